"""Patterns in the short form: an element-wise rewrite written as arithmetic in a rule file,
expanded into an ordinary egglog `rule` before the loader checks it.

    ; x * sigmoid(x) -> silu x
    (pattern (* x (sigmoid x)) (silu x) :ruleset fusion :name "fusion/silu")

is `(rule ((= ?root LHS)) ((union ?root (compute (silu) x))) :ruleset fusion :name ...)`
with LHS the importer's encoding of x * sigmoid(x). The form is
`(pattern LEFT RIGHT :ruleset NAME [:name "NAME"] [:tolerance T])`:

- LEFT is an element-wise expression. `(OP a b ..)` with OP an n-ary operator of the
  registry (apsat.lang.ops.NARY_OPS read over an `access-pair`: every one but `select`),
  by its registry name or, for seven of them, a symbol (SYMBOLS: `+ * - / pow max min`),
  is `(compute (OP) (access-pair A B))`; a variadic one (registry arity 0: add, mul, max,
  min) takes two or more operands and folds them to the left, as the importer folds Sum.
  `(OP p.. e)` with OP a unary map (UNARY_MAPS) is `(compute (OP p..) E)`, its literal
  parameters first (`(clip 0.0 6.0 e)`); egglog's spelling of a renamed constructor
  (EGG_NAMES: `exp` is `exp-op`) is written for it. OPERATORS holds the whole table.
- A number on the left is a scalar constant broadcast where it is read, as the importer
  writes one (apsat/frontend/builder.py): `(access-broadcast (access-reshape
  (access-literal V) ?sN) ?tN)`. A number that float32 holds exactly (0, 0.5, 1, 3, 6) is
  matched exactly: exporters write those exactly, and egglog looks a literal up where
  bounds make it try every literal (GPT-2's fusion phase with the two GELU rules: 0.12 s
  against 0.31 s). Any other number V is a variable ?cN with the facts `(>= ?cN LO)
  (<= ?cN HI)`, LO, HI = V -+ T * |V|: the tolerance T is relative (default
  DEFAULT_TOLERANCE). A number as a float parameter (`(clip 0 6 e)`) is matched the same
  way. A commutative operator's constant operand is written second, where the importer
  always puts it.
- An identifier is a pattern variable: an expression, or a parameter where it stands for
  one (`(clip lo hi e)`); one used twice binds one e-class (egglog's join does that).
- RIGHT is a variable of the left side or unary maps over one: `(gelu x)` is
  `(compute (gelu) x)`, `(hard-sigmoid 0.16666667 0.5 x)` with its parameters. A
  constant needs a shape the right side cannot name, so numbers are parameters only.

Every mistake is a RuleError `path:line: reason` naming the offending line: an unknown
operator, a wrong number of operands, a number where an expression is folded at import
(`(+ 1 2)`), an unbound or ill-sorted variable on the right, a missing `:ruleset`, a bad
`:tolerance`. What the expansion produces then goes through the loader's checks (arities,
the ruleset, operand-order variants: apsat/rules/commute.py); `expand_patterns` writes
each rule on the lines its pattern held, so the loader's `path:line` and the rule's
default name `FILE:LINE` are the pattern's.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from apsat.errors import RuleError
from apsat.lang.ops import COMPUTE_OPS, NARY_OPS, UNARY_MAPS
from apsat.rules.sexpr import Atom, Form, read_forms

# Short spellings of the arithmetic n-ary operators; every other operator is written by
# its registry name.
SYMBOLS = {"+": "elementwise-add", "*": "elementwise-mul", "-": "elementwise-sub",
           "/": "elementwise-div", "pow": "elementwise-pow", "max": "elementwise-max",
           "min": "elementwise-min"}
# float32 keeps 24 bits (6e-8 relative): 1e-6 lets the constant a rule writes to 7 or more
# digits (0.7978846) meet the float32 an exporter stored (0.79788458), and refuses any
# other constant a model would hold instead (0.05 for 0.044715).
DEFAULT_TOLERANCE = 1e-6
# The loader's MAX_NESTING, which it checks on the expansion after this; a pattern nested
# deeper would otherwise meet Python's recursion limit here first.
MAX_DEPTH = 100
KEYWORDS = (":ruleset", ":name", ":tolerance")
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
_VARIABLE = re.compile(r"[A-Za-z_][\w\-]*")
_SORTS = {"expr": "an expression", "float": "a float parameter", "int": "an integer parameter"}


@dataclass(frozen=True)
class Operator:
    """A left-side operator: its registry `name`, egglog constructor `egg`, the kinds of
    its literal `params` (written before the operands), `operands` (1 for a unary map, 2
    for a binary operator, 0 for a variadic one: two or more) and `commutative`."""

    name: str
    egg: str
    params: tuple[str, ...]
    operands: int
    commutative: bool


def _registry_operators() -> dict[str, Operator]:
    """Every unary map with literal parameters only, and every n-ary operator over a pair
    (arity 0 or 2; `select` reads three operands by concatenation), by registry name and
    by symbol."""
    ops = {}
    for name in sorted(UNARY_MAPS):
        spec = COMPUTE_OPS[name]
        if set(spec.params) <= {"float", "int"}:
            ops[name] = Operator(name, spec.egg, spec.params, 1, False)
    for name in sorted(NARY_OPS):
        spec = COMPUTE_OPS[name]
        if spec.arity in (0, 2):
            ops[name] = Operator(name, spec.egg, (), spec.arity, spec.commutative)
    ops.update({symbol: ops[name] for symbol, name in SYMBOLS.items()})
    return ops


OPERATORS = _registry_operators()


def _f64(value: float) -> str:
    """`value` as an egglog f64 literal (a point or an exponent, which egglog requires)."""
    text = repr(float(value))
    return text if "." in text or "e" in text else text + ".0"


def _float32_exact(value: float) -> bool:
    """Whether float32 holds `value` exactly (past its range it holds no finite value)."""
    with np.errstate(over="ignore"):
        return float(np.float32(value)) == value


def _is_number(node) -> bool:
    return isinstance(node, Atom) and bool(_NUMBER.fullmatch(node.text))


@dataclass
class _Expansion:
    """One pattern being expanded: the query facts its numbers add, the sort of each
    variable the left side binds ("expr", "float" or "int"), and a counter for fresh
    names. Fresh names start with `?`, which a pattern's own variables cannot."""

    path: Path
    tolerance: float
    facts: list[str] = field(default_factory=list)
    sorts: dict[str, str] = field(default_factory=dict)
    count: int = 0

    def fail(self, line: int, reason: str):
        raise RuleError(f"{self.path}:{line}: {reason}")

    def fresh(self) -> int:
        """A number no other fresh name of this pattern has."""
        self.count += 1
        return self.count

    def matched(self, atom: Atom) -> str:
        """The number `atom` as the left side matches it: its literal where float32 holds
        it exactly, else a fresh f64 variable and the facts bounding it within the
        tolerance."""
        value = float(atom.text)
        if not math.isfinite(value):
            self.fail(atom.line, f"{atom.text} is not a finite number")
        if _float32_exact(value):
            return _f64(value)
        var, slack = f"?c{self.fresh()}", self.tolerance * abs(value)
        self.facts += [f"(>= {var} {_f64(value - slack)})", f"(<= {var} {_f64(value + slack)})"]
        return var

    def variable(self, atom: Atom, sort: str, bind: bool) -> str:
        """A pattern variable used as `sort`: bound on the left (`bind`), or checked to be
        bound with that sort on the right."""
        name = atom.text
        if not _VARIABLE.fullmatch(name) or name in ("true", "false"):
            self.fail(atom.line, f"'{name}' is neither a number nor a variable")
        if name in OPERATORS:
            self.fail(atom.line, f"'{name}' is an operator: apply it, ({name} ...)")
        if not bind and name not in self.sorts:
            self.fail(atom.line, f"variable '{name}' on the right side is not bound by the left side")
        if self.sorts.setdefault(name, sort) != sort:
            self.fail(atom.line, f"variable '{name}' is {_SORTS[self.sorts[name]]} and {_SORTS[sort]}")
        return name

    def call(self, form: Form) -> tuple[Operator, list, list]:
        """The operator of `(OP params.. operands..)`, its parameter and operand nodes;
        RuleError for an unknown operator or a wrong count."""
        if not isinstance(form.items[0] if form.items else None, Atom):
            self.fail(form.line, "expected (OPERATOR ARGUMENTS ..)")
        op = OPERATORS.get(form.head)
        if op is None:
            self.fail(form.line, f"unknown element-wise operator '{form.head}' (docs/rules.md lists them)")
        args, k = form.items[1:], len(op.params)
        wanted = k + op.operands if op.operands else None
        if (wanted is not None and len(args) != wanted) or (wanted is None and len(args) < k + 2):
            count = str(wanted) if wanted is not None else "at least 2"
            self.fail(form.line, f"'{form.head}' takes {count} arguments, got {len(args)}")
        return op, args[:k], args[k:]

    def param(self, node, kind: str, left: bool) -> str:
        """An operator parameter: a number (a float one on the left as `matched` says) or
        a variable of that kind."""
        if isinstance(node, Form):
            self.fail(node.line, "an operator's parameter is a number or a variable")
        if not _is_number(node):
            return self.variable(node, kind, bind=left)
        if kind == "int":
            if not re.fullmatch(r"[-+]?\d+", node.text):
                self.fail(node.line, f"{node.text} is no integer")
            return node.text
        return self.matched(node) if left else _f64(float(node.text))

    def left(self, node, depth: int = 0) -> str:
        """The egglog pattern of a left-side expression."""
        if depth > MAX_DEPTH:
            self.fail(node.line, f"the pattern nests more than {MAX_DEPTH} deep (the limit)")
        if isinstance(node, Atom):
            if not _is_number(node):
                return self.variable(node, "expr", bind=True)
            c, k = self.matched(node), self.fresh()
            return f"(access-broadcast (access-reshape (access-literal {c}) ?s{k}) ?t{k})"
        op, params, operands = self.call(node)
        if all(_is_number(o) for o in operands):
            self.fail(node.line, f"({node.head} ..) over numbers only is one constant at import: write its value")
        head = " ".join([op.egg] + [self.param(p, kind, True) for p, kind in zip(params, op.params)])
        texts = [self.left(o, depth + 1) for o in operands]
        if op.operands == 1:
            return f"(compute ({head}) {texts[0]})"
        acc, acc_constant = texts[0], _is_number(operands[0])
        for node_b, text in zip(operands[1:], texts[1:]):
            constant_first = op.commutative and acc_constant and not _is_number(node_b)
            pair = f"{text} {acc}" if constant_first else f"{acc} {text}"
            acc, acc_constant = f"(compute ({head}) (access-pair {pair}))", False
        return acc

    def right(self, node, depth: int = 0) -> str:
        """The egglog term of a right-side expression: a bound variable or unary maps over
        one."""
        if depth > MAX_DEPTH:
            self.fail(node.line, f"the pattern nests more than {MAX_DEPTH} deep (the limit)")
        if isinstance(node, Atom):
            if _is_number(node):
                self.fail(node.line, "a number on the right side is an operator's parameter only "
                          "(a constant there has no shape to take)")
            return self.variable(node, "expr", bind=False)
        op, params, operands = self.call(node)
        if op.operands != 1:
            self.fail(node.line, f"the right side applies unary maps only, not '{node.head}'")
        head = " ".join([op.egg] + [self.param(p, kind, False) for p, kind in zip(params, op.params)])
        return f"(compute ({head}) {self.right(operands[0], depth + 1)})"


