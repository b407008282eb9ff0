"""Access ops as the exporter sees them: layout bookkeeping, and lazy forms a consumer reads.

A view (transpose, squeeze, inserted axis, broadcast, re-split) changes only a `Val`'s lazy
layout (graph.py). Three access forms have no good ONNX value of their own and stay lazy
until a consumer reads them: `Padded` (an access-pad chain: a Conv or a pool takes it as
its pads attribute), `Windows` (sliding windows: a Conv's or a pool's operand) and `Pair`
(the operands of an element-wise or dot-product compute: access-pair, a cartesian
product, or items stacked by concatenation). `dense_any` materialises any of them for a
consumer that needs the plain tensor: a Pad node, a Concat, or, for windows, a Gather
with the windows' element indices (large windows are refused).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from apsat.backends.onnx.graph import Builder, Val, const_val, dense, in_layout
from apsat.errors import ApsatError

# Windows that no Conv or pool reads are gathered element by element: an int64 index
# per element. Beyond this many the export is refused rather than written gigabytes big.
GATHER_LIMIT = 1 << 22


class ExportError(ApsatError):
    """A program (or a part of one) that cannot be written as ONNX."""


@dataclass(frozen=True, eq=False)
class Padded:
    """`base` padded by `pads` ((before, after) per logical axis) with zeros or -inf."""

    base: Val
    pads: tuple
    kind: str
    shape: tuple


@dataclass(frozen=True, eq=False)
class Windows:
    """Sliding windows over `src`'s item axes (those from `n_iter` on). `axes` names each
    logical axis: ("i", k) src's iterated axis k, ("o", j) the window position along item
    axis j, ("w", j) the offset inside the window along item axis j, ("u",) a size-1 axis
    (which a broadcast may have widened)."""

    src: object          # Val or Padded
    n_iter: int
    window: tuple
    strides: tuple
    dilations: tuple
    axes: tuple
    shape: tuple


@dataclass(frozen=True, eq=False)
class Pair:
    """Items whose leading axis (logical axis `axis`) holds `operands`; each operand's
    shape is the pair's without that axis (a cartesian product's operands broadcast)."""

    operands: tuple
    axis: int
    shape: tuple


LAZY = (Padded, Windows, Pair)


# ---- views on a Val ---------------------------------------------------------------------------

def transpose(v, perm) -> object:
    perm = tuple(perm)
    shape = tuple(v.shape[p] for p in perm)
    if isinstance(v, Val):
        return Val(v.name, v.dims, tuple(v.perm[p] for p in perm), shape, v.array)
    if isinstance(v, Windows):
        return Windows(v.src, v.n_iter, v.window, v.strides, v.dilations, tuple(v.axes[p] for p in perm), shape)
    return None


def squeeze(v, axis: int):
    shape = v.shape[:axis] + v.shape[axis + 1:]
    if isinstance(v, Val):
        return Val(v.name, v.dims, v.perm[:axis] + v.perm[axis + 1:], shape, v.array)
    if isinstance(v, Windows):
        return Windows(v.src, v.n_iter, v.window, v.strides, v.dilations, v.axes[:axis] + v.axes[axis + 1:], shape)
    return None


def insert_axis(v, axis: int):
    shape = v.shape[:axis] + (1,) + v.shape[axis:]
    if isinstance(v, Val):
        return Val(v.name, v.dims, v.perm[:axis] + (None,) + v.perm[axis:], shape, v.array)
    if isinstance(v, Windows):
        return Windows(v.src, v.n_iter, v.window, v.strides, v.dilations, v.axes[:axis] + (("u",),) + v.axes[axis:], shape)
    if isinstance(v, Pair) and axis != v.axis:
        inner = axis if axis < v.axis else axis - 1
        return Pair(tuple(insert_axis(o, inner) for o in v.operands), v.axis + (axis <= v.axis), shape)
    return None


def broadcast(v, shape: tuple):
    shape = tuple(shape)
    if isinstance(v, (Val, Windows)):
        return type(v)(**{**v.__dict__, "shape": shape})
    if isinstance(v, Pair):
        inner = shape[:v.axis] + shape[v.axis + 1:]
        return Pair(tuple(broadcast(o, inner) for o in v.operands), v.axis, shape)
    return None


def resplit(v):
    """`access E k`: the split moves, the data does not."""
    return v


# ---- forms that need a node (or numpy, for constants) -------------------------------------------

def reshape(b: Builder, v, dims: tuple) -> Val:
    dims = tuple(dims)
    if isinstance(v, Val) and v.is_const:
        return const_val(compact(np.reshape(v.logical_array(), dims)), dims)
    lazy = _unit_reshape(v, dims) if isinstance(v, Val) else _padded_reshape(b, v, dims)
    if lazy is not None:
        return lazy
    name = dense_any(b, v)
    return Val(b.reshape(name, dims, v.shape), dims, tuple(range(len(dims))), dims)


def _unit_reshape(v, dims: tuple):
    """A reshape that only inserts or removes size-1 axes, as a layout change (no node);
    None for any other."""
    if not isinstance(v, Val):
        return None
    old = [i for i, d in enumerate(v.shape) if d != 1]
    new = [i for i, d in enumerate(dims) if d != 1]
    if [v.shape[i] for i in old] != [dims[i] for i in new]:
        return None
    if any(v.perm[i] is None or v.dims[v.perm[i]] != v.shape[i] for i in old):
        return None                      # a broadcast axis would change its meaning
    perm = [None] * len(dims)
    for i, j in zip(old, new):
        perm[j] = v.perm[i]
    return Val(v.name, v.dims, tuple(perm), dims, v.array)


def _padded_reshape(b: Builder, p, dims: tuple):
    """A reshape of padded data that splits or merges only unpadded axes, as the same
    padding of the reshaped base (a grouped conv's (N, C, H, W) -> (N, G, C/G, H, W) keeps
    its pads for Conv's attribute); None for any other."""
    if not isinstance(p, Padded):
        return None
    base_dims, pads = [], []
    for old, new in _reshape_groups(p.shape, dims):
        padded = [a for a in old if p.pads[a] != (0, 0)]
        if padded and (len(old) != 1 or len(new) != 1):
            return None
        for j in new:
            lo, hi = p.pads[old[0]] if padded else (0, 0)
            base_dims.append(dims[j] - lo - hi)
            pads.append((lo, hi))
    return Padded(reshape(b, p.base, tuple(base_dims)), tuple(pads), p.kind, dims)


def _reshape_groups(old: tuple, new: tuple) -> list:
    """A reshape's axes in smallest groups of equal size: [(old axes, new axes)..]."""
    groups, i, j = [], 0, 0
    while i < len(old) or j < len(new):
        a = old[i] if i < len(old) else 1
        c = new[j] if j < len(new) else 1
        if (a == 1) != (c == 1):          # a size-1 axis on one side only: a group alone
            groups.append(([i], []) if a == 1 else ([], [j]))
            i, j = (i + 1, j) if a == 1 else (i, j + 1)
            continue
        gi, gj = [i], [j]
        while a != c:
            if a < c:
                i += 1
                gi.append(i)
                a *= old[i]
            else:
                j += 1
                gj.append(j)
                c *= new[j]
        groups.append(([x for x in gi if x < len(old)], [y for y in gj if y < len(new)]))
        i, j = i + 1, j + 1
    return groups


def slice_axis(b: Builder, v, axis: int, lo: int, hi: int) -> Val:
    shape = v.shape[:axis] + (hi - lo,) + v.shape[axis + 1:]
    if isinstance(v, Val) and v.is_const:
        a = v.aligned_array()
        if a.shape[axis] != 1:
            a = a[(slice(None),) * axis + (slice(lo, hi),)]
        return const_val(a, shape)
    if isinstance(v, Val) and v.perm[axis] is not None and v.dims[v.perm[axis]] == 1:
        return Val(v.name, v.dims, v.perm, shape)              # a broadcast axis: every slice is it
    if not isinstance(v, Val):
        v = as_val(b, v)
    p = v.perm[axis]
    name = b.op("Slice", [v.name, b.ints([lo]), b.ints([hi]), b.ints([p])])
    dims = v.dims[:p] + (hi - lo,) + v.dims[p + 1:]
    return Val(name, dims, v.perm, shape)


def concatenate(b: Builder, x, y, axis: int, shape: tuple):
    """Join along `axis`; stacking single items on a leading item axis makes a Pair."""
    parts = [_stack_parts(v, axis) for v in (x, y)]
    if all(p is not None for p in parts):
        return Pair(parts[0] + parts[1], axis, shape)
    if all(isinstance(v, Val) and v.is_const for v in (x, y)):
        return const_val(compact(np.concatenate([x.logical_array(), y.logical_array()], axis)), shape)
    order = _common_order([v for v in (x, y) if isinstance(v, Val)], len(shape))
    names = [b.const(np.transpose(v.logical_array(), order)) if isinstance(v, Val) and v.is_const
             else in_layout(b, as_val(b, v, full=True), order).name for v in (x, y)]
    phys = order.index(axis)
    dims = tuple(shape[i] for i in order)
    out = b.op("Concat", names, axis=phys)
    return Val(out, dims, tuple(order.index(i) for i in range(len(shape))), shape)


def _stack_parts(v, axis: int):
    """The operands `v` contributes when stacked along `axis`: a Pair's own, or one item."""
    if isinstance(v, Pair) and v.axis == axis:
        return v.operands
    if isinstance(v, (Val, Windows)) and v.shape[axis] == 1 and (
            (isinstance(v, Val) and (v.perm[axis] is None or v.dims[v.perm[axis]] == 1))
            or (isinstance(v, Windows) and v.axes[axis] == ("u",))):
        return (squeeze(v, axis),)
    return None


def _common_order(vals: list, rank: int) -> tuple:
    """The logical order of the first full-rank non-constant operand's physical axes
    (so it needs no transpose), else logical order."""
    for v in vals:
        if not v.is_const and None not in v.perm and len(v.perm) == len(v.dims) == rank:
            return tuple(sorted(range(rank), key=lambda i: v.perm[i]))
    return tuple(range(rank))


def compact(a: np.ndarray) -> np.ndarray:
    """A constant with every axis along which it does not vary cut to size 1 (ONNX
    broadcasting restores it): a broadcast bias is written once, not per position."""
    for axis in range(a.ndim):
        if a.shape[axis] <= 1:
            continue
        cut = (slice(None),) * axis
        first = a[cut + (slice(0, 1),)]
        if a.strides[axis] != 0:         # stride 0: a broadcast view, constant by construction
            if not np.array_equal(first, a[cut + (slice(1, 2),)], equal_nan=True):
                continue                 # varies between its first two slices already
            if not np.array_equal(a, np.broadcast_to(first, a.shape), equal_nan=True):
                continue
        a = first
    return a         # a view where it was one: the Builder writes the bytes contiguous


# ---- materialising lazy forms -------------------------------------------------------------------

def as_val(b: Builder, v, full: bool = False) -> Val:
    """Any value as a Val (lazy forms materialised); `full` also expands broadcasts."""
    if isinstance(v, Val):
        if full and not v.full and not v.is_const:
            name = dense(b, v)
            return Val(name, v.shape, tuple(range(len(v.shape))), v.shape)
        return v
    name = dense_any(b, v)
    return Val(name, v.shape, tuple(range(len(v.shape))), v.shape)


def dense_any(b: Builder, v) -> str:
    """The ONNX value of any form, exactly in logical layout."""
    if isinstance(v, Val):
        return dense(b, v)
    if isinstance(v, Padded):
        return pad_node(b, v)
    if isinstance(v, Pair):
        parts = [b.op("Unsqueeze", [dense_any(b, o), b.ints([v.axis])]) for o in v.operands]
        return b.op("Concat", parts, axis=v.axis) if len(parts) > 1 else parts[0]
    return gather_windows(b, v)


def pad_node(b: Builder, p: Padded) -> str:
    x = dense(b, p.base)
    fill = 0.0 if p.kind == "zero-padding" else -np.inf
    pads = [lo for lo, _ in p.pads] + [hi for _, hi in p.pads]
    return b.op("Pad", [x, b.ints(pads), b.const(np.float32(fill))], mode="constant")


def gather_windows(b: Builder, w: Windows) -> str:
    """Windows read element by element: Gather on the source with its item dims flattened,
    by the windows' indices within one item (numpy's own sliding windows), so the index
    does not grow with (or fix) the iterated dims, a batch among them."""
    from apsat.lang.evaluate import _windows_view

    it, item = w.src.shape[:w.n_iter], w.src.shape[w.n_iter:]
    index = _windows_view(np.arange(math.prod(item), dtype=np.int64).reshape(item), 0,
                          w.window, w.strides, w.dilations)      # a view: nothing copied yet
    if index.size > GATHER_LIMIT:      # the index constant written: one item's windows
        raise ExportError(f"sliding windows of {index.size} elements an item that no Conv or pool "
                          f"reads cannot be written as ONNX (more than {GATHER_LIMIT} gathered elements)")
    k = w.n_iter + len(w.window)
    names = [("i", i) for i in range(w.n_iter)] + [("o", j) for j in range(len(w.window))] \
        + [("w", j) for j in range(len(w.window))]
    picked = [names.index(a) if a != ("u",) else None for a in w.axes]
    order = [p for p in picked if p is not None]
    order = order + [i for i in range(k) if i not in order]
    gathered_shape = tuple(it) + index.shape
    sizes = [gathered_shape[p] if p is not None else 1 for p in picked]
    flat = b.reshape(dense_any(b, w.src), list(it) + [-1])
    out = b.op("Gather", [flat, b.const(np.ascontiguousarray(index), "window_index", np.int64)], axis=w.n_iter)
    if order != list(range(k)):
        out = b.op("Transpose", [out], perm=order)
    if tuple(sizes) != tuple(gathered_shape[p] for p in order):
        out = b.op("Reshape", [out, b.ints(sizes)])
    if tuple(sizes) != tuple(w.shape):
        out = b.op("Expand", [out, b.ints(list(w.shape))])
    return out
