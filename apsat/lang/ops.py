"""The op registry: one entry per construct of the access-pattern language.

Each entry declares the op's argument kinds (its signature), its shape rule in Python, and
where ONNX programs get it from. The other per-op parts live with their layer and are
checked against this registry by tests/test_registry.py: the egglog declaration and shape
rule (language.egg, shape_rules.egg), the reference semantics (backends/reference.py) and the importer
(egraph/importer.py).

An access pattern's shape is a pair ((iterated dims), (item dims)), after Glenside.
Argument kinds:
  expr          a child Expr term
  int, float    a literal
  name          a tensor name or opaque-call key (a string)
  list          an int tuple written `(list 1 0)`
  shape         an int tuple written `(shape 3 3 3)`
  exprs         a tuple of Expr terms written `(args e1 e2 ...)`
  access-shape  an `(access-shape (shape ..) (shape ..))` term
  pad-type      `zero-padding` or `min-padding`
  compute-op    a compute operator term: `dot-product`, `relu`, `(clip 0.0 6.0)`, ...

Compute operators take literal parameters (`clip lo hi`) or operator-valued ones: `(chain F
G)` applies G to the result of F, item by item, and is written with its operators as
arguments, `(chain elementwise-add relu)`, `(chain (chain elementwise-mul tanh) (clip 0.0 6.0))`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from apsat.lang.term import ATTRIBUTE_OPS
from apsat.errors import ShapeError

Dims = tuple[int, ...]
AccessShape = tuple[Dims, Dims]


@dataclass(frozen=True)
class OpSpec:
    """An op of sort Expr. `shape(args, arg_shapes, env)` returns the access shape;
    `arg_shapes` holds the AccessShape of each expr argument (tuples for `exprs`) in order.
    `onnx` names the ONNX ops the importer lowers into this op, or says why none does."""

    name: str
    signature: tuple[str, ...]
    shape: Callable
    doc: str
    onnx: tuple[str, ...] | str


@dataclass(frozen=True)
class ComputeSpec:
    """A compute operator: applied to every item; `item_shape(params, item)` gives the
    result item dims. `params` are the kinds of the operator's parameters: literals
    (`float`, `int`) or operators (`compute-op`: a compute operator term, as `chain` takes)."""

    name: str
    params: tuple[str, ...]
    item_shape: Callable
    doc: str
    onnx: tuple[str, ...] | str


def _fail(msg: str):
    raise ShapeError(msg)


def _check(cond: bool, msg: str):
    if not cond:
        _fail(msg)


def _prod(dims) -> int:
    return math.prod(dims)


# ---- shape rules -------------------------------------------------------------------------

def _access_tensor(args, shapes, env):
    name = args[0]
    if name not in env:
        _fail(f"access-tensor {name!r}: no shape given for tensor {name!r}")
    return ((), tuple(env[name]))


def _access(args, shapes, env):
    (it, item), k = shapes[0], args[1]
    dims = it + item
    _check(0 <= k <= len(dims), f"access: axis {k} outside 0..{len(dims)} for {dims}")
    return (dims[:k], dims[k:])


def _transpose(args, shapes, env):
    (it, item), perm = shapes[0], args[1]
    dims = it + item
    _check(sorted(perm) == list(range(len(dims))),
           f"access-transpose: {list(perm)} is not a permutation of {len(dims)} axes")
    out = tuple(dims[p] for p in perm)
    return (out[: len(it)], out[len(it):])


def _cartesian(args, shapes, env):
    (ia, ta), (ib, tb) = shapes
    _check(ta == tb, f"access-cartesian-product: item shapes differ, {ta} vs {tb}")
    return (ia + ib, (2,) + ta)


def _window_out(item, window, strides, dilations, op):
    _check(len(window) == len(item) == len(strides) == len(dilations),
           f"{op}: window {window}, strides {strides} and item dims {item} differ in rank")
    out = []
    for d, w, s, dl in zip(item, window, strides, dilations):
        span = (w - 1) * dl + 1
        _check(s > 0 and w > 0 and dl > 0, f"{op}: window, strides and dilations must be positive")
        _check(span <= d, f"{op}: window {window} does not fit item dims {item}")
        out.append((d - span) // s + 1)
    return tuple(out)


def _windows(args, shapes, env):
    (it, item), window, strides = shapes[0], args[1], args[2]
    return (it + _window_out(item, window, strides, (1,) * len(window), "access-windows"), window)


def _dilated_windows(args, shapes, env):
    (it, item), window, strides, dil = shapes[0], args[1], args[2], args[3]
    out = _window_out(item, window, strides, dil, "access-dilated-windows")
    return (it + out, window)


def _squeeze(args, shapes, env):
    (it, item), axis = shapes[0], args[1]
    dims = it + item
    _check(0 <= axis < len(dims) and dims[axis] == 1,
           f"access-squeeze: axis {axis} of {dims} is not of size 1")
    if axis < len(it):
        return (it[:axis] + it[axis + 1:], item)
    j = axis - len(it)
    return (it, item[:j] + item[j + 1:])


def _insert_axis(args, shapes, env):
    (it, item), axis = shapes[0], args[1]
    _check(0 <= axis <= len(it) + len(item), f"access-insert-axis: axis {axis} out of range")
    if axis <= len(it):
        return (it[:axis] + (1,) + it[axis:], item)
    j = axis - len(it)
    return (it, item[:j] + (1,) + item[j:])


def _flatten(args, shapes, env):
    it, item = shapes[0]
    return ((_prod(it),), (_prod(item),))


def _reshape(args, shapes, env):
    it, item = shapes[0]
    new_it, new_item = shapes[1]
    _check(_prod(it + item) == _prod(new_it + new_item),
           f"access-reshape: {it + item} has {_prod(it + item)} elements, "
           f"target {new_it + new_item} has {_prod(new_it + new_item)}")
    return (new_it, new_item)


def _slice(args, shapes, env):
    (it, item), axis, lo, hi = shapes[0], args[1], args[2], args[3]
    dims = list(it + item)
    _check(0 <= axis < len(dims), f"access-slice: axis {axis} out of range for {tuple(dims)}")
    _check(0 <= lo < hi <= dims[axis], f"access-slice: [{lo}, {hi}) outside 0..{dims[axis]}")
    dims[axis] = hi - lo
    return (tuple(dims[: len(it)]), tuple(dims[len(it):]))


def _concatenate(args, shapes, env):
    (ia, ta), (ib, tb), axis = shapes[0], shapes[1], args[2]
    a, b = list(ia + ta), list(ib + tb)
    _check(len(ia) == len(ib) and len(a) == len(b),
           f"access-concatenate: shapes {(ia, ta)} and {(ib, tb)} differ in layout")
    _check(0 <= axis < len(a), f"access-concatenate: axis {axis} out of range")
    _check(all(x == y for i, (x, y) in enumerate(zip(a, b)) if i != axis),
           f"access-concatenate: {tuple(a)} and {tuple(b)} differ off axis {axis}")
    a[axis] += b[axis]
    return (tuple(a[: len(ia)]), tuple(a[len(ia):]))


def _pad(args, shapes, env):
    (it, item), axis, before, after = shapes[0], args[2], args[3], args[4]
    dims = list(it + item)
    _check(0 <= axis < len(dims), f"access-pad: axis {axis} out of range")
    _check(before >= 0 and after >= 0, "access-pad: negative padding")
    dims[axis] += before + after
    return (tuple(dims[: len(it)]), tuple(dims[len(it):]))


def _pair(args, shapes, env):
    a, b = shapes
    _check(a == b, f"access-pair: shapes differ, {a} vs {b}")
    return (a[0], (2,) + a[1])


def _broadcast(args, shapes, env):
    (it, item), (tit, titem) = shapes
    src, dst = it + item, tit + titem
    _check(len(src) == len(dst) and all(s in (1, d) for s, d in zip(src, dst)),
           f"access-broadcast: {src} does not broadcast to {dst}")
    return (tit, titem)


def _literal(args, shapes, env):
    return ((), ())


def _compute(args, shapes, env):
    op = args[0]
    it, item = shapes[0]
    spec = COMPUTE_OPS.get(op.op)
    if spec is None:
        _fail(f"compute: unknown operator {op.op!r}")
    return (it, spec.item_shape(op.args, item))


def _systolic(args, shapes, env):
    rows, cols = args[0], args[1]
    (ia, ta), (ib, tb) = shapes[0], shapes[1]
    _check(ta == (rows,), f"systolic-array {rows} {cols}: left item shape {ta} is not ({rows},)")
    _check(ib == () and tb == (rows, cols),
           f"systolic-array {rows} {cols}: right shape {(ib, tb)} is not ((), ({rows}, {cols}))")
    return (ia, (cols,))


def _opaque(args, shapes, env):
    return ((), tuple(args[2]))


def _fused_dot(args, shapes, env, op):
    """Shape of the fused dot-product atoms: a ((ia), item), b ((ib), item), bias ((ib), ())
    -> ((ia ++ ib), ()), as `compute dot-product (access-cartesian-product a b)`."""
    (ia, ta), (ib, tb), (ic, tc) = shapes
    _check(ta == tb, f"{op}: item shapes differ, {ta} vs {tb}")
    _check(len(ta) >= 1, f"{op}: the item has no axis to pair over")
    _check(ic == ib and tc == (), f"{op}: bias shape {(ic, tc)} is not (({ib}), ())")
    return (ia + ib, ())


def _fused_dot_bias(args, shapes, env):
    return _fused_dot(args, shapes, env, "fused-dot-bias")


def _fused_dot_bias_act(args, shapes, env):
    op = args[0]
    _check(op.op in ACTIVATIONS,
           f"fused-dot-bias-act: {op.op!r} is not an activation ({', '.join(sorted(ACTIVATIONS))})")
    return _fused_dot(args[1:], shapes, env, "fused-dot-bias-act")


OPS: dict[str, OpSpec] = {s.name: s for s in [
    OpSpec("access-tensor", ("name",), _access_tensor,
           "A named tensor (input or weight) accessed as ((), dims).", ("<graph input>", "<initializer>")),
    OpSpec("access", ("expr", "int"), _access,
           "Re-split an access: the first k dims are iterated, the rest are the item.", ("<layout>",)),
    OpSpec("access-transpose", ("expr", "list"), _transpose,
           "Permute all dims; the split stays at the same position.", ("Transpose",)),
    OpSpec("access-cartesian-product", ("expr", "expr"), _cartesian,
           "Every pair of items of a and b: ((ia ++ ib), (2, item)).", ("Conv", "Gemm", "MatMul")),
    OpSpec("access-windows", ("expr", "shape", "shape"), _windows,
           "Sliding windows (window shape, strides) over the item dims.", ("Conv", "MaxPool", "AveragePool")),
    OpSpec("access-dilated-windows", ("expr", "shape", "shape", "shape"), _dilated_windows,
           "access-windows with dilations (window elements spaced apart).", ("Conv",)),
    OpSpec("access-squeeze", ("expr", "int"), _squeeze,
           "Remove a dim of size 1.", ("Squeeze", "Conv")),
    OpSpec("access-insert-axis", ("expr", "int"), _insert_axis,
           "Insert a dim of size 1.", ("Unsqueeze", "MatMul")),
    OpSpec("access-flatten", ("expr",), _flatten,
           "Flatten the iterated dims to one and the item dims to one.",
           "produced by rules (im2col); the importer uses access-reshape"),
    OpSpec("access-reshape", ("expr", "access-shape"), _reshape,
           "Reinterpret the elements (row-major) with a new access shape.",
           ("Reshape", "Flatten", "GlobalAveragePool")),
    OpSpec("access-slice", ("expr", "int", "int", "int"), _slice,
           "Keep [low, high) of one axis.", ("Slice", "Split", "Gather")),
    OpSpec("access-concatenate", ("expr", "expr", "int"), _concatenate,
           "Join two accesses along an axis.", ("Concat", "Gather")),
    OpSpec("access-pad", ("expr", "pad-type", "int", "int", "int"), _pad,
           "Pad one axis (zero-padding, or min-padding = -inf for max pooling).", ("Conv", "MaxPool", "Pad")),
    OpSpec("access-pair", ("expr", "expr"), _pair,
           "Pair two equal-shaped accesses item by item: item (2, item).", ("Add", "Mul", "Sub", "Div", "Pow")),
    OpSpec("access-broadcast", ("expr", "access-shape"), _broadcast,
           "Broadcast dims of size 1 to a target access shape (same rank).", ("Expand", "Add", "Mul")),
    OpSpec("access-literal", ("float",), _literal,
           "A scalar constant with shape ((), ()).", ("BatchNormalization", "Constant")),
    OpSpec("compute", ("compute-op", "expr"), _compute,
           "Apply a compute operator to every item.", ("Relu", "Softmax", "Conv")),
    OpSpec("systolic-array", ("int", "int", "expr", "expr"), _systolic,
           "Hardware atom: a ((batch),(rows)) times b ((),(rows, cols)) matmul on a systolic array.",
           "hardware atom, produced only by the systolic rules"),
    OpSpec("opaque", ("name", "exprs", "shape"), _opaque,
           "An ONNX node the language does not cover, run by onnxruntime: ((), out dims).",
           ("<any op without a lowering>",)),
    # Fused kernel atoms (produced by apsat/rules/fusion.egg, never by the importer).
    OpSpec("fused-dot-bias", ("expr", "expr", "expr"), _fused_dot_bias,
           "Kernel atom: matmul/convolution plus per-output-column bias. For a ((ia), item), "
           "b ((ib), item), bias ((ib), ()): out[i.., j..] = sum over item of "
           "a[i.., item] * b[j.., item] + bias[j..], shape ((ia ++ ib), ()); i.e. "
           "`compute dot-product (access-cartesian-product a b)` plus bias broadcast over ia.",
           "kernel atom, produced only by the fusion rules"),
    OpSpec("fused-dot-bias-act", ("compute-op", "expr", "expr", "expr"), _fused_dot_bias_act,
           "Kernel atom: `fused-dot-bias a b bias` followed by an elementwise activation OP "
           "(one of ops.ACTIVATIONS: relu, clip lo hi, gelu, sigmoid, tanh) applied to every "
           "element: out = OP(fused-dot-bias a b bias), shape ((ia ++ ib), ()).",
           "kernel atom, produced only by the fusion rules"),
]}

# ---- compute operators --------------------------------------------------------------------

def _to_scalar(name):
    def rule(params, item):
        return ()
    return rule


def _same(params, item):
    return item


def _dot(params, item):
    _check(len(item) >= 1, "dot-product: item has no axis to pair over")
    return ()


def _nary(n_exact):
    def rule(params, item):
        _check(len(item) >= 1 and item[0] >= 2 and (n_exact is None or item[0] == n_exact),
               f"elementwise op: item {item} needs a leading axis of "
               f"{'at least 2' if n_exact is None else n_exact} operands")
        return item[1:]
    return rule


def _lrn(params, item):
    _check(len(item) >= 1, "lrn: item needs a channel axis")
    return item


def _chain(params, item):
    """G's item rule applied to F's; F must be element-wise and G a unary map."""
    f, g = params
    _check(is_elementwise_op(f), f"chain: {f.op} is not an element-wise operator (a unary "
           "map, an n-ary operator or a chain of them)")
    _check(g.op in UNARY_MAPS, f"chain: {g.op} is not a unary element-wise map "
           f"({', '.join(sorted(UNARY_MAPS))})")
    inner = COMPUTE_OPS[f.op].item_shape(f.args, item)
    return COMPUTE_OPS[g.op].item_shape(g.args, inner)


COMPUTE_OPS: dict[str, ComputeSpec] = {s.name: s for s in [
    ComputeSpec("dot-product", (), _dot, "Multiply along the first item axis, sum everything.",
                ("Conv", "Gemm", "MatMul")),
    ComputeSpec("reduce-sum", (), _to_scalar("reduce-sum"), "Sum of the item.", ("ReduceSum", "AveragePool")),
    ComputeSpec("reduce-max", (), _to_scalar("reduce-max"), "Maximum of the item.", ("MaxPool", "ReduceMax")),
    ComputeSpec("reduce-mean", (), _to_scalar("reduce-mean"), "Mean of the item.",
                ("ReduceMean", "AveragePool", "GlobalAveragePool")),
    ComputeSpec("relu", (), _same, "max(x, 0).", ("Relu",)),
    ComputeSpec("negative", (), _same, "-x.", ("Neg",)),
    ComputeSpec("sqrt", (), _same, "Square root.", ("Sqrt", "BatchNormalization")),
    ComputeSpec("exp", (), _same, "e**x.", ("Exp",)),
    ComputeSpec("erf", (), _same, "Gauss error function.", ("Erf",)),
    ComputeSpec("tanh", (), _same, "Hyperbolic tangent.", ("Tanh",)),
    ComputeSpec("sigmoid", (), _same, "1 / (1 + e**-x).", ("Sigmoid",)),
    ComputeSpec("clip", ("float", "float"), _same, "min(max(x, lo), hi).", ("Clip",)),
    ComputeSpec("softmax", (), _same, "Softmax over all item dims.", ("Softmax",)),
    ComputeSpec("layer-norm", ("float",), _same,
                "(x - mean) / sqrt(var + eps) over all item dims (no scale, no bias).",
                ("LayerNormalization",)),
    ComputeSpec("lrn", ("int", "float", "float", "float"), _lrn,
                "ONNX LRN (size, alpha, beta, bias) across the first item axis.", ("LRN",)),
    ComputeSpec("elementwise-add", (), _nary(None), "Sum over the leading operand axis.",
                ("Add", "Sum", "BatchNormalization")),
    ComputeSpec("elementwise-mul", (), _nary(None), "Product over the leading operand axis.",
                ("Mul", "BatchNormalization")),
    ComputeSpec("elementwise-sub", (), _nary(2), "item[0] - item[1].", ("Sub",)),
    ComputeSpec("elementwise-div", (), _nary(2), "item[0] / item[1].", ("Div",)),
    ComputeSpec("elementwise-pow", (), _nary(2), "item[0] ** item[1].", ("Pow",)),
    ComputeSpec("select", (), _nary(3), "item[1] where item[0] != 0 else item[2].", ("Where",)),
    ComputeSpec("gelu", (), _same,
                "Exact (erf) GELU, elementwise: x * (erf(x / sqrt 2) + 1) * 0.5 in float32.",
                "produced by the fusion rules from the Div/Erf/Add/Mul pattern exporters write; "
                "ONNX Gelu (opset 20) is not lowered yet"),
    ComputeSpec("chain", ("compute-op", "compute-op"), _chain,
                "(chain F G): G applied to the result of F, item by item, as one element-wise "
                "kernel: (compute (chain F G) x) = (compute G (compute F x)). F is element-wise "
                "(a pairwise/n-ary operator, a unary map, or a chain: chains nest to the left), "
                "G a unary map (ops.UNARY_MAPS); item shape: G's rule applied to F's.",
                "kernel operator, produced only by the fusion rules"),
]}

# Elementwise unary compute operators a fused kernel may apply as its epilogue.
ACTIVATIONS = frozenset({"relu", "clip", "gelu", "sigmoid", "tanh"})
# Element-wise operators: unary maps (one value in, one out, item kept), n-ary operators
# over the item's leading operand axis, and chains of them (`chain`, see COMPUTE_OPS).
UNARY_MAPS = frozenset({"relu", "negative", "sqrt", "exp", "erf", "tanh", "sigmoid", "clip", "gelu"})
NARY_OPS = frozenset({"elementwise-add", "elementwise-mul", "elementwise-sub", "elementwise-div",
                      "elementwise-pow", "select"})
ELEMENTWISE_OPS = UNARY_MAPS | NARY_OPS | {"chain"}


def chain_parts(op) -> tuple:
    """The operators a compute operator term applies, in order: (F0, G1, G2, ...) for a
    left-nested chain, (op,) for any other operator."""
    parts = []
    while op.op == "chain":
        parts.append(op.args[1])
        op = op.args[0]
    return (op,) + tuple(reversed(parts))


def is_elementwise_op(op) -> bool:
    """True for an element-wise operator term: a unary map, an n-ary operator, or a chain
    whose first part is one and whose other parts are unary maps."""
    first, *rest = chain_parts(op)
    return first.op in UNARY_MAPS | NARY_OPS and all(g.op in UNARY_MAPS for g in rest)

PAD_TYPES = ("zero-padding", "min-padding")

# Registry names egglog cannot take as constructor names (egglog 13.2 already has an f64
# primitive `sqrt`): the language.egg constructor is renamed, the surface syntax is not.
EGG_NAMES = {"sqrt": "sqrt-op"}

ATTRIBUTE_OPS.update(COMPUTE_OPS, PAD_TYPES, ["access-shape"])
