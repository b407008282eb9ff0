"""The `precision` rules (apsat/rules/precision.egg): each rule fires on a small float32-typed
program under the facts apsat.pipeline.precision.facts writes, reaches its half form, and
every member of the root e-class stays within the half type's tolerance of the float32
original (the reference computes each member in its types: every half node rounded);
each family refuses where its condition fails (no facts, a value already half, an
operator the mode keeps in float32). Then the family as a whole: bounded on small
transformer-like and conv programs, and inert without its facts.

Tolerance: these rules change values by rounding, so members are compared at
apsat.pipeline.verify.half_tolerance of the type (8 ulps: 7.8e-3 for f16, 6.3e-2 for bf16)
relative to the output's scale (atol = tol * max|float32 result|, rtol = tol), the bound the
pipeline itself judges a precision run by. One rounding of a half operand moves it by at
most 2**-11 relative (f16), and the products here sum at most 6 terms in float32, so a
correct rule stays well inside (views and cancelled casts move no value: compared
exactly); a wrong one moves the result by O(1) of its scale on standard-normal inputs,
far outside: a product with one operand twice, a pair with its weight dropped, the
concatenation's operands swapped, a map that drops its operator each fail here (tried)."""

import numpy as np
import pytest

from apsat.egraph.driver import EGraph
from apsat.lang.evaluate import evaluate
from apsat.lang.syntax import parse_term
from apsat.pipeline.precision import facts
from apsat.pipeline.soundness import random_tensors
from apsat.pipeline.verify import half_tolerance
from harness import check_collapses, check_reaches, check_refuses, check_sound, fired, library, run_rule, typed_program

FP16, BF16, MIXED = facts("fp16"), facts("bf16"), facts("mixed")
SHAPES = {"a": (5, 6), "w": (4, 6), "b": (4,), "x": (5, 6), "y": (5, 6), "u": (5, 6), "v": (1, 6), "s": (5, 1, 6),
          "im": (1, 3, 6, 6), "q": (1, 2, 5, 4), "k": (1, 2, 6, 4), "vt": (1, 2, 3, 6)}


def acc(name: str, split: int = 1) -> str:
    return f"(access (access-tensor {name}) {split})"


A, W, B, X, Y = acc("a"), acc("w"), acc("b"), acc("x"), acc("y")
MM = f"(compute dot-product (access-cartesian-product {A} {W}))"               # ((5, 4), ())
FDB = f"(fused-dot-bias {A} {W} {B})"
QK = ("(access-pair (access-broadcast (access-reshape (access-tensor q) (access-shape (shape 1 2 5 1 4) (shape))) "
      "(access-shape (shape 1 2 5 6) (shape 4))) (access-broadcast (access-reshape (access-tensor k) "
      "(access-shape (shape 1 2 1 6 4) (shape))) (access-shape (shape 1 2 5 6) (shape 4))))")
V = ("(access-broadcast (access-reshape (access-tensor vt) (access-shape (shape 1 2 1 3 6) (shape))) "
     "(access-shape (shape 1 2 5 3) (shape 6)))")
ATTN = f"(attention 0 {QK} (access-literal 0.0) {V})"


def half(t: str, h: int = 10) -> str:
    return f"(compute (cast {h}) {t})"


def wide(t: str) -> str:
    return f"(compute (cast 1) {t})"


def tolerances(text: str, shapes: dict, types, dtype: str = "f16") -> dict:
    """check_sound's rtol / atol at the half tolerance, scaled by the float32 result."""
    tol = half_tolerance(dtype)
    scale = float(np.max(np.abs(evaluate(typed_program(text, shapes, types), random_tensors(shapes)))))
    return {"rtol": tol, "atol": tol * scale}


def check_half(rule, text, pattern, types="f32", fact_text=FP16, dtype="f16", **limits):
    """The rule fires, reaches `pattern` and every member is within the half tolerance."""
    check_reaches(rule, text, SHAPES, pattern, types=types, facts=fact_text, **limits)
    check_sound(rule, text, SHAPES, types=types, facts=fact_text,
                **tolerances(text, SHAPES, types, dtype), **limits)


WX, WY = wide(X), wide(Y)                     # x, y : f16 widened


# ---- products: the half-operand forms ----------------------------------------------------------

