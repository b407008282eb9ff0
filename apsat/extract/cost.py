"""Cost models: what one e-node costs on a target.

The interface extractors plug into: a cost model is an object with
`node_cost(graph: ExtractionGraph) -> callable(node_id) -> float`, so a model can look at
a node's context in the graph (its children's classes and their members). The target cost
models (gpu roofline, systolic cycles) implement the same interface.
"""
from __future__ import annotations

from apsat.egraph.ops import OPS
from apsat.extract.graph import ExtractionGraph


class NodeCount:
    """Every Expr node costs 1; lists, literals and operator tags cost nothing. Tree cost
    is then term size and DAG cost the number of distinct Expr nodes."""

    name = "nodes"

    def node_cost(self, graph: ExtractionGraph):
        return lambda nid: 1.0 if graph.nodes[nid]["op"] in OPS else 0.0


COST_MODELS = {"nodes": NodeCount}


def cost_model(name_or_model):
    """A cost model object from a name in COST_MODELS or an object with `node_cost`."""
    if hasattr(name_or_model, "node_cost"):
        return name_or_model
    if name_or_model not in COST_MODELS:
        raise ValueError(f"unknown cost model {name_or_model!r}; known: {', '.join(COST_MODELS)}")
    return COST_MODELS[name_or_model]()
