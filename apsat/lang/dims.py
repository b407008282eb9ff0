"""Symbolic dims: integer polynomials over named symbols, each with a representative value.

A model exported with a dynamic batch or sequence has dims that are names (`batch_size`,
`sequence_length`). apsat builds and saturates the program at one representative value per
symbol (apsat.frontend.symbols); a `Dim` is what such a dim, or a dim computed from it
(`batch_size*sequence_length*32`, `sequence_length - 2`), is for every value of the symbols.
Dims duck-type as ints for the registry's Python shape rules (apsat/lang/shapes.py): sums,
products and exact division stay symbolic; an order comparison (`span <= d`) is decided at
the representative values, which the program was built at; a floor division that is not
exact for every value raises NotGeneral, as do mixed-in floats.

Why not sympy: only integer polynomials are needed, compared and hashed many thousands of
times per model; a dict of monomials is 30 lines and a hundred times faster.
"""
from __future__ import annotations

from apsat.errors import ApsatError

Monomial = tuple[tuple[str, int], ...]      # ((symbol, exponent), ...) sorted; () is 1


class NotGeneral(ApsatError):
    """The program (or its export) holds only at the representative sizes: the message
    says which term or constant ties it to them."""


def _mono_mul(a: Monomial, b: Monomial) -> Monomial:
    exps = dict(a)
    for s, e in b:
        exps[s] = exps.get(s, 0) + e
    return tuple(sorted(exps.items()))


