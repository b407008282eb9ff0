"""Address patterns: how a DMA (or the array's operand feeder) walks a DRAM buffer.

A view is a base buffer plus steps, each a tuple:
  ("reshape", dims)                          row-major reinterpretation
  ("transpose", perm)                        permute axes
  ("windows", window, strides, dil, n_iter)  sliding windows over the axes from n_iter
                                             (Glenside's access-windows; im2col rows)
  ("slice", axis, lo, hi)                    indices [lo, hi) of one axis
  ("broadcast", dims)                        repeat size-1 axes (stride 0)
  ("pad", axis, before, after, value)        out-of-range indices read `value`
  ("diag", axis)                             a new last axis j: x where index[axis] == j,
                                             else 0 (block-diagonal weights, grouped.py)
They are the language's view ops reduced to what addressing needs (the split between
iterated and item dims matters only to `windows`, which records it). `apply` evaluates a
view with numpy (views where numpy can, copies where it must); `footprint` estimates how
many distinct base elements a view reads, which is what a DMA moves.
"""
from __future__ import annotations

import math

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from apsat.errors import ApsatError

STEP_KINDS = ("reshape", "transpose", "windows", "slice", "broadcast", "pad", "diag")


def step_dims(dims: tuple, step: tuple) -> tuple:
    """The dims after one step (the same arithmetic as the ops' shape rules)."""
    kind = step[0]
    if kind in ("reshape", "broadcast"):
        return tuple(step[1])
    if kind == "transpose":
        return tuple(dims[p] for p in step[1])
    if kind == "windows":
        _, window, strides, dil, n_iter = step
        out = tuple((d - ((w - 1) * dl + 1)) // s + 1
                    for d, w, s, dl in zip(dims[n_iter:], window, strides, dil))
        return tuple(dims[:n_iter]) + out + tuple(window)
    if kind == "slice":
        _, axis, lo, hi = step
        return dims[:axis] + (hi - lo,) + dims[axis + 1:]
    if kind == "pad":
        _, axis, before, after, _ = step
        return dims[:axis] + (dims[axis] + before + after,) + dims[axis + 1:]
    if kind == "diag":
        return tuple(dims) + (dims[step[1]],)
    raise ApsatError(f"unknown view step {kind!r}")


def dims_after(dims: tuple, steps) -> tuple:
    """The dims after all `steps`."""
    for s in steps:
        dims = step_dims(dims, s)
    return tuple(dims)


def footprint(base_dims: tuple, steps) -> int:
    """Distinct base elements the view reads (an estimate that is exact for reshapes,
    transposes, slices, broadcasts, pads and windows that cover their input): the least
    element count along the chain, pads, broadcasts and diagonals adding nothing read."""
    dims, fp = tuple(base_dims), math.prod(base_dims)
    for s in steps:
        dims = step_dims(dims, s)
        if s[0] not in ("pad", "broadcast", "diag"):
            fp = min(fp, math.prod(dims))
    return fp


def _windows(x: np.ndarray, window, strides, dil, n_iter) -> np.ndarray:
    """out[i.., o.., w..] = x[i.., o*s + w*d]: a view, never a copy."""
    spans = tuple((w - 1) * d + 1 for w, d in zip(window, dil))
    v = sliding_window_view(x, spans, axis=tuple(range(n_iter, x.ndim)))
    return v[(slice(None),) * n_iter + tuple(slice(None, None, s) for s in strides)
             + tuple(slice(None, None, d) for d in dil)]


def apply(x: np.ndarray, steps) -> np.ndarray:
    """The array a view with `steps` gives over base array `x` (often a numpy view)."""
    for s in steps:
        kind = s[0]
        if kind == "reshape":
            x = x.reshape(s[1])
        elif kind == "transpose":
            x = x.transpose(s[1])
        elif kind == "windows":
            x = _windows(x, *s[1:])
        elif kind == "slice":
            x = x[(slice(None),) * s[1] + (slice(s[2], s[3]),)]
        elif kind == "broadcast":
            x = np.broadcast_to(x, s[1])
        elif kind == "pad":
            width = [(0, 0)] * x.ndim
            width[s[1]] = (s[2], s[3])
            x = np.pad(x, width, mode="constant", constant_values=np.float32(s[4]))
        elif kind == "diag":
            n = x.shape[s[1]]
            on = np.eye(n, dtype=bool).reshape([n if i == s[1] else 1 for i in range(x.ndim)] + [n])
            x = np.where(on, x[..., None], np.zeros((), x.dtype))
        else:
            raise ApsatError(f"unknown view step {kind!r}")
    return x


# ---- text -----------------------------------------------------------------------------------

def _ints(values, sep="x") -> str:
    return sep.join(str(int(v)) for v in values) if len(values) else "-"


def _parse_ints(text: str, sep="x") -> tuple:
    return () if text == "-" else tuple(int(v) for v in text.split(sep))


def step_text(step: tuple) -> str:
    """One step as text, e.g. `windows 3x3/2x2/1x1@2`, `pad 2 1:1 -inf`."""
    kind = step[0]
    if kind in ("reshape", "broadcast"):
        return f"{kind} {_ints(step[1])}"
    if kind == "transpose":
        return f"transpose {_ints(step[1], ',')}"
    if kind == "windows":
        _, w, s, d, n = step
        return f"windows {_ints(w)}/{_ints(s)}/{_ints(d)}@{n}"
    if kind == "slice":
        return f"slice {step[1]} {step[2]}:{step[3]}"
    if kind == "pad":
        return f"pad {step[1]} {step[2]}:{step[3]} {float(step[4])!r}"
    if kind == "diag":
        return f"diag {step[1]}"
    raise ApsatError(f"unknown view step {kind!r}")


def parse_step(text: str) -> tuple:
    """Inverse of step_text."""
    kind, _, rest = text.strip().partition(" ")
    parts = rest.split()
    if kind in ("reshape", "broadcast"):
        return (kind, _parse_ints(parts[0]))
    if kind == "transpose":
        return (kind, _parse_ints(parts[0], ","))
    if kind == "windows":
        body, _, n = parts[0].partition("@")
        w, s, d = body.split("/")
        return (kind, _parse_ints(w), _parse_ints(s), _parse_ints(d), int(n))
    if kind == "slice":
        lo, hi = parts[1].split(":")
        return (kind, int(parts[0]), int(lo), int(hi))
    if kind == "pad":
        lo, hi = parts[1].split(":")
        return (kind, int(parts[0]), int(lo), int(hi), float(parts[2]))
    if kind == "diag":
        return (kind, int(parts[0]))
    raise ApsatError(f"unknown view step {kind!r} in {text!r}")
