"""Lowerings of ONNX's neural-network ops: convolution, pooling, normalisation, matmul and
softmax. Reductions are in lowering_reduce.py, Instance/GroupNormalization in
lowering_norm.py, ConvTranspose in lowering_convtranspose.py, Resize in lowering_resize.py.
Conventions (ctx, returned terms, Unlowerable): lowering_tensor.py.

Convolution follows Glenside: pad, `(access x 1)`, windows over (C, kh, kw), squeeze the
window axis of C, cartesian product with the weights accessed at 1, `compute dot-product`,
transpose to NCHW. Grouped convolution pairs broadcast windows with broadcast weights over
((N, G, M/G, OH, OW), (C/G, kh, kw)) so nothing is duplicated until a backend decides to.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from apsat.frontend.lowering_tensor import Unlowerable, normalize_axis


# ---- window geometry ------------------------------------------------------------------------

class Geometry(NamedTuple):
    """Windows over the spatial dims: `begin`/`end` padding as applied (end includes
    ceil_mode's extension), `declared_end` the padding the node asked for."""
    begin: list
    end: list
    declared_end: list
    strides: list
    dilations: list
    out: list


def _geometry(ctx, spatial, kernel, ceil_mode=False):
    """Pads (begin, end), strides, dilations and output dims for windows of `kernel` over
    `spatial` dims, from the node's auto_pad/pads/strides/dilations attributes. With
    ceil_mode the end padding is extended so the last partial window exists (onnxruntime's
    rule: a window that would start inside the end padding is dropped)."""
    n = len(spatial)
    strides = ctx.ints("strides", [1] * n)
    dil = ctx.ints("dilations", [1] * n)
    for name, vals in (("strides", strides), ("dilations", dil)):
        if len(vals) != n or min(vals) < 1:
            ctx.bad_attr(name, f"needs {n} positive values, got {vals}")
    auto = ctx.attr("auto_pad", "NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    spans = [(k - 1) * d + 1 for k, d in zip(kernel, dil)]
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        total = [max(0, (-(-x // s) - 1) * s + sp - x) for x, s, sp in zip(spatial, strides, spans)]
        small = [t // 2 for t in total]
        begin = small if auto == "SAME_UPPER" else [t - h for t, h in zip(total, small)]
        end = [t - b for t, b in zip(total, begin)]
    elif auto in ("NOTSET", "VALID"):
        pads = ctx.ints("pads", [0] * 2 * n) if auto == "NOTSET" else [0] * 2 * n
        if len(pads) != 2 * n or min(pads) < 0:
            ctx.bad_attr("pads", f"needs {2 * n} non-negative values, got {pads}")
        begin, end = list(pads[:n]), list(pads[n:])
    else:
        ctx.bad_attr("auto_pad", f"unknown value {auto!r}")
    out, declared_end = [], list(end)
    for i in range(n):
        room = spatial[i] + begin[i] + end[i] - spans[i]
        if room < 0:
            ctx.fail(f"window {spans[i]} does not fit spatial dim {i} of size "
                     f"{spatial[i]} padded by {begin[i]}+{end[i]}")
        o = (-(-room // strides[i]) if ceil_mode else room // strides[i]) + 1
        if ceil_mode and (o - 1) * strides[i] >= spatial[i] + begin[i]:
            o -= 1
        end[i] += max(0, (o - 1) * strides[i] + spans[i] - (spatial[i] + begin[i] + end[i]))
        out.append(o)
    return Geometry(begin, end, declared_end, strides, dil, out)


def _pad_spatial(b, x, kind, begin, end):
    """Pad dims 2.. of an NC... tensor."""
    for i, (lo, hi) in enumerate(zip(begin, end)):
        x = b.pad(x, kind, 2 + i, lo, hi)
    return x


# ---- convolution ----------------------------------------------------------------------------

def lower_conv(ctx):
    b = ctx.b
    xd, wd = ctx.dims(0), ctx.dims(1)
    if len(xd) < 3 or len(wd) != len(xd):
        ctx.fail(f"input dims {xd} and weight dims {wd} are not N,C,spatial.. and M,C/group,kernel..")
    g = ctx.attr("group", 1)
    if g < 1:
        ctx.bad_attr("group", f"{g} is not positive")
    (_, c, *spatial), (m, cg, *kernel) = xd, wd
    if ctx.ints("kernel_shape", kernel) != kernel:
        ctx.bad_attr("kernel_shape", f"{ctx.ints('kernel_shape', None)} differs from the "
                                     f"weight's kernel {kernel}")
    if c != cg * g:
        ctx.fail(f"input has {c} channels but weight {ctx.node.input[1]!r} {wd} with group {g} "
                 f"expects {cg * g}")
    if m % g:
        ctx.fail(f"weight {ctx.node.input[1]!r} has {m} output channels, not divisible by group {g}")
    begin, end, _, strides, dil, _ = _geometry(ctx, spatial, kernel)
    x = _pad_spatial(b, ctx.term(0), "zero-padding", begin, end)
    y = conv(b, x, ctx.term(1), g, strides, dil)
    if ctx.has(2):
        y = b.elementwise("elementwise-add", [y, b.channel(ctx.term(2), len(xd))])
    return [y]


def conv(b, x, w, g, strides, dil):
    """The convolution (cross-correlation) of an already padded x (N, C, spatial..) with
    the weight term w (M, C/g, k..) in g groups, strides and dilations per spatial dim;
    (N, M, out..), no bias. Shapes are the caller's to check (lower_conv, ConvTranspose)."""
    n, c, *padded = b.dims(x)
    m, _, *kernel = b.dims(w)
    s = len(kernel)
    if g == 1:
        win = b.windows(b.at(x, 1), (c, *kernel), (1, *strides), (1, *dil))  # ((N,1,O..),(C,k..))
        win = b.squeeze(win, 1)
        y = b.compute("dot-product", b.make("access-cartesian-product", win, b.at(w, 1)))
        return b.transpose(y, (0, s + 1) + tuple(range(1, s + 1)))          # (N,O..,M) -> NCHW
    out = [(p - (k - 1) * d - 1) // st + 1 for p, k, d, st in zip(padded, kernel, dil, strides)]
    return _grouped(b, x, w, g, (n, c, *padded), m, kernel, strides, dil, out)


def _grouped(b, x, w, g, xdims, m, kernel, strides, dil, out):
    """Grouped convolution over ((N, G, M/G, O..), (C/G, k..)): windows broadcast over the
    M/G filters of their group, weights broadcast over N and the output positions."""
    n, c, *padded = xdims
    cg, mg, s = c // g, m // g, len(kernel)
    xg = b.reshape(x, (n, g, cg, *padded), 2)                                # ((N,G),(C/G,H,W))
    win = b.windows(xg, (cg, *kernel), (1, *strides), (1, *dil))             # ((N,G,1,O..),..)
    win = b.insert_axis(b.squeeze(win, 2), 2)                                # ((N,G,1,O..),..)
    target = (n, g, mg, *out, cg, *kernel)
    win = b.broadcast(win, target, 3 + s)
    wt = b.reshape(w, (1, g, mg) + (1,) * s + (cg, *kernel), 3 + s)
    wt = b.broadcast(wt, target, 3 + s)
    y = b.compute("dot-product", b.make("access-pair", win, wt))              # ((N,G,M/G,O..),())
    return b.reshape(y, (n, m, *out))


# ---- pooling --------------------------------------------------------------------------------

def _pool_kernel(ctx, rank):
    if rank < 3:
        ctx.fail(f"input {ctx.node.input[0]!r} has {rank} dims; pooling needs (N, C, spatial...)")
    kernel = ctx.ints("kernel_shape", None)
    if kernel is None or len(kernel) != rank - 2 or min(kernel) < 1:
        ctx.bad_attr("kernel_shape", f"needs {rank - 2} positive values, got {kernel}")
    return kernel


def lower_maxpool(ctx):
    """min-padding, `(access x 2)`, windows, reduce-max. The Indices output is not produced."""
    if ctx.output_used(1):
        raise Unlowerable("MaxPool indices")
    dims = ctx.dims(0)
    kernel = _pool_kernel(ctx, len(dims))
    begin, end, _, strides, dil, _ = _geometry(ctx, dims[2:], kernel, bool(ctx.attr("ceil_mode", 0)))
    b = ctx.b
    x = _pad_spatial(b, ctx.term(0), "min-padding", begin, end)
    return [b.compute("reduce-max", b.windows(b.at(x, 2), kernel, strides, dil))]


def lower_averagepool(ctx):
    """zero-padding, windows, reduce-mean; when windows cover different numbers of counted
    elements (count_include_pad=0 with pads, or ceil_mode's extra end padding) the sum is
    divided by a count tensor added to the weights instead."""
    dims = ctx.dims(0)
    kernel = _pool_kernel(ctx, len(dims))
    begin, end, declared_end, strides, dil, out = _geometry(
        ctx, dims[2:], kernel, bool(ctx.attr("ceil_mode", 0)))
    b = ctx.b
    x = _pad_spatial(b, ctx.term(0), "zero-padding", begin, end)
    win = b.windows(b.at(x, 2), kernel, strides, dil)
    # Counted region per axis: the real input, plus the declared pads when they count
    # (ceil_mode's extension never counts, as in onnxruntime).
    include = bool(ctx.attr("count_include_pad", 0))
    counts = np.ones(out, dtype=np.float32)
    for i, (d, k, s, dl, lo) in enumerate(zip(dims[2:], kernel, strides, dil, begin)):
        first, last = (-lo, d + declared_end[i]) if include else (0, d)
        taps = np.arange(out[i])[:, None] * s - lo + np.arange(k)[None, :] * dl
        per = ((taps >= first) & (taps < last)).sum(axis=1).astype(np.float32)
        counts = counts * per.reshape([-1 if j == i else 1 for j in range(len(out))])
    if np.all(counts == math.prod(kernel)):
        return [b.compute("reduce-mean", win)]
    total = b.compute("reduce-sum", win)
    count = ctx.add_weight("count", counts.reshape((1, 1, *out)))
    return [b.elementwise("elementwise-div", [total, count])]


def _global_pool(op):
    def lower(ctx):
        """Reduce over all spatial dims: `(access x 2)`, reduce, reshape to (N, C, 1, ..)."""
        dims = ctx.dims(0)
        if len(dims) < 3:
            ctx.fail(f"input dims {dims} have no spatial axes")
        y = ctx.b.compute(op, ctx.b.at(ctx.term(0), 2))
        return [ctx.b.reshape(y, dims[:2] + (1,) * (len(dims) - 2))]
    return lower


lower_globalaveragepool = _global_pool("reduce-mean")
lower_globalmaxpool = _global_pool("reduce-max")


# ---- normalisation --------------------------------------------------------------------------

def lower_batchnorm(ctx):
    """Inference BatchNormalization as x*scale + shift per channel, scale and shift
    computed in the language from the named 1-D weights (rules can fold them into a conv)."""
    if ctx.attr("training_mode", 0) or any(ctx.output_used(k) for k in range(1, 5)):
        raise Unlowerable("BatchNormalization in training mode")
    b = ctx.b
    rank = len(ctx.dims(0))
    x, gamma, beta, mean, var = (ctx.term(i) for i in range(5))
    for i in range(1, 5):
        if ctx.dims(i) != (ctx.dims(0)[1],):
            ctx.fail(f"input {i} ({ctx.node.input[i]!r}) has dims {ctx.dims(i)}, "
                     f"expected ({ctx.dims(0)[1]},)")
    eps = ctx.attr("epsilon", 1e-5)
    std = b.compute("sqrt", b.elementwise("elementwise-add", [var, b.literal(eps)]))
    scale = b.elementwise("elementwise-div", [gamma, std])
    shift = b.elementwise("elementwise-sub", [beta, b.elementwise("elementwise-mul", [mean, scale])])
    y = b.elementwise("elementwise-mul", [x, b.channel(scale, rank)])
    return [b.elementwise("elementwise-add", [y, b.channel(shift, rank)])]


def lower_lrn(ctx):
    size = ctx.attr("size", None)
    if not isinstance(size, int) or size < 1:
        ctx.bad_attr("size", f"needs a positive int, got {size}")
    params = (size, float(ctx.attr("alpha", 1e-4)), float(ctx.attr("beta", 0.75)),
              float(ctx.attr("bias", 1.0)))
    return [ctx.b.compute("lrn", ctx.b.at(ctx.term(0), 1), *params)]


def lower_layernorm(ctx):
    """`(access x axis)`, `compute (layer-norm eps)`, then scale and bias broadcast."""
    if ctx.output_used(1) or ctx.output_used(2):
        raise Unlowerable("LayerNormalization mean/inv-std outputs")
    b, dims = ctx.b, ctx.dims(0)
    axis = normalize_axis(ctx, ctx.attr("axis", -1), len(dims))
    y = b.compute("layer-norm", b.at(ctx.term(0), axis), float(ctx.attr("epsilon", 1e-5)))
    y = b.elementwise("elementwise-mul", [y, ctx.term(1)])
    if ctx.has(2):
        y = b.elementwise("elementwise-add", [y, ctx.term(2)])
    return [y]


def lower_softmax(ctx):
    """Opset < 13: softmax over all dims from `axis` (ONNX's coerced 2-D semantics);
    opset >= 13: over the one axis, moved last when it is not."""
    b, dims = ctx.b, ctx.dims(0)
    rank = len(dims)
    if ctx.opset < 13:
        axis = normalize_axis(ctx, ctx.attr("axis", 1), rank)
        return [b.compute("softmax", b.at(ctx.term(0), axis))]
    axis = normalize_axis(ctx, ctx.attr("axis", -1), rank)
    perm = [i for i in range(rank) if i != axis] + [axis]
    y = b.compute("softmax", b.at(b.transpose(ctx.term(0), perm), rank - 1))
    return [b.transpose(y, list(np.argsort(perm)))]


# ---- matrix products ------------------------------------------------------------------------

def lower_gemm(ctx):
    """alpha * A' B' + beta * C with A' = A or A^T, B' = B or B^T: a dot-product over the
    cartesian product of A' rows and B'^T rows."""
    b = ctx.b
    ad, bd = ctx.dims(0), ctx.dims(1)
    if len(ad) != 2 or len(bd) != 2:
        ctx.fail(f"A {ad} and B {bd} must be 2-D")
    a = b.transpose(ctx.term(0), (1, 0)) if ctx.attr("transA", 0) else ctx.term(0)
    bt = ctx.term(1) if ctx.attr("transB", 0) else b.transpose(ctx.term(1), (1, 0))
    if b.dims(a)[1] != b.dims(bt)[1]:
        ctx.fail(f"A {ad} and B {bd} (transA={ctx.attr('transA', 0)}, "
                 f"transB={ctx.attr('transB', 0)}) differ in K")
    y = b.compute("dot-product", b.make("access-cartesian-product", b.at(a, 1), b.at(bt, 1)))
    alpha, beta = float(ctx.attr("alpha", 1.0)), float(ctx.attr("beta", 1.0))
    if alpha != 1.0:
        y = b.elementwise("elementwise-mul", [y, b.literal(alpha)])
    if ctx.has(2) and beta != 0.0:
        c = ctx.term(2)
        if beta != 1.0:
            c = b.elementwise("elementwise-mul", [c, b.literal(beta)])
        y = b.elementwise("elementwise-add", [y, c])
    return [y]


def lower_matmul(ctx):
    """numpy matmul. B of rank <= 2: cartesian product of A's rows with B^T's rows. Both
    batched: A and B^T broadcast to ((batch.., M, N), (K)), paired, dot-product."""
    b = ctx.b
    ad, bd = ctx.dims(0), ctx.dims(1)
    if not ad or not bd or ad[-1] != bd[-2 if len(bd) > 1 else 0]:
        ctx.fail(f"A {ad} and B {bd} do not agree in K")
    a = ctx.term(0)
    if len(bd) == 1:
        return [b.compute("dot-product", b.make("access-cartesian-product",
                                                b.at(a, len(ad) - 1), b.at(ctx.term(1), 0)))]
    bt = b.transpose(ctx.term(1), tuple(range(len(bd) - 2)) + (len(bd) - 1, len(bd) - 2))
    if len(bd) == 2:
        return [b.compute("dot-product", b.make("access-cartesian-product",
                                                b.at(a, len(ad) - 1), b.at(bt, 1)))]
    squeeze_m = len(ad) == 1
    if squeeze_m:
        a = b.reshape(a, (1,) + ad)
        ad = (1,) + ad
    batch = tuple(np.broadcast_shapes(ad[:-2], bd[:-2]))
    m, k, n = ad[-2], ad[-1], bd[-1]
    target = batch + (m, n, k)
    r = len(target)
    a = b.broadcast(b.reshape(a, (1,) * (len(batch) - len(ad) + 2) + ad[:-1] + (1, k)), target, r - 1)
    bt = b.broadcast(b.reshape(bt, (1,) * (len(batch) - len(bd) + 2) + bd[:-2] + (1, n, k)), target, r - 1)
    y = b.compute("dot-product", b.make("access-pair", a, bt))           # ((batch, M, N), ())
    return [b.squeeze(y, r - 3) if squeeze_m else y]
