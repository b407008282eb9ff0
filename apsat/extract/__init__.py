"""Extraction: choose one program out of an e-graph.

`extract(eg, root, method=..., cost=...)` serialises the e-graph (extraction-gym JSON),
runs an extractor over it, checks the choice is a program (one node per used class, all
children chosen, acyclic) and decodes it into a Program. Extractors are functions
`(graph, roots, node_cost) -> {class id: node id}` registered in EXTRACTORS: "tree" (tree
cost, the baseline), "greedy-dag" (DAG cost, fast heuristic) and "ilp" (exact DAG cost with
HiGHS under a time limit). An extractor that takes a `time_limit` keyword gets one when
the caller gives one; one that returns an ExtractionResult (a dict with `.optimal`,
`.gap`) has those figures copied into the report.
"""
from __future__ import annotations

import inspect
import time

from apsat.errors import ExtractionError
from apsat.lang.program import Program
from apsat.extract.check import check_extraction, check_roots, dag_cost
from apsat.extract.cost import cost_model
from apsat.extract.decode import decode_classes, language_graph
from apsat.extract.greedy_dag import extract_greedy_dag
from apsat.extract.ilp import ExtractionResult, extract_ilp
from apsat.extract.sharing import merge_siblings
from apsat.extract.tree import extract_tree

EXTRACTORS = {"tree": extract_tree, "greedy-dag": extract_greedy_dag, "ilp": extract_ilp}


def run_extractor(method: str, graph, roots, node_cost=None, time_limit: float | None = None):
    """Run EXTRACTORS[method]; `time_limit` (seconds) reaches extractors that take one and
    is ignored by the others. Returns the extractor's choice (a dict; for "ilp" an
    ExtractionResult with `.optimal`, `.gap`, `.bound`, `.stats`); a root with no program
    is left out of it (check_roots says why). ExtractionError for an unknown method."""
    fn = _extractor(method)
    if time_limit is not None and "time_limit" in inspect.signature(fn).parameters:
        return fn(graph, roots, node_cost, time_limit=time_limit)
    return fn(graph, roots, node_cost)


def _extractor(method: str):
    """EXTRACTORS[method]; ExtractionError naming the known ones otherwise."""
    if method not in EXTRACTORS:
        raise ExtractionError(f"unknown extraction method {method!r}; known: {', '.join(EXTRACTORS)}")
    return EXTRACTORS[method]


def _forced(graph, roots) -> dict[str, str] | None:
    """The choice when every class the roots reach holds one node (an e-graph no rule has
    run on: the imported program, priced before saturation), else None. No extractor
    needed: on a 30k-node program greedy-DAG took 2.5 s to find the only choice."""
    choice, stack = {}, list(roots)
    while stack:
        c = stack.pop()
        if c in choice:
            continue
        nodes = graph.classes.get(c, ())
        if len(nodes) != 1:
            return None
        choice[c] = nodes[0]
        stack.extend(graph.node_classes[nodes[0]])
    return choice


def extract(eg, root, method: str = "greedy-dag", cost=None, time_limit: float | None = None) -> Program:
    """The best program for `root` (a handle from `eg.add`, or a dict output name ->
    handle) under `method` and the cost model `cost` (a name in COST_MODELS, a cost-model
    object, or None for the e-graph's target's own model: "gpu" or "systolic").
    The Program carries `.cost` (its DAG cost: shared classes paid once) and
    `.extraction` (method, cost model, seconds, tree-vs-DAG figures; with "ilp" also
    `optimal` and `gap`). `time_limit` (seconds) bounds extractors that take one (ilp).
    ExtractionError (an ApsatError and a ValueError) for an unknown method or cost model, no
    root, or a root with no acyclic program; EGraphError for a handle of another e-graph."""
    program = extract_candidates(eg, root, method, cost, time_limit, merges=False)[0][1]
    program.graph = None          # the e-graph's copy is not kept alive by a returned program
    return program


