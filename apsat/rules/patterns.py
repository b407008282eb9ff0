"""A rule's left side as a tree of pattern nodes, for asking how far it matches.

`rule_queries(rule)` reads a loader Rule (its operand-order variants included) into
Queries: the constructor forms of its pattern, one PatternNode each, numbered in pre-order,
and the facts that are not patterns (`:when` conditions, relations). A Query writes any
part of its pattern that is closed under parents as egglog query text (`facts`), one fact
per node, `(= VAR (head ARG ...))`, so that every node's e-class has a variable: a probe
can name the class where a part stopped matching. Why flat facts: a nested pattern gives
names only to its root and its leaves, and the place where a match stops is usually inside.

Nothing here runs egglog; apsat.pipeline.why probes the parts on an e-graph and
apsat.pipeline.provenance matches them against a serialised one.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from apsat.egraph.serialize import SORT_OF
from apsat.rules.commute import to_text
from apsat.rules.loader import Rule, bound_variables, is_variable, positional
from apsat.rules.sexpr import Atom, Form, atoms, read_forms

ROOT = "apsat-why-root"          # the class a rewrite's left side matches
_NODE_VAR = "apsat-why-{}"       # the class of pattern node k, when the pattern names none


@dataclass
class PatternNode:
    """One constructor form of a pattern: its pre-order `index` in the Query, `form`,
    `parent` index (None for a pattern's root), `var` naming its e-class, `children`
    (indices of the constructor forms among its arguments) and `expr` (headed by an Expr
    constructor, so its class is an Expr class)."""

    index: int
    form: Form
    parent: int | None
    var: str
    children: list[int] = field(default_factory=list)

    @property
    def expr(self) -> bool:
        return SORT_OF.get(self.form.head) == "Expr"

    @property
    def head(self) -> str:
        return self.form.head


@dataclass
class Query:
    """One variant of a rule (`name`: the rule's, or NAME|swapped-K) as pattern `nodes` in
    pre-order and `conditions` (the other facts), with `source` the rule text it came from."""

    name: str
    nodes: list[PatternNode]
    conditions: list[Form]
    source: str

    def everything(self) -> set[int]:
        """Every node's index: the whole pattern."""
        return {n.index for n in self.nodes}

    def path(self, k: int) -> set[int]:
        """Node k and its ancestors."""
        out = set()
        while k is not None:
            out.add(k)
            k = self.nodes[k].parent
        return out

    def bound(self, part: set[int]) -> set[str]:
        """The variables a part binds: its nodes' class variables and the variables among
        their arguments."""
        out = set()
        for k in part:
            node = self.nodes[k]
            out.add(node.var)
            for item in node.form.items[1:]:
                if not _is_node(item):
                    out.update(a.text for a in atoms(item) if is_variable(a))
        return out

    def facts(self, part: set[int]) -> str:
        """egglog query text for `part` (indices closed under parents): one fact per node,
        then every condition whose variables the part binds."""
        text = [self.fact(k) for k in sorted(part)]
        bound = self.bound(part)
        text += [to_text(c) for c in self.conditions if bound_variables(c) <= bound]
        return " ".join(text)

    def fact(self, k: int) -> str:
        """`(= VAR (head ARG ...))` for node k, its constructor arguments as their variables."""
        node = self.nodes[k]
        args = [self.nodes[c].var for c in node.children]
        it = iter(args)
        items = [next(it) if _is_node(item) else to_text(item) for item in node.form.items[1:]]
        return f"(= {node.var} ({' '.join([node.head] + items)}))"

    def conditions_new_at(self, k: int) -> list[str]:
        """The conditions that node k's path binds and its parent's path did not."""
        parent = self.nodes[k].parent
        before = self.bound(self.path(parent)) if parent is not None else set()
        now = self.bound(self.path(k))
        return [to_text(c) for c in self.conditions if bound_variables(c) <= now and not bound_variables(c) <= before]

    def site(self, k: int) -> str | None:
        """The variable of node k's class, or its nearest Expr ancestor's (a compute operator
        has no Expr class of its own); None when there is none."""
        while k is not None and not self.nodes[k].expr:
            k = self.nodes[k].parent
        return None if k is None else self.nodes[k].var

    def text_of(self, k: int) -> str:
        """Node k's sub-pattern as written."""
        return to_text(self.nodes[k].form)

    def shown(self, part: set[int], k: int | None = None) -> str:
        """The pattern with the nodes outside `part` written `_` (node k's own form kept, to
        show the sub-pattern that did not match)."""
        roots = [n.index for n in self.nodes if n.parent is None]
        return "  ".join(self._shown(r, part, k) for r in roots)

    def _shown(self, i: int, part: set[int], k) -> str:
        node = self.nodes[i]
        if i not in part and i != k:
            return "_"
        if i == k:
            return to_text(node.form)
        it = iter(node.children)
        items = [self._shown(next(it), part, k) if _is_node(item) else to_text(item) for item in node.form.items]
        return "(" + " ".join(items) + ")"


def _is_node(item) -> bool:
    """A constructor form of the language (a pattern node, not a function call)."""
    return isinstance(item, Form) and item.head in SORT_OF


def rule_queries(rule: Rule) -> list[Query]:
    """A Query per rule command in `rule.text` (the rule and its operand-order variants),
    in order; commands with no constructor pattern are left out."""
    out = []
    for form in read_forms(rule.text):
        if not isinstance(form, Form):
            continue
        name = _name(form) or rule.name
        patterns, conditions = split_facts(form)
        query = Query(name, [], conditions, to_text(form))
        for var, pattern in patterns:
            _add_nodes(query, pattern, None, var)
        if query.nodes:
            out.append(query)
    return out


def _name(form: Form) -> str | None:
    for i, item in enumerate(form.items[:-1]):
        if isinstance(item, Atom) and item.text == ":name":
            return form.items[i + 1].text.strip('"')
    return None


def split_facts(form: Form) -> tuple[list[tuple[str, Form]], list[Form]]:
    """(patterns as (root variable, form), conditions) of a rewrite or rule command: a
    rewrite's left side is bound to ROOT and its `:when` facts are conditions; a rule's
    `(= VAR PATTERN)` facts are patterns and the rest conditions."""
    pos = positional(form.items[1:])
    if form.head in ("rewrite", "birewrite") and len(pos) == 2:
        when = next((form.items[i + 1] for i, it in enumerate(form.items[:-1])
                     if isinstance(it, Atom) and it.text == ":when"), None)
        facts = [f for f in when.items if isinstance(f, Form)] if isinstance(when, Form) else []
        return ([(ROOT, pos[0])] if _is_node(pos[0]) else []), facts
    if form.head == "rule" and pos and isinstance(pos[0], Form):
        patterns, conditions = [], []
        for fact in pos[0].items:
            if not isinstance(fact, Form):
                continue
            sides = fact.items[1:] if fact.head == "=" and len(fact.items) == 3 else []
            var = next((s.text for s in sides if isinstance(s, Atom) and is_variable(s)), None)
            pattern = next((s for s in sides if _is_node(s)), None)
            if var is not None and pattern is not None:
                patterns.append((var, pattern))
            else:
                conditions.append(fact)
        return patterns, conditions
    return [], []


def _add_nodes(query: Query, form: Form, parent: int | None, var: str | None) -> int:
    """Add `form` and its constructor sub-forms to `query` in pre-order; returns its index."""
    k = len(query.nodes)
    node = PatternNode(k, form, parent, var or _NODE_VAR.format(k))
    query.nodes.append(node)
    for item in form.items[1:]:
        if _is_node(item):
            node.children.append(_add_nodes(query, item, k, None))
    return k
