"""The lowerings that read data at computed positions: Gather, GatherElements, GatherND,
Pad in its non-zero and reflecting modes, and CumSum.

All of them become `access-gather` (one data-dependent gather along one axis) or the
language's views and products, never one slice per run of indices joined by nested
concatenations (that chain grew with the index map: a 12x12 window's relative-position
bias was hundreds of levels deep). A Gather whose data and indices are both constants is
folded at import (importer.Importer._should_fold), so what reaches these lowerings reads
data or indices that the program computes:

* Gather: a scalar index or one contiguous run is a slice (the rules see slices); other
  constant indices become an index weight; run-time indices (token ids) are read as given.
* GatherElements and GatherND: the data flattened to the gathered axes, a linear index
  (computed at import when the indices are constants, in the language otherwise: exact
  while the flattened size stays below 2**24, float32's integer range), one access-gather.
* Pad: `constant` with a value other than 0 is the zero pad with the border selected to
  the value; `reflect`, `edge` and `wrap` are gathers of the padded axes by constant index
  maps (np.pad of an arange).
* CumSum: a product with a constant triangular 0/1 matrix (at most CUMSUM_LIMIT along the
  axis). Its sums equal a scan's for finite values; an infinity in the input makes the
  positions before it NaN (inf * 0), where a scan keeps them finite.
"""
from __future__ import annotations

import math

import numpy as np

from apsat.frontend.lowering_tensor import Unlowerable, axis_last, normalize_axis

CUMSUM_LIMIT = 1024        # the triangular matrix is n x n floats: 4 MiB at the limit
EXACT_INDEX = 2 ** 24      # float32 carries every integer below it exactly


def _runs(flat: list[int]) -> list[tuple[int, int]]:
    """Contiguous ascending runs of `flat` as [lo, hi) pairs."""
    runs, start = [], 0
    for j in range(1, len(flat) + 1):
        if j == len(flat) or flat[j] != flat[j - 1] + 1:
            runs.append((flat[start], flat[j - 1] + 1))
            start = j
    return runs


def lower_gather(ctx):
    """ONNX Gather along `axis`: a slice where the indices are one constant run, else
    `access-gather` by the indices (a weight when constant, the program's value when not)."""
    dims = ctx.dims(0)
    axis = normalize_axis(ctx, ctx.attr("axis", 0), len(dims))
    x, b = ctx.term(0), ctx.b
    indices = ctx.const(1)
    if indices is None:
        return [b.gather(x, ctx.term(1), axis)]
    idx = np.asarray(indices).astype(np.int64)
    if np.any(idx < -dims[axis]) or np.any(idx >= dims[axis]):
        ctx.fail(f"indices {idx.reshape(-1).tolist()[:16]} out of range for axis {axis} of size {dims[axis]}")
    idx = np.where(idx < 0, idx + dims[axis], idx)
    if idx.size == 0:
        raise Unlowerable("Gather with no indices")
    if idx.ndim == 0:
        return [b.squeeze(b.slice(x, axis, int(idx), int(idx) + 1), axis)]
    runs = _runs([int(i) for i in idx.reshape(-1)])
    if len(runs) == 1:
        t = b.slice(x, axis, *runs[0])
        return [b.reshape(t, dims[:axis] + idx.shape + dims[axis + 1:])]
    return [b.gather(x, ctx.add_weight("indices", idx.astype(np.float32)), axis)]


def _flat_gather(ctx, data, lead: tuple, linear):
    """`data` reshaped to (prod(lead), rest...) and gathered along axis 0 by `linear` (a
    term or a constant array of linear positions into the leading dims)."""
    b = ctx.b
    dims = b.dims(data)
    if math.prod(lead) >= EXACT_INDEX:
        raise Unlowerable(f"a linear index into {math.prod(lead)} elements is not exact in float32")
    flat = b.reshape(data, (math.prod(lead),) + dims[len(lead):])
    if isinstance(linear, np.ndarray):
        linear = ctx.add_weight("linear_index", linear.astype(np.float32))
    return b.gather(flat, linear, 0)


