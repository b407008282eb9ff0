"""Terms to kernel expressions: access patterns become indexing, element-wise ops inline.

On the GPU no view is ever copied: `Values(...).value(term, idx)` is the value of `term` at
the index tuple `idx` (one Ix per dim of iterated ++ item), written as loads from the
buffers underneath. A transpose permutes the index, a reshape re-linearises it, windows
add the window offset to the output position times the stride, a slice adds its start,
a broadcast pins size-1 axes to 0, padding and concatenation become conditions (a padded
element is the pad value, never a load), a pair or cartesian product picks an operand by
the pair axis. Element-wise compute operators that the lowering chose to inline (a chain
of adds, multiplies and activations) become arithmetic on their operands' values, and so
does a `chain F G` operator (F's arithmetic, then G's on its value).

epilogue.py's `epilogue_path` and `invert_path` let a kernel (matmul or reduction)
compute an element-wise consumer chain in its epilogue.
"""
from __future__ import annotations

import math

from apsat.backends.gpu.expr import (Ix, add, call, const, fconst, flat, gathered, ge, lt, mul,
                                      unflat, vge, where)
from apsat.backends.gpu.folds import FOLD, NORMALISED, UNROLL_LIMIT, normalised, taps, unrolled
from apsat.lang import formula as fm
from apsat.lang.ops import COMPUTE_OPS, LOCAL_OPS, UNARY_MAPS, chain_parts
from apsat.lang.term import Term
from apsat.errors import ApsatError

# The registry's local operators (LOCAL_OPS) inline into a kernel; of them, the
# element-wise ones (ELEMENTWISE_OPS: one output element from the same element of the
# operand(s)) may also lie on an epilogue path, while lrn reads channel neighbours and
# may not. A chain reads its operand as its first part does (`leading`), unary or n-ary;
# its other parts are unary maps.


_UNKNOWN = object()      # Values._run: a read whose value is not memoised yet
INDEX_LIMIT = 400       # index expression nodes: a reshape chain's operand past it is copied out
UNROLLED_REDUCTIONS = frozenset(n for n, s in COMPUTE_OPS.items()
                                if s.kind in ("reduction", "contraction") and n in FOLD)


class Unsupported(ApsatError):
    """The GPU target cannot express a term; the lowering turns it into a host step."""


class NeedsBuffer(Unsupported):
    """A kernel cannot read `term` inline: a normalisation whose row statistics it cannot
    compute, or a view under reshapes that shuffle elements so often that the index
    expression outgrows INDEX_LIMIT (written out as a tree, it would double a level). The
    term gets a kernel (or a copy) of its own, and the reader is built again."""

    def __init__(self, term: Term, why: str):
        super().__init__(why)
        self.term = term


def dims_of(program, term: Term) -> tuple[int, ...]:
    """All dims (iterated ++ item) of a term's access shape."""
    it, item = program.shape_of(term)
    return tuple(it) + tuple(item)


def n_iter(program, term: Term) -> int:
    """Number of iterated dims of a term's access shape."""
    return len(program.shape_of(term)[0])


def is_elementwise(term: Term) -> bool:
    """A compute term whose operator is element-wise (may be inlined into a kernel)."""
    return term.op == "compute" and term.args[0].op in LOCAL_OPS


def leading(op: Term) -> str:
    """The name of the operator that reads a compute's operand: a chain's first part."""
    return chain_parts(op)[0].op


