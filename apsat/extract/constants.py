"""Weight-only work: e-nodes whose value depends on weights and literals alone.

A model's weights (its ONNX initializers, `Program.weights`) are known when it is loaded,
so anything computed from them alone (BatchNorm folded into a convolution's weights, a
weight matrix stored transposed for the array, a bias reshaped) is done once at load time,
not per inference: the systolic backend puts it in its stream's `init` section, the GPU
runner in its `prepare` step. The target cost models price such nodes at 0, so extraction
neither avoids folding (which moves work onto the weights) nor charges a layout change of
the weights as a per-inference copy.

A node is weight-only when it is a language op other than `opaque` and either reads a
weight (`access-tensor` of a name in the weights), is a literal, or has only weight-only
Expr children (a class is weight-only when one of its members is: all members compute
the same value). Found by a worklist from the leaves, each node visited once per child.
"""
from __future__ import annotations

from apsat.lang.ops import OPS
from apsat.extract.decode import expr_child_classes, node_args
from apsat.extract.graph import ExtractionGraph


def weight_only_nodes(graph: ExtractionGraph, weights) -> set[str]:
    """Ids of the nodes of `graph` whose value depends only on the tensors named in
    `weights` and on literals."""
    weights = set(weights)
    kids = {nid: expr_child_classes(graph, nid) for nid, n in graph.nodes.items()
            if n["op"] in OPS and n["op"] != "opaque"}
    waiting = {nid: len(set(ks)) for nid, ks in kids.items()}
    users: dict[str, list[str]] = {}
    for nid, ks in kids.items():
        for c in set(ks):
            users.setdefault(c, []).append(nid)
    ready = [nid for nid, ks in kids.items() if not ks and _leaf_is_known(graph, nid, weights)]
    done, known_classes = set(), set()
    while ready:
        nid = ready.pop()
        if nid in done:
            continue
        done.add(nid)
        cls = graph.nodes[nid]["eclass"]
        if cls in known_classes:
            continue
        known_classes.add(cls)
        for user in users.get(cls, ()):
            waiting[user] -= 1
            if waiting[user] == 0:
                ready.append(user)
    return done


def _leaf_is_known(graph: ExtractionGraph, nid: str, weights: set) -> bool:
    op = graph.nodes[nid]["op"]
    if op == "access-tensor":
        return node_args(graph, nid, lambda c: c)[0] in weights
    return op == "access-literal"


__all__ = ["weight_only_nodes"]
