"""Small programs lowered, simulated and compared with the reference interpreter: GEMMs,
convolutions (im2col on chip, materialised, gathered), pooling, fused kernels, vector ops,
copies, host steps; on every dataflow with scratchpads small enough that everything is
tiled, chunked and double buffered. Tolerances: sa_helpers (float32, sums re-ordered)."""
from __future__ import annotations

import numpy as np
import pytest
from sa_helpers import DATAFLOWS, assert_close, conv_text, run_both, small_acc
from test_syntax import operator_head

import apsat
from apsat.backends import systolic as sab
from apsat.lang.evaluate import evaluate
from apsat.backends.systolic import Copy, Host, Load, Matmul, Preload, Store, Vec
from apsat.backends.systolic.vector import PAIRWISE
from apsat.lang.ops import COMPUTE_OPS
from apsat.errors import ApsatError
from apsat.targets.accelerator import Accelerator

MATMUL = "(systolic-array {k} {n} (access (access-tensor a) 1) (access-tensor b))"


def kinds(stream, section="main"):
    return {type(i).__name__ for i in getattr(stream, section)}


@pytest.mark.parametrize("df", DATAFLOWS)
@pytest.mark.parametrize("m,k,n", [(5, 7, 3), (40, 100, 30), (3, 300, 20), (200, 20, 9)])
def test_matmul_on_every_dataflow(df, m, k, n):
    stream, got, want = run_both(MATMUL.format(k=k, n=n), {"a": (m, k), "b": (k, n)}, small_acc(df))
    assert_close(got, want)
    assert {"Load", "Matmul", "Store"} <= kinds(stream)
    assert ("Preload" in kinds(stream)) == (df != "os")


@pytest.mark.parametrize("df", DATAFLOWS)
def test_partial_sums_drain_per_row_fold_under_ws_and_is(df):
    # k = 20 on 8 rows: three row folds; ws/is store the first and add the others in DRAM
    stream, got, want = run_both(MATMUL.format(k=20, n=12), {"a": (30, 20), "b": (20, 12)}, small_acc(df))
    assert_close(got, want)
    acc_stores = [i for i in stream.main if isinstance(i, Store) and i.accumulate]
    assert bool(acc_stores) == (df != "os")


@pytest.mark.parametrize("df", DATAFLOWS)
@pytest.mark.parametrize("opts", [{}, {"im2col": "gather"}, {"fold_copies": True}])
def test_conv_with_padding_and_stride(df, opts):
    shapes = {"x": (1, 3, 29, 29), "w": (10, 3, 3, 3)}
    stream, got, want = run_both(conv_text(3, 3, 3, 10, stride=2, pad=1), shapes, small_acc(df, kb=2), **opts)
    assert_close(got, want)
    # the padded input (3 x 31 x 31 = 2883 words) does not fit 2 kB: materialised or gathered
    modes = {g.a_mode for g in stream.groups.values() if g.kind == "gemm"}
    assert modes == {"gather" if opts.get("im2col") == "gather" else "im2col"}
    pads = [g for g in stream.groups.values() if g.label == "access-pad"]
    assert len(pads) == (0 if opts.get("fold_copies") else 2)


@pytest.mark.parametrize("df", DATAFLOWS)
def test_conv_whose_input_fits_the_ifmap_is_formed_on_chip(df):
    shapes = {"x": (1, 4, 9, 9), "w": (6, 4, 3, 3)}
    stream, got, want = run_both(conv_text(4, 3, 3, 6), shapes, small_acc(df, ifmap_kb=1, kb=2))
    assert_close(got, want)
    (g,) = [g for g in stream.groups.values() if g.kind == "gemm"]
    assert g.a_mode == "resident"
    # the whole input is loaded once; the array reads its windows through the view
    loads = [i for i in stream.main if isinstance(i, Load) and i.dst.sp == "ifmap"]
    assert len(loads) == 1 and loads[0].words == 4 * 9 * 9
    assert any(getattr(i, "a", None) is not None and getattr(i.a, "view", None)
               for i in stream.main if isinstance(i, Matmul)) or df == "is"
    if df == "is":
        assert all(p.src.view for p in stream.main if isinstance(p, Preload))


@pytest.mark.parametrize("df", DATAFLOWS)
@pytest.mark.parametrize("act", ["relu", "(clip 0.0 6.0)", None])
def test_fused_dot_bias_act_starts_from_the_bias_and_has_a_vector_epilogue(df, act):
    # the accumulators start from the bias row (MATMUL init); only the activation runs on
    # the vector unit
    a = "(access (access-tensor a) 1)"
    b = "(access (access-tensor b) 1)"
    bias = "(access (access-tensor c) 1)"
    text = f"(fused-dot-bias-act {act} {a} {b} {bias})" if act else f"(fused-dot-bias {a} {b} {bias})"
    shapes = {"a": (37, 20), "b": (11, 20), "c": (11,)}
    stream, got, want = run_both(text, shapes, small_acc(df))
    assert_close(got, want)
    vecs = [i for i in stream.main if isinstance(i, Vec)]
    assert {v.mode for v in vecs} == ({"map"} if act else set())
    passes = [i for i in stream.main if isinstance(i, Matmul)]
    started = [p for p in passes if p.init is not None]
    # one bias row per output block's first passes, never on a pass that accumulates
    assert started and not any(p.accumulate for p in started)
    assert all(p.init.region.rows == 1 and p.init.region.cols == p.n for p in started)


