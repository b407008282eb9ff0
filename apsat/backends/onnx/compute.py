"""Compute operators other than products, as ONNX nodes.

Element-wise operators read the registry: an entry's `onnx_out` names the ONNX op (and how
its literal parameters become attributes or inputs); an entry without one is written as
its formula, one ONNX node per step, in the formula's own order. Whether an ONNX op takes
or gives booleans comes from ONNX's schema, so comparisons and logic ops get their Casts
from the op's declaration, not from a table here. Reductions and normalisations over the
item become ONNX's reduce ops (a global pool where they cover every axis after N and C),
Softmax, LayerNormalization, RMSNormalization and LRN on the axes the value
already has, so no transpose is written for them.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto

from apsat.backends.onnx.graph import Builder, Val, in_layout, physical
from apsat.backends.onnx.views import ExportError, Pair, as_val, slice_axis, squeeze, _common_order
from apsat.lang import formula as fm
from apsat.lang.ops import COMPUTE_OPS, chain_parts
from apsat.lang.primitives import PRIMITIVES

OPSET = 23     # the default domain's version every export imports (Attention is opset 23)

REDUCE_OPS = {"reduce-sum": "ReduceSum", "reduce-max": "ReduceMax", "reduce-mean": "ReduceMean"}


def operands(b: Builder, v, axis: int) -> list:
    """The element-wise operands of a compute whose items lead with axis `axis`: a Pair's
    own, else slices of the value along that axis."""
    if isinstance(v, Pair):
        return [as_val(b, o) for o in v.operands]
    v = as_val(b, v)
    if v.perm[axis] is None or v.dims[v.perm[axis]] == 1:
        return [squeeze(v, axis)] * v.shape[axis]
    return [squeeze(slice_axis(b, v, axis, i, i + 1), axis) for i in range(v.shape[axis])]


# ONNX ops with a neutral constant: (value, the operand positions it may take)
NEUTRAL = {"Add": (0.0, (0, 1)), "Mul": (1.0, (0, 1)), "Sub": (0.0, (1,)), "Div": (1.0, (1,))}


def elementwise(b: Builder, op, vals: list, shape: tuple) -> Val:
    """Apply the element-wise operator term `op` (unary map, n-ary operator or chain) to
    operand Vals of logical dims `shape` (broadcast where smaller)."""
    kept = _without_neutral(op, vals, shape)
    if kept is not None:
        return kept
    live = [v for v in vals if not v.is_const]
    if len(live) == 1 and all(v.array.size == 1 for v in vals if v.is_const) and b.reshaped_from(live[0].name):
        return _before_reshape(b, op, vals, live[0], shape)
    order = _common_order(vals, len(shape))
    laid = [in_layout(b, v, order) for v in vals]
    names = [physical(b, v) for v in laid]
    dims = tuple(np.broadcast_shapes(*[v.dims for v in laid]))
    return Val(_chain(b, op, names), dims, laid[0].perm, shape)


def _before_reshape(b: Builder, op, vals: list, x: Val, shape: tuple) -> Val:
    """An element-wise op of one reshaped value and scalars, applied before the reshape
    (it commutes with it): a split, scale and merge around Attention cost one Mul."""
    src, src_dims = b.reshaped_from(x.name)
    names = [src if v is x else b.const(v.array.reshape(())) for v in vals]
    name = _chain(b, op, names)
    return Val(b.reshape(name, x.dims, src_dims), x.dims, x.perm, shape)


def _chain(b: Builder, op, names: list) -> str:
    first, *rest = chain_parts(op)
    name = _apply(b, first, names)
    for g in rest:
        name = _apply(b, g, [name])
    return name


def _without_neutral(op, vals: list, shape: tuple):
    """x + 0, x * 1, x - 0, x / 1 (the constant all neutral, x already of the result's
    shape): x itself, no node; else None."""
    parts = chain_parts(op)
    kind = COMPUTE_OPS[parts[0].op].onnx_out.split(" ")[0]
    if len(parts) != 1 or len(vals) != 2 or kind not in NEUTRAL:
        return None
    value, positions = NEUTRAL[kind]
    for k in positions:
        const, other = vals[k], vals[1 - k]
        if const.is_const and np.all(const.array == value) and other.shape == tuple(shape):
            return other
    return None


def _apply(b: Builder, op, names: list) -> str:
    spec = COMPUTE_OPS[op.op]
    if op.op == "cast":         # rounded to the type; kept there only in the export's own type
        to = int(op.args[0])
        out = b.op("Cast", names, to=to)
        return out if to in (b.float_type, TensorProto.FLOAT) else b.op("Cast", [out], to=TensorProto.FLOAT)
    if not spec.onnx_out:
        reading = fm.Reading(lambda c: b.const(np.float32(c)), lambda fn, *xs: _call(b, fn, xs),
                             lambda kind, *xs: _compare(b, kind, xs), lambda c, x, y: b.op("Where", [c, x, y]))
        return fm.interpret(spec.scalar, names, op.args, reading)
    op_type, *words = spec.onnx_out.split()
    attrs = {k: _literal(v) for k, v in (w.split("=") for w in words if "=" in w)}
    named = [w for w in words if "=" not in w and w != "+"]
    attrs.update({w: float(p) for w, p in zip(named, op.args)})
    inputs = list(names) + ([b.const(np.float32(p)) for p in op.args] if "+" in words else [])
    if spec.kind == "nary" and spec.arity == 0 and len(inputs) > 2 and op_type in ("Add", "Mul"):
        out = inputs[0]
        for x in inputs[1:]:
            out = _typed(b, op_type, [out, x], attrs)
        return out
    return _typed(b, op_type, inputs, attrs)


def _literal(text: str):
    """A fixed attribute's value: an int, else a float, else the string."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _typed(b: Builder, op_type: str, inputs: list, attrs: dict) -> str:
    """One node, with Casts where ONNX's schema wants booleans in or gives them out (the
    language's booleans are float 0.0 / 1.0). `domain:Op` is a contrib op (float in and
    out)."""
    if ":" in op_type:
        domain, op_type = op_type.split(":")
        return b.op(op_type, inputs, domain=domain, **attrs)
    schema = onnx.defs.get_schema(op_type, OPSET)
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}

    def boolean(type_str):
        return type_str == "tensor(bool)" or allowed.get(type_str) == {"tensor(bool)"}

    formal = [i.type_str for i in schema.inputs]
    ins = [b.cast(x, TensorProto.BOOL) if boolean(formal[min(k, len(formal) - 1)]) else x
           for k, x in enumerate(inputs)]
    out = b.op(op_type, ins, **attrs)
    return b.cast(out, TensorProto.FLOAT, TensorProto.BOOL) if boolean(schema.outputs[0].type_str) else out


