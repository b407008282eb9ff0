"""Plans are declared with the rules: `(ruleset NAME :phase PHASE)` joins a ruleset to a phase
of every plan that has it (apsat/rules/plans.py), a built-in ruleset that declares none is a
loader error, `:phase on-request` keeps one out of the plans on purpose, a phase no plan has
is refused with path:line, and a user file joins a phase the same way: its rules then run
in the target's plan (after the phases before it, so they see what those built)."""
from __future__ import annotations

from pathlib import Path

import pytest
from models import make_model
from onnx import helper

import apsat
from apsat.errors import RuleError
from apsat.rules import library as library_module
from apsat.rules.library import RuleLibrary
from apsat.rules.saturate import default_plan

MINE = """\
; mine: relu(relu(x)) -> relu(x), joined to the fusion phase
(ruleset mine :phase {phase})
; relu(relu(x)) -> relu(x)
(rewrite (compute (relu) (compute (relu) x)) (compute (relu) x) :ruleset mine :name "mine/relu-twice")
"""


def test_the_built_in_plans_come_from_the_rule_files():
    gpu = {p.name: p.rulesets for p in default_plan("gpu")}
    assert set(gpu["fusion"]) == {"fusion", "attention-fusion", "norm-fusion", "regroup"}
    assert gpu["relayout"] == ("layout-join",) and gpu["merge"] == ("merge",)
    systolic = {p.name: p.rulesets for p in default_plan("systolic")}
    assert systolic["im2col"] == ("im2col",) and "algebra" not in systolic
    lib = RuleLibrary()
    assert lib.phase_of["tiling"] == "on-request"
    assert all("tiling" not in p.rulesets for plan in ("gpu", "systolic") for p in default_plan(plan))


def test_a_built_in_ruleset_in_no_phase_is_a_loader_error(tmp_path, monkeypatch):
    stray = tmp_path / "stray.egg"
    stray.write_text("; stray\n(ruleset stray)\n")
    builtins = library_module.builtin_rule_files()
    monkeypatch.setattr(library_module, "builtin_rule_files", lambda: builtins + [stray])
    with pytest.raises(RuleError, match=rf"^{stray}:2: built-in ruleset 'stray' joins no phase"):
        RuleLibrary()


@pytest.mark.parametrize("declaration, reason", [
    ("(ruleset mine :phase fusoin)", "unknown phase 'fusoin'"),
    ("(ruleset mine :stage fusion)", "expected (ruleset NAME) or (ruleset NAME :phase PHASE)"),
])
def test_a_bad_phase_declaration_is_refused_with_its_line(tmp_path, declaration, reason):
    path = tmp_path / "mine.egg"
    path.write_text(f"; mine\n{declaration}\n")
    with pytest.raises(RuleError) as err:
        RuleLibrary([path])
    assert str(err.value).startswith(f"{path.resolve()}:2: {reason}")


def _model():
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["y"])]
    return make_model(nodes, {"x": (2, 8)}, ["y"])


def test_a_user_file_joins_its_phase_of_the_plan(tmp_path):
    path = tmp_path / "mine.egg"
    path.write_text(MINE.format(phase="fusion"))
    res = apsat.optimize(_model(), target="gpu", rules=[Path(path)])
    phases = {p["phase"]: p for p in res.report["saturation"]["phases"]}
    assert list(phases)[:2] == ["affine", "layout"]             # the whole plan ran
    assert "mine" in phases["fusion"]["rulesets"]
    assert phases["fusion"]["rule_matches"].get("mine/relu-twice", 0) >= 1
    assert res.program.op_counts() == {"access-tensor": 1, "compute relu": 1}    # relu once


def test_a_user_file_without_a_phase_still_runs_alone(tmp_path):
    path = tmp_path / "mine.egg"
    path.write_text(MINE.replace(" :phase {phase}", ""))
    res = apsat.optimize(_model(), target="gpu", rules=[Path(path)])
    assert [p["phase"] for p in res.report["saturation"]["phases"]] == ["rules"]
