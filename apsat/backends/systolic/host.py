"""HOST steps: a program node the accelerator cannot run (lower.py says when), computed on
the host by the reference interpreter.

A HOST instruction carries the node's term with every materialised sub-term replaced by
its DRAM buffer, re-accessed at the same split, so the host reads buffers, never the
program's own sub-terms; the opaque ONNX nodes the term calls are copied into the stream.
"""
from __future__ import annotations

import math

from apsat.backends.systolic import inplace
from apsat.backends.systolic.isa import Host
from apsat.lang.syntax import to_text
from apsat.lang.term import ATTRIBUTE_OPS, Term


def emit_host(L, t: Term, reason: str) -> None:
    """A HOST step of lowering `L` computing `t` into its buffer, `reason` recorded."""
    memo: dict[Term, Term] = {}
    used: set[str] = set()
    term = _over_buffers(L, t, t, memo, used)
    for x in memo:
        if x.op == "opaque":
            L.stream.opaque[x.args[0]] = L.program.opaque_nodes[x.args[0]]
    macs = _host_macs(L.program, t)
    reads = sum(L.stream.buffers[b].size for b in used)
    L.begin(t, "host", t.args[0].op if t.op == "compute" else t.op)
    L.emit(Host(L.buf_of[t], to_text(term), reads, macs, reason, L.tag))


def _host_macs(program, t: Term) -> int:
    """The MACs of `t` when it is a dot-product (the host's arithmetic the cycle model
    counts), else 0."""
    if t.op == "compute" and t.args[0].op == "dot-product":
        it, item = program.shape_of(t.args[1])
        return math.prod(it) * math.prod(item) // 2
    return 0


def _over_buffers(L, x: Term, t: Term, memo: dict, used: set) -> Term:
    """`x` with its materialised sub-terms (other than `t`, the node being computed)
    replaced by their buffers; memoised in `memo`, the buffers read added to `used`.
    Children first on an explicit stack, in depth-first order (why: a host step may read a
    chain of views thousands of terms deep, which recursion would follow frame by frame)."""
    stack = [x]
    while stack:
        y = stack[-1]
        if y in memo:
            stack.pop()
        elif y is not t and y in L.buf_of:
            used.add(L.buf_of[y])
            memo[stack.pop()] = inplace.host_operand(L, y, L.buf_of[y])
        elif y.op == "access-tensor":
            b = L.tensor_buffer(y.args[0])
            used.add(b)
            memo[stack.pop()] = Term("access-tensor", (b,))
        else:
            kids = [b for a in y.args for b in ((a,) if isinstance(a, Term) and a.op not in ATTRIBUTE_OPS else
                                                a if isinstance(a, tuple) and a and isinstance(a[0], Term) else ())]
            todo = [k for k in kids if k not in memo]
            stack.extend(reversed(todo))
            if not todo:
                memo[stack.pop()] = Term(y.op, tuple(
                    memo[a] if isinstance(a, Term) and a.op not in ATTRIBUTE_OPS else
                    tuple(memo[b] for b in a) if isinstance(a, tuple) and a and isinstance(a[0], Term) else a
                    for a in y.args))
    return memo[x]
