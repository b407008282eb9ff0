"""Access shapes of the e-classes of a serialised e-graph, for cost models.

Every member of an e-class denotes the same value, so the class has one access shape (the
e-graph's shape analysis refuses a class with two). The serialised graph holds only the
language's nodes, not egglog's shape tables, so the shapes are derived again here from
the registry's Python shape rules (apsat/lang/ops.py): a class gets its shape from the
first member whose children are shaped, repeated until nothing changes. Cost models read
the result to count FLOPs and bytes.
"""
from __future__ import annotations

from apsat.lang.ops import OPS
from apsat.lang.program import apply_shape_rule
from apsat.errors import ShapeError
from apsat.extract.decode import expr_child_classes, node_args
from apsat.extract.graph import ExtractionGraph


def class_shapes(graph: ExtractionGraph, tensor_shapes: dict) -> dict:
    """Class id -> ((iterated dims), (item dims)) for every Expr class that has a member
    whose children are all shaped (tensors take their dims from `tensor_shapes`). Classes
    left without a shape (only cyclic members, or members over unknown tensors) are absent."""
    shapes: dict = {}
    pending = {nid for nid, node in graph.nodes.items() if node["op"] in OPS}
    kids = {nid: expr_child_classes(graph, nid) for nid in pending}
    waiting: dict[str, list[str]] = {}   # class -> nodes waiting for its shape
    ready = [nid for nid in pending if not kids[nid]]
    for nid in pending:
        for c in kids[nid]:
            waiting.setdefault(c, []).append(nid)
    while ready:
        nid = ready.pop()
        cls = graph.nodes[nid]["eclass"]
        if cls in shapes or any(c not in shapes for c in kids[nid]):
            continue
        try:
            shapes[cls] = _node_shape(graph, nid, shapes, tensor_shapes)
        except (ShapeError, KeyError, ValueError):
            continue   # another member may shape the class
        ready.extend(waiting.get(cls, ()))
    return shapes


def _node_shape(graph, nid, shapes, tensor_shapes):
    """One node's access shape from its children's, through the registry's shape rule."""
    args = node_args(graph, nid, lambda c: c)
    return apply_shape_rule(graph.nodes[nid]["op"], args, shapes.__getitem__, tensor_shapes)
