"""The why-trace: for each fused atom of the chosen program, the rules that built it.

`why_trace(eg, imported, chosen, library)` walks the chosen program's nodes (the extraction's
choice over the serialised e-graph, `chosen.choice` / `chosen.graph`). A node that the
import wrote is the imported program's own; any other node was built by rewrites, and the
rules that explain it are found by apsat.rules.provenance: the rule whose right side is the
node and whose left side matches in its class, then, for each node of that left-side match
that the import did not write, its own builder, down to the imported program.

Atoms are the chosen nodes built by rewrites that compute (products with bias and
activation, attention, norms, systolic-array calls, merged products, element-wise chains,
activations recognised from their spellings); layout nodes (`access-*`) are neither listed
nor followed. Each report entry:
{"class", "atom" (the node in the language's syntax), "rules" (rule names, each once, in the
order they applied: a rule's inputs before it), "tree"}, the tree {"node", "rule" (None when
no rule explains it: see provenance's module doc), "from": [trees]}.
"""
from __future__ import annotations

from apsat.extract.decode import expr_child_classes, node_args
from apsat.lang.ops import OPS
from apsat.lang.term import ATTRIBUTE_OPS, Term
from apsat.pipeline.why import member_text
from apsat.rules.provenance import RuleIndex

MAX_DEPTH = 24        # a derivation deeper than this is cut (each level is one rule)
MAX_ATOMS = 400       # report entries at most; the count of the rest is noted


def why_trace(eg, imported, chosen, library) -> dict:
    """{"atoms": [entry, ...], "left_out": n} for `chosen` (an extracted Program carrying
    `.choice` and `.graph`) of `imported` (the Program the import wrote, added to `eg`),
    explained by the rules of `library` (module doc). Empty when the program carries no
    choice (a program not made by extraction)."""
    graph, choice = getattr(chosen, "graph", None), getattr(chosen, "choice", None)
    if graph is None or choice is None:
        return {"atoms": [], "left_out": 0}
    original = _original_nodes(eg, imported.terms(), graph)
    atoms = [nid for cls, nid in choice.items() if nid not in original and _is_atom(graph, nid)]
    atoms.sort(key=lambda n: _order(graph, n))
    if not atoms:
        return {"atoms": [], "left_out": 0}
    trace = _Trace(graph, original, RuleIndex(library))
    entries = []
    for nid in atoms[:MAX_ATOMS]:
        tree = trace.tree(nid, 0, frozenset())
        entries.append({"class": graph.nodes[nid]["eclass"], "atom": tree["node"],
                        "rules": _in_order(tree), "tree": tree})
    return {"atoms": entries, "left_out": max(0, len(atoms) - MAX_ATOMS)}


def built_by(eg, terms, graph, nids, library) -> dict[str, str | None]:
    """Node id -> "import" for a node of the added `terms` (what the import wrote), else the
    name of the first rule that explains it (apsat.rules.provenance), else None; for the
    nodes `nids` of `graph`, the serialised e-graph of `eg`."""
    original = _original_nodes(eg, terms, graph)
    index, parents = RuleIndex(library), graph.parents()
    out = {}
    for nid in nids:
        out[nid] = "import" if nid in original else next((r for r, _ in index.builders(graph, nid, parents)), None)
    return out


def _order(graph, nid: str):
    """Kernel atoms first (products, attention, array calls), then the computations; each
    group in the order egglog made their classes (its ids count up)."""
    tail = graph.nodes[nid]["eclass"].rsplit("-", 1)[-1]
    return (graph.nodes[nid]["op"] == "compute", int(tail) if tail.isdigit() else 0)


def _is_atom(graph, nid: str) -> bool:
    op = graph.nodes[nid]["op"]
    return op in OPS and not op.startswith("access")


class _Trace:
    """Derivation trees over one graph, memoised by node."""

    def __init__(self, graph, original: set[str], index: RuleIndex):
        self.graph, self.original, self.index = graph, original, index
        self.memo: dict[str, dict] = {}
        self.parents = graph.parents()

    def tree(self, nid: str, depth: int, above: frozenset) -> dict:
        if nid in self.memo:
            return self.memo[nid]
        out = {"node": member_text(self.graph, nid), "rule": None, "from": []}
        if depth < MAX_DEPTH and nid not in above:
            for rule, used in self.index.builders(self.graph, nid, self.parents):
                # layout nodes (access-*) the left side went through are not followed: the
                # layout rules that made them say how data moves, not what was fused
                inner = sorted(n for n in used if n not in self.original and n != nid and _is_atom(self.graph, n))
                out["rule"] = rule
                out["from"] = [self.tree(n, depth + 1, above | {nid}) for n in inner]
                break
        self.memo[nid] = out
        return out


def _in_order(tree: dict) -> list[str]:
    """The tree's rule names after its inputs' (post-order), each once."""
    out: list[str] = []

    def walk(t):
        for child in t["from"]:
            walk(child)
        if t["rule"] and t["rule"] not in out:
            out.append(t["rule"])
    walk(tree)
    return out


def _original_nodes(eg, terms, graph) -> set[str]:
    """The node ids of `graph` that are the added `terms` themselves. From each root term
    (one no other term reads) in its class, down: in a term's class, the node with the
    term's operator and attributes is the term's, and its Expr child classes are the
    classes of the term's children, in order. Why top-down: one egglog look-up a root
    rather than one a term (a class_of is an egglog call; 5,000 terms took 0.3 s)."""
    terms = list(terms)
    read = {c for t in terms for c in t.children()}
    stack = [(t, eg.class_of(eg.handle_of(t))) for t in terms if t not in read]
    out, seen = set(), set()
    while stack:
        term, cls = stack.pop()
        if term in seen:
            continue
        seen.add(term)
        want = tuple(_slots(a) for a in term.args)
        for nid in graph.classes.get(cls, ()):
            if graph.nodes[nid]["op"] == term.op and node_args(graph, nid, lambda c: _SLOT) == want:
                out.add(nid)
                stack.extend(zip(term.children(), expr_child_classes(graph, nid)))
                break
    return out


_SLOT = ("expr",)      # an Expr argument, compared by position only


def _slots(a):
    """A Term argument with its Expr terms replaced by _SLOT."""
    if isinstance(a, Term) and a.op not in ATTRIBUTE_OPS:
        return _SLOT
    if isinstance(a, tuple):
        return tuple(_slots(x) for x in a)
    return a
