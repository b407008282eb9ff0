"""Term building for the importer and the lowerings.

`Builder` makes interned terms and tracks each one's access shape as it goes, so a lowering
can ask for dims mid-way. Its helpers skip no-op steps (an `access` that keeps the split, an
identity transpose, a reshape to the same shape) and collapse `access`/`access-reshape`/
`access-insert-axis`/`access-squeeze` chains under a reshape, so the imported program
carries no dead layout nodes.
"""
from __future__ import annotations

import numpy as np

from apsat.lang.ops import COMPUTE_OPS, OPS, AccessShape
from apsat.lang.term import Term


class Builder:
    """Makes terms and remembers their access shapes. `tensor_shapes` (name -> dims) is
    the dict the Program is built with; `access-tensor` reads it."""

    def __init__(self, tensor_shapes: dict):
        self.tensor_shapes = tensor_shapes
        self.shapes: dict[Term, AccessShape] = {}

    # ---- primitive constructors (one per op, shape-checked by the registry's rule) -----

    def make(self, op: str, *args) -> Term:
        """Term(op, args), its access shape computed by the op's shape rule (ShapeError
        when the arguments do not fit)."""
        term = Term(op, args)
        if term not in self.shapes:
            spec = OPS[op]
            arg_shapes = []
            for kind, value in zip(spec.signature, args):
                if kind == "expr":
                    arg_shapes.append(self.shapes[value])
                elif kind == "exprs":
                    arg_shapes.append(tuple(self.shapes[v] for v in value))
                elif kind == "access-shape":
                    arg_shapes.append(tuple(value.args))
            self.shapes[term] = spec.shape(term.args, arg_shapes, self.tensor_shapes)
        return term

    def shape(self, t: Term) -> AccessShape:
        return self.shapes[t]

    def dims(self, t: Term) -> tuple[int, ...]:
        it, item = self.shapes[t]
        return it + item

    def split(self, t: Term) -> int:
        return len(self.shapes[t][0])

    def tensor(self, name: str) -> Term:
        return self.make("access-tensor", name)

    def literal(self, value: float) -> Term:
        return self.make("access-literal", float(value))

    def compute(self, op: str, t: Term, *params) -> Term:
        return self.make("compute", Term(op, tuple(params)), t)

    # ---- layout helpers (no-ops skipped, chains collapsed) ------------------------------

    def at(self, t: Term, k: int) -> Term:
        """`(access t k)`: the first k dims iterated."""
        if self.split(t) == k:
            return t
        if t.op == "access":
            return self.at(t.args[0], k)
        return self.make("access", t, k)

    def transpose(self, t: Term, perm) -> Term:
        perm = tuple(int(p) for p in perm)
        if perm == tuple(range(len(perm))):
            return t
        if t.op == "access-transpose":        # compose: keeps the program one transpose deep
            inner = t.args[1]
            return self.transpose(t.args[0], tuple(inner[p] for p in perm))
        return self.make("access-transpose", t, perm)

    def reshape(self, t: Term, dims, k: int | None = None) -> Term:
        """Row-major reshape to `dims`, the first k (default all) iterated."""
        dims = tuple(int(d) for d in dims)
        k = len(dims) if k is None else k
        target = (dims[:k], dims[k:])
        if self.shapes[t] == target:
            return t
        # A reshape ignores the inner layout; inserting or squeezing a size-1 axis keeps the
        # elements' order, so a reshape reads through those too (an Unsqueezed per-channel
        # vector becomes the reshaped 1-D tensor the fusion rules match).
        while t.op in ("access-reshape", "access", "access-insert-axis", "access-squeeze"):
            t = t.args[0]
        if self.shapes[t] == target:
            return t
        if self.dims(t) == dims:
            return self.at(t, k)
        return self.make("access-reshape", t, Term("access-shape", target))

    def broadcast(self, t: Term, dims, k: int | None = None) -> Term:
        """Broadcast (same rank, size-1 dims repeated) to `dims`, the first k iterated."""
        dims = tuple(dims)
        k = len(dims) if k is None else k
        if self.dims(t) == dims:
            return self.at(t, k)
        return self.make("access-broadcast", t, Term("access-shape", (dims[:k], dims[k:])))

    def pad(self, t: Term, kind: str, axis: int, before: int, after: int) -> Term:
        if before == 0 and after == 0:
            return t
        return self.make("access-pad", t, Term(kind, ()), axis, int(before), int(after))

    def slice(self, t: Term, axis: int, lo: int, hi: int) -> Term:
        if lo == 0 and hi == self.dims(t)[axis]:
            return t
        return self.make("access-slice", t, axis, int(lo), int(hi))

    def gather(self, data: Term, indices: Term, axis: int) -> Term:
        """`access-gather`: data along `axis` at the (float32-carried) indices."""
        return self.make("access-gather", data, indices, int(axis))

    def squeeze(self, t: Term, axis: int) -> Term:
        return self.make("access-squeeze", t, axis)

    def insert_axis(self, t: Term, axis: int) -> Term:
        return self.make("access-insert-axis", t, axis)

    def windows(self, t: Term, window, strides, dilations=None) -> Term:
        window, strides = tuple(window), tuple(strides)
        if dilations is None or all(d == 1 for d in dilations):
            return self.make("access-windows", t, window, strides)
        return self.make("access-dilated-windows", t, window, strides, tuple(dilations))

    def concat(self, terms: list[Term], axis: int) -> Term:
        """Left-nested chain of access-concatenate; operands are split at full rank so
        their layouts agree."""
        acc = self.at(terms[0], len(self.dims(terms[0])))
        for t in terms[1:]:
            acc = self.make("access-concatenate", acc, self.at(t, len(self.dims(t))), axis)
        return acc

    # ---- numpy-style elementwise --------------------------------------------------------

    def expand(self, t: Term, out_dims) -> Term:
        """numpy broadcasting of t to out_dims: prepend 1s (reshape), then broadcast;
        the result is split with every dim iterated. A constant already broadcast (an
        equal-valued tensor as a literal over its dims, frontend/constants.py) is broadcast
        from its literal, in one step: the form a scalar gets, which rules match by value."""
        out_dims = tuple(out_dims)
        if t.op == "access-broadcast" and is_constant(t):
            t = t.args[0]          # broadcasts compose: its operand's dims broadcast to out_dims too
        dims = self.dims(t)
        if len(dims) < len(out_dims):
            t = self.reshape(t, (1,) * (len(out_dims) - len(dims)) + dims)
        return self.broadcast(t, out_dims)

    def elementwise(self, op: str, terms: list[Term]) -> Term:
        """`compute op` over numpy-broadcast operands: a chain of pairs, left to right
        (so n-ary Sum adds in ONNX's order)."""
        out = tuple(np.broadcast_shapes(*(self.dims(t) for t in terms)))
        acc = self.expand(terms[0], out)
        for t in terms[1:]:
            right = self.expand(t, out)
            if len(terms) == 2 and COMPUTE_OPS[op].commutative and is_constant(acc) and not is_constant(right):
                acc, right = right, acc     # canonical order: the constant second (exact: a op b == b op a)
            acc = self.compute(op, self.make("access-pair", acc, right))
        return acc

    def select(self, cond: Term, a: Term, other: Term) -> Term:
        """numpy-broadcast `where(cond != 0, a, other)`: the three operands broadcast to
        the output, each given a trailing size-1 axis made the item, concatenated into
        item (3,), `compute select` (as ONNX Where's lowering)."""
        terms = [cond, a, other]
        out = tuple(np.broadcast_shapes(*(self.dims(t) for t in terms)))
        parts = [self.at(self.insert_axis(self.expand(t, out), len(out)), len(out)) for t in terms]
        acc = parts[0]
        for p in parts[1:]:
            acc = self.make("access-concatenate", acc, p, len(out))
        return self.compute("select", acc)

    def channel(self, t: Term, rank: int) -> Term:
        """A per-channel 1-D vector (C,) shaped (1, C, 1, ...) for an NC... tensor."""
        (c,) = self.dims(t)
        return self.reshape(t, (1, c) + (1,) * (rank - 2))


def is_constant(t: Term) -> bool:
    """A literal, reshaped or broadcast: what a rule pattern writes as a constant operand."""
    while t.op in ("access-broadcast", "access-reshape"):
        t = t.args[0]
    return t.op == "access-literal"