PRODUCTS = [
    ("precision/dot", MM, wide(f"(compute dot-product (access-cartesian-product {half('?a')} {half('?b')}))")),
    ("precision/dot-bias", FDB, wide(f"(fused-dot-bias {half('?a')} {half('?b')} {half('?c')})")),
    ("precision/dot-bias-act", f"(fused-dot-bias-act relu {A} {W} {B})",
     wide(f"(fused-dot-bias-act relu {half('?a')} {half('?b')} {half('?c')})")),
    ("precision/attention", ATTN, wide(f"(attention 0 {half('?qk')} ?m {half('?v')})")),
]


@pytest.mark.parametrize("rule,text,pattern", PRODUCTS, ids=[p[0] for p in PRODUCTS])
def test_product_reaches_half_form_and_is_close(rule, text, pattern):
    """Each float32 product (plain, fused with a bias, with an activation, attention) gains
    its half-operand form widened back to float32, within the f16 tolerance."""
    check_half(rule, text, pattern)


def test_dot_in_bf16_and_mixed():
    """bf16 facts give the (cast 16) operands, at the bf16 tolerance; mixed lowers a
    product to f16 (products are what mixed computes in half)."""
    check_half("precision/dot", MM, wide(f"(compute dot-product (access-cartesian-product {half('?a', 16)} "
                                         f"{half('?b', 16)}))"), fact_text=BF16, dtype="bf16")
    check_half("precision/dot", MM, wide(f"(compute dot-product (access-cartesian-product {half('?a')} "
                                         f"{half('?b')}))"), fact_text=MIXED)


@pytest.mark.parametrize("rule,text,_", PRODUCTS, ids=[p[0] for p in PRODUCTS])
def test_product_refuses_without_facts_or_float32(rule, text, _):
    """No facts set: nothing fires. Untyped (exact) values or values already f16: the
    product is not float32, so it is not lowered (again)."""
    check_refuses(rule, text, SHAPES, types="f32")
    check_refuses(rule, text, SHAPES, facts=FP16)
    check_refuses(rule, text, SHAPES, types="f16", facts=FP16)


def test_dot_bias_act_keeps_float32_activation_in_mixed():
    """mixed keeps softplus in float32 (half-ok does not hold): its fused product is not
    lowered, while fp16 lowers it and mixed lowers the relu one (the contrast)."""
    soft = f"(fused-dot-bias-act softplus {A} {W} {B})"
    check_refuses("precision/dot-bias-act", soft, SHAPES, types="f32", facts=MIXED)
    check_half("precision/dot-bias-act", soft, wide(f"(fused-dot-bias-act softplus {half('?a')} {half('?b')} "
                                                    f"{half('?c')})"))
    check_half("precision/dot-bias-act", f"(fused-dot-bias-act relu {A} {W} {B})",
               wide(f"(fused-dot-bias-act relu {half('?a')} {half('?b')} {half('?c')})"), fact_text=MIXED)


MASK = "(access-broadcast (access (access-tensor mask) 4) (access-shape (shape 1 2 5 6) (shape)))"


def test_attention_keeps_a_fully_masked_row():
    """Query row 0 masked everywhere with float32's minimum (torch's masked_fill value):
    the float32 atom's scores are all equal there (the mean of v); the half form keeps that
    within the f16 tolerance, because the bias stays float32 (rounded to f16 it was -inf,
    and the row NaN or 0)."""
    text, shapes = f"(attention 1 {QK} {MASK} {V})", dict(SHAPES, mask=(1, 1, 5, 6))
    inputs = random_tensors(shapes)
    inputs["mask"] = np.zeros((1, 1, 5, 6), np.float32)
    inputs["mask"][..., 0, :] = np.finfo(np.float32).min
    want = evaluate(typed_program(text, shapes, "f32"), inputs)
    tol = half_tolerance("f16")
    check_sound("precision/attention", text, shapes, types="f32", facts=FP16, inputs=inputs, rtol=tol,
                atol=tol * float(np.max(np.abs(want))))


# ---- casts: cancelling, one half mirror per float32 class ---------------------------------------

def test_cast_cancel():
    """f16(f32(x)) is x for x : f16, exactly."""
    text = half(wide(X))
    check_reaches("precision/cast-cancel", text, SHAPES, X, types="f16", facts=FP16)
    # the cast pair is then a cycle through x's class: x is the one acyclic member
    check_collapses("precision/cast-cancel", text, SHAPES, X, types="f16", facts=FP16)


