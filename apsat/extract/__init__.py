"""Extraction: choose one program out of an e-graph.

`extract(eg, root, method=..., cost=...)` serialises the e-graph (extraction-gym JSON),
runs an extractor over it, checks the choice is a program (one node per used class, all
children chosen, acyclic) and decodes it into a Program. Extractors are functions
`(graph, roots, node_cost) -> {class id: node id}` registered in EXTRACTORS; better ones
(greedy-DAG, ILP) plug in here with the same signature.
"""
from __future__ import annotations

import time

from apsat.egraph.program import Program
from apsat.extract.check import check_extraction, dag_cost
from apsat.extract.cost import cost_model
from apsat.extract.decode import decode, language_graph
from apsat.extract.tree import extract_tree

EXTRACTORS = {"tree": extract_tree}


def extract(eg, root, method: str = "tree", cost="nodes") -> Program:
    """The best program for `root` (a handle from `eg.add`, or a dict output name ->
    handle) under `method` and the cost model `cost` (a name or a cost-model object).
    The Program carries `.cost` (its DAG cost: shared classes paid once) and
    `.extraction` (method, cost model, seconds, tree-vs-DAG figures)."""
    if method not in EXTRACTORS:
        raise ValueError(f"unknown extraction method {method!r}; known: {', '.join(EXTRACTORS)}")
    outputs = root if isinstance(root, dict) else {"out": root}
    start = time.perf_counter()
    graph = language_graph(eg.serialize())
    roots = [eg.class_of(h) for h in outputs.values()]
    node_cost = cost_model(cost).node_cost(graph)
    choice = EXTRACTORS[method](graph, roots, node_cost)
    missing = [r for r in roots if r not in choice]
    if missing:
        raise ValueError(f"extract: no finite-cost program for e-class {missing[0]}")
    used = check_extraction(graph, choice, roots)
    terms = decode(graph, choice, roots)
    seconds = time.perf_counter() - start
    program = Program({name: terms[eg.class_of(h)] for name, h in outputs.items()},
                      dict(eg.tensor_shapes), dict(eg.opaque_nodes))
    program.cost = dag_cost(graph, choice, roots, node_cost)
    program.extraction = {"method": method, "cost_model": cost_model(cost).name,
                          "seconds": seconds, "classes_used": len(used),
                          "egraph_nodes": len(graph.nodes)}
    return program