def _priced_graph(eg, outputs: dict, cost):
    """(the serialised e-graph as an ExtractionGraph, class shapes and weights included;
    the outputs' root classes; the cost model; its node_cost over the graph)."""
    graph = language_graph(eg.serialize())   # class shapes included: egglog's, exported
    graph.weights = frozenset(eg.weights)
    model = cost_model(cost, eg.target)
    return graph, [eg.class_of(h) for h in outputs.values()], model, model.node_cost(graph)


def imported_cost(eg, root, cost=None) -> float:
    """The DAG cost of the program an e-graph no rule has run on holds for `root` (a handle
    or a dict of them), under `cost` as in extract: the imported program priced by the
    e-node model. The same figure as extract(eg, root).cost, without rebuilding and
    checking the program (a 10,000-node model: 0.9 s against 1.3 s). Where a class holds
    more than one node (rules ran) it is extract's figure."""
    graph, roots, _, node_cost = _priced_graph(eg, root if isinstance(root, dict) else {"out": root}, cost)
    choice = _forced(graph, roots)
    if choice is None:
        return extract(eg, root, cost=cost).cost
    return dag_cost(graph, choice, roots, node_cost)


def extract_candidates(eg, root, method: str = "greedy-dag", cost=None, time_limit: float | None = None,
                       merges: bool = True) -> list[tuple[str, Program]]:
    """[(label, Program)]: "as extracted", extract's program, and where `merges` and the
    e-graph holds sibling merges the program can take (apsat/rules/merge.egg), "siblings
    merged", the same program with every such merge taken (apsat/extract/sharing.py).
    The target's planner chooses between them by what the backend emits
    (apsat/pipeline/plan.py). Arguments and errors as extract's."""
    _extractor(method)
    outputs = root if isinstance(root, dict) else {"out": root}
    if not outputs:
        raise ExtractionError("extract: no root e-class given (an empty dict of outputs)")
    start = time.perf_counter()
    graph, roots, model, node_cost = _priced_graph(eg, outputs, cost)
    forced = _forced(graph, roots)
    choice = forced or run_extractor(method, graph, roots, node_cost, time_limit)
    check_roots(graph, choice, roots)
    used = check_extraction(graph, choice, roots)
    seconds = time.perf_counter() - start
    out = [("as extracted", _program(eg, graph, outputs, roots, choice, node_cost))]
    out[0][1].extraction = {"method": method, "cost_model": model.name, "seconds": seconds,
                            "classes_used": len(used), "egraph_nodes": len(graph.nodes)}
    if isinstance(choice, ExtractionResult):
        out[0][1].extraction.update(optimal=choice.optimal, gap=choice.gap)
    if merges and not forced:
        fill = choice if method == "greedy-dag" else lambda: extract_greedy_dag(graph, roots, node_cost)
        merged = merge_siblings(graph, choice, roots, fill)
        if merged is not None:
            check_extraction(graph, merged, roots)
            program = _program(eg, graph, outputs, roots, merged, node_cost)
            program.extraction = dict(out[0][1].extraction, classes_used=len(merged))
            out.append(("siblings merged", program))
    return out


def _program(eg, graph, outputs: dict, roots, choice: dict, node_cost) -> Program:
    """The Program `choice` makes of `outputs`, with its DAG cost as `.cost`."""
    terms = decode_classes(graph, choice, roots)
    shapes = {t: graph.shapes[c] for c, t in terms.items() if c in (graph.shapes or {})}
    program = Program({name: terms[eg.class_of(h)] for name, h in outputs.items()},
                      dict(eg.tensor_shapes), dict(eg.opaque_nodes), weights=graph.weights,
                      tensor_types=dict(eg.tensor_types), known_shapes=shapes)
    program.cost = dag_cost(graph, choice, roots, node_cost)
    # What the program was chosen from (apsat.pipeline.trace reads them for the why-trace):
    # the choice, class id -> node id, and the serialised e-graph it names.
    program.choice, program.graph = dict(choice), graph
    return program