def _wrapped(ctx, t, n: int):
    """A run-time index term with negative values counted from the end: idx mod n (floor
    mod, so -1 is n - 1)."""
    return ctx.b.elementwise("elementwise-mod", [t, ctx.b.literal(float(n))])


def _linear(ctx, parts: list, strides: list[int]):
    """sum(parts[k] * strides[k]) where parts are terms or constant arrays; a constant array
    when every part is one."""
    if all(isinstance(p, np.ndarray) for p in parts):
        return sum(p.astype(np.int64) * s for p, s in zip(parts, strides))
    b, total = ctx.b, None
    for p, s in zip(parts, strides):
        t = ctx.add_weight("part", p.astype(np.float32)) if isinstance(p, np.ndarray) else p
        t = b.elementwise("elementwise-mul", [t, b.literal(float(s))]) if s != 1 else t
        total = t if total is None else b.elementwise("elementwise-add", [total, t])
    return total


def lower_gather_elements(ctx):
    """out[i] = data[i with axis k replaced by indices[i]]: the data flattened, a linear
    index of the indices' shape, one gather."""
    dims, idims = ctx.dims(0), ctx.dims(1)
    axis = normalize_axis(ctx, ctx.attr("axis", 0), len(dims))
    if len(idims) != len(dims) or any(i > d for k, (i, d) in enumerate(zip(idims, dims)) if k != axis):
        ctx.fail(f"indices dims {idims} do not fit data dims {dims} off axis {axis}")
    strides = [math.prod(dims[k + 1:]) for k in range(len(dims))]
    grid = np.indices(idims, sparse=True)
    fixed = sum(g * s for k, (g, s) in enumerate(zip(grid, strides)) if k != axis)
    fixed = np.broadcast_to(np.asarray(fixed, np.int64), idims) if len(dims) > 1 else np.zeros(idims, np.int64)
    indices = ctx.const(1)
    if indices is not None:
        along = np.asarray(indices, np.int64) % dims[axis]
        return [_flat_gather(ctx, ctx.term(0), dims, fixed + along * strides[axis])]
    along = _wrapped(ctx, ctx.term(1), dims[axis])
    if any(ctx.follows_symbol(d) for d in idims):      # positions computed, sized by the symbol
        fixed = _positions(ctx, idims, strides, axis)
    return [_flat_gather(ctx, ctx.term(0), dims, _linear(ctx, [along, fixed], [strides[axis], 1]))]


def _positions(ctx, dims: tuple, strides: list, skip: int):
    """sum over axes k != skip of (index along k) * strides[k], broadcast to `dims`, as a
    term built on generated Ranges (its size follows a symbolic dim)."""
    b, total = ctx.b, None
    for k, (n, s) in enumerate(zip(dims, strides)):
        if k == skip or n == 1:
            continue
        shape = tuple(n if j == k else 1 for j in range(len(dims)))
        t = b.broadcast(b.reshape(ctx.add_range(f"positions{k}", n), shape), dims)
        t = b.elementwise("elementwise-mul", [t, b.literal(float(s))]) if s != 1 else t
        total = t if total is None else b.elementwise("elementwise-add", [total, t])
    return total if total is not None else b.broadcast(b.reshape(b.literal(0.0), (1,) * len(dims)), dims)


def lower_gather_nd(ctx):
    """GatherND with batch_dims 0: indices (..., k) pick data[idx] over the first k dims;
    the data flattened over those k, a linear index, one gather."""
    if ctx.attr("batch_dims", 0) != 0:
        raise Unlowerable("GatherND with batch_dims")
    dims, idims = ctx.dims(0), ctx.dims(1)
    if not idims or not 1 <= idims[-1] <= len(dims):
        ctx.fail(f"indices dims {idims} do not index data dims {dims}")
    k = idims[-1]
    strides = [math.prod(dims[j + 1:k]) for j in range(k)]
    indices = ctx.const(1)
    if indices is not None:
        idx = np.asarray(indices, np.int64) % np.asarray(dims[:k])
        return [_flat_gather(ctx, ctx.term(0), dims[:k], (idx * strides).sum(-1))]
    b, t = ctx.b, ctx.term(1)
    parts = [_wrapped(ctx, b.squeeze(b.slice(t, len(idims) - 1, j, j + 1), len(idims) - 1), dims[j])
             for j in range(k)]
    return [_flat_gather(ctx, ctx.term(0), dims[:k], _linear(ctx, parts, strides))]


