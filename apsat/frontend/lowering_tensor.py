"""The lowerings of ONNX's layout ops; terms are made by `Builder` (builder.py).

Conventions every lowering follows: an ONNX value is any term whose dims (iterated ++ item)
are the ONNX tensor's shape; its split is free. Elementwise results are split with every
dim iterated and an empty item, `((dims), ())`. A lowering takes a `NodeCtx` (lowering.py)
and returns one term per ONNX output (None for outputs it does not produce); it raises
`Unlowerable` when this node or attribute combination has no lowering (the importer then
emits an opaque call, or folds the node when its inputs are constants).
"""
from __future__ import annotations

import math

import numpy as np



class Unlowerable(Exception):
    """This node (or this attribute combination) has no lowering into the language."""


def normalize_axis(ctx, axis: int, rank: int, attr: str = "axis") -> int:
    """ONNX axis (negative counts from the end) -> 0..rank-1; a bad one is an error."""
    if not -rank <= axis < rank:
        ctx.bad_attr(attr, f"{axis} is outside [-{rank}, {rank - 1}]")
    return axis % rank


def axis_last(rank: int, axis: int) -> tuple[tuple, tuple]:
    """(the permutation moving `axis` last, the one moving it back); Builder.transpose skips
    an identity, so an axis already last costs nothing."""
    perm = tuple(a for a in range(rank) if a != axis) + (axis,)
    return perm, tuple(int(a) for a in np.argsort(perm))


def axes_from(ctx, attr: str, input_index: int, since: int):
    """Axes from an attribute (opset < since) or a constant input (opset >= since);
    None when absent. A non-constant axes input is Unlowerable."""
    if ctx.opset < since:
        return ctx.ints(attr, None)
    if not ctx.has(input_index):
        return None
    return [int(a) for a in ctx.static(input_index).reshape(-1)]


# ---- lowerings ------------------------------------------------------------------------------

def lower_identity(ctx):
    """Identity, and Dropout in inference (ratio ignored; the mask output is not
    produced, so a model that reads it gets an opaque call)."""
    if ctx.op == "Dropout" and ctx.has(2):
        training = ctx.const(2)
        if training is None or bool(np.asarray(training).reshape(-1)[0]):
            raise Unlowerable("Dropout in training mode")
    return [ctx.term(0)]


def lower_cast(ctx):
    """The language carries every value as float32 (integers exactly below 2**24, booleans
    as 0/1) with an element type per float value (apsat/lang/dtypes.py). A Cast to a float
    type is `(cast T)` where it changes the type (to f16 or bf16, or from one to f32), and
    passes through otherwise; from an integer or boolean to an integer type it passes
    through. A Cast to bool is `nonzero`; float to integer truncates toward zero (floor above
    0, ceil below), from a half type after widening to f32 (its integers exact there)."""
    from onnx import TensorProto

    floats = (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16)
    half = (TensorProto.FLOAT16, TensorProto.BFLOAT16)     # the cast's parameter is the ONNX code
    to, source = ctx.attr("to", None), ctx.elem_type(0)
    if to in floats:
        if to in half and source != to:
            return [ctx.b.compute("cast", ctx.term(0), to)]
        return [ctx.b.compute("cast", ctx.term(0), TensorProto.FLOAT) if source in half and to not in half
                else ctx.term(0)]
    integral = source not in floats and source != 0
    if to == TensorProto.BOOL and source == TensorProto.BOOL:
        return [ctx.term(0)]
    if to not in (TensorProto.BOOL, TensorProto.STRING) and integral and source != TensorProto.STRING:
        return [ctx.term(0)]
    if to == TensorProto.BOOL and source not in (0, TensorProto.STRING):
        return [ctx.b.compute("nonzero", ctx.term(0))]          # nonzero is true
    if to not in (TensorProto.BOOL, TensorProto.STRING, 0) and source in floats:
        # float to integer truncates toward zero (out-of-range values are undefined in ONNX)
        x, b = ctx.term(0), ctx.b
        x = b.compute("cast", x, 1) if source in half else x
        return [b.select(b.elementwise("greater-equal", [x, b.literal(0.0)]), b.compute("floor", x),
                         b.compute("ceil", x))]
    raise Unlowerable(f"Cast from element type {source} to {to} changes the value")


def lower_transpose(ctx):
    x = ctx.term(0)
    rank = len(ctx.dims(0))
    perm = ctx.ints("perm", list(reversed(range(rank))))
    if sorted(perm) != list(range(rank)):
        ctx.bad_attr("perm", f"{perm} is not a permutation of {rank} axes")
    return [ctx.b.transpose(x, perm)]


