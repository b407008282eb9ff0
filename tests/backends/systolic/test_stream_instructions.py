"""Each instruction kind on its own: hand-written streams run by the simulator (exact
numpy expectations), timed by the cycle model (figures from apsat/targets/systolic.py),
and written and parsed back."""
from __future__ import annotations

import math

import numpy as np
import pytest
from sa_helpers import small_acc

from apsat.backends import systolic as sab
from apsat.backends.systolic import (ARRAY, Buffer, Copy, Host, Load, Matmul, Operand, Preload, Region,
                                     Slot, Store, Stream, Vec, View)
from apsat.backends.systolic.timing import pass_cycles
from apsat.targets.systolic import dram_cycles, gemm_cost, vector_cycles

RNG = np.random.default_rng(7)


def stream_with(acc, buffers: dict, views: dict, main: list, outputs: dict) -> Stream:
    s = Stream(acc)
    for name, (dims, kind) in buffers.items():
        s.buffers[name] = Buffer(name, dims, kind, name if kind in ("input", "weight") else None)
    for name, (base, steps) in views.items():
        from apsat.backends.systolic.views import dims_after

        s.views[name] = View(name, base, tuple(steps), dims_after(s.buffers[base].dims, steps))
    s.main = list(main)
    s.outputs = dict(outputs)
    return s


def whole(slot):
    return Operand(slot, Region(0, slot.rows, 0, slot.cols))


def roundtrip(s: Stream) -> None:
    text = sab.to_text(s)
    again = sab.parse(text)
    assert again.main == s.main and again.init == s.init
    assert again.buffers == s.buffers and again.views == s.views and again.outputs == s.outputs
    assert sab.to_text(again) == text


def test_load_and_store_move_a_block_through_a_scratchpad():
    acc = small_acc()
    a = RNG.standard_normal((6, 10)).astype(np.float32)
    slot = Slot("ifmap", 0, 4, 5)
    s = stream_with(acc, {"a": ((6, 10), "input"), "t": ((4, 5), "temp")}, {"va": ("a", ()), "vt": ("t", ())},
                    [Load(slot, "va", Region(1, 5, 3, 8), 20), Store("t", (4, 5), Region(0, 4, 0, 5), slot)],
                    {"out": "vt"})
    np.testing.assert_array_equal(sab.simulate(s, {"a": a})["out"], a[1:5, 3:8])
    rep = sab.cycles(s)
    # each transfer takes dram_cycles on its scratchpad's interface; the store waits for the load
    assert rep["total_cycles"] == 2 * dram_cycles(acc, 20)
    assert rep["dram"]["reads"] == 20 and rep["dram"]["writes"] == 20
    roundtrip(s)


def test_store_accumulate_adds_to_dram():
    acc = small_acc()
    a = RNG.standard_normal((2, 3)).astype(np.float32)
    slot = Slot("ofmap", 0, 2, 3)
    s = stream_with(acc, {"a": ((2, 3), "input"), "t": ((2, 3), "temp")}, {"va": ("a", ()), "vt": ("t", ())},
                    [Load(slot, "va", Region(0, 2, 0, 3), 6), Store("t", (2, 3), Region(0, 2, 0, 3), slot),
                     Store("t", (2, 3), Region(0, 2, 0, 3), slot, accumulate=True)], {"out": "vt"})
    np.testing.assert_array_equal(sab.simulate(s, {"a": a})["out"], a + a)
    roundtrip(s)


@pytest.mark.parametrize("step,expect", [
    (("transpose", (1, 0)), lambda x: x.T),
    (("pad", 1, 2, 1, 0.0), lambda x: np.pad(x, ((0, 0), (2, 1)))),
    (("pad", 0, 1, 0, -math.inf), lambda x: np.pad(x, ((1, 0), (0, 0)), constant_values=-np.inf)),
])
def test_copy_applies_its_address_pattern(step, expect):
    acc = small_acc()
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    want = expect(x)
    s = stream_with(acc, {"x": ((3, 4), "input"), "t": (want.shape, "temp")},
                    {"v": ("x", (step,)), "vt": ("t", ())}, [Copy("t", "v", 12)], {"out": "vt"})
    np.testing.assert_array_equal(sab.simulate(s, {"x": x})["out"], want)
    rep = sab.cycles(s)
    assert rep["total_cycles"] == max(dram_cycles(acc, 12), dram_cycles(acc, want.size))
    assert rep["dram"]["writes"] == want.size
    roundtrip(s)


def test_copy_into_a_part_concatenates():
    acc = small_acc()
    x, y = (RNG.standard_normal((2, 3)).astype(np.float32) for _ in range(2))
    s = stream_with(acc, {"x": ((2, 3), "input"), "y": ((2, 3), "input"), "t": ((2, 6), "temp")},
                    {"vx": ("x", ()), "vy": ("y", ()), "vt": ("t", ())},
                    [Copy("t", "vx", 6, 1, 0, 3), Copy("t", "vy", 6, 1, 3, 6)], {"out": "vt"})
    np.testing.assert_array_equal(sab.simulate(s, {"x": x, "y": y})["out"], np.concatenate([x, y], 1))
    roundtrip(s)


