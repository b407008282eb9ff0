"""Local improvement of an extracted program (DAG cost), used to strengthen the ILP's start.

Greedy-DAG already switches single classes to nodes whose children the program computes
anyway. What it cannot see is a switch that only pays off together with others: tensat's
merged matmul `split0(split(matmul(x, concat(w1, w2))))` costs more than `matmul(x, w1)`
for one class, and is cheaper only once the sibling class takes `split1` of the same
merged product. `improve` tries exactly these compound moves: switch one used class to
another of its nodes, complete the program with `fill` choices for the classes that node
newly needs, then let every used class that is a parent of a newly computed class switch
to a node reusing it when that lowers the cost; the move is kept when the whole program
got cheaper (checked exactly, acyclicity included).
"""
from __future__ import annotations

from apsat.errors import ExtractionError
import time

from apsat.extract.check import find_back_edge
from apsat.extract.graph import ExtractionGraph


def improve(graph: ExtractionGraph, choice: dict[str, str], roots, node_cost=None,
            fill: dict[str, str] | None = None, time_limit: float = 5.0) -> dict[str, str]:
    """Return a program for `roots` no worse than `choice` (a valid program: acyclic, one
    node per used class) under DAG cost with `node_cost` (default the stored costs), found
    by first-improvement sweeps of the compound moves in the module doc until none helps
    or `time_limit` seconds pass. `fill` (class -> node, e.g. greedy-DAG's choice for
    every class) completes a program where a move needs new classes; default `choice`.
    The result covers exactly the classes it uses."""
    start = time.perf_counter()
    cost = node_cost or graph.cost
    own = {n: cost(n) for n in graph.nodes}
    roots = list(roots)
    fill = choice if fill is None else fill
    parents = graph.parents()
    best = dict(choice)
    best_cost, used = _evaluate(graph, best, roots, own)
    if best_cost is None:
        raise ExtractionError("improve: the starting choice is not an acyclic program")
    # Round robin over the used classes: after a kept move, go on with the class after
    # the one that moved (rescanning from the start would repeat the failed moves); stop
    # after a full round without a kept move.
    order, pos, since = sorted(used), 0, 0
    while since < len(order) and time.perf_counter() - start < time_limit:
        c = order[pos % len(order)]
        pos, since = pos + 1, since + 1
        if c not in used:
            continue
        bar = best_cost - 1e-12 * max(1.0, best_cost)
        for m in graph.classes[c]:
            if m == best[c] or c in graph.node_classes[m]:
                continue
            trial = _move(graph, best, used, c, m, fill, parents, own, roots)
            if trial is None:
                continue
            t_cost, t_used = _evaluate(graph, trial, roots, own, bar)
            if t_cost is not None and t_cost < bar:
                best, best_cost, used = trial, t_cost, t_used
                order = sorted(used)
                pos, since = sum(1 for d in order if d <= c), 0
                break
    return {c: best[c] for c in used}


def _move(graph, choice, used, c, m, fill, parents, own, roots):
    """`choice` with class c switched to node m, completed from `fill`, and parents of
    the newly computed classes switched to nodes that reuse them where that is cheaper.
    None when `fill` cannot complete the program."""
    trial = dict(choice)
    trial[c] = m
    new, stack = [], list(graph.node_classes[m])
    while stack:
        k = stack.pop()
        if k in used or k in new:
            continue
        if k not in fill:
            return None
        trial[k] = fill[k]
        new.append(k)
        stack.extend(graph.node_classes[fill[k]])
    have = used | set(new)
    reuse = [q for k in new for q in parents.get(k, ()) if _reuses(graph, trial, used, have, c, q)]
    if not reuse:
        return trial
    cur, _ = _evaluate(graph, trial, roots, own)
    for q in reuse:
        d = graph.nodes[q]["eclass"]
        old, trial[d] = trial[d], q
        t_cost, _ = _evaluate(graph, trial, roots, own, cur)
        if t_cost is not None and (cur is None or t_cost < cur):
            cur = t_cost
        else:
            trial[d] = old
    return trial


def _reuses(graph, trial, used, have, c, q) -> bool:
    """Whether switching q's class to q is a reuse step: the class is used (and is not
    the class just moved), q is not chosen there yet, and all q's children are computed."""
    d = graph.nodes[q]["eclass"]
    ks = graph.node_classes[q]
    return d in used and d != c and trial[d] != q and d not in ks and all(j in have for j in ks)


def _evaluate(graph, choice, roots, own, bar=None):
    """(DAG cost, used classes) of following `choice` from `roots`, or (None, None) when
    that meets a class without a choice or a cycle. With `bar`, a program costing `bar` or
    more is returned without the acyclicity check (the costly part; its caller rejects
    the program anyway)."""
    seen, stack, total = set(), list(roots), 0.0
    while stack:
        c = stack.pop()
        if c in seen:
            continue
        n = choice.get(c)
        if n is None:
            return None, None
        seen.add(c)
        total += own[n]
        stack.extend(graph.node_classes[n])
    if bar is not None and total >= bar:
        return total, seen
    if find_back_edge(graph, choice, roots) is not None:
        return None, None
    return total, seen
