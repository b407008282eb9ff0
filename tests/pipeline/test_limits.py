"""Saturation limits that hold: the caller's iteration, node, time and memory limits cap
every phase of the default plan, the report says which limit stopped each phase and what
the phase ran under, and the result does not depend on how fast the machine is (burst
sizes follow iterations and e-node counts, never the clock)."""
import subprocess
import sys

import onnx
import pytest

import apsat
from apsat.egraph import bursts
from apsat.egraph.driver import EGraph
from apsat.lang.syntax import to_dag_text
from apsat.pipeline.optimize import optimize
from apsat.pipeline.zoo import light_model_paths, randomize_weights
from apsat.rules.saturate import DEFAULT_TIME_LIMIT, RULES_DEFAULTS, default_plan, saturate

LIGHT = {p.stem.replace("light_", ""): p for p in light_model_paths()}
# Each literal begets the next under a relu: two e-nodes an iteration, never saturating.
GROW = """
(ruleset grow)
(rewrite (access-literal ?v) (compute (relu) (access-literal (+ ?v 1.0))) :ruleset grow)
"""
REASONS = {"saturated", "iter_limit", "node_limit", "time_limit", "memory_limit"}


def _light(name: str) -> onnx.ModelProto:
    return randomize_weights(onnx.load(str(LIGHT[name])), seed=1)


def _growing() -> EGraph:
    eg = EGraph()
    eg.add(apsat.parse("(access-literal 0.0)", {}))
    eg.load_text(GROW)
    return eg


def test_caller_limits_cap_every_phase_of_the_default_plan():
    # the reproduced bug: the plan ignored these and ended at 13,158 e-nodes after a
    # 16-iteration phase
    res = optimize(_light("squeezenet"), target="systolic:32x32", node_limit=3000, iter_limit=2, verify=False)
    sat = res.report["saturation"]
    plan = {p.name: p for p in default_plan("systolic")}
    assert [p["phase"] for p in sat["phases"]] == list(plan)
    for phase in sat["phases"]:
        assert phase["iterations"] <= 2 and phase["stop_reason"] in REASONS
        assert phase["limits"] == {"iter_limit": 2, "node_limit": 3000, "time_limit": DEFAULT_TIME_LIMIT,
                                   "memory_limit": None}
        assert phase["nodes"] <= 3000 + phase["overshoot"] and phase["overshoot"] == 0
    assert res.report["egraph"]["nodes"] <= 3000
    assert any(p["stop_reason"] == "iter_limit" for p in sat["phases"])


def test_a_node_limit_alone_stops_the_exploding_phase_under_it():
    res = optimize(_light("squeezenet"), target="systolic:32x32", node_limit=3000, verify=False)
    phases = {p["phase"]: p for p in res.report["saturation"]["phases"]}
    assert phases["systolic"]["stop_reason"] == "node_limit"        # unbounded it reaches 13,158
    assert res.report["egraph"]["nodes"] <= 3000 and res.report["saturation"]["overshoot"] == 0
    # the phases keep their own iteration limits where the caller gives none
    assert phases["layout"]["limits"]["iter_limit"] == 16 and phases["fusion"]["limits"]["iter_limit"] == 30


def test_without_caller_limits_phases_run_under_their_own():
    eg = EGraph(target="gpu")
    eg.add(apsat.parse("(compute relu (access (access-tensor x) 1))", {"x": (2, 3)}))
    report = saturate(eg)
    own = {p.name: p.limits() for p in default_plan("gpu")}
    assert {p["phase"]: p["limits"] for p in report["phases"]} == own
    assert all(lim["time_limit"] == DEFAULT_TIME_LIMIT for lim in own.values())
    # a caller's time limit replaces the safety net, also upwards; iterations only lower
    report = saturate(eg, time_limit=300.0, iter_limit=20)
    assert {p["phase"]: p["limits"] for p in report["phases"]} == {
        name: {**lim, "time_limit": 300.0, "iter_limit": min(20, lim["iter_limit"])} for name, lim in own.items()}
    # explicit rulesets: one phase under the defaults it always had
    report = saturate(eg, rules=["layout"])
    assert report["phases"][0]["limits"] == {**RULES_DEFAULTS, "memory_limit": None}
    report = saturate(eg, rules=["layout"], iter_limit=3, time_limit=50.0)
    assert report["phases"][0]["limits"] == {**RULES_DEFAULTS, "iter_limit": 3, "time_limit": 50.0,
                                             "memory_limit": None}


def test_memory_limit_stops_a_phase_between_bursts():
    if bursts.rss_mib() is None:
        pytest.skip("no /proc/self/statm: the memory limit is not enforced here")
    assert 10 < bursts.rss_mib() < 1e6
    report = _growing().run("grow", iter_limit=50, memory_limit=1.0)   # 1 MiB: already over
    assert report["stop_reason"] == "memory_limit" and report["iterations"] == 0
    report = _growing().run("grow", iter_limit=5, memory_limit=1e7)    # far above: no effect
    assert report["stop_reason"] == "iter_limit" and report["rss_mib"] > 1.0


class _FakeClock:
    """Stands in for the `time` module inside apsat.egraph.bursts: seconds pass only when
    a burst runs, `seconds_per_iteration` an iteration (a fast or a slow machine)."""

    def __init__(self, eg, seconds_per_iteration: float):
        self.now, self.rate = 0.0, seconds_per_iteration
        run = eg._run

        def timed(text, what):
            if text.startswith("(run-schedule (let-scheduler"):     # a burst, not shapes
                self.now += self.rate * int(text.split("(repeat ")[1].split()[0])
            return run(text, what)
        eg._run = timed

    def perf_counter(self) -> float:
        return self.now


def test_burst_sizes_do_not_depend_on_the_clock(monkeypatch):
    # 100 iterations at 10 s each fit a 1100 s limit. The old scheduler shortened bursts
    # to land inside the time limit by the measured seconds per iteration, so a slow
    # machine split the same run into other bursts (each with a fresh back-off scheduler)
    logs = []
    for rate in (1e-4, 10.0):
        eg = _growing()
        monkeypatch.setattr(bursts, "time", _FakeClock(eg, rate))
        report = eg.run("grow", iter_limit=100, time_limit=1100.0)
        assert report["stop_reason"] == "iter_limit" and report["iterations"] == 100
        logs.append(report["burst_log"])
    assert logs[0] == logs[1]
    # the time limit stays a safety net: too slow a machine stops between bursts
    eg = _growing()
    monkeypatch.setattr(bursts, "time", _FakeClock(eg, 100.0))
    report = eg.run("grow", iter_limit=100, time_limit=1100.0)
    assert report["stop_reason"] == "time_limit" and report["iterations"] < 100
    assert [k for k, _, _ in report["burst_log"]] == [k for k, _, _ in logs[0][:len(report["burst_log"])]]


def _program_text(proto) -> tuple[str, list]:
    res = optimize(proto, target="gpu", verify=False)
    phases = [(p["phase"], p["iterations"], p["stop_reason"]) for p in res.report["saturation"]["phases"]]
    return to_dag_text(res.program.outputs), phases


@pytest.mark.slow
def test_same_program_on_an_idle_and_on_a_loaded_machine():
    # light ResNet-50, the zoo's deepest plan run for gpu (1.8 s here idle): once as it
    # is, once beside a busy loop on each core
    proto = _light("resnet50")
    idle = _program_text(proto)
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        loaded = _program_text(proto)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert loaded[1] == idle[1]
    assert all(reason in ("saturated", "iter_limit") for _, _, reason in idle[1])
    assert loaded[0] == idle[0]
