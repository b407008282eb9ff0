"""Exact DAG-cost extraction as a mixed-integer program, solved with HiGHS (`highspy`).

Model (after pruning, below): a binary x_n per node, minimise sum cost(n) x_n, subject to
  - every class: sum of its x_n <= 1; every root class: = 1;
  - a picked node forces a node in each child class: x_n <= sum_{m in k} x_m;
  - acyclicity. The class graph (c -> k when a node of c has child class k) is split into
    strongly connected components first: an edge between components can never close a
    cycle, so order constraints are needed only inside non-trivial components. Two ways:
      "order": a topological-order variable t_c in [0, |SCC|-1] per class in a cyclic
               component and, per node n of c with child k in the same component,
               t_k - t_c + M x_n <= M - 1 (M = |SCC|): a picked node's children come first;
      "cuts":  solve without them, and while the chosen program has a cycle add the cut
               sum_{n in cycle} x_n <= len - 1 and solve again (warm-started).
Every solve is warm-started from greedy-DAG (apsat/extract/greedy_dag.py), so HiGHS always
has an incumbent, and the whole call respects one time limit.

Pruning keeps the optimum: classes unreachable from the roots; nodes whose child class is
their own class (always a cycle); nodes whose own cost alone exceeds the greedy program's
total (no better program can contain them); nodes with a child class that has no node
left; nodes dominated by a node of the same class that costs no more and needs a subset of
their child classes (swapping one for the other keeps a program valid and acyclic).

The result is never invalid: the solver's choice is checked, and when HiGHS found nothing
better in time (or anything went wrong) the greedy program is returned with optimal=False.
"""
from __future__ import annotations

import time

import numpy as np

from apsat.extract.check import InvalidExtraction, check_extraction, dag_cost
from apsat.extract.graph import ExtractionGraph
from apsat.extract.greedy_dag import extract_greedy_dag


class ExtractionResult(dict):
    """A choice {class id: node id} that also says how good it is. `optimal`: proven
    optimal for DAG cost; `gap`: (cost - lower bound) / cost, or None without a bound;
    `bound`: the lower bound on the DAG cost; `stats`: pruning and solver figures."""

    def __init__(self, choice, optimal=False, gap=None, bound=None, stats=None):
        super().__init__(choice)
        self.optimal, self.gap, self.bound, self.stats = optimal, gap, bound, stats or {}


def extract_ilp(graph: ExtractionGraph, roots=None, node_cost=None, time_limit: float = 10.0,
                acyclic: str = "order", rel_gap: float = 1e-6) -> ExtractionResult:
    """The least-DAG-cost program for `roots` (default `graph.roots`) under `node_cost`
    (non-negative; default the stored costs), found within `time_limit` seconds (the
    greedy-DAG warm start and pruning count against it). `acyclic` is "order" or "cuts"
    (see the module doc); `rel_gap` is the relative gap at which HiGHS calls it optimal.
    Returns an ExtractionResult covering exactly the classes the program uses (or, when
    some root has no program at all, greedy-DAG's choice, which lacks that root)."""
    if acyclic not in ("order", "cuts"):
        raise ValueError(f"acyclic must be 'order' or 'cuts', not {acyclic!r}")
    start = time.perf_counter()
    cost = node_cost or graph.cost
    roots = list(dict.fromkeys(graph.roots if roots is None else roots))
    greedy = extract_greedy_dag(graph, roots, node_cost)
    if any(r not in greedy for r in roots):
        return ExtractionResult(greedy, stats={"status": "no program"})
    warm = {c: greedy[c] for c in check_extraction(graph, greedy, roots)}
    warm_cost = dag_cost(graph, warm, roots, node_cost)
    own = {n: cost(n) for n in graph.nodes}
    members, kids, dominator = _prune(graph, roots, own, warm_cost)
    stats = {"nodes": len(graph.nodes), "classes": len(graph.classes),
             "kept_nodes": sum(len(v) for v in members.values()), "kept_classes": len(members),
             "greedy_cost": warm_cost, "acyclic": acyclic}
    warm_pruned = _map_warm(warm, dominator, kids, roots)

    model = _Model(members, kids, own, roots, acyclic)
    stats.update(cyclic_classes=model.n_order, cuts=0, solves=0)
    best, best_cost, bound, status = warm, warm_cost, None, "not run"
    incumbent, optimal = warm_pruned, False
    while (left := time_limit - (time.perf_counter() - start)) > 0.05:
        sol, lb, status = model.solve(incumbent, left, rel_gap)
        stats["solves"] += 1
        if lb is not None:  # every solve is a relaxation of the final model: bounds hold
            bound = lb if bound is None else max(bound, lb)
        if sol is None:
            break
        cycles = _cycle_nodes(sol, kids, roots)
        if cycles:  # "cuts" mode only: the order constraints forbid cycles outright
            model.add_cuts(cycles)
            stats["cuts"] += len(cycles)
            continue
        choice = {c: sol[c] for c in _reached(sol, kids, roots)}
        try:
            check_extraction(graph, choice, roots)
        except InvalidExtraction:  # never expected; the greedy program is the safe answer
            status = "invalid solver choice"
            break
        c_cost = dag_cost(graph, choice, roots, node_cost)
        if c_cost < best_cost:
            best, best_cost, incumbent = choice, c_cost, choice
        optimal = status == "optimal"
        break  # an acyclic solver answer: optimal, or the best found before the limit
    gap = None
    if bound is not None:
        gap = max(0.0, (best_cost - bound) / best_cost) if best_cost > 0 else 0.0
    stats.update(status=status, seconds=time.perf_counter() - start, cost=best_cost)
    return ExtractionResult(best, optimal=optimal, gap=gap, bound=bound, stats=stats)


