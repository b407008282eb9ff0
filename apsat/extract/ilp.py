"""Exact DAG-cost extraction as a mixed-integer program, solved with HiGHS (`highspy`).

Model (over the pruned graph, apsat/extract/prune.py; built by ilp_model.HighsModel): a
binary x_n per node, minimise sum cost(n) x_n, subject to
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

The LP relaxation of this model is weak (tensat bert: 0.37 against an optimum of 0.705,
vgg: 0.22 against 4.85), so proofs on the tensat e-graphs are out of reach, and on bert
HiGHS's search over the full model does not even beat the start it is given: it is drawn
to the cyclic "programs" the relaxation allows. The solution quality comes from the
phases before the full model:
  1. greedy-DAG (apsat/extract/greedy_dag.py), then local improvement with compound
     moves (apsat/extract/improve.py);
  2. pruning against that incumbent's cost (exact: the optimum is kept);
  3. the MIP over an acyclic restriction of the pruned graph (prune.acyclic_restriction):
     no acyclicity rows, every solution a program. First only over the support of its
     LP relaxation plus the best program (tensat bert: ~900 of 20,244 nodes, solved in a
     second or two), then over the whole restriction. It may lose the optimum, so its
     verdict proves nothing unless the restriction dropped no node;
  4. the full model ("order" or "cuts") warm-started from the best program so far, for
     whatever time is left: its lower bound is the reported one, and only it proves
     optimality (or phase 3, when the restriction dropped nothing).
Every candidate is checked on the original graph; the answer is the cheapest valid one,
never worse than greedy-DAG, and `stats["phases"]` records what each phase reached.
"""
from __future__ import annotations

import math
import time

from apsat.errors import ExtractionError
from apsat.extract.check import InvalidExtraction, check_extraction, dag_cost
from apsat.extract.graph import ExtractionGraph
from apsat.extract.greedy_dag import extract_greedy_dag
from apsat.extract.ilp_model import HighsModel
from apsat.extract.improve import improve
from apsat.extract.prune import acyclic_restriction, prune

_IMPROVE_SHARE = 0.2  # at most this share of the time limit for local improvement
_RESTRICT_UNTIL = 0.75  # the restricted MIP may run until this share of the time limit


class ExtractionResult(dict):
    """A choice {class id: node id} that also says how good it is. `optimal`: proven
    optimal for DAG cost; `gap`: (cost - lower bound) / cost, or None without a bound;
    `bound`: the lower bound on the DAG cost; `stats`: pruning and solver figures."""

    def __init__(self, choice, optimal=False, gap=None, bound=None, stats=None):
        super().__init__(choice)
        self.optimal, self.gap, self.bound, self.stats = optimal, gap, bound, stats or {}


def extract_ilp(graph: ExtractionGraph, roots=None, node_cost=None, time_limit: float = 10.0,
                acyclic: str = "order", rel_gap: float = 1e-6, *, local_search: bool = True,
                restrict: bool = True) -> ExtractionResult:
    """The least-DAG-cost program for `roots` (default `graph.roots`) under `node_cost`
    (non-negative; default the stored costs), searched within `time_limit` seconds (every
    phase counts against it). `acyclic` ("order" or "cuts") picks how the full model
    forbids cycles; `rel_gap` is the relative gap at which HiGHS calls it optimal.
    `local_search` and `restrict` switch phases 1 (improvement) and 3 of the module doc.
    Returns an ExtractionResult covering exactly the classes the program uses (or, when
    some root has no program at all, greedy-DAG's choice, which lacks that root), never
    costlier than greedy-DAG's program; `optimal` only when the full model proved it."""
    if acyclic not in ("order", "cuts"):
        raise ExtractionError(f"acyclic must be 'order' or 'cuts', not {acyclic!r}")
    run = _Run(graph, roots, node_cost, time_limit)
    greedy = extract_greedy_dag(graph, run.roots, node_cost)
    if any(r not in greedy for r in run.roots):
        return ExtractionResult(greedy, stats={"status": "no program"})
    check_extraction(graph, greedy, run.roots)  # greedy-DAG's contract: raises if broken
    run.offer(greedy, "greedy-dag")
    if not run.roots:
        return run.result(acyclic)
    if local_search and run.left() > 0:
        run.offer(improve(graph, run.best, run.roots, node_cost, fill=greedy,
                          time_limit=min(run.left(), _IMPROVE_SHARE * time_limit)), "local improvement")
    pruned = prune(graph, run.roots, run.own, run.best_cost)
    run.note("pruning", kept_nodes=pruned.stats["kept_nodes"], kept_classes=pruned.stats["kept_classes"])
    exact = False  # whether the restricted model turned out to be the full one
    if restrict and run.left() > 0.05:
        exact = _solve_restricted(run, pruned, greedy, rel_gap)
        if run.best_cost < pruned.stats["limit"]:  # a cheaper incumbent prunes more
            pruned = prune(graph, run.roots, run.own, run.best_cost)
    if not exact and not run.optimal and run.left() > 0.05:
        _solve_full(run, pruned, acyclic, rel_gap)
    run.stats.update(kept_nodes=pruned.stats["kept_nodes"], kept_classes=pruned.stats["kept_classes"])
    return run.result(acyclic)