def _options(path: Path, form: Form) -> tuple[list, dict]:
    """A pattern's positional parts and its keyword options (keyword -> Atom); RuleError
    for an unknown, repeated or valueless keyword, and for a missing :ruleset."""
    items, positional, options = form.items[1:], [], {}
    i = 0
    while i < len(items):
        item = items[i]
        if isinstance(item, Atom) and item.text.startswith(":"):
            if item.text not in KEYWORDS or item.text in options:
                what = "repeated" if item.text in options else "unknown"
                raise RuleError(f"{path}:{item.line}: {what} keyword {item.text} "
                                f"(a pattern takes {', '.join(KEYWORDS)})")
            value = items[i + 1] if i + 1 < len(items) else None
            if not isinstance(value, Atom) or value.text.startswith(":"):
                raise RuleError(f"{path}:{item.line}: {item.text} takes a name, a string or a number after it")
            options[item.text] = value
            i += 2
        else:
            positional.append(item)
            i += 1
    if ":ruleset" not in options:
        raise RuleError(f"{path}:{form.line}: pattern has no :ruleset (rules must belong to a named ruleset)")
    return positional, options


def _tolerance(path: Path, atom: Atom | None) -> float:
    """The `:tolerance` value: a number in [0, 1), DEFAULT_TOLERANCE when absent."""
    if atom is None:
        return DEFAULT_TOLERANCE
    value = float(atom.text) if _is_number(atom) else math.nan
    if not 0.0 <= value < 1.0:     # NaN fails too
        raise RuleError(f"{path}:{atom.line}: bad :tolerance {atom.text} (a relative "
                        "tolerance: a number from 0 up to, not including, 1)")
    return value


