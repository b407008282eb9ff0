"""Constant folding at import: a node whose inputs are all known at import time becomes
numpy arrays (shape arithmetic, Constant, ConstantOfShape, Shape of a static tensor, ...).

`fold(node, inputs, opsets, out_types)` evaluates one node: numpy for the common ops
(FOLDERS), onnxruntime on the lone node otherwise. Folding never changes a value's
meaning; the importer decides which nodes to fold (see importer.Importer._should_fold).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from apsat.frontend.limits import MAX_ELEMENTS
from apsat.frontend.node_shapes import infer_node
from apsat.frontend.reading import HALF_FLOAT_TYPES, is_half, widened


class FoldError(Exception):
    """The node could not be evaluated at import (the message says why, on one line)."""


@dataclass
class Const:
    """A value known at import. `weight`: it came from an initializer. As data, a constant
    holding one value becomes a literal whatever its source (frontend/constants.py)."""

    value: np.ndarray
    weight: bool = False


def _attrs(node) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _axes(node, inputs, opset: int, since: int):
    """Axes from the `axes` attribute (opset < since) or input 1; None when absent."""
    if opset < since:
        return _attrs(node).get("axes")
    return None if len(inputs) < 2 or inputs[1] is None else [int(a) for a in inputs[1].reshape(-1)]


class _UseOnnxruntime(Exception):
    """Raised by a numpy folder for a case it does not cover: onnxruntime folds it."""


def _constant(node, inputs, opset):
    attrs = _attrs(node)
    for key in ("value", "value_float", "value_floats", "value_int", "value_ints"):
        if key in attrs:
            v = attrs[key]
            if key == "value":
                return [numpy_helper.to_array(v)]
            dtype = np.float32 if "float" in key else np.int64
            return [np.asarray(v, dtype=dtype)]
    raise _UseOnnxruntime          # sparse or string constants


def _constant_of_shape(node, inputs, opset):
    """A read-only broadcast view: a weight filled by ConstantOfShape costs no memory."""
    v = _attrs(node).get("value")
    fill = numpy_helper.to_array(v).reshape(-1)[0] if v is not None else np.float32(0)
    shape = tuple(int(d) for d in inputs[0].reshape(-1))
    return [np.broadcast_to(np.asarray(fill), shape)]


def _cast(node, inputs, opset):
    to = helper.tensor_dtype_to_np_dtype(_attrs(node)["to"])
    with np.errstate(invalid="ignore", over="ignore"):   # out-of-range casts: ONNX leaves them undefined
        return [inputs[0].astype(to)]


def _unsqueeze(node, inputs, opset):
    axes = _axes(node, inputs, opset, 13)
    rank = inputs[0].ndim + len(axes)
    out = inputs[0]
    for a in sorted(a % rank for a in axes):
        out = np.expand_dims(out, a)
    return [out]


def _squeeze(node, inputs, opset):
    axes = _axes(node, inputs, opset, 13)
    x = inputs[0]
    return [np.squeeze(x) if axes is None else np.squeeze(x, axis=tuple(a % x.ndim for a in axes))]


def _reshape(node, inputs, opset):
    x, shape = inputs[0], [int(s) for s in inputs[1].reshape(-1)]
    allowzero = _attrs(node).get("allowzero", 0)
    shape = [x.shape[i] if s == 0 and not allowzero else s for i, s in enumerate(shape)]
    return [x.reshape(shape)]


def _slice(node, inputs, opset):
    x = inputs[0]
    if opset < 10:
        a = _attrs(node)
        starts, ends, axes, steps = a["starts"], a["ends"], a.get("axes"), None
    else:
        starts, ends = inputs[1].reshape(-1), inputs[2].reshape(-1)
        axes = inputs[3].reshape(-1) if len(inputs) > 3 and inputs[3] is not None else None
        steps = inputs[4].reshape(-1) if len(inputs) > 4 and inputs[4] is not None else None
    axes = range(len(starts)) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    index = [slice(None)] * x.ndim
    for a, s, e, st in zip(axes, starts, ends, steps):
        index[int(a) % x.ndim] = slice(int(s), int(e), int(st))   # Python clamps as ONNX does
    return [x[tuple(index)]]


def _div(node, inputs, opset):
    a, b = inputs
    if a.dtype.kind in "iu" and b.dtype.kind in "iu":          # C integer division truncates
        q = np.abs(a) // np.abs(b)
        return [(np.sign(a) * np.sign(b) * q).astype(np.result_type(a, b))]
    return [a / b]


def _mod(node, inputs, opset):
    """fmod=1: C's fmod (the sign of the dividend); fmod=0: the sign of the divisor."""
    a, b = inputs
    return [np.fmod(a, b) if _attrs(node).get("fmod", 0) else np.mod(a, b)]


