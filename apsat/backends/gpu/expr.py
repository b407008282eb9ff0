"""The expression IR of generated kernels: integer index expressions and float values.

Both code generators (Triton and CUDA C) render the same expressions, so the indexing a
kernel does is decided once, here and in views.py, and tested once under the Triton
interpreter.

Index expressions (`Ix`) are integers built from per-axis loop variables with +, * by a
constant, floor division and modulo by a constant. They are simplified as they are built,
using each expression's known range [lo, hi]: `x % d` vanishes when 0 <= x < d, `x // d`
becomes 0, and a sum divided by d splits off the terms whose coefficient d divides. That is
what turns the reshape chains of real programs (flatten, split heads, transpose, merge
heads) back into plain per-axis indexing instead of towers of div/mod. The ranges describe
the *valid* elements of a kernel; lanes past the end of a tile compute garbage indices
that every load masks off, so a simplification only has to hold for valid elements (this
is also why C's truncating division and Python's flooring one may be mixed: they differ
only for negative operands, which only masked-off lanes produce).

Value expressions are plain tuples, tag first, so they hash and compare structurally and
the emitters can share common sub-expressions (CSE):

    ("const", float)                       a float32 literal
    ("load", buffer, Ix, conds)            buffer[Ix]; conds: index conditions that must
                                           hold (padding), else the load is skipped and
                                           reads 0 (both renderers guarantee it)
    ("sym", name)                          a value the kernel skeleton defines (the
                                           accumulator "acc", a row's statistics)
    ("call", fn, *args)                    fn in UNARY or BINARY (below)
    ("where", cond, a, b)                  cond: an index condition, or a value condition
                                           ("nz", value) (value != 0) or ("vge", a, b)
                                           (a >= b)

Index conditions are ("ge", Ix, int) / ("lt", Ix, int) and are decided statically where
the ranges allow (then they never reach the generated code). The functions are those of
the registry's scalar formulas (apsat/lang/formula.py), which views.py translates here.
"""
from __future__ import annotations

from apsat.lang import formula as fm
from apsat.lang.formula import FUNCTIONS
from apsat.lang.primitives import PRIMITIVES

# The functions: exactly the registry formulas' (apsat/lang/formula.py FUNCTIONS).
UNARY = frozenset(fn for fn, n in FUNCTIONS.items() if n == 1)
BINARY = frozenset(fn for fn, n in FUNCTIONS.items() if n == 2)
VALUE_CONDITIONS = ("nz", "vge")


class Ix:
    """An integer index expression with a known range of valid values [lo, hi]. Build with
    var/const/add/mul/div/mod (never the constructor): they simplify as they go."""

    __slots__ = ("_deps", "_hash", "_key", "args", "hi", "lo", "op", "size", "values")

    def __init__(self, op, args, lo, hi):
        self.op, self.args, self.lo, self.hi, self._deps = op, args, lo, hi, None
        self._key = (op, args)
        kids = [b for a in args for b in (a if isinstance(a, tuple) else (a,)) if isinstance(b, Ix)]
        self.size = 1 + sum(b.size for b in kids)      # nodes as written out (a tree)
        # the gathered values it reads (op "value"): computed before the load they index
        self.values = (args[0],) if op == "value" else tuple(v for b in kids for v in b.values)
        # computed once: hashing the nested key anew each time is quadratic in the depth of
        # an expression (T5's relative-position gathers spent 15 s of 19 s in __hash__)
        self._hash = hash(self._key)

    def __eq__(self, other):
        return self is other or (isinstance(other, Ix) and self._hash == other._hash and self._key == other._key)

    def __hash__(self):
        return self._hash

    def __repr__(self):
        from apsat.backends.gpu.emit import render_ix
        return render_ix(self, "//")

    @property
    def const(self):
        """The value when the expression is a constant, else None."""
        return self.args[0] if self.op == "const" else None

    def deps(self) -> frozenset:
        """Names of the variables the expression reads (a gathered index: those its value's
        loads read). Computed once: kernels ask for every load's, and an index value's own
        loads are a walk of the value (Swin's shifted windows: 70 s uncached)."""
        if self._deps is None:
            if self.op in ("var", "value"):
                self._deps = frozenset([self.args[0]]) if self.op == "var" else frozenset().union(
                    *(v[2].deps().union(*(c[1].deps() for c in v[3])) for v in loads(self.args[0])))
            else:
                self._deps = frozenset().union(*(b.deps() for a in self.args for b in
                                                 (a if isinstance(a, tuple) else (a,)) if isinstance(b, Ix)))
        return self._deps
        out = frozenset()
        for a in self.args:
            if isinstance(a, Ix):
                out |= a.deps()
            elif isinstance(a, tuple):
                for b in a:
                    out |= b.deps()
        return out


def const(c: int) -> Ix:
    """The integer constant c."""
    return Ix("const", (int(c),), int(c), int(c))


def var(name: str, size: int) -> Ix:
    """A loop variable over 0..size-1 (a size-1 axis is the constant 0)."""
    return const(0) if size == 1 else Ix("var", (name,), 0, size - 1)


