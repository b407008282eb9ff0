"""The im2col family (apsat/rules/im2col.egg): soundness, reach and refusal of every rule,
and the family as a whole turning convolutions into matrix multiplies.

Soundness compares the original program (or sub-program) with up to 20 extractable members
of its e-class under the reference interpreter on seeded random inputs, at rtol 1e-4 /
atol 1e-5 (harness.RTOL/ATOL): the rewrites only move and reinterpret elements, but the
interpreter computes a dot-product over a reshaped or flattened access as a matmul of a
different layout, which sums the float32 products in another order (a few ulps each).

The exploratory and cartesian-product rules read shape lists that the family's `aux` rules
build, so those three rules run with the aux rules beside them in their one-rule ruleset
(the harness's `helpers=AUX`); only the named rule's matches count as "fired".
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import apsat
from apsat.lang.evaluate import evaluate
from apsat.explore.egraph import EGraph
from apsat.lang.program import Program
from apsat.errors import EGraphError, RuleError
from apsat.extract.decode import decode, language_graph
from apsat.extract.tree import extract_tree
from harness import (ATOL, RTOL, check_reaches, check_refuses, check_sound, fired, helper_rules, library,
                     members, random_tensors, run_rule)

AUX = ["im2col/aux-want-cartesian", "im2col/aux-iter-dims-start", "im2col/aux-iter-dims-step",
       "im2col/aux-item-dims-start", "im2col/aux-item-dims-step"]
# The aux rules build a list one dim per iteration before the rule they serve can match.
WITH_AUX = {"helpers": AUX, "iter_limit": 20}

# A small conv2d, Glenside's way: w (4, 2, 3, 3) over x (2, 6, 6), stride 1 -> ((4, 4, 4), ()).
W = "(access (access-tensor w) 1)"                                                  # ((4), (2, 3, 3))
X = "(access-squeeze (access-windows (access (access-tensor x) 0) (shape 2 3 3) (shape 1 1 1)) 0)"  # ((4, 4), (2, 3, 3))
CONV = f"(compute dot-product (access-cartesian-product {W} {X}))"
CONV_SHAPES = {"w": (4, 2, 3, 3), "x": (2, 6, 6)}
# A matmul: both operands already flat, nothing to discover.
MATMUL = "(compute dot-product (access-cartesian-product (access (access-tensor a) 1) (access (access-tensor b) 1)))"
MATMUL_SHAPES = {"a": (6, 8), "b": (5, 8)}


# ---- one rule plus the aux rules ------------------------------------------------------------

def test_aux_list_is_the_familys_helper_rules():
    assert helper_rules("im2col") == sorted(AUX)
    with pytest.raises(RuleError, match="im2col/aux-nope"):
        run_rule("im2col/explore-left", CONV, CONV_SHAPES, helpers=["im2col/aux-nope"])


def handle_of(eg, text, shapes):
    """The handle of a sub-program added with an earlier program."""
    return eg.handle_of(apsat.parse(text, shapes).outputs["out"])


def members_unrolled(eg, handle, samples=20) -> list[Program]:
    """Like harness.members (one program per node of the e-class, the rest by tree
    extraction), but a member that reaches its own e-class again, as the exploratory
    rewrite's a -> (access-reshape (access-flatten a) ..) does, is unrolled once: below its
    top node the class is the tree-extracted program, so that member is compared too
    (harness.members skips it as cyclic)."""
    graph = language_graph(eg.serialize())
    cls = eg.class_of(handle)
    base = extract_tree(graph, [cls])
    out = []
    for node in sorted(graph.classes[cls])[:samples]:
        if any(k not in base for k in graph.node_classes[node]):
            continue  # a child class with no finite program
        top = dataclasses.replace(graph, classes={**graph.classes, "#top": [node]})
        term = decode(top, {**base, "#top": node}, ["#top"])["#top"]
        out.append(Program({"out": term}, dict(eg.tensor_shapes)))
    return out


def sound_with_aux(rule_name, text, shapes, sub=None, seed=0, samples=20, **limits) -> int:
    """check_sound for a rule that needs the aux rules; `sub` (surface text of a sub-term
    of `text`) names the e-class to compare when the rule grows an operand's class."""
    eg, root, report = run_rule(rule_name, text, shapes, **{**WITH_AUX, **limits})
    assert fired(report, rule_name), f"{rule_name} did not fire on {text}"
    handle = handle_of(eg, sub, shapes) if sub else root
    tensors = random_tensors(shapes, seed)
    want = evaluate(apsat.parse(sub or text, shapes), tensors)
    progs = members_unrolled(eg, handle, samples)
    assert len(progs) >= 2, f"{rule_name}: the e-class has no second member to compare"
    for prog in progs:
        np.testing.assert_allclose(evaluate(prog, tensors), want, rtol=RTOL, atol=ATOL,
                                   err_msg=f"{rule_name} unsound: {prog.to_text()[:300]}")
    return len(progs)