def _solve_restricted(run, pruned, fill, rel_gap) -> bool:
    """Phase 3 on the acyclic restriction of `pruned`: first the MIP over the support of
    its LP relaxation plus the best program (a small neighbourhood that HiGHS solves in a
    second or two, where the whole restricted MIP takes several seconds to get as far),
    then the whole restricted MIP with the time left, both until the _RESTRICT_UNTIL
    share of the time limit. Returns whether the restriction dropped nothing (its model
    is then the full model, and its bound and proof hold for the full problem)."""
    fill = {**fill, **run.best}
    graph, roots, estimate = run.graph, run.roots, {}
    members = acyclic_restriction(pruned, roots, set(pruned.to_model(run.best, roots).values()),
                                  lambda n: estimate.setdefault(n, _program_cost(graph, n, fill, run.own)))
    kept = sum(map(len, members.values()))
    exact = kept == pruned.stats["kept_nodes"]
    until = run.time_limit if exact else _RESTRICT_UNTIL * run.time_limit
    model = HighsModel(members, pruned, roots, None)
    lp = model.relaxation(max(until - run.elapsed(), 0.05))
    if lp is not None:
        support = {n for n, v in lp.items() if v > 1e-6} | set(pruned.to_model(run.best, roots).values())
        sub = _closed({c: [n for n in ns if n in support] for c, ns in members.items()}, pruned.kids)
        seconds = until - run.elapsed()  # it usually stops early, proven within its nodes
        if seconds > 0.05:
            sol, _, status = HighsModel(sub, pruned, roots, None).solve(
                pruned.to_model(run.best, roots), seconds, rel_gap)
            run.offer_solution(sol, pruned, "ILP LP-support neighbourhood", status=status,
                               kept_nodes=sum(map(len, sub.values())))
    if until - run.elapsed() > 0.05:
        sol, lb, status = model.solve(pruned.to_model(run.best, roots), until - run.elapsed(), rel_gap)
        run.offer_solution(sol, pruned, "ILP acyclic restriction", status=status, kept_nodes=kept)
        if exact and lb is not None:
            run.bound_at(lb, status == "optimal")
    return exact


def _closed(members, kids):
    """`members` without the nodes that need a class left without nodes, to a fixpoint.
    A class given with no nodes is one left without them (the LP support can empty a
    class: a node reading it must go too, not only the empty entry)."""
    members = {c: ns for c, ns in members.items() if ns}
    while True:
        out = {c: [n for n in ns if all(k in members for k in kids[n])] for c, ns in members.items()}
        out = {c: ns for c, ns in out.items() if ns}
        if sum(map(len, out.values())) == sum(map(len, members.values())):
            return out
        members = out


