"""Rendering value expressions as statements, shared by the Triton and CUDA generators.

A kernel's values (apsat/backends/gpu/expr.py) are DAGs: gelu reads its operand twice, a
pair of views reads one buffer at two indices, a layer norm's epilogue reads the same
scale for every use. `emit` walks them children first and gives every load, call and
select one temporary, so each is computed once, and returns the statements plus the text
of each requested value. A dialect says how one node is written (`Dialect` below).
"""
from __future__ import annotations

from abc import ABC, abstractmethod

from apsat.backends.gpu.expr import Ix, defined, value_nodes
from apsat.lang.formula import FUNCTIONS


class Dialect(ABC):
    """How one value node is written in a target language. Subclasses set `floordiv`
    and implement the node renderers; `load` gets the offset text and the texts of the
    conditions that must hold (plus whether the load depends on loop variables)."""

    floordiv = "//"
    indent_unit = "    "       # one block level (Triton's Python; CUDA C uses two spaces)

    def ix(self, x, index=None) -> str:
        """Text of an index expression (`index` as render_ix's)."""
        return render_ix(x, self.floordiv, index)

    def cond(self, c, index=None) -> str:
        """Text of an index condition ("ge"/"lt" tuples)."""
        return render_cond(c, self.floordiv, index)

    int_cast = "{}"        # a whole float value as an integer index, in the dialect

    def gather_index(self, v: str, n: int) -> str:
        """Text of the integer position a gather reads along an axis of size n from v, the
        name of a whole float value already in [0, n) (expr.gathered computes it)."""
        return self.int_cast.format(v)

    @abstractmethod
    def const(self, v: float) -> str:
        """Text of a float32 constant."""

    @abstractmethod
    def load(self, buf: str, offset: str, conds: list[str], varying: bool) -> str:
        """Text of a (masked, where `conds` is not empty) load of buf[offset]."""

    @abstractmethod
    def call(self, fn: str, args: list[str], nodes: tuple = ()) -> str:
        """Text of fn(args); `nodes` are the argument expressions (to spot literals)."""

    @abstractmethod
    def where(self, cond: str, a: str, b: str) -> str:
        """Text of `a if cond else b`, element-wise."""

    def nz(self, a: str) -> str:
        """Condition text: a != 0."""
        return f"({a} != 0)"

    def ge(self, a: str, b: str) -> str:
        """Condition text: a >= b (values)."""
        return f"({a} >= {b})"

    @abstractmethod
    def assign(self, name: str, text: str) -> str:
        """A statement binding `name` to `text`."""


def emit(dialect: Dialect, values: dict, syms: dict, prefix: str) -> tuple[list[str], dict]:
    """Statements computing `values` (key -> value expression) and key -> text of each
    result. `syms` maps ("sym", name) names to their text in the kernel; temporaries are
    named prefix0, prefix1, ..."""
    text: dict = {}
    lines: list[str] = []
    for v in values.values():
        for node in value_nodes(v):
            if node in text:
                continue
            tag = node[0]
            if tag == "const":
                text[node] = dialect.const(node[1])
                continue
            if tag == "sym":
                text[node] = syms[node[1]]
                continue
            if tag == "load":
                _, buf, off, conds = node
                deps = off.deps()
                for c in conds:
                    deps |= c[1].deps()
                def index(value, n):
                    return dialect.gather_index(text[value], n)
                rendered = dialect.load(buf, dialect.ix(off, index), [dialect.cond(c, index) for c in conds],
                                        bool(deps))
            elif tag == "call":
                rendered = dialect.call(node[1], [text[a] for a in node[2:]], node[2:])
            elif tag == "where":
                rendered = dialect.where(_condition(dialect, node[1], text), text[node[2]], text[node[3]])
            else:
                raise AssertionError(f"unknown value node {tag!r}")
            name = f"{prefix}{len(lines)}"
            lines.append(dialect.assign(name, rendered))
            text[node] = name
    return lines, {k: text[v] for k, v in values.items()}


