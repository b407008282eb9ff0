"""Concatenations built in place (apsat/backends/systolic/inplace.py, lowering option
fold_copies): GEMM results and inner concatenations land in their columns of the
outermost concatenation's buffer; other parts are copied; readers of a placed part read
its slice. Checked against the reference interpreter on every dataflow (tolerances:
sa_helpers, float32 sums re-ordered)."""
from __future__ import annotations

import pytest
from sa_helpers import DATAFLOWS, assert_close, run_both, small_acc

from apsat.backends import systolic as sab
from apsat.backends.systolic import Copy, Host, Store


def gemm(i: int) -> str:
    return (f"(fused-dot-bias-act relu (access (access-tensor a) 1) (access (access-tensor w{i}) 1) "
            f"(access (access-tensor b{i}) 1))")


INNER = f"(access-concatenate {gemm(1)} {gemm(2)} 1)"
OUTER = f"(access-concatenate {INNER} {gemm(3)} 1)"
# the inner concatenation also feeds a relu, whose result is the last part (copied)
TEXT = f"(access-concatenate {OUTER} (compute relu {INNER}) 1)"
SHAPES = {"a": (40, 12), "w1": (8, 12), "b1": (8,), "w2": (5, 12), "b2": (5,), "w3": (6, 12), "b3": (6,)}


def output_buffer(stream):
    return stream.views[stream.outputs["out"]].base


@pytest.mark.parametrize("df", DATAFLOWS + ("flex",))
def test_nested_concatenation_of_gemms_copies_only_the_other_part(df):
    stream, got, want = run_both(TEXT, SHAPES, small_acc(df, kb=2), fold_copies=True)
    assert_close(got, want)
    out = output_buffer(stream)
    # the three GEMMs store into the output's columns; only the relu part is copied
    assert {i.dst for i in stream.main if isinstance(i, Store) and i.tag in gemm_tags(stream)} == {out}
    (copy,) = [i for i in stream.main if isinstance(i, Copy)]
    assert (copy.dst, copy.axis, copy.lo, copy.hi) == (out, 1, 19, 32)


def gemm_tags(stream):
    return {tag for tag, g in stream.groups.items() if g.kind == "gemm"}


def test_without_folding_every_part_is_copied():
    stream, got, want = run_both(TEXT, SHAPES, small_acc("os", kb=2))
    assert_close(got, want)
    assert len([i for i in stream.main if isinstance(i, Copy)]) == 6     # 2 parts x 3 concatenations


def test_a_placed_gemm_that_falls_back_to_the_host_is_copied_into_place(monkeypatch):
    from apsat.backends.systolic import gemm as gemm_module
    from apsat.backends.systolic.lower import Unlowerable

    def refuse(L, t, zip_with=None):
        raise Unlowerable("refused for the test")

    monkeypatch.setattr(gemm_module, "lower_fused", refuse)
    stream, got, want = run_both(TEXT, SHAPES, small_acc("os", kb=2), fold_copies=True)
    assert_close(got, want)
    assert len([i for i in stream.main if isinstance(i, Host)]) == 3
    # each host result goes to a buffer of its own, then into its columns
    placed = [(i.lo, i.hi) for i in stream.main if isinstance(i, Copy)]
    assert sorted(placed) == [(0, 8), (8, 13), (13, 19), (19, 32)]
    assert sab.to_text(sab.parse(sab.to_text(stream))) == sab.to_text(stream)
