"""Greedy DAG-cost extraction (extraction-gym's faster-greedy-dag idea).

A class's cost is not a number but the *set* of distinct classes its current choice needs,
each with the cost of the node chosen there, so shared sub-programs are paid once. A node
costs its own cost plus the total of the union of its children's sets; classes are
settled cheapest first (Knuth's generalisation of Dijkstra), each node evaluated once.

It is a heuristic: the union of locally best sets is not the best union.
It is the fast default and the warm start of the ILP extractor (apsat/extract/ilp.py).

Following the per-class choices could in principle close a cycle that no single set saw
(a set excludes its own class, not every path back to it). `_break_cycles` repairs that
case with tree choices (acyclic by construction), so the result is always a valid program.
"""
from __future__ import annotations

import heapq

from apsat.extract.check import dag_cost, find_back_edge
from apsat.extract.graph import ExtractionGraph
from apsat.extract.tree import extract_tree


def extract_greedy_dag(graph: ExtractionGraph, roots=None, node_cost=None) -> dict[str, str]:
    """Choose, for every class that has an acyclic finite program, the node whose program
    has the least DAG cost found by the greedy set-union fixpoint.
    `roots` is accepted for signature compatibility (every class is solved; the repair of
    stale cycles starts from `roots`, default `graph.roots`). `node_cost(node_id) -> float`
    (non-negative) defaults to the costs stored in the graph.
    When tree extraction's program is cheaper (DAG cost, at the roots) it is taken
    instead, so greedy-DAG is never worse than the tree baseline; then `_improve` switches
    used classes to nodes that reuse what the program already computes.
    Returns class id -> node id; following it from the roots gives an acyclic program."""
    cost = node_cost or graph.cost
    roots = graph.roots if roots is None else list(roots)
    own = {n: cost(n) for n in graph.nodes}
    choice = _settle_classes(graph, own)
    choice = _break_cycles(graph, choice, roots, node_cost)
    if not roots:
        return choice
    # Greedy unions can lose to plain tree choices (rover's box filter: 1819 vs 1701), and
    # the tree extractor is cheap next to this pass: keep whichever costs less at the roots.
    tree = extract_tree(graph, roots, node_cost)
    if all(r in tree for r in roots) and (not all(r in choice for r in roots) or (
            dag_cost(graph, tree, roots, node_cost) < dag_cost(graph, choice, roots, node_cost))):
        choice = tree
    if all(r in choice for r in roots):
        choice = _improve(graph, choice, roots, own)
    return choice


def _settle_classes(graph: ExtractionGraph, own: dict[str, float]) -> dict[str, str]:
    """The greedy set-union fixpoint: class id -> the node whose set (own cost plus the
    union of its children's sets) is cheapest, for every class with an acyclic finite
    program. Following these choices may still close a cycle (see the module docstring)."""
    nodes = graph.nodes
    cls_of = {n: nodes[n]["eclass"] for n in nodes}
    # Distinct child classes: DAG cost pays a class once however often a node uses it.
    kids = {n: list(dict.fromkeys(ks)) for n, ks in graph.node_classes.items()}
    parents = graph.parents()

    sets: dict[str, dict[str, float]] = {}  # class -> {class it needs: cost paid there}
    total: dict[str, float] = {}  # class -> sum of its set
    choice: dict[str, str] = {}
    # Knuth's generalisation of Dijkstra: a node's total (own cost + the union of its
    # children's sets) is never below any child's total, so the cheapest candidate popped
    # for a class is final. Each node is evaluated once, when its last child class is
    # final; a plain worklist re-evaluates a class every time a descendant improves, which
    # on deep e-graphs with real costs (DenseNet-121, systolic cycles) meant ~1M
    # re-evaluations, each copying a set of thousands of classes.
    waiting = {n: len(ks) for n, ks in kids.items()}
    # parent nodes yet to read each class's set: at 0 the set goes (why: a deep DAG's sets
    # each hold every class below, so keeping them all took 4.4 GB on 10,000 ONNX nodes)
    readers = {c: len(ps) for c, ps in parents.items()}
    heap = []
    counter = 0
    for n in nodes:
        if not kids[n]:
            heapq.heappush(heap, (own[n], counter, n, None))
            counter += 1
    while heap:
        t, _, n, s = heapq.heappop(heap)
        c = cls_of[n]
        if c in total:
            continue
        s = {} if s is None else s
        s[c] = own[n]
        sets[c], total[c], choice[c] = s, t, n
        for p in parents.get(c, ()):
            waiting[p] -= 1
            if waiting[p]:
                continue
            ks = kids[p]
            # not a settled class, nor a self-loop (never helps)
            if cls_of[p] not in total and cls_of[p] not in ks:
                s2, t2 = _union(ks, sets, total, parents)
                if cls_of[p] not in s2:  # else its program would use its own class: a cycle
                    heapq.heappush(heap, (t2 + own[p], counter, p, s2))
                    counter += 1
            for k in ks:
                readers[k] -= 1
                if not readers[k]:
                    del sets[k]
    return choice