def _gemm_stream(acc, a_stationary: bool, chunks: int):
    """C (4x6) = A (4xK) @ B (Kx6) in `chunks` k-chunks accumulating in one ofmap block;
    the stationary operand (a or b) PRELOADed once per chunk."""
    k = 4 * chunks
    bufs = {"a": ((4, k), "input"), "b": ((k, 6), "weight"), "c": ((4, 6), "temp")}
    views = {"va": ("a", ()), "vb": ("b", ()), "vc": ("c", ())}
    out = Slot("ofmap", 0, 4, 6)
    prog = []
    for i in range(chunks):
        sa, sb = Slot("ifmap", 64 * (i % 2), 4, 4), Slot("filter", 64 * (i % 2), 4, 6)
        prog += [Load(sa, "va", Region(0, 4, 4 * i, 4 * i + 4), 16), Load(sb, "vb", Region(4 * i, 4 * i + 4, 0, 6), 24)]
        a, b = whole(sa), whole(sb)
        if a_stationary is True:
            prog.append(Preload(a))
            a = ARRAY
        elif a_stationary is False:
            prog.append(Preload(b))
            b = ARRAY
        prog.append(Matmul(whole(out), a, b, 4, 4, 6, accumulate=i > 0, fill=i == chunks - 1))
    prog.append(Store("c", (4, 6), Region(0, 4, 0, 6), out))
    return stream_with(acc, bufs, views, prog, {"out": "vc"}), k


@pytest.mark.parametrize("stationary", [None, True, False], ids=["os", "is-preload-a", "ws-preload-b"])
def test_preload_and_matmul_accumulate_over_chunks(stationary):
    acc = small_acc({None: "os", True: "is", False: "ws"}[stationary])
    s, k = _gemm_stream(acc, stationary, 3)
    a = RNG.standard_normal((4, k)).astype(np.float32)
    b = RNG.standard_normal((k, 6)).astype(np.float32)
    np.testing.assert_allclose(sab.simulate(s, {"a": a, "b": b})["out"], a @ b, rtol=1e-5, atol=1e-5)
    roundtrip(s)


def test_matmul_pass_time_comes_from_gemm_cost():
    for df in ("os", "ws", "is"):
        acc = small_acc(df)
        full = Matmul(whole(Slot("ofmap", 0, 8, 8)), whole(Slot("ifmap", 0, 8, 20)),
                      whole(Slot("filter", 0, 20, 8)), 8, 20, 8, fill=True)
        # one fold: gemm_cost's compute cycles plus the last cycle it leaves uncounted
        assert pass_cycles(acc, full) == gemm_cost(acc, 8, 20, 8).compute_cycles + 1
        cont = Matmul(full.dst, full.a, full.b, 8, 20, 8, accumulate=True, fill=False)
        # a continuation chunk of a fold does not pay the fold's fill again
        assert pass_cycles(acc, full) - pass_cycles(acc, cont) == acc.fill_cycles()


def test_matmul_reading_the_array_before_a_preload_is_refused():
    acc = small_acc("ws")
    s, _ = _gemm_stream(acc, False, 1)
    s.main = [i for i in s.main if not isinstance(i, Preload)]
    with pytest.raises(sab.SimulationError, match="before any PRELOAD"):
        sab.simulate(s, {"a": np.zeros((4, 4), np.float32), "b": np.zeros((4, 6), np.float32)})


def test_reading_a_block_nothing_loaded_is_refused():
    acc = small_acc()
    s = stream_with(acc, {"t": ((2, 2), "temp")}, {"vt": ("t", ())},
                    [Store("t", (2, 2), Region(0, 2, 0, 2), Slot("ofmap", 0, 2, 2))], {"out": "vt"})
    with pytest.raises(sab.SimulationError, match="nothing holds block ofmap@0:2x2"):
        sab.simulate(s, {})


def _vec_stream(acc, mode, op, x_shape, out_shape, item=(), second=None):
    bufs = {"x": (x_shape, "input"), "t": (out_shape, "temp")}
    views = {"vx": ("x", ()), "vt": ("t", ())}
    sx = Slot("ifmap", 0, *x_shape)
    prog = [Load(sx, "vx", Region(0, x_shape[0], 0, x_shape[1]), math.prod(x_shape))]
    srcs = [whole(sx)]
    if second is not None:
        bufs["y"] = (second, "input")
        views["vy"] = ("y", ())
        sy = Slot("filter", 0, *second)
        prog.append(Load(sy, "vy", Region(0, second[0], 0, second[1]), math.prod(second)))
        srcs.append(whole(sy))
    dst = Slot("ofmap", 0, *out_shape)
    prog += [Vec(mode, op, whole(dst), tuple(srcs), item), Store("t", out_shape, Region(0, out_shape[0], 0, out_shape[1]), dst)]
    return stream_with(acc, bufs, views, prog, {"out": "vt"})


