"""Shared by the per-op tests that compare every backend with onnxruntime: a checked
one-graph model, and one case run through a backend (the reference interpreter on the
imported program, the gpu target's Triton kernels, the systolic simulator, the export)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import apsat
from apsat.lang.evaluate import evaluate
from apsat.pipeline.zoo import ort_run

BACKENDS = ("reference", "triton", "systolic", "export")


def checked_model(nodes, inputs: dict, outputs: dict, inits: dict, opset: int = 18):
    """A checked model: inputs and outputs name -> (elem type, dims)."""
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, t, d) for n, (t, d) in inputs.items()],
        [helper.make_tensor_value_info(n, t, d) for n, (t, d) in outputs.items()],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def prepare(proto, inputs: dict) -> dict:
    """The case: the model imported, onnxruntime's outputs, the gpu and systolic results."""
    model = apsat.load_onnx(proto)
    return {"proto": proto, "inputs": inputs, "model": model, "want": ort_run(proto, inputs),
            "gpu": apsat.optimize(model, target="gpu", verify=False),
            "systolic": apsat.optimize(model, target="systolic:32x32", verify=False)}


def run_backend(backend: str, r: dict) -> dict:
    names = list(r["want"])
    tensors = {**r["model"].weights, **{k: np.asarray(v, np.float32) for k, v in r["inputs"].items()}}
    if backend == "reference":
        got = evaluate(r["model"].program, tensors)
    elif backend == "triton":
        pytest.importorskip("triton", reason="the GPU backend needs triton (pip install apsat[gpu])")
        from apsat.backends.gpu.runner import run_kernels

        got = run_kernels(r["gpu"].program, tensors)
        got = {k: np.asarray(v.numpy() if hasattr(v, "numpy") else v) for k, v in
               (got if isinstance(got, dict) else {names[0]: got}).items()}
    elif backend == "systolic":
        from apsat.backends import systolic

        res = r["systolic"]
        stream = systolic.compile(res.program, "systolic:32x32", weights=res.model.weights)
        assert not systolic.cycles(stream)["host_steps"]
        got = systolic.simulate(stream, tensors)
    else:
        got = ort_run(r["gpu"].to_onnx(), r["inputs"])
    return got if isinstance(got, dict) else {names[0]: got}


def assert_backend_equals(r: dict, backend: str, rtol: float, atol: float, label: str) -> None:
    """Every output of case `r` through `backend` equals onnxruntime's within rtol/atol
    (integer outputs compared as the float32 the language carries them as)."""
    got = run_backend(backend, r)
    for name, want in r["want"].items():
        np.testing.assert_allclose(np.asarray(got[name], np.float32), want.astype(np.float32), rtol=rtol,
                                   atol=atol, err_msg=f"{label} {backend} {name}")


def assert_verified_without_host_steps(report: dict, target: str) -> None:
    """An optimize report that verified (the simulator too on a systolic target), with no
    opaque call and no host step on `target`, priced as emitted."""
    assert report["verification"]["ok"], report["verification"]
    assert not report["opaque_ops"], report["opaque_ops"]
    assert_priced_as_emitted(report, target)
    if target == "gpu":
        assert report["gpu_kernels"]["totals"]["host_steps"] == 0, report["gpu_kernels"]["host_steps"]
    else:
        assert report["systolic"]["simulation"]["ok"], report["systolic"]["simulation"]
        assert not report["systolic"]["host_steps"], report["systolic"]["host_steps"]


def assert_priced_as_emitted(report: dict, target: str) -> None:
    """The extraction's price is what the backend emits (apsat.pipeline.plan): on gpu the
    kernels launched per inference and their modelled time, on a systolic target the
    stream's cycles; and the imported program was priced by the same model."""
    ext = report["extraction"]
    if target == "gpu":
        totals = report["gpu_kernels"]["totals"]
        assert ext["kernels"] == totals["inference_kernels"], (ext["kernels"], totals)
        assert ext["dag_cost"] == pytest.approx(totals["modelled_us"], rel=1e-12), (ext["dag_cost"], totals)
        assert ext["unit"] == "us"
    else:
        assert ext["dag_cost"] == report["systolic"]["cycles"]["total_cycles"]
        assert ext["unit"] == "cycles"
    assert ext["modelled_speedup"] == pytest.approx(ext["dag_cost_before"] / ext["dag_cost"])
    assert ext["chosen"] in [v["label"] for v in ext["variants"]]
