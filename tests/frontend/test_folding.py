"""Constant folding at import against onnxruntime: every numpy folder (FOLDERS) on 0-D
scalars, int64 and broadcast operands, and the onnxruntime fallback on 0-D results. The
folded value must equal onnxruntime's exactly in dtype and shape, and in value (floats to
1 ulp-ish: rtol 1e-6)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from apsat.frontend.folding import FOLDERS, fold
from apsat.pipeline.zoo import ort_run

I, F, B = np.int64, np.float32, np.bool_
S = lambda v, t=I: np.array(v, dtype=t)        # noqa: E731  (a 0-D scalar)

BINARY = ["Add", "Sub", "Mul", "Div", "Min", "Max", "Equal", "Less", "Greater", "LessOrEqual",
          "GreaterOrEqual"]
BINARY_CASES = {
    "scalar-int64": [S(7), S(-3)],
    "broadcast-int64": [np.arange(-4, 2, dtype=I).reshape(3, 2), S([2, -5], I)],
    "broadcast-float": [np.linspace(-2, 2, 6, dtype=F).reshape(2, 3, 1), S(0.75, F)],
}
CASES = [(op, {}, name, ins) for op in BINARY for name, ins in BINARY_CASES.items()] + [
    ("Mod", {}, "scalar-int64", [S(7), S(-3)]),                       # Swin's window arithmetic
    ("Mod", {}, "broadcast-int64", [np.arange(-5, 5, dtype=I).reshape(2, 5), S(3)]),
    ("Mod", {"fmod": 1}, "float", [np.linspace(-5, 5, 7, dtype=F), S(1.5, F)]),
    ("Pow", {}, "float-int-exponent", [np.linspace(-2, 2, 5, dtype=F), S(2)]),
    ("Pow", {}, "scalar-int64", [S(3), S(4)]),
    ("Neg", {}, "scalar-int64", [S(5)]),
    ("Abs", {}, "int64", [np.arange(-3, 3, dtype=I)]),
    ("Sqrt", {}, "scalar-float", [S(2.0, F)]),
    ("Floor", {}, "float", [np.linspace(-2, 2, 7, dtype=F)]),
    ("Ceil", {}, "float", [np.linspace(-2, 2, 7, dtype=F)]),
    ("Sign", {}, "int64", [np.arange(-2, 3, dtype=I)]),
    ("Not", {}, "bool", [np.array([True, False])]),
    ("And", {}, "broadcast-bool", [np.array([[True], [False]]), np.array([True, False, True])]),
    ("Or", {}, "broadcast-bool", [np.array([[True], [False]]), np.array([True, False, True])]),
    ("Xor", {}, "broadcast-bool", [np.array([[True], [False]]), np.array([True, False, True])]),
    ("Where", {}, "broadcast", [np.array([[True], [False]]), S([1, 2, 3]), S(-1)]),
    ("Cast", {"to": TensorProto.FLOAT}, "scalar-int64", [S(3)]),
    ("Cast", {"to": TensorProto.BOOL}, "int64", [np.arange(-1, 2, dtype=I)]),
    ("Unsqueeze", {}, "scalar", [S(4), S([0])]),
    ("Squeeze", {}, "int64", [S([[4]]), S([0, 1])]),
    ("Reshape", {}, "zero-copies-dim", [np.arange(6, dtype=I).reshape(2, 3), S([0, -1])]),
    ("Concat", {"axis": 0}, "int64", [S([1, 2]), S([3])]),
    ("Gather", {"axis": 0}, "scalar-index", [S([5, 6, 7]), S(-1)]),
    ("Slice", {}, "negative-step", [np.arange(8, dtype=I), S([-1]), S([-9]), S([0]), S([-2])]),
    ("Range", {}, "int64", [S(0), S(7), S(2)]),
    ("Expand", {}, "scalar-to-shape", [S(1.5, F), S([2, 3])]),
    ("Expand", {}, "bidirectional", [np.ones((3, 1), F), S([1, 4])]),
    ("ConstantOfShape", {"value": helper.make_tensor("v", TensorProto.INT64, [1], [9])}, "int64", [S([2, 2])]),
    ("Tile", {}, "int64", [S([[1, 2]]), S([2, 2])]),
    ("Trilu", {"upper": 0}, "float", [np.ones((3, 4), F), S(1)]),
    ("CumSum", {}, "int64", [np.arange(6, dtype=I).reshape(2, 3), S(1)]),
    ("ReduceSum", {"keepdims": 0}, "int64", [np.arange(6, dtype=I).reshape(2, 3), S([1])]),
    ("ReduceProd", {"keepdims": 1}, "int64", [np.arange(1, 7, dtype=I).reshape(2, 3), S([0])]),
    ("ReduceMax", {"keepdims": 0}, "all-axes", [np.arange(6, dtype=I).reshape(2, 3)]),
    ("ReduceMin", {"keepdims": 1}, "float", [np.linspace(-1, 1, 6, dtype=F).reshape(3, 2), S([-1])]),
    ("Identity", {}, "scalar", [S(3)]),
    ("Transpose", {"perm": [1, 0]}, "int64", [np.arange(6, dtype=I).reshape(2, 3)]),
    ("BitShift", {"direction": "LEFT"}, "scalar-onnxruntime-fallback", [S(7, np.uint64), S(3, np.uint64)]),
]


def _oracle(op: str, attrs: dict, ins: list) -> np.ndarray:
    """onnxruntime on the node alone with the inputs fed as graph inputs (not folded)."""
    names = [f"x{i}" for i in range(len(ins))]
    vis = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
           for n, v in zip(names, ins)]
    node = helper.make_node(op, names, ["y"], **attrs)
    graph = helper.make_graph([node], "g", vis, [helper.make_tensor_value_info("y", 0, None)])
    model = onnx.shape_inference.infer_shapes(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    return ort_run(model, dict(zip(names, ins)))["y"]


def test_every_folder_is_exercised():
    ops = {c[0] for c in CASES}
    assert set(FOLDERS) - {"Constant"} <= ops, f"folders without a case: {set(FOLDERS) - ops}"


@pytest.mark.parametrize("op, attrs, case, ins", CASES, ids=[f"{c[0]}-{c[2]}" for c in CASES])
def test_fold_equals_onnxruntime(op, attrs, case, ins):
    want = _oracle(op, attrs, ins)
    node = helper.make_node(op, [f"x{i}" for i in range(len(ins))], ["y"], **attrs)
    (got,) = fold(node, ins, {"": 18}, [0])
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    if got.dtype.kind == "f":
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)
    else:
        np.testing.assert_array_equal(got, want)


def test_fold_of_a_constant_node():
    node = helper.make_node("Constant", [], ["y"], value=onnx.numpy_helper.from_array(S(4)))
    (got,) = fold(node, [], {"": 18}, [0])
    assert got.shape == () and got.dtype == np.int64 and int(got) == 4


def test_a_half_precision_node_onnxruntime_has_no_kernel_for_folds_in_float32():
    """onnxruntime's CPU has no bfloat16 Log (T5's relative-position buckets): the node runs
    on its inputs widened to float32, and the result is rounded to bfloat16."""
    bf16 = helper.tensor_dtype_to_np_dtype(TensorProto.BFLOAT16)
    x = np.array([0.5, 1.0, 3.0, 100.0], np.float32).astype(bf16)
    node = helper.make_node("Log", ["x"], ["y"])
    (y,) = fold(node, [x], {"": 17}, [TensorProto.BFLOAT16])
    assert y.dtype == bf16
    np.testing.assert_array_equal(y.astype(np.float32), np.log(x.astype(np.float32)).astype(bf16).astype(np.float32))
    with pytest.raises(Exception, match="cannot fold at import"):    # float32 input: no such fallback
        fold(helper.make_node("Log", ["x"], ["y"], domain="no.such"), [x.astype(np.float32)], {"": 17, "no.such": 1},
             [TensorProto.FLOAT])
