"""Grouped and depthwise convolutions (dot-products over access-pairs of broadcasts) on
the array, one GEMM per group or depthwise filters batched, or on the vector unit (apsat/backends/systolic/grouped.py),
against the reference interpreter and onnxruntime on every dataflow. Tolerances:
sa_helpers (float32, sums re-ordered)."""
from __future__ import annotations

import pytest
from models import grouped_convnet
from sa_helpers import DATAFLOWS, assert_close, run_both, small_acc
from test_stream_models import check_against_onnxruntime, fused_program

import apsat
from apsat.backends import systolic as sab
from apsat.backends.systolic import Host, Matmul, Store, Vec


def _grouped_text(g, cg, mg, k, out, size):
    """The importer's pair form of a stride-1 grouped conv over x (1, g*cg, size, size)
    with w (g*mg, cg, k, k) and out x out outputs (the windows broadcast over the mg
    filters of their group, the weights over the output positions)."""
    full = f"(access-shape (shape 1 {g} {mg} {out} {out}) (shape {cg} {k} {k}))"
    win = (f"(access-broadcast (access-insert-axis (access-squeeze (access-windows (access-reshape "
           f"(access-tensor x) (access-shape (shape 1 {g}) (shape {cg} {size} {size}))) "
           f"(shape {cg} {k} {k}) (shape 1 1 1)) 2) 2) {full})")
    wt = (f"(access-broadcast (access-reshape (access-tensor w) "
          f"(access-shape (shape 1 {g} {mg} 1 1) (shape {cg} {k} {k}))) {full})")
    return f"(compute dot-product (access-pair {win} {wt}))"


@pytest.mark.parametrize("df", DATAFLOWS)
def test_grouped_conv_runs_one_gemm_per_group_in_place(df):
    # 3 groups of 4 -> 6 channels, 3x3 over 9x9: 3 products of (6 x 36) . (36 x 49)
    text = _grouped_text(3, 4, 6, 3, 7, 9)
    stream, got, want = run_both(text, {"x": (1, 12, 9, 9), "w": (18, 4, 3, 3)}, small_acc(df, kb=2))
    assert_close(got, want)
    (group,) = [g for g in stream.groups.values() if g.kind == "grouped"]
    assert (group.m, group.k, group.n) == (6, 36, 49)
    assert sum(i.m * i.k * i.n for i in stream.main if isinstance(i, Matmul)) == 3 * 6 * 36 * 49
    # stored straight into the output: no copy, no host step
    assert not any(isinstance(i, Host) for i in stream.main)
    assert {i.dst for i in stream.main if isinstance(i, Store)} == {stream.views[stream.outputs["out"]].base}


@pytest.mark.parametrize("df", DATAFLOWS)
def test_depthwise_conv_runs_on_the_vector_unit(df):
    # one filter column per group: with 32 lanes the vector unit beats 8 x 8 array folds
    text = _grouped_text(8, 1, 1, 3, 6, 8)
    stream, got, want = run_both(text, {"x": (1, 8, 8, 8), "w": (8, 1, 3, 3)}, small_acc(df, lanes=32))
    assert_close(got, want)
    dots = [i for i in stream.main if isinstance(i, Vec) and i.mode == "dot"]
    assert dots and not any(isinstance(i, Matmul) for i in stream.main)
    rep = sab.cycles(stream)
    assert rep["vector_macs"] == 8 * 36 * 9 and rep["macs"] == 0


