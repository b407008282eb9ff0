"""TopK (a mixture-of-experts router's choice), Tile, a Cast from float to integer
(truncation toward zero), ScatterND and ScatterElements (lowering_scatter.py: a gather by a
constant source map, or comparisons for run-time indices) import into the language (no opaque call) and equal onnxruntime
through every backend: values and indices, ties at the lower index first, largest and
smallest, along the last axis and another one (rtol 0, atol 0: selections, copies and
truncations give exact values)."""
from __future__ import annotations

import numpy as np
import pytest
from backend_cases import BACKENDS, assert_backend_equals, checked_model, prepare
from onnx import TensorProto, helper

RNG = np.random.default_rng(5)
F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _x(*dims):
    return RNG.standard_normal(dims).astype(np.float32)


def _topk(dims, k, axis=-1, largest=1):
    out = list(dims)
    out[axis] = k
    return checked_model([helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=axis, largest=largest)],
                         {"x": (F, list(dims))}, {"v": (F, out), "i": (I64, out)}, {"k": np.array([k])})


CASES = {
    # router logits of 6 tokens over 8 experts, with ties (small integers)
    "router_ties": (lambda: _topk((6, 8), 2), {"x": RNG.integers(-2, 3, (6, 8)).astype(np.float32)}),
    "smallest_axis0": (lambda: _topk((5, 3, 4), 3, axis=0, largest=0), {"x": RNG.standard_normal((5, 3, 4)).astype(np.float32)}),
    "tile": (lambda: checked_model([helper.make_node("Tile", ["x", "r"], ["y"])], {"x": (F, [2, 3, 1])},
                                   {"y": (F, [4, 3, 5])}, {"r": np.array([2, 1, 5])}),
             {"x": RNG.standard_normal((2, 3, 1)).astype(np.float32)}),
    "cast_truncates": (lambda: checked_model([helper.make_node("Cast", ["x"], ["y"], to=I64)], {"x": (F, [4, 6])},
                                             {"y": (I64, [4, 6])}, {}),
                       {"x": (RNG.standard_normal((4, 6)) * 4).astype(np.float32)}),
    # rows 1 and -1 (the last) of a (4, 3, 2) tensor replaced; the last write to a slot wins
    "scatter_nd_constant": (lambda: checked_model(
        [helper.make_node("ScatterND", ["x", "idx", "u"], ["y"])],
        {"x": (F, [4, 3, 2]), "u": (F, [3, 3, 2])}, {"y": (F, [4, 3, 2])},
        {"idx": np.array([[1], [-1], [1]])}), {"x": _x(4, 3, 2), "u": _x(3, 3, 2)}),
    "scatter_elements_constant": (lambda: checked_model(
        [helper.make_node("ScatterElements", ["x", "idx", "u"], ["y"], axis=1)],
        {"x": (F, [3, 5]), "u": (F, [3, 2])}, {"y": (F, [3, 5])},
        {"idx": np.array([[0, 4], [-1, 2], [3, 1]])}), {"x": _x(3, 5), "u": _x(3, 2)}),
    # a router's top-2 weights written into a dense (tokens, experts) matrix of zeros
    "router_weights": (lambda: checked_model(
        [helper.make_node("ScatterElements", ["x", "idx", "u"], ["y"], axis=1)],
        {"x": (F, [6, 8]), "idx": (I64, [6, 2]), "u": (F, [6, 2])}, {"y": (F, [6, 8])}, {}),
        {"x": np.zeros((6, 8), np.float32), "idx": np.stack([RNG.permutation(8)[:2] for _ in range(6)]),
         "u": _x(6, 2)}),
}


@pytest.fixture(scope="module")
def results():
    return {name: prepare(build(), inputs) for name, (build, inputs) in CASES.items()}


@pytest.mark.parametrize("case", sorted(CASES))
def test_imports_without_an_opaque_call(results, case):
    assert not results[case]["model"].program.opaque_nodes


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_equals_onnxruntime(results, case, backend):
    assert_backend_equals(results[case], backend, 0, 0, case)