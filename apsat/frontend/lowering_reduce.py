"""Lowerings of ONNX's reductions (Reduce*) and of ArgMax/ArgMin, composed from the
language's reduce-sum/-max/-mean and element-wise operators. Conventions (ctx, returned
terms, Unlowerable): lowering_tensor.py.

A reduction moves its reduced axes last (transpose), accesses them as the item and reduces
the item; keepdims reshapes the 1s back in. The other Reduce ops wrap that in element-wise
maps: ReduceMin = -max(-x), ReduceL1 = sum |x|,
ReduceSumSquare = sum x*x, ReduceL2 = sqrt(sum x*x), ReduceLogSum = log(sum x),
ReduceLogSumExp = log(sum exp(x - m)) + m with m the max (onnxruntime's stable form),
ReduceProd = elementwise-mul over the reduced elements as the item's operand axis. With
noop_with_empty_axes and no axes nothing is reduced, but the maps still apply, as in
onnxruntime (ReduceSumSquare gives x*x, ReduceL1 |x|).
"""
from __future__ import annotations

import math

import numpy as np

from apsat.frontend.lowering_tensor import Unlowerable, axes_from, normalize_axis

# ReduceProd multiplies its reduced elements as the operands of one element-wise product;
# a kernel reads every operand of an element at once, so only short products are lowered.
MAX_PRODUCT_OPERANDS = 16


def reduce_axes(b, x, axes, op: str, keepdims: bool):
    """`compute op` (a reduction) of x over `axes` (sorted, distinct; empty: x itself):
    the reduced axes moved last, accessed as the item; keepdims puts 1s in their place."""
    if not axes:
        return x
    dims = b.dims(x)
    keep = [i for i in range(len(dims)) if i not in axes]
    y = b.compute(op, b.at(b.transpose(x, keep + list(axes)), len(keep)))
    if keepdims:
        y = b.reshape(y, tuple(1 if i in axes else d for i, d in enumerate(dims)))
    return y


def node_axes(ctx, since: int) -> list:
    """The sorted axes a Reduce* node reduces: from the `axes` attribute (opset < since)
    or constant input 1; none given means all, unless noop_with_empty_axes (then [])."""
    rank = len(ctx.dims(0))
    axes = axes_from(ctx, "axes", 1, since=since)
    if not axes:
        return [] if ctx.attr("noop_with_empty_axes", 0) else list(range(rank))
    return sorted({normalize_axis(ctx, a, rank, "axes") for a in axes})


def _abs(b, x):
    return b.compute("abs", x)


def _square(b, x):
    return b.elementwise("elementwise-mul", [x, x])


def _reduction(op: str, pre=None, post=None, since: int = 18):
    """Lowering of a Reduce* node: `pre` (b, x -> term) on every element, `compute op` over
    the axes, `post` (b, y -> term) on every result."""
    def lower(ctx):
        b = ctx.b
        x = ctx.term(0) if pre is None else pre(b, ctx.term(0))
        y = reduce_axes(b, x, node_axes(ctx, since), op, bool(ctx.attr("keepdims", 1)))
        return [y if post is None else post(b, y)]
    lower.__doc__ = f"`compute {op}` over the node's axes, between element-wise maps."
    return lower


def lower_reducelogsumexp(ctx):
    """log(sum exp(x - m)) + m with m the max over the axes (kept as 1s to broadcast
    back), the form onnxruntime computes, so large values do not overflow."""
    b, x = ctx.b, ctx.term(0)
    axes = node_axes(ctx, 18)
    m = reduce_axes(b, x, axes, "reduce-max", True)
    e = b.compute("exp", b.elementwise("elementwise-sub", [x, m]))
    keepdims = bool(ctx.attr("keepdims", 1))
    s = b.compute("log", reduce_axes(b, e, axes, "reduce-sum", keepdims))
    if not keepdims:
        m = b.reshape(m, b.dims(s))
    return [b.elementwise("elementwise-add", [s, m])]


