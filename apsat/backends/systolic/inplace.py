"""Concatenations built in place (the lowering option fold_copies).

A concatenation along its last axis whose part is a GEMM result (systolic-array,
fused-dot-bias(-act)) or another such concatenation need not copy that part: the GEMM
stores its (m x n) blocks straight into the part's columns of the concatenation's
buffer read as an (m x total) matrix, and an inner concatenation's own parts land there
at their offsets. DenseNet's dense blocks (each layer concatenates all earlier features
with its own) then keep one buffer per block and copy nothing; Inception's branches
write their columns of the module's output.

Readers of a part placed so read it through a slice of the buffer it lives in
(Lowering.chain), so other consumers of the part see the same values. A part that is
read before the concatenation exists is fine: the buffer is allocated before anything
is lowered, and each part's columns are written once.

Not placed: parts of other kinds (vector and grouped results are stored in other
layouts; they stay COPYs), parts whose result is not laid out as (rows, last axis), a
part already placed in another concatenation, and GEMMs fused into an element-wise
consumer (fuse_zips: they have no buffer of their own).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from apsat.lang.term import Term

# The atoms whose result is a GEMM's (rows, columns) matrix (not attention: its heads'
# outputs are stored by its own lowering, attention.py)
GEMM_ATOMS = ("systolic-array", "fused-dot-bias", "fused-dot-bias-act")


@dataclass(frozen=True)
class Placement:
    """A term stored in columns [offset, offset + width) of the buffer of `root` (a
    concatenation that is itself placed nowhere), read as a matrix of `cols` columns
    (the root's last dim); `axis` is that last axis."""

    root: Term
    axis: int
    offset: int
    width: int
    cols: int

    def step(self) -> tuple:
        """The view step that reads the placed term out of the root's buffer."""
        return ("slice", self.axis, self.offset, self.offset + self.width)


def _gemm_width(L, t: Term) -> int | None:
    """n of a GEMM term when its result's last axis is the product's columns."""
    if t.op == "systolic-array":
        n = t.args[1]
    else:
        n = math.prod(L.program.shape_of(t.args[-2])[0])
    dims = L.dims(t)
    return n if dims and dims[-1] == n else None


def plan(L, order, deferred) -> dict[Term, Placement]:
    """{term: Placement} for the parts the concatenations in `order` (children first)
    can be built from in place; outer concatenations are decided first so that inner
    ones resolve to the outermost buffer."""
    placed: dict[Term, Placement] = {}
    for t in reversed(order):
        if t.op != "access-concatenate" or L.const.get(t, False):
            continue
        a, b, axis = t.args
        dims = L.dims(t)
        if axis != len(dims) - 1:
            continue
        outer = placed.get(t)
        root, base, cols = (outer.root, outer.offset, outer.cols) if outer else (t, 0, dims[-1])
        lo = 0
        for part in (a, b):
            width = L.dims(part)[axis]
            q = producer(L, part)
            if _placeable(L, q, axis, width, placed, deferred):
                placed[q] = Placement(root, axis, base + lo, width, cols)
            lo += width
    return placed


def producer(L, part: Term) -> Term:
    """The term whose buffer holds a concatenation part: through re-splits and reshapes
    that keep the last axis (a GEMM's (m, n) result read as (1, h, w, n))."""
    q = part
    while q.op in ("access", "access-reshape") and L.dims(q.args[0])[-1:] == L.dims(q)[-1:]:
        q = q.args[0]
    return q


def _placeable(L, q: Term, axis: int, width: int, placed: dict, deferred) -> bool:
    if q in placed or q in deferred or L.const.get(q, False):
        return False
    if q.op == "access-concatenate":
        return q.args[2] == axis and len(L.dims(q)) == axis + 1
    return q.op in GEMM_ATOMS and _gemm_width(L, q) == width


def host_operand(L, x: Term, buf: str) -> Term:
    """The term a HOST step reads a materialised `x` as: its buffer, or the slice of
    the buffer it is placed in."""
    t = Term("access", (Term("access-tensor", (buf,)), L.split(x)))
    p = L.placed.get(x)
    if p is None:
        return t
    return Term("access-slice", (t, p.axis, p.offset, p.offset + p.width))
