"""From a serialised egglog e-graph of the access-pattern language back to Terms.

Knows how the language is written in egglog (see syntax.egg_node): int tuples are
`icons`/`inil` cons-lists, opaque arguments `econs`/`enil`, compute operators and pad
types nullary or parameterised constructors (a chain's parameters are operators
themselves), literals primitive nodes.
"""
from __future__ import annotations

import json

from apsat.lang.ops import COMPUTE_OPS, OPS, PAD_TYPES
from apsat.lang.term import Term
from apsat.extract.graph import ExtractionGraph

LIST_OPS = {"inil", "icons", "enil", "econs", "access-shape"}
CONSTRUCTORS = set(OPS) | set(COMPUTE_OPS) | set(PAD_TYPES) | LIST_OPS
PRIMITIVE_TYPES = {"i64", "f64", "String", "bool"}


def language_graph(data: dict) -> ExtractionGraph:
    """An ExtractionGraph of the language's constructors and literals only (analysis
    function rows such as `dim` are dropped)."""
    types = {c: d.get("type", "") for c, d in data.get("class_data", {}).items()}

    def extractable(nid, node):
        if node["op"] in CONSTRUCTORS:
            return True
        return types.get(node["eclass"]) in PRIMITIVE_TYPES and not node["children"]

    return ExtractionGraph.from_json(data, extractable)


def _literal(graph: ExtractionGraph, cls: str):
    """The value of a primitive class (its childless literal node)."""
    nid = graph.classes[cls][0]
    text = graph.nodes[nid]["op"]
    kind = graph.class_types.get(cls)
    if kind == "i64":
        return int(text)
    if kind == "f64":
        return float(text.replace("inf", "inf"))
    if kind == "String":
        return json.loads(text) if text.startswith('"') else text
    raise ValueError(f"class {cls} of type {kind!r} is not a literal")


def _chain(graph, choice, cls, item):
    """Walk a cons-list class: `item(head_class)` for each element, in order."""
    out = []
    while True:
        nid = choice.get(cls) or graph.classes[cls][0]
        op = graph.nodes[nid]["op"]
        if op in ("inil", "enil"):
            return tuple(out)
        head, tail = graph.node_classes[nid]
        out.append(item(head))
        cls = tail


def expr_child_classes(graph: ExtractionGraph, nid: str, choice: dict[str, str] | None = None) -> list[str]:
    """The Expr child classes of language node `nid`, in argument order (an opaque call's
    argument list flattened)."""
    out = []
    for kind, c in zip(OPS[graph.nodes[nid]["op"]].signature, graph.node_classes[nid]):
        if kind == "expr":
            out.append(c)
        elif kind == "exprs":
            out.extend(_chain(graph, choice or {}, c, lambda h: h))
    return out


def node_args(graph: ExtractionGraph, nid: str, expr, choice: dict[str, str] | None = None) -> tuple:
    """The arguments of language node `nid` as a Term would hold them: literals, int
    tuples, attribute Terms (compute operators, pad types, access shapes), and `expr(class
    id)` for each Expr child (inside a tuple for an `exprs` argument). List and attribute
    classes are read through `choice` where it names them, else their first node."""
    choice = choice or {}
    args = []
    for kind, c in zip(OPS[graph.nodes[nid]["op"]].signature, graph.node_classes[nid]):
        if kind == "expr":
            args.append(expr(c))
        elif kind == "exprs":
            args.append(_chain(graph, choice, c, expr))
        elif kind in ("int", "float", "name"):
            v = _literal(graph, c)
            args.append(float(v) if kind == "float" else v)
        elif kind in ("list", "shape"):
            args.append(_chain(graph, choice, c, lambda h: _literal(graph, h)))
        elif kind == "access-shape":
            n = choice.get(c) or graph.classes[c][0]
            a, b = graph.node_classes[n]
            args.append(Term("access-shape", (_chain(graph, choice, a, lambda h: _literal(graph, h)),
                                              _chain(graph, choice, b, lambda h: _literal(graph, h)))))
        elif kind == "pad-type":
            n = choice.get(c) or graph.classes[c][0]
            args.append(Term(graph.nodes[n]["op"], ()))
        elif kind == "compute-op":
            args.append(compute_op_term(graph, c, choice))
    return tuple(args)


def compute_op_term(graph: ExtractionGraph, cls: str, choice: dict[str, str] | None = None) -> Term:
    """The compute operator term of ComputeOp class `cls`: its literal parameters read as
    the registry's kinds, operator parameters (a chain's F and G) read recursively."""
    choice = choice or {}
    n = choice.get(cls) or graph.classes[cls][0]
    name = graph.nodes[n]["op"]
    params = []
    for k, p in zip(COMPUTE_OPS[name].params, graph.node_classes[n]):
        if k == "compute-op":
            params.append(compute_op_term(graph, p, choice))
        else:
            v = _literal(graph, p)
            params.append(int(v) if k == "int" else float(v))
    return Term(name, tuple(params))


def decode(graph: ExtractionGraph, choice: dict[str, str], roots) -> dict[str, Term]:
    """Terms for the given root classes under `choice` (class id -> node id), built
    bottom-up with an explicit stack. Returns root class id -> Term."""
    terms = decode_classes(graph, choice, roots)
    return {r: terms[r] for r in roots}


def decode_classes(graph: ExtractionGraph, choice: dict[str, str], roots) -> dict[str, Term]:
    """decode() for every Expr class the roots reach under `choice`: class id -> Term."""
    terms: dict[str, Term] = {}

    def build(nid):
        return Term(graph.nodes[nid]["op"], node_args(graph, nid, lambda c: terms[c], choice))

    for root in roots:
        stack = [(root, False)]
        while stack:
            cls, ready = stack.pop()
            if cls in terms:
                continue
            nid = choice[cls]
            if ready:
                terms[cls] = build(nid)
                continue
            stack.append((cls, True))
            stack.extend((k, False) for k in expr_child_classes(graph, nid, choice) if k not in terms)
    return terms
