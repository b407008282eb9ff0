"""TopK (a mixture-of-experts router's choice), Tile and a Cast from float to integer
(truncation toward zero) import into the language (no opaque call) and equal onnxruntime
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