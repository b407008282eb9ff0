"""Saturation by regions, with reuse for structurally identical regions.

A model's term DAG is cut at its shared values: a region is the tree of single-use terms
under one shared (or output) term, down to the shared terms and leaves it reads (its
inputs). A region's key is its term with the inputs replaced by placeholders of the same
access shapes, plus the phase plan and the target: ResNet-50's repeated bottleneck blocks
have equal keys, so each distinct block is saturated once, in a small e-graph of its own,
and the saturated e-graph (the template) is instantiated into the model's e-graph once
per occurrence, its placeholders bound to that occurrence's inputs.

Rewrites that would need to see across a region boundary (through a shared value) are
not found this way; `saturate(..., regions=False)` saturates the whole graph instead.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from apsat.lang.ops import EGG_NAMES, OPS
from apsat.lang.program import Program
from apsat.lang.syntax import to_text
from apsat.lang.term import Term

PLACEHOLDER = "__region{}_in{}"  # region index, input index


@dataclass
class Region:
    """One occurrence: `root` term, its `inputs` (frontier terms, first-use order), the
    abstracted `template_root` and the reuse `key`."""

    root: Term
    inputs: list[Term]
    template_root: Term
    key: str


def find_regions(program: Program) -> list[Region]:
    """Regions of a program: one per shared or output non-leaf term."""
    order = program.terms()
    cuts = _cuts(program, order)
    regions = []
    for t in order:
        if t in cuts and t.op != "access-tensor":
            regions.append(_abstract(program, t, cuts))
    return regions


def _abstract(program: Program, root: Term, cuts: set, index: str = "") -> Region:
    """Replace the region's frontier terms by placeholders `(access (access-tensor
    __region_inK) split)` of the same access shape (built bottom-up, no recursion)."""
    inputs: list[Term] = []
    placeholder: dict[Term, Term] = {}
    rebuilt: dict[Term, Term] = {}
    for t in _region_terms(root, cuts):
        if t is not root and t in cuts:
            if t not in placeholder:
                it, _ = program.shape_of(t)
                name = PLACEHOLDER.format(index, len(inputs))
                placeholder[t] = Term("access", (Term("access-tensor", (name,)), len(it)))
                inputs.append(t)
            rebuilt[t] = placeholder[t]
            continue
        if any(c in rebuilt for c in t.children()):
            rebuilt[t] = Term(t.op, tuple(_swap(a, rebuilt) for a in t.args))
        else:
            rebuilt[t] = t
    shapes = tuple(program.shape_of(t) for t in inputs)
    key = to_text(rebuilt[root]) + "|" + repr(shapes)
    return Region(root, inputs, rebuilt[root], key)


def _region_terms(root: Term, cuts: set) -> list[Term]:
    """Terms of the region under `root`, children first, stopping at (and including)
    frontier terms; explicit stack."""
    order, seen, stack = [], set(), [(root, False)]
    while stack:
        t, expanded = stack.pop()
        if expanded:
            order.append(t)
            continue
        if t in seen:
            continue
        seen.add(t)
        stack.append((t, True))
        if t is root or t not in cuts:
            stack.extend((c, False) for c in reversed(list(t.children())) if c not in seen)
    return order


def _swap(arg, rebuilt):
    if isinstance(arg, Term):
        return rebuilt.get(arg, arg)
    if isinstance(arg, tuple) and arg and isinstance(arg[0], Term):
        return tuple(rebuilt.get(a, a) for a in arg)
    return arg


class _Renderer:
    """egglog text for nodes of a serialised template, with Expr children as handles."""

    def __init__(self, data: dict):
        self.nodes = data["nodes"]
        self.types = {c: d.get("type", "") for c, d in data["class_data"].items()}
        self.members: dict[str, list[str]] = {}
        for nid, n in self.nodes.items():
            self.members.setdefault(n["eclass"], []).append(nid)

    def value(self, cls: str, handles: dict) -> str | None:
        """A non-Expr class as text (first member), None if it needs an unmapped class."""
        if self.types.get(cls) == "Expr":
            return handles.get(cls)
        nid = self.members[cls][0]
        return self.node(nid, handles)

    def node(self, nid: str, handles: dict) -> str | None:
        n = self.nodes[nid]
        if not n["children"] and self.types.get(n["eclass"]) in ("i64", "f64", "String", "bool"):
            return n["op"]
        parts = [EGG_NAMES.get(n["op"], n["op"])]
        for ch in n["children"]:
            text = self.value(self.nodes[ch]["eclass"], handles)
            if text is None:
                return None
            parts.append(text)
        return "(" + " ".join(parts) + ")"


class Template:
    """One distinct region's saturated classes in the template e-graph, with the order in
    which its Expr nodes can be written (every Expr child class bound or written before),
    found once and replayed for each occurrence."""

    def __init__(self, data: dict, root_cls: str, holes: list[tuple[str, str]], classes):
        self.data, self.root_cls, self.holes = data, root_cls, holes
        r = data["_renderer"]
        tensors = {t for _, t in holes}
        nodes = [nid for c in classes if r.types.get(c) == "Expr" and c not in tensors
                 for nid in r.members.get(c, ()) if data["nodes"][nid]["op"] in OPS]
        self.order = _emission_order(r, data, nodes, {root_cls} | {a for a, _ in holes} | tensors)

    def statements(self, root: str, inputs: list[str], fresh) -> list[str]:
        """egglog statements adding this template for one occurrence: `root` the handle of
        the occurrence's root, `inputs` the handles of its inputs (in hole order)."""
        r, nodes = self.data["_renderer"], self.data["nodes"]
        handles = {self.root_cls: root}
        out = []
        for (access_cls, tensor_cls), h in zip(self.holes, inputs):
            handles.setdefault(access_cls, h)
            handles[tensor_cls] = fresh()
            out.append(f"(set {handles[tensor_cls]} (access {h} 0))")
        for nid in self.order:
            cls = nodes[nid]["eclass"]
            text = r.node(nid, handles)
            if cls in handles:
                out.append(f"(union {handles[cls]} {text})")
            else:
                handles[cls] = fresh()
                out.append(f"(set {handles[cls]} {text})")
        return out


def _emission_order(r: _Renderer, data: dict, nodes: list[str], bound: set) -> list[str]:
    """`nodes` in an order in which each one's Expr children are in `bound` or in the
    class of a node before it; nodes that never become writable (their classes reachable
    only through unbound cycles) are left out."""
    known = {c: "x" for c in bound}
    order, done, progress = [], set(), True
    while progress:
        progress = False
        for nid in nodes:
            if nid in done or r.node(nid, known) is None:
                continue
            known.setdefault(data["nodes"][nid]["eclass"], "x")
            order.append(nid)
            done.add(nid)
            progress = True
    return order


def _reachable(data: dict, root_cls: str, members: dict[str, list[str]]) -> set[str]:
    """Classes reachable from `root_cls` through node children (`members`: class -> node ids)."""
    nodes = data["nodes"]
    seen, stack = set(), [root_cls]
    while stack:
        c = stack.pop()
        if c in seen:
            continue
        seen.add(c)
        for nid in members.get(c, ()):
            stack.extend(nodes[ch]["eclass"] for ch in nodes[nid]["children"])
    return seen


def saturate_regions(eg, program: Program, run_plan) -> dict:
    """Saturate `eg` (holding `program`) region by region: the distinct regions are
    added side by side to one template e-graph (placeholders named per region, so their
    shapes never meet), `run_plan(template_eg)` saturates them together once, and each
    occurrence is instantiated from its template's classes. Returns {"regions",
    "distinct", "reuse_rate", "seconds", "template_report", "template_nodes"}."""
    from apsat.egraph.driver import EGraph

    start = time.perf_counter()
    order = program.terms()
    regions = find_regions(program)
    cuts = _cuts(program, order)
    distinct: dict[str, Region] = {}
    for region in regions:
        if region.key not in distinct:
            distinct[region.key] = _abstract(program, region.root, cuts, str(len(distinct)))
    shapes = dict(program.tensor_shapes)
    for j, reg in enumerate(distinct.values()):
        for i, t in enumerate(reg.inputs):
            it, item = program.shape_of(t)
            shapes[PLACEHOLDER.format(j, i)] = it + item
    teg = EGraph(target=eg.target)
    types = {PLACEHOLDER.format(j, i): program.dtype_of(t)
             for j, reg in enumerate(distinct.values()) for i, t in enumerate(reg.inputs)}
    tprog = Program({f"r{j}": r.template_root for j, r in enumerate(distinct.values())}, shapes,
                    program.opaque_nodes, tensor_types={**program.tensor_types, **types})
    troots = teg.add_outputs(tprog)
    report = run_plan(teg)
    data = teg.serialize()
    data["_renderer"] = _Renderer(data)  # built once, shared by every instantiation
    templates: dict[str, Template] = {}
    holes_of = _placeholders(tprog)
    for j, (key, reg) in enumerate(distinct.items()):
        root_cls = teg.class_of(troots[f"r{j}"])
        holes = []
        for i in range(len(reg.inputs)):
            access = holes_of[PLACEHOLDER.format(j, i)]
            holes.append((teg.class_of(teg.handle_of(access)), teg.class_of(teg.handle_of(access.args[0]))))
        templates[key] = Template(data, root_cls, holes, sorted(_reachable(data, root_cls, data["_renderer"].members)))

    def build(fresh):      # every occurrence in one batch: one shape check at the end
        return [line for region in regions
                for line in templates[region.key].statements(
                    eg.handle_of(region.root), [eg.handle_of(t) for t in region.inputs], fresh)]
    eg.add_statements(build)
    n = len(regions)
    return {"regions": n, "distinct": len(distinct),
            "reuse_rate": round(1 - len(distinct) / n, 4) if n else 0.0,
            "seconds": round(time.perf_counter() - start, 4), "template_report": report,
            "template_nodes": teg.size()[0]}


def _cuts(program: Program, order) -> set:
    uses: dict[Term, int] = {}
    for t in order:
        for c in t.children():
            uses[c] = uses.get(c, 0) + 1
    roots = set(program.outputs.values())
    return {t for t in order if uses.get(t, 0) > 1 or t in roots or t.op == "access-tensor"}


def _placeholders(prog: Program) -> dict[str, Term]:
    """Placeholder tensor name -> its `(access (access-tensor NAME) split)` term."""
    return {t.args[0].args[0]: t for t in prog.terms()
            if t.op == "access" and t.args[0].op == "access-tensor"
            and t.args[0].args[0].startswith("__region")}
