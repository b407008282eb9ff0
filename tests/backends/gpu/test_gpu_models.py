"""End to end under the Triton interpreter: models optimised for the gpu target, run by
their generated kernels, equal onnxruntime on the original model (apsat.pipeline.verify's
tolerances: rtol 1e-4, atol 1e-5 x the output's scale), and the unsupported parts run as
named host steps."""
from __future__ import annotations

import models
import numpy as np
import pytest
from onnx import helper

import apsat
from apsat.backends.gpu.lower import lower
from apsat.pipeline.verify import compare
from apsat.pipeline.zoo import ort_run, random_inputs


def _check(model, triton_run, **kwargs):
    res = apsat.optimize(model, target="gpu", verify=False)
    inputs = random_inputs(res.model, 0)
    want = ort_run(res.model.onnx, inputs)
    got = triton_run(res.program, {**res.model.weights, **inputs}, **kwargs)
    got = got if isinstance(got, dict) else {next(iter(res.program.outputs)): got}
    v = compare(want, got)
    assert v.ok, v
    return res


@pytest.mark.parametrize("builder", ["small_convnet", "encoder_block", "mlp3", "grouped_convnet"])
def test_model_matches_onnxruntime(builder, triton_run):
    _check(apsat.load_onnx(getattr(models, builder)()), triton_run)


@pytest.mark.parametrize("op, keepdims", [("ReduceSum", 0), ("ReduceMax", 1), ("ReduceMean", 0)])
def test_reduction_to_one_value(op, keepdims, triton_run):
    """Every axis reduced: the kernel stores one value at a constant offset."""
    _check(models.single_op(op, [(3, 4)], {"keepdims": keepdims}, opset=18), triton_run)


@pytest.mark.parametrize("ops", [("Add", "Relu", "Sigmoid"), ("Mul", "Tanh")], ids=["add-relu-sigmoid", "mul-tanh"])
def test_elementwise_run_is_one_chain_kernel_matching_onnxruntime(ops, triton_run):
    """fusion/chain leaves one `compute (chain ...)`; its one element-wise Triton kernel
    equals onnxruntime."""
    res = _check(apsat.load_onnx(models.elementwise_chain(ops)), triton_run)
    (kernel,) = lower(res.program).steps
    assert kernel.kind == "elementwise" and kernel.name == "k00_elementwise_chain"
    assert len(kernel.covers) == len(ops)


def _cos_model():
    """MatMul, Atan (no lowering: an opaque call), Relu."""
    w = (np.random.default_rng(0).standard_normal((19, 23)) * 0.3).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"]), helper.make_node("Atan", ["m"], ["c"]),
             helper.make_node("Relu", ["c"], ["y"])]
    return apsat.load_onnx(models.make_model(nodes, {"x": (5, 19)}, ["y"], {"W": w}))


def test_opaque_node_is_a_named_host_step(triton_run):
    res = _check(_cos_model(), triton_run)
    graph = lower(res.program)
    (host,) = graph.host_steps
    assert host.runner == "onnxruntime" and host.op == "opaque Atan" and "Atan" in host.reason
    assert [s.name for s in graph.steps] == ["k00_gemm_dot_product", "h01_opaque_atan",
                                             "k02_elementwise_relu"]


def test_unexpressible_view_falls_back_to_the_reference(triton_run, monkeypatch):
    """Where the kernels cannot read a view (forced here for windows), the convolution
    runs on the host in the reference interpreter, named with the reason, and the model
    still equals onnxruntime."""
    from apsat.backends.gpu import views

    def refuse(self, t, idx, conds):
        raise views.Unsupported("windows refused by this test")

    monkeypatch.setattr(views.Values, "_windows", refuse)
    res = _check(apsat.load_onnx(models.small_convnet()), triton_run)
    hosts = lower(res.program).host_steps
    assert hosts and all(h.runner == "reference" and h.reason == "windows refused by this test"
                         for h in hosts)
    assert {h.op for h in hosts} >= {"fused-dot-bias-act"}
