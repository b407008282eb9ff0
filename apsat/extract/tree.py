"""Tree-cost extraction: the baseline. A class costs its cheapest node plus the cost of
each child *per use*, so shared sub-programs are counted once per use (the classic trap
that DAG-cost extractors avoid). Runs a worklist to a fixpoint over the serialised
e-graph, which handles cycles in the e-graph (a cyclic choice never has finite cost).

On residual DAGs tree cost doubles per block and passes float range after ~1000 blocks
(egglog's built-in u64 tree cost overflows at ~50): costs then saturate at inf, ties are
broken by node id, and the result is still a valid program -- just not a tree-optimal one."""
from __future__ import annotations

import heapq

from apsat.extract.graph import ExtractionGraph


def extract_tree(graph: ExtractionGraph, roots=None, node_cost=None) -> dict[str, str]:
    """Choose, for every class with a finite-cost node, the node minimising tree cost.
    `node_cost(node_id) -> float` defaults to the costs stored in the graph.
    Returns class id -> node id (ties broken by node id, so results are deterministic)."""
    cost = node_cost or graph.cost
    own = {n: cost(n) for n in graph.nodes}
    best: dict[str, float] = {}
    choice: dict[str, str] = {}
    parents = graph.parents()
    # Dijkstra-like: with non-negative costs a class's final cost is settled when popped,
    # and each node is re-evaluated only when a child class improves.
    heap: list[tuple[float, str, str]] = []
    for nid, kids in graph.node_classes.items():
        if not kids:
            heapq.heappush(heap, (own[nid], nid, graph.nodes[nid]["eclass"]))
    while heap:
        c_cost, nid, cls = heapq.heappop(heap)
        if cls in best:
            continue
        best[cls] = c_cost
        choice[cls] = nid
        for parent in parents.get(cls, ()):
            kids = graph.node_classes[parent]
            if all(k in best for k in kids):
                total = own[parent] + sum(best[k] for k in kids)  # may reach inf: see below
                pcls = graph.nodes[parent]["eclass"]
                if pcls not in best:
                    heapq.heappush(heap, (total, parent, pcls))
    return choice
