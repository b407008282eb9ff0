"""regroup: a chain of one associative operator with a scalar constant in it also holds the
grouping with the constant outermost (apsat/rules/regroup.egg): each rule is sound on
seeded inputs (rtol 1e-4, atol 1e-5: the two roundings change order), reaches that form,
and refuses a chain without a constant and an operator that is not associative; the
registry's associative flag is checked on the formula."""
from __future__ import annotations

import dataclasses

import pytest
from harness import check_reaches, check_refuses, check_sound

from apsat.lang.ops import COMPUTE_OPS

SHAPES = {"x": (2, 3, 4), "y": (2, 3, 4)}
X, Y = "(access (access-tensor x) 3)", "(access (access-tensor y) 3)"


def lit(value: float) -> str:
    return (f"(access-broadcast (access-reshape (access-literal {value}) (access-shape (shape 1 1 1) (shape))) "
            f"(access-shape (shape 2 3 4) (shape)))")


def op(name: str, a: str, b: str) -> str:
    return f"(compute {name} (access-pair {a} {b}))"


OUTWARD = [   # (rule, the chain as written, its constant-outermost form)
    ("regroup/constant-outward", op("elementwise-mul", op("elementwise-mul", X, lit(0.5)), Y),
     op("elementwise-mul", op("elementwise-mul", X, Y), lit(0.5))),
    ("regroup/constant-outward-right", op("elementwise-mul", Y, op("elementwise-mul", X, lit(0.5))),
     op("elementwise-mul", op("elementwise-mul", X, Y), lit(0.5))),
    ("regroup/constant-outward", op("elementwise-add", op("elementwise-add", X, lit(3.0)), Y),
     op("elementwise-add", op("elementwise-add", X, Y), lit(3.0))),
    ("regroup/constant-outward-right", op("elementwise-max", Y, op("elementwise-max", X, lit(-1.0))),
     op("elementwise-max", op("elementwise-max", X, Y), lit(-1.0))),
]


@pytest.mark.parametrize("rule, text, outermost", OUTWARD, ids=[f"{r}-{i}" for i, (r, _, _) in enumerate(OUTWARD)])
def test_constant_moves_outward_soundly(rule, text, outermost):
    assert check_sound(rule, text, SHAPES) >= 2
    check_reaches(rule, text, SHAPES, outermost)


@pytest.mark.parametrize("rule, text", [
    ("regroup/constant-outward", op("elementwise-mul", op("elementwise-mul", X, Y), X)),       # no constant
    ("regroup/constant-outward", op("elementwise-sub", op("elementwise-sub", X, lit(0.5)), Y)),  # not associative
    ("regroup/constant-outward-right", op("elementwise-mul", Y, op("elementwise-add", X, lit(0.5)))),  # two ops
])
def test_refuses_a_chain_it_cannot_regroup(rule, text):
    check_refuses(rule, text, SHAPES)


def test_the_associative_flag_is_checked_on_the_formula():
    """Declaring Equal (or Sub, which does not commute) associative fails at import."""
    for name in ("equal", "elementwise-sub"):
        with pytest.raises(ValueError, match="declared associative"):
            # the derived fields cleared, so the entry is checked as if declared so
            dataclasses.replace(COMPUTE_OPS[name], associative=True, flops_in=0, flops_out=0, evaluate=None)
    assert {n for n, s in COMPUTE_OPS.items() if s.associative} == {
        "elementwise-add", "elementwise-mul", "elementwise-max", "elementwise-min",
        "logical-and", "logical-or", "logical-xor"}