def reaches_with_aux(rule_name, text, shapes, pattern):
    return check_reaches(rule_name, text, shapes, pattern, **WITH_AUX)


def refuses_with_aux(rule_name, text, shapes):
    check_refuses(rule_name, text, shapes, **WITH_AUX)


# ---- aux: shape lists -------------------------------------------------------------------------

def _holds(eg, fact: str) -> bool:
    try:
        eg.load_text(f"(check {fact})")
        return True
    except EGraphError:
        return False


def _ilist(dims) -> str:
    out = "(inil)"
    for d in reversed(dims):
        out = f"(icons {d} {out})"
    return out


def test_aux_rules_build_shape_lists_and_add_no_terms():
    # every aux rule, alone with the others, on the conv: lists for the product and both
    # operands, iterated and item dims, and not one Expr node more
    for name in AUX:
        eg, root, report = run_rule(name, CONV, CONV_SHAPES, **WITH_AUX)
        assert fired(report, name), name
        assert report["nodes_after"] == report["nodes_before"], name
    cart = f"(access-cartesian-product {W} {X})"
    for text, it, item in [(W, (4,), (2, 3, 3)), (X, (4, 4), (2, 3, 3)), (cart, (4, 4, 4), (2, 2, 3, 3))]:
        h = handle_of(eg, text, CONV_SHAPES)
        assert _holds(eg, f"(im2col-iter-dims {h} 0 {_ilist(it)})"), text
        assert _holds(eg, f"(im2col-item-dims {h} {len(it)} {_ilist(item)})"), text
        assert not _holds(eg, f"(im2col-iter-dims {h} 0 {_ilist(it[::-1] + (7,))})")
    # nothing is wanted outside cartesian products
    assert not _holds(eg, f"(im2col-want {root})")


# ---- exploration --------------------------------------------------------------------------

def test_explore_left_sound():
    assert sound_with_aux("im2col/explore-left", CONV, CONV_SHAPES, sub=W) >= 2


def test_explore_left_reaches():
    reaches_with_aux("im2col/explore-left", f"(access-cartesian-product {W} {X})", CONV_SHAPES,
                     "(access-cartesian-product (access-reshape (access-flatten ?w) "
                     "(access-shape (shape 4) (shape 2 3 3))) ?x)")


def test_explore_left_refuses_flat_operand():
    # the left operand ((6), (8)) is already flat: flattening it again would repeat forever
    refuses_with_aux("im2col/explore-left", MATMUL, MATMUL_SHAPES)


def test_explore_right_sound():
    assert sound_with_aux("im2col/explore-right", CONV, CONV_SHAPES, sub=X) >= 2


def test_explore_right_reaches():
    reaches_with_aux("im2col/explore-right", f"(access-cartesian-product {W} {X})", CONV_SHAPES,
                     "(access-cartesian-product ?w (access-reshape (access-flatten ?x) "
                     "(access-shape (shape 4 4) (shape 2 3 3))))")


def test_explore_right_refuses_flat_operand():
    refuses_with_aux("im2col/explore-right", MATMUL, MATMUL_SHAPES)


