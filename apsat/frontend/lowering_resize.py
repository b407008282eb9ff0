"""Resize (opsets 10-19) and Upsample as the language's own constructs, following
onnxruntime's CPU kernel (coordinates in float32, as it computes them).

Resizing is separable: along each resized axis the output is A · x for a constant matrix
A (out, in) computed here at import from the mode, the coordinate transformation and the
nearest rounding: nearest has one 1 per row, linear the two weights of the neighbours,
cubic four. Each such axis is moved last, contracted with A (`compute dot-product` over a
cartesian product with A's rows, an ordinary matmul that the systolic and GPU backends
map like any other), and moved back; for an NCHW image scaled along H and W that is
A_h · X · A_wᵀ. Nearest upsampling by an integer factor f whose index map is o // f (the
usual case) is instead a broadcast: a size-1 axis after the resized one, broadcast to f,
reshaped into it. Scales and sizes must be constants. Unlowerable: tf_crop_and_resize
(a region of interest plus extrapolation), antialias when downscaling with linear or
cubic, a mode or attribute this module does not know. Conventions (ctx, returned terms,
Unlowerable): lowering_tensor.py.
"""
from __future__ import annotations

import numpy as np

from apsat.frontend.lowering_tensor import Unlowerable, normalize_axis

F32 = np.float32


def _scales_and_sizes(ctx, dims) -> tuple[list, list]:
    """Per-axis float32 scales and output dims from the constant scales or sizes input (or
    Upsample-7's attribute), over `axes` (opset 18) or every axis. Given sizes, the scale
    is size / input (after keep_aspect_ratio_policy); given scales, size = floor(scale * in)."""
    rank = len(dims)
    if ctx.op == "Upsample" and ctx.opset < 9:
        scales, sizes = ctx.attr("scales", None), None
    elif ctx.op == "Upsample" or ctx.opset < 11:
        scales, sizes = ctx.static(1).reshape(-1), None
    else:
        scales = ctx.static(2).reshape(-1) if ctx.has(2) else None
        sizes = ctx.static(3).reshape(-1) if ctx.has(3) else None
        scales = None if scales is not None and scales.size == 0 else scales
    axes = [normalize_axis(ctx, a, rank, "axes") for a in ctx.ints("axes", list(range(rank)))]
    given = sizes if scales is None else scales
    if given is None or len(given) != len(axes):
        ctx.fail(f"needs {len(axes)} scales or sizes, got {None if given is None else list(given)}")
    out_scales, out_dims = [F32(1.0)] * rank, list(dims)
    if scales is not None:
        for a, s in zip(axes, scales):
            out_scales[a] = F32(s)
            out_dims[a] = int(np.floor(F32(s) * F32(dims[a])))
        return out_scales, out_dims
    ratios = [F32(int(s)) / F32(dims[a]) for a, s in zip(axes, sizes)]
    policy = ctx.attr("keep_aspect_ratio_policy", "stretch")
    if policy in ("not_larger", "not_smaller"):
        ratio = min(ratios) if policy == "not_larger" else max(ratios)
        ratios = [ratio] * len(axes)
        sizes = [np.floor(np.float64(F32(ratio * F32(dims[a]))) + 0.5) for a in axes]
    elif policy != "stretch":
        ctx.bad_attr("keep_aspect_ratio_policy", f"unknown value {policy!r}")
    for a, s, r in zip(axes, sizes, ratios):
        out_scales[a], out_dims[a] = r, int(s)
    return out_scales, out_dims


def _coordinates(mode: str, out_len: int, in_len: int, scale) -> np.ndarray:
    """The input coordinate (float32) of every output index along one axis."""
    x, s, half = np.arange(out_len, dtype=F32), F32(scale), F32(0.5)
    if mode in ("half_pixel", "pytorch_half_pixel"):
        if mode == "pytorch_half_pixel" and out_len == 1:
            return np.zeros(1, F32)
        return (x + half) / s - half
    if mode == "align_corners":
        return np.zeros(out_len, F32) if out_len == 1 else x * F32(in_len - 1) / F32(out_len - 1)
    if mode == "asymmetric":
        return x / s
    if mode == "tf_half_pixel_for_nn":
        return (x + half) / s
    if mode == "half_pixel_symmetric":
        adjustment = F32(out_len) / (s * F32(in_len))
        offset = F32(in_len) / F32(2) * (F32(1) - adjustment)
        return offset + (x + half) / s - half
    raise Unlowerable(f"Resize coordinate_transformation_mode {mode!r}")


def _nearest(coords: np.ndarray, rounding: str, downscale: bool) -> np.ndarray:
    """Nearest input index of each coordinate (not yet clamped), onnxruntime's rounding;
    `simple` is Upsample's and opset-10 Resize's: ceil when downscaling, else truncate."""
    c = coords.astype(np.float64)          # exact: no float32 rounding in c + 0.5
    away = np.sign(c) * np.floor(np.abs(c) + 0.5)           # std::round
    table = {"round_prefer_floor": lambda: np.where(c == np.floor(c) + 0.5, np.floor(c), away),
             "round_prefer_ceil": lambda: away, "floor": lambda: np.floor(c),
             "ceil": lambda: np.ceil(c), "simple": lambda: np.ceil(c) if downscale else np.trunc(c)}
    if rounding not in table:
        raise Unlowerable(f"Resize nearest_mode {rounding!r}")
    return table[rounding]().astype(np.int64)


