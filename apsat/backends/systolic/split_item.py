"""Whole-item operators whose item does not fit a scratchpad half, in two levels.

A reduction, softmax, layer norm or RMS norm reads its whole item at once on the vector
unit (vector.py's `row` tiles). An item larger than half a scratchpad (PoolFormer's
GroupNorm(1) normalises all C x H x W values of an image together: 100,352 of them at
32 x 56 x 56) has no such tile. Here the item is cut into `a` chunks of `b` values (b the
largest divisor of the item that fits), and the operator becomes the language's own terms
over the chunks: a reduction of each chunk, then of the `a` partial results, and the
normalisations' element-wise steps over the data, each of which lowers as usual (a level
that still does not fit splits again). The expansion equals the operator's semantics in
real arithmetic (the mean of equal chunks' means is the mean); in float32 it sums in
another order, like any blocked reduction.
"""
from __future__ import annotations

import math

from apsat.lang.term import ATTRIBUTE_OPS, Term

SPLITTABLE = frozenset({"reduce-sum", "reduce-max", "reduce-mean", "softmax", "layer-norm", "rms-norm"})


class Terms:
    """Makes an expansion's terms and keeps the Expr ones, children first (`new`)."""

    def __init__(self):
        self.new: list = []

    def mk(self, op: str, *args) -> Term:
        """Term(op, args), recorded unless it is an attribute (an operator, a shape)."""
        u = Term(op, args)
        if op not in ATTRIBUTE_OPS:
            self.new.append(u)
        return u

    def compute(self, name: str, x: Term, *params) -> Term:
        """`compute (name params...) x`."""
        return self.mk("compute", Term(name, tuple(params)), x)


def shape(*groups) -> Term:
    """An `access-shape` term of the given dim groups (iterated, item)."""
    return Term("access-shape", tuple(tuple(g) for g in groups))


