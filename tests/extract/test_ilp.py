"""ILP extraction (HiGHS): exact on small e-graphs, never worse than greedy-DAG, never
below a known optimum, never an invalid program -- even with no time to solve."""
import pytest

from apsat.extract.check import check_extraction, dag_cost
from apsat.extract.greedy_dag import extract_greedy_dag
from apsat.extract.ilp import ExtractionResult, extract_ilp
from apsat.extract.tree import extract_tree

from test_greedy_dag import DATA, cyclic, graph, load, shared_conv
from test_improve import merged_matmul

pytest.importorskip("highspy")


@pytest.mark.parametrize("acyclic", ["order", "cuts"])
def test_shared_conv_optimal(acyclic):
    g = shared_conv()
    res = extract_ilp(g, acyclic=acyclic)
    assert isinstance(res, ExtractionResult) and res.optimal and res.gap == pytest.approx(0, abs=1e-6)
    check_extraction(g, res, g.roots)
    assert dag_cost(g, res, g.roots) == 13 < dag_cost(g, extract_tree(g), g.roots)


def test_ilp_beats_greedy_where_greedy_is_locally_wrong():
    # Y = {u(a) 1.7, v(b) 1}, Z = {p(a) 1.7, q(b) 1}, a = 4, b = 5. Each class alone is
    # cheaper through a (5.7 < 6), so greedy shares a: 1.7 + 1.7 + 4 + 1 = 8.4. Sharing b
    # costs 1 + 1 + 5 + 1 = 8, but needs two switches at once (no single switch reuses
    # what the program computes): only the ILP finds it.
    g = graph({
        "a": {"op": "a", "children": [], "eclass": "A", "cost": 4},
        "b": {"op": "b", "children": [], "eclass": "B", "cost": 5},
        "u": {"op": "u", "children": ["a"], "eclass": "Y", "cost": 1.7},
        "v": {"op": "v", "children": ["b"], "eclass": "Y", "cost": 1},
        "p": {"op": "p", "children": ["a"], "eclass": "Z", "cost": 1.7},
        "q": {"op": "q", "children": ["b"], "eclass": "Z", "cost": 1},
        "r": {"op": "r", "children": ["u", "p"], "eclass": "R", "cost": 1},
    }, ["R"])
    assert dag_cost(g, extract_greedy_dag(g), g.roots) == pytest.approx(8.4)
    res = extract_ilp(g)
    check_extraction(g, res, g.roots)
    assert res.optimal and dag_cost(g, res, g.roots) == 8


@pytest.mark.parametrize("acyclic", ["order", "cuts"])
def test_cyclic_egraph(acyclic):
    g = cyclic()
    res = extract_ilp(g, acyclic=acyclic)
    check_extraction(g, res, g.roots)
    assert res.optimal and dag_cost(g, res, g.roots) == 6


@pytest.mark.parametrize("name", ["resnet50_acyclic.json", "vgg_acyclic.json", "math_simplify_add.json",
                                  "loop.json"])
def test_proves_optimality_on_small_benchmarks(name):
    g = load(name)
    res = extract_ilp(g, time_limit=10)
    check_extraction(g, res, g.roots)
    assert res.optimal, res.stats
    greedy = extract_greedy_dag(g)
    assert dag_cost(g, res, g.roots) <= dag_cost(g, greedy, g.roots) + 1e-9


def test_resnet50_improves_on_greedy_and_respects_known_optimum():
    g = load("resnet50.json.gz")
    res = extract_ilp(g, time_limit=4)
    check_extraction(g, res, g.roots)
    cost = dag_cost(g, res, g.roots)
    assert 4.385795 - 1e-6 <= cost <= dag_cost(g, extract_greedy_dag(g), g.roots) + 1e-9
    assert res.bound is None or res.bound <= 4.385795 + 1e-6  # a lower bound must be one
    assert res.gap is not None and 0 <= res.gap < 0.05


@pytest.mark.parametrize("kw", [dict(), dict(acyclic="cuts"), dict(restrict=False), dict(local_search=False),
                                dict(restrict=False, local_search=False, acyclic="cuts")])
def test_every_phase_combination_finds_the_merged_matmul(kw):
    # Greedy computes both matmuls (8); the optimum shares the merged one (7) and must
    # break the e-graph's cycle Q -> S -> M -> Q by taking the matmul in M.
    g = merged_matmul()
    res = extract_ilp(g, **kw)
    check_extraction(g, res, g.roots)
    assert dag_cost(g, res, g.roots) == 7 and res.optimal
    assert res.stats["greedy_cost"] == 8 and res.stats["cost"] == 7


def test_phases_are_recorded_and_acyclic_graphs_are_proven_by_the_restriction():
    g = load("vgg_acyclic.json")
    res = extract_ilp(g, time_limit=10)
    phases = [p["phase"] for p in res.stats["phases"]]
    assert phases[:3] == ["greedy-dag", "local improvement", "pruning"]
    # No cycle: the restriction keeps every node, so its proof holds and no full model runs.
    assert phases[-1] == "ILP acyclic restriction" and res.optimal
    costs = [p["cost"] for p in res.stats["phases"]]
    assert costs == sorted(costs, reverse=True)  # the best so far only ever improves


def test_no_time_returns_greedy_program():
    g = load("vgg.json.gz")
    res = extract_ilp(g, time_limit=0)
    check_extraction(g, res, g.roots)
    assert not res.optimal
    assert dag_cost(g, res, g.roots) == pytest.approx(dag_cost(g, extract_greedy_dag(g), g.roots))


def test_registry_and_cli(tmp_path, capsys):
    import json

    from apsat.cli import main
    from apsat.extract import EXTRACTORS, run_extractor

    assert {"greedy-dag", "ilp"} <= set(EXTRACTORS)
    g = shared_conv()
    assert run_extractor("ilp", g, g.roots, None, time_limit=1).optimal
    assert run_extractor("greedy-dag", g, g.roots, None, time_limit=1)["A"] == "act"
    path = tmp_path / "eg.json"
    path.write_text((DATA / "vgg_acyclic.json").read_text())
    assert main(["extract", str(path), "--method", "ilp", "--time-limit", "5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["method"] == "ilp" and out["optimal"] is True and out["gap"] == pytest.approx(0, abs=1e-6)


def test_a_class_emptied_by_the_restriction_takes_its_readers_with_it():
    """_closed: the LP support can leave a class with no node; a node reading that class
    must be dropped too (densenet121's ILP once failed with KeyError on such a class)."""
    from apsat.extract.ilp import _closed

    kids = {"a1": ["B"], "a2": [], "b1": []}
    assert _closed({"A": ["a1", "a2"], "B": []}, kids) == {"A": ["a2"]}
    assert _closed({"A": ["a1"], "B": ["b1"]}, kids) == {"A": ["a1"], "B": ["b1"]}