class Dim:
    """sum(coefficient * monomial); `rep` is its value at the representative sizes."""

    __slots__ = ("terms", "rep")

    def __init__(self, terms: dict[Monomial, int], rep: int):
        self.terms = {m: c for m, c in terms.items() if c}
        self.rep = rep

    @staticmethod
    def symbol(name: str, rep: int) -> "Dim":
        return Dim({((name, 1),): 1}, rep)

    @staticmethod
    def of(value) -> "Dim":
        if isinstance(value, Dim):
            return value
        if isinstance(value, bool) or not isinstance(value, int):
            raise NotGeneral(f"a dim computed with {value!r}, not an integer")
        return Dim({(): value} if value else {}, value)

    # ---- what it is ----------------------------------------------------------------------
    @property
    def is_const(self) -> bool:
        return all(m == () for m in self.terms)

    def symbols(self) -> set[str]:
        return {s for m in self.terms for s, _ in m}

    def at(self, values: dict[str, int]) -> int:
        """The value for the symbols' `values`."""
        total = 0
        for mono, c in self.terms.items():
            v = c
            for s, e in mono:
                v *= values[s] ** e
            total += v
        return total

    def __int__(self) -> int:
        if not self.is_const:
            raise NotGeneral(f"dim {self} is used where a fixed size is needed")
        return self.rep

    def __index__(self) -> int:
        return self.__int__()

    # ---- arithmetic ----------------------------------------------------------------------
    def __add__(self, other):
        o = Dim.of(other)
        terms = dict(self.terms)
        for m, c in o.terms.items():
            terms[m] = terms.get(m, 0) + c
        return Dim(terms, self.rep + o.rep)

    __radd__ = __add__

    def __neg__(self):
        return Dim({m: -c for m, c in self.terms.items()}, -self.rep)

    def __sub__(self, other):
        return self + (-Dim.of(other))

    def __rsub__(self, other):
        return Dim.of(other) - self

    def __mul__(self, other):
        o = Dim.of(other)
        terms: dict[Monomial, int] = {}
        for ma, ca in self.terms.items():
            for mb, cb in o.terms.items():
                m = _mono_mul(ma, mb)
                terms[m] = terms.get(m, 0) + ca * cb
        return Dim(terms, self.rep * o.rep)

    __rmul__ = __mul__

    def __floordiv__(self, other):
        o = Dim.of(other)
        if not o.is_const:
            raise NotGeneral(f"{self} divided by the symbolic {o}")
        k = o.rep
        if k and all(c % k == 0 for c in self.terms.values()):
            return Dim({m: c // k for m, c in self.terms.items()}, self.rep // k)
        if self.is_const:
            return Dim.of(self.rep // k)
        raise NotGeneral(f"({self}) // {k} is not a polynomial in the symbols")

    def __rfloordiv__(self, other):
        return Dim.of(other) // self

    def __mod__(self, other):
        q = self // other              # exact or NotGeneral: the remainder is then 0
        return self - q * other

    # ---- comparison: equality is symbolic, order is at the representative values -------
    def __eq__(self, other):
        if isinstance(other, (Dim, int)) and not isinstance(other, bool):
            return self.terms == Dim.of(other).terms
        return NotImplemented

    def __hash__(self):
        if self.is_const:
            return hash(self.rep)
        return hash(frozenset(self.terms.items()))

    def __lt__(self, other):
        return self.rep < Dim.of(other).rep

    def __le__(self, other):
        return self.rep <= Dim.of(other).rep

    def __gt__(self, other):
        return self.rep > Dim.of(other).rep

    def __ge__(self, other):
        return self.rep >= Dim.of(other).rep

    def __repr__(self) -> str:
        if not self.terms:
            return "0"
        parts = []
        for mono, c in sorted(self.terms.items(), key=lambda mc: (-len(mc[0]), mc[0])):
            names = "*".join(s if e == 1 else f"{s}^{e}" for s, e in mono)
            if not names:
                parts.append(str(c))
            else:
                parts.append(names if c == 1 else f"-{names}" if c == -1 else f"{c}*{names}")
        return " + ".join(parts).replace("+ -", "- ")


def simplest(value):
    """A constant Dim as its int, anything else unchanged."""
    return value.rep if isinstance(value, Dim) and value.is_const else value


def at(value, values: dict[str, int]):
    """An int, a Dim or a nested tuple of them, evaluated at `values`."""
    if isinstance(value, Dim):
        return value.at(values)
    if isinstance(value, tuple):
        return tuple(at(v, values) for v in value)
    return value


def is_symbolic(value) -> bool:
    """Whether an int, Dim or nested tuple of them depends on a symbol."""
    if isinstance(value, Dim):
        return not value.is_const
    if isinstance(value, tuple):
        return any(is_symbolic(v) for v in value)
    return False


def parse(text: str, symbols: dict[str, "Dim"]):
    """A dim_param as exporters write them: a name (`batch_size`) or an expression of
    names and whole numbers with + - * (`past_sequence_length + sequence_length`, as
    optimum's decoder exports). Returns the Dim over `symbols` (name -> Dim.symbol); a
    name not in `symbols` raises KeyError; other text NotGeneral."""
    import ast

    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        raise NotGeneral(f"dim {text!r} is not a name or an expression of names") from None

    def walk(node):
        if isinstance(node, ast.Name):
            return symbols[node.id]
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return Dim.of(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult)):
            a, b = walk(node.left), walk(node.right)
            return a + b if isinstance(node.op, ast.Add) else a - b if isinstance(node.op, ast.Sub) else a * b
        raise NotGeneral(f"dim {text!r} is not a name or an expression of names with + - *")

    return walk(tree)


def names_in(text: str) -> list[str]:
    """The symbol names a dim_param uses: itself when it is one name (any spelling ONNX
    allows, `N`, `batch-size`), else the identifiers of its expression."""
    import re

    if not re.search(r"[+*]|\s-\s", text):
        return [text]
    return list(dict.fromkeys(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text)))


def is_expression(text: str) -> bool:
    return names_in(text) != [text]


def is_prime(n: int) -> bool:
    """Whether n is a prime: representatives and probe sizes are, so that no tile divides
    them and each size names the symbols it came from."""
    return n >= 2 and all(n % p for p in range(2, int(n ** 0.5) + 1))