class Values:
    """Builds value expressions inside one kernel.

    buffers: term -> (buffer name, dims) for every materialised term (inputs, kernel and
    host-step results) the kernel may load from; fused: term -> value expression for the
    one producer whose result the kernel holds in registers (the epilogue case); stats:
    the row statistics registry to share with another Values of the same kernel."""

    def __init__(self, program, buffers: dict, fused: dict | None = None, stats: dict | None = None):
        self.program, self.buffers, self.fused = program, buffers, dict(fused or {})
        self.read: dict[str, tuple] = {}        # buffer name -> dims, in first-read order
        # (normalisation, row index) -> folds.RowStats the kernel computes first
        self.stats: dict = {} if stats is None else stats
        self._memo: dict = {}

    def dims(self, term):
        return dims_of(self.program, term)

    def value(self, term: Term, idx: tuple, conds: tuple = ()):
        """The value of `term` at index tuple `idx`; `conds` are the conditions under which
        the element is really read (padding), carried into every load below."""
        key = (term, tuple(idx), conds)
        if key not in self._memo:
            self._run(key, self._value(*key))
        return self._memo[key]

    def _run(self, key, reads):
        """Drive generator `reads` (yields the (term, idx, conds) it reads, is sent their values)
        on an explicit stack, memoised under `key` unless None: deep chains nest no frames."""
        stack, sent = [(key, reads)], None
        while True:
            k, gen = stack[-1]
            try:
                want = gen.send(sent)
            except StopIteration as done:
                stack.pop()
                sent = done.value
                if k is not None:
                    self._memo[k] = sent
                if not stack:
                    return sent
                continue
            want = (want[0], tuple(want[1]), want[2])
            sent = self._memo.get(want, _UNKNOWN)
            if sent is _UNKNOWN:
                stack.append((want, self._value(*want)))
                sent = None

    def _value(self, t: Term, idx: tuple, conds: tuple):
        """A generator (see _run): yields the reads `t` at idx needs, returns its value."""
        if t in self.fused:
            return self.fused[t]
        if t in self.buffers:
            name, dims = self.buffers[t]
            self.read.setdefault(name, dims)
            return ("load", name, flat(idx, dims), conds)
        op = t.op
        if op == "access-literal":
            return fconst(t.args[0])
        if op == "access":
            return (yield t.args[0], idx, conds)
        child = t.args[0] if t.args and isinstance(t.args[0], Term) else None
        if op == "access-transpose":     # dim k of t is dim perm[k] of the child
            return (yield child, tuple(idx[t.args[1].index(p)] for p in range(len(idx))), conds)
        if op in ("access-reshape", "access-flatten"):
            return (yield child, self._reshaped(t, child, idx), conds)
        if op in ("access-squeeze", "access-insert-axis"):
            a = t.args[1]
            return (yield child, idx[:a] + (const(0),) + idx[a:] if op == "access-squeeze" else idx[:a] + idx[a + 1:],
                    conds)
        if op == "access-slice":
            _, axis, lo, _hi = t.args
            return (yield child, idx[:axis] + (add(idx[axis], lo),) + idx[axis + 1:], conds)
        if op == "access-broadcast":
            cd, d = self.dims(child), self.dims(t)
            return (yield child, tuple(const(0) if c == 1 and n != 1 else i
                                       for i, c, n in zip(idx, cd, d)), conds)
        if op in ("access-windows", "access-dilated-windows"):
            return (yield self._windows(t, idx, conds))
        if op == "access-gather":
            data, index, axis = t.args
            k = len(self.dims(index))
            at = gathered((yield index, idx[axis:axis + k], conds), self.dims(data)[axis])
            return (yield data, idx[:axis] + (at,) + idx[axis + k:], conds)
        if op == "access-pad":
            return (yield from self._pad(t, idx, conds))
        if op == "access-concatenate":
            return (yield from self._concatenate(t, idx, conds))
        if op == "access-pair":
            n = n_iter(self.program, t)
            return (yield from self._pick(idx[n], [(a, idx[:n] + idx[n + 1:], conds) for a in t.args]))
        if op == "access-cartesian-product":
            a, b = t.args
            na, nb = n_iter(self.program, a), n_iter(self.program, b)
            item = idx[na + nb + 1:]
            operands = (idx[:na] + item, idx[na:na + nb] + item)
            return (yield from self._pick(idx[na + nb], [(t.args[k], operands[k], conds) for k in (0, 1)]))
        if op == "compute" and t.args[0].op in LOCAL_OPS:
            return (yield from self._apply(t.args[0], t.args[1], idx, conds))
        # a nested _run: a nest of these is bounded (each reads up to 27 values or a row)
        if op == "compute" and t.args[0].op in UNROLLED_REDUCTIONS:
            return self._unrolled(t, idx, conds)
        if op == "compute" and t.args[0].op in NORMALISED:
            return normalised(self, t, idx, conds)
        raise Unsupported(f"{op} cannot be read as a view inside a kernel")

    def _reshaped(self, t: Term, child: Term, idx: tuple) -> tuple:
        """The child's index tuple under reshape t; NeedsBuffer(child) when it would
        outgrow INDEX_LIMIT nodes (reshapes that shuffle elements, again and again)."""
        cd, d = self.dims(child), self.dims(t)
        c = idx if cd == d else unflat(flat(idx, d), cd)
        if max((x.size for x in c), default=0) > INDEX_LIMIT and child not in self.buffers:
            raise NeedsBuffer(child, f"reading through {t.op} needs an index of more than {INDEX_LIMIT} terms")
        return c

    def _pick(self, k: Ix, reads):
        """Operand 0 or 1 of a pair by pair-axis index k (static where known) of `reads`."""
        if k.const is not None:
            return (yield reads[k.const])
        return where(lt(k, 1), (yield reads[0]), (yield reads[1]))

    def _windows(self, t, idx, conds):
        """The (term, idx, conds) read of windows t at idx (position * stride + offset * dilation)."""
        child, window, wstrides = t.args[0], t.args[1], t.args[2]
        dil = t.args[3] if t.op == "access-dilated-windows" else (1,) * len(window)
        n, r = n_iter(self.program, child), len(window)
        pos, win = idx[n:n + r], idx[n + r:]
        inner = tuple(add(mul(p, s), mul(w, d)) for p, w, s, d in zip(pos, win, wstrides, dil))
        return child, idx[:n] + inner, conds

    def _pad(self, t, idx, conds):
        """Padding at idx: the fill outside, else the operand (a generator, see _run)."""
        child, ptype, axis, before, _after = t.args
        fill = fconst(0.0 if ptype.op == "zero-padding" else -math.inf)
        ci = add(idx[axis], -before)
        low, high = ge(ci, 0), lt(ci, self.dims(child)[axis])
        if low is False or high is False:
            return fill
        inner_conds = conds + tuple(c for c in (low, high) if c is not True)
        inner = yield child, idx[:axis] + (ci,) + idx[axis + 1:], inner_conds
        if inner[0] == "load" and fill == fconst(0.0):
            return inner         # the load itself is skipped, and reads 0, where padded
        return where(low, where(high, inner, fill), fill)

    def _concatenate(self, t, idx, conds):
        """Concatenation at idx: one operand's value, or a select of both (a generator)."""
        a, b, axis = t.args
        da = self.dims(a)[axis]
        first = lt(idx[axis], da)
        shifted = idx[:axis] + (add(idx[axis], -da),) + idx[axis + 1:]
        if first is True:
            return (yield a, idx, conds)
        if first is False:
            return (yield b, shifted, conds)
        return where(first, (yield a, idx, _narrowed(conds, first)),
                     (yield b, shifted, _narrowed(conds, ("ge", idx[axis], da))))

    def _unrolled(self, t, idx, conds):
        """A small reduction folded here (folds.unrolled), at most UNROLL_LIMIT values."""
        values = math.prod(taps(self.program, t))
        if values > UNROLL_LIMIT:
            raise Unsupported(f"{t.args[0].op} over {values} values is a kernel of its own, "
                              f"not unrolled (at most {UNROLL_LIMIT})")
        return unrolled(self, t, idx, conds)

    def _compute(self, t, idx, conds):
        """An inlined element-wise operator, in the float32 steps the reference takes."""
        return self._run(None, self._apply(*t.args, tuple(idx), conds))

    def _apply(self, opterm, x_term, idx, conds):
        """Operator `opterm` over operand x_term at idx (a chain: F, then each G, in a loop)."""
        first, *maps = chain_parts(opterm)
        name, params = first.op, first.args
        if name in UNARY_MAPS:
            v = unary(name, params, (yield x_term, idx, conds))
        elif name == "lrn":
            v = yield from self._lrn(x_term, n_iter(self.program, x_term), params, idx, conds)
        else:
            n = n_iter(self.program, x_term)
            ops = []
            for k in range(self.dims(x_term)[n]):
                ops.append((yield x_term, idx[:n] + (const(k),) + idx[n:], conds))
            v = nary(name, ops)
        for g in maps:
            v = unary(g.op, g.args, v)
        return v

    def _lrn(self, x_term, axis, params, idx, conds):
        """ONNX LRN over the channel axis: neighbours read at shifted indices, zero outside."""
        size, alpha, beta, bias = params
        channels = self.dims(x_term)[axis]
        total = None
        for off in range(-((size - 1) // 2), -(-(size - 1) // 2) + 1):
            ci = add(idx[axis], off)
            low, high = ge(ci, 0), lt(ci, channels)
            if low is False or high is False:
                continue
            inner_conds = conds + tuple(c for c in (low, high) if c is not True)
            v = yield x_term, idx[:axis] + (ci,) + idx[axis + 1:], inner_conds
            sq = where(low, where(high, call("mul", v, v), fconst(0.0)), fconst(0.0))
            total = sq if total is None else call("add", total, sq)
        scale = call("add", fconst(bias), call("mul", fconst(float(_f32(alpha / size))), total))
        return call("div", (yield x_term, idx, conds), pow_value(scale, fconst(beta)))

def _narrowed(conds: tuple, c) -> tuple:
    """conds and index condition c, less the bounds c makes redundant (same kind and index,
    no tighter). Why: a concat chain's loads would carry a bound per level (quadratic text)."""
    return tuple(d for d in conds if d[:2] != c[:2] or (d[2] < c[2] if c[0] == "lt" else d[2] > c[2])) + (c,)


def _f32(v: float) -> float:
    import numpy as np

    return float(np.float32(v))


def _call(fn: str, *args):
    """A formula's function as kernel values: `pow` through pow_value (literal exponents
    become multiplications), the others as they are."""
    return pow_value(*args) if fn == "pow" else call(fn, *args)


# How kernels read a registry formula (apsat/lang/formula.py): literals rounded to float32.
KERNEL = fm.Reading(
    const=lambda c: fconst(_f32(c)),
    call=_call,
    compare=lambda kind, a, b=None: ("nz", a) if kind == "nz" else vge(a, b),
    select=where,
)


def unary(name: str, params: tuple, x):
    """The value of unary map `name` with `params` applied to x: its registry formula, in
    the reference's float32 steps."""
    return fm.interpret(COMPUTE_OPS[name].scalar, (x,), params, KERNEL)


def pow_value(a, b):
    """a ** b; small constant exponents become multiplications (exact where the reference's
    float32 power is: squares of signed values, as layer norms exported with Pow have)."""
    if b[0] == "const":
        e = b[1]
        if e == 0.0:
            return fconst(1.0)
        if e == 1.0:
            return a
        if e == 2.0:
            return call("mul", a, a)
        if e == 3.0:
            return call("mul", call("mul", a, a), a)
        if e == 0.5:       # powf's edges: pow(-inf, 0.5) = inf, pow(-0, 0.5) = +0
            return where(vge(fconst(-math.inf), a), fconst(math.inf), call("add", call("sqrt", a), fconst(0.0)))
        if e == -1.0:
            return call("div", fconst(1.0), a)
    return call("pow", a, b)


def nary(name: str, ops: list):
    """The value of n-ary operator `name` over its operands' values: its registry formula,
    folded left to right over the operands when the operator takes two or more (like the
    reference)."""
    spec = COMPUTE_OPS[name]
    if spec.arity:
        return fm.interpret(spec.scalar, ops, (), KERNEL)
    acc = ops[0]
    for o in ops[1:]:
        acc = fm.interpret(spec.scalar, (acc, o), (), KERNEL)
    return acc