def _solve_full(run, pruned, acyclic, rel_gap) -> None:
    """Phase 4: the full model over `pruned`, warm-started from the best program; adds
    cycle cuts and re-solves while HiGHS's answer has a cycle ("cuts" mode)."""
    model = HighsModel(pruned.members, pruned, run.roots, acyclic)
    run.stats.update(cyclic_classes=model.n_order, cuts=0, solves=0)
    while (left := run.left()) > 0.05:
        sol, lb, status = model.solve(pruned.to_model(run.best, run.roots), left, rel_gap)
        run.stats["solves"] += 1
        if lb is not None:  # every solve is a relaxation of the final model: bounds hold
            run.bound_at(lb, False)
        if sol is None:
            break
        cycles = _cycle_nodes(sol, pruned.kids, run.roots)
        if cycles:  # "cuts" mode only: the order constraints forbid cycles outright
            model.add_cuts(cycles)
            run.stats["cuts"] += len(cycles)
            continue
        run.offer_solution(sol, pruned, f"ILP full ({acyclic})", status=status)
        run.optimal = status == "optimal"
        break


class _Run:
    """One extraction call: the time limit, the best valid program so far, the best
    lower bound, and per-phase figures (`stats["phases"]`: name, cost, seconds)."""

    def __init__(self, graph, roots, node_cost, time_limit):
        self.start = time.perf_counter()
        self.graph, self.node_cost, self.time_limit = graph, node_cost, time_limit
        self.roots = list(dict.fromkeys(graph.roots if roots is None else roots))
        cost = node_cost or graph.cost
        self.own = {n: cost(n) for n in graph.nodes}
        self.best, self.best_cost, self.bound, self.optimal = None, math.inf, None, False
        self.stats = {"nodes": len(graph.nodes), "classes": len(graph.classes), "phases": []}

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float:
        return self.time_limit - self.elapsed()

    def note(self, phase, **figures) -> None:
        """Record a phase's result: the best cost after it and the seconds so far."""
        self.stats["phases"].append({"phase": phase, "cost": self.best_cost,
                                     "seconds": time.perf_counter() - self.start, **figures})

    def offer(self, choice, phase, **figures) -> None:
        """Keep `choice` when it is a valid program cheaper than the best so far."""
        try:
            used = check_extraction(self.graph, choice, self.roots)
        except InvalidExtraction:  # never expected; the best so far is the safe answer
            figures["invalid"] = True
        else:
            choice = {c: choice[c] for c in used}
            c_cost = dag_cost(self.graph, choice, self.roots, self.node_cost)
            if c_cost < self.best_cost:
                self.best, self.best_cost = choice, c_cost
        self.note(phase, **figures)

    def offer_solution(self, sol, pruned, phase, **figures) -> None:
        """Offer a model solution {class: node} (None: the solver found nothing)."""
        if sol is None:
            self.note(phase, **figures)
            return
        full = pruned.to_graph(sol)
        self.offer({c: full[c] for c in _reached(full, self.graph.node_classes, self.roots)}, phase, **figures)

    def bound_at(self, lb, proven) -> None:
        self.bound = lb if self.bound is None else max(self.bound, lb)
        self.optimal = self.optimal or proven

    def result(self, acyclic) -> ExtractionResult:
        gap = None
        if self.bound is not None:
            gap = max(0.0, (self.best_cost - self.bound) / self.best_cost) if self.best_cost > 0 else 0.0
        last = self.stats["phases"][-1]
        self.stats.update(acyclic=acyclic, seconds=time.perf_counter() - self.start, cost=self.best_cost,
                          greedy_cost=self.stats["phases"][0]["cost"], status=last.get("status", last["phase"]))
        return ExtractionResult(self.best, optimal=self.optimal, gap=gap, bound=self.bound, stats=self.stats)


def _program_cost(graph, n, fill, own) -> float:
    """DAG cost of node n with its child classes completed by `fill`; inf when that
    program comes back to n's class or meets a class `fill` lacks."""
    c, seen, stack, total = graph.nodes[n]["eclass"], set(), list(graph.node_classes[n]), own[n]
    while stack:
        k = stack.pop()
        if k in seen:
            continue
        if k == c or k not in fill:
            return math.inf
        seen.add(k)
        total += own[fill[k]]
        stack.extend(graph.node_classes[fill[k]])
    return total


def _reached(choice, kids, roots):
    """Classes used when following `choice` from `roots` (tolerates cycles)."""
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