def test_cast_cancel_refuses_other_types():
    """bf16(f32(x)) for x : f16 under the fp16 facts is a rounding, not x; f16(f32(x)) for
    x : f32 rounds x; neither is cancelled. Without facts nothing fires."""
    check_refuses("precision/cast-cancel", half(wide(X), 16), SHAPES, types="f16", facts=FP16)
    check_refuses("precision/cast-cancel", half(wide(X)), SHAPES, types="f32", facts=FP16)
    check_refuses("precision/cast-cancel", half(wide(X)), SHAPES, types="f16")


ONE = ("(access-broadcast (access-reshape (access-literal 1.0) (access-shape (shape 1) (shape 1))) "
       "(access-shape (shape 5) (shape 6)))")
TIMES_ONE = f"(compute elementwise-mul (access-pair {WX} {ONE}))"
MIRROR = ["algebra/mul-one", "precision/pair-weight", "precision/map"]


def test_widen_one_to_one_merges_half_mirrors():
    """x * 1 = x in float32 (algebra/mul-one) puts f32(x) and f32(x * f16(1)) (the pair and
    map rules' half form) in one class; widen-one-to-one then makes x * f16(1) a member
    of x's half class, which no other rule derives (mul-one does not read f16(1) as 1), and
    every member stays exact (x * 1 is x in f16 too)."""
    eg, _, report = run_rule("precision/widen-one-to-one", TIMES_ONE, SHAPES, helpers=MIRROR, types="f16",
                             facts=FP16)
    assert fired(report, "precision/widen-one-to-one")
    x = eg.handle_of(parse_term(X))
    assert eg.matches(f"(compute elementwise-mul (access-pair {X} {half('?one')}))", x)
    # x's class is then {x, x * f16(1)} (cyclic): the members are sampled one relu above it
    check_sound("precision/widen-one-to-one", f"(compute relu {TIMES_ONE})", SHAPES, helpers=MIRROR,
                types="f16", facts=FP16, rtol=0, atol=0)


def test_widen_one_to_one_refuses_other_half_type():
    """With x : f16 under the bf16 facts no half mirror is built, so nothing is merged even
    though mul-one still unions float32 forms; without facts likewise."""
    for fact_text in (BF16, ""):
        _, _, report = run_rule("precision/widen-one-to-one", TIMES_ONE, SHAPES, helpers=MIRROR, types="f16",
                                facts=fact_text)
        assert fired(report, "algebra/mul-one") and not fired(report, "precision/widen-one-to-one")
    check_refuses("precision/widen-one-to-one", f"(compute elementwise-add (access-pair {wide(X)} {wide(Y)}))",
                  SHAPES, types="f16", facts=FP16)


# ---- map: operators the mode computes in half ------------------------------------------------

def test_map_moves_widening_out():
    """relu(f32(x)) -> f32(relu(x)) for x : f16; the add of two half values likewise (with
    the pair rule beside it), within the f16 tolerance."""
    check_half("precision/map", f"(compute relu {wide(X)})", wide(f"(compute relu {X})"), types="f16")
    add = f"(compute elementwise-add (access-pair {wide(X)} {wide(Y)}))"
    check_half("precision/map", add, wide(f"(compute elementwise-add (access-pair {X} {Y}))"), types="f16",
               helpers=["precision/pair"])


@pytest.mark.parametrize("op", ["exp", "softmax", "reduce-sum"])
def test_map_refuses_float32_operators_in_mixed(op):
    """mixed keeps exp, softmax and sums in float32: their operand's widening stays; fp16
    moves it (the contrast, so the refusal is the mode's and not the program's)."""
    text = f"(compute {op} {WX})"
    check_refuses("precision/map", text, SHAPES, types="f16", facts=MIXED)
    check_half("precision/map", text, wide(f"(compute {op} ?x)"), types="f16")


def test_map_refuses_float32_operand_and_no_facts():
    """relu(f32(x)) for x : f32 is not a widening; without facts nothing fires."""
    check_refuses("precision/map", f"(compute relu {wide(X)})", SHAPES, types="f32", facts=FP16)
    check_refuses("precision/map", f"(compute relu {wide(X)})", SHAPES, types="f16")


# ---- views, pairs and copies -----------------------------------------------------------------

