"""Tree extraction and the extraction checks on small hand-made e-graphs (extraction-gym
JSON) and on a copy of a public benchmark e-graph."""
import pytest

from apsat.extract.check import InvalidExtraction, check_extraction, dag_cost
from apsat.extract.graph import ExtractionGraph
from apsat.extract.tree import extract_tree


def _graph(nodes, roots):
    return ExtractionGraph.from_json({"nodes": nodes, "root_eclasses": roots, "class_data": {}})


def _shared_branch():
    # r = add(f(x), g(x)); x is either `big` (cost 10) or `small` (cost 1) -- tree cost
    # counts x once per use; act can fold into fused `fa` (cost 3) that recomputes conv.
    return _graph({
        "big": {"op": "big", "children": [], "eclass": "x", "cost": 10},
        "small": {"op": "small", "children": [], "eclass": "x", "cost": 1},
        "f": {"op": "f", "children": ["small"], "eclass": "fx", "cost": 2},
        "g": {"op": "g", "children": ["small"], "eclass": "gx", "cost": 2},
        "add": {"op": "add", "children": ["f", "g"], "eclass": "r", "cost": 1},
    }, ["r"])


def test_tree_picks_cheapest_member_and_counts_shared_child_per_use():
    g = _shared_branch()
    choice = extract_tree(g)
    assert choice["x"] == "small"
    assert check_extraction(g, choice, g.roots)
    # DAG cost pays x once: 1 + 2 + 2 + 1 = 6 (tree cost would be 7).
    assert dag_cost(g, choice, g.roots) == 6


def test_cycle_in_egraph_is_avoided():
    # class a = {leaf (cost 5), loop(b)}, class b = {wrap(a)}: the only finite choice for a
    # is the leaf, and the extraction stays acyclic.
    g = _graph({
        "leaf": {"op": "leaf", "children": [], "eclass": "a", "cost": 5},
        "loop": {"op": "loop", "children": ["wrap"], "eclass": "a", "cost": 0},
        "wrap": {"op": "wrap", "children": ["leaf"], "eclass": "b", "cost": 0},
    }, ["b"])
    choice = extract_tree(g)
    assert choice["a"] == "leaf"
    check_extraction(g, choice, ["b"])


def test_checker_rejects_cycle_and_missing_class():
    g = _graph({
        "leaf": {"op": "leaf", "children": [], "eclass": "a", "cost": 5},
        "loop": {"op": "loop", "children": ["wrap"], "eclass": "a", "cost": 0},
        "wrap": {"op": "wrap", "children": ["leaf"], "eclass": "b", "cost": 0},
    }, ["b"])
    with pytest.raises(InvalidExtraction, match="cycle"):
        check_extraction(g, {"a": "loop", "b": "wrap"}, ["b"])
    with pytest.raises(InvalidExtraction, match="no chosen node"):
        check_extraction(g, {"b": "wrap"}, ["b"])
    with pytest.raises(InvalidExtraction, match="not an extractable member"):
        check_extraction(g, {"b": "wrap", "a": "wrap"}, ["b"])


def test_tree_cost_overflow_on_deep_residual_dag_still_extracts():
    # x_{i+1} = add(x_i, relu(x_i)): tree cost doubles per block, 1500 blocks pass 1e308.
    nodes = {"leaf": {"op": "x", "children": [], "eclass": "c0", "cost": 1}}
    for i in range(1500):
        nodes[f"r{i}"] = {"op": "relu", "children": [_last(nodes, i)], "eclass": f"r{i}", "cost": 1}
        nodes[f"a{i}"] = {"op": "add", "children": [_last(nodes, i), f"r{i}"], "eclass": f"c{i + 1}", "cost": 1}
    g = _graph(nodes, ["c1500"])
    choice = extract_tree(g)
    assert len(check_extraction(g, choice, g.roots)) == 3001
    assert dag_cost(g, choice, g.roots) == 3001


def _last(nodes, i):
    return "leaf" if i == 0 else f"a{i - 1}"