def _prune(graph, roots, own, limit):
    """Return (class -> kept node ids, node -> distinct child classes, node -> its
    dominator) after removing, to a fixpoint, the nodes described in the module doc."""
    kids = {n: list(dict.fromkeys(ks)) for n, ks in graph.node_classes.items()}
    cls_of = {n: graph.nodes[n]["eclass"] for n in graph.nodes}
    alive = {n for n in graph.nodes if cls_of[n] not in kids[n] and own[n] <= limit * (1 + 1e-12)}
    dominator: dict[str, str] = {}
    while True:
        members: dict[str, list[str]] = {}
        for n in alive:
            members.setdefault(cls_of[n], []).append(n)
        # Dominance inside each class: cheapest (then fewest children) first, so a node
        # can only be dominated by one earlier in this order.
        for c, ns in members.items():
            ns.sort(key=lambda n: (own[n], len(kids[n]), n))
            kept: list[tuple[str, set]] = []
            for n in ns:
                ks = set(kids[n])
                dom = next((m for m, mk in kept if mk <= ks), None) if len(kept) < 64 else None
                if dom is None:
                    kept.append((n, ks))
                else:
                    dominator[n] = dom
            members[c] = [m for m, _ in kept]
        # Reachable from the roots through kept nodes whose children all have a node.
        live = {n for ns in members.values() for n in ns}
        keep_nodes, seen, stack = set(), set(), [r for r in roots if r in members]
        while stack:
            c = stack.pop()
            if c in seen:
                continue
            seen.add(c)
            for n in members[c]:
                if all(k in members for k in kids[n]):
                    keep_nodes.add(n)
                    stack.extend(kids[n])
        if keep_nodes == alive:
            members = {c: [n for n in ns if n in keep_nodes] for c, ns in members.items()}
            return {c: ns for c, ns in members.items() if ns}, kids, dominator
        alive = keep_nodes & live


def _map_warm(warm, dominator, kids, roots):
    """The warm program with pruned (dominated) nodes replaced by their dominators; the
    result is still a program (fewer child classes, same or lower cost)."""
    sub = {}
    for c, n in warm.items():
        while n in dominator:
            n = dominator[n]
        sub[c] = n
    return {c: sub[c] for c in _reached(sub, kids, roots)}


def _reached(choice, kids, roots):
    """Classes used when following `choice` from `roots` (assumes acyclic or tolerates cycles)."""
    seen, stack = [], list(roots)
    mark = set()
    while stack:
        c = stack.pop()
        if c in mark:
            continue
        mark.add(c)
        seen.append(c)
        stack.extend(kids[choice[c]])
    return seen


def _cycle_nodes(choice, kids, roots, limit=500):
    """Node lists of cycles in the program `choice` reached from `roots` (one per DFS back
    edge, at most `limit`), or [] if it is acyclic. Cutting many cycles per solve matters:
    each re-solve starts HiGHS over, so one cut per round converges far too slowly."""
    state, path, cycles = {}, [], []
    for root in roots:
        if state.get(root):
            continue
        state[root] = 1
        path.append(root)
        stack = [iter(kids[choice[root]])]
        while stack:
            k = next(stack[-1], None)
            if k is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(k) == 1:
                cycles.append([choice[c] for c in path[path.index(k):]])
                if len(cycles) >= limit:
                    return cycles
            elif k not in state:
                state[k] = 1
                path.append(k)
                stack.append(iter(kids[choice[k]]))
    return cycles


def _sccs(members, kids):
    """Strongly connected components of the class graph (iterative Tarjan)."""
    succ = {c: list(dict.fromkeys(k for n in ns for k in kids[n])) for c, ns in members.items()}
    index, low, on, stack, out, counter = {}, {}, set(), [], [], 0
    for s in succ:
        if s in index:
            continue
        work = [(s, iter(succ[s]))]
        index[s] = low[s] = counter
        counter += 1
        stack.append(s)
        on.add(s)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(succ[w])))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                out.append(comp)
    return out


