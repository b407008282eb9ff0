"""The user's own rules are checked on the model at hand: after saturation, members of the
e-classes a user rule merged into are evaluated against the class's original term on
seeded inputs; a wrong rule fails the run naming the rule (file:line), a sound one passes,
check_rules=False lets anything through."""
import pytest

from models import small_convnet

from apsat.errors import ApsatError, UnsoundRuleError
from apsat.pipeline.optimize import optimize
from apsat.pipeline.soundness import site_probes
from apsat.rules.loader import Rule

# relu(x) is relu(relu(x)): sound, and it fires on both of small_convnet's Relus.
SOUND = """; more relus: sound, and it fires on every relu.
(ruleset mine)

; relu(x) -> relu(relu(x))
(rewrite (compute (relu) ?x) (compute (relu) (compute (relu) ?x)) :ruleset mine :name "relu-twice")
"""
# relu(x) is not sigmoid(x).
UNSOUND = """; a wrong rule.
(ruleset wrong)

; relu(x) -> sigmoid(x)
(rewrite (compute (relu) ?x) (compute (sigmoid) ?x) :ruleset wrong :name "relu-is-sigmoid")
"""
# the same mistake as a `rule` with a union, added to a built-in ruleset
UNSOUND_RULE = """; a wrong rule in the fusion ruleset.

; relu(x) -> sigmoid(x)
(rule ((= e (compute (relu) ?x))) ((union e (compute (sigmoid) ?x))) :ruleset fusion :name "relu-union-sigmoid")
"""


def _file(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_a_sound_user_rule_passes_and_the_report_says_what_was_checked(tmp_path):
    res = optimize(small_convnet(), rules=[_file(tmp_path, "mine.egg", SOUND)], verify=False)
    check = res.report["rule_check"]
    assert check["rules"] == 1 and check["probed_rules"] == 1
    assert check["sites"] >= 2 and 2 <= check["classes_checked"] <= 20
    assert check["members_checked"] >= 2


def test_an_unsound_user_rule_fails_the_run_naming_the_rule(tmp_path):
    path = _file(tmp_path, "wrong.egg", UNSOUND)
    with pytest.raises(UnsoundRuleError) as err:
        optimize(small_convnet(), rules=[path], verify=False)
    message = str(err.value)
    assert isinstance(err.value, ApsatError) and "\n" not in message
    assert message.startswith(f"{tmp_path / 'wrong.egg'}:5: rule 'relu-is-sigmoid' is unsound on this model")
    assert "e-class Expr-" in message and "sigmoid" in message and "max abs err" in message


def test_an_unsound_rule_form_added_to_a_builtin_ruleset_is_caught(tmp_path):
    path = _file(tmp_path, "wrong_rule.egg", UNSOUND_RULE)
    with pytest.raises(UnsoundRuleError, match=r"wrong_rule.egg:4: rule 'relu-union-sigmoid'"):
        optimize(small_convnet(), rules=[path], verify=False)


def test_check_rules_false_lets_an_unsound_rule_through(tmp_path):
    res = optimize(small_convnet(), rules=[_file(tmp_path, "wrong.egg", UNSOUND)], verify=False,
                   check_rules=False)
    assert res.report["rule_check"] == {"skipped": "check_rules=False"}
    assert res.report["saturation"]["phases"][0]["rule_matches"]["relu-is-sigmoid"] >= 2


def test_builtin_rulesets_alone_are_not_checked():
    res = optimize(small_convnet(), rules=["fusion"], verify=False)
    assert "rule_check" not in res.report


def test_site_probes_bind_the_left_side_with_its_conditions():
    rule = Rule("r", "mine", None, 1, "(birewrite (compute (relu) ?x) (compute (relu) (compute (relu) ?x)) "
                                      ":when ((= (ndim ?x) 2)) :ruleset mine)")
    probes, ops = site_probes(rule)
    assert probes == [("(= ?apsat_site (compute (relu) ?x)) (= (ndim ?x) 2)", "?apsat_site"),
                      ("(= ?apsat_site (compute (relu) (compute (relu) ?x))) (= (ndim ?x) 2)", "?apsat_site")]
    assert ops == {"compute", "relu"}
    # an operator rewrite merges no Expr class: nothing to probe (a documented limit)
    assert site_probes(Rule("r", "mine", None, 1, "(rewrite (relu) (sigmoid) :ruleset mine)"))[0] == []
