"""fuse_zips=True: an element-wise op over a pair, one of whose operands is a fused
GEMM nothing else reads (a residual add after a convolution), joins the GEMM's epilogue.
Each case is simulated against the reference interpreter on every dataflow, with the
groups the stream holds checked. An add to a product without activation does not zip: the
accumulators start from the other operand. Tolerances: sa_helpers (float32, sums re-ordered)."""
from __future__ import annotations

import pytest
from sa_helpers import assert_close, run_both, small_acc

from apsat.backends import systolic as sab
from apsat.backends.systolic import Vec
from apsat.backends.systolic.isa import Load
from apsat.targets.systolic import vector_cycles

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


# A residual add to a product without activation: the accumulators start from the other
# operand (k = 20 on an 8-row array: three row folds under ws/is, chunks under os).
PLAIN = ("(fused-dot-bias (access (access-tensor a) 1) (access (access-tensor w) 1) "
         "(access (access-tensor bias) 1))")


def _residual_loads(stream) -> list:
    """(scratchpad, words) of every LOAD of the residual tensor r."""
    r = {b.name for b in stream.buffers.values() if b.tensor == "r"}
    return [(i.dst.sp, i.words) for i in stream.main
            if isinstance(i, Load) and stream.views[i.src].base in r]


@pytest.mark.parametrize("df", ["os", "ws", "is", "flex"])
@pytest.mark.parametrize("op,pair,maps", [
    ("(chain elementwise-add relu)", f"(access-pair {PLAIN} {R})", {"relu"}),
    ("(chain elementwise-add relu)", f"(access-pair {R} {PLAIN})", {"relu"}),   # r + gemm
    ("elementwise-add", f"(access-pair {PLAIN} {R})", set()),
    ("(chain (chain elementwise-add relu) (clip 0.0 6.0))", f"(access-pair {PLAIN} {R})",
     {"(chain relu (clip 0.0 6.0))"}),
])
def test_an_add_to_a_plain_gemm_starts_its_accumulators(df, op, pair, maps):
    text = f"(compute {op} {pair})"
    stream, got, want = run_both(text, SHAPES, small_acc(df, kb=2), fuse_zips=True)
    assert_close(got, want)
    assert labels(stream) == [("gemm", f"fused-dot-bias + {op}")]
    vecs = [i for i in stream.main if isinstance(i, Vec)]
    assert {(v.mode, v.op) for v in vecs} == {("map", m) for m in maps}
    # the residual is read once, into the output blocks (where the sums start)
    loads = _residual_loads(stream)
    assert {sp for sp, _ in loads} == {"ofmap"} and sum(w for _, w in loads) == 300 * 12
    assert sab.parse(sab.to_text(stream)).main == stream.main


def test_the_start_needs_fewer_vector_cycles_than_the_zip():
    # the same add + relu over a product with and without its own activation: the zip
    # costs the add's operations on the vector unit, the start does not
    op = "(chain elementwise-add relu)"
    acc = small_acc("os", kb=2)
    start, _, _ = run_both(f"(compute {op} (access-pair {PLAIN} {R}))", SHAPES, acc, fuse_zips=True)
    zipped, _, _ = run_both(f"(compute {op} (access-pair {FUSED} {R}))", SHAPES, acc, fuse_zips=True)
    relu_only = vector_cycles(acc, 300 * 12, 1)
    assert sab.cycles(start)["busy"]["vector"] == relu_only
    assert sab.cycles(zipped)["busy"]["vector"] > 2 * relu_only


@pytest.mark.parametrize("op,pair", [
    ("(chain elementwise-sub relu)", f"(access-pair {PLAIN} {R})"),     # not an add
    ("(chain elementwise-mul relu)", f"(access-pair {R} {PLAIN})"),
])
def test_other_operators_over_a_plain_gemm_still_zip(op, pair):
    stream, got, want = run_both(f"(compute {op} {pair})", SHAPES, small_acc("ws", kb=2), fuse_zips=True)
    assert_close(got, want)
    assert any(isinstance(i, Vec) and i.mode == "zip" for i in stream.main)
    assert all(sp == "ofmap" for sp, _ in _residual_loads(stream))
