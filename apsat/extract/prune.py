"""Shrinking an e-graph before exact extraction, and the acyclic restriction the ILP solves first.

`prune` removes, to a fixpoint, what no better program can contain, so the optimum is kept:
  - nodes whose child class is their own class (always a cycle);
  - nodes whose DAG-cost lower bound exceeds the incumbent's cost. The bound of a node is
    its own cost plus the largest bound among its child classes (a program contains each
    child's program, and these cannot include the node's own class: programs are
    acyclic); a class's bound is its cheapest node's. Classes with no finite bound have no
    acyclic program at all, so their parents go too;
  - nodes dominated by a node of the same class that costs no more and needs a subset of
    their child classes (the swap keeps a program valid, adds no edge, costs no more);
  - classes no longer reachable from the roots through kept nodes.
Then it collapses chains: a non-root class with a single node n and a single parent node
p is needed exactly when p is chosen, so n is folded into p (p's cost grows by n's, p's
child classes become the union of both). The model loses one binary and one class row per
collapse; a chain that folds back into p's own class is a cycle, and p is dropped.

`acyclic_restriction` is a heuristic, not a pruning: it keeps a subset of the nodes whose
class graph has no cycle (see its doc). A restricted program is always a valid program of
the full graph, but the restriction may lose the optimum.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

from apsat.extract.graph import ExtractionGraph

_TOL = 1e-9  # relative slack on cost comparisons, so the incumbent itself is never pruned


@dataclass
class Pruned:
    """The extraction problem after pruning, in "model" terms: `members` (class -> kept
    node ids), `kids` (node -> distinct child classes, chains folded in), `cost` (node ->
    its cost, chains folded in), `absorbed` (node -> [(class, node)] folded into it),
    `dominator` (removed node -> the node that replaces it in a program), `stats`."""

    members: dict[str, list[str]]
    kids: dict[str, list[str]]
    cost: dict[str, float]
    absorbed: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    dominator: dict[str, str] = field(default_factory=dict)
    stats: dict = field(default_factory=dict)

    def to_model(self, choice: dict[str, str], roots) -> dict[str, str]:
        """A program of the original graph as {class: node} over kept classes: dominated
        nodes replaced by their dominators, folded classes left out. Returns {} when some
        node has no kept replacement (the program then has no counterpart in the model)."""
        kept = {n for ns in self.members.values() for n in ns}
        sub = {}
        for c, n in choice.items():
            while n in self.dominator:
                n = self.dominator[n]
            sub[c] = n
        out, seen, stack = {}, set(), [r for r in roots]
        while stack:
            c = stack.pop()
            if c in seen:
                continue
            seen.add(c)
            n = sub.get(c)
            if n not in kept:
                return {}
            out[c] = n
            stack.extend(self.kids[n])
        return out

    def to_graph(self, choice: dict[str, str]) -> dict[str, str]:
        """A model solution {class: node} as a choice on the original graph: folded
        classes come back with their single node. (The caller restricts it to the classes
        reached from the roots and checks it.)"""
        out = dict(choice)
        for n in choice.values():
            out.update(self.absorbed.get(n, ()))
        return out


def prune(graph: ExtractionGraph, roots, own: dict[str, float], limit: float) -> Pruned:
    """Prune `graph` for `roots` under node costs `own` (non-negative), given an incumbent
    program of cost `limit`: every program of the original graph that costs no more than
    `limit` is still representable (through `Pruned.to_model`), so the optimum is kept.
    Classes without any acyclic program (and so the roots, when there is no program) are
    absent from the result."""
    cls_of = {n: graph.nodes[n]["eclass"] for n in graph.nodes}
    kids = {n: list(dict.fromkeys(ks)) for n, ks in graph.node_classes.items()}
    cost = dict(own)
    members: dict[str, list[str]] = {}
    for n in graph.nodes:
        if cls_of[n] not in kids[n]:
            members.setdefault(cls_of[n], []).append(n)
    p = Pruned(members, kids, cost, stats={"nodes": len(graph.nodes), "classes": len(graph.classes), "limit": limit})
    bound = limit * (1 + _TOL) + 1e-12
    while True:  # folding merges nodes, which may make new dominance: prune again
        _fixpoint(p, roots, bound)
        if not _collapse(p, roots, cls_of):
            break
    p.stats.update(kept_nodes=sum(len(ns) for ns in p.members.values()), kept_classes=len(p.members),
                   folded=sum(len(v) for v in p.absorbed.values()))
    return p


def _fixpoint(p: Pruned, roots, bound: float) -> None:
    """Bound, dominance and reachability pruning of `p.members`, in place, until stable."""
    while True:
        size = sum(len(ns) for ns in p.members.values())
        lb = lower_bounds(p.members, p.kids, p.cost)
        for c in list(p.members):
            ns = [n for n in p.members[c] if lb.get(n, math.inf) <= bound]
            p.members[c] = _undominated(ns, p)
        reach = _reachable(p.members, p.kids, roots)
        p.members = {c: ns for c, ns in p.members.items() if c in reach and ns}
        if sum(len(ns) for ns in p.members.values()) == size:
            return


def lower_bounds(members, kids, cost) -> dict[str, float]:
    """node -> a lower bound on the DAG cost of any acyclic program rooted at that node:
    its cost plus the largest bound of its child classes (a class's bound is its best
    node's). Nodes absent from the result have no acyclic program. Dijkstra-like, since
    max-plus with non-negative costs settles each class at its final value when popped."""
    cls_of = {n: c for c, ns in members.items() for n in ns}
    waiting = {n: len(kids[n]) for n in cls_of}
    parents: dict[str, list[str]] = {}
    for n in cls_of:
        for k in kids[n]:
            parents.setdefault(k, []).append(n)
    node_lb, cls_lb = {}, {}
    heap = [(cost[n], n) for n in cls_of if not kids[n]]
    partial = {n: 0.0 for n in cls_of}
    while heap:
        v, n = heapq.heappop(heap)
        node_lb.setdefault(n, v)
        c = cls_of[n]
        if c in cls_lb:
            continue
        cls_lb[c] = v
        for m in parents.get(c, ()):
            partial[m] = max(partial[m], v)
            waiting[m] -= 1
            if waiting[m] == 0:
                heapq.heappush(heap, (cost[m] + partial[m], m))
    return node_lb


def _undominated(ns: list[str], p: Pruned) -> list[str]:
    """The nodes of one class that no other costs no more than while needing a subset of
    their child classes; the removed ones get their dominator recorded. Sorted cheapest
    (then fewest children) first, so a dominator always comes before what it dominates;
    comparisons stop after 64 kept nodes (huge classes: keep the rest, stay linear)."""
    ns = sorted(ns, key=lambda n: (p.cost[n], len(p.kids[n]), n))
    kept: list[tuple[str, set]] = []
    for n in ns:
        ks = set(p.kids[n])
        dom = next((m for m, mk in kept if mk <= ks), None) if len(kept) < 64 else None
        if dom is None:
            kept.append((n, ks))
        else:
            p.dominator[n] = dom
    return [m for m, _ in kept]


def _reachable(members, kids, roots) -> set[str]:
    """Classes reachable from `roots` through nodes whose child classes all have a node."""
    seen, stack = set(), [r for r in roots if r in members]
    while stack:
        c = stack.pop()
        if c in seen:
            continue
        seen.add(c)
        for n in members[c]:
            if all(k in members for k in kids[n]):
                stack.extend(kids[n])
    return seen


def _collapse(p: Pruned, roots, cls_of) -> bool:
    """Fold single-node classes with a single parent node into that parent (module doc).
    Returns whether anything was folded."""
    rootset = set(roots)
    parents: dict[str, set[str]] = {}
    for ns in p.members.values():
        for n in ns:
            for k in p.kids[n]:
                parents.setdefault(k, set()).add(n)
    todo = [c for c, ns in p.members.items() if len(ns) == 1]
    folded = False
    while todo:
        k = todo.pop()
        if k in rootset or k not in p.members or len(p.members[k]) != 1 or len(parents.get(k, ())) != 1:
            continue
        (n,), (par,) = p.members[k], parents[k]
        c = cls_of[par]
        if par not in p.members.get(c, ()):
            continue
        del p.members[k]
        folded = True
        for j in p.kids[n]:
            parents[j].discard(n)
            parents[j].add(par)
        new_kids = [j for j in dict.fromkeys(p.kids[par] + p.kids[n]) if j != k]
        p.kids[par] = new_kids
        p.cost[par] += p.cost[n]
        p.absorbed.setdefault(par, []).extend([(k, n)] + p.absorbed.pop(n, []))
        if c in new_kids:  # the chain leads back into par's own class: never acyclic
            p.members[c].remove(par)
            for j in new_kids:
                parents[j].discard(par)
        todo.extend(j for j in p.kids[n] if len(parents.get(j, ())) == 1)
        if len(p.members[c]) == 1:
            todo.append(c)
    return folded


def sccs(members, kids) -> list[list[str]]:
    """Strongly connected components of the class graph (c -> k when a node of c has
    child class k), iterative Tarjan; every class of `members` is in exactly one."""
    succ = {c: list(dict.fromkeys(k for n in ns for k in kids[n] if k in members)) for c, ns in members.items()}
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


def acyclic_restriction(p: Pruned, roots, keep_first, estimate) -> dict[str, list[str]]:
    """A subset of `p.members` whose class graph is acyclic, so every program in it is a
    valid program and the ILP over it needs no acyclicity constraints at all (and HiGHS's
    heuristics are not drawn to cheaper cyclic "programs").
    Only nodes with a child class in their own strongly connected component can close a
    cycle. They are inserted one by one, each kept unless a path of kept edges already
    leads from one of its children back to its class: first the nodes in `keep_first`
    (an acyclic program, which thus stays feasible), then by `estimate(node)` ascending,
    so each cycle is broken at its most expensive way of computing a class. Classes
    left without a node are dropped (with the nodes that needed them)."""
    comp = {c: i for i, cs in enumerate(sccs(p.members, p.kids)) for c in cs}
    succ: dict[str, set[str]] = {c: set() for c in p.members}
    inner, out = [], {c: [] for c in p.members}
    for c, ns in p.members.items():
        for n in ns:
            same = [k for k in p.kids[n] if comp.get(k) == comp[c]]
            if same:
                inner.append((n not in keep_first, estimate(n), n, c, same))
            else:
                out[c].append(n)
    inner.sort(key=lambda t: t[:3])
    for _, _, n, c, same in inner:
        if not any(_path(succ, k, c, comp) for k in same):
            out[c].append(n)
            succ[c].update(same)
    members = {c: ns for c, ns in out.items() if ns}
    while True:  # classes that lost every node take their parents with them
        reach = _reachable(members, p.kids, roots)
        alive = {c: [n for n in members[c] if all(k in members for k in p.kids[n])] for c in reach}
        alive = {c: ns for c, ns in alive.items() if ns}
        if sum(map(len, alive.values())) == sum(map(len, members.values())):
            return alive
        members = alive


def _path(succ, src, dst, comp) -> bool:
    """Whether kept edges lead from class `src` to class `dst` (searched inside their
    strongly connected component: no path between components comes back)."""
    if src == dst:
        return True
    cp, seen, stack = comp[dst], {src}, [src]
    while stack:
        for v in succ[stack.pop()]:
            if v == dst:
                return True
            if v not in seen and comp.get(v) == cp:
                seen.add(v)
                stack.append(v)
    return False
