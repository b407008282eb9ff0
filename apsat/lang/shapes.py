"""Shape rules in Python: one function per op of sort Expr, and the item rule of every
compute operator by its kind.

An op's rule is `rule(args, arg_shapes, env) -> AccessShape` (the registry's
`OpSpec.shape`, apsat/lang/ops.py): `args` the term's arguments, `arg_shapes` the access
shape ((iterated dims), (item dims)) of each expr argument in order, `env` the tensor
shapes. A term that breaks its op's rule raises ShapeError naming the op. The egglog
counterparts, relational, are in shape_rules.egg; tests/egraph/test_egglog_shapes.py checks
that both agree.
"""
from __future__ import annotations

import math

from apsat.errors import ShapeError


def _fail(msg: str):
    raise ShapeError(msg)


def _check(cond: bool, msg: str):
    if not cond:
        _fail(msg)


def _prod(dims) -> int:
    return math.prod(dims)


def access_tensor(args, shapes, env):
    name = args[0]
    if name not in env:
        _fail(f"access-tensor {name!r}: no shape given for tensor {name!r}")
    return ((), tuple(env[name]))


def access(args, shapes, env):
    (it, item), k = shapes[0], args[1]
    dims = it + item
    _check(0 <= k <= len(dims), f"access: axis {k} outside 0..{len(dims)} for {dims}")
    return (dims[:k], dims[k:])


def access_transpose(args, shapes, env):
    (it, item), perm = shapes[0], args[1]
    dims = it + item
    _check(sorted(perm) == list(range(len(dims))),
           f"access-transpose: {list(perm)} is not a permutation of {len(dims)} axes")
    out = tuple(dims[p] for p in perm)
    return (out[: len(it)], out[len(it):])


def access_cartesian_product(args, shapes, env):
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


def access_windows(args, shapes, env):
    (it, item), window, strides = shapes[0], args[1], args[2]
    return (it + _window_out(item, window, strides, (1,) * len(window), "access-windows"), window)


def access_dilated_windows(args, shapes, env):
    (it, item), window, strides, dil = shapes[0], args[1], args[2], args[3]
    out = _window_out(item, window, strides, dil, "access-dilated-windows")
    return (it + out, window)


def access_squeeze(args, shapes, env):
    (it, item), axis = shapes[0], args[1]
    dims = it + item
    _check(0 <= axis < len(dims) and dims[axis] == 1,
           f"access-squeeze: axis {axis} of {dims} is not of size 1")
    if axis < len(it):
        return (it[:axis] + it[axis + 1:], item)
    j = axis - len(it)
    return (it, item[:j] + item[j + 1:])


def access_insert_axis(args, shapes, env):
    (it, item), axis = shapes[0], args[1]
    _check(0 <= axis <= len(it) + len(item), f"access-insert-axis: axis {axis} out of range")
    if axis <= len(it):
        return (it[:axis] + (1,) + it[axis:], item)
    j = axis - len(it)
    return (it, item[:j] + (1,) + item[j:])


def access_flatten(args, shapes, env):
    it, item = shapes[0]
    return ((_prod(it),), (_prod(item),))


def access_reshape(args, shapes, env):
    it, item = shapes[0]
    new_it, new_item = shapes[1]
    _check(_prod(it + item) == _prod(new_it + new_item),
           f"access-reshape: {it + item} has {_prod(it + item)} elements, "
           f"target {new_it + new_item} has {_prod(new_it + new_item)}")
    return (new_it, new_item)


def access_slice(args, shapes, env):
    (it, item), axis, lo, hi = shapes[0], args[1], args[2], args[3]
    dims = list(it + item)
    _check(0 <= axis < len(dims), f"access-slice: axis {axis} out of range for {tuple(dims)}")
    _check(0 <= lo < hi <= dims[axis], f"access-slice: [{lo}, {hi}) outside 0..{dims[axis]}")
    dims[axis] = hi - lo
    return (tuple(dims[: len(it)]), tuple(dims[len(it):]))


def access_concatenate(args, shapes, env):
    (ia, ta), (ib, tb), axis = shapes[0], shapes[1], args[2]
    a, b = list(ia + ta), list(ib + tb)
    _check(len(ia) == len(ib) and len(a) == len(b),
           f"access-concatenate: shapes {(ia, ta)} and {(ib, tb)} differ in layout")
    _check(0 <= axis < len(a), f"access-concatenate: axis {axis} out of range")
    _check(all(x == y for i, (x, y) in enumerate(zip(a, b)) if i != axis),
           f"access-concatenate: {tuple(a)} and {tuple(b)} differ off axis {axis}")
    a[axis] += b[axis]
    return (tuple(a[: len(ia)]), tuple(a[len(ia):]))


def access_gather(args, shapes, env):
    (dit, ditem), (iit, iitem), axis = shapes[0], shapes[1], args[2]
    data, index = tuple(dit) + tuple(ditem), tuple(iit) + tuple(iitem)
    _check(0 <= axis < len(data), f"access-gather: axis {axis} out of range for {data}")
    return (data[:axis] + index + data[axis + 1:], ())


def access_pad(args, shapes, env):
    (it, item), axis, before, after = shapes[0], args[2], args[3], args[4]
    dims = list(it + item)
    _check(0 <= axis < len(dims), f"access-pad: axis {axis} out of range")
    _check(before >= 0 and after >= 0, "access-pad: negative padding")
    dims[axis] += before + after
    return (tuple(dims[: len(it)]), tuple(dims[len(it):]))


