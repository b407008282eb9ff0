"""Lower precision as a rewrite: `optimize(precision=..., max_error=...)` and `--precision`
(apsat/pipeline/precision.py, apsat/rules/precision.egg).

The model: tests/models.mlp3 at sizes where half products pay on the gpu roofline
(batch 256, 1024 -> 2048 -> 2048 -> 512: 65 µs in fp32, 15 µs in fp16; at batch 128 and
half the widths launches dominate and the extractor keeps float32)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

import apsat
from apsat.cli import main
from apsat.errors import UsageError
from apsat.pipeline.precision import PrecisionError
from apsat.pipeline.verify import half_tolerance

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import models  # noqa: E402

MLP = models.mlp3(batch=256, sizes=(1024, 2048, 2048, 512))


@pytest.fixture(scope="module")
def results():
    """The MLP at fp32 and at each lower precision (one optimise each, verified)."""
    return {p: apsat.optimize(MLP, target="gpu", precision=None if p == "fp32" else p)
            for p in ("fp32", "fp16", "mixed", "bf16")}


@pytest.mark.parametrize("precision, dtype", [("fp16", "f16"), ("mixed", "f16"), ("bf16", "bf16")])
def test_products_compute_in_the_half_type_and_the_error_is_within_the_bound(results, precision, dtype):
    """The products gain half forms the extractor takes (faster on the roofline), the
    inputs and outputs stay float32, and the measured error against the float32 original
    is a half computation's: above float32's, within the default bound (8 ulps)."""
    res, base = results[precision], results["fp32"]
    p = res.report["precision"]
    assert p["precision"] == precision and p["type"] == dtype and p["max_error"] == half_tolerance(dtype)
    assert p["half_nodes"] == p["nodes"] == 3, p          # the three products
    assert 2.0 ** -20 < p["error"] <= p["max_error"], p
    program = res.program
    assert program.float_type() == "f32" and all(program.dtype_of(t) == "f32" for t in program.outputs.values())
    assert sum(k.operand == dtype for k in res.lowered.artifact.kernels if k.kind == "gemm") == 3
    us = res.report["gpu_kernels"]["totals"]["modelled_us"]
    assert us < base.report["gpu_kernels"]["totals"]["modelled_us"]
    assert "precision" not in base.report


def test_the_export_holds_half_weights_and_float32_inputs_and_outputs(results):
    """The fp16 result's ONNX export: float16 weights for the products, float32 inputs
    and outputs as the original's, and onnxruntime's run of it within the bound of the
    original's float32 run."""
    import onnxruntime as ort

    res = results["fp16"]
    out = res.to_onnx()
    kinds = {t.data_type for t in out.graph.initializer}
    assert onnx.TensorProto.FLOAT16 in kinds
    assert all(v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT for v in [*out.graph.input, *out.graph.output])
    x = np.random.default_rng(0).standard_normal((256, 1024)).astype(np.float32)
    runs = [ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]) for m in (MLP, out)]
    want, got = (s.run(None, {s.get_inputs()[0].name: x})[0] for s in runs)
    assert np.abs(got - want).max() <= half_tolerance("f16") * np.abs(want).max()


def test_a_result_past_the_bound_is_refused_in_one_line():
    with pytest.raises(PrecisionError, match=r"^precision fp16: the result's error against the float32 "
                                             r"original, .* passes the bound 1\.0e-09 \(max_error\)$"):
        apsat.optimize(MLP, target="gpu", precision="fp16", max_error=1e-9)


@pytest.mark.parametrize("kwargs, message", [
    ({"precision": "fp8"}, "precision 'fp8': use one of fp32, fp16, bf16, mixed"),
    ({"max_error": 1e-3}, "max_error bounds a lower precision"),
    ({"precision": "fp16", "max_error": -1.0}, "max_error -1.0: a positive number"),
    ({"precision": "fp16", "target": "systolic"}, "lower precision is for the gpu target"),
])
def test_requests_that_cannot_be_met_are_usage_errors(kwargs, message):
    with pytest.raises(UsageError, match=message):
        apsat.optimize(models.small_convnet(), **{"target": "gpu", **kwargs})


def test_a_half_model_is_not_lowered_again():
    f16 = pytest.importorskip("onnxruntime.transformers.float16")
    half = f16.convert_float_to_float16(models.small_convnet(), keep_io_types=False)
    with pytest.raises(UsageError, match="the model already computes in f16"):
        apsat.optimize(half, target="gpu", precision="fp16")


def test_fp32_and_no_precision_are_the_same_run(results):
    """precision="fp32" sets no facts and adds no phase: the program equals the default's."""
    res = apsat.optimize(MLP, target="gpu", precision="fp32")
    assert res.program.to_text() == results["fp32"].program.to_text() and "precision" not in res.report


def test_the_command_line_refuses_past_max_error_with_status_1(tmp_path, capsys):
    model = tmp_path / "mlp.onnx"
    onnx.save(MLP, str(model))
    out = tmp_path / "out"
    assert main(["optimize", str(model), "--out", str(out), "--precision", "fp16", "--max-error", "1e-9"]) == 1
    assert "passes the bound 1.0e-09" in capsys.readouterr().err
    assert main(["optimize", str(model), "--out", str(out), "--precision", "mixed"]) == 0
    report = json.loads((out / "mlp" / "report.json").read_text())
    assert report["precision"]["precision"] == "mixed" and report["precision"]["half_nodes"] == 3
