"""ONNX ScatterND and ScatterElements (reduction "none") in the language.

With constant indices (Longformer's chunked attention, masks an exporter writes into place)
a scatter is a gather: the data and the updates flattened and joined, and every output
position reading the element that ends up there (the data's own, or the last update
written to it, as ONNX's order of writes says), one `access-gather` by a constant map.
With run-time indices along a short axis (a mixture-of-experts router writing its top-k
weights into a dense (tokens, experts) matrix), each output position compares its index
with the indices of the updates of its row: the matching update where one matches, the
data elsewhere (duplicate indices, which ONNX leaves undefined, add up here).
"""
from __future__ import annotations

import math

import numpy as np

from apsat.frontend.lowering_gather import EXACT_INDEX
from apsat.frontend.lowering_tensor import Unlowerable, axis_last, normalize_axis

SCATTER_LIMIT = 4096        # run-time indices: at most this many (update, position) pairs a row


def _reduction(ctx):
    if ctx.attr("reduction", "none") != "none":
        raise Unlowerable(f"{ctx.op} with reduction {ctx.attr('reduction')!r}")


def _by_source_map(ctx, source: np.ndarray):
    """out = concat(flat data, flat updates)[source], reshaped to the data's dims."""
    b, dims, udims = ctx.b, ctx.dims(0), ctx.dims(2)
    n, u = math.prod(dims), math.prod(udims)
    if n + u >= EXACT_INDEX:
        raise Unlowerable("a scatter over more elements than float32 indexes exactly")
    joined = b.concat([b.reshape(ctx.term(0), (n,)), b.reshape(ctx.term(2), (u,))], 0)
    out = b.gather(joined, ctx.add_weight("scatter_map", source.astype(np.float32)), 0)
    return [b.reshape(out, dims)]


def lower_scatter_nd(ctx):
    """ScatterND with constant indices (module doc)."""
    _reduction(ctx)
    indices = ctx.const(1)
    if indices is None:
        raise Unlowerable("ScatterND with run-time indices")
    dims = ctx.dims(0)
    idx = np.asarray(indices, np.int64)
    k = idx.shape[-1]
    idx = idx % np.asarray(dims[:k])
    tail = math.prod(dims[k:])
    strides = np.asarray([math.prod(dims[j + 1:k]) for j in range(k)], np.int64)
    slots = (idx * strides).sum(-1).reshape(-1)
    n = math.prod(dims)
    source = np.arange(n, dtype=np.int64)
    for u, slot in enumerate(slots):          # in order: the last write to a slot wins
        source[slot * tail:(slot + 1) * tail] = n + u * tail + np.arange(tail)
    return _by_source_map(ctx, source)


def lower_scatter_elements(ctx):
    """ScatterElements: constant indices as a source map, run-time ones by comparison."""
    _reduction(ctx)
    dims, idims = ctx.dims(0), ctx.dims(1)
    axis = normalize_axis(ctx, ctx.attr("axis", 0), len(dims))
    indices = ctx.const(1)
    if indices is not None:
        idx = np.asarray(indices, np.int64) % dims[axis]
        grid = list(np.indices(idims))
        grid[axis] = idx
        targets = np.ravel_multi_index(tuple(grid), dims).reshape(-1)
        n = math.prod(dims)
        source = np.arange(n, dtype=np.int64)
        source[targets] = n + np.arange(targets.size)       # numpy: the last write wins
        return _by_source_map(ctx, source)
    return _by_comparison(ctx, dims, idims, axis)


def _by_comparison(ctx, dims, idims, axis):
    """Run-time indices: with the axis moved last, out[.., j] = sum over r of updates[.., r]
    where indices[.., r] == j, or data[.., j] where no index is j."""
    if any(i != d for a, (i, d) in enumerate(zip(idims, dims)) if a != axis):
        raise Unlowerable("ScatterElements whose indices cover part of the other axes")
    n, m = dims[axis], idims[axis]
    if n * m > SCATTER_LIMIT:
        raise Unlowerable(f"ScatterElements over {n} positions by {m} run-time indices")
    b = ctx.b
    perm, back = axis_last(len(dims), axis)

    def last(t):
        return b.transpose(t, perm)

    rows = tuple(dims[a] for a in perm[:-1])
    square = rows + (n, m)                                   # [.., j, r]
    wrapped = b.elementwise("elementwise-mod", [last(ctx.term(1)), b.literal(float(n))])
    hit = b.elementwise("equal", [b.expand(b.reshape(wrapped, rows + (1, m)), square),
                                  ctx.add_weight("position", np.arange(n, dtype=np.float32).reshape(n, 1))])
    spread = b.expand(b.reshape(last(ctx.term(2)), rows + (1, m)), square)
    value = b.compute("reduce-sum", b.at(b.select(hit, spread, b.literal(0.0)), len(rows) + 1))
    written = b.compute("reduce-sum", b.at(hit, len(rows) + 1))
    out = b.select(written, value, last(ctx.term(0)))
    return [b.transpose(out, back)]
