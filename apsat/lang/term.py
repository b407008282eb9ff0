"""Hash-consed terms of the access-pattern language.

A `Term` is one node: an op name and a tuple of arguments. Arguments are child Terms,
Python literals (int, float, str), tuples of ints (lists and shapes) or tuples of Terms
(the argument list of an opaque call). Terms are interned: building the same op over the
same (interned) arguments returns the same object, so equality is identity and a model's
term DAG shares every common sub-term. Deep DAGs are walked with explicit stacks, never by
recursion.
"""
from __future__ import annotations

import weakref
from typing import Iterator, Union

Literal = Union[int, float, str, tuple]
# Ops of attribute sorts (compute operators, pad types, access shapes): Terms, but not
# children of the expression DAG. Filled in by apsat.lang.ops.
ATTRIBUTE_OPS: set[str] = set()
_INTERN: "weakref.WeakValueDictionary[tuple, Term]" = weakref.WeakValueDictionary()


def _key(value):
    """Interning key of one argument: children by identity, literals by value and type."""
    if isinstance(value, Term):
        return ("T", id(value))
    if isinstance(value, tuple):
        return ("tuple",) + tuple(_key(v) for v in value)
    return (type(value).__name__, value)


class Term:
    """One interned node: `op` (a registry name) and `args` (children and literals)."""

    __slots__ = ("op", "args", "__weakref__")

    def __new__(cls, op: str, args: tuple = ()):
        key = (op,) + tuple(_key(a) for a in args)
        found = _INTERN.get(key)
        if found is not None:
            return found
        term = object.__new__(cls)
        term.op = op
        term.args = tuple(args)
        _INTERN[key] = term
        return term

    def __reduce__(self):
        return (Term, (self.op, self.args))

    def children(self) -> Iterator["Term"]:
        """The child Expr terms in argument order (those inside an `exprs` tuple included)."""
        for a in self.args:
            if isinstance(a, Term):
                if a.op not in ATTRIBUTE_OPS:
                    yield a
            elif isinstance(a, tuple):
                for b in a:
                    if isinstance(b, Term):
                        yield b

    def __repr__(self) -> str:
        from apsat.lang.ops import COMPUTE_OPS
        from apsat.lang.syntax import compute_op_text, to_text

        if self.op in ATTRIBUTE_OPS:
            return compute_op_text(self) if self.op in COMPUTE_OPS else f"Term({self.op!r}, {self.args!r})"
        text = to_text(self)
        return text if len(text) < 400 else text[:400] + " ..."


def postorder(roots) -> list[Term]:
    """Every distinct term reachable from `roots`, children before parents (no recursion)."""
    if isinstance(roots, Term):
        roots = [roots]
    seen: set[int] = set()
    order: list[Term] = []
    for root in roots:
        stack = [(root, False)]
        while stack:
            term, expanded = stack.pop()
            if expanded:
                order.append(term)
                continue
            if id(term) in seen:
                continue
            seen.add(id(term))
            stack.append((term, True))
            for child in reversed(list(term.children())):
                if id(child) not in seen:
                    stack.append((child, False))
    return order


def write_pieces(root: Term, pieces, out: list, names: dict, own: Term | None = None) -> list:
    """Append root's text to `out` and return it: `pieces(term)` gives a term's text as
    strings and the child Terms to write in their place; a term in `names` (id -> text)
    other than `own` is written as its name. Why pieces on an explicit stack, not a text
    per term joined into its parent's: that copies a chain's text once a level (quadratic
    memory: a 1.5 MB program.txt took 6.9 GiB), and recursion would follow its depth."""
    stack = [root]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            out.append(item)
        elif item is not own and id(item) in names:
            out.append(names[id(item)])
        else:
            stack.extend(reversed(pieces(item)))
    return out
