"""ConvTranspose as a convolution (lowering_nn.conv): the input with stride-1 zeros inserted
between its elements along each spatial axis, span-1-pad zeros at each edge (span the
dilated kernel extent; output_padding adds to the end; negative means cropped), convolved
at stride 1 with the weight flipped spatially and transposed to (M, C/group, k..). Zeros
are inserted by giving a spatial axis a trailing axis of size 1, zero-padding that to the
stride and reshaping the two into one; the edges are whole elements of zero-padding before
that and a slice after it (see _spread). The weight must be a constant: it is flipped and
transposed once, at import, into a new weight. Conventions (ctx, returned terms,
Unlowerable): lowering_tensor.py.
"""
from __future__ import annotations

import numpy as np

from apsat.frontend.lowering_nn import conv
from apsat.frontend.lowering_tensor import Unlowerable


def _per_axis(ctx, name: str, n: int, default: int) -> list:
    """An n-value attribute, at least 1 when its default is 1 (strides, dilations), at
    least 0 when it is 0 (output_padding)."""
    vals = ctx.ints(name, [default] * n)
    if len(vals) != n or min(vals) < (1 if default else 0):
        ctx.bad_attr(name, f"needs {n} {'positive' if default else 'non-negative'} values, got {vals}")
    return vals


def transposed_pads(ctx, spatial, spans, strides, out_pad) -> tuple[list, list]:
    """(begin, end) padding of the transposed convolution's output, onnxruntime's rule:
    `pads` (NOTSET), none (VALID); with `output_shape` or SAME_* (output = input * stride)
    the total is natural size - wanted size, split in half, the odd one at the end for
    SAME_UPPER and at the beginning otherwise."""
    n = len(spatial)
    auto = ctx.attr("auto_pad", "NOTSET")
    wanted = ctx.ints("output_shape", None)
    if wanted is not None:
        wanted = wanted[-n:]
        if len(wanted) != n:
            ctx.bad_attr("output_shape", f"needs {n} spatial dims, got {ctx.ints('output_shape')}")
    elif auto in ("SAME_UPPER", "SAME_LOWER"):
        wanted = [d * s for d, s in zip(spatial, strides)]
    elif auto not in ("NOTSET", "VALID"):
        ctx.bad_attr("auto_pad", f"unknown value {auto!r}")
    if wanted is None:
        pads = ctx.ints("pads", [0] * 2 * n) if auto == "NOTSET" else [0] * 2 * n
        if len(pads) != 2 * n or min(pads) < 0:
            ctx.bad_attr("pads", f"needs {2 * n} non-negative values, got {pads}")
        return list(pads[:n]), list(pads[n:])
    total = [s * (d - 1) + p + sp - w for d, s, p, sp, w in zip(spatial, strides, out_pad, spans, wanted)]
    if min(total) < 0:
        raise Unlowerable(f"ConvTranspose output_shape {wanted} larger than the full output")
    small = [t // 2 for t in total]
    if auto == "SAME_UPPER":
        return small, [t - h for t, h in zip(total, small)]
    return [t - h for t, h in zip(total, small)], small


def _flipped_weight(ctx, g: int) -> np.ndarray:
    """The ConvTranspose weight (C, M/g, k..) as a Conv weight (M, C/g, k..): per group,
    input and output channels swapped, the kernel reversed along every spatial axis."""
    w = ctx.const(1)
    if w is None:
        raise Unlowerable("ConvTranspose with a non-constant weight (it is flipped and "
                          "transposed at import)")
    c, mg, *kernel = w.shape
    w = w.reshape(g, c // g, mg, *kernel).swapaxes(1, 2).reshape(g * mg, c // g, *kernel)
    return np.ascontiguousarray(w[(slice(None), slice(None)) + (slice(None, None, -1),) * len(kernel)],
                                dtype=np.float32)


def _spread(b, x, axis: int, stride: int, before: int, after: int):
    """x with stride-1 zeros after every element along `axis` (a size-1 axis after it,
    zero-padded to the stride, reshaped into it), `before` zeros ahead of the first
    element and `after` behind the last (negative: that many cut off). Edge zeros are
    padded as whole elements before spreading and the excess sliced off after, so every
    pad sits under the reshape: kernels then index a reshape with offsets that are never
    negative where an element is read."""
    d = b.dims(x)[axis]
    lead, tail = -(-max(before, 0) // stride), -(-max(after - stride + 1, 0) // stride)
    x = b.pad(x, "zero-padding", axis, lead, tail)
    if stride > 1:
        dims = b.dims(x)
        x = b.pad(b.insert_axis(x, axis + 1), "zero-padding", axis + 1, 0, stride - 1)
        x = b.reshape(x, dims[:axis] + (dims[axis] * stride,) + dims[axis + 1:])
    return b.slice(x, axis, lead * stride - before, (lead + d - 1) * stride + 1 + after)


def lower_convtranspose(ctx):
    """ConvTranspose (any group, strides, pads, output_padding, dilations, auto_pad,
    output_shape) as the convolution the module docstring describes, plus the bias."""
    b = ctx.b
    xd, wd = ctx.dims(0), ctx.dims(1)
    if len(xd) < 3 or len(wd) != len(xd):
        ctx.fail(f"input dims {xd} and weight dims {wd} are not N,C,spatial.. and C,M/group,kernel..")
    g = ctx.attr("group", 1)
    (_, c, *spatial), (cw, _, *kernel) = xd, wd
    if g < 1 or c % g or cw != c:
        ctx.fail(f"input has {c} channels, weight {wd}, group {g}: they do not fit")
    if ctx.ints("kernel_shape", kernel) != kernel:
        ctx.bad_attr("kernel_shape", f"{ctx.ints('kernel_shape')} differs from the weight's {kernel}")
    n = len(spatial)
    strides, dil = _per_axis(ctx, "strides", n, 1), _per_axis(ctx, "dilations", n, 1)
    out_pad = _per_axis(ctx, "output_padding", n, 0)
    spans = [(k - 1) * d + 1 for k, d in zip(kernel, dil)]
    begin, end = transposed_pads(ctx, spatial, spans, strides, out_pad)
    x = ctx.term(0)
    for i in range(n):
        before, after = spans[i] - 1 - begin[i], spans[i] - 1 - end[i] + out_pad[i]
        if (spatial[i] - 1) * strides[i] + 1 + before + after < spans[i]:
            ctx.fail(f"pads {begin[i]}+{end[i]} leave no output along spatial axis {i}")
        x = _spread(b, x, 2 + i, strides[i], before, after)
    y = conv(b, x, ctx.add_weight("flipped", _flipped_weight(ctx, g)), g, [1] * n, dil)
    if ctx.has(2):
        y = b.elementwise("elementwise-add", [y, b.channel(ctx.term(2), len(xd))])
    return [y]
