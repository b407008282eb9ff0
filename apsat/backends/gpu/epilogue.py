"""Epilogue paths: a kernel (matmul or reduction) may compute an element-wise consumer chain
in its epilogue when the path from the chain's root down to the kernel consists of
point-wise steps and bijective views, so that the kernel can work out, for each element it
produced, where the chain's result for that element goes (`invert_path`).
"""
from __future__ import annotations

from apsat.backends.gpu.expr import const, flat, unflat
from apsat.backends.gpu.views import dims_of, leading, n_iter
from apsat.lang.ops import NARY_OPS, UNARY_MAPS
from apsat.lang.term import Term

_SAME_INDEX_VIEWS = frozenset({"access"})
_BIJECTIVE_VIEWS = frozenset({"access-reshape", "access-flatten", "access-squeeze",
                              "access-insert-axis", "access-transpose"})
# views through which a point-wise reader reads each element once
ONE_READ_VIEWS = _SAME_INDEX_VIEWS | _BIJECTIVE_VIEWS | {"access-pair"}


def epilogue_path(program, root: Term, is_candidate, uses, buffers) -> tuple | None:
    """(producer, steps) for the first kernel term a point-wise chain rooted at `root` reads
    through point-wise steps and bijective views only, else None.

    is_candidate(term): may this materialised term compute the chain in its epilogue?
    uses: term -> number of consumer slots; every term strictly between root and the
    producer must have one, so no other consumer needs the producer's own result.
    steps: (parent, child index) pairs from root down to the producer, for invert_path."""
    stack = [(root, None, ())]
    while stack:
        t, pending, steps = stack.pop()
        if t is not root:
            if t in buffers:
                if pending is None and is_candidate(t):
                    return t, steps
                continue
            if uses.get(t, 0) != 1:
                continue
        op = t.op
        nxt = []
        if op == "compute" and leading(t.args[0]) in UNARY_MAPS and pending is None:
            nxt = [(1, None)]
        elif op == "compute" and leading(t.args[0]) in NARY_OPS and pending is None:
            nxt = [(1, n_iter(program, t.args[1]))]
        elif op in _SAME_INDEX_VIEWS:
            nxt = [(0, pending)]
        elif op == "access-pair" and pending == n_iter(program, t):
            nxt = [(1, None), (0, None)]
        elif op in _BIJECTIVE_VIEWS and pending is None:
            nxt = [(0, None)]
        for pos, pend in nxt:
            stack.append((t.args[pos], pend, steps + ((t, pos),)))
    return None


def invert_path(program, steps: tuple, idx: tuple) -> tuple:
    """The root's index tuple of the element the producer computes at `idx`."""
    for parent, pos in reversed(steps):
        op, child = parent.op, parent.args[pos]
        if op == "compute" and leading(parent.args[0]) in NARY_OPS:
            n = n_iter(program, child)
            idx = idx[:n] + idx[n + 1:]
        elif op == "access-pair":
            n = n_iter(program, parent)
            idx = idx[:n] + (const(pos),) + idx[n:]
        elif op in ("access-reshape", "access-flatten"):
            cd, d = dims_of(program, child), dims_of(program, parent)
            idx = idx if cd == d else unflat(flat(idx, cd), d)
        elif op == "access-squeeze":
            a = parent.args[1]
            idx = idx[:a] + idx[a + 1:]
        elif op == "access-insert-axis":
            a = parent.args[1]
            idx = idx[:a] + (const(0),) + idx[a:]
        elif op == "access-transpose":
            idx = tuple(idx[p] for p in parent.args[1])
        # access and unary compute keep the index
    return idx