class _Model:
    """The HiGHS model: columns 0..N-1 are the node binaries, then the order variables."""

    def __init__(self, members, kids, own, roots, acyclic):
        import highspy

        self.h = h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        self.nodes = [n for ns in members.values() for n in ns]
        self.col = {n: i for i, n in enumerate(self.nodes)}
        self.cls = {n: c for c, ns in members.items() for n in ns}
        self.kids = kids
        col = self.col
        rows: list[tuple[list[int], list[float], float, float]] = []
        rootset = set(roots)
        for c, ns in members.items():
            rows.append(([col[n] for n in ns], [1.0] * len(ns), 1.0 if c in rootset else 0.0, 1.0))
        for n in self.nodes:
            for k in kids[n]:
                idx = [col[n]] + [col[m] for m in members[k]]
                rows.append((idx, [1.0] + [-1.0] * len(members[k]), -np.inf, 0.0))
        self.order: dict[str, tuple[int, float, int]] = {}  # class -> (column, M, component)
        self.comps: list[list[str]] = []
        if acyclic == "order":
            for comp in _sccs(members, kids):
                if len(comp) < 2:
                    continue
                m = float(len(comp))
                for c in comp:
                    self.order[c] = (len(self.nodes) + len(self.order), m, len(self.comps))
                self.comps.append(comp)
                cs = set(comp)
                for c in comp:
                    tc = self.order[c][0]
                    for n in members[c]:
                        for k in kids[n]:
                            if k in cs:  # t_k - t_c + M x_n <= M - 1
                                rows.append(([self.order[k][0], tc, col[n]], [1.0, -1.0, m], -np.inf, m - 1.0))
        self.n_order = len(self.order)
        ncol = len(self.nodes) + len(self.order)
        lower = np.zeros(ncol)
        upper = np.ones(ncol)
        costs = np.zeros(ncol)
        costs[: len(self.nodes)] = [own[n] for n in self.nodes]
        for i, m, _ in self.order.values():
            upper[i] = m - 1.0
        h.addCols(ncol, costs, lower, upper, 0, np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0))
        nb = len(self.nodes)
        h.changeColsIntegrality(nb, np.arange(nb, dtype=np.int32), np.ones(nb, np.uint8))
        self._add_rows(rows)

    def _add_rows(self, rows):
        starts, idx, val = [], [], []
        for r_idx, r_val, _, _ in rows:
            starts.append(len(idx))
            idx.extend(r_idx)
            val.extend(r_val)
        self.h.addRows(len(rows), np.array([r[2] for r in rows], float), np.array([r[3] for r in rows], float),
                       len(idx), np.array(starts, np.int32), np.array(idx, np.int32), np.array(val, float))

    def add_cuts(self, cycles):
        """Forbid these cycles: not all nodes of one may be picked together."""
        self._add_rows([([self.col[n] for n in cy], [1.0] * len(cy), -np.inf, len(cy) - 1.0) for cy in cycles])

    def solve(self, warm, seconds, rel_gap):
        """Solve from the warm program {class: node} (acyclic, in the pruned graph).
        Returns ({class: node} or None, lower bound or None, HiGHS model status text)."""
        h = self.h
        x = np.zeros(len(self.nodes) + len(self.order))
        for n in warm.values():
            x[self.col[n]] = 1.0
        # Order values for the warm program: a post-order rank, children first, scaled
        # into each component's [0, M-1] range by ranking within the component.
        rank = {}
        for pos, c in enumerate(_post_order(warm, self.kids)):
            rank[c] = pos
        by_comp: dict[int, list] = {}
        for c, (i, _, comp) in self.order.items():
            if c in rank:
                by_comp.setdefault(comp, []).append((rank[c], i))
        for items in by_comp.values():
            for r, (_, i) in enumerate(sorted(items)):
                x[i] = float(r)
        h.setSolution(len(x), np.arange(len(x), dtype=np.int32), x)
        h.setOptionValue("time_limit", float(seconds))
        h.setOptionValue("mip_rel_gap", float(rel_gap))
        h.run()
        status = h.modelStatusToString(h.getModelStatus()).lower()
        info = h.getInfo()
        lb = info.mip_dual_bound if np.isfinite(info.mip_dual_bound) else None
        if int(info.primal_solution_status) < 2:  # 2 = feasible: nothing found otherwise
            return None, lb, status
        vals = h.getSolution().col_value
        sol = {}
        for n, i in self.col.items():
            if vals[i] > 0.5:
                sol[self.cls[n]] = n
        return sol, lb, status


def _post_order(choice, kids):
    """Classes of an acyclic program, children before parents."""
    out, done = [], set()
    for root in choice:
        if root in done:
            continue
        stack = [(root, iter(kids[choice[root]]))]
        done.add(root)
        while stack:
            c, it = stack[-1]
            k = next(it, None)
            if k is None:
                out.append(c)
                stack.pop()
            elif k not in done and k in choice:
                done.add(k)
                stack.append((k, iter(kids[choice[k]])))
    return out