def test_max_pooling_and_global_average_pooling_on_the_vector_unit():
    pool = ("(compute reduce-max (access-windows (access (access-pad (access-tensor x) min-padding 2 1 1) 2) "
            "(shape 3 3) (shape 2 2)))")
    for text, shapes in [(pool, {"x": (1, 5, 9, 9)}),
                         ("(compute reduce-mean (access (access-tensor x) 2))", {"x": (1, 7, 6, 6)})]:
        stream, got, want = run_both(text, shapes, small_acc(kb=1))
        assert_close(got, want)
        assert any(isinstance(i, Vec) and i.mode == "row" for i in stream.main)


def test_elementwise_ops_unary_and_pairs_with_broadcasts():
    text = ("(compute relu (compute elementwise-add (access-pair (access (access-tensor x) 4) "
            "(access-broadcast (access-reshape (access-tensor c) (access-shape (shape 1 6 1 1) (shape))) "
            "(access-shape (shape 1 6 10 10) (shape))))))")
    stream, got, want = run_both(text, {"x": (1, 6, 10, 10), "c": (6,)}, small_acc(kb=1))
    assert_close(got, want)
    assert {v.mode for v in stream.main if isinstance(v, Vec)} == {"zip", "map"}
    # a broadcast operand is read once from DRAM, not once per element
    c_buf = next(b for b in stream.buffers.values() if b.tensor == "c")
    c_reads = sum(i.words for i in stream.main if isinstance(i, Load) and stream.views[i.src].base == c_buf.name)
    assert c_reads <= 6 * 2


def test_lrn_across_channels_is_tiled_when_a_whole_item_does_not_fit():
    text = "(compute (lrn 5 0.0001 0.75 1.0) (access (access-tensor x) 1))"
    stream, got, want = run_both(text, {"x": (1, 8, 20, 20)}, small_acc(kb=1))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert {v.mode for v in stream.main if isinstance(v, Vec)} == {"axis0"}


def test_softmax_rows_and_a_too_long_item_in_two_levels():
    stream, got, want = run_both("(compute softmax (access (access-tensor x) 1))", {"x": (4, 100)}, small_acc())
    assert_close(got, want)
    stream, got, want = run_both("(compute softmax (access (access-tensor x) 1))", {"x": (2, 5000)}, small_acc())
    assert_close(got, want)
    assert not [i for i in stream.main if isinstance(i, Host)]       # split_item.py
    stream, got, want = run_both("(compute softmax (access (access-tensor x) 1))", {"x": (2, 5003)}, small_acc())
    assert_close(got, want)
    (h,) = [i for i in stream.main if isinstance(i, Host)]             # 5003 is prime
    assert "does not fit half of a scratchpad" in h.reason


def test_copies_transpose_concatenate_pad():
    text = ("(access-pad (access-concatenate (access-transpose (access-tensor x) (list 1 0)) "
            "(access-tensor y) 0) zero-padding 1 2 1)")
    shapes = {"x": (4, 3), "y": (2, 4)}
    stream, got, want = run_both(text, shapes, small_acc())
    np.testing.assert_array_equal(got, want)
    assert kinds(stream) == {"Copy"}
    # folded: the transpose and the pad become address patterns of the concatenation's copies
    stream, got, _ = run_both(text, shapes, small_acc(), fold_copies=True)
    np.testing.assert_array_equal(got, want)
    assert sum(isinstance(i, Copy) for i in stream.main) == 2


def test_a_dot_product_left_off_the_array_is_mapped_there():
    text = "(compute dot-product (access-cartesian-product (access (access-tensor a) 1) (access (access-tensor b) 1)))"
    stream, got, want = run_both(text, {"a": (6, 5), "b": (4, 5)}, small_acc())
    assert_close(got, want)
    assert not [i for i in stream.main if isinstance(i, Host)]           # split_item.lower_as_matmul


def test_a_dot_product_over_a_stacked_item_is_a_named_host_step():
    # neither a pair nor a cartesian product: the item (2, 5) holds both operands
    stream, got, want = run_both("(compute dot-product (access (access-tensor a) 1))", {"a": (6, 2, 5)}, small_acc())
    assert_close(got, want)
    (h,) = stream.main
    assert isinstance(h, Host) and h.macs == 6 * 5 and "dot-product left off the array" in h.reason
    assert sab.cycles(stream)["host_steps"][0]["reason"] == h.reason


def test_weight_only_work_goes_to_the_init_section():
    # the weight transpose depends on the weight alone: done once at load time
    shapes = {"x": (1, 3, 8, 8), "w": (5, 3, 3, 3)}
    stream, got, want = run_both(conv_text(3, 3, 3, 5), shapes, small_acc(kb=1), weights={"w"})
    assert_close(got, want)
    assert kinds(stream, "init") == {"Copy"} and "Copy" not in kinds(stream)
    rep = sab.cycles(stream)
    assert rep["init_cycles"] > 0 and rep["dram"]["init_writes"] == 5 * 27


