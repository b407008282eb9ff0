"""Local improvement: never worse than its start, always a valid program, and it makes
the compound moves (switch + complete + reuse) that single switches cannot."""
import pytest

from apsat.extract.check import check_extraction, dag_cost
from apsat.extract.greedy_dag import extract_greedy_dag
from apsat.extract.improve import improve

from test_greedy_dag import cyclic, graph, load, shared_conv
from test_prune import chains, locally_wrong


def merged_matmul():
    # Tensat's pattern, with its cycle: Q = {mq(X, WQ) 3, split0(S)}, K = {mk(X, WK) 3,
    # split1(S)}, S = split(M), M = {mm(X, CW) 5, concat(Q, K) 0.1}, CW = concat(WQ, WK).
    # Separately Q and K cost 6; merged, one matmul of 5 serves both (M must take mm:
    # concat(Q, K) would close the cycle Q -> S -> M -> Q).
    return graph({
        "x": {"op": "x", "children": [], "eclass": "X", "cost": 1},
        "wq": {"op": "wq", "children": [], "eclass": "WQ", "cost": 0},
        "wk": {"op": "wk", "children": [], "eclass": "WK", "cost": 0},
        "cw": {"op": "concat", "children": ["wq", "wk"], "eclass": "CW", "cost": 0},
        "mq": {"op": "matmul", "children": ["x", "wq"], "eclass": "Q", "cost": 3},
        "mk": {"op": "matmul", "children": ["x", "wk"], "eclass": "K", "cost": 3},
        "mm": {"op": "matmul", "children": ["x", "cw"], "eclass": "M", "cost": 5},
        "cat": {"op": "concat", "children": ["mq", "mk"], "eclass": "M", "cost": 0.1},
        "s": {"op": "split", "children": ["mm"], "eclass": "S", "cost": 0},
        "s0": {"op": "split0", "children": ["s"], "eclass": "Q", "cost": 0},
        "s1": {"op": "split1", "children": ["s"], "eclass": "K", "cost": 0},
        "r": {"op": "r", "children": ["mq", "mk"], "eclass": "R", "cost": 1},
    }, ["R"])


def _start(g):
    greedy = extract_greedy_dag(g)
    return greedy, {c: greedy[c] for c in check_extraction(g, greedy, g.roots)}


@pytest.mark.parametrize("make", [shared_conv, cyclic, chains, locally_wrong, merged_matmul,
                                  lambda: load("loop.json"), lambda: load("math_simplify_add.json"),
                                  lambda: load("vgg.json.gz")])
def test_never_worse_than_its_start_and_valid(make):
    g = make()
    greedy, start = _start(g)
    res = improve(g, start, g.roots, fill=greedy)
    used = check_extraction(g, res, g.roots)
    assert set(used) == set(res)  # exactly the classes it uses
    assert dag_cost(g, res, g.roots) <= dag_cost(g, start, g.roots) + 1e-12


def test_compound_moves_find_what_single_switches_miss():
    g = locally_wrong()
    greedy, start = _start(g)
    assert dag_cost(g, start, g.roots) == pytest.approx(8.4)
    assert dag_cost(g, improve(g, start, g.roots, fill=greedy), g.roots) == pytest.approx(8)
    g = merged_matmul()
    greedy, start = _start(g)
    assert dag_cost(g, start, g.roots) == 8  # r + x + mq + mk
    res = improve(g, start, g.roots, fill=greedy)
    assert dag_cost(g, res, g.roots) == 7 and res["M"] == "mm"  # r + x + mm, shared


def test_resnet50_reaches_the_known_optimum():
    g = load("resnet50.json.gz")
    greedy, start = _start(g)
    res = improve(g, start, g.roots, fill=greedy, time_limit=60)  # converges in well under 1 s
    check_extraction(g, res, g.roots)
    assert dag_cost(g, res, g.roots) == pytest.approx(4.385795, abs=1e-6)  # greedy: 4.3969


def test_no_time_keeps_the_start():
    g = merged_matmul()
    greedy, start = _start(g)
    assert improve(g, start, g.roots, fill=greedy, time_limit=0) == start
