"""The ONNX importer: every lowering on a one-node model against onnxruntime, transformer
and conv blocks, and the nine light models with seeded random weights.

Tolerances. One-node models: rtol 1e-5 / atol 1e-6 (short sums; only rounding order
differs). Whole models: rtol 1e-4 with atol 1e-5 scaled by the output's largest magnitude
(at least 1): both sides compute in float32 but accumulate in different orders (tensordot
over windows vs onnxruntime's direct convolution), and sums of up to ~25k products carry
an error relative to the size of their terms, not of their result. A logit near zero in a
vector whose entries reach ~140 (ShuffleNet with random weights) is a difference of large
terms and is off by ~5e-5 absolute, a few float32 ulps of the vector's scale.
"""
from __future__ import annotations

import time

import numpy as np
import onnx
import pytest


import models  # noqa: E402
from models import single_op  # noqa: E402

from apsat.pipeline import zoo  # noqa: E402
from apsat.frontend.importer import load_onnx  # noqa: E402
from apsat.frontend.lowering import LOWERINGS  # noqa: E402

RNG = np.random.default_rng(0)


def _arr(*shape, lo=None):
    a = RNG.standard_normal(shape).astype(np.float32)
    return np.abs(a) + lo if lo is not None else a


def _ints(*vals):
    return np.array(vals, dtype=np.int64)


def onnx_dims(proto, name):
    for vi in proto.graph.output:
        if vi.name == name:
            return tuple(d.dim_value for d in vi.type.tensor_type.shape.dim)
    raise KeyError(name)


def check(proto, opaque=0, rtol=1e-5, atol=1e-6, seed=0, positive=False):
    """Import, compare every output's dims with ONNX's and its values with onnxruntime
    on seeded N(0, 1) inputs (|N(0, 1)| when `positive`)."""
    model = load_onnx(proto)
    assert len(model.program.opaque_nodes) == opaque, model.opaque_ops()
    for name, term in model.program.outputs.items():
        it, item = model.program.shape_of(term)
        assert it + item == onnx_dims(proto, name)
    inputs = zoo.random_inputs(model, seed)
    if positive:
        inputs = {k: np.abs(v) for k, v in inputs.items()}
    want, got = zoo.ort_run(proto, inputs), model.run(inputs)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=rtol, atol=atol, equal_nan=True,
                                   err_msg=name)
    return model


# ---- one node per lowering ------------------------------------------------------------------