@pytest.mark.parametrize("mode,op,x_shape,out_shape,item,second,expect,ops", [
    ("map", "relu", (3, 8), (3, 8), (), None, lambda x, y: np.maximum(x, 0), 1),
    ("map", "(clip -0.5 0.5)", (3, 8), (3, 8), (), None, lambda x, y: np.clip(x, -0.5, 0.5), 2),
    ("zip", "elementwise-mul", (3, 8), (3, 8), (), (3, 8), lambda x, y: x * y, None),
    ("bias", "elementwise-add", (3, 8), (3, 8), (), (1, 8), lambda x, y: x + y, None),
    ("row", "reduce-max", (4, 6), (4, 1), (2, 3), None, lambda x, y: x.max(1, keepdims=True), None),
    ("row", "softmax", (4, 6), (4, 6), (6,), None,
     lambda x, y: np.exp(x - x.max(1, keepdims=True)) / np.exp(x - x.max(1, keepdims=True)).sum(1, keepdims=True), 6),
    ("axis0", "elementwise-add", (3, 5), (1, 5), (), None, lambda x, y: x.sum(0, keepdims=True), None),
])
def test_vector_unit_modes(mode, op, x_shape, out_shape, item, second, expect, ops):
    acc = small_acc()
    s = _vec_stream(acc, mode, op, x_shape, out_shape, item, second)
    x = RNG.standard_normal(x_shape).astype(np.float32)
    feeds = {"x": x}
    y = None
    if second is not None:
        y = feeds["y"] = RNG.standard_normal(second).astype(np.float32)
    np.testing.assert_allclose(sab.simulate(s, feeds)["out"], expect(x, y), rtol=1e-6, atol=1e-6)
    vec = next(i for i in s.main if isinstance(i, Vec))
    if ops is not None:      # the cost model's arithmetic per output element, on vector_lanes
        assert sab.cycles(s)["busy"]["vector"] == vector_cycles(acc, math.prod(out_shape), ops)
    assert vec.mode == mode
    roundtrip(s)


def test_host_step_runs_a_term_on_dram_buffers():
    acc = small_acc()
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    term = "(compute dot-product (access-pair (access (access-tensor x) 1) (access (access-tensor x) 1)))"
    s = stream_with(acc, {"x": ((3, 4), "input"), "t": ((3,), "temp")}, {"vt": ("t", ())},
                    [Host("t", term, 12, 12, "a dot-product left off the array")], {"out": "vt"})
    np.testing.assert_allclose(sab.simulate(s, {"x": x})["out"], (x * x).sum(1), rtol=1e-6)
    rep = sab.cycles(s)
    assert rep["host_macs"] == 12 and rep["host_steps"][0]["reason"] == "a dot-product left off the array"
    assert rep["busy"]["host"] > 12
    roundtrip(s)


def test_a_missing_or_misshaped_tensor_is_a_one_line_error():
    acc = small_acc()
    s = stream_with(acc, {"x": ((3, 4), "input")}, {"vx": ("x", ())}, [], {"out": "vx"})
    with pytest.raises(sab.SimulationError, match="no value given for tensor 'x'"):
        sab.simulate(s, {})
    with pytest.raises(sab.SimulationError, match=r"has shape \(4, 3\)"):
        sab.simulate(s, {"x": np.zeros((4, 3), np.float32)})


def test_matmul_init_starts_the_accumulators_from_a_bias_row():
    acc = small_acc()
    a = RNG.standard_normal((4, 6)).astype(np.float32)
    b = RNG.standard_normal((6, 5)).astype(np.float32)
    bias = RNG.standard_normal((1, 5)).astype(np.float32)
    sa, sb, sbias, out = Slot("ifmap", 0, 4, 6), Slot("filter", 0, 6, 5), Slot("ofmap", 64, 1, 5), Slot("ofmap", 0, 4, 5)
    s = stream_with(acc, {"a": ((4, 6), "input"), "b": ((6, 5), "weight"), "c": ((1, 5), "weight"),
                          "t": ((4, 5), "temp")},
                    {"va": ("a", ()), "vb": ("b", ()), "vc": ("c", ()), "vt": ("t", ())},
                    [Load(sa, "va", Region(0, 4, 0, 6), 24), Load(sb, "vb", Region(0, 6, 0, 5), 30),
                     Load(sbias, "vc", Region(0, 1, 0, 5), 5),
                     Matmul(whole(out), whole(sa), whole(sb), 4, 6, 5, init=whole(sbias)),
                     Store("t", (4, 5), Region(0, 4, 0, 5), out)], {"out": "vt"})
    got = sab.simulate(s, {"a": a, "b": b, "c": bias})["out"]
    np.testing.assert_allclose(got, a @ b + bias, rtol=1e-5, atol=1e-5)
    assert "init=ofmap@64:1x5[0:1,0:5]" in sab.to_text(s)
    roundtrip(s)
    # the pass reads the bias row's scratchpad words, so it is timed after that row's LOAD
    from apsat.backends.systolic.timing import footprint_of

    reads = footprint_of(s, s.main[3])[2]
    assert ("sp:ofmap", 64, 69) in reads