def reshape_target(ctx, dims, shape, allowzero: bool) -> tuple[int, ...]:
    """ONNX Reshape's target dims: 0 copies the input dim (unless allowzero), one -1 is
    inferred."""
    out = [dims[i] if (s == 0 and not allowzero and i < len(dims)) else int(s)
           for i, s in enumerate(shape)]
    total = math.prod(dims)
    if out.count(-1) > 1 or any(d < -1 for d in out):
        ctx.fail(f"shape {list(shape)} has more than one -1 or a negative dim")
    if -1 in out:
        known = math.prod(d for d in out if d != -1)
        if known == 0 or total % known:
            ctx.fail(f"shape {list(shape)} does not fit {total} elements")
        out[out.index(-1)] = total // known
    if math.prod(out) != total:
        ctx.fail(f"shape {list(shape)} does not fit input dims {dims}")
    return tuple(out)


def lower_reshape(ctx):
    shape = ctx.ints("shape", None) if ctx.opset < 5 else [int(s) for s in ctx.static(1).reshape(-1)]
    if shape is None:
        ctx.bad_attr("shape", "missing")
    target = reshape_target(ctx, ctx.dims(0), shape, bool(ctx.attr("allowzero", 0)))
    return [ctx.b.reshape(ctx.term(0), target)]


def lower_flatten(ctx):
    dims = ctx.dims(0)
    axis = ctx.attr("axis", 1)
    if not -len(dims) <= axis <= len(dims):
        ctx.bad_attr("axis", f"{axis} is outside [-{len(dims)}, {len(dims)}]")
    axis = axis + len(dims) if axis < 0 else axis
    return [ctx.b.reshape(ctx.term(0), (math.prod(dims[:axis]), math.prod(dims[axis:])))]


def lower_squeeze(ctx):
    dims = ctx.dims(0)
    axes = axes_from(ctx, "axes", 1, since=13)
    if axes is None:
        axes = [i for i, d in enumerate(dims) if d == 1]
    axes = sorted({normalize_axis(ctx, a, len(dims), "axes") for a in axes}, reverse=True)
    t = ctx.term(0)
    for a in axes:                      # highest first, so lower axis numbers stay valid
        if dims[a] != 1:
            ctx.bad_attr("axes", f"axis {a} has size {dims[a]}, not 1")
        t = ctx.b.squeeze(t, a)
    return [t]


def lower_unsqueeze(ctx):
    rank = len(ctx.dims(0))
    axes = axes_from(ctx, "axes", 1, since=13)
    if not axes:
        ctx.bad_attr("axes", "missing or empty")
    out_rank = rank + len(axes)
    norm = sorted(normalize_axis(ctx, a, out_rank, "axes") for a in axes)
    if len(set(norm)) != len(norm):
        ctx.bad_attr("axes", f"{axes} repeats an axis")
    t = ctx.term(0)
    for a in norm:                      # ascending: each index is final in the output
        t = ctx.b.insert_axis(t, a)
    return [t]


def lower_concat(ctx):
    parts = [i for i in range(ctx.n_inputs) if ctx.has(i)]
    axis = ctx.attr("axis", None)
    if axis is None:
        ctx.bad_attr("axis", "missing")
    axis = normalize_axis(ctx, axis, len(ctx.dims(parts[0])))
    # empty parts add nothing (and are never made terms: the language has no empty tensor)
    terms = [ctx.term(i) for i in parts if ctx.dims(i)[axis] > 0]
    if not terms:
        raise Unlowerable("Concat of empty tensors")
    return [ctx.b.concat(terms, axis)]


def _slice_bounds(start: int, end: int, d: int) -> tuple[int, int]:
    """ONNX Slice clamping for step 1: negative indices count from the end."""
    start = start + d if start < 0 else start
    end = end + d if end < 0 else end
    return max(0, min(start, d)), max(0, min(end, d))


def lower_slice(ctx):
    dims = ctx.dims(0)
    if ctx.opset < 10:
        starts, ends = ctx.ints("starts", None), ctx.ints("ends", None)
        axes, steps = ctx.ints("axes", None), None
    else:
        starts, ends = list(ctx.static(1).reshape(-1)), list(ctx.static(2).reshape(-1))
        axes = list(ctx.static(3).reshape(-1)) if ctx.has(3) else None
        steps = list(ctx.static(4).reshape(-1)) if ctx.has(4) else None
    if starts is None or ends is None or len(starts) != len(ends):
        ctx.bad_attr("starts", "starts and ends are missing or differ in length")
    axes = list(range(len(starts))) if axes is None else axes
    steps = [1] * len(starts) if steps is None else [int(s) for s in steps]
    if any(s < 1 for s in steps):
        raise Unlowerable("Slice with a negative step (a reversal) has no access-pattern form")
    t = ctx.term(0)
    for a, s, e, step in zip(axes, starts, ends, steps):
        a = normalize_axis(ctx, int(a), len(dims), "axes")
        lo, hi = _slice_bounds(int(s), int(e), dims[a])
        if lo >= hi:
            raise Unlowerable("empty Slice")
        t = ctx.b.slice(t, a, lo, hi) if step == 1 else _strided(ctx.b, t, a, lo, hi, step)
    return [t]


