"""Gather, GatherElements, GatherND, CumSum and Pad's non-zero and reflecting modes: each
imports into the language (access-gather, views and products; no opaque call and no chain
of concatenations), and equals onnxruntime through the reference interpreter, the gpu
target's Triton kernels (the interpreter on a CPU), the systolic simulator and the ONNX
export. Indices are seeded random integers, negative ones included; tolerance rtol 1e-6,
atol 1e-6 (gathers move values exactly; CumSum's triangular product sums in another order).
"""
from __future__ import annotations

import numpy as np
import pytest
from backend_cases import BACKENDS, assert_backend_equals, checked_model, prepare
from onnx import TensorProto, helper

import apsat
from apsat.lang.evaluate import evaluate

RNG = np.random.default_rng(7)
F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _rel_index(w: int) -> np.ndarray:
    """A w x w window's relative-position index map (Swin's), (w*w, w*w)."""
    c = np.stack(np.meshgrid(np.arange(w), np.arange(w), indexing="ij")).reshape(2, -1)
    rel = c[:, :, None] - c[:, None, :] + (w - 1)
    return rel[0] * (2 * w - 1) + rel[1]


def _x(*dims):
    return RNG.standard_normal(dims).astype(np.float32)


CASES = {
    # an embedding: token ids (negative ones count from the end) into a weight table
    "embedding": (lambda: checked_model(
        [helper.make_node("Gather", ["table", "ids"], ["e"]), helper.make_node("Relu", ["e"], ["y"])],
        {"ids": (I64, [2, 7])}, {"y": (F, [2, 7, 8])}, {"table": _x(30, 8)}),
        {"ids": RNG.integers(-30, 30, (2, 7))}),
    # a gather of activations by constant, non-contiguous indices
    "constant_indices": (lambda: checked_model(
        [helper.make_node("Gather", ["x", "idx"], ["y"], axis=1)],
        {"x": (F, [3, 6, 4])}, {"y": (F, [3, 2, 3, 4])}, {"idx": np.array([[5, 0, 2], [2, 2, -1]])}),
        {"x": _x(3, 6, 4)}),
    # a relative-position bias: table and index both weights fold at import
    "relative_position_bias": (lambda: checked_model(
        [helper.make_node("Gather", ["table", "idx"], ["b"]),
         helper.make_node("Transpose", ["b"], ["bt"], perm=[2, 0, 1]), helper.make_node("Add", ["x", "bt"], ["y"])],
        {"x": (F, [3, 49, 49])}, {"y": (F, [3, 49, 49])},
        {"table": _x(169, 3), "idx": _rel_index(7)}), {"x": _x(3, 49, 49)}),
    "gather_elements": (lambda: checked_model(
        [helper.make_node("GatherElements", ["x", "ix"], ["y"], axis=1)],
        {"x": (F, [3, 6]), "ix": (I64, [3, 4])}, {"y": (F, [3, 4])}, {}),
        {"x": _x(3, 6), "ix": RNG.integers(-6, 6, (3, 4))}),
    "gather_elements_constant": (lambda: checked_model(
        [helper.make_node("GatherElements", ["x", "ix"], ["y"], axis=0)],
        {"x": (F, [4, 5])}, {"y": (F, [2, 5])}, {"ix": RNG.integers(-4, 4, (2, 5))}), {"x": _x(4, 5)}),
    "gather_nd": (lambda: checked_model(
        [helper.make_node("GatherND", ["x", "ix"], ["y"])],
        {"x": (F, [4, 5, 3]), "ix": (I64, [6, 2])}, {"y": (F, [6, 3])}, {}),
        {"x": _x(4, 5, 3), "ix": np.stack([RNG.integers(-4, 4, 6), RNG.integers(-5, 5, 6)], -1)}),
    "cumsum": (lambda: checked_model(
        [helper.make_node("CumSum", ["x", "ax"], ["a"]),
         helper.make_node("CumSum", ["x", "ax"], ["b"], exclusive=1, reverse=1),
         helper.make_node("CumSum", ["x", "ax0"], ["c"], reverse=1)],
        {"x": (F, [3, 7])}, {"a": (F, [3, 7]), "b": (F, [3, 7]), "c": (F, [3, 7])},
        {"ax": np.array(1), "ax0": np.array(0)}), {"x": _x(3, 7)}),
    # position ids as transformers export them: cumsum of a mask of integers
    "position_ids": (lambda: checked_model(
        [helper.make_node("CumSum", ["mask", "ax"], ["c"]), helper.make_node("Mul", ["c", "mask"], ["p"]),
         helper.make_node("Gather", ["pos", "p"], ["y"])],
        {"mask": (I64, [2, 6])}, {"y": (F, [2, 6, 4])}, {"ax": np.array(1), "pos": _x(8, 4)}),
        {"mask": RNG.integers(0, 2, (2, 6))}),
    "pad_value": (lambda: checked_model(
        [helper.make_node("Pad", ["x", "pads", "v"], ["y"])],
        {"x": (F, [1, 2, 4, 4])}, {"y": (F, [1, 2, 7, 5])},
        {"pads": np.array([0, 0, 2, 0, 0, 0, 1, 1]), "v": np.array(1.0, np.float32)}), {"x": _x(1, 2, 4, 4)}),
    "pad_reflect_edge_wrap": (lambda: checked_model(
        [helper.make_node("Pad", ["x", "pads"], ["r"], mode="reflect"),
         helper.make_node("Pad", ["x", "pads"], ["e"], mode="edge"),
         helper.make_node("Pad", ["x", "pads"], ["w"], mode="wrap")],
        {"x": (F, [2, 5, 4])}, {k: (F, [2, 6, 7]) for k in "rew"},
        {"pads": np.array([0, 1, 1, 0, 0, 2])}, opset=19), {"x": _x(2, 5, 4)}),
}


