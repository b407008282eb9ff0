"""Loaded e-graphs reused between runs (apsat/pipeline/egraph_pool.py): a second run of a
model gives the same report (timings aside) from an e-graph that was loaded once; runs
with the user's rules, a run that failed and rule files edited since do not share one."""
from __future__ import annotations

from pathlib import Path

import pytest
from models import make_model
from onnx import helper

import apsat
from apsat.pipeline import egraph_pool


def _model():
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Sigmoid", ["a"], ["y"])]
    return make_model(nodes, {"x": (4, 8)}, ["y"])


def _without_times(report: dict) -> dict:
    """The report with every figure that depends on the clock left out."""
    def clean(v):
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items() if "second" not in k and "rss" not in k}
        if isinstance(v, list):
            return [clean(x) for x in v]
        return v
    return clean(report)


@pytest.fixture
def empty_pool(monkeypatch):
    monkeypatch.setattr(egraph_pool, "_IDLE", {})
    return egraph_pool._IDLE


def test_a_second_run_reuses_the_loaded_egraph_and_reports_the_same(empty_pool):
    first = apsat.optimize(_model(), target="gpu")
    [(key, idle)] = empty_pool.items()
    kept = idle[0]
    second = apsat.optimize(_model(), target="gpu")
    assert empty_pool[key] == [kept]                      # handed out, popped, kept again
    assert _without_times(first.report) == _without_times(second.report)
    assert first.program.to_text() == second.program.to_text()
    assert kept.size() == (0, 0) and kept.outputs == {}     # back to the loaded state: no model in it


def test_a_run_with_the_users_rules_builds_its_own(empty_pool, tmp_path):
    path = tmp_path / "mine.egg"
    path.write_text("; mine\n(ruleset mine)\n; relu(relu(x)) -> relu(x)\n(rewrite (compute (relu) (compute (relu) x)) "
                    "(compute (relu) x) :ruleset mine :name \"mine/relu-twice\")\n")
    apsat.optimize(_model(), target="gpu", rules=[Path(path)])
    assert empty_pool == {}


def test_an_egraph_handed_out_twice_at_once_is_two_and_a_failed_run_keeps_none(empty_pool):
    a, b = egraph_pool.acquire("systolic:8x8"), egraph_pool.acquire("systolic:8x8")
    assert a is not b and a.library is not b.library
    egraph_pool.release(a)                                   # b's run failed: never released
    assert [len(v) for v in empty_pool.values()] == [1]


def test_edited_rule_files_are_read_again(empty_pool, monkeypatch):
    before = egraph_pool.acquire("gpu")
    egraph_pool.release(before)
    monkeypatch.setattr(egraph_pool, "builtin_stamp", lambda: (("edited", 1, 1),))
    after = egraph_pool.acquire("gpu")
    assert after is not before and all(k[1] == (("edited", 1, 1),) for k in empty_pool)
