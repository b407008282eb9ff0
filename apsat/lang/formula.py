"""Scalar formulas: what an element-wise operator computes for one element, written once.

A unary map (relu, gelu, leaky-relu, ...) or an n-ary operator (elementwise-add, select,
...) declares in its registry entry (`ComputeSpec.scalar`, apsat/lang/ops.py) the arithmetic
it does on one element, as a formula over its operands and literal parameters. Every part
that needs that arithmetic reads it from there through `interpret`: the reference semantics
(apsat/lang/semantics.py evaluates it with numpy, in float32), the GPU backend (translated
into its expression IR, which Triton and CUDA C both render), and the operator's FLOP figure
(`flops`). So an element-wise operator built from FUNCTIONS needs no backend edit.

A formula is a `Formula` wrapping a tuple tree:

    ("arg", i)              operand i (a unary map has one, X; an n-ary operator X0, X1, ...)
    ("param", i)            the operator's i-th literal parameter, rounded to float32
    ("const", c)            a literal, rounded to float32
    ("call", fn, f, ...)    fn in FUNCTIONS applied to formulas
    ("select", c, a, b)     a where condition c holds, else b

and a condition is ("nz", f) (f != 0, true for NaN) or ("ge", f, g) (f >= g, false where
either is NaN). Python's operators build formulas, `X * ((erf(X / SQRT2) + 1.0) * 0.5)` is
gelu: each operator is one float32 step in the order written, and nothing ever
reassociates them, so every reading rounds alike.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from apsat.lang.primitives import PRIMITIVES

# The primitive functions, by arity, and the arithmetic of one evaluation of each: read from
# their one table (apsat/lang/primitives.py), which also says what each gives at NaN, +-inf
# and -0, and how the reference, the kernels and the export compute it. They are exactly
# the GPU expression IR's functions (apsat/backends/gpu/expr.py).
FUNCTIONS = {name: p.arity for name, p in PRIMITIVES.items()}
FUNCTION_FLOPS = {name: p.flops for name, p in PRIMITIVES.items()}
# A select costs one. An operator's FLOP figure is the sum over its formula (`flops`).
SELECT_FLOPS = 1
CONDITIONS = ("nz", "ge")
SQRT2 = math.sqrt(2.0)


@dataclass(frozen=True)
class Formula:
    """A scalar formula (the module doc's tuple tree in `node`); build with X, arg, param,
    the functions below and Python's arithmetic operators."""

    node: tuple

    def __add__(self, other):
        return call("add", self, other)

    def __radd__(self, other):
        return call("add", other, self)

    def __sub__(self, other):
        return call("sub", self, other)

    def __rsub__(self, other):
        return call("sub", other, self)

    def __mul__(self, other):
        return call("mul", self, other)

    def __rmul__(self, other):
        return call("mul", other, self)

    def __truediv__(self, other):
        return call("div", self, other)

    def __rtruediv__(self, other):
        return call("div", other, self)

    def __neg__(self):
        return call("neg", self)

    def __ge__(self, other):
        """The condition self >= other (for `select`), not a comparison of formulas."""
        return Formula(("ge", self.node, lift(other).node))


def lift(value) -> Formula:
    """A formula as is; a number as a literal."""
    if isinstance(value, Formula):
        return value
    if isinstance(value, (int, float)):
        return Formula(("const", float(value)))
    raise TypeError(f"not a formula: {value!r}")


def arg(i: int) -> Formula:
    """Operand i of the operator."""
    return Formula(("arg", i))


def param(i: int) -> Formula:
    """The operator's i-th literal parameter."""
    return Formula(("param", i))


X = arg(0)


def call(fn: str, *args) -> Formula:
    """fn (one of FUNCTIONS) applied to formulas or numbers."""
    if FUNCTIONS.get(fn) != len(args):
        raise ValueError(f"formula: {fn} is not a function of {len(args)} arguments")
    return Formula(("call", fn) + tuple(lift(a).node for a in args))


def nz(f) -> Formula:
    """The condition f != 0."""
    return Formula(("nz", lift(f).node))


def select(cond: Formula, a, b) -> Formula:
    """a where `cond` (a `>=` or `nz` condition) holds, else b."""
    if cond.node[0] not in CONDITIONS:
        raise ValueError(f"select: {cond.node[0]!r} is not a condition ({', '.join(CONDITIONS)})")
    return Formula(("select", cond.node, lift(a).node, lift(b).node))


def maximum(a, b) -> Formula:
    return call("max", a, b)


def minimum(a, b) -> Formula:
    return call("min", a, b)


def power(a, b) -> Formula:
    return call("pow", a, b)


def neg(a) -> Formula:
    return call("neg", a)


def sqrt(a) -> Formula:
    return call("sqrt", a)


def exp(a) -> Formula:
    return call("exp", a)


def erf(a) -> Formula:
    return call("erf", a)


def tanh(a) -> Formula:
    return call("tanh", a)


def sigmoid(a) -> Formula:
    return call("sigmoid", a)


def absolute(a) -> Formula:
    """|a|."""
    return call("abs", a)


def log(a) -> Formula:
    """Natural logarithm."""
    return call("log", a)


def log1p(a) -> Formula:
    """log(1 + a), accurate for small a."""
    return call("log1p", a)


def recip(a) -> Formula:
    """1 / a."""
    return call("recip", a)


def floor(a) -> Formula:
    """Round toward -inf."""
    return call("floor", a)


def ceil(a) -> Formula:
    """Round toward +inf."""
    return call("ceil", a)


def cos(a) -> Formula:
    """Cosine."""
    return call("cos", a)


def sin(a) -> Formula:
    """Sine."""
    return call("sin", a)


def fmod(a, b) -> Formula:
    """C's fmodf: a - trunc(a / b) * b, exactly (the sign of a)."""
    return call("fmod", a, b)


# ---- reading a formula ----------------------------------------------------------------------

@dataclass(frozen=True)
class Reading:
    """How a backend reads formulas: `const(c)` a literal (parameters included), `call(fn,
    *values)` a function, `compare(kind, *values)` a condition ("nz", "ge"), `select(cond,
    a, b)`. `interpret` applies them bottom-up."""

    const: Callable
    call: Callable
    compare: Callable
    select: Callable


def interpret(formula: Formula, operands, params, reading: Reading):
    """The value of `formula` with its operands and literal parameters bound, built with
    `reading`'s constructors. A sub-formula used twice is built once."""
    return _build(formula.node, operands, params, reading, {})


def _build(node, operands, params, reading: Reading, memo: dict):
    """interpret's walk (a plain function, not a closure over `memo`: a recursive closure
    is a reference cycle, which would keep every intermediate value alive until the next
    garbage collection)."""
    if node in memo:
        return memo[node]
    tag = node[0]
    if tag == "arg":
        out = operands[node[1]]
    elif tag == "param":
        out = reading.const(float(params[node[1]]))
    elif tag == "const":
        out = reading.const(node[1])
    else:
        kids = [_build(n, operands, params, reading, memo) for n in node[2 if tag == "call" else 1:]]
        if tag == "call":
            out = reading.call(node[1], *kids)
        elif tag in CONDITIONS:
            out = reading.compare(tag, *kids)
        elif tag == "select":
            out = reading.select(*kids)
        else:
            raise ValueError(f"formula: unknown node {tag!r}")
    memo[node] = out
    return out


def nodes(formula: Formula) -> list[tuple]:
    """Every node of the formula, each distinct one once."""
    seen, stack = {}, [formula.node]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen[node] = None
        if node[0] == "call":
            stack.extend(node[2:])
        elif node[0] in CONDITIONS + ("select",):
            stack.extend(node[1:])
    return list(seen)


def flops(formula: Formula) -> int:
    """Arithmetic of one evaluation: FUNCTION_FLOPS of every call and SELECT_FLOPS of
    every select (a shared sub-formula counts once, as generated kernels compute it)."""
    return sum(FUNCTION_FLOPS[n[1]] if n[0] == "call" else SELECT_FLOPS
               for n in nodes(formula) if n[0] in ("call", "select"))


def functions(formula: Formula) -> set[str]:
    """The primitive functions the formula calls."""
    return {n[1] for n in nodes(formula) if n[0] == "call"}


def operand_count(formula: Formula) -> int:
    """Operands the formula reads (1 + the largest operand index)."""
    return 1 + max((n[1] for n in nodes(formula) if n[0] == "arg"), default=-1)


def param_count(formula: Formula) -> int:
    """Literal parameters the formula reads (1 + the largest parameter index)."""
    return 1 + max((n[1] for n in nodes(formula) if n[0] == "param"), default=-1)
