"""The gpu roofline by element type (issue 32, part 4): half products at the tensor-core
peak, bytes at each value's width, the same for the e-node model (the serialised e-graph
carries each class's type) and for the backend's kernels; f32 figures as before."""
from __future__ import annotations

import math

import pytest
from models import mlp3

from apsat.egraph.driver import EGraph
from apsat.extract import imported_cost
from apsat.extract.cost_gpu import GpuRoofline
from apsat.extract.decode import language_graph
from apsat.frontend.importer import load_onnx
from apsat.targets.gpu import HBM_BYTES_PER_US, LAUNCH_US, TFLOPS, Roofline


def test_peaks_by_operand_type():
    r = Roofline("fp32", calibration=None)
    flop = 1e12
    assert TFLOPS["fp16"] == TFLOPS["bf16"] == 989.0 and TFLOPS["fp32"] == 67.0 and TFLOPS["tf32"] == 494.0
    assert r.kernel_us(flop, 0.0, True, dtype="f16") == pytest.approx(LAUNCH_US + flop / 989e6)
    assert r.kernel_us(flop, 0.0, True, dtype="bf16") == pytest.approx(LAUNCH_US + flop / 989e6)
    assert r.kernel_us(flop, 0.0, True, dtype="f32") == pytest.approx(LAUNCH_US + flop / 67e6)
    # element-wise work runs in float32 registers whatever the value's type
    assert r.kernel_us(flop, 0.0, False, dtype="f16") == pytest.approx(LAUNCH_US + flop / 67e6)
    # bytes: the caller's (each buffer at its width), else 4 per element
    assert r.kernel_us(0.0, 1e9, False) == pytest.approx(LAUNCH_US + 4e9 / HBM_BYTES_PER_US)
    assert r.kernel_us(0.0, 1e9, False, moved_bytes=2e9) == pytest.approx(LAUNCH_US + 2e9 / HBM_BYTES_PER_US)


def _half(proto):
    f16 = pytest.importorskip("onnxruntime.transformers.float16")
    return f16.convert_float_to_float16(proto, keep_io_types=False)


def _egraph(proto):
    eg = EGraph("gpu")
    handles = eg.add_outputs(load_onnx(proto).program)
    return eg, handles


def test_serialised_classes_carry_their_type():
    eg, _ = _egraph(_half(mlp3()))
    graph = language_graph(eg.serialize())
    assert graph.dtypes and set(graph.dtypes.values()) == {"f16"}
    eg32, _ = _egraph(mlp3())
    assert set(language_graph(eg32.serialize()).dtypes.values()) == {"f32"}


def test_enode_model_prices_half_bytes_and_peaks():
    """Each node of the f16 graph costs what the f32 graph's does with half the bytes and,
    for products, the tensor-core peak: per kernel node, the f16 time is launch plus the
    larger of flop/989 and half the f32 bytes over the bandwidth."""
    costs = {}
    for name, proto in (("f32", mlp3()), ("f16", _half(mlp3()))):
        eg, handles = _egraph(proto)
        graph = language_graph(eg.serialize())
        model = GpuRoofline(calibration=None)
        node_cost = model.node_cost(graph)
        costs[name] = sorted((graph.nodes[n]["op"], node_cost(n)) for n in graph.nodes
                             if node_cost(n) > 0 and math.isfinite(node_cost(n)))
        costs[name + "-dag"] = imported_cost(eg, handles, GpuRoofline(calibration=None))
    assert [op for op, _ in costs["f32"]] == [op for op, _ in costs["f16"]]
    for (op, c32), (_, c16) in zip(costs["f32"], costs["f16"]):
        assert c16 < c32
        # memory-bound at these sizes: half the bytes, the same launch
        assert c16 - LAUNCH_US == pytest.approx((c32 - LAUNCH_US) / 2, rel=1e-9) or op in (
            "fused-dot-bias", "fused-dot-bias-act", "compute")
    assert costs["f16-dag"] < costs["f32-dag"]


def test_backend_kernels_priced_by_type(monkeypatch):
    """The backend's kernels: bytes at each buffer's width (the f32 figure is elements x
    4, as before types), products at the operands' peak."""
    import apsat
    from apsat.backends.gpu.lower import lower

    monkeypatch.setenv("APSAT_GPU_CALIBRATION", "none")      # the data sheet's figures
    for proto, width, peak in ((mlp3(), 4, TFLOPS["fp32"]), (_half(mlp3()), 2, TFLOPS["fp16"])):
        res = apsat.optimize(load_onnx(proto), target="gpu", verify=False)
        for k in lower(res.program).kernels:
            assert k.kind == "gemm" and k.bytes == (k.elements_read + k.elements_written) * width
            assert k.modelled_us == pytest.approx(LAUNCH_US + max(k.flops / (peak * 1e6), k.bytes / HBM_BYTES_PER_US))