def chunk(m: int, cap: int) -> int:
    """The largest divisor b of m with 2 <= b <= cap and m // b > 1; 0 when there is none
    (m prime and past the cap: no split helps)."""
    best = 0
    for d in range(2, math.isqrt(m) + 1):
        if m % d == 0:
            for b in (d, m // d):
                if b <= cap and m // b > 1:
                    best = max(best, b)
    return best


def expansion(t: Term, it: tuple, item: tuple, b: int) -> tuple[Term, list]:
    """(root, new terms children first): `compute OP x` over x's item (prod(item) values)
    as two-level terms with chunks of b; the root has t's access shape ((it), item') with
    item' () for a reduction and `item` for the others."""
    op, x = t.args
    name, eps = op.op, (op.args[0] if op.args else 0.0)
    r, m = len(it), math.prod(item)
    a = m // b
    made = Terms()
    mk, compute, new = made.mk, made.compute, made.new

    chunks = mk("access-reshape", x, shape(tuple(it) + (a,), (b,)))        # ((it, a), (b))

    def reduce(n, u):
        """Two-level reduction of u ((it, a), (b)) -> ((it), ())."""
        partial = compute(n, u)                                            # ((it, a), ())
        return compute(n, mk("access", partial, r))                        # ((it), ())

    def spread(s):
        """A per-row scalar s ((it), ()) broadcast to the chunks' shape."""
        ones = mk("access-reshape", s, shape(tuple(it) + (1,), (1,)))
        return mk("access-broadcast", ones, shape(tuple(it) + (a,), (b,)))

    def zip2(n, u, v):
        return compute(n, mk("access-pair", u, v))

    if name in ("reduce-sum", "reduce-max", "reduce-mean"):
        return reduce(name, chunks), new
    if name == "softmax":
        e = compute("exp", zip2("elementwise-sub", chunks, spread(reduce("reduce-max", chunks))))
        out = zip2("elementwise-div", e, spread(reduce("reduce-sum", e)))
    elif name == "layer-norm":
        centred = zip2("elementwise-sub", chunks, spread(reduce("reduce-mean", chunks)))
        var = reduce("reduce-mean", zip2("elementwise-mul", centred, centred))
        out = zip2("elementwise-div", centred, spread(_root(compute, mk, var, eps, it)))
    elif name == "rms-norm":
        ms = reduce("reduce-mean", zip2("elementwise-mul", chunks, chunks))
        out = zip2("elementwise-div", chunks, spread(_root(compute, mk, ms, eps, it)))
    else:
        raise ValueError(f"{name} has no two-level expansion")
    return mk("access-reshape", out, shape(it, item)), new


def _root(compute, mk, v, eps: float, it: tuple):
    """sqrt(v + eps) for v ((it), ())."""
    eps_row = mk("access-reshape", mk("access-literal", float(eps)), Term("access-shape", ((1,) * len(it), ())))
    eps_term = mk("access-broadcast", eps_row, Term("access-shape", (tuple(it), ())))
    return compute("sqrt", compute("elementwise-add", mk("access-pair", v, eps_term)))


def lower_expansion(L, t: Term, root: Term, new: list, note: str) -> None:
    """Lower the terms `new` (children first, ending in `root`, which stands for t) into
    t's buffer. They are private to t: a term the program may hold elsewhere keeps its own
    buffer (the buffer map is restored after); t's operands, lowered before it, are read
    from their buffers. The groups it makes carry `note` (why t was expanded)."""
    from apsat.lang.ops import VIEW_OPS
    from apsat.lang.program import apply_shape_rule
    from apsat.lang.term import postorder

    producer = root        # a reshape of the result reads t's buffer as it lies: write it there
    while producer.op in ("access", "access-reshape"):
        producer = producer.args[0]
    inside = set(postorder(list(t.children())))
    private = [u for u in dict.fromkeys(new) if u not in inside]
    program = L.program
    shapes: dict = {}
    for u in private:
        shapes[u] = apply_shape_rule(u.op, u.args, lambda c: shapes[c] if c in shapes else program.shape_of(c),
                                     program.tensor_shapes)
    saved = {u: (L.buf_of.pop(u, None), L.placed.pop(u, None), L.const.pop(u, None)) for u in private}
    mark = len(L.stream.groups)
    L.program = _Extended(program, shapes)
    try:
        for u in private:
            L.const[u] = L._is_const(u)
            if u.op in VIEW_OPS:
                continue
            L.buf_of[u] = L.buf_of[t] if u is producer else L.new_buffer(L.dims(u))
            L._lower_or_host(u)
    finally:
        L.program = program
        for u, kept in saved.items():
            for table, value in zip((L.buf_of, L.placed, L.const), kept):
                if value is None:
                    table.pop(u, None)
                else:
                    table[u] = value
    for g in list(L.stream.groups.values())[mark:]:
        g.label += f" ({note})"


class _Extended:
    """The program seen with the shapes of an expansion's terms besides its own."""

    def __init__(self, program, shapes: dict):
        self._program, self._shapes = program, shapes

    def shape_of(self, term):
        """The term's access shape: the expansion's, else the program's."""
        return self._shapes[term] if term in self._shapes else self._program.shape_of(term)

    def __getattr__(self, name):
        return getattr(self._program, name)


def lower_split(L, t: Term, it: tuple, item: tuple, cap: int) -> bool:
    """Lower whole-item `compute OP x` (OP in SPLITTABLE) in two levels with chunks of at
    most `cap` values; False when no chunking helps (an item of a prime size past cap)."""
    if t.args[0].op not in SPLITTABLE:
        return False
    b = chunk(math.prod(item), cap)
    if not b:
        return False
    root, new = expansion(t, tuple(it), tuple(item), b)
    lower_expansion(L, t, root, new, f"item of {math.prod(item)} split into chunks of {b}")
    return True


def lower_as_matmul(L, t: Term) -> None:
    """`compute dot-product (access-cartesian-product a b)` that extraction left off the
    array (weight-only work such as Swin-V2's position-bias MLP, which the cost model does
    not weigh): both operands flattened to matrices, a ((M), (K)) and b ((N), (K)), the
    `systolic-array` atom the systolic rules write for a matrix product, and the result
    reshaped to t's dims."""
    a, b = t.args[1].args
    (ia, ta), (ib, _) = L.program.shape_of(a), L.program.shape_of(b)
    m, n, k = math.prod(ia), math.prod(ib), math.prod(ta)
    made = Terms()
    mk, new = made.mk, made.new

    left = mk("access-reshape", a, shape((m,), (k,)))
    right = mk("access", mk("access-transpose", mk("access-reshape", b, shape((n,), (k,))), (1, 0)), 0)
    product = mk("systolic-array", k, n, left, right)                      # ((M), (N))
    root = mk("access-reshape", product, shape(tuple(ia) + tuple(ib), ()))
    lower_expansion(L, t, root, new, "dot-product mapped onto the array here")