VIEWS = [  # rule, program over f32(x) with x : f16, the half form expected in the root e-class
    ("precision/pair", f"(access-pair {WX} {WY})", wide(f"(access-pair {X} {Y})")),
    ("precision/concatenate", f"(access-concatenate {WX} {WY} 0)", wide(f"(access-concatenate {X} {Y} 0)")),
    ("precision/access", f"(access {wide('(access-tensor x)')} 1)", wide(X)),
    ("precision/transpose", f"(access-transpose {WX} (list 1 0))", wide(f"(access-transpose {X} (list 1 0))")),
    ("precision/reshape", f"(access-reshape {WX} (access-shape (shape 30) (shape)))",
     wide(f"(access-reshape {X} (access-shape (shape 30) (shape)))")),
    ("precision/flatten", f"(access-flatten {WX})", wide(f"(access-flatten {X})")),
    ("precision/squeeze", f"(access-squeeze {wide(acc('s'))} 1)", wide(f"(access-squeeze {acc('s')} 1)")),
    ("precision/insert-axis", f"(access-insert-axis {WX} 1)", wide(f"(access-insert-axis {X} 1)")),
    ("precision/slice", f"(access-slice {WX} 1 1 4)", wide(f"(access-slice {X} 1 1 4)")),
    ("precision/windows", f"(access-windows {wide(acc('im'))} (shape 3 3 3) (shape 1 1 1))",
     wide(f"(access-windows {acc('im')} (shape 3 3 3) (shape 1 1 1))")),
    ("precision/pad", f"(access-pad {WX} zero-padding 1 1 2)", wide(f"(access-pad {X} zero-padding 1 1 2)")),
    ("precision/pad", f"(access-pad {WX} min-padding 0 2 0)", wide(f"(access-pad {X} min-padding 0 2 0)")),
    ("precision/broadcast", f"(access-broadcast {wide(acc('v'))} (access-shape (shape 5) (shape 6)))",
     wide(f"(access-broadcast {acc('v')} (access-shape (shape 5) (shape 6)))")),
]


@pytest.mark.parametrize("rule,text,pattern", VIEWS, ids=[v[0] for v in VIEWS])
def test_view_moves_widening_out_exactly(rule, text, pattern):
    """A view or copy of f32(x), x : f16, is f32 of the view of x: values only move, so
    every member equals the original exactly."""
    check_reaches(rule, text, SHAPES, pattern, types="f16", facts=FP16)
    check_sound(rule, text, SHAPES, types="f16", facts=FP16, rtol=0, atol=0)


@pytest.mark.parametrize("rule,text,_", VIEWS, ids=[v[0] for v in VIEWS])
def test_view_refuses_float32_operand_and_no_facts(rule, text, _):
    """f32(x) for x : f32 (a no-op cast) or x : bf16 under the fp16 facts is not a widening
    from the half type: nothing moves; without facts nothing fires."""
    check_refuses(rule, text, SHAPES, types="f32", facts=FP16)
    check_refuses(rule, text, SHAPES, types="bf16", facts=FP16)
    check_refuses(rule, text, SHAPES, types="f16")


U = acc("u")
PAIR_W = f"(access-pair {WX} {U})"
WEIGHT_PAIR = f"(access-pair {U} {WX})"


@pytest.mark.parametrize("rule,text,pattern", [
    ("precision/pair-weight", PAIR_W, wide(f"(access-pair {X} {half(U)})")),
    ("precision/weight-pair", WEIGHT_PAIR, wide(f"(access-pair {half(U)} {X})")),
])
def test_pair_with_weight_rounds_the_weight(rule, text, pattern):
    """A half value paired with a float32 weight: the weight is rounded to f16 and the
    pair widened, within the f16 tolerance."""
    check_half(rule, text, pattern, types={"x": "f16", "u": "f32"}, weights=("u",))


@pytest.mark.parametrize("rule,text", [("precision/pair-weight", PAIR_W), ("precision/weight-pair", WEIGHT_PAIR),
                                       ("precision/pair", PAIR_W), ("precision/pair", WEIGHT_PAIR)])
def test_pair_refuses_computed_float32_operand(rule, text):
    """u is no weight here (not loaded as one) and not a widening: rounding a computed
    float32 operand is a product rule's choice, not a view's, so no pair rule fires."""
    check_refuses(rule, text, SHAPES, types={"x": "f16", "u": "f32"}, facts=FP16)


def test_concatenate_refuses_mixed_operands():
    """concat(f32(x), y) with y : f32 computed: the widening cannot move out of one side."""
    check_refuses("precision/concatenate", f"(access-concatenate {WX} {Y} 0)", SHAPES,
                  types={"x": "f16", "y": "f32"}, facts=FP16)


