"""A rule written once matches every operand order of the commutative operators.

`(compute (elementwise-mul) (access-pair A B))` in a rule's pattern (a rewrite's left
side, a rule's query) also matches `(access-pair B A)`: the loader adds, beside the rule,
one variant per further order of its commutative pairs, named `NAME|swapped-K`, whose
matches the run reports count under NAME (apsat.egraph.bursts.base_name). Which operators commute is the registry's
`commutative` flag (apsat/lang/ops.py; checked against each formula), so a new
commutative operator needs nothing here. The right side and the actions are not touched:
the variant's match binds the same variables to the same values.

A pair whose two operands are written alike (`x * x`) has one order, and so has a pair
written constant second: the import writes a commutative operator's constant operand
second (apsat/frontend/builder.py), whichever side the exporter put it. At most
MAX_SWAPPED pairs of one pattern are expanded (2^MAX_SWAPPED orders); the loader refuses
a pattern with more, naming the line.
"""
from __future__ import annotations

import itertools
import re

from apsat.egraph.bursts import VARIANT_MARK
from apsat.lang.ops import COMPUTE_OPS
from apsat.rules.sexpr import Atom, Form

COMMUTATIVE = frozenset(s.egg for s in COMPUTE_OPS.values() if s.commutative)
MAX_SWAPPED = 4


def commutative_pairs(pattern) -> list[Form]:
    """The `access-pair` forms of `pattern` read by a commutative compute operator, whose
    two operands differ, outermost first; a pair written in the import's canonical order
    (a constant second, the other operand not one: apsat/frontend/builder.py) is left
    out, since the import never writes the other."""
    out, stack = [], [pattern]
    while stack:
        node = stack.pop()
        if not isinstance(node, Form):
            continue
        items = node.items
        if (node.head == "compute" and len(items) == 3 and isinstance(items[1], Form)
                and len(items[1].items) == 1 and items[1].head in COMMUTATIVE
                and isinstance(items[2], Form) and items[2].head == "access-pair"
                and len(items[2].items) == 3 and to_text(items[2].items[1]) != to_text(items[2].items[2])
                and not (_constant(items[2].items[2]) and not _constant(items[2].items[1]))):
            out.append(items[2])
        stack.extend(reversed(items))
    return out


def _constant(node) -> bool:
    """A literal, reshaped or broadcast (the pattern form of a constant operand)."""
    while isinstance(node, Form) and node.head in ("access-broadcast", "access-reshape") and len(node.items) > 1:
        node = node.items[1]
    return isinstance(node, Form) and node.head == "access-literal"


def variants(form: Form, pairs: list[Form], name: str) -> list[str]:
    """The egglog text of every other operand order of `form` (a rule command whose
    pattern's commutative pairs are `pairs`), each with its own :name, duplicates
    dropped."""
    seen, out = {to_text(form)}, []
    for k, chosen in enumerate(_subsets(pairs), start=1):
        text = to_text(form, {id(p) for p in chosen})
        if text in seen:
            continue
        seen.add(text)
        named = f':name "{name}{VARIANT_MARK}{k}"'
        out.append(re.sub(r':name\s+"[^"]*"', named, text, count=1) if ":name" in text
                   else text[:-1] + f" {named})")
    return out


def _subsets(pairs: list) -> list:
    """Every non-empty subset of `pairs`."""
    return [c for r in range(1, len(pairs) + 1) for c in itertools.combinations(pairs, r)]


def to_text(node, swapped: frozenset | set = frozenset()) -> str:
    """`node` written back as egglog text; the operands of each pair in `swapped` (ids)
    in the other order."""
    if isinstance(node, Atom):
        return node.text
    items = list(node.items)
    if id(node) in swapped:
        items[1], items[2] = items[2], items[1]
    return "(" + " ".join(to_text(i, swapped) for i in items) + ")"
