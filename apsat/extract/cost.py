"""Cost models: what one e-node costs on a target.

The interface extractors plug into: a cost model is an object with a `name` and
`node_cost(graph: ExtractionGraph) -> callable(node_id) -> float` (non-negative; inf for a
node that must never be chosen), so a model can look at a node's context in the graph:
its children's classes, their shapes (`graph.shapes`) and the data underneath them.

Models: "nodes" (every Expr node costs 1), "gpu" (roofline microseconds on an H100,
cost_gpu.py) and "systolic" (cycles on a systolic-array accelerator, cost_systolic.py).
Where context enters a cost is listed in workload.py's module doc.
"""
from __future__ import annotations

from apsat.errors import ExtractionError
from apsat.lang.ops import OPS
from apsat.extract.cost_gpu import GpuRoofline
from apsat.extract.cost_systolic import SystolicCycles
from apsat.extract.graph import ExtractionGraph


class NodeCount:
    """Every Expr node costs 1; lists, literals and operator tags cost nothing. Tree cost
    is then term size and DAG cost the number of distinct Expr nodes."""

    name = "nodes"

    def node_cost(self, graph: ExtractionGraph):
        return lambda nid: 1.0 if graph.nodes[nid]["op"] in OPS else 0.0


COST_MODELS = {"nodes": NodeCount, "gpu": GpuRoofline, "systolic": SystolicCycles}


def cost_model(name_or_model, target=None):
    """A cost model object: `name_or_model` itself when it has `node_cost`, else the model
    registered under that name in COST_MODELS; None picks the target's own model ("gpu"
    or "systolic", with the target's accelerator). ExtractionError (a ValueError)
    for an unknown name."""
    if hasattr(name_or_model, "node_cost"):
        return name_or_model
    if name_or_model is None:
        name_or_model = target.kind if target is not None else "nodes"
    if name_or_model not in COST_MODELS:
        raise ExtractionError(f"unknown cost model {name_or_model!r}; known: {', '.join(COST_MODELS)}")
    if name_or_model == "systolic" and target is not None and target.kind == "systolic":
        return SystolicCycles.for_target(target)
    return COST_MODELS[name_or_model]()
