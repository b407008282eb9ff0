"""Pruning before exact extraction keeps the optimum (checked by brute force on small
graphs, cycles included, even with the optimum itself as the incumbent's cost), folds
single-node chains, and the acyclic restriction really is acyclic and keeps its start."""
import itertools
import math

import pytest

from apsat.extract.check import check_extraction, dag_cost, find_back_edge
from apsat.extract.greedy_dag import extract_greedy_dag
from apsat.extract.prune import acyclic_restriction, lower_bounds, prune, sccs

from test_greedy_dag import cyclic, graph, load, shared_conv


def locally_wrong():
    # Greedy shares a (8.4); sharing b costs 8 (see test_ilp).
    return graph({
        "a": {"op": "a", "children": [], "eclass": "A", "cost": 4},
        "b": {"op": "b", "children": [], "eclass": "B", "cost": 5},
        "u": {"op": "u", "children": ["a"], "eclass": "Y", "cost": 1.7},
        "v": {"op": "v", "children": ["b"], "eclass": "Y", "cost": 1},
        "p": {"op": "p", "children": ["a"], "eclass": "Z", "cost": 1.7},
        "q": {"op": "q", "children": ["b"], "eclass": "Z", "cost": 1},
        "r": {"op": "r", "children": ["u", "p"], "eclass": "R", "cost": 1},
    }, ["R"])


def chains():
    # R = {r(C), s(D, E)}; C -> D -> leaf is a chain of single-node classes that folds
    # into r; P = {p1(K), p2} where K's only node leads back to P: folding K into p1
    # makes p1 need its own class, so p1 can never be picked.
    return graph({
        "leaf": {"op": "leaf", "children": [], "eclass": "L", "cost": 1},
        "d": {"op": "d", "children": ["leaf"], "eclass": "D", "cost": 2},
        "c": {"op": "c", "children": ["d"], "eclass": "C", "cost": 3},
        "e": {"op": "e", "children": ["p1"], "eclass": "E", "cost": 1},
        "p1": {"op": "p1", "children": ["k"], "eclass": "P", "cost": 0},
        "p2": {"op": "p2", "children": ["leaf"], "eclass": "P", "cost": 4},
        "k": {"op": "k", "children": ["p2"], "eclass": "K", "cost": 0},
        "r": {"op": "r", "children": ["c"], "eclass": "R", "cost": 5},
        "s": {"op": "s", "children": ["d", "e"], "eclass": "R", "cost": 1},
    }, ["R"])


def dominated():
    # X = {x1(A) 2, x2(A, B) 3, x3(A) 2.5}: x1 dominates x2 and x3 (cheaper, fewer needs).
    return graph({
        "a": {"op": "a", "children": [], "eclass": "A", "cost": 1},
        "b": {"op": "b", "children": [], "eclass": "B", "cost": 1},
        "x1": {"op": "x1", "children": ["a"], "eclass": "X", "cost": 2},
        "x2": {"op": "x2", "children": ["a", "b"], "eclass": "X", "cost": 3},
        "x3": {"op": "x3", "children": ["a"], "eclass": "X", "cost": 2.5},
        "r": {"op": "r", "children": ["x2", "b"], "eclass": "R", "cost": 1},
    }, ["R"])


def brute_force(members, kids, cost, roots):
    """Least DAG cost over every assignment of one node per class (inf if none is an
    acyclic program), on any {class: nodes} / {node: child classes} representation."""
    classes = list(members)
    best = math.inf
    for pick in itertools.product(*(members[c] for c in classes)):
        choice = dict(zip(classes, pick))
        total, seen, stack, ok = 0.0, set(), list(roots), True
        while stack and ok:
            c = stack.pop()
            if c in seen:
                continue
            if c not in choice:
                ok = False
                break
            seen.add(c)
            total += cost[choice[c]]
            stack.extend(kids[choice[c]])
        if ok and total < best and _acyclic(choice, kids, roots):
            best = total
    return best


def _acyclic(choice, kids, roots):
    state = {}

    def visit(c):
        if state.get(c) == 1:
            return False
        if state.get(c) == 2:
            return True
        state[c] = 1
        ok = all(visit(k) for k in kids[choice[c]])
        state[c] = 2
        return ok
    return all(visit(r) for r in roots)