def _condition(dialect: Dialect, c, text: dict) -> str:
    """Text of a where's condition: a value condition over rendered values, or an index one."""
    if c[0] == "nz":
        return dialect.nz(text[c[1]])
    if c[0] == "vge":
        return dialect.ge(text[c[1]], text[c[2]])
    return dialect.cond(c, lambda value, n: dialect.gather_index(text[value], n))


def indent(lines, n=1, unit="    ") -> list[str]:
    """`lines` indented n block levels of `unit` (a dialect's `indent_unit`)."""
    return [unit * n + ln for ln in lines]


def axis_defs(dialect: Dialect, prefix: str, dims, flat_var, assign, used=None) -> list[str]:
    """Definitions of the loop variables prefix0, prefix1, ... of a group of axes `dims`
    from their row-major flat index `flat_var` (an Ix var). Size-1 axes get none (their
    index is the constant 0 wherever it is used), nor do variables outside `used` (a set
    of names, None for all): C compilers warn about unused ones."""
    from apsat.backends.gpu.expr import unflat

    out = []
    for i, (d, e) in enumerate(zip(dims, unflat(flat_var, dims))):
        if d > 1 and (used is None or f"{prefix}{i}" in used):
            out.append(assign(f"{prefix}{i}", dialect.ix(e)))
    return out


def used_vars(*items) -> set:
    """Loop-variable names read by value expressions and index expressions (None skipped)."""


    out: set = set()
    for item in items:
        if item is None:
            continue
        if isinstance(item, Ix):
            out |= item.deps()
            continue
        for v in value_nodes(item):
            if v[0] == "load":
                out |= v[2].deps()
                for c in v[3]:
                    out |= c[1].deps()
            elif v[0] == "where" and v[1][0] in ("ge", "lt"):
                out |= v[1][1].deps()
    return out


def defined_body(dialect: Dialect, fn: str) -> tuple[list[str], str]:
    """(statements, result text) of primitive `fn`'s kernel definition (expr.defined) over
    operands named a, b: the body of the function a dialect writes for it."""
    names = ["a", "b"][: FUNCTIONS[fn]]
    lines, texts = emit(dialect, {"y": defined(fn, [("sym", n) for n in names])}, {n: n for n in names}, "t")
    return lines, texts["y"]


# ---- rendering of index expressions ----------------------------------------------------------

def render_ix(x: Ix, floordiv: str, index=None) -> str:
    """Source text of an index expression; `floordiv` is the dialect's integer division
    operator ("//" in Triton, "/" in C); `index(value, n)` writes a gathered position (the
    dialect's reading of the value's temporary)."""
    op = x.op
    if op == "value":
        return index(*x.args) if index is not None else f"index({x.args[0]!r}, {x.args[1]})"
    if op == "const":
        return str(x.args[0])
    if op == "var":
        return x.args[0]
    if op == "add":
        parts = [render_ix(t, floordiv, index) for t in x.args[0]]
        text = parts[0]
        for p in parts[1:]:
            text += f" - {p[1:]}" if p.startswith("-") else f" + {p}"
        return f"({text})"
    if op == "mul":
        return f"{_atom(x.args[0], floordiv, index)} * {x.args[1]}"
    if op in ("div", "mod"):
        a, d = x.args
        # Both dialects' `//`/`/` and `%` round toward zero; the simplifier means floor. A
        # dividend that can be negative (pad offsets folded into a reshape's division) is
        # shifted by a multiple of d that makes it non-negative, where the two agree.
        shift = -(a.lo // d) * d if a.lo < 0 else 0
        text = f"({render_ix(a, floordiv, index)} + {shift})" if shift else _atom(a, floordiv, index)
        if op == "mod":
            return f"({text} % {d})"
        return f"({text} {floordiv} {d} - {shift // d})" if shift else f"({text} {floordiv} {d})"
    raise AssertionError(op)


def _atom(x: Ix, floordiv: str, index=None) -> str:
    text = render_ix(x, floordiv, index)
    return text if x.op in ("var", "const", "add", "div", "mod") else f"({text})"


def render_cond(c, floordiv: str, index=None) -> str:
    """Source text of an index condition ("ge"/"lt")."""
    op, x, k = c
    return f"({render_ix(x, floordiv, index)} {'>=' if op == 'ge' else '<'} {k})"