def _pad_value(ctx):
    """The constant-mode fill as a term: a literal, or a one-element weight for +-inf
    (literals are finite)."""
    value = float(ctx.static(2).reshape(-1)[0]) if ctx.opset >= 11 and ctx.has(2) else float(ctx.attr("value", 0.0))
    if math.isfinite(value):
        return value, ctx.b.literal(value)
    return value, ctx.add_weight("pad_value", np.float32(value))


def pad_by_value(ctx, t, padded: list[tuple[int, int, int]]):
    """The zero pad of `t` (axis, before, after >= 0) with the border selected to the fill:
    a constant 0/1 mask over the padded axes says which elements are the input's (so -0
    and NaN inside keep their value, which adding a border would not)."""
    b = ctx.b
    value, fill = _pad_value(ctx)
    zero = t
    for a, before, after in padded:
        zero = b.pad(zero, "zero-padding", a, before, after)
    if value == 0.0 and not math.copysign(1.0, value) < 0:
        return zero
    out = b.dims(zero)
    mask = np.zeros([d if any(a == k for a, _, _ in padded) else 1 for k, d in enumerate(out)], np.float32)
    inside = [slice(None)] * len(out)
    for a, before, after in padded:
        inside[a] = slice(before, out[a] - after)
    mask[tuple(inside)] = 1.0
    return b.select(ctx.add_weight("pad_mask", mask), zero, fill)


def pad_by_gather(ctx, t, mode: str, padded: list[tuple[int, int, int]]):
    """`reflect`, `edge` or `wrap` padding: each padded axis gathered by np.pad's index
    map of an arange."""
    b = ctx.b
    for a, before, after in padded:
        n = b.dims(t)[a]
        if mode == "reflect" and n < 2 and (before or after):
            raise Unlowerable("reflect padding of an axis of size 1")
        index = np.pad(np.arange(n), (before, after), mode={"edge": "edge", "reflect": "reflect",
                                                            "wrap": "wrap"}[mode])
        t = b.gather(t, ctx.add_weight("pad_index", index.astype(np.float32)), a)
    return t


def lower_cumsum(ctx):
    """CumSum along a constant axis as a product with a triangular 0/1 matrix: entry
    (j, i) is 1 where position i counts towards output j (exclusive and reverse as ONNX
    defines them)."""
    b, dims = ctx.b, ctx.dims(0)
    if not dims:
        ctx.fail("CumSum of a scalar")
    axis = normalize_axis(ctx, int(ctx.static(1).reshape(-1)[0]), len(dims))
    n = dims[axis]
    if n > CUMSUM_LIMIT:
        raise Unlowerable(f"CumSum over {n} > {CUMSUM_LIMIT} positions")
    j, i = np.indices((n, n))
    exclusive, reverse = bool(ctx.attr("exclusive", 0)), bool(ctx.attr("reverse", 0))
    counts = (i >= j) if reverse else (i <= j)
    if exclusive:
        counts &= i != j
    r = len(dims)
    perm, back = axis_last(r, axis)
    x = b.transpose(ctx.term(0), perm)
    if ctx.follows_symbol(n):          # the triangle's size follows a symbol: computed
        iota = ctx.add_range("positions", n)
        i_, j_ = b.broadcast(b.reshape(iota, (1, n)), (n, n)), b.broadcast(b.reshape(iota, (n, 1)), (n, n))
        op = {(True, False): "greater-equal", (False, False): "less-equal",
              (True, True): "greater", (False, True): "less"}[(reverse, exclusive)]
        tri = b.elementwise(op, [i_, j_])
    else:
        tri = ctx.add_weight("triangle", counts.astype(np.float32))
    y = b.compute("dot-product", b.make("access-cartesian-product", b.at(x, r - 1), b.at(tri, 1)))
    return [b.transpose(y, back)]