def _cubic_weights(t: np.ndarray, a: float) -> np.ndarray:
    """Keys' cubic convolution weights (rows: 4 per coordinate, for floor(x)-1 .. +2) at
    fractional offsets t, coefficient a."""
    a, one = F32(a), F32(1)
    d = [t + one, t, one - t, F32(2) - t]
    near = [((a + 2) * u - (a + 3)) * u * u + one for u in d[1:3]]
    far = [((a * u - 5 * a) * u + 8 * a) * u - 4 * a for u in (d[0], d[3])]
    return np.stack([far[0], near[0], near[1], far[1]], axis=1).astype(F32)


def axis_matrix(ctx, mode: str, out_len: int, in_len: int, scale) -> np.ndarray | None:
    """The (out_len, in_len) float32 matrix A with output = A · input along one axis, or
    None when the axis is unchanged (scale 1, as onnxruntime then copies)."""
    if scale == 1 and out_len == in_len:
        return None
    legacy = ctx.op == "Upsample" or ctx.opset < 11
    coord_mode = "asymmetric" if legacy else ctx.attr("coordinate_transformation_mode", "half_pixel")
    if coord_mode == "tf_crop_and_resize":
        raise Unlowerable("Resize tf_crop_and_resize (a region of interest and extrapolation)")
    coords = _coordinates(coord_mode, out_len, in_len, scale)
    rows, A = np.arange(out_len), np.zeros((out_len, in_len), F32)
    if mode == "nearest":
        rounding = "simple" if legacy else ctx.attr("nearest_mode", "round_prefer_floor")
        A[rows, np.clip(_nearest(coords, rounding, scale < 1), 0, in_len - 1)] = 1
    elif mode in ("linear", "bilinear"):
        c = np.clip(coords, F32(0), F32(in_len - 1))
        i1 = np.minimum(c.astype(np.int64), in_len - 1)
        i2 = np.minimum(i1 + 1, in_len - 1)
        same = i1 == i2                     # at the last index both weights are 1/2
        np.add.at(A, (rows, i1), np.where(same, F32(0.5), np.abs(c - i2.astype(F32))))
        np.add.at(A, (rows, i2), np.where(same, F32(0.5), np.abs(c - i1.astype(F32))))
    elif mode == "cubic" and not legacy:
        base = np.floor(coords).astype(np.int64)
        w = _cubic_weights((coords - base.astype(F32)).astype(F32), ctx.attr("cubic_coeff_a", -0.75))
        idx = base[:, None] + np.arange(-1, 3)[None, :]
        if ctx.attr("exclude_outside", 0):
            w = np.where((idx < 0) | (idx >= in_len), F32(0), w)
            w = w / w.sum(axis=1, keepdims=True)
        np.add.at(A, (np.repeat(rows, 4), np.clip(idx, 0, in_len - 1).reshape(-1)), w.reshape(-1))
    else:
        raise Unlowerable(f"{ctx.op} mode {mode!r}")
    return A


def _repeat_factor(A: np.ndarray) -> int | None:
    """f when A repeats each input f times in order (row o picks o // f), else None."""
    out_len, in_len = A.shape
    f = out_len // in_len
    if f < 2 or out_len != f * in_len:
        return None
    return f if np.array_equal(A, np.repeat(np.eye(in_len, dtype=F32), f, axis=0)) else None


def _along(b, x, axis: int, matrix):
    """A · x along `axis`: the axis moved last and made the item, `compute dot-product`
    over its cartesian product with the matrix's rows, moved back."""
    rank = len(b.dims(x))
    perm = [i for i in range(rank) if i != axis] + [axis]
    t = b.at(b.transpose(x, perm), rank - 1)
    y = b.compute("dot-product", b.make("access-cartesian-product", t, b.at(matrix, 1)))
    return b.transpose(y, list(np.argsort(perm)))


def _repeat(b, x, factors: dict):
    """Each axis a in `factors` repeated element by element factors[a] times: a size-1
    axis after it, broadcast to the factor, reshaped into it."""
    dims = b.dims(x)
    spread, widened, out = [], [], []
    for a, d in enumerate(dims):
        f = factors.get(a)
        spread += [d] if f is None else [d, 1]
        widened += [d] if f is None else [d, f]
        out.append(d if f is None else d * f)
    return b.reshape(b.broadcast(b.reshape(x, spread), widened), out)


def lower_resize(ctx):
    """Resize and Upsample: per resized axis a broadcast (nearest, integer factor) or a
    matmul with the axis's constant interpolation matrix (module docstring)."""
    b, dims = ctx.b, ctx.dims(0)
    mode = ctx.attr("mode", "nearest")
    scales, out_dims = _scales_and_sizes(ctx, dims)
    if ctx.attr("antialias", 0) and mode != "nearest" and any(s < 1 for s in scales):
        raise Unlowerable(f"Resize {mode} with antialias when downscaling")
    x, repeats = ctx.term(0), {}
    for a, (d, o, s) in enumerate(zip(dims, out_dims, scales)):
        A = axis_matrix(ctx, mode, o, d, s)
        if A is None:
            continue
        f = _repeat_factor(A)
        if f is not None:
            repeats[a] = f
        else:
            x = _along(b, x, a, ctx.add_weight(f"axis{a}", A))
    return [_repeat(b, x, repeats) if repeats else x]
