"""fuse_zips=True: an element-wise op over a pair, one of whose operands is a fused
GEMM nothing else reads (a residual add after a convolution), joins the GEMM's epilogue.
Each case is simulated against the reference interpreter on every dataflow, with the
groups the stream holds checked. Tolerances: sa_helpers (float32, sums re-ordered)."""
from __future__ import annotations

import pytest
from sa_helpers import assert_close, run_both, small_acc

from apsat.backends import systolic as sab
from apsat.backends.systolic import Vec

FUSED = ("(fused-dot-bias-act relu (access (access-tensor a) 1) (access (access-tensor w) 1) "
         "(access (access-tensor bias) 1))")
SHAPES = {"a": (300, 20), "w": (12, 20), "bias": (12,), "r": (300, 12)}
R = "(access (access-tensor r) 2)"


def labels(stream):
    return [(g.kind, g.label) for g in stream.groups.values()]


@pytest.mark.parametrize("df", ["os", "ws", "is", "flex"])
@pytest.mark.parametrize("op,pair", [
    ("(chain elementwise-add relu)", f"(access-pair {FUSED} {R})"),    # residual add, then relu
    ("elementwise-sub", f"(access-pair {R} {FUSED})"),                  # r - gemm: order kept
])
def test_a_zip_over_a_gemm_joins_its_epilogue(df, op, pair):
    text = f"(compute {op} {pair})"
    plain, want_plain, want = run_both(text, SHAPES, small_acc(df, kb=2))
    fused, got, _ = run_both(text, SHAPES, small_acc(df, kb=2), fuse_zips=True)
    assert_close(got, want)
    assert_close(want_plain, want)
    assert [k for k, _ in labels(plain)] == ["gemm", "vector"]
    assert labels(fused) == [("gemm", f"fused-dot-bias-act relu + {op}")]
    assert any(isinstance(i, Vec) and i.mode == "zip" for i in fused.main)
    # the product's result never goes to DRAM: fewer words moved than with the vector pass
    assert sab.cycles(fused)["dram"]["total"] < sab.cycles(plain)["dram"]["total"]
    again = sab.parse(sab.to_text(fused))
    assert again.options["fuse_zips"] is True and again.main == fused.main


def test_a_gemm_read_twice_is_not_fused():
    # the GEMM's result also feeds a second consumer: it must reach DRAM, so the zip
    # stays a vector pass of its own
    text = f"(compute elementwise-mul (access-pair (compute (chain elementwise-add relu) (access-pair {FUSED} {R})) {FUSED}))"
    stream, got, want = run_both(text, SHAPES, small_acc("os", kb=2), fuse_zips=True)
    assert_close(got, want)
    assert [k for k, _ in labels(stream)] == ["gemm", "vector", "vector"]
