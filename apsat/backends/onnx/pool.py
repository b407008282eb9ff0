"""Reductions over sliding windows as MaxPool and AveragePool, and the attention atom.

A reduction whose item is a window over a (padded) tensor is a pool: the window's axes of
size 1 pass through (they fold into the pool's N and C), the others are spatial. Max
pooling takes -inf padding as its pads attribute, mean pooling zero padding (padded
elements count, count_include_pad=1); a sum is that mean times the window size.
"""
from __future__ import annotations

import math

import numpy as np

from apsat.backends.onnx.graph import Builder, Val, const_val, in_layout, needs_transpose, physical
from apsat.backends.onnx.views import Padded, Windows, as_val, squeeze
from apsat.backends.onnx.contract import _real

POOL_PADDING = {"reduce-max": "min-padding", "reduce-mean": "zero-padding", "reduce-sum": "zero-padding"}


def pool(b: Builder, name: str, win: Windows, n_iter: int, shape: tuple):
    """MaxPool / AveragePool for a reduction over windows; None when the windows are not
    a pool ONNX writes (the caller gathers them)."""
    src = win.src
    pads = dict(enumerate(src.pads)) if isinstance(src, Padded) else {}
    if isinstance(src, Padded) and src.kind != POOL_PADDING[name]:
        return None
    if win.axes[n_iter:] != tuple(("w", j) for j in range(len(win.window))) or any(win.dilations[j] != 1 for j in range(len(win.window))):
        return None
    base = as_val(b, src.base if isinstance(src, Padded) else src, full=True)
    axes = range(len(base.shape))
    item = [a for a in axes if a >= win.n_iter]
    spatial = [a for a in item if win.window[a - win.n_iter] > 1 or win.strides[a - win.n_iter] > 1
               or pads.get(a, (0, 0)) != (0, 0)]
    passing = [a for a in axes if a not in spatial]
    if not spatial or len(spatial) > 3 or not _positions_in_order(win, n_iter, spatial, passing):
        return None
    order = tuple(sorted(passing, key=lambda a: (base.perm[a] is None, base.perm[a] or 0))) + tuple(spatial)
    x = in_layout(b, base, order)
    lead = [base.shape[a] for a in order[:len(passing)]]
    x_name = physical(b, x)
    if len(passing) != 2:
        x_name = b.reshape(x_name, [math.prod(lead), 1] + [base.shape[a] for a in spatial], x.dims)
    attrs = dict(kernel_shape=[win.window[a - win.n_iter] for a in spatial],
                 strides=[win.strides[a - win.n_iter] for a in spatial],
                 pads=[pads.get(a, (0, 0))[0] for a in spatial] + [pads.get(a, (0, 0))[1] for a in spatial])
    if name == "reduce-max":
        out = b.op("MaxPool", [x_name], **attrs)
    else:
        out = b.op("AveragePool", [x_name], count_include_pad=1, **attrs)
        if name == "reduce-sum":
            out = b.op("Mul", [out, b.const(np.float32(math.prod(attrs["kernel_shape"])))])
    out_spatial = [shape[_position(win, a)] for a in spatial]
    dims = tuple(lead) + tuple(out_spatial)
    if len(passing) != 2:
        out = b.reshape(out, dims, [math.prod(lead), 1] + out_spatial)
    perm = [None] * len(shape)
    for phys, a in enumerate(order):
        perm[_position(win, a)] = phys
    return Val(out, dims, tuple(perm), shape)


def _position(win: Windows, src_axis: int) -> int:
    """The logical axis of the windows carrying source axis `src_axis`'s positions."""
    key = ("i", src_axis) if src_axis < win.n_iter else ("o", src_axis - win.n_iter)
    return win.axes.index(key)


def _positions_in_order(win: Windows, n_iter: int, spatial: list, passing: list) -> bool:
    """Every source axis has its positions axis among the iterated ones, once."""
    keys = [("i", a) if a < win.n_iter else ("o", a - win.n_iter) for a in passing + spatial]
    head = win.axes[:n_iter]
    return all(head.count(k) == 1 for k in keys) and all(a in keys or a == ("u",) for a in head)


# ---- attention --------------------------------------------------------------------------------