def access_pair(args, shapes, env):
    a, b = shapes
    _check(a == b, f"access-pair: shapes differ, {a} vs {b}")
    return (a[0], (2,) + a[1])


def access_broadcast(args, shapes, env):
    (it, item), (tit, titem) = shapes
    src, dst = it + item, tit + titem
    _check(len(src) == len(dst) and all(s in (1, d) for s, d in zip(src, dst)),
           f"access-broadcast: {src} does not broadcast to {dst}")
    return (tit, titem)


def access_literal(args, shapes, env):
    return ((), ())


def compute(args, shapes, env):
    from apsat.lang.ops import COMPUTE_OPS   # here, not at the top: the registry imports us

    op = args[0]
    it, item = shapes[0]
    spec = COMPUTE_OPS.get(op.op)
    if spec is None:
        _fail(f"compute: unknown operator {op.op!r}")
    return (it, spec.item_shape(op.args, item))


def systolic_array(args, shapes, env):
    rows, cols = args[0], args[1]
    (ia, ta), (ib, tb) = shapes[0], shapes[1]
    _check(ta == (rows,), f"systolic-array {rows} {cols}: left item shape {ta} is not ({rows},)")
    _check(ib == () and tb == (rows, cols),
           f"systolic-array {rows} {cols}: right shape {(ib, tb)} is not ((), ({rows}, {cols}))")
    return (ia, (cols,))


def opaque(args, shapes, env):
    return ((), tuple(args[2]))


def _fused_dot(args, shapes, env, op):
    """Shape of the fused dot-product atoms: a ((ia), item), b ((ib), item), bias ((ib), ())
    -> ((ia ++ ib), ()), as `compute dot-product (access-cartesian-product a b)`."""
    (ia, ta), (ib, tb), (ic, tc) = shapes
    _check(ta == tb, f"{op}: item shapes differ, {ta} vs {tb}")
    _check(len(ta) >= 1, f"{op}: the item has no axis to pair over")
    _check(ic == ib and tc == (), f"{op}: bias shape {(ic, tc)} is not (({ib}), ())")
    return (ia + ib, ())


def fused_dot_bias(args, shapes, env):
    return _fused_dot(args, shapes, env, "fused-dot-bias")


def fused_dot_bias_act(args, shapes, env):
    from apsat.lang.ops import ACTIVATIONS

    op = args[0]
    _check(op.op in ACTIVATIONS,
           f"fused-dot-bias-act: {op.op!r} is not an activation ({', '.join(sorted(ACTIVATIONS))})")
    return _fused_dot(args[1:], shapes, env, "fused-dot-bias-act")


def attention(args, shapes, env):
    """`attention SAFE qk bias v`: qk ((I.., m, n), (2, d)), bias ((I.., m, n), ()) or a
    scalar ((), ()), v ((I.., m, e), (n)) -> ((I.., m, e), ())."""
    (iq, tq), (ib, tb), (iv, tv) = shapes
    _check(args[0] in (0, 1), f"attention: SAFE is {args[0]}, not 0 or 1")
    _check(len(iq) >= 2 and len(tq) == 2 and tq[0] == 2,
           f"attention: scores operand {(iq, tq)} is not ((.., m, n), (2, d))")
    _check(len(iv) == len(iq) and iv[:-1] == iq[:-1] and tv == iq[-1:],
           f"attention: values operand {(iv, tv)} is not (({iq[:-1]} + (e,)), ({iq[-1]},))")
    _check(ib + tb in ((), iq), f"attention: bias shape {(ib, tb)} is not (({iq}), ()) or a scalar")
    return (iv, ())


# ---- compute operators: the item rule of each kind ------------------------------------------

def item_shape(spec, params: tuple, item: tuple) -> tuple:
    """The item dims compute operator `spec` (a ComputeSpec) with `params` makes of an item
    of dims `item`, by its kind (spec.KINDS)."""
    if spec.axis_needed:
        _check(len(item) >= 1, f"{spec.name}: {spec.axis_needed}")
    if spec.kind in ("contraction", "reduction"):
        return ()
    if spec.kind in ("map", "item"):
        return item
    if spec.kind == "nary":
        n = spec.arity
        _check(len(item) >= 1 and item[0] >= 2 and (n == 0 or item[0] == n),
               f"elementwise op: item {item} needs a leading axis of "
               f"{'at least 2' if n == 0 else n} operands")
        return item[1:]
    return _chain(params, item)


def _chain(params, item):
    """G's item rule applied to F's; F must be element-wise and G a unary map."""
    from apsat.lang.ops import COMPUTE_OPS, UNARY_MAPS, is_elementwise_op

    f, g = params
    _check(is_elementwise_op(f), f"chain: {f.op} is not an element-wise operator (a unary "
           "map, an n-ary operator or a chain of them)")
    _check(g.op in UNARY_MAPS, f"chain: {g.op} is not a unary element-wise map "
           f"({', '.join(sorted(UNARY_MAPS))})")
    inner = COMPUTE_OPS[f.op].item_shape(f.args, item)
    return COMPUTE_OPS[g.op].item_shape(g.args, inner)