def _call(b: Builder, fn: str, xs) -> str:
    """A formula's primitive function as the ONNX op its table entry names
    (apsat/lang/primitives.py); log1p, which ONNX lacks, as Log(1 + x)."""
    spelling = PRIMITIVES[fn].onnx
    if spelling is None:
        return b.op("Log", [b.op("Add", [xs[0], b.const(np.float32(1.0))])])
    op_type, *words = spelling.split()
    return b.op(op_type, list(xs), **{k: _literal(v) for k, v in (w.split("=") for w in words)})


def _compare(b: Builder, kind: str, xs) -> str:
    if kind == "nz":
        return b.cast(xs[0], TensorProto.BOOL)
    return b.op("GreaterOrEqual", list(xs))


# ---- over the whole item --------------------------------------------------------------------

# a reduction over every axis after (N, C) is a global pool
GLOBAL_POOLS = {"reduce-mean": "GlobalAveragePool", "reduce-max": "GlobalMaxPool"}


def reduce(b: Builder, name: str, v, n_iter: int, shape: tuple) -> Val:
    """reduce-sum / -max / -mean over the item axes (keepdims: the reduced axes stay as
    size-1 physical axes no logical axis names)."""
    v = as_val(b, v, full=True)
    axes = [v.perm[a] for a in range(n_iter, len(v.shape)) if v.perm[a] is not None]
    if not axes:
        return Val(v.name, v.dims, v.perm[:n_iter], shape, v.array)
    if name in GLOBAL_POOLS and 3 <= len(v.dims) <= 5 and sorted(axes) == list(range(2, len(v.dims))):
        out = b.op(GLOBAL_POOLS[name], [physical(b, v)])      # NCHWc-friendly in onnxruntime
    else:
        out = b.op(REDUCE_OPS[name], [physical(b, v), b.ints(axes)], keepdims=1)
    dims = tuple(1 if p in axes else d for p, d in enumerate(v.dims))
    return Val(out, dims, v.perm[:n_iter], shape)


def _item_last(b: Builder, v, n_iter: int) -> Val:
    """`v` laid out with its iterated axes first (in their physical order) and the item
    axes last, in logical order, every dim present."""
    v = as_val(b, v, full=True)
    if v.is_const:
        return in_layout(b, v, tuple(range(len(v.shape))))
    lead = sorted(range(n_iter), key=lambda a: (v.perm[a] is None, v.perm[a] or 0))
    return in_layout(b, v, tuple(lead) + tuple(range(n_iter, len(v.shape))))


def over_item(b: Builder, op, v, n_iter: int, shape: tuple) -> Val:
    """softmax, layer-norm, rms-norm and lrn over the item axes."""
    x = _item_last(b, v, n_iter)
    name, item = physical(b, x), shape[n_iter:]
    if op.op == "softmax":
        wide = [i for i, d in enumerate(item) if d > 1]
        flat = len(wide) > 1               # over one axis (size-1 axes aside): no reshape
        if flat:
            name = b.reshape(name, list(x.dims[:n_iter]) + [-1])
        out = b.op("Softmax", [name], axis=-1 if flat else n_iter + (wide or [0])[0])
        out = b.reshape(out, x.dims) if flat else out
    elif op.op == "layer-norm":
        out = b.op("LayerNormalization", [name, b.const(np.ones(item, np.float32))],
                   axis=n_iter, epsilon=float(op.args[0]))
    elif op.op == "rms-norm":
        out = b.op("RMSNormalization", [name, b.const(np.ones(item, np.float32))],
                   axis=n_iter, epsilon=float(op.args[0]))
    elif op.op == "lrn":
        out = _lrn(b, name, x.dims, n_iter, op.args)
    else:                                # a new "item" operator without an ONNX form here
        raise ExportError(f"compute {op.op} has no ONNX form")
    return Val(out, x.dims, x.perm, shape)


def _lrn(b: Builder, x: str, dims: tuple, n_iter: int, params) -> str:
    """ONNX LRN across axis 1: the iterated axes fold into N, the item's first is C."""
    size, alpha, beta, bias = params
    lead = int(np.prod(dims[:n_iter])) if n_iter else 1
    rest = list(dims[n_iter:]) + ([1] if len(dims) - n_iter < 3 else [])
    y = b.reshape(x, [lead] + rest, dims)
    y = b.op("LRN", [y], size=int(size), alpha=float(alpha), beta=float(beta), bias=float(bias))
    return b.reshape(y, dims, [lead] + rest)