def optimum(g):
    own = {n: g.cost(n) for n in g.nodes}
    return brute_force(g.classes, g.node_classes, own, g.roots)


SMALL = {"shared_conv": shared_conv, "cyclic": cyclic, "locally_wrong": locally_wrong, "chains": chains,
         "dominated": dominated, "loop": lambda: load("loop.json"),
         "math_simplify_add": lambda: load("math_simplify_add.json")}


@pytest.mark.parametrize("name", sorted(SMALL))
def test_pruning_keeps_the_optimum(name):
    g = SMALL[name]()
    own = {n: g.cost(n) for n in g.nodes}
    opt = optimum(g)
    greedy = extract_greedy_dag(g)
    for limit in (dag_cost(g, greedy, g.roots), opt):  # the optimum itself must survive
        p = prune(g, g.roots, own, limit)
        assert brute_force(p.members, p.kids, p.cost, g.roots) == pytest.approx(opt)
        assert p.stats["kept_nodes"] <= len(g.nodes)
    # The greedy program maps into the model at no higher cost, and back to the graph.
    p = prune(g, g.roots, own, dag_cost(g, greedy, g.roots))
    model = p.to_model(greedy, g.roots)
    assert model and sum(p.cost[n] for n in model.values()) <= dag_cost(g, greedy, g.roots) + 1e-9
    back = p.to_graph(model)
    used = check_extraction(g, back, g.roots)
    assert dag_cost(g, {c: back[c] for c in used}, g.roots) == pytest.approx(sum(p.cost[n] for n in model.values()))


def test_chains_fold_and_a_chain_back_into_its_parent_is_dropped():
    g = chains()
    p = prune(g, g.roots, {n: g.cost(n) for n in g.nodes}, 100)
    assert "p1" not in p.members.get("P", [])  # P -> K -> P: never acyclic
    assert "C" not in p.members and "D" in p.members  # C has one parent node, D two
    folded = dict(p.absorbed["r"])
    assert folded == {"C": "c"} and p.kids["r"] == ["D"] and p.cost["r"] == 8
    assert optimum(g) == 9  # r + c + d + leaf; s(d, e(p2(leaf))) costs 1 + 2 + 1 + 4 + 1 + 1 = 10


def test_dominated_nodes_and_bound():
    g = dominated()
    p = prune(g, g.roots, {n: g.cost(n) for n in g.nodes}, 100)
    assert p.dominator["x2"] == "x1" and p.dominator["x3"] == "x1"
    # Then every class has one node and one parent: the whole program folds into r.
    assert p.members == {"R": ["r"]} and dict(p.absorbed["r"]) == {"X": "x1", "A": "a", "B": "b"}
    assert p.cost["r"] == 5 and p.kids["r"] == []
    lb = lower_bounds(g.classes, {n: list(dict.fromkeys(k)) for n, k in g.node_classes.items()},
                      {n: g.cost(n) for n in g.nodes})
    assert lb["x2"] == 4 and lb["r"] == 4  # own + the largest child bound: 1 + max(3, 1)
    # With an incumbent of 3.9 nothing is left: every program costs at least 4.
    assert prune(g, g.roots, {n: g.cost(n) for n in g.nodes}, 3.9).members == {}


@pytest.mark.parametrize("name", ["cyclic", "loop", "vgg", "resnet50"])
def test_acyclic_restriction_is_acyclic_and_keeps_its_start(name):
    g = {"cyclic": cyclic, "loop": lambda: load("loop.json"), "vgg": lambda: load("vgg.json.gz"),
         "resnet50": lambda: load("resnet50.json.gz")}[name]()
    own = {n: g.cost(n) for n in g.nodes}
    greedy = extract_greedy_dag(g)
    p = prune(g, g.roots, own, dag_cost(g, greedy, g.roots))
    start = p.to_model(greedy, g.roots)
    members = acyclic_restriction(p, g.roots, set(start.values()), lambda n: own[n])
    assert all(len(comp) == 1 for comp in sccs(members, p.kids))
    assert not any(c in p.kids[n] for c, ns in members.items() for n in ns)
    assert all(n in members[c] for c, n in start.items())
    assert all(k in members for ns in members.values() for n in ns for k in p.kids[n])
    assert find_back_edge(g, p.to_graph(start), g.roots) is None
