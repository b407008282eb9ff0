"""LeakyRelu end to end, the worked example of docs/adding-an-op.md: one registry entry
(`leaky-relu` in apsat/lang/ops.py) and one importer mapping (apsat/frontend/lowering.py)
give the importer, the e-graph (an activation: it fuses into the matmul atom), both cost
models and both backends. Optimised programs equal onnxruntime through the reference
interpreter (rtol and atol 1e-5), the systolic simulator and the Triton kernels too."""
from __future__ import annotations

import models
from oracles import assert_program_equals
import numpy as np
import pytest
from onnx import helper

import apsat
from apsat.pipeline.zoo import ort_run, random_inputs

TOL = {"rtol": 1e-5, "atol": 1e-5}


def conv_leaky_relu():
    """Conv (bias, padding 1) -> LeakyRelu (alpha 0.2), NCHW."""
    rng = np.random.default_rng(0)
    w = {"w": (rng.standard_normal((6, 3, 3, 3)) / np.sqrt(27)).astype(np.float32),
         "b": (0.1 * rng.standard_normal(6)).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("LeakyRelu", ["c"], ["y"], alpha=0.2)]
    return models.make_model(nodes, {"x": (1, 3, 9, 9)}, ["y"], w)


def matmul_add_leaky_relu():
    """MatMul -> Add (a per-column bias) -> LeakyRelu with ONNX's default alpha (0.01)."""
    rng = np.random.default_rng(1)
    w = {"W": (rng.standard_normal((19, 23)) / np.sqrt(19)).astype(np.float32),
         "B": (0.1 * rng.standard_normal(23)).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"]), helper.make_node("Add", ["m", "B"], ["a"]),
             helper.make_node("LeakyRelu", ["a"], ["y"])]
    return models.make_model(nodes, {"x": (7, 19)}, ["y"], w)


BUILDERS = {"conv": conv_leaky_relu, "matmul-add": matmul_add_leaky_relu}


def _optimize(name: str, target: str):
    """The model optimised for `target` (its default plan), its inputs and onnxruntime's output."""
    res = apsat.optimize(BUILDERS[name](), target=target, verify=False)
    inputs = random_inputs(res.model, 0)
    return res, inputs, ort_run(res.model.onnx, inputs)["y"]


def _operators(program) -> set[str]:
    """(op, compute operator) pairs of the program, as strings `op operator`."""
    return {f"{t.op} {t.args[0].op}" for t in program.terms() if t.op in ("compute", "fused-dot-bias-act")}


@pytest.mark.parametrize("alpha, want", [({"alpha": 0.3}, 0.3), ({}, 0.01)])
def test_importer_lowers_leaky_relu_with_its_alpha(alpha, want):
    program = apsat.load_onnx(models.single_op("LeakyRelu", [(3, 5)], alpha)).program
    (op,) = [t.args[0] for t in program.terms() if t.op == "compute"]
    assert op.op == "leaky-relu" and op.args == (pytest.approx(want),)


@pytest.mark.parametrize("target", ["gpu", "systolic:32x32"])
@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_optimized_program_equals_onnxruntime(name, target):
    res, inputs, want = _optimize(name, target)
    assert_program_equals(res, {**res.model.weights, **inputs}, want, target, **TOL)


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_gpu_chooses_the_fused_atom(name):
    res, _, _ = _optimize(name, "gpu")
    assert "fused-dot-bias-act leaky-relu" in _operators(res.program)
    assert "compute leaky-relu" not in _operators(res.program)


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_triton_kernels_equal_onnxruntime(name):
    pytest.importorskip("torch", reason="the GPU backend needs torch (pip install apsat[gpu])")
    pytest.importorskip("triton", reason="the GPU backend needs triton (pip install apsat[gpu])")
    from apsat.backends.gpu.lower import lower
    from apsat.backends.gpu.runner import run_kernels as run

    res, inputs, want = _optimize(name, "gpu")
    assert any("fused-dot-bias-act leaky-relu" in k.covers for k in lower(res.program).kernels)
    got = run(res.program, {**res.model.weights, **inputs})
    got = got["y"] if isinstance(got, dict) else got
    np.testing.assert_allclose(got, want, **TOL)


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_cuda_kernels_compile(name, tmp_path):
    from apsat.backends.gpu import cuda
    from apsat.backends.gpu.lower import lower

    if cuda.nvcc_path() is None:
        pytest.skip("nvcc is not on PATH: CUDA sources are generated, not compiled")
    res, _, _ = _optimize(name, "gpu")
    for k in lower(res.program).kernels:
        src, _ = cuda.kernel_source(k)
        out = cuda.compile_cuda(src, tmp_path / f"{k.name}.cu")
        assert out["ok"] and "warning" not in out["log"].lower(), out["log"]