def _reduce(fn, since: int = 18):
    """ReduceX with axes from the attribute (before `since`) or input 1, keepdims and
    noop_with_empty_axes as ONNX defines them."""
    def fold_reduce(node, inputs, opset):
        a = _attrs(node)
        axes = _axes(node, inputs, opset, since)
        if not axes:
            if a.get("noop_with_empty_axes", 0):
                return [inputs[0]]
            axes = None
        x = inputs[0]
        keep = bool(a.get("keepdims", 1))
        axis = None if axes is None else tuple(int(i) % max(x.ndim, 1) for i in axes)
        return [np.asarray(fn(x, axis=axis, keepdims=keep)).astype(x.dtype)]
    return fold_reduce


def _tile(node, inputs, opset):
    return [np.tile(inputs[0], [int(r) for r in inputs[1].reshape(-1)])]


def _trilu(node, inputs, opset):
    k = int(inputs[1].reshape(-1)[0]) if len(inputs) > 1 and inputs[1] is not None else 0
    upper = _attrs(node).get("upper", 1)
    return [np.triu(inputs[0], k) if upper else np.tril(inputs[0], k)]


def _cumsum(node, inputs, opset):
    """CumSum along input 1's axis; exclusive and reverse as ONNX defines them."""
    a = _attrs(node)
    x, axis = inputs[0], int(inputs[1].reshape(-1)[0]) % inputs[0].ndim
    if a.get("exclusive", 0) or a.get("reverse", 0):
        raise _UseOnnxruntime
    return [np.cumsum(x, axis=axis, dtype=x.dtype)]


def _elementwise(fn):
    """A numpy ufunc with numpy broadcasting (ONNX's multidirectional broadcasting)."""
    return lambda node, inputs, opset: [fn(*inputs)]


FOLDERS = {
    "Constant": _constant,
    "ConstantOfShape": _constant_of_shape,
    "Identity": lambda n, i, o: [i[0]],
    "Cast": _cast,
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Reshape": _reshape,
    "Slice": _slice,
    "Div": _div,
    "Gather": lambda n, i, o: [np.take(i[0], i[1], axis=_attrs(n).get("axis", 0))],
    "Concat": lambda n, i, o: [np.concatenate([x for x in i if x is not None], axis=_attrs(n)["axis"])],
    "Transpose": lambda n, i, o: [np.transpose(i[0], _attrs(n).get("perm"))],
    "Add": lambda n, i, o: [i[0] + i[1]],
    "Sub": lambda n, i, o: [i[0] - i[1]],
    "Mul": lambda n, i, o: [i[0] * i[1]],
    "Neg": lambda n, i, o: [-i[0]],
    "Sqrt": lambda n, i, o: [np.sqrt(i[0])],
    "Equal": lambda n, i, o: [np.equal(i[0], i[1])],
    "Where": lambda n, i, o: [np.where(i[0], i[1], i[2])],
    "Range": lambda n, i, o: [np.arange(i[0], i[1], i[2]).astype(i[0].dtype)],
    "Expand": lambda n, i, o: [i[0] * np.ones(tuple(int(s) for s in i[1]), dtype=i[0].dtype)],
    "Mod": _mod,
    "Min": lambda n, i, o: [np.minimum.reduce(np.broadcast_arrays(*i))],
    "Max": lambda n, i, o: [np.maximum.reduce(np.broadcast_arrays(*i))],
    "Pow": _elementwise(np.power),
    "Abs": _elementwise(np.abs),
    "Floor": _elementwise(np.floor),
    "Ceil": _elementwise(np.ceil),
    "Sign": _elementwise(np.sign),
    "Less": _elementwise(np.less),
    "Greater": _elementwise(np.greater),
    "LessOrEqual": _elementwise(np.less_equal),
    "GreaterOrEqual": _elementwise(np.greater_equal),
    "Not": _elementwise(np.logical_not),
    "And": _elementwise(np.logical_and),
    "Or": _elementwise(np.logical_or),
    "Xor": _elementwise(np.logical_xor),
    "ReduceSum": _reduce(np.sum, 13),
    "ReduceProd": _reduce(np.prod),
    "ReduceMax": _reduce(np.max),
    "ReduceMin": _reduce(np.min),
    "Tile": _tile,
    "Trilu": _trilu,
    "CumSum": _cumsum,
}