def test_a_tile_that_cannot_be_formed_is_refused_in_one_line():
    # a 1 kB ofmap holds 1024 words: half of it cannot hold one 32x32 output tile
    acc = Accelerator(32, 32, "os", 64, 64, 1, 64.0, 32, "tiny-ofmap")
    prog = apsat.parse(MATMUL.format(k=64, n=64), {"a": (64, 64), "b": (64, 64)})
    with pytest.raises(ApsatError) as e:
        sab.compile(prog, acc)
    assert "cannot hold a 32x32 output tile" in str(e.value) and "\n" not in str(e.value)
    acc = Accelerator(32, 32, "ws", 64, 1, 64, 64.0, 32, "tiny-filter")
    with pytest.raises(ApsatError, match="cannot hold one 32x32 weight tile"):
        sab.compile(prog, acc)
    with pytest.raises(ApsatError, match="needs a systolic target"):
        sab.compile(prog, "gpu")
    with pytest.raises(ApsatError, match="im2col must be"):
        sab.compile(prog, "systolic:32x32", im2col="sometimes")


def _op_text(name: str) -> str:
    params = {"clip": "-0.5 0.5", "layer-norm": "1e-05", "lrn": "3 0.0001 0.75 1.0",
              "chain": "elementwise-div sqrt"}
    return f"({name} {params[name]})" if name in params else operator_head(name)


def test_every_compute_operator_runs_on_the_vector_unit_or_is_a_named_host_step():
    """A registry walk: every compute operator of the language has a lowering; only the
    dot-product off the array goes to the host."""
    rng = np.random.default_rng(0)
    x = (np.abs(rng.standard_normal((4, 6))) + 0.5).astype(np.float32)
    y = (np.abs(rng.standard_normal((4, 6))) + 0.5).astype(np.float32)
    z = rng.standard_normal((4, 3, 6)).astype(np.float32)
    for name in COMPUTE_OPS:
        op = _op_text(name)
        if name == "dot-product":
            continue                      # test_a_dot_product_left_off_the_array_is_a_named_host_step
        if name in PAIRWISE or name == "chain":
            text = f"(compute {op} (access-pair (access (access-tensor x) 1) (access (access-tensor y) 1)))"
        elif name == "select":
            text = f"(compute {op} (access (access-tensor z) 1))"
        else:
            text = f"(compute {op} (access (access-tensor x) 1))"
        prog = apsat.parse(text, {"x": x.shape, "y": y.shape, "z": z.shape})
        feeds = {"x": x, "y": y, "z": z}
        stream = sab.compile(prog, small_acc())
        assert not any(isinstance(i, Host) for i in stream.main), name
        np.testing.assert_allclose(sab.simulate(stream, feeds)["out"], evaluate(prog, feeds),
                                   rtol=1e-6, atol=1e-6, err_msg=name)
        assert sab.cycles(stream)["busy"]["vector"] > 0, name


# (chain operator, operand, VEC mode): a chain is one VEC whose op text is its surface syntax
CHAINS = [
    ("(chain (chain elementwise-add relu) sigmoid)",
     "(access-pair (access (access-tensor x) 1) (access (access-tensor y) 1))", "zip"),
    ("(chain (chain exp (clip -0.5 0.5)) tanh)", "(access (access-tensor x) 1)", "map"),
    ("(chain select gelu)", "(access (access-tensor z) 1)", "row"),
]


@pytest.mark.parametrize("op,operand,mode", CHAINS, ids=[c[2] for c in CHAINS])
def test_chain_operator_is_one_vec_instruction(op, operand, mode):
    from apsat.backends.systolic.timing import vec_cycles
    from apsat.lang.arithmetic import operator_flops
    from apsat.lang.syntax import parse_compute_op
    from apsat.targets.systolic import vector_cycles

    rng = np.random.default_rng(1)
    feeds = {"x": rng.standard_normal((4, 6)).astype(np.float32),
             "y": rng.standard_normal((4, 6)).astype(np.float32),
             "z": rng.standard_normal((4, 3, 6)).astype(np.float32)}
    prog = apsat.parse(f"(compute {op} {operand})", {k: v.shape for k, v in feeds.items()})
    acc = small_acc()
    stream = sab.compile(prog, acc)
    vecs = [i for i in stream.main if isinstance(i, Vec)]
    assert [(v.mode, v.op) for v in vecs] == [(mode, op)] * len(vecs) and vecs
    assert sab.parse(sab.to_text(stream)).main == stream.main
    np.testing.assert_allclose(sab.simulate(stream, feeds)["out"], evaluate(prog, feeds),
                               rtol=1e-6, atol=1e-6)
    # the vector unit's work is the sum of the chain's parts
    ins = vecs[0]
    work = operator_flops(parse_compute_op(op), sum(s.region.size for s in ins.srcs), ins.dst.region.size)
    assert vec_cycles(acc, ins) == vector_cycles(acc, int(work), 1)