@pytest.mark.parametrize("df", ("os", "is"))
@pytest.mark.parametrize("groups", (8, 12))
def test_depthwise_conv_batches_filters_on_the_array(df, groups):
    # 8 lanes: the vector unit is slower than 8 filters a pass as a block-diagonal
    # (8 x 72) . (72 x 36) product; 12 groups take a pass of 8 and one of 4. (Under ws
    # the batch's 8 rows would stream through 45 folds: one filter a pass is cheaper
    # there, and pair_dot_cost says so.)
    text = _grouped_text(groups, 1, 1, 3, 6, 8)
    stream, got, want = run_both(text, {"x": (1, groups, 8, 8), "w": (groups, 1, 3, 3)}, small_acc(df))
    assert_close(got, want)
    assert not any(isinstance(i, Vec) for i in stream.main)
    passes = [i for i in stream.main if isinstance(i, Matmul)]
    assert {i.blocks for i in passes} == ({8} if groups == 8 else {8, 4})
    (group,) = [g for g in stream.groups.values() if g.kind == "grouped"]
    assert (group.m, group.k, group.n) == (8, 72, 36)
    rep = sab.cycles(stream)
    assert rep["macs"] == groups * 36 * 9          # the useful MACs, not the zeros
    assert sum(i.m * i.k * i.n for i in passes) == (8 * 72 * 36 if groups == 8 else 8 * 72 * 36 + 4 * 36 * 36)
    assert sab.to_text(sab.parse(sab.to_text(stream))) == sab.to_text(stream)


def test_the_backend_batches_where_pair_dot_cost_does():
    from apsat.targets.pair_dot import pair_dot_cost

    for df in DATAFLOWS:
        acc = small_acc(df)
        stream, got, want = run_both(_grouped_text(8, 1, 1, 3, 6, 8), {"x": (1, 8, 8, 8), "w": (8, 1, 3, 3)}, acc)
        assert_close(got, want)
        batched = any(isinstance(i, Matmul) and i.blocks > 1 for i in stream.main)
        assert batched == (pair_dot_cost(acc, 8, 36, 9, 1).unit == "batched"), df


def test_diagonal_view_step_embeds_an_axis():
    import numpy as np

    from apsat.backends.systolic.views import apply, dims_after, parse_step, step_text

    x = np.arange(1, 7, dtype=np.float32).reshape(2, 3)
    d = apply(x, (("diag", 0),))
    assert d.shape == dims_after((2, 3), (("diag", 0),)) == (2, 3, 2)
    assert (d[0, :, 0] == x[0]).all() and (d[1, :, 1] == x[1]).all()
    assert (d[0, :, 1] == 0).all() and (d[1, :, 0] == 0).all()
    assert parse_step(step_text(("diag", 0))) == ("diag", 0)


def test_stream_text_round_trips_grouped_and_dot_instructions():
    stream, _, _ = run_both(_grouped_text(8, 1, 1, 3, 6, 8), {"x": (1, 8, 8, 8), "w": (8, 1, 3, 3)},
                            small_acc("os", lanes=32))
    again = sab.parse(sab.to_text(stream))
    assert sab.to_text(again) == sab.to_text(stream)


def _pair_product(a_dims, b_dims):
    """A dot-product over a pair of broadcasts to ((4, 5, 6), (3)), simulated on a small array."""
    text = ("(compute dot-product (access-pair "
            "(access-broadcast (access (access-tensor a) 3) (access-shape (shape 4 5 6) (shape 3))) "
            "(access-broadcast (access (access-tensor b) 3) (access-shape (shape 4 5 6) (shape 3)))))")
    stream, got, want = run_both(text, {"a": a_dims, "b": b_dims}, small_acc("os"))
    assert_close(got, want)
    return stream, [i for i in stream.main if isinstance(i, Host)]


def test_pair_with_axes_out_of_order_is_reordered_onto_the_array():
    # rows, columns, rows: each group's result is not one block of the output, so the
    # product runs with its axes reordered and its result is transposed back (no HOST)
    stream, host = _pair_product((4, 1, 6, 3), (1, 5, 1, 3))
    assert not host and any("reordered" in g.label for g in stream.groups.values())


def test_pair_whose_axis_varies_in_neither_operand_stays_on_the_host():
    _, (host,) = _pair_product((4, 1, 1, 3), (1, 1, 6, 3))
    assert "not groups, rows and columns" in host.reason


@pytest.mark.parametrize("df", DATAFLOWS)
def test_grouped_convnet_matches_onnxruntime(df):
    import dataclasses

    from apsat.targets.accelerator import PRESETS

    model = apsat.load_onnx(grouped_convnet())
    acc = dataclasses.replace(PRESETS["32x32"], dataflow=df)
    stream = sab.compile(fused_program(model, acc), acc, weights=model.weights)
    check_against_onnxruntime(model, stream)
    assert sab.cycles(stream)["host_steps"] == []