def gathered(value, n: int) -> Ix:
    """The position a gather reads along an axis of size n, from a float32-carried index
    value: NaN read as 0, rounded half up, a negative one counted from the end, clamped into
    [0, n) (evaluate.gather_indices, the reference's reading of the same rule)."""
    if n == 1:
        return const(0)
    if value[0] == "const":
        import numpy as np

        from apsat.lang.semantics import gather_indices
        return const(int(gather_indices(np.float32(value[1]), n)))
    zero, top = fconst(0.0), fconst(float(n - 1))
    r = call("floor", call("add", where(vge(value, value), value, zero), fconst(0.5)))
    w = where(vge(r, zero), r, call("add", r, fconst(float(n))))
    return Ix("value", (where(vge(w, zero), where(vge(w, top), top, w), zero), n), 0, n - 1)


def _terms(x: Ix) -> list[tuple[Ix | None, int]]:
    """x as a list of (factor, coefficient) with factor None for the constant part."""
    if x.op == "add":
        out = []
        for t in x.args[0]:
            out.extend(_terms(t))
        return out
    if x.op == "const":
        return [(None, x.args[0])]
    if x.op == "mul":
        return [(x.args[0], x.args[1])]
    return [(x, 1)]


def _from_terms(terms) -> Ix:
    """Sum of (factor, coefficient) terms, constants folded, like factors merged."""
    c, merged, order = 0, {}, []
    for f, k in terms:
        if f is None:
            c += k
        elif f in merged:
            merged[f] += k
        else:
            merged[f] = k
            order.append(f)
    parts = [mul(f, merged[f]) for f in order if merged[f] != 0]
    parts = [p for p in parts if p.const != 0]
    if c != 0 or not parts:
        parts.append(const(c))
    if len(parts) == 1:
        return parts[0]
    return Ix("add", (tuple(parts),), sum(p.lo for p in parts), sum(p.hi for p in parts))


def add(*xs: Ix | int) -> Ix:
    """Sum of index expressions (ints are constants)."""
    terms = []
    for x in xs:
        terms.extend(_terms(x if isinstance(x, Ix) else const(x)))
    return _from_terms(terms)


def mul(x: Ix, c: int) -> Ix:
    """x * c for a constant c >= 0 (distributed over sums, so div/mod can split them)."""
    if c == 0 or x.const == 0:
        return const(0)
    if c == 1:
        return x
    if c < 0:
        raise ValueError("index expressions only scale by non-negative constants")
    if x.op == "const":
        return const(x.args[0] * c)
    if x.op == "add":
        return _from_terms([(f, k * c) for f, k in _terms(x)])
    if x.op == "mul":
        return mul(x.args[0], x.args[1] * c)
    return Ix("mul", (x, c), x.lo * c, x.hi * c)