def test_explore_covers_unflat_splits():
    # ((), (k)) and ((1, n), (k)) are not flat either: split 0 and split 2 operands
    text = ("(compute dot-product (access-cartesian-product (access (access-tensor a) 0) "
            "(access (access-tensor b) 2)))")
    shapes = {"a": (8,), "b": (1, 5, 8)}
    assert sound_with_aux("im2col/explore-left", text, shapes, sub="(access (access-tensor a) 0)") >= 2
    assert sound_with_aux("im2col/explore-right", text, shapes, sub="(access (access-tensor b) 2)") >= 2


# ---- bubbling through the cartesian product ---------------------------------------------------

# reshapes of flat a ((6), (8)) and b ((5), (8)) that keep the iterated counts
BUBBLE_CART = ("(access-cartesian-product "
               "(access-reshape (access (access-tensor a) 1) (access-shape (shape 2 3) (shape 2 4))) "
               "(access-reshape (access (access-tensor b) 1) (access-shape (shape 5) (shape 2 4))))")


def test_bubble_reshape_cartesian_product_sound():
    assert sound_with_aux("im2col/bubble-reshape-cartesian-product", BUBBLE_CART, MATMUL_SHAPES) >= 2
    # under a dot-product too (the form the conv produces)
    dot = f"(compute dot-product {BUBBLE_CART})"
    assert sound_with_aux("im2col/bubble-reshape-cartesian-product", dot, MATMUL_SHAPES,
                          sub=BUBBLE_CART) >= 2


def test_bubble_reshape_cartesian_product_reaches():
    reaches_with_aux("im2col/bubble-reshape-cartesian-product", BUBBLE_CART, MATMUL_SHAPES,
                     "(access-reshape (access-cartesian-product (access (access-tensor a) 1) "
                     "(access (access-tensor b) 1)) (access-shape (shape 2 3 5) (shape 2 2 4)))")


def test_bubble_reshape_cartesian_product_refuses_reshape_across_the_split():
    # a ((6), (8)) reshaped to ((12), (4)): the iterated count changes, so the reshape mixes
    # items with iterations and cannot move above the product
    text = ("(access-cartesian-product "
            "(access-reshape (access (access-tensor a) 1) (access-shape (shape 12) (shape 4))) "
            "(access-reshape (access (access-tensor b) 1) (access-shape (shape 10) (shape 4))))")
    refuses_with_aux("im2col/bubble-reshape-cartesian-product", text, MATMUL_SHAPES)


def test_bubble_reshape_cartesian_product_refuses_unflat_operand():
    # the reshaped access ((2), (3, 8)) is not flat
    text = ("(access-cartesian-product "
            "(access-reshape (access (access-tensor a) 1) (access-shape (shape 6) (shape 8))) "
            "(access (access-tensor b) 1))")
    refuses_with_aux("im2col/bubble-reshape-cartesian-product", text, {"a": (2, 3, 8), "b": (5, 8)})


# ---- bubbling through dot-product (needs no aux rule: the harness runs it alone) -------------

BUBBLE_DOT = ("(compute dot-product (access-reshape (access-cartesian-product (access (access-tensor a) 1) "
              "(access (access-tensor b) 1)) (access-shape (shape 2 3 5) (shape 2 2 4))))")


def test_bubble_reshape_dot_product_sound():
    assert check_sound("im2col/bubble-reshape-dot-product", BUBBLE_DOT, MATMUL_SHAPES) >= 2


def test_bubble_reshape_dot_product_reaches():
    check_reaches("im2col/bubble-reshape-dot-product", BUBBLE_DOT, MATMUL_SHAPES,
                  "(access-reshape (compute dot-product (access-cartesian-product ?a ?b)) "
                  "(access-shape (shape 2 3 5) (shape)))")


def test_bubble_reshape_dot_product_refuses_reshape_across_the_split():
    # ((6, 5), (2, 8)) reshaped to ((60), (2, 4)): items are cut in half, the pairs move
    text = ("(compute dot-product (access-reshape (access-cartesian-product (access (access-tensor a) 1) "
            "(access (access-tensor b) 1)) (access-shape (shape 60) (shape 2 4))))")
    check_refuses("im2col/bubble-reshape-dot-product", text, MATMUL_SHAPES)