def _strided(b, t, axis: int, lo: int, hi: int, step: int):
    """Every step-th element of [lo, hi) on `axis` (Swin's x[:, 0::2, 1::2]): the range
    zero-padded to a whole number of steps, split into (count, step), position 0 kept."""
    count = -(-(hi - lo) // step)
    n = b.dims(t)[axis]
    t = b.slice(t, axis, lo, min(n, lo + count * step))
    t = b.pad(t, "zero-padding", axis, 0, max(0, lo + count * step - n))
    dims = b.dims(t)
    t = b.reshape(t, dims[:axis] + (count, step) + dims[axis + 1:])
    t = b.slice(t, axis + 1, 0, 1)
    return b.reshape(t, dims[:axis] + (count,) + dims[axis + 1:])


def lower_split(ctx):
    dims = ctx.dims(0)
    axis = normalize_axis(ctx, ctx.attr("axis", 0), len(dims))
    n = len(ctx.node.output)
    sizes = ctx.ints("split", None) if ctx.opset < 13 else (
        [int(s) for s in ctx.static(1).reshape(-1)] if ctx.has(1) else None)
    if sizes is None:                  # equal parts; opset 18 may leave the last one short
        part = -(-dims[axis] // n)
        sizes = [min(part, dims[axis] - i * part) for i in range(n)]
    if len(sizes) != n or sum(sizes) != dims[axis] or min(sizes) <= 0:
        ctx.bad_attr("split", f"{sizes} does not split axis {axis} of size {dims[axis]} "
                              f"into {n} non-empty parts")
    t, lo, outs = ctx.term(0), 0, []
    for s in sizes:
        outs.append(ctx.b.slice(t, axis, lo, lo + s))
        lo += s
    return outs


def lower_expand(ctx):
    shape = tuple(int(s) for s in ctx.static(1).reshape(-1))
    try:
        out = tuple(np.broadcast_shapes(ctx.dims(0), shape))
    except ValueError:
        ctx.fail(f"input dims {ctx.dims(0)} do not broadcast with shape {list(shape)}")
    return [ctx.b.expand(ctx.term(0), out)]


def lower_pad(ctx):
    """Negative pads become slices; then `constant` mode pads with zeros and selects the
    border to a non-zero value, `reflect`, `edge` and `wrap` gather (lowering_gather)."""
    from apsat.frontend.lowering_gather import pad_by_gather, pad_by_value

    dims = ctx.dims(0)
    mode = ctx.attr("mode", "constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if ctx.opset < 11:
        pads, axes = ctx.ints("pads", None), None
    else:
        pads = [int(p) for p in ctx.static(1).reshape(-1)]
        axes = [int(a) for a in ctx.static(3).reshape(-1)] if ctx.has(3) else None
    if mode not in ("constant", "reflect", "edge", "wrap"):
        ctx.bad_attr("mode", f"{mode!r} is not constant, reflect, edge or wrap")
    axes = list(range(len(dims))) if axes is None else \
        [normalize_axis(ctx, a, len(dims), "axes") for a in axes]
    if pads is None or len(pads) != 2 * len(axes):
        ctx.bad_attr("pads", f"needs {2 * len(axes)} values, got {pads}")
    t, padded = ctx.term(0), []
    for i, a in enumerate(axes):
        before, after = pads[i], pads[i + len(axes)]
        d = ctx.b.dims(t)[a]
        if max(0, -before) >= d - max(0, -after):
            raise Unlowerable("Pad that slices an axis away")
        t = ctx.b.slice(t, a, max(0, -before), d - max(0, -after))
        if before > 0 or after > 0:
            padded.append((a, max(0, before), max(0, after)))
    if not padded:
        return [t]
    return [pad_by_value(ctx, t, padded) if mode == "constant" else pad_by_gather(ctx, t, mode, padded)]


def lower_tile(ctx):
    """Tile by constant repeats: each dim d repeated r times is a size-1 axis broadcast to r
    before it, (r, d) merged into r * d (row-major, so copies follow each other)."""
    b, dims = ctx.b, ctx.dims(0)
    repeats = [int(r) for r in ctx.static(1).reshape(-1)]
    if len(repeats) != len(dims) or min(repeats, default=1) < 1:
        ctx.fail(f"repeats {repeats} do not fit dims {dims}")
    if all(r == 1 for r in repeats):
        return [ctx.term(0)]
    spread = tuple(x for d in dims for x in (1, d))
    t = b.reshape(ctx.term(0), spread)
    t = b.broadcast(t, tuple(x for d, r in zip(dims, repeats) for x in (r, d)))
    return [b.reshape(t, tuple(d * r for d, r in zip(dims, repeats)))]