def div(x: Ix, d: int) -> Ix:
    """floor(x / d) for a constant d > 0."""
    if d == 1:
        return x
    if x.op == "const":
        return const(x.args[0] // d)
    if x.lo >= 0 and x.hi < d:
        return const(0)
    if x.op == "add" or x.op == "mul":
        terms = _terms(x)
        whole = [(f, k // d) for f, k in terms if k % d == 0]
        rest = [(f, k) for f, k in terms if k % d != 0]
        if whole:
            return add(_from_terms(whole), div(_from_terms(rest), d)) if rest else _from_terms(whole)
    if x.op == "div":       # (y // a) // d == y // (a * d) for the valid (non-negative) values
        return div(x.args[0], x.args[1] * d)
    return Ix("div", (x, d), x.lo // d, x.hi // d)


def mod(x: Ix, d: int) -> Ix:
    """x modulo a constant d > 0 (x >= 0 for valid elements)."""
    if d == 1:
        return const(0)
    if x.op == "const":
        return const(x.args[0] % d)
    if x.lo >= 0 and x.hi < d:
        return x
    if x.op == "add" or x.op == "mul":
        rest = [(f, k) for f, k in _terms(x) if k % d != 0]
        if len(rest) != len(_terms(x)):
            return mod(_from_terms(rest), d)
    return Ix("mod", (x, d), 0, d - 1)


def strides(dims) -> list[int]:
    """Row-major strides of dims."""
    out, s = [], 1
    for d in reversed(tuple(dims)):
        out.append(s)
        s *= d
    return out[::-1]


def flat(idx, dims) -> Ix:
    """Row-major offset of the index tuple idx in a contiguous array of shape dims."""
    return add(*[mul(i, s) for i, s in zip(idx, strides(dims))])


def unflat(offset: Ix, dims) -> tuple[Ix, ...]:
    """The index tuple of a row-major offset into shape dims (inverse of flat)."""
    out = []
    for k, (s, d) in enumerate(zip(strides(dims), dims)):
        q = div(offset, s)
        out.append(q if k == 0 and offset.hi < s * d else mod(q, d))
    return tuple(const(0) if d == 1 else o for o, d in zip(out, dims))


# ---- index conditions --------------------------------------------------------------------

def ge(x: Ix, c: int):
    """x >= c: True, False, or a condition for the generated code."""
    if x.lo >= c:
        return True
    if x.hi < c:
        return False
    return ("ge", x, c)


def lt(x: Ix, c: int):
    """x < c: True, False, or a condition for the generated code."""
    if x.hi < c:
        return True
    if x.lo >= c:
        return False
    return ("lt", x, c)


# ---- values --------------------------------------------------------------------------------

class Node(tuple):
    """A value node with value operands (call, where, vge): a tuple hashed once, and
    compared with an explicit stack. Why: a plain tuple's hash and == recurse through a
    fused chain thousands deep (quadratic hashing, RecursionError, C stack overflow)."""

    def __new__(cls, items):
        node = tuple.__new__(cls, items)
        node._hash = tuple.__hash__(node)
        return node

    def __hash__(self):
        return self._hash

    def __reduce__(self):       # the hash is per process (string hashing is salted)
        return (Node, (tuple(self),))

    def __eq__(self, other):
        pairs = [(self, other)]
        while pairs:
            a, b = pairs.pop()
            if a is b:
                continue
            if not isinstance(b, tuple) or len(a) != len(b) or hash(a) != hash(b):
                return False
            for x, y in zip(a, b):
                if isinstance(x, Node) or isinstance(y, Node):
                    pairs.append((x, y) if isinstance(x, tuple) else (y, x))
                elif x is not y and x != y:
                    return False
        return True

    def __ne__(self, other):
        return not self.__eq__(other)


def fconst(v: float) -> tuple:
    """A float32 literal."""
    return ("const", float(v))


def call(fn: str, *args) -> tuple:
    """fn applied to values; folded to a constant when every argument is one (so no
    generated code applies a function to two literals, which Triton would refuse)."""
    if fn not in UNARY and fn not in BINARY:
        raise ValueError(f"unknown kernel function {fn!r}")
    if all(a[0] == "const" for a in args):
        return fconst(_fold(fn, [a[1] for a in args]))
    return Node(("call", fn) + tuple(args))


DEFINED = frozenset(fn for fn, p in PRIMITIVES.items() if p.kernel is not None)


def defined(fn: str, args) -> tuple:
    """The value of primitive `fn`'s kernel definition (apsat/lang/primitives.py: max and
    min from comparisons and selects, as ONNX defines them at NaN and -0) with its operands
    bound to the values `args`. Each dialect writes it once, as a function of its own
    (triton.HELPERS, cuda.DEVICE_FUNCTIONS), which kernels call: expanding it in place
    would repeat an operand in three places, and a chain of maxima (a max pool's taps)
    would grow threefold with every tap."""
    return fm.interpret(fm.Formula(PRIMITIVES[fn].kernel), tuple(args), (), _DEFINITION)


def _fold(fn: str, xs: list[float]) -> float:
    """fn on float32 constants, rounded as the reference interpreter rounds (its numpy
    reading of the formula functions)."""
    import numpy as np

    from apsat.lang.semantics import NUMPY_FUNCTIONS

    with np.errstate(all="ignore"):
        return float(np.float32(NUMPY_FUNCTIONS[fn](*(np.float32(v) for v in xs))))


def vge(a, b):
    """The value condition a >= b; True or False when both are literals (folded, as
    `call` folds)."""
    if a[0] == "const" and b[0] == "const":
        import numpy as np

        return bool(np.float32(a[1]) >= np.float32(b[1]))
    return Node(("vge", a, b))


def where(cond, a, b) -> tuple:
    """a where cond holds, else b (cond: an index condition, True/False, or a value
    condition ("nz", value) / ("vge", a, b))."""
    if cond is True:
        return a
    if cond is False:
        return b
    return Node(("where", cond, a, b))


# how `defined` reads a definition: the kernel IR's own constructors
_DEFINITION = fm.Reading(const=fconst, call=call,
                         compare=lambda kind, a, b=None: ("nz", a) if kind == "nz" else vge(a, b),
                         select=where)


def value_nodes(value) -> list:
    """Every distinct value sub-expression, children first."""
    seen, order, stack = set(), [], [(value, False)]
    while stack:
        v, done = stack.pop()
        if done:
            order.append(v)
            continue
        if v in seen:
            continue
        seen.add(v)
        stack.append((v, True))
        for c in value_children(v):
            stack.append((c, False))
    return order


def value_children(v) -> tuple:
    """The value operands of a value expression (conditions' values included)."""
    tag = v[0]
    if tag == "call":
        return v[2:]
    if tag == "load":         # a gather's index values, computed before the load
        return v[2].values + tuple(u for c in v[3] for u in c[1].values)
    if tag == "where":
        cond = v[1]
        values = cond[1:] if isinstance(cond, tuple) and cond[0] in VALUE_CONDITIONS else ()
        return tuple(values) + (v[2], v[3])
    return ()


def loads(value) -> list[tuple]:
    """The load nodes of a value expression."""
    return [v for v in value_nodes(value) if v[0] == "load"]