def test_bubble_reshape_dot_product_refuses_when_pairs_are_not_leading():
    # ((6, 5), (2, 8)) reshaped to ((30), (2, 8)) is fine, but to ((30), (4, 4)) the item's
    # leading axis is no longer the pair axis (the pattern asks for a leading 2)
    text = ("(compute dot-product (access-reshape (access-cartesian-product (access (access-tensor a) 1) "
            "(access (access-tensor b) 1)) (access-shape (shape 30) (shape 4 4))))")
    check_refuses("im2col/bubble-reshape-dot-product", text, MATMUL_SHAPES)


# ---- reshape of an access ---------------------------------------------------------------------

RESHAPE_OF_ACCESS = "(access-reshape (access (access-tensor a) 1) (access-shape (shape 4 2) (shape 6)))"


def test_reshape_of_access_sound():
    assert check_sound("im2col/reshape-of-access", RESHAPE_OF_ACCESS, MATMUL_SHAPES) >= 2


def test_reshape_of_access_reaches():
    check_reaches("im2col/reshape-of-access", RESHAPE_OF_ACCESS, MATMUL_SHAPES,
                  "(access-reshape (access-tensor a) (access-shape (shape 4 2) (shape 6)))")


# ---- the family: convolutions become matrix multiplies ---------------------------------------

FLAT_MATMUL = "(access-reshape (compute dot-product (access-cartesian-product (access-flatten ?w) (access-flatten ?x))) ?s)"

CONVS = {
    "3x3": (CONV, CONV_SHAPES),
    # stride 2 and a non-square window over a 3-channel 7x9 input
    "strided": ("(compute dot-product (access-cartesian-product (access (access-tensor w) 1) "
                "(access-squeeze (access-windows (access (access-tensor x) 0) (shape 3 3 2) (shape 1 2 2)) 0)))",
                {"w": (5, 3, 3, 2), "x": (3, 7, 9)}),
    # the importer's form: a batch axis, windows then the product with the weights second
    "batched": ("(compute dot-product (access-cartesian-product "
                "(access-squeeze (access-windows (access (access-tensor x) 1) (shape 2 3 3) (shape 1 1 1)) 1) "
                "(access (access-tensor w) 1)))", {"w": (4, 2, 3, 3), "x": (1, 2, 5, 5)}),
    # 1x1 convolution
    "1x1": ("(compute dot-product (access-cartesian-product (access (access-tensor w) 1) "
            "(access-squeeze (access-windows (access (access-tensor x) 0) (shape 3 1 1) (shape 1 1 1)) 0)))",
            {"w": (6, 3, 1, 1), "x": (3, 4, 4)}),
}


@pytest.mark.parametrize("name", sorted(CONVS))
def test_family_discovers_im2col(name):
    text, shapes = CONVS[name]
    eg = EGraph()
    root = eg.add(apsat.parse(text, shapes))
    library().load_into(eg, ["im2col"])
    report = eg.run(["im2col"], iter_limit=60)
    assert report["stop_reason"] == "saturated"          # bounded: the family saturates
    assert report["nodes_after"] < 40
    assert eg.matches(FLAT_MATMUL, root)
    tensors = random_tensors(shapes, seed=3)
    want = evaluate(apsat.parse(text, shapes), tensors)
    progs = members(eg, root)
    assert len(progs) >= 2
    for prog in progs:
        np.testing.assert_allclose(evaluate(prog, tensors), want, rtol=RTOL, atol=ATOL)


def test_family_leaves_a_matmul_alone():
    eg = EGraph()
    eg.add(apsat.parse(MATMUL, MATMUL_SHAPES))
    library().load_into(eg, ["im2col"])
    report = eg.run(["im2col"])
    assert report["nodes_after"] == report["nodes_before"]
    for name in ("im2col/explore-left", "im2col/explore-right", "im2col/bubble-reshape-cartesian-product"):
        assert not fired(report, name)
