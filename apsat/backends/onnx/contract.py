"""Products (dot-product, fused-dot-bias[-act], attention) as MatMul, Gemm and Conv.

A product's two operands are a Pair: out[i..] = sum over the item of a[i.., k..] * b[i..,
k..], each operand broadcast along the axes the other one spans. Each iterated axis is
read by its role: both operands real (a batch axis), only a real (M), only b real (N),
neither (a unit). That is a MatMul over (batch.., M, K) x (batch.., K, N), whatever
transposes and cartesian products the program wrote: the layouts are bookkeeping
(graph.py), so the node is one MatMul, or one Gemm when the operand is a matrix and the
bias can ride along.

An operand that is sliding windows over a (padded) tensor, with weights as the other, is a
convolution: the windows' axes say which source axes are batch, group, channel and
spatial, and the weights are permuted into Conv's (M, C/G, k..) once, here.
"""
from __future__ import annotations

import math

import numpy as np

from apsat.backends.onnx.graph import Builder, Val, in_layout, physical
from apsat.backends.onnx.views import Padded, Windows, as_val, squeeze

def roles(a, b, n_iter: int) -> list[str]:
    """Each iterated axis: "batch" (both real), "m" (a only), "n" (b only), "unit"."""
    out = []
    for i in range(n_iter):
        ra, rb = _real(a, i), _real(b, i)
        out.append("batch" if ra and rb else "m" if ra else "n" if rb else "unit")
    return out


def _real(v, axis: int) -> bool:
    """The operand varies along `axis` (it is not a broadcast there)."""
    if isinstance(v, Windows):
        return v.axes[axis] != ("u",) and v.shape[axis] > 1
    return v.perm[axis] is not None and v.dims[v.perm[axis]] > 1


def matmul(b: Builder, a: Val, w: Val, n_iter: int, shape: tuple, bias: Val | None = None) -> Val:
    """sum_k a[.., k..] * w[.., k..] (+ bias over the n axes) as one MatMul (or Gemm)."""
    rank = len(a.shape)
    role = roles(a, w, n_iter)
    # a's own size-1 axes ride along as M axes: dropping them would cost a Reshape
    role = ["m" if r == "unit" and not a.is_const and a.perm[i] is not None else r for i, r in enumerate(role)]
    axes = {r: [i for i in range(n_iter) if role[i] == r] for r in ("batch", "m", "n", "unit")}
    item = list(range(n_iter, rank))
    size = lambda ax: math.prod(shape[i] if i < n_iter else a.shape[i] for i in ax)  # noqa: E731
    lead = axes["batch"]
    if w.is_const and not lead:
        ax = _dense_in(b, a, axes["m"] + item)
        m_dims = [shape[i] for i in axes["m"]] or [1]       # a vector: a 1-row matrix (Gemm)
        left = b.reshape(ax.name, m_dims + [size(item)], ax.dims)
    else:
        ax = _dense_in(b, a, lead + axes["m"] + item)
        left = b.reshape(physical(b, ax), [shape[i] for i in lead] + [size(axes["m"]), size(item)], ax.dims)
        m_dims = [shape[i] for i in lead] + [size(axes["m"])]
    wk = _dense_in(b, w, lead + item + axes["n"])
    right_dims = [shape[i] for i in lead] + [size(item), size(axes["n"])]
    if wk.is_const:
        right = b.const(np.reshape(wk.array, right_dims), "weight")
    else:
        right = b.reshape(wk.name, right_dims, wk.dims)
    bias_name = None if bias is None else b.const(np.reshape(_bias_array(bias, axes["n"]), [-1]), "bias")
    if len(m_dims) == 1 and bias_name is not None and not lead:
        out = b.op("Gemm", [left, right, bias_name])
    else:
        out = b.op("MatMul", [left, right])
        if bias_name is not None:
            out = b.op("Add", [out, bias_name])
    out_dims = tuple(m_dims) + (size(axes["n"]),)
    if not axes["m"] and not lead:
        out, out_dims = b.reshape(out, out_dims[1:], out_dims), out_dims[1:]
    return _unflatten(b, out, out_dims, [lead, axes["m"], axes["n"]], shape)


