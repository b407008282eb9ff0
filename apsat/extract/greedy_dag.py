"""Greedy DAG-cost extraction (extraction-gym's faster-greedy-dag idea).

A class's cost is not a number but the *set* of distinct classes its current choice needs,
each with the cost of the node chosen there, so shared sub-programs are paid once. A node
costs its own cost plus the total of the union of its children's sets; a worklist
re-evaluates a node whenever one of its child classes improves, until nothing improves.

It is a heuristic: the sets are snapshots, so a class's set can go stale when a class deep
below it later switches node, and the union of locally best sets is not the best union.
It is the fast default and the warm start of the ILP extractor (apsat/extract/ilp.py).

Staleness also means that following the final per-class choices could in principle close
a cycle that no single set saw. `_break_cycles` repairs that case with tree choices (which
are acyclic by construction), so the result is always a valid program.
"""
from __future__ import annotations

from collections import deque

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
    nodes = graph.nodes
    own = {n: cost(n) for n in nodes}
    cls_of = {n: nodes[n]["eclass"] for n in nodes}
    # Distinct child classes: DAG cost pays a class once however often a node uses it.
    kids = {n: list(dict.fromkeys(ks)) for n, ks in graph.node_classes.items()}
    parents = graph.parents()

    sets: dict[str, dict[str, float]] = {}  # class -> {class it needs: cost paid there}
    total: dict[str, float] = {}  # class -> sum of its set
    choice: dict[str, str] = {}
    queue = deque(n for n in nodes if not kids[n])
    queued = set(queue)
    while queue:
        n = queue.popleft()
        queued.discard(n)
        c, ks = cls_of[n], kids[n]
        if c in ks or any(k not in total for k in ks):
            continue  # a self-loop never helps; a child without a program yet: wait for it
        best = total.get(c)
        if ks:
            # The union costs at least its largest member: skip the set work when even
            # that cannot beat the class's current cost (the common case on re-visits).
            big = max(ks, key=lambda k: total[k])
            if best is not None and own[n] + total[big] >= best:
                continue
            # Copy the largest set (by size) and add the others' missing entries: the
            # copy is the expensive part, so it is done once per evaluated node.
            big = max(ks, key=lambda k: len(sets[k]))
            s = dict(sets[big])
            t = total[big]
            for k in ks:
                if k is big:
                    continue
                for cc, v in sets[k].items():
                    if cc not in s:
                        s[cc] = v
                        t += v
            if c in s:
                continue  # this node's program would use its own class: a cycle
        else:
            s, t = {}, 0.0
        t += own[n]
        if best is not None and t >= best:
            continue
        s[c] = own[n]
        sets[c], total[c], choice[c] = s, t, n
        for p in parents.get(c, ()):
            if p not in queued:
                queued.add(p)
                queue.append(p)
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