def attention(b: Builder, safe: int, q, k, bias, v, shape: tuple) -> Val:
    """ONNX Attention (opset 23) over q (I.., m, n, d) and k, both broadcast where the
    other varies, the additive bias (I.., m, n) and v (I.., m, e, n); scale 1 (the
    program scaled q already). SAFE: rows that are all -inf give 0, not NaN. With
    (batch, heads) leading and q, k, v laid out (batch, seq, heads, d) as the projections
    wrote them, the 3-D form (batch, seq, heads * d) reads them with no Transpose."""
    r = len(shape)          # I.. + (m, e)
    lead, m, n = list(range(r - 2)), r - 2, r - 1
    if _real(q, n) or _real(k, m) or _real(v, m):
        return None
    # squeezed: q (I.., m, d), k (I.., n, d), v (I.., e, n): (sequence axis, width axis)
    parts = [(as_val(b, squeeze(q, n), full=True), m, n), (as_val(b, squeeze(k, m), full=True), m, n),
             (as_val(b, squeeze(v, m), full=True), n, m)]
    heads = [shape[i] for i in lead]
    if len(lead) == 2 and not any(needs_transpose(x, (0, s, 1, w)) for x, s, w in parts):
        return _attention_3d(b, safe, parts, bias, heads, shape, k.shape[n])
    four = [math.prod(heads[:-1]) if len(heads) > 1 else 1, heads[-1] if heads else 1]
    names = []
    for x, s, w in parts:
        if x.is_const and not x.full:   # a broadcast constant (keys of zeros): written whole,
            x = const_val(np.ascontiguousarray(x.logical_array()))   # the reshape reads every dim
        x = in_layout(b, x, tuple(lead + [s, w]))
        names.append(b.reshape(physical(b, x), four + list(x.dims[-2:]), x.dims))
    mask = _mask(b, bias, heads, shape[m], k.shape[n], four)
    out = _attention_node(b, safe, names, mask)
    dims = tuple(shape)
    return Val(b.reshape(out, dims, four + list(dims[-2:])), dims, tuple(range(len(dims))), dims)


def _attention_3d(b: Builder, safe: int, parts: list, bias, heads: list, shape: tuple, kv: int) -> Val:
    """Attention on (batch, seq, heads * width) operands; the result is (batch, heads,
    m, e) logically, (batch, m, heads, e) physically."""
    names = []
    for x, s, w in parts:
        x = in_layout(b, x, (0, s, 1, w))
        names.append(b.reshape(physical(b, x), [x.dims[0], x.dims[1], x.dims[2] * x.dims[3]], x.dims))
    mask = _mask(b, bias, heads, shape[2], kv, heads)
    out = _attention_node(b, safe, names, mask, q_num_heads=heads[1], kv_num_heads=heads[1])
    dims = (shape[0], shape[2], shape[1], shape[3])
    out = b.reshape(out, dims, (shape[0], shape[2], shape[1] * shape[3]))
    return Val(out, dims, (0, 2, 1, 3), shape)


def _attention_node(b: Builder, safe: int, names: list, mask, **heads) -> str:
    out = b.op("Attention", names + ([mask] if mask else []), scale=1.0, **heads)
    if safe:
        out = b.op("Where", [b.op("IsNaN", [out]), b.const(np.float32(0.0)), out])
    return out


def _mask(b: Builder, bias, heads: list, m: int, n: int, four: list):
    """The additive mask as Attention's 4-D attn_mask (None without one); onnxruntime
    wants its query dim whole, so a mask broadcast along it is expanded."""
    if bias is None:
        return None
    full = tuple(heads) + (m, n)
    bv = as_val(b, bias)
    mask = physical(b, in_layout(b, bv, tuple(range(len(bv.shape)))))
    if tuple(bv.dims[-2:-1]) != (m,) or len(heads) != 2:
        mask = b.op("Expand", [mask, b.ints(full)])
        mask = b.reshape(mask, list(four) + [m, n], full)
    return _finite_floor(b, mask)


# onnxruntime's Attention reads a mask value as low as -FLT_MAX (masked_fill with finfo.min,
# as transformers write padding) as -inf: a row masked whole gives 0, where the program (and
# the original's Add and Softmax) give the mean of the values, every score being equally
# -FLT_MAX. Raised to MASK_FLOOR a value is still far below any score (exp gives 0 beside
# an unmasked one) and a row masked whole stays uniform; -inf itself stays -inf.
MASK_FLOOR = -1e30


def _finite_floor(b: Builder, mask: str) -> str:
    """`mask` with its finite values below MASK_FLOOR raised to it (at export time for a
    constant mask)."""
    value = b.value_of(mask)
    if value is not None:
        return b.const(np.where(np.isneginf(value), value, np.maximum(value, np.float32(MASK_FLOOR))))
    raised = b.op("Max", [mask, b.const(np.float32(MASK_FLOOR))])
    return b.op("Where", [b.op("IsInf", [mask], detect_positive=0), mask, raised])
