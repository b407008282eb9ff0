"""EGraph.run's node limit on exploding e-graphs: a phase never ends over its limit by more
than its last iteration's growth (the report carries it), near the limit single iterations
run under a match limit the room can hold, rules that still fit are not held back, and the
saturation report shows any overshoot."""
import apsat
import pytest

from apsat.explore.egraph import EGraph
from apsat.rules.library import RuleLibrary

# Every literal v < CAP begets 2v+1 and 2v+2: a binary tree of literals, the e-graph
# doubling each iteration (every literal matches again each iteration, so a rule's match
# count is the whole graph, as with exploratory rules on real programs).
DOUBLE = """
(ruleset double)
(rule ((= e (access-literal v)) (< v {cap}.0))
      ((access-literal (+ (* v 2.0) 1.0)) (access-literal (+ (* v 2.0) 2.0))) :ruleset double)
"""
MATMUL64 = ("(compute dot-product (access-cartesian-product (access (access-tensor a) 1) "
            "(access (access-tensor b) 1)))")


def _tree_size(cap: int) -> int:
    """Literals 0 .. 2(cap-1)+2: the saturated DOUBLE tree."""
    return 2 * (cap - 1) + 3


def _doubling(cap: int = 1 << 20) -> EGraph:
    eg = EGraph()
    eg.add(apsat.parse("(access-literal 0.0)", {}))
    eg.load_text(DOUBLE.format(cap=cap))
    return eg


def _tiling64() -> EGraph:
    eg = EGraph()
    eg.add(apsat.parse(MATMUL64, {"a": (64, 64), "b": (64, 64)}))
    RuleLibrary().load_into(eg, ["tiling"])
    return eg


def _assert_bounded(report: dict):
    """The guarantee: over the limit by at most the last burst's growth, that burst being
    a single iteration; overshoot as reported."""
    last = report["last_burst"]
    assert report["overshoot"] == max(0, report["nodes_after"] - report["node_limit"])
    assert report["nodes_after"] <= report["node_limit"] + last["nodes_added"]
    if report["overshoot"]:
        assert last["iterations"] == 1


def test_growth_per_match_counts_right_hand_side_constructors():
    eg = _doubling()
    assert eg.growth_per_match("double") == 2            # two access-literal per match
    eg.load_text("(ruleset grow)\n(rewrite (access-literal ?v) (compute (relu) (access-literal (+ ?v 1.0))) "
                 ":ruleset grow)\n(birewrite (compute (relu) ?x) (compute (relu) (compute (relu) ?x)) "
                 ":ruleset grow)\n(unstable-combined-ruleset both double grow)")
    assert eg.growth_per_match("grow") == 2 + (2 + 1)    # the birewrite: both directions
    assert eg.growth_per_match(["both", "double"]) == 2 + 5
    assert eg.growth_per_match("shapes") == 0            # shape facts add no term


@pytest.mark.parametrize("limit", [100, 1000, 5000])
def test_doubling_graph_stops_under_its_limit(limit):
    report = _doubling().run("double", node_limit=limit, iter_limit=100)
    assert report["stop_reason"] == "node_limit"
    _assert_bounded(report)
    assert report["overshoot"] == 0
    # stopped at the last whole tree that fits: the next doubling would not
    assert report["nodes_after"] <= limit < 2 * report["nodes_after"] + 1


def test_held_back_rules_that_fit_still_run_and_saturation_is_recognised():
    # the tree saturates at 513 literals; with limit 700 the run turns careful at 255
    # nodes (one more doubling might not fit) but the last doubling fits: the driver must
    # let it run and then see that nothing is left
    report = _doubling(cap=256).run("double", node_limit=700, iter_limit=100)
    assert report["stop_reason"] == "saturated" and report["nodes_after"] == _tree_size(256)
    assert report["overshoot"] == 0
    # with limit 400 the last doubling does not fit
    report = _doubling(cap=256).run("double", node_limit=400, iter_limit=100)
    assert report["stop_reason"] == "node_limit" and report["nodes_after"] == 255


def test_an_overshoot_is_one_iteration_and_reported():
    # a limit below what the very first iteration adds (no growth measured yet): the
    # overshoot is that one iteration, and the report says so
    report = _doubling().run("double", node_limit=2, iter_limit=100)
    assert report["stop_reason"] == "node_limit" and report["nodes_after"] == 3
    assert report["overshoot"] == 1
    assert report["last_burst"] == {"iterations": 1, "nodes_added": 2, "match_limit": 100_000}
    _assert_bounded(report)


@pytest.mark.parametrize("limit", [2_000, 10_000])
def test_tiling_a_64x64_matmul_stays_under_small_node_limits(limit):
    # unbounded, tiling this matmul saturates at ~20k nodes; one of its iterations can
    # triple the graph, so the old driver ended at 3.1k for 2k and 16.6k for 10k
    report = _tiling64().run("tiling", node_limit=limit, iter_limit=100, time_limit=60)
    assert report["stop_reason"] == "node_limit"
    _assert_bounded(report)
    assert report["overshoot"] == 0
    assert report["nodes_after"] > limit // 2                 # and used most of the budget
    assert all(k == 1 for k, _, _ in report["burst_log"][-2:])  # careful near the limit


def test_saturation_report_shows_node_limit_and_overshoot():
    eg = _tiling64()
    report = eg.saturate(rules=["tiling"], node_limit=2_000, iter_limit=100, time_limit=60)
    phase = report["phases"][0]
    assert phase["node_limit"] == 2_000 and phase["stop_reason"] == "node_limit"
    assert phase["overshoot"] == 0 and report["overshoot"] == 0
    assert phase["last_burst"]["iterations"] == 1
    assert phase["nodes"] <= 2_000 + phase["last_burst"]["nodes_added"]