CASES = {
    "Add-broadcast": lambda: single_op("Add", [(2, 3, 4), (3, 1)]),
    "Add-weight": lambda: single_op("Add", [(2, 3, 4), _arr(4)]),
    "Sub": lambda: single_op("Sub", [(2, 3), (2, 3)]),
    "Mul-scalar-weight": lambda: single_op("Mul", [(2, 3), np.array(2.5, np.float32)]),
    "Div": lambda: single_op("Div", [(2, 3), _arr(3, lo=0.5)]),
    "Pow": lambda: single_op("Pow", [(2, 3), np.array([1.0, 2.0, 3.0], np.float32)]),
    "Sum-3": lambda: single_op("Sum", [(2, 3), (3,), (1, 3)]),
    "Sum-1": lambda: single_op("Sum", [(2, 3)]),
    "Mean": lambda: single_op("Mean", [(2, 3), (2, 3)]),
    "Where": lambda: single_op("Where", [np.array([[True], [False]]), (2, 3), (3,)]),
    "Relu": lambda: single_op("Relu", [(2, 3)]),
    "Neg": lambda: single_op("Neg", [(2, 3)]),
    "Sqrt": lambda: single_op("Sqrt", [(2, 3)]),
    "Exp": lambda: single_op("Exp", [(2, 3)]),
    "Erf": lambda: single_op("Erf", [(2, 3)]),
    "Tanh": lambda: single_op("Tanh", [(2, 3)]),
    "Sigmoid": lambda: single_op("Sigmoid", [(2, 3)]),
    "LeakyRelu": lambda: single_op("LeakyRelu", [(2, 3)], {"alpha": 0.2}),
    "LeakyRelu-default-alpha": lambda: single_op("LeakyRelu", [(2, 3)]),
    "Clip-inputs": lambda: single_op("Clip", [(2, 3), np.array(-0.5, np.float32), np.array(0.5, np.float32)]),
    "Clip-min-only": lambda: single_op("Clip", [(2, 3), np.array(0.0, np.float32)]),
    "Clip-opset9": lambda: single_op("Clip", [(2, 3)], {"min": -0.2, "max": 0.3}, opset=9),
    "Identity": lambda: single_op("Identity", [(2, 3)]),
    "Dropout": lambda: single_op("Dropout", [(2, 3)], {"ratio": 0.3}, opset=9),
    "Cast-float": lambda: single_op("Cast", [(2, 3)], {"to": onnx.TensorProto.FLOAT}),
    "Transpose": lambda: single_op("Transpose", [(2, 3, 4)], {"perm": [1, 2, 0]}),
    "Transpose-default": lambda: single_op("Transpose", [(2, 3, 4)]),
    "Reshape": lambda: single_op("Reshape", [(2, 3, 4), _ints(0, -1, 2)]),
    "Flatten-0": lambda: single_op("Flatten", [(2, 3, 4)], {"axis": 0}),
    "Flatten-2": lambda: single_op("Flatten", [(2, 3, 4)], {"axis": 2}),
    "Flatten-neg": lambda: single_op("Flatten", [(2, 3, 4)], {"axis": -1}),
    "Squeeze-13": lambda: single_op("Squeeze", [(2, 1, 3, 1), _ints(1, -1)]),
    "Squeeze-all": lambda: single_op("Squeeze", [(2, 1, 3, 1)]),
    "Squeeze-11": lambda: single_op("Squeeze", [(2, 1, 3)], {"axes": [1]}, opset=11),
    "Unsqueeze-13": lambda: single_op("Unsqueeze", [(2, 3), _ints(0, 3)]),
    "Unsqueeze-9": lambda: single_op("Unsqueeze", [(2, 3)], {"axes": [1, 2]}, opset=9),
    "Concat": lambda: single_op("Concat", [(2, 3), (2, 1), (2, 4)], {"axis": 1}),
    "Concat-neg": lambda: single_op("Concat", [(2, 3), (1, 3)], {"axis": -2}),
    "Slice": lambda: single_op("Slice", [(4, 6), _ints(1, -4), _ints(3, 100), _ints(0, 1)]),
    "Slice-opset9": lambda: single_op("Slice", [(4, 6)], {"starts": [1], "ends": [-1], "axes": [1]}, opset=9),
    "Split-equal": lambda: single_op("Split", [(6, 4)], {"axis": 0}, n_outputs=3),
    "Split-sizes": lambda: single_op("Split", [(2, 7), _ints(2, 5)], {"axis": 1}, n_outputs=2),
    "Split-opset11": lambda: single_op("Split", [(2, 7)], {"axis": 1, "split": [3, 4]}, n_outputs=2, opset=11),
    "Split-num-outputs": lambda: single_op("Split", [(7, 2)], {"axis": 0, "num_outputs": 3}, n_outputs=3, opset=18),
    "Gather-scalar": lambda: single_op("Gather", [(4, 5), np.array(-2, np.int64)], {"axis": 1}),
    "Gather-list": lambda: single_op("Gather", [(4, 5), _ints(0, 1, 3, 3)], {"axis": 0}),
    "Gather-2d": lambda: single_op("Gather", [(4, 5), np.array([[0, 4], [2, 3]], np.int64)], {"axis": 1}),
    "GatherElements": lambda: single_op("GatherElements", [(3, 5), _ints(0, 4, -1, 2, 2, 1).reshape(3, 2)],
                                        {"axis": 1}),
    "GatherND": lambda: single_op("GatherND", [(4, 5, 2), _ints(3, 1, 0, 4, -1, 2).reshape(3, 2)]),
    "CumSum": lambda: single_op("CumSum", [(3, 6), np.array(1, np.int64)], {"reverse": 1}),
    "Tile": lambda: single_op("Tile", [(2, 3), _ints(3, 2)]),
    "ScatterND": lambda: single_op("ScatterND", [(4, 3), _ints(2, 0).reshape(2, 1), (2, 3)]),
    "ScatterElements": lambda: single_op("ScatterElements", [(3, 4), _ints(1, 3, 0).reshape(3, 1), (3, 1)],
                                         {"axis": 1}),
    "TopK": lambda: single_op("TopK", [(3, 6), _ints(2)], {"axis": 1}, n_outputs=2),
    "Einsum": lambda: single_op("Einsum", [(2, 3, 4), (2, 4, 5)], {"equation": "bij,bjk->bik"}, opset=12),
    "Expand": lambda: single_op("Expand", [(3, 1), _ints(2, 1, 4)]),
    "Pad": lambda: single_op("Pad", [(2, 3, 4), _ints(0, 1, -1, 0, 2, 1)]),
    "Pad-opset2": lambda: single_op("Pad", [(2, 3)], {"pads": [1, 0, 0, 2]}, opset=9),
    "Pad-nonzero": lambda: single_op("Pad", [(2, 3), _ints(1, 0, 0, 1), np.array(1.5, np.float32)]),
    "Pad-reflect": lambda: single_op("Pad", [(2, 5), _ints(0, 2, 1, 1)], {"mode": "reflect"}),
    "Conv": lambda: single_op("Conv", [(1, 3, 8, 8), _arr(4, 3, 3, 3)]),
    "Conv-bias-stride-pad": lambda: single_op(
        "Conv", [(2, 3, 9, 8), _arr(4, 3, 3, 2), _arr(4)], {"strides": [2, 1], "pads": [1, 0, 2, 1]}),
    "Conv-dilated": lambda: single_op("Conv", [(1, 2, 9, 9), _arr(3, 2, 3, 3)], {"dilations": [2, 1]}),
    "Conv-groups": lambda: single_op("Conv", [(2, 4, 7, 7), _arr(6, 2, 3, 3), _arr(6)],
                                     {"group": 2, "pads": [1, 1, 1, 1]}),
    "Conv-depthwise": lambda: single_op("Conv", [(1, 5, 6, 6), _arr(5, 1, 3, 3)],
                                        {"group": 5, "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "Conv-1d": lambda: single_op("Conv", [(1, 3, 10), _arr(2, 3, 3)], {"pads": [1, 1]}),
    "Conv-3d": lambda: single_op("Conv", [(1, 2, 4, 5, 5), _arr(3, 2, 2, 3, 3)]),
    "Conv-same-upper": lambda: single_op("Conv", [(1, 2, 7, 7), _arr(3, 2, 4, 4)],
                                         {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    "Conv-same-lower": lambda: single_op("Conv", [(1, 2, 6, 6), _arr(3, 2, 4, 4)], {"auto_pad": "SAME_LOWER"}),
    "MaxPool": lambda: single_op("MaxPool", [(1, 2, 8, 8)], {"kernel_shape": [2, 2], "strides": [2, 2]}),
    "MaxPool-pads": lambda: single_op("MaxPool", [(1, 2, 7, 7)],
                                      {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "MaxPool-ceil": lambda: single_op("MaxPool", [(1, 2, 8, 8)],
                                      {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    "MaxPool-dilated": lambda: single_op("MaxPool", [(1, 1, 9, 9)], {"kernel_shape": [2, 2], "dilations": [2, 2]}),
    "MaxPool-1d": lambda: single_op("MaxPool", [(2, 3, 9)], {"kernel_shape": [3], "strides": [2]}),
    "AveragePool": lambda: single_op("AveragePool", [(1, 2, 8, 8)], {"kernel_shape": [2, 2], "strides": [2, 2]}),
    "AveragePool-pads-exclude": lambda: single_op(
        "AveragePool", [(1, 2, 7, 7)], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "AveragePool-pads-include": lambda: single_op(
        "AveragePool", [(1, 2, 7, 7)],
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1}),
    "AveragePool-ceil": lambda: single_op(
        "AveragePool", [(1, 2, 8, 8)], {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    "AveragePool-ceil-include": lambda: single_op(
        "AveragePool", [(1, 1, 8, 8)],
        {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1, "pads": [1, 1, 0, 0],
         "count_include_pad": 1}),
    "GlobalAveragePool": lambda: single_op("GlobalAveragePool", [(2, 3, 5, 4)]),
    "GlobalMaxPool": lambda: single_op("GlobalMaxPool", [(2, 3, 5, 4)]),
    "BatchNormalization": lambda: single_op(
        "BatchNormalization", [(2, 3, 4, 4), _arr(3), _arr(3), _arr(3), _arr(3, lo=0.5)], {"epsilon": 1e-3}),
    "BatchNormalization-opset9": lambda: single_op(
        "BatchNormalization", [(2, 3, 4), _arr(3), _arr(3), _arr(3), _arr(3, lo=0.5)], opset=9),
    "LRN": lambda: single_op("LRN", [(1, 7, 3, 3)], {"size": 3, "alpha": 1e-2, "beta": 0.75, "bias": 2.0}),
    "LayerNormalization": lambda: single_op("LayerNormalization", [(2, 3, 8), _arr(8), _arr(8)]),
    "LayerNormalization-axis1-nobias": lambda: single_op("LayerNormalization", [(2, 3, 4), _arr(3, 4)], {"axis": 1}),
    "Softmax-opset9-coerced": lambda: single_op("Softmax", [(2, 3, 4)], {"axis": 1}, opset=9),
    "Softmax-axis1": lambda: single_op("Softmax", [(2, 3, 4)], {"axis": 1}),
    "Softmax-last": lambda: single_op("Softmax", [(2, 3, 4)]),
    "Gemm": lambda: single_op("Gemm", [(3, 4), _arr(4, 5), _arr(5)]),
    "Gemm-trans-alpha-beta": lambda: single_op(
        "Gemm", [(4, 3), _arr(5, 4), _arr(3, 5)], {"transA": 1, "transB": 1, "alpha": 0.5, "beta": 2.0}),
    "Gemm-noC": lambda: single_op("Gemm", [(3, 4), (4, 2)], opset=13),
    "MatMul-2d": lambda: single_op("MatMul", [(3, 4), (4, 5)]),
    "MatMul-3d-2d": lambda: single_op("MatMul", [(2, 3, 4), _arr(4, 5)]),
    "MatMul-1d-2d": lambda: single_op("MatMul", [(4,), (4, 5)]),
    "MatMul-3d-1d": lambda: single_op("MatMul", [(2, 3, 4), (4,)]),
    "MatMul-batched": lambda: single_op("MatMul", [(2, 3, 4, 5), (2, 3, 5, 6)]),
    "MatMul-broadcast-batch": lambda: single_op("MatMul", [(2, 1, 3, 4), (5, 4, 6)]),
    "MatMul-1d-3d": lambda: single_op("MatMul", [(4,), (2, 4, 3)]),
    "ReduceMean": lambda: single_op("ReduceMean", [(2, 3, 4)], {"axes": [0, 2]}, opset=13),
    "ReduceMean-nokeep": lambda: single_op("ReduceMean", [(2, 3, 4)], {"axes": [-1], "keepdims": 0}, opset=13),
    "ReduceMean-18": lambda: single_op("ReduceMean", [(2, 3, 4), _ints(1)], opset=18),
    "ReduceMean-all": lambda: single_op("ReduceMean", [(2, 3, 4)], {"keepdims": 0}, opset=13),
    "ReduceSum": lambda: single_op("ReduceSum", [(2, 3, 4), _ints(1, 2)]),
    "ReduceMax": lambda: single_op("ReduceMax", [(2, 3, 4)], {"axes": [1]}, opset=13),
    # activations and maps
    "HardSwish": lambda: single_op("HardSwish", [(2, 3)]),
    "HardSigmoid": lambda: single_op("HardSigmoid", [(2, 3)], {"alpha": 0.3, "beta": 0.4}),
    "Elu": lambda: single_op("Elu", [(2, 3)], {"alpha": 0.5}),
    "Selu": lambda: single_op("Selu", [(2, 3)]),
    "Softplus": lambda: single_op("Softplus", [(2, 3)]),
    "Softsign": lambda: single_op("Softsign", [(2, 3)]),
    "Mish": lambda: single_op("Mish", [(2, 3)], opset=18),
    "Gelu-tanh": lambda: single_op("Gelu", [(2, 3)], {"approximate": "tanh"}, opset=20),
    "PRelu": lambda: single_op("PRelu", [(2, 3, 4), _arr(3, 1)]),
    "Abs": lambda: single_op("Abs", [(2, 3)]),
    "Log": lambda: single_op("Log", [(2, 3)]),
    "Reciprocal": lambda: single_op("Reciprocal", [(2, 3)]),
    "Floor": lambda: single_op("Floor", [(2, 3)]),
    "Ceil": lambda: single_op("Ceil", [(2, 3)]),
    "Cos": lambda: single_op("Cos", [(2, 3)]),
    "Sin": lambda: single_op("Sin", [(2, 3)]),
    "Sign": lambda: single_op("Sign", [(2, 3)]),
    "IsNaN": lambda: single_op("IsNaN", [(2, 3)]),
    "Max": lambda: single_op("Max", [(2, 3), (3,), (1, 3)]),
    "Min": lambda: single_op("Min", [(2, 3), (2, 1)]),
    "Mod-fmod": lambda: single_op("Mod", [(2, 3), _arr(3, lo=0.5)], {"fmod": 1}),
    # comparisons and logic: boolean outputs, carried as 0/1
    "Equal": lambda: single_op("Equal", [(2, 3), np.array([0.0, 1.0, -1.0], np.float32)]),
    "Less": lambda: single_op("Less", [(2, 3), (3,)]),
    "LessOrEqual": lambda: single_op("LessOrEqual", [(2, 3), (2, 1)]),
    "Greater": lambda: single_op("Greater", [(2, 3), (3,)]),
    "GreaterOrEqual": lambda: single_op("GreaterOrEqual", [(2, 3), (2, 3)]),
    "Not": lambda: _logic("Not", 1),
    "And": lambda: _logic("And", 2),
    "Or": lambda: _logic("Or", 2),
    "Xor": lambda: _logic("Xor", 2),
    "Cast-to-bool": lambda: _cast_to_bool(),
    # reductions, normalisations, ConvTranspose, Resize (composed from existing constructs)
    "ReduceMin": lambda: single_op("ReduceMin", [(2, 3, 4), _ints(1)], {"keepdims": 0}, opset=18),
    "ReduceL1": lambda: single_op("ReduceL1", [(2, 3, 4)], {"axes": [0, 2]}, opset=13),
    "ReduceL2": lambda: single_op("ReduceL2", [(2, 3, 4), _ints(-1)], opset=18),
    "ReduceSumSquare": lambda: single_op("ReduceSumSquare", [(2, 3, 4), _ints(1)], opset=18),
    "ReduceLogSum": lambda: single_op("ReduceLogSum", [(2, 3, 4), _ints(2)], opset=18),
    "ReduceLogSumExp": lambda: single_op("ReduceLogSumExp", [(2, 3, 4), _ints(0, 2)], {"keepdims": 0}, opset=18),
    "ReduceProd": lambda: single_op("ReduceProd", [(2, 3, 4), _ints(1)], opset=18),
    "ArgMax": lambda: single_op("ArgMax", [(2, 3, 4)], {"axis": 1}),
    "ArgMin-last": lambda: single_op("ArgMin", [(2, 3, 4)], {"select_last_index": 1}),
    "InstanceNormalization": lambda: single_op("InstanceNormalization", [(2, 3, 4, 5), _arr(3), _arr(3)]),
    "GroupNormalization": lambda: _shaped(single_op("GroupNormalization", [(2, 4, 3, 5), _arr(4), _arr(4)],
                                                    {"num_groups": 2}, opset=21), (2, 4, 3, 5)),
    "ConvTranspose": lambda: single_op("ConvTranspose", [(1, 4, 5, 5), _arr(4, 3, 3, 3), _arr(6)],
                                       {"strides": [2, 2], "pads": [1, 1, 1, 1], "group": 2}),
    "Resize-nearest": lambda: single_op("Resize", [(1, 2, 3, 4), None, np.array([1, 1, 2, 2], np.float32)]),
    "Resize-linear": lambda: single_op("Resize", [(1, 2, 3, 4), None, None, _ints(1, 2, 5, 7)], {"mode": "linear"}),
    "Upsample": lambda: single_op("Upsample", [(1, 2, 3, 4), np.array([1, 1, 2, 2], np.float32)], opset=9),
}


def _shaped(proto, dims):
    """The model with its output y0 declared float32 of `dims` (onnx infers no shape for
    GroupNormalization, and the checker refuses an output without one)."""
    from onnx import helper

    del proto.graph.output[:]
    proto.graph.output.extend([helper.make_tensor_value_info("y0", onnx.TensorProto.FLOAT, list(dims))])
    return proto


def _logic(op: str, arity: int):
    """`op` over booleans computed from float inputs (x > 0): booleans in, boolean out."""
    from onnx import helper

    nodes = [helper.make_node("Greater", [f"x{i}", "zero"], [f"b{i}"]) for i in range(arity)]
    nodes.append(helper.make_node(op, [f"b{i}" for i in range(arity)], ["y0"]))
    shapes = [(2, 3), (3,)][:arity]
    return models.make_model(nodes, {f"x{i}": s for i, s in enumerate(shapes)}, ["y0"],
                             {"zero": np.array(0.0, np.float32)})


def _cast_to_bool():
    """Cast to BOOL of float data: nonzero is true."""
    from onnx import helper

    nodes = [helper.make_node("Cast", ["x0"], ["y0"], to=onnx.TensorProto.BOOL)]
    return models.make_model(nodes, {"x0": (2, 3)}, ["y0"])


@pytest.mark.parametrize("case", sorted(CASES))
def test_single_op_matches_onnxruntime(case):
    check(CASES[case](), positive=case in ("Sqrt", "Pow", "Log", "ReduceLogSum"))


def test_every_lowering_has_a_case():
    covered = {case.split("-")[0] for case in CASES} | {"Constant"}
    assert set(LOWERINGS) <= covered, sorted(set(LOWERINGS) - covered)


# ---- opaque calls and folding -------------------------------------------------------------

@pytest.mark.parametrize("proto,calls", [
    (lambda: single_op("Atan", [(2, 3)]), 1),                                 # no lowering
    (lambda: single_op("Slice", [(4, 6), _ints(5), _ints(-7), _ints(1), _ints(-1)]), 1),  # reversal
], ids=["Atan", "Slice-reversed"])
def test_uncovered_nodes_become_opaque_calls(proto, calls):
    model = check(proto(), opaque=calls)
    assert list(model.opaque_ops().values()) == [calls]


def test_opaque_call_inside_a_lowered_graph():
    """Atan between two lowered ops: the call's argument is a term, its result feeds one."""
    from onnx import helper
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Atan", ["a"], ["b"]),
             helper.make_node("Add", ["b", "x"], ["y"])]
    check(models.make_model(nodes, {"x": (2, 3)}, ["y"]), opaque=1)


def test_gather_on_runtime_indices_is_a_gather_of_the_language():
    """Token ids (an int64 input) index the table inside the language: no opaque call."""
    from onnx import TensorProto, helper
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["y"], axis=0)], "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])],
        initializer=[onnx.numpy_helper.from_array(_arr(5, 4), "table")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    model = load_onnx(proto)
    assert model.opaque_ops() == {} and "access-gather" in {t.op for t in model.program.terms()}
    ids = {"ids": np.array([4, 0, 2], dtype=np.int64)}
    np.testing.assert_array_equal(model.run(ids)["y"], zoo.ort_run(proto, ids)["y"])


def test_a_reshape_reads_through_unsqueeze_and_squeeze():
    """An Unsqueezed per-channel vector broadcast against a conv output (a Caffe "Scale"
    layer) is the reshaped 1-D tensor itself: inserting or squeezing a size-1 axis keeps
    the elements' order, so no access-insert-axis is left for the fusion rules to see
    through. Values still equal onnxruntime."""
    proto = models.conv_batchnorm_scale()
    check(proto, rtol=1e-4, atol=1e-5)
    ops = {t.op for t in load_onnx(proto).program.terms()}
    assert "access-insert-axis" not in ops and "access-reshape" in ops


def test_constant_folding_shape_arithmetic():
    """Shape -> Gather -> Concat -> Reshape and Cast -> Sqrt fold; ConstantOfShape becomes
    a named weight; scalar constants become literals."""
    model = check(models.attention_block(), opaque=0, rtol=1e-4, atol=1e-5)
    ops = model.program.op_counts()
    assert ops.get("access-literal", 0) >= 1          # sqrt(d) folded to a literal
    assert "access-reshape" in ops


def test_constant_of_shape_weight_is_named_and_lazy():
    from onnx import helper
    nodes = [helper.make_node("ConstantOfShape", ["shape"], ["w"],
                              value=onnx.numpy_helper.from_array(np.array([0.25], np.float32))),
             helper.make_node("MatMul", ["x", "w"], ["y"])]
    model = check(models.make_model(nodes, {"x": (2, 3)}, ["y"], {"shape": _ints(3, 4)}))
    assert set(model.weights) == {"w"}
    assert model.weights["w"].strides == (0, 0)       # a broadcast view, not 12 copies


def test_fold_falls_back_to_onnxruntime(capfd):
    """A constant-input op numpy folding does not know (Tile) runs in onnxruntime, quietly."""
    from onnx import helper
    nodes = [helper.make_node("Tile", ["c", "reps"], ["t"]), helper.make_node("Add", ["x", "t"], ["y"])]
    model = check(models.make_model(nodes, {"x": (2, 6)}, ["y"], {"c": _ints(1, 2, 3).astype(np.float32)
                                                                   .reshape(1, 3), "reps": _ints(2, 2)}))
    assert model.program.opaque_nodes == {}
    assert capfd.readouterr().err == ""


def test_weights_are_float32_and_inputs_exclude_initializers():
    model = load_onnx(zoo.light_model_paths()[0])     # old style: initializers are inputs too
    assert list(model.inputs) == ["data_0"]
    assert all(w.dtype == np.float32 for w in model.weights.values())
    assert set(model.weights) | set(model.inputs) == set(model.program.tensor_shapes)


# ---- transformer and conv blocks ----------------------------------------------------------

@pytest.mark.parametrize("builder", [models.attention_block, models.gelu_mlp, models.small_convnet],
                         ids=lambda b: b.__name__)
def test_blocks_import_without_opaque_calls(builder):
    check(builder(), opaque=0, rtol=1e-4, atol=1e-5)


def test_attention_block_opset18():
    check(models.attention_block(opset=18), opaque=0, rtol=1e-4, atol=1e-5)


def test_model_api():
    model = load_onnx(models.small_convnet())
    assert model.source_op_counts()["Conv"] == 2
    assert model.inputs == {"x": (1, 3, 16, 16)}
    assert model.path is None and isinstance(model.onnx, onnx.ModelProto)
    out = model.run(zoo.random_inputs(model, 3))
    assert list(out) == ["y"] and out["y"].shape == (1, 10)


# ---- the light zoo ------------------------------------------------------------------------

LIGHT = {p.stem.replace("light_", ""): p for p in zoo.light_model_paths()}
IMPORT_SECONDS: dict[str, float] = {}


def test_light_zoo_has_nine_models():
    assert len(LIGHT) == 9


@pytest.mark.parametrize("name", sorted(LIGHT))
def test_light_model_imports_without_opaque_calls(name):
    start = time.perf_counter()
    model = load_onnx(LIGHT[name])
    IMPORT_SECONDS[name] = time.perf_counter() - start
    print(f"{name}: import {IMPORT_SECONDS[name]:.3f} s, {len(model.program.terms())} terms")
    assert model.program.opaque_nodes == {}
    proto = onnx.load(str(LIGHT[name]))
    for vi in proto.graph.output:
        it, item = model.program.shape_of(model.program.outputs[vi.name])
        assert it + item == tuple(d.dim_value for d in vi.type.tensor_type.shape.dim)


@pytest.mark.parametrize("name,limit", [("resnet50", 2.0), ("densenet121", 4.0)])
def test_light_import_time(name, limit):
    load_onnx(LIGHT[name])                           # warm imports and caches
    start = time.perf_counter()
    load_onnx(LIGHT[name])
    assert time.perf_counter() - start < limit


# The imported light zoo against onnxruntime: tests/test_pipeline.py's
# test_light_model_extracted_program_matches_onnxruntime (no rules, so the extracted program
# is the imported one), which runs each model once for both.


def test_randomize_weights_replaces_placeholders():
    proto = onnx.load(str(LIGHT["resnet50"]))
    a, b = zoo.randomize_weights(proto, seed=0), zoo.randomize_weights(proto, seed=0)
    assert not [n for n in a.graph.node if n.op_type == "ConstantOfShape"]
    onnx.checker.check_model(a)
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in a.graph.initializer}
    assert all(np.array_equal(inits[i.name], onnx.numpy_helper.to_array(i)) for i in b.graph.initializer)
    conv = inits["gpu_0/conv1_w_0"]                      # (64, 3, 7, 7): N(0, 1/147)
    assert conv.shape == (64, 3, 7, 7) and abs(conv.std() * np.sqrt(147) - 1) < 0.05
    var = inits["gpu_0/res2_0_branch1_bn_riv_0"]         # 1-D: 1 + 0.1 N(0, 1), positive
    assert var.min() > 0 and abs(var.mean() - 1) < 0.05
    other = {i.name: onnx.numpy_helper.to_array(i) for i in zoo.randomize_weights(proto, 1).graph.initializer}
    assert not np.array_equal(other["gpu_0/conv1_w_0"], conv)


def test_logits_output_adds_the_softmax_input():
    proto = onnx.load(str(LIGHT["squeezenet"]))
    assert zoo.softmax_logits(proto) == ["r65"]
    with_logits = zoo.logits_output(proto)
    assert [o.name for o in with_logits.graph.output] == ["softmaxout_1", "r65"]
    assert len(proto.graph.output) == 1                  # the original is untouched
    assert zoo.logits_output(models.gelu_mlp()) is not None


def test_empty_tensors_are_constants_that_concat_drops():
    """A partial rotary embedding rotating every dim: the pass-through slice is empty (Phi-3,
    Qwen3-ViT and GPT-NeoX-Japanese exports), read by a Neg, then concatenated back. Empty
    values are constants (nothing to compute): no opaque call, and the result equals
    onnxruntime."""
    from onnx import helper

    nodes = [helper.make_node("Slice", ["x", "s", "e", "a"], ["rest"]),          # x[..., 8:8]: empty
             helper.make_node("Neg", ["rest"], ["neg"]),
             helper.make_node("Mul", ["x", "two"], ["rot"]),
             helper.make_node("Concat", ["rot", "neg"], ["y"], axis=-1)]
    proto = models.make_model(nodes, {"x": (1, 2, 4, 8)}, ["y"],
                              {"s": _ints(8), "e": _ints(8), "a": _ints(-1), "two": np.array(2.0, np.float32)})
    check(proto)