def fold_shape(node, dims: tuple[int, ...]) -> np.ndarray:
    """Shape (with opset-15 start/end) or Size of a tensor of static `dims`."""
    if node.op_type == "Size":
        return np.asarray(int(np.prod(dims, dtype=np.int64)), dtype=np.int64)
    a = _attrs(node)
    rank = len(dims)
    start, end = a.get("start", 0), a.get("end", rank)
    start = max(0, min(rank, start + rank if start < 0 else start))
    end = max(0, min(rank, end + rank if end < 0 else end))
    return np.asarray(dims[start:end], dtype=np.int64)


def fold(node, inputs: list, opsets: dict[str, int], out_types: list[int]) -> list[np.ndarray]:
    """Every output of `node` given its input values (None for omitted optional inputs).
    `out_types` are the ONNX element types of the outputs (0 when unknown); results are
    cast to them. Raises FoldError."""
    opset = opsets.get(node.domain or "", opsets.get("", 1))
    folder = FOLDERS.get(node.op_type) if node.domain in ("", "ai.onnx") else None
    inferred = infer_node(node, inputs, opsets, probe=False)
    for _, dims in inferred:           # before numpy or onnxruntime allocates the result
        if dims is not None and int(np.prod(dims, dtype=object)) > MAX_ELEMENTS:
            raise FoldError(f"cannot fold at import: its output has dims {dims}, over apsat's limit "
                            f"of 2**30 elements per tensor")
    outs = None
    if folder is not None:
        try:
            outs = folder(node, inputs, opset)
        except _UseOnnxruntime:
            pass
        except Exception as e:        # numpy's own complaint, on one line
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise FoldError(f"cannot fold at import: {why}") from None
    out_types = [t or it for t, (it, _) in zip(list(out_types) + [0] * len(inferred), inferred)]
    if outs is None:                  # no numpy folder for this case: onnxruntime folds it
        outs = _fold_with_ort(node, inputs, opsets, out_types)
    result = []
    for arr, t, (_, dims) in zip(outs, out_types, inferred):
        arr = np.asarray(arr)
        if t:
            want = helper.tensor_dtype_to_np_dtype(t)
            arr = arr if arr.dtype == want else arr.astype(want)
        if dims is not None and arr.shape != dims and arr.size == int(np.prod(dims, dtype=np.int64)):
            arr = arr.reshape(dims)   # onnxruntime gives 0-D results of some ops as 1-D (Mod)
        result.append(arr)
    return result


def _fold_with_ort(node, inputs, opsets, out_types):
    """Run the lone node in onnxruntime (quietly) with its inputs as initializers. Where
    onnxruntime has no kernel for a half-precision type (bfloat16 Log on the CPU), the
    node runs on its inputs widened to float32 and `fold` rounds the results back: apsat
    computes a half-precision model in float32 anyway."""
    try:
        return _run_alone(node, inputs, opsets, out_types)
    except FoldError:
        if not any(is_half(v) for v in inputs):
            raise
    return _run_alone(node, [widened(v) for v in inputs], opsets,
                      [onnx.TensorProto.FLOAT if t in HALF_FLOAT_TYPES else t for t in out_types])


def _run_alone(node, inputs, opsets, out_types):
    """The lone node's outputs from onnxruntime; FoldError with its complaint."""
    import onnxruntime as ort

    inits = [numpy_helper.from_array(np.asarray(v, order="C"), name)
             for name, v in zip(node.input, inputs) if name and v is not None]
    outs = [helper.make_tensor_value_info(name, t or onnx.TensorProto.FLOAT, None)
            for name, t in zip(node.output, out_types) if name]
    graph = helper.make_graph([node], "fold", [], outs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()])
    model.ir_version = 10            # onnxruntime 1.31 accepts up to IR 11
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        values = sess.run(None, {})
    except Exception as e:
        raise FoldError(f"cannot fold at import (onnxruntime): {str(e).splitlines()[0]}") from None
    by_name = dict(zip([o.name for o in outs], values))
    return [by_name.get(name) for name in node.output]