def _dense_in(b: Builder, v: Val, order: list) -> Val:
    """`v` with every dim present, physically in logical order `order` (the other logical
    axes, all size 1, dropped)."""
    rest = [i for i in range(len(v.shape)) if i not in order]
    v = as_val(b, v, full=False)
    if v.is_const:
        a = np.broadcast_to(v.aligned_array(), v.shape)
        a = np.transpose(a[tuple(0 if i in rest else slice(None) for i in range(a.ndim))],
                         [sorted(order).index(i) for i in order])
        # a view (Builder.const makes the bytes contiguous when it writes them, or, for
        # an external-data export, one tensor at a time as it saves them)
        return Val(None, a.shape, tuple(range(a.ndim)), a.shape, a)
    for axis in sorted(rest, reverse=True):          # broadcast axes: dropped, no node
        v = squeeze(v, axis)
    kept = sorted(order)
    laid = in_layout(b, v, tuple(kept.index(i) for i in order))
    name, dims = laid.name, tuple(v.shape[kept.index(i)] for i in order)
    if laid.dims != dims:
        name = b.op("Expand", [name, b.ints(dims)])
    return Val(name, dims, tuple(range(len(dims))), dims)


def _bias_array(bias: Val, n_axes: list) -> np.ndarray:
    """The bias over the product's n axes, in their order (it is broadcast over the rest)."""
    a = np.broadcast_to(bias.aligned_array(), bias.shape)
    idx = tuple(slice(None) if i in n_axes else 0 for i in range(len(bias.shape)))
    return np.ascontiguousarray(a[idx], dtype=np.float32)


def _unflatten(b: Builder, name: str, dims: tuple, groups: list, shape: tuple) -> Val:
    """The product's physical result (batch.., M.., N) or (batch.., M, N) as a Val of the
    logical `shape`: a Reshape only where a flattened group had several axes."""
    order = [i for g in groups for i in g]
    want = tuple(shape[i] for i in order)
    if dims != want:
        name = b.reshape(name, want, dims)
    perm = [None] * len(shape)
    for phys, logical in enumerate(order):
        perm[logical] = phys
    return Val(name, want, tuple(perm), shape)


# ---- convolution ----------------------------------------------------------------------------

def conv(b: Builder, win: Windows, w: Val, n_iter: int, shape: tuple, bias=None):
    """Conv for windows `win` against constant weights `w` (its activation, written after
    it, becomes FusedConv's in fuse.py); None when the windows are not a convolution ONNX
    writes (the caller gathers them)."""
    plan = _conv_plan(win, w, n_iter)
    if plan is None:
        return None
    batch, group, chan, spatial, pads = plan
    src = win.src.base if isinstance(win.src, Padded) else win.src
    src = as_val(b, src, full=True)
    x = in_layout(b, src, tuple(batch + group + chan + spatial))
    n, c = math.prod(src.shape[i] for i in batch), math.prod(src.shape[i] for i in group + chan)
    x_name = physical(b, x)
    if len(batch) != 1 or len(group + chan) != 1:
        x_name = b.reshape(x_name, [n, c] + [src.shape[i] for i in spatial], x.dims)
    lead, m_axes, out_axes = _conv_axes(win, w, n_iter, batch, spatial)
    weight, g = _conv_weight(win, w, n_iter, m_axes, spatial, len(group))
    attrs = dict(kernel_shape=[win.window[i - win.n_iter] for i in spatial],
                 strides=[win.strides[i - win.n_iter] for i in spatial],
                 dilations=[win.dilations[i - win.n_iter] for i in spatial],
                 pads=[pads[i][0] for i in spatial] + [pads[i][1] for i in spatial], group=g)
    inputs = [x_name, b.const(weight, "conv_weight")]
    if bias is not None:
        inputs.append(b.const(np.reshape(_bias_array(bias, m_axes), [-1]), "conv_bias"))
    out = b.op("Conv", inputs, **attrs)
    y_dims = (n, weight.shape[0]) + tuple(shape[i] for i in out_axes)
    return _unflatten(b, out, y_dims, [lead, m_axes, out_axes], shape)


