"""`apsat rules why`: a rule that fired, one that partly matched (where it stopped, and the
members of the class there), one whose pattern matches nothing; bad input in one line."""
from __future__ import annotations

import numpy as np
import pytest
from models import make_model
from onnx import helper

from apsat.cli import EXIT_BAD_INPUT, EXIT_OK, main
from apsat.frontend.importer import load_onnx
from apsat.pipeline.why import why_on_model

RULES = """\
(ruleset mine)
; relu(relu(x)) -> relu(x)
(rewrite (compute (relu) (compute (relu) x)) (compute (relu) x) :ruleset mine :name "mine/relu-twice")
; relu(sigmoid(x)) -> sigmoid(x): a sigmoid is positive already
(rewrite (compute (relu) (compute (sigmoid) x)) (compute (sigmoid) x) :ruleset mine :name "mine/relu-sigmoid")
; concatenating along axis 1 twice the same way, for a model with no concatenation
(rewrite (access-concatenate (access-concatenate a b 1) c 1) (access-concatenate a (access-concatenate b c 1) 1)
         :ruleset mine :name "mine/concat-right")
"""


@pytest.fixture(scope="module")
def rule_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("why") / "mine.egg"
    path.write_text(RULES)
    return path


def _model(inner: str):
    """y = relu(inner(relu(x)))"""
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node(inner, ["a"], ["b"]),
             helper.make_node("Relu", ["b"], ["y"])]
    return load_onnx(make_model(nodes, {"x": (2, 8)}, ["y"]))


def test_a_rule_that_fired_says_where(rule_file):
    answer = why_on_model(_model("Relu"), "mine/relu-twice", [rule_file])
    assert answer.fired and answer.sites and answer.matches_during_run >= 1
    assert answer.matched == answer.total == 4
    texts = [t for ts in answer.members.values() for t in ts]
    assert "fired" in str(answer) and any(t.startswith("(compute (relu)") for t in texts)


def test_a_rule_that_partly_matched_says_where_it_stopped(rule_file):
    answer = why_on_model(_model("Tanh"), "mine/relu-sigmoid", [rule_file])
    assert not answer.fired and answer.matches_during_run == 0
    # relu(compute(?, x)) matched; the operator (sigmoid) did not: the stop is the class of
    # tanh(relu x), whose member shows the operator found instead
    assert (answer.matched, answer.total) == (3, 4)
    assert answer.part == "(compute (relu) (compute _ x))"
    assert answer.missing == "(sigmoid)"
    texts = [t for ts in answer.members.values() for t in ts]
    assert any(t.startswith("(compute (tanh) <Expr-") for t in texts), texts
    assert "first sub-pattern that did not match: (sigmoid)" in str(answer)


def test_a_rule_whose_pattern_matches_nothing_says_so(rule_file):
    answer = why_on_model(_model("Tanh"), "mine/concat-right", [rule_file])
    assert not answer.fired and answer.matched == 0 and answer.sites == []
    assert answer.missing.startswith("(access-concatenate (access-concatenate a b 1) c 1)")
    assert "no part of its pattern matches" in str(answer)


def test_the_variant_of_a_swapped_order_answers_for_the_rule(tmp_path):
    """A rule written x * sigmoid(x) fires on sigmoid(x) * x through its swapped variant."""
    path = tmp_path / "swish.egg"
    path.write_text('(ruleset swish)\n; x * sigmoid(x) -> silu x\n(rewrite (compute (elementwise-mul) '
                    '(access-pair x (compute (sigmoid) x))) (compute (silu) x) :ruleset swish :name "swish/silu")\n')
    nodes = [helper.make_node("MatMul", ["x", "w"], ["a"]), helper.make_node("Sigmoid", ["a"], ["s"]),
             helper.make_node("Mul", ["s", "a"], ["y"])]
    model = make_model(nodes, {"x": (2, 8)}, ["y"], {"w": np.full((8, 8), 0.5, np.float32)})
    answer = why_on_model(load_onnx(model), "swish/silu", [path])
    assert answer.fired and answer.variant == "swish/silu|swapped-1"


def test_cli_answers_and_refuses_an_unknown_rule_in_one_line(rule_file, tmp_path, capsys):
    path = tmp_path / "m.onnx"
    path.write_bytes(make_model([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["y"])],
                                {"x": (2, 8)}, ["y"]).SerializeToString())
    assert main(["rules", "why", str(rule_file), "mine/relu-twice", str(path)]) == EXIT_OK
    assert "rule mine/relu-twice" in capsys.readouterr().out
    assert main(["rules", "why", str(rule_file), "mine/relu-twise", str(path)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "unknown rule 'mine/relu-twise'" in err and "mine/relu-twice" in err
    assert main(["rules", "why", "mine/relu-twice"]) == EXIT_BAD_INPUT
    assert "give [RULE_FILE] RULE_NAME MODEL.onnx" in capsys.readouterr().err
