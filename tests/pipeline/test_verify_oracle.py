"""Verification's float64 rule (apsat.pipeline.verify, apsat.pipeline.oracle): the float64
copy of a model runs in onnxruntime and agrees with float32 onnxruntime to float32
rounding, its rewrites of the ops onnxruntime runs in float32 only compute what the ops
do, an honest optimised program passes while a planted sign flip or dropped bias fails on
deep networks (ResNet-50, a BERT encoder), an error a fixed tolerance lets through on a
shallow network fails, a model with no float64 copy falls back to the fixed tolerance
and says so, and NaN must sit where onnxruntime puts it."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from models import make_model, single_op, small_convnet

import apsat
from apsat.pipeline.oracle import float64_run
from apsat.pipeline.verify import FLOOR, K, Oracle, compare, judge, run_oracle, verify_program
from apsat.pipeline.zoo import light_model_paths, ort_run, random_inputs, randomize_weights

ROOT = Path(__file__).resolve().parents[2]
ZOO = ROOT / "tests" / "data" / "real_zoo"


def _bench():
    """benchmarks/verify_oracle.py, whose planting helpers the tests share."""
    spec = importlib.util.spec_from_file_location("bench_verify_oracle", ROOT / "benchmarks" / "verify_oracle.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _scaled(a, b) -> float:
    return float(np.abs(np.asarray(a, np.float64) - b).max() / np.abs(b).max())


def test_float64_copy_runs_and_matches_float32_onnxruntime():
    proto = small_convnet()
    inputs = random_inputs(proto, 0)
    ref, notes = float64_run(proto, inputs)
    want = ort_run(proto, inputs)
    assert set(ref) == set(want) and all(v.dtype == np.float64 for v in ref.values())
    assert any(n.startswith("Conv x") and "rewritten" in n for n in notes), notes
    for name in want:
        assert 0 < _scaled(want[name], ref[name]) < 1e-5, name


@pytest.mark.parametrize("op, shapes, attrs", [
    ("Conv", [(1, 4, 9, 10), (6, 2, 3, 2)], dict(group=2, strides=[2, 1], pads=[1, 0, 2, 1], dilations=[1, 2])),
    ("Conv", [(2, 3, 8, 8), (5, 3, 3, 3), (5,)], dict(auto_pad="SAME_UPPER", strides=[2, 2])),
    ("Conv", [(1, 4, 11), (4, 1, 3)], dict(group=4, auto_pad="SAME_LOWER")),
    ("AveragePool", [(1, 3, 7, 7)], dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1)),
    ("AveragePool", [(1, 3, 7, 7)], dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1)),
    ("GlobalAveragePool", [(2, 3, 5, 6)], {}),
    ("LRN", [(1, 7, 4, 4)], dict(size=5, alpha=1e-2, beta=0.75, bias=2.0)),
    ("InstanceNormalization", [(2, 3, 5, 6), (3,), (3,)], dict(epsilon=1e-3)),
])
def test_float64_rewrites_compute_the_op(op, shapes, attrs):
    """Each op onnxruntime has no double kernel for is rewritten in the copy into ops
    that have one: it agrees with the float32 op to float32 rounding."""
    rng = np.random.default_rng(0)
    args = [shapes[0]] + [rng.standard_normal(s).astype(np.float32) for s in shapes[1:]]
    proto = single_op(op, args, attrs)
    inputs = random_inputs(proto, 1)
    ref, notes = float64_run(proto, inputs)
    assert notes == [f"{op} x1 rewritten"]
    want = ort_run(proto, inputs)
    (name, value), = want.items()
    assert ref[name].shape == value.shape and _scaled(value, ref[name]) < 1e-6


def _optimised(proto):
    """(model, program after the gpu target's saturation plan and extraction)."""
    from apsat.egraph.driver import EGraph
    from apsat.extract import extract
    from apsat.rules.saturate import saturate

    model = apsat.load_onnx(proto)
    eg = EGraph(target="gpu")
    handles = eg.add_outputs(model.program)
    saturate(eg, None)
    return model, extract(eg, handles)


def _resnet50():
    path = next(p for p in light_model_paths() if p.stem == "light_resnet50")
    return randomize_weights(onnx.load(str(path)), seed=1), None


def _bert():
    """The real zoo's BERT encoder with seeded biases and LayerNorm weights (its own are
    zeros and ones, so a dropped bias would change nothing)."""
    with np.load(ZOO / "bert.npz") as data:
        inputs = {k: data[k] for k in data.files if not k.startswith("output:")}
    return randomize_weights(onnx.load(str(ZOO / "bert.onnx")), seed=3), inputs


@pytest.mark.slow
@pytest.mark.parametrize("build", [_resnet50, _bert], ids=["resnet50", "bert"])
def test_planted_sign_flip_and_dropped_bias_fail_on_a_deep_network(build):
    bench = _bench()
    proto, inputs = build()
    model, program = _optimised(proto)
    inputs = inputs if inputs is not None else random_inputs(model, 2)
    oracle = run_oracle(model.onnx, inputs)
    assert oracle.label == "float64 (onnxruntime)"
    honest = verify_program(model, program, inputs, oracle=oracle)
    assert honest.ok and honest.err_apsat <= K * honest.err_ort + FLOOR, honest
    flipped, _ = bench.plant_sign_flip(program, model, inputs)
    v = verify_program(model, flipped, inputs, oracle=oracle)
    assert not v.ok and v.ratio > 100, v
    dropped, weights, bias = bench.plant_dropped_bias(program, model, inputs)
    v = verify_program(SimpleNamespace(onnx=model.onnx, weights=weights), dropped, inputs, oracle=oracle)
    assert not v.ok and v.ratio > 100, (bias, v)


def test_a_small_error_on_a_shallow_network_fails_where_a_fixed_tolerance_passes():
    """The last weight matrix of a 2-layer MLP off by 3e-5 of itself (a constant folded
    wrongly, say): within rtol 1e-4 / atol 1e-5, but ~300x what float32 rounding costs
    onnxruntime here."""
    rng = np.random.default_rng(0)
    w1, w2 = rng.standard_normal((16, 32)).astype(np.float32), rng.standard_normal((32, 8)).astype(np.float32)
    nodes = [onnx.helper.make_node("MatMul", ["x", "w1"], ["h"]), onnx.helper.make_node("Relu", ["h"], ["r"]),
             onnx.helper.make_node("MatMul", ["r", "w2"], ["y"])]
    model = apsat.load_onnx(make_model(nodes, {"x": (4, 16)}, ["y"], {"w1": w1, "w2": w2}))
    inputs = random_inputs(model, 0)
    assert verify_program(model, model.program, inputs).ok
    off = {**model.weights, "w2": model.weights["w2"] * np.float32(1 + 3e-5)}
    wrong = SimpleNamespace(onnx=model.onnx, weights=off)
    v = verify_program(wrong, model.program, inputs)
    got = apsat.evaluate(model.program, {**off, **inputs})
    assert compare(ort_run(model.onnx, inputs), {"y": got}).ok       # the fixed tolerance passes it
    assert not v.ok and v.oracle == "float64 (onnxruntime)", v


def test_without_a_float64_copy_verification_falls_back_and_says_so():
    """ConvTranspose has no double kernel and no rewrite here: the fixed tolerance against
    float32 onnxruntime decides, and the report names the oracle and why."""
    w = np.random.default_rng(0).standard_normal((3, 2, 3, 3)).astype(np.float32)
    model = apsat.load_onnx(single_op("ConvTranspose", [(1, 3, 5, 5), w]))
    v = verify_program(model, model.program, random_inputs(model, 0))
    assert v.ok and v.oracle.startswith("float32 (no float64 copy runs: ") and "ConvTranspose" in v.oracle
    assert v.err_apsat is None and v.k is None and (v.rtol, v.atol) == (1e-4, 1e-5)


def test_optimize_reports_both_errors_the_ratio_and_the_rule():
    res = apsat.optimize(small_convnet(), target="gpu")
    v = res.report["verification"]
    assert v["ok"] and v["oracle"] == "float64 (onnxruntime)" and (v["k"], v["floor"]) == (K, FLOOR)
    assert 0 < v["err_ort"] < 1e-5 and v["err_apsat"] <= K * v["err_ort"] + FLOOR
    assert v["ratio"] == pytest.approx(v["err_apsat"] / v["err_ort"])
    assert v["max_abs_err"] >= 0 and "Conv x2 rewritten" in v["oracle_notes"]


def _oracle(values: np.ndarray) -> Oracle:
    ref = values.astype(np.float64)
    return Oracle({"y": values.astype(np.float32)}, {"y": ref}, "float64 (onnxruntime)")


def test_nan_must_sit_where_onnxruntime_has_it():
    want = np.array([1.0, np.nan, 3.0, np.inf, -2.0], np.float32)
    assert judge(_oracle(want), {"y": want.copy()}).ok
    moved = np.array([1.0, 2.0, np.nan, np.inf, -2.0], np.float32)
    assert not judge(_oracle(want), {"y": moved}).ok
    assert not judge(_oracle(want), {"y": np.where(np.isinf(want), -np.inf, want)}).ok   # another infinity
    fallback = Oracle({"y": want}, None, "float32 (no float64 copy runs: test)")
    assert judge(fallback, {"y": want.copy()}).ok and not judge(fallback, {"y": moved}).ok


def test_an_exact_output_leaves_only_the_floor():
    """Where onnxruntime is exact (err 0), apsat may be off by FLOOR of the scale, no more."""
    want = np.linspace(-4, 4, 9).astype(np.float32)
    near, far = want.copy(), want.copy()
    near[0] += np.float32(4.0 * FLOOR * 0.5)
    far[0] += np.float32(4.0 * FLOOR * 4)
    v = judge(_oracle(want), {"y": near})
    assert v.ok and v.err_ort == 0 and v.ratio is None
    assert not judge(_oracle(want), {"y": far}).ok