def lower_reduceprod(ctx):
    """The reduced elements as the operand axis of one `compute elementwise-mul` (a product
    folded left to right, as onnxruntime multiplies); more than MAX_PRODUCT_OPERANDS of
    them is Unlowerable (an element-wise kernel would read them all at once)."""
    b, x, dims = ctx.b, ctx.term(0), ctx.dims(0)
    axes = node_axes(ctx, 18)
    count = math.prod(dims[a] for a in axes)
    if count > MAX_PRODUCT_OPERANDS:
        raise Unlowerable(f"ReduceProd over {count} elements (at most {MAX_PRODUCT_OPERANDS} "
                          f"are multiplied as one element-wise product)")
    keep = [i for i in range(len(dims)) if i not in axes]
    kept = tuple(dims[i] for i in keep)
    if axes and count > 1:
        x = b.reshape(b.transpose(x, keep + axes), kept + (count,), len(keep))
        x = b.compute("elementwise-mul", x)
    if ctx.attr("keepdims", 1):
        return [b.reshape(x, tuple(1 if i in axes else d for i, d in enumerate(dims)))]
    return [b.reshape(x, kept)]


lower_reducesum = _reduction("reduce-sum", since=13)
lower_reducemean = _reduction("reduce-mean")
lower_reducemax = _reduction("reduce-max")
lower_reducemin = _reduction("reduce-max", lambda b, x: b.compute("negative", x),
                             lambda b, y: b.compute("negative", y))
lower_reducel1 = _reduction("reduce-sum", _abs)
lower_reducesumsquare = _reduction("reduce-sum", _square)
lower_reducel2 = _reduction("reduce-sum", _square, lambda b, y: b.compute("sqrt", y))
lower_reducelogsum = _reduction("reduce-sum", None, lambda b, y: b.compute("log", y))


# ---- ArgMax / ArgMin ------------------------------------------------------------------------

def lower_argmax(ctx):
    """The index of the max (ArgMin: of the max of -x) along `axis`, as a float32 value.
    d = x - max is exactly 0 where x equals the max and nonzero elsewhere, so
    select(d, other, index) keeps the indices of the maxima: the first is
    -max(select(d, -n, -index)), the last (select_last_index) max(select(d, -1, index)).
    The index vector 0..n-1 is a constant weight broadcast along the other axes. Where
    a slice holds a NaN, or its max is infinite (inf - inf is NaN, not 0), the result is
    n (first) or -1 (last), not onnxruntime's index."""
    b, dims = ctx.b, ctx.dims(0)
    axis = normalize_axis(ctx, ctx.attr("axis", 0), len(dims))
    keepdims, last = bool(ctx.attr("keepdims", 1)), bool(ctx.attr("select_last_index", 0))
    x = ctx.term(0) if ctx.op == "ArgMax" else b.compute("negative", ctx.term(0))
    n = dims[axis]
    d = b.elementwise("elementwise-sub", [x, reduce_axes(b, x, [axis], "reduce-max", True)])
    shape = [n if i == axis else 1 for i in range(len(dims))]

    def indices(negated: bool):
        """0..n-1 along the axis (negated): a generated Range where n follows a symbol."""
        if ctx.follows_symbol(n):
            t = b.reshape(ctx.add_range("index", n), tuple(shape))
            return b.compute("negative", t) if negated else t
        index = np.arange(n, dtype=np.float32).reshape(shape)
        return ctx.add_weight("neg_index" if negated else "index", -index if negated else index)

    if last:
        chosen = b.select(d, b.literal(-1.0), indices(False))
        return [reduce_axes(b, chosen, [axis], "reduce-max", keepdims)]
    chosen = b.select(d, b.literal(-float(n)), indices(True))
    return [b.compute("negative", reduce_axes(b, chosen, [axis], "reduce-max", keepdims))]