# ---- the family: bounded, and inert without its facts -------------------------------------------

BLOCK_SHAPES = {"t": (4, 8), "w1": (8, 8), "w2": (8, 8), "c": (8,), "x": (1, 3, 6, 6), "cw": (5, 3, 3, 3),
                "cb": (5,)}
T = acc("t")
P1 = f"(compute dot-product (access-cartesian-product {T} {acc('w1')}))"
P2 = f"(compute dot-product (access-cartesian-product (access (compute relu {P1}) 1) {acc('w2')}))"
BIAS_C = ("(access-broadcast (access-reshape (access-tensor c) (access-shape (shape 1 8) (shape))) "
          "(access-shape (shape 4 8) (shape)))")
# an MLP block: two products, a relu, a bias and a residual add, a view on top
BLOCK = (f"(access-transpose (compute elementwise-add (access-pair (compute elementwise-add (access-pair {P2} "
         f"{BIAS_C})) {acc('t', 2)})) (list 1 0))")
WIN = "(access-squeeze (access-windows (access (access-tensor x) 1) (shape 3 3 3) (shape 1 1 1)) 1)"
CONV = f"(access-transpose (compute dot-product (access-cartesian-product {WIN} {acc('cw')})) (list 0 3 1 2))"
CB = ("(access-broadcast (access-reshape (access-tensor cb) (access-shape (shape 1 5 1 1) (shape))) "
      "(access-shape (shape 1 5 4 4) (shape)))")
CONV_BLOCK = f"(compute relu (compute elementwise-add (access-pair {CONV} {CB})))"


WEIGHTS = ("w1", "w2", "c", "cw", "cb")


def saturate_precision(text: str, shapes: dict, fact_text: str, types="f32") -> dict:
    """A fresh e-graph of `text` typed `types` (WEIGHTS its weights), `fact_text` loaded,
    saturated with the whole precision family under the pipeline's limits; the report."""
    from apsat.pipeline.precision import PRECISION_LIMITS

    eg = EGraph(target="gpu")
    eg.add(typed_program(text, shapes, types, weights=[w for w in WEIGHTS if w in shapes]))
    library().load_into(eg, ["precision"])
    if fact_text:
        eg.load_text(fact_text, what="setting the precision facts")
    return eg.run(["precision"], **PRECISION_LIMITS)


BOUNDED = [  # program, shapes, the rules that must match on it
    (BLOCK, BLOCK_SHAPES, {"dot", "access", "map", "pair-weight", "cast-cancel"}),
    (CONV_BLOCK, BLOCK_SHAPES, {"dot", "transpose", "pair-weight", "map"}),
    (ATTN, SHAPES, {"attention"}),
]


@pytest.mark.parametrize("text,shapes,expect", BOUNDED, ids=["mlp-block", "conv-block", "attention"])
def test_family_saturates_and_at_most_doubles(text, shapes, expect):
    """The whole family under the fp16 facts saturates (one half mirror per float32 class,
    casts cancelled: the relu between the MLP's products stays f16) and the e-graph at
    most doubles: measured 21 -> 40 e-nodes (mlp-block), 15 -> 29 (conv-block), 12 -> 17
    (attention), the same under the mixed facts."""
    report = saturate_precision(text, shapes, FP16)
    assert report["stop_reason"] == "saturated"
    matched = {r.split("/", 1)[1] for r, n in report["rule_matches"].items() if n and r.startswith("precision/")}
    assert expect <= matched, matched
    assert report["nodes_after"] <= 2 * report["nodes_before"], report


@pytest.mark.parametrize("text,types", [(BLOCK, "f32"), (CONV_BLOCK, "f32"), (ATTN, "f32")]
                         + [(t, "f16") for _, t, _ in VIEWS if "(access-tensor s)" not in t])
def test_family_inert_without_facts(text, types):
    """No precision asked (no half-type, no half-ok): no precision rule matches and the
    e-graph is unchanged, on float32 programs and on widened f16 values alike."""
    shapes = BLOCK_SHAPES if text in (BLOCK, CONV_BLOCK) else SHAPES
    report = saturate_precision(text, shapes, "", types)
    assert not any(n for r, n in report["rule_matches"].items() if r.startswith("precision/"))
    assert report["nodes_after"] == report["nodes_before"]