@pytest.fixture(scope="module")
def results():
    return {name: prepare(build(), inputs) for name, (build, inputs) in CASES.items()}


@pytest.mark.parametrize("case", sorted(CASES))
def test_imports_without_opaque_calls_or_concatenation_chains(results, case):
    program = results[case]["model"].program
    ops = [t.op for t in program.terms()]
    assert not program.opaque_nodes, f"{case}: opaque {sorted(program.opaque_nodes)}"
    assert ops.count("access-concatenate") <= 2, f"{case}: {ops.count('access-concatenate')} concatenations"
    if case in ("embedding", "constant_indices", "gather_elements", "gather_nd", "pad_reflect_edge_wrap"):
        assert "access-gather" in ops
    if case == "relative_position_bias":       # folded: the bias is one weight
        assert "access-gather" not in ops and len(program.weights) == 1


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_equals_onnxruntime(results, case, backend):
    assert_backend_equals(results[case], backend, 1e-6, 1e-6, case)


@pytest.mark.parametrize("case", sorted(CASES))
def test_gpu_has_no_host_step(results, case):
    from apsat.backends.gpu.lower import lower

    assert not lower(results[case]["gpu"].program).host_steps


def test_gather_kernel_compiles_as_cuda_c(results, tmp_path):
    """The embedding's CUDA C (an index read from a float buffer, clamped, then a load at it)
    compiles for sm_90."""
    from apsat.backends.gpu import cuda
    from apsat.backends.gpu.lower import lower

    if cuda.nvcc_path() is None:
        pytest.skip("nvcc is not installed")
    for k in lower(results["embedding"]["gpu"].program).kernels:
        source = cuda.kernel_source(k)[0]
        assert "(int)" in source
        info = cuda.compile_cuda(source, tmp_path / f"{k.name}.cubin")
        assert info.get("error") is None, info


def test_out_of_range_indices_clamp_on_every_backend():
    """ONNX leaves an out-of-range index an error; apsat clamps it, the same everywhere."""
    proto = CASES["embedding"][0]()
    model = apsat.load_onnx(proto)
    ids = np.array([[-100, -31, -30, 29, 30, 1000, 3]] * 2, np.float32)
    tensors = {**model.weights, "ids": ids}
    want = np.maximum(model.weights["table"][np.array([0, 0, 0, 29, 29, 29, 3])], 0)[None].repeat(2, 0)
    np.testing.assert_array_equal(evaluate(model.program, tensors), want)
    pytest.importorskip("triton", reason="the GPU backend needs triton (pip install apsat[gpu])")
    from apsat.backends.gpu.runner import run_kernels

    got = run_kernels(apsat.optimize(model, target="gpu", verify=False).program, tensors)
    got = next(iter(got.values())) if isinstance(got, dict) else got
    np.testing.assert_array_equal(np.asarray(got.numpy() if hasattr(got, "numpy") else got), want)