def _conv_axes(win: Windows, w: Val, n_iter: int, batch: list, spatial: list):
    """The product's iterated axes as Conv's N (batch source axes), M (group source axes
    and the weights' own) and output positions (in the source's spatial order)."""
    lead = [i for i in range(n_iter) if win.axes[i][0] == "i" and win.axes[i][1] in batch]
    m_axes = [i for i in range(n_iter) if (win.axes[i][0] == "i" and win.axes[i][1] not in batch)
              or (win.axes[i] == ("u",) and _real(w, i))]
    where = {win.axes[i]: i for i in range(n_iter)}
    out_axes = [where[("o", s - win.n_iter)] for s in spatial if ("o", s - win.n_iter) in where]
    return lead, m_axes, out_axes


def _conv_plan(win: Windows, w: Val, n_iter: int):
    """(batch, group, channel, spatial source axes, pads by source axis) or None."""
    if not (isinstance(w, Val) and w.is_const):
        return None
    src_shape = win.src.shape
    pads = dict(enumerate(win.src.pads)) if isinstance(win.src, Padded) else {}
    if isinstance(win.src, Padded) and win.src.kind != "zero-padding":
        return None
    pads = {i: pads.get(i, (0, 0)) for i in range(len(src_shape))}
    role = roles(win, w, n_iter)
    batch, group = [], []
    for k in range(win.n_iter):
        real_w = any(win.axes[i] == ("i", k) and role[i] == "batch" for i in range(n_iter))
        (group if real_w else batch).append(k)
    items = range(win.n_iter, len(src_shape))
    full = [a for a in items if win.window[a - win.n_iter] == src_shape[a]
            and win.strides[a - win.n_iter] == 1 and pads[a] == (0, 0)]
    # a 1x1 map's spatial axes are full windows too: the channel is the one wider than 1
    chan = [a for a in full if src_shape[a] > 1][:2] or full[:1]
    spatial = [a for a in items if a not in chan]
    if len(chan) != 1 or not (1 <= len(spatial) <= 3) or len(group) > 1 or not batch:
        return None
    if any(a[0] == "w" and (i < n_iter) for i, a in enumerate(win.axes)):
        return None
    return batch, group, chan, spatial, pads


def _conv_weight(win: Windows, w: Val, n_iter: int, m_axes: list, spatial: list, grouped: int):
    """The weights as Conv's (M, C/G, k..) array, and the group count."""
    wa = np.broadcast_to(w.aligned_array(), w.shape)
    item_role = {}
    for i in range(n_iter, len(w.shape)):
        item_role[i] = win.axes[i]
    chan_axis = [i for i, r in item_role.items() if r[0] == "w" and r[1] + win.n_iter not in spatial]
    spat_axes = [next(i for i, r in item_role.items() if r == ("w", s - win.n_iter)) for s in spatial]
    keep = m_axes + chan_axis + spat_axes
    idx = tuple(slice(None) if i in keep else 0 for i in range(len(w.shape)))
    sub = wa[idx]
    kept = [i for i in range(len(w.shape)) if i in keep]
    sub = np.transpose(sub, [kept.index(i) for i in keep])
    m = math.prod(w.shape[i] for i in m_axes)
    group = w.shape[m_axes[0]] if grouped else 1
    out = sub.reshape([m] + [w.shape[i] for i in chan_axis + spat_axes])
    return np.ascontiguousarray(out, dtype=np.float32), group