def expand_pattern(path, form: Form) -> str:
    """The egglog `rule` text (one line) of a `(pattern LEFT RIGHT :ruleset R ..)` form
    read from the file at `path`; RuleError `path:line: reason` for a malformed one."""
    path = Path(path)
    positional, options = _options(path, form)
    if len(positional) != 2:
        raise RuleError(f"{path}:{form.line}: pattern needs a left and a right side, got {len(positional)} parts")
    lhs, rhs = positional
    if not isinstance(lhs, Form):
        raise RuleError(f"{path}:{form.line}: the left side must apply an operator, not be a bare "
                        f"{'number' if _is_number(lhs) else 'variable'}")
    exp = _Expansion(path, _tolerance(path, options.get(":tolerance")))
    left = exp.left(lhs)
    right = exp.right(rhs)
    query = " ".join([f"(= ?root {left})"] + exp.facts)
    name = options.get(":name")
    if name is not None and not name.text.startswith('"'):
        raise RuleError(f'{path}:{name.line}: :name takes a string, "FAMILY/RULE"')
    return (f"(rule ({query}) ((union ?root {right})) :ruleset {options[':ruleset'].text}"
            + (f" :name {name.text})" if name is not None else ")"))


def expand_patterns(path, text: str, forms: list) -> tuple[str, list]:
    """`text` and its top-level `forms` with every `(pattern ..)` form replaced by its
    rule (expand_pattern), each written where its pattern began and followed by as many
    newlines as the pattern spanned, so every form keeps its line. Text without a
    pattern comes back as it is."""
    patterns = [f for f in forms if isinstance(f, Form) and f.head == "pattern"]
    if not patterns:
        return text, forms
    pieces, pos = [], 0
    for form in patterns:
        pieces += [text[pos:form.start], expand_pattern(path, form),
                   "\n" * text.count("\n", form.start, form.end)]
        pos = form.end
    out = "".join(pieces) + text[pos:]
    return out, read_forms(out)
