"""Half-precision models against the float64 yardstick (apsat.pipeline.oracle): the float64
copy of a float16 or bfloat16 model is really double, so onnxruntime's own error in the
model's type sets the bar (the float64 rule of apsat.pipeline.verify: err(apsat) <=
8 x err(onnxruntime) + 4 float32 ulps). Before, the copy converted float32 only and an fp16
model's "float64" run was its fp16 run: onnxruntime's error counted as none and an honest
program failed."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import onnx
import pytest
from models import small_convnet
from onnx import TensorProto, numpy_helper

import apsat
from apsat.errors import ModelError
from apsat.pipeline.oracle import float64_run
from apsat.pipeline.verify import run_oracle, verify_program
from apsat.pipeline.zoo import ort_run

ROOT = Path(__file__).resolve().parents[2]
NARROW = {TensorProto.FLOAT16: np.float16, TensorProto.BFLOAT16: onnx.helper.tensor_dtype_to_np_dtype(TensorProto.BFLOAT16)}


def _retyped(proto: onnx.ModelProto, elem: int, widen: bool) -> onnx.ModelProto:
    """`proto` with its float32 weights rounded to `elem`, kept in `elem` (its values
    typed `elem`) or, with `widen`, widened back to float32 exactly."""
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    g = out.graph
    for i, init in enumerate(g.initializer):
        narrow = numpy_helper.to_array(init).astype(NARROW[elem])
        g.initializer[i].CopyFrom(numpy_helper.from_array(narrow.astype(np.float32) if widen else narrow, init.name))
    if not widen:
        for vi in [*g.input, *g.output, *g.value_info]:
            vi.type.tensor_type.elem_type = elem
    return out


@pytest.mark.parametrize("elem", sorted(NARROW), ids=["float16", "bfloat16"])
def test_the_float64_copy_of_a_half_model_is_double(elem):
    """The copy of the half model computes what the float32 model with the same (rounded)
    weights computes in float64, to double precision."""
    base = small_convnet()
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(NARROW[elem])
    half, _ = float64_run(_retyped(base, elem, widen=False), {"x": x})
    wide, _ = float64_run(_retyped(base, elem, widen=True), {"x": x.astype(np.float32)})
    assert half["y"].dtype == np.float64
    np.testing.assert_allclose(half["y"], wide["y"], rtol=1e-12, atol=1e-12)


def test_an_fp16_model_verifies_in_its_type_and_a_planted_flip_fails():
    """The program computes in float16 (its output's type): its error against float64 is an
    fp16 computation's, inside the type's tolerance; a planted sign flip is far outside."""
    from apsat.pipeline.verify import half_tolerance

    spec = importlib.util.spec_from_file_location("bench_verify_oracle", ROOT / "benchmarks" / "verify_oracle.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    proto = _retyped(small_convnet(), TensorProto.FLOAT16, widen=False)
    x = np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype(np.float16)
    assert ort_run(proto, {"x": x})["y"].dtype == np.float16
    res = apsat.optimize(proto, target="gpu", inputs={"x": x})
    v = res.report["verification"]
    assert v["ok"] and v["oracle"] == "float64 (onnxruntime)", v
    assert res.program.float_type() == "f16" and res.program.dtype_of(res.program.root) == "f16"
    assert 2.0 ** -24 < v["err_apsat"] < half_tolerance("f16") and v["floor"] == half_tolerance("f16"), v
    oracle = run_oracle(res.model.onnx, {"x": x})
    flipped, _ = bench.plant_sign_flip(res.program, res.model, {"x": x})
    bad = verify_program(res.model, flipped, {"x": x}, oracle=oracle)
    assert not bad.ok, bad


def test_the_report_says_a_half_model_is_computed_in_its_type():
    proto = _retyped(small_convnet(), TensorProto.FLOAT16, widen=False)
    notices = apsat.load_onnx(proto).notices
    assert any(n.startswith("the model holds float16 values: apsat computes them in their type") for n in notices)
    assert not any("float16" in n for n in apsat.load_onnx(small_convnet()).notices)


def test_dims_measured_in_a_run_of_the_half_model():
    """Where shape inference falls short the dims come from a run with the values as extra
    outputs; a float16 model's values are float16 (declared float, onnxruntime refused)."""
    from apsat.pipeline.oracle import measured_shapes

    proto = _retyped(small_convnet(), TensorProto.FLOAT16, widen=False)
    dims = measured_shapes(proto, {"x": np.zeros((1, 3, 16, 16), np.float16)}, ["r1", "mp"])
    assert dims == {"r1": (1, 8, 16, 16), "mp": (1, 8, 8, 8)}


def test_without_a_float64_copy_a_half_model_is_judged_against_its_float32_copy(monkeypatch):
    """Where no float64 copy runs, the reference is the float32 copy's run (the same
    weights, widened), which equals the widened float32 model's, and the honest program,
    computing in float16, passes the fixed rule at the type's tolerance."""
    from apsat.pipeline import oracle

    def no_copy(*args, **kwargs):
        raise oracle.NoFloat64("no double kernel (planted)")
    monkeypatch.setattr(oracle, "float64_run", no_copy)
    proto = _retyped(small_convnet(), TensorProto.FLOAT16, widen=False)
    x = np.random.default_rng(2).standard_normal((1, 3, 16, 16)).astype(np.float16)
    copy = ort_run(oracle.float32_copy(proto), {"x": x.astype(np.float32)})["y"]
    wide = ort_run(_retyped(small_convnet(), TensorProto.FLOAT16, widen=True), {"x": x.astype(np.float32)})["y"]
    assert copy.dtype == np.float32
    np.testing.assert_allclose(copy, wide, rtol=1e-6, atol=1e-7)
    v = apsat.optimize(proto, target="gpu", inputs={"x": x}).report["verification"]
    assert v["ok"] and v["oracle"].startswith("float32 copy of the half-precision model"), v


def _mlp(seed=0) -> onnx.ModelProto:
    """MatMul + bias -> Relu -> MatMul + bias, float32 (opset 17: each op takes bfloat16)."""
    from onnx import helper
    from models import make_model

    rng = np.random.default_rng(seed)
    w = {"w1": (rng.standard_normal((16, 32)) / 4).astype(np.float32), "b1": rng.standard_normal(32).astype(np.float32),
         "w2": (rng.standard_normal((32, 8)) / 6).astype(np.float32), "b2": rng.standard_normal(8).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m1"]), helper.make_node("Add", ["m1", "b1"], ["a1"]),
             helper.make_node("Relu", ["a1"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["m2"]),
             helper.make_node("Add", ["m2", "b2"], ["y"])]
    return make_model(nodes, {"x": (4, 16)}, ["y"], w)


def test_a_bfloat16_model_onnxruntime_cannot_run_verifies_through_its_float32_copy():
    """onnxruntime's CPU has no bfloat16 Add: the float32 copy stands in for the model's own
    run beside the float64 copy, the honest program passes, a planted sign flip fails."""
    spec = importlib.util.spec_from_file_location("bench_verify_oracle", ROOT / "benchmarks" / "verify_oracle.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    proto = _retyped(_mlp(), TensorProto.BFLOAT16, widen=False)
    x = np.random.default_rng(3).standard_normal((4, 16)).astype(NARROW[TensorProto.BFLOAT16])
    with pytest.raises(ModelError, match="Could not find an implementation"):
        ort_run(proto, {"x": x})
    res = apsat.optimize(proto, target="gpu", inputs={"x": x})
    v = res.report["verification"]
    assert v["ok"] and "its float32 copy stands in for its own run" in v["oracle"], v
    assert v["oracle"].startswith("float64 (onnxruntime)") and v["err_ort"] > 0, v
    oracle = run_oracle(res.model.onnx, {"x": x})
    flipped, _ = bench.plant_sign_flip(res.program, res.model, {"x": x})
    assert not verify_program(res.model, flipped, {"x": x}, oracle=oracle).ok