def _union(ks, sets, total, parents) -> tuple[dict[str, float], float]:
    """The union of the child classes' sets and its total: the largest set is copied once
    and the others' missing entries added. When this node is the largest child's only
    user, its set is extended in place instead: no other node will read it (chains of
    views are most of an e-graph, and copying their ever longer sets was most of the
    time: 14 of 29 s on DenseNet-121's systolic e-graph)."""
    big = max(ks, key=lambda k: len(sets[k]))
    s = sets[big] if len(parents.get(big, ())) == 1 else dict(sets[big])
    t = total[big]
    for k in ks:
        if k is big:
            continue
        for cc, v in sets[k].items():
            if cc not in s:
                s[cc] = v
                t += v
    return s, t


def _improve(graph: ExtractionGraph, choice: dict[str, str], roots, own, sweeps: int = 20) -> dict[str, str]:
    """Local improvement of the program: switch a used class to another of its nodes whose
    children the program already computes, when that lowers the DAG cost and stays
    acyclic. This is what catches the shared-branch trap that set unions cannot see:
    class act(conv(x)) picks the fused convAct(x) locally, but once conv(x) is computed
    for the other branch anyway, act(conv(x)) only adds the activation.
    Each candidate is checked exactly (O(program) each); programs are small next to the
    e-graph (tensat bert: ~200 classes, no candidates), so this stays cheap."""
    choice = dict(choice)
    cost = _program_cost(graph, choice, roots, own)
    for _ in range(sweeps):
        used = set(_reach(graph, choice, roots))
        improved = False
        for c in sorted(used):
            for m in graph.classes[c]:
                ks = graph.node_classes[m]
                if m == choice[c] or c in ks or not all(k in used for k in ks):
                    continue
                old, choice[c] = choice[c], m
                new = _program_cost(graph, choice, roots, own)
                if new is not None and new < cost - 1e-12 * max(1.0, abs(cost)):
                    cost, improved = new, True
                    used = set(_reach(graph, choice, roots))
                else:
                    choice[c] = old
            if improved:
                break  # the used set changed: restart the sweep from it
        if not improved:
            break
    return choice


def _reach(graph, choice, roots):
    seen, stack = set(), list(roots)
    while stack:
        c = stack.pop()
        if c not in seen:
            seen.add(c)
            stack.extend(graph.node_classes[choice[c]])
    return seen


def _program_cost(graph, choice, roots, own) -> float | None:
    """DAG cost of following `choice` from `roots`, or None if that meets a cycle."""
    if find_back_edge(graph, choice, roots) is not None:
        return None
    return sum(own[choice[c]] for c in _reach(graph, choice, roots))


def _break_cycles(graph: ExtractionGraph, choice: dict[str, str], roots, node_cost) -> dict[str, str]:
    """Return `choice` with any cycle reachable from `roots` removed. When following the
    choices closes a cycle at class c, c and everything its tree choice reaches switch to
    tree choices: that set is closed under tree choices (so no path leaves it) and tree
    choices are acyclic, so the cycle is gone and no new one can pass through the set;
    each repair grows the set, so this terminates. Rare: stale sets only."""
    tree = None
    fixed: set[str] = set()
    while True:
        back = find_back_edge(graph, choice, roots)
        if back is None:
            return choice
        if tree is None:
            tree = extract_tree(graph, roots, node_cost)
        stack = [back]
        while stack:
            c = stack.pop()
            if c in fixed or c not in tree:
                continue
            fixed.add(c)
            choice[c] = tree[c]
            stack.extend(graph.node_classes[tree[c]])
