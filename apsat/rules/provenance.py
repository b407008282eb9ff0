"""Which rule built a node: rules read as (left side, what their right side builds), and a
matcher of rule patterns over a serialised e-graph.

egglog keeps no record of which rule made a node, so provenance is found again after the
fact: a rule is credited with node n of class c when what its right side builds matches n
(the node itself, its constructors and literals, variables binding n's child classes) and
its left side, with those bindings, matches in c, where the rule merged it. `:when`
conditions that compare a literal with a number are checked; conditions on relations and
analysis functions (`activation`, `weight-key`, `dim`) are not in the serialised e-graph and
are taken as holding, which can credit a rule whose pattern fits but whose condition would
not have. A node built inside a right side (a merged product's wider gemm, under the slices
that replace its members) is credited by the right side's shape alone.

`RuleIndex(library)` reads every rule once; `index.builders(graph, nid)` yields
(rule name, left-side node ids) for the rules that explain node `nid`.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from apsat.egraph.bursts import base_name
from apsat.egraph.serialize import EGG_TO_REGISTRY, SORT_OF
from apsat.rules.loader import is_variable, positional
from apsat.rules.patterns import ROOT, split_facts
from apsat.rules.sexpr import Atom, Form, read_forms

USED = "\0used"          # the bindings' key for the nodes a match went through
MAX_STEPS = 20_000      # node visits per question: a pattern over a big class stops here
_COMPARE = {">": float.__gt__, "<": float.__lt__, ">=": float.__ge__, "<=": float.__le__}


@dataclass
class Builder:
    """One rule command read for provenance: its (base) rule `name`, the `built` form
    (a constructor form its right side makes), whether that form is the right side's
    `root` (merged into the left side's class), the `whole` right side, the class variable
    `target` it joins, the left side `patterns` as (variable, form) and the `conditions`."""

    name: str
    built: Form
    root: bool
    whole: Form
    target: str | None
    patterns: list
    conditions: list


def _inline(node, lets: dict):
    """`node` with let-bound variables replaced by their forms."""
    if isinstance(node, Atom):
        return lets.get(node.text, node)
    return Form([_inline(i, lets) for i in node.items], node.line, node.start, node.end)


def _built_forms(form: Form) -> list[tuple[str | None, Form]]:
    """(class variable it joins, right-side form) for a rewrite or rule command."""
    pos = positional(form.items[1:])
    if form.head in ("rewrite", "birewrite") and len(pos) == 2:
        out = [(ROOT, pos[1])]
        return out + ([(ROOT, pos[0])] if form.head == "birewrite" else [])
    if form.head != "rule" or len(pos) != 2 or not isinstance(pos[1], Form):
        return []
    lets, out = {}, []
    for action in pos[1].items:
        if not isinstance(action, Form):
            continue
        if action.head == "let" and len(action.items) == 3:
            lets[action.items[1].text] = _inline(action.items[2], lets)
        elif action.head == "union" and len(action.items) == 3:
            a, b = (_inline(x, lets) for x in action.items[1:])
            for var, built in ((a, b), (b, a)):
                if isinstance(built, Form) and built.head in SORT_OF:
                    out.append((var.text if isinstance(var, Atom) else None, built))
    return out


def _sub_forms(form: Form) -> list[Form]:
    """The constructor forms inside `form`, itself first."""
    out, stack = [], [form]
    while stack:
        n = stack.pop()
        if isinstance(n, Form) and n.head in SORT_OF:
            out.append(n)
            stack.extend(reversed(n.items[1:]))
    return out


class RuleIndex:
    """Every rule of a RuleLibrary read once, indexed by the constructor (and compute
    operator) of each form its right side builds."""

    def __init__(self, library):
        self.by_key: dict[tuple, list[Builder]] = {}
        for rule in library.rules.values():
            for key, b in _builders(rule.name, rule.text):
                self.by_key.setdefault(key, []).append(b)

    def builders(self, graph, nid: str, parents: dict):
        """(rule name, {left-side node id, ...}) for each rule whose right side builds node
        `nid` of `graph` (a language ExtractionGraph) from a left side matched in the class
        its right side joins: `nid`'s own, or for a form inside the right side, the class of
        a parent node (`parents`: graph.parents()) that the whole right side matches."""
        seen = set()
        key = _node_key(graph, nid)
        candidates = self.by_key.get(key, []) + (self.by_key.get(key[:1], []) if len(key) > 1 else [])
        for b in candidates:
            if b.name in seen or not next(Matcher(graph).node(b.built, nid, {}), None):
                continue
            tops = [nid] if b.root else [p for p in parents.get(graph.nodes[nid]["eclass"], ())]
            used = next(filter(lambda u: u is not None, (self._explains(graph, b, top) for top in tops)), None)
            if used is not None:
                seen.add(b.name)
                yield b.name, used

    @staticmethod
    def _explains(graph, b: Builder, top: str) -> set[str] | None:
        """The left-side nodes of rule `b` matched in node `top`'s class with the bindings
        of its whole right side matched at `top`, or None (a right side with no left-side
        pattern on its class: the empty set)."""
        m = Matcher(graph)
        for env in m.node(b.whole, top, {}):
            used = m.left_side(b, env, graph.nodes[top]["eclass"])
            if used is not None:
                return used
        return None


@lru_cache(maxsize=4096)
def _builders(name: str, text: str) -> tuple:
    """((index key, Builder), ...) of one rule's text: read once per process, as each
    optimize builds its own library of the same rules."""
    out = []
    for form in read_forms(text):
        if not isinstance(form, Form):
            continue
        patterns, conditions = split_facts(form)
        for target, built in _built_forms(form):
            for k, sub in enumerate(_sub_forms(built)):
                out.append((_key(sub), Builder(base_name(name), sub, k == 0, built, target, patterns, conditions)))
    return tuple(out)


def _key(form: Form) -> tuple:
    """A form's index key: its constructor's registry name, and a compute form's operator."""
    op = EGG_TO_REGISTRY.get(form.head, form.head)
    if op == "compute" and len(form.items) > 1 and isinstance(form.items[1], Form):
        return (op, EGG_TO_REGISTRY.get(form.items[1].head, form.items[1].head))
    return (op,)


def _node_key(graph, nid: str) -> tuple:
    op = graph.nodes[nid]["op"]
    if op == "compute":
        cls = graph.node_classes[nid][0]
        return (op, graph.nodes[graph.classes[cls][0]]["op"]) if cls in graph.classes else (op,)
    return (op,)


class Matcher:
    """Rule patterns matched against a serialised e-graph, with backtracking, counting node
    visits against MAX_STEPS (past it, no further match is found). Bindings are dicts of
    variable -> class id; USED in them holds the Expr nodes the match went through."""

    def __init__(self, graph):
        self.graph, self.steps = graph, 0

    def node(self, form: Form, nid: str, env: dict):
        """Every extension of `env` under which `form` matches node `nid` itself."""
        self.steps += 1
        g = self.graph
        if self.steps > MAX_STEPS or g.nodes[nid]["op"] != EGG_TO_REGISTRY.get(form.head, form.head):
            return
        kids = g.node_classes[nid]
        if len(kids) != len(form.items) - 1:
            return
        if SORT_OF.get(form.head) == "Expr":
            env = {**env, USED: env.get(USED, frozenset()) | {nid}}
        yield from self._items(form.items[1:], kids, 0, env)

    def _items(self, items: list, kids: list, i: int, env: dict):
        if i == len(items):
            yield env
            return
        for found in self.item(items[i], kids[i], env):
            yield from self._items(items, kids, i + 1, found)

    def item(self, item, cls: str, env: dict):
        """Every extension of `env` under which a pattern item (variable, literal, form)
        matches class `cls`."""
        if isinstance(item, Atom):
            if is_variable(item):
                bound = env.get(item.text)
                if bound is None or bound == cls:
                    yield {**env, item.text: cls}
            elif _literal_equal(self.graph, cls, item.text):
                yield env
        elif item.head not in SORT_OF:
            yield env            # a function call or unit: not in the serialised e-graph
        else:
            for nid in self.graph.classes.get(cls, ()):
                yield from self.node(item, nid, env)

    def left_side(self, b: Builder, env: dict, cls: str) -> set[str] | None:
        """The Expr nodes of the first left-side match in class `cls` under `env` (the
        conditions checked), or None."""
        env = {k: v for k, v in env.items() if k != USED}
        if b.target is not None:
            env.setdefault(b.target, cls)
        for found in self._patterns(b.patterns, 0, env):
            if all(_condition_holds(self.graph, c, found) for c in b.conditions):
                return set(found.get(USED, ()))
        return None

    def _patterns(self, patterns: list, i: int, env: dict):
        if i == len(patterns):
            yield env
            return
        var, form = patterns[i]
        if env.get(var) is None:    # a pattern on a class the right side does not name
            yield from self._patterns(patterns, i + 1, env)
            return
        for found in self.item(form, env[var], env):
            yield from self._patterns(patterns, i + 1, found)


def _literal(graph, cls: str):
    nodes = graph.classes.get(cls)
    if not nodes or graph.nodes[nodes[0]]["children"]:
        return None
    try:
        return float(graph.nodes[nodes[0]]["op"])
    except ValueError:
        return None


def _literal_equal(graph, cls: str, text: str) -> bool:
    try:
        want = float(text)
    except ValueError:
        return graph.classes.get(cls) is not None and graph.nodes[graph.classes[cls][0]]["op"] == text
    return _literal(graph, cls) == want


def _condition_holds(graph, fact, env: dict) -> bool:
    """A comparison of a literal variable with a number, checked; anything else holds."""
    if not (isinstance(fact, Form) and fact.head in _COMPARE and len(fact.items) == 3):
        return True
    values = []
    for a in fact.items[1:]:
        if not isinstance(a, Atom):
            return True
        v = _literal(graph, env[a.text]) if a.text in env else _number(a.text)
        if v is None:
            return True
        values.append(v)
    return _COMPARE[fact.head](*values)


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None
