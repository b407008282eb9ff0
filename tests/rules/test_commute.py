"""A rule written once matches both operand orders of a commutative operator
(apsat/rules/commute.py; the registry's `commutative` flag): the loader adds the other
orders as variants whose matches count for the rule; the flag is checked against the
operator's formula; a user's rule fires on each order, soundly (the harness's rtol 1e-4,
atol 1e-5)."""
from __future__ import annotations

import numpy as np
import pytest

import apsat
from apsat.errors import RuleError
from apsat.explore.egraph import EGraph
from apsat.lang import formula as fm
from apsat.lang.evaluate import evaluate
from apsat.lang.ops import COMPUTE_OPS
from apsat.lang.spec import ComputeSpec
from apsat.lang import semantics as sem
from apsat.rules.library import RuleLibrary
from harness import ATOL, RTOL, fired, members, random_tensors

SHAPES = {"x": (4, 6), "y": (4, 6)}
X, Y = "(access (access-tensor x) 1)", "(access (access-tensor y) 1)"


def _rule_file(tmp_path, pattern: str, rhs: str = "(compute (relu) x)") -> RuleLibrary:
    path = tmp_path / "mine.egg"
    path.write_text("; a rule of mine\n(ruleset mine)\n"
                    f"; {pattern} -> {rhs}\n(rewrite {pattern} {rhs} :ruleset mine :name \"mine/r\")\n")
    return RuleLibrary([path])


def _egglog_rules(lib: RuleLibrary) -> int:
    return lib.rules["mine/r"].text.count("(rewrite")


def test_the_commutative_operators_are_the_registrys():
    assert {s.name for s in COMPUTE_OPS.values() if s.commutative} == {
        "elementwise-add", "elementwise-mul", "elementwise-max", "elementwise-min", "equal",
        "logical-and", "logical-or", "logical-xor"}


def test_a_formula_that_does_not_commute_cannot_be_declared_commutative():
    with pytest.raises(ValueError, match="my-sub: is declared commutative, but its formula is not a symmetric"):
        ComputeSpec("my-sub", (), "nary", "a - b", (), scalar=fm.arg(0) - fm.arg(1), arity=2,
                    commutative=True, evaluate=sem.nary_evaluator(fm.arg(0) - fm.arg(1), False))


@pytest.mark.parametrize("pattern,orders", [
    ("(compute (elementwise-mul) (access-pair x (compute (sigmoid) x)))", 2),
    ("(compute (elementwise-mul) (access-pair x x))", 1),                       # one order only
    ("(compute (elementwise-sub) (access-pair x (compute (sigmoid) x)))", 1),    # not commutative
    ("(compute (elementwise-add) (access-pair (compute (elementwise-mul) (access-pair x (compute (sigmoid) x))) x))", 4),
])
def test_the_loader_adds_every_other_order(tmp_path, pattern, orders):
    assert _egglog_rules(_rule_file(tmp_path, pattern)) == orders


def test_more_pairs_than_expanded_is_a_path_line_error(tmp_path):
    pattern = "x"
    for _ in range(5):
        pattern = f"(compute (elementwise-add) (access-pair {pattern} (compute (sigmoid) x)))"
    with pytest.raises(RuleError, match=r"mine\.egg:4: the pattern has more than 4 commutative pairs"):
        _rule_file(tmp_path, pattern)


@pytest.mark.parametrize("program", [
    f"(compute elementwise-mul (access-pair {X} (compute sigmoid {X})))",
    f"(compute elementwise-mul (access-pair (compute sigmoid {X}) {X}))",
])
def test_a_user_rule_written_once_fires_on_both_orders_and_is_sound(tmp_path, program):
    lib = _rule_file(tmp_path, "(compute (elementwise-mul) (access-pair x (compute (sigmoid) x)))",
                     "(compute (silu) x)")
    eg = EGraph()
    root = eg.add(apsat.parse(program, SHAPES))
    lib.load_into(eg, ["mine"])
    report = eg.run(["mine"])
    assert fired(report, "mine/r") >= 1                   # variants count for the rule
    assert not any("|swapped-" in name for name in report["rule_matches"])
    assert eg.matches(f"(compute silu {X})", root)
    tensors = random_tensors(SHAPES, seed=4)
    want = evaluate(apsat.parse(program, SHAPES), tensors)
    progs = members(eg, root)
    assert len(progs) == 2
    for prog in progs:
        np.testing.assert_allclose(evaluate(prog, tensors), want, rtol=RTOL, atol=ATOL)


def test_builtin_silu_has_no_second_rule_and_fires_on_both_orders():
    lib = RuleLibrary()
    assert "fusion/silu-commuted" not in lib.rules
    for program in (f"(compute elementwise-mul (access-pair {Y} (compute sigmoid {Y})))",
                    f"(compute elementwise-mul (access-pair (compute sigmoid {Y}) {Y}))"):
        eg = EGraph()
        root = eg.add(apsat.parse(program, SHAPES))
        lib.load_into(eg, ["fusion"])
        assert fired(eg.run(["fusion"]), "fusion/silu") >= 1
        assert eg.matches(f"(compute silu {Y})", root)
