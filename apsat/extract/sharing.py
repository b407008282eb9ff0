"""Sibling merges taken together: the move a per-class extractor cannot make.

The merge rules (apsat/rules/merge.egg) put, into each sibling product's class, a slice of
one wider product over the siblings' weights. Greedy-DAG prices each slice as the whole
wider product, blind to the siblings that would share it, so it keeps the separate
products; the ILP sees the sharing but prices it by the e-node model, which does not know
which element-wise work the backend folds into the merged kernel. `merge_siblings` makes
the move whole: every used class that can read a slice of one merged product takes it,
widest merge first, and the pipeline's planner (apsat/pipeline/plan.py) prices the result
against the extractor's own choice by what the backend emits.

A member reads its slice directly (`access-slice m ..` in its class) or through one
compute operator (`f(d)` in its class, `access-slice m ..` in d's): a product whose atom
applies an activation that the merged product does not share.
"""
from __future__ import annotations

from apsat.extract.check import find_back_edge, reachable
from apsat.extract.graph import ExtractionGraph

PRODUCTS = ("fused-dot-bias", "fused-dot-bias-act")


def merge_siblings(graph: ExtractionGraph, choice: dict[str, str], roots, fill=None) -> dict[str, str] | None:
    """`choice` (a valid program for `roots`) with each group of used classes that can read
    slices of one merged product switched to those slices, groups with more members
    first (a class joins one group), each group kept only where the program stays
    acyclic. Classes the merged products newly need take `fill`'s choice: a dict, or a
    function making one, called only when some group is found (default `choice`; a class
    `fill` does not cover drops the group). None when no group applies. The result
    covers exactly the classes the program uses."""
    used = set(reachable(graph, choice, roots))
    groups = _groups(graph, used)
    if not groups:
        return None
    fill = choice if fill is None else fill() if callable(fill) else fill
    taken, best, merged = set(), dict(choice), 0
    for product, readers in groups:
        readers = [(c, steps) for c, steps in readers if c not in taken]
        if len(readers) < 2:
            continue
        trial = dict(best)
        for _, steps in readers:
            trial.update(steps)
        needed = [k for _, steps in readers for n in steps.values() for k in graph.node_classes[n]]
        if not _complete(graph, trial, needed, fill) or find_back_edge(graph, trial, roots) is not None:
            continue
        best, merged = trial, merged + 1
        taken.update(c for c, _ in readers)
    if not merged:
        return None
    return {c: best[c] for c in reachable(graph, best, roots)}


def _groups(graph: ExtractionGraph, used: set) -> list:
    """[(merged product class, [(member class, {class: node} steps)])], most members
    first, then fewest steps (members reading their slice directly: a merged atom that
    applies their shared activation itself), then by class id: for each used class, the
    product classes it can read a slice of (see the module doc), each member counted once
    per product."""
    readers: dict[str, dict] = {}
    for c in sorted(used):
        for product, steps in _slices(graph, c):
            readers.setdefault(product, {}).setdefault(c, steps)
    groups = [(p, sorted(r.items())) for p, r in readers.items() if len(r) > 1 and _is_product(graph, p)]
    return sorted(groups, key=lambda g: (-len(g[1]), sum(len(steps) for _, steps in g[1]), g[0]))


def _slices(graph: ExtractionGraph, c: str):
    """(sliced class, steps) for each slice class c can read: its own slice nodes, and
    slice nodes of the operand class of its compute nodes."""
    for n in graph.classes.get(c, ()):
        op = graph.nodes[n]["op"]
        if op == "access-slice":
            yield graph.node_classes[n][0], {c: n}
        elif op == "compute":
            d = graph.node_classes[n][1]
            for s in graph.classes.get(d, ()):
                if graph.nodes[s]["op"] == "access-slice" and d != c:
                    yield graph.node_classes[s][0], {c: n, d: s}


def _is_product(graph: ExtractionGraph, cls: str) -> bool:
    return any(graph.nodes[n]["op"] in PRODUCTS for n in graph.classes.get(cls, ()))


def _complete(graph: ExtractionGraph, trial: dict, start: list, fill: dict) -> bool:
    """Give every class reachable from the classes `start` that `trial` has no node for
    `fill`'s node (the merged product, and the slice bounds a new slice node reads);
    False when `fill` has none."""
    stack = list(start)
    while stack:
        k = stack.pop()
        if k in trial:
            continue
        if k not in fill:
            return False
        trial[k] = fill[k]
        stack.extend(graph.node_classes[fill[k]])
    return True
