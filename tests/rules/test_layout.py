"""The layout family (apsat/rules/layout.egg): every rule sound, reaching its goal, and
refusing where its condition fails; the whole family cancels NCHW <-> NHWC transposes
around element-wise regions and pre-lays-out systolic weights.

Soundness tolerance (the harness's rtol 1e-4 / atol 1e-5, which these rules meet with
room): transposes and accesses move data exactly and the element-wise ops compute the
same float32 values in another order of elements, so results are bit-identical in
practice; the shared tolerance is kept for uniformity with the other families.
"""
import numpy as np
import pytest

import apsat
from apsat.lang.evaluate import evaluate
from harness import (RTOL, ATOL, check_collapses, check_reaches, check_refuses, check_sound, fired, library, members,
                     random_tensors, run_rule, saturate_family)


def at(name, k):
    return f"(access (access-tensor {name}) {k})"


def tr(x, *perm):
    return f"(access-transpose {x} (list {' '.join(map(str, perm))}))"


A1, A2 = at("a", 1), at("a", 2)
X4 = at("x", 4)
NHWC, NCHW = (0, 2, 3, 1), (0, 3, 1, 2)
# a BatchNorm parameter (1, C, 1, 1) broadcast to NCHW (2, 3, 4, 5), all dims iterated
BC = "(access-broadcast (access (access-tensor m) 4) (access-shape (shape 2 3 4 5) (shape)))"
SYS_W = "(access (access-transpose (access (access-tensor w) 1) (list 1 0)) 0)"
SYS_FLAT = "(access (access-transpose (access-flatten (access (access-tensor w) 1)) (list 1 0)) 0)"

# a convolution (windows (3 3 3) strides (1 2 1), squeezed) over {y}, weights {w}
CONV_NCHW = ("(compute dot-product (access-cartesian-product (access-squeeze (access-windows (access {y} 1)"
             " (shape 3 3 3) (shape 1 2 1)) 1) {w}))")
PAD_NCHW = "(access-pad (access-transpose (access-tensor y) (list 0 3 1 2)) zero-padding 2 1 1)"

POOL = "(compute {op} (access-windows (access {y} 2) (shape 2 2) (shape 2 2)))"
# (transpose (transpose x id) p) beside (transpose x id): transpose-compose-4 puts (transpose x p)
# into the first class, so two transposes by p (of x and of (transpose x id)) share it, and
# transpose-injective makes (transpose x id) one class with x (x is 2x3x3x3 so that both
# operands of the pair have one shape)
ID4 = tr(X4, 0, 1, 2, 3)
INJECTIVE = f"(compute elementwise-add (access-pair {tr(ID4, *NHWC)} {ID4}))"

# rule name, program text, tensor shapes, a pattern the root e-class must then hold
REACH = [
    ("layout/transpose-compose-2", tr(tr(A1, 1, 0), 1, 0), {"a": (3, 4)}, tr(A1, 0, 1)),
    ("layout/transpose-compose-3", tr(tr(A1, 1, 2, 0), 1, 2, 0), {"a": (2, 3, 4)}, tr(A1, 2, 0, 1)),
    ("layout/transpose-compose-4", tr(tr(X4, *NHWC), *NCHW), {"x": (2, 3, 4, 5)}, tr(X4, 0, 1, 2, 3)),
    ("layout/transpose-compose-5", tr(tr(at("a", 2), 4, 0, 3, 1, 2), 1, 3, 0, 4, 2), {"a": (2, 3, 4, 5, 6)},
     tr(at("a", 2), 0, 1, 4, 2, 3)),
    ("layout/transpose-identity-2", tr(A1, 0, 1), {"a": (3, 4)}, A1),
    ("layout/transpose-identity-3", tr(A1, 0, 1, 2), {"a": (2, 3, 4)}, A1),
    ("layout/transpose-identity-4", tr(X4, 0, 1, 2, 3), {"x": (2, 3, 4, 5)}, X4),
    ("layout/transpose-identity-5", tr(A1, 0, 1, 2, 3, 4), {"a": (2, 3, 4, 5, 6)}, A1),
    ("layout/transpose-unary-out", f"(compute relu {tr(X4, *NHWC)})", {"x": (2, 3, 4, 5)},
     tr(f"(compute relu {X4})", *NHWC)),
    ("layout/access-through-map", "(access (compute sigmoid (access-tensor a)) 2)", {"a": (2, 3, 4)},
     "(compute sigmoid (access (access-tensor a) 2))"),
    ("layout/transpose-unary-in", tr(f"(compute sigmoid {X4})", *NHWC), {"x": (2, 3, 4, 5)},
     f"(compute sigmoid {tr(X4, *NHWC)})"),
    ("layout/transpose-nary-out",
     f"(compute elementwise-add (access-pair {tr(A1, 2, 0, 1)} {tr(at('b', 1), 2, 0, 1)}))",
     {"a": (2, 3, 4), "b": (2, 3, 4)},
     tr(f"(compute elementwise-add (access-pair {A1} {at('b', 1)}))", 2, 0, 1)),
    ("layout/transpose-nary-in", tr(f"(compute elementwise-mul (access-pair {X4} {at('y', 4)}))", *NHWC),
     {"x": (2, 3, 4, 5), "y": (2, 3, 4, 5)},
     f"(compute elementwise-mul (access-pair {tr(X4, *NHWC)} {tr(at('y', 4), *NHWC)}))"),
    ("layout/transpose-nary-left-4",
     f"(compute elementwise-sub (access-pair {tr(X4, *NCHW)} {BC}))", {"x": (2, 4, 5, 3), "m": (1, 3, 1, 1)},
     tr(f"(compute elementwise-sub (access-pair {X4} {tr(BC, *NHWC)}))", *NCHW)),
    ("layout/transpose-nary-right-4",
     f"(compute elementwise-div (access-pair {BC} {tr(X4, *NCHW)}))", {"x": (2, 4, 5, 3), "m": (1, 3, 1, 1)},
     tr(f"(compute elementwise-div (access-pair {tr(BC, *NHWC)} {X4}))", *NCHW)),
    ("layout/access-access", f"(access {A1} 2)", {"a": (2, 3, 4)}, at("a", 2)),
    ("layout/access-noop", at("a", 0), {"a": (2, 3)}, "(access-tensor a)"),
    ("layout/access-transpose", f"(access {tr('(access-tensor a)', 1, 0)} 1)", {"a": (2, 3)},
     tr(A1, 1, 0)),
    ("layout/pad-through-transpose", PAD_NCHW, {"y": (2, 7, 8, 3)},
     tr("(access-pad (access-tensor y) zero-padding 1 1 1)", *NCHW)),
    ("layout/conv-nhwc", CONV_NCHW.format(y=tr("(access-tensor y)", *NCHW), w=at("w", 1)),
     {"y": (2, 7, 8, 3), "w": (4, 3, 3, 3)},
     "(compute dot-product (access-cartesian-product (access-squeeze (access-windows (access (access-tensor y) 1)"
     " (shape 3 3 3) (shape 2 1 1)) 3) (access-transpose (access (access-tensor w) 1) (list 0 2 3 1))))"),
    ("layout/pool-nhwc", POOL.format(op="reduce-max", y=tr("(access-tensor y)", *NCHW)), {"y": (1, 6, 6, 3)},
     tr("(compute reduce-max (access-windows (access (access-tensor y) 1) (shape 2 2 1) (shape 2 2 1)))", *NCHW)),
    ("layout/concat-through-transpose",
     f"(access-concatenate {tr(X4, *NCHW)} {tr(at('z', 4), *NCHW)} 1)", {"x": (1, 4, 5, 3), "z": (1, 4, 5, 2)},
     tr(f"(access-concatenate {X4} {at('z', 4)} 3)", *NCHW)),
    ("layout/transpose-injective", INJECTIVE, {"x": (2, 3, 3, 3)},
     f"(compute elementwise-add (access-pair ?e {X4}))"),
    ("layout/systolic-weight-tensor", f"(systolic-array 4 5 {at('x', 1)} {SYS_W})", {"x": (3, 4), "w": (5, 4)},
     "(systolic-array 4 5 ?a (access-transpose (access-tensor w) (list 1 0)))"),
    ("layout/systolic-weight-flat", f"(systolic-array 12 5 {at('x', 1)} {SYS_FLAT})",
     {"x": (3, 12), "w": (5, 3, 2, 2)},
     "(systolic-array 12 5 ?a (access-transpose (access-reshape (access-tensor w)"
     " (access-shape (shape) (shape 5 12))) (list 1 0)))"),
]

# rule name, a program where the rule's condition fails, tensor shapes
REFUSE = [
    ("layout/transpose-compose-2", tr(tr(A1, 1, 2, 0), 2, 0, 1), {"a": (2, 3, 4)}),   # rank 3
    ("layout/transpose-compose-3", tr(tr(A1, 1, 0), 1, 0), {"a": (3, 4)}),
    ("layout/transpose-compose-4", tr(tr(A1, 1, 2, 0), 2, 0, 1), {"a": (2, 3, 4)}),
    ("layout/transpose-compose-5", tr(tr(X4, *NHWC), *NCHW), {"x": (2, 3, 4, 5)}),
    ("layout/transpose-identity-2", tr(A1, 1, 0), {"a": (3, 4)}),
    ("layout/transpose-identity-3", tr(A1, 0, 2, 1), {"a": (2, 3, 4)}),
    ("layout/transpose-identity-4", tr(X4, *NHWC), {"x": (2, 3, 4, 5)}),
    ("layout/transpose-identity-5", tr(A1, 0, 1, 2, 4, 3), {"a": (2, 3, 4, 5, 6)}),
    # softmax over a non-empty item: the permutation would move item axes
    ("layout/transpose-unary-out", f"(compute softmax {tr(A1, 0, 2, 1)})", {"a": (2, 3, 4)}),
    ("layout/transpose-unary-in", tr(f"(compute softmax {A1})", 0, 2, 1), {"a": (2, 3, 4)}),
    # softmax is no unary map: it normalises over the item, so the split decides what it reads
    ("layout/access-through-map", "(access (compute softmax (access-tensor a)) 1)", {"a": (2, 3, 4)}),
    # the two operands are transposed differently
    ("layout/transpose-nary-out",
     f"(compute elementwise-add (access-pair {tr(A1, 1, 0, 2)} {tr(at('b', 1), 0, 2, 1)}))",
     {"a": (2, 2, 2), "b": (2, 2, 2)}),
    # dot-product is no element-wise binary op
    ("layout/transpose-nary-out",
     f"(compute dot-product (access-pair {tr(A1, 2, 0, 1)} {tr(at('b', 1), 2, 0, 1)}))",
     {"a": (2, 3, 4), "b": (2, 3, 4)}),
    ("layout/transpose-nary-in", tr(f"(compute dot-product (access-pair {A2} {at('b', 2)}))", 1, 0),
     {"a": (2, 3, 4), "b": (2, 3, 4)}),
    ("layout/transpose-nary-left-4",                                   # rank 3
     f"(compute elementwise-add (access-pair {tr(A1, 2, 0, 1)} {at('b', 1)}))", {"a": (2, 3, 4), "b": (4, 2, 3)}),
    ("layout/transpose-nary-right-4",
     f"(compute elementwise-add (access-pair {at('b', 1)} {tr(A1, 2, 0, 1)}))", {"a": (2, 3, 4), "b": (4, 2, 3)}),
    ("layout/transpose-nary-left-4",                                   # not an element-wise binary op
     f"(compute dot-product (access-pair {tr(X4, *NCHW)} {BC}))", {"x": (2, 4, 5, 3), "m": (1, 3, 1, 1)}),
    ("layout/access-noop", A1, {"a": (2, 3)}),
    # softmax keeps its item: not a reduction, the windows' item order matters
    ("layout/pool-nhwc", POOL.format(op="softmax", y=tr("(access-tensor y)", *NCHW)), {"y": (1, 6, 6, 3)}),
    # the two parts are transposed differently
    ("layout/concat-through-transpose",
     f"(access-concatenate {tr(X4, *NCHW)} {tr(at('z', 4), 0, 1, 3, 2)} 1)", {"x": (1, 4, 5, 3), "z": (1, 2, 5, 4)}),
    # compose-4 puts (transpose x (0 1 2 3)) beside (transpose (transpose x p) p^-1): different permutations
    ("layout/transpose-injective", tr(tr(X4, *NHWC), *NCHW), {"x": (2, 3, 4, 5)}),
    # weights of rank 5 (two iterated axes): the (0 2 3 1) item permutation is for rank 4
    ("layout/conv-nhwc", CONV_NCHW.format(y=tr("(access-tensor y)", *NCHW), w=at("w", 2)),
     {"y": (2, 7, 8, 3), "w": (2, 4, 3, 3, 3)}),
    # the input is not an NHWC tensor transposed to NCHW
    ("layout/conv-nhwc", CONV_NCHW.format(y=tr("(access-tensor y)", 0, 1, 3, 2), w=at("w", 1)),
     {"y": (2, 3, 8, 7), "w": (4, 3, 3, 3)}),
    # weight operand not a (flattened) named tensor
    ("layout/systolic-weight-tensor",
     f"(systolic-array 4 5 {at('x', 1)} (access (access-transpose (access (compute relu (access-tensor w)) 1)"
     " (list 1 0)) 0))", {"x": (3, 4), "w": (5, 4)}),
    ("layout/systolic-weight-flat",
     f"(systolic-array 12 5 {at('x', 1)} (access (access-transpose (access-flatten (access (compute relu"
     " (access-tensor w)) 1)) (list 1 0)) 0))", {"x": (3, 12), "w": (5, 3, 2, 2)}),
]

# Rules whose left side being well-shaped implies the right side is: no condition to refuse.
UNCONDITIONAL = {"layout/access-access", "layout/access-transpose", "layout/pad-through-transpose"}
# Rules that union a term with one of its own sub-terms: the root e-class then has one
# acyclic member (the sub-term), which check_sound cannot sample as a second member.
COLLAPSING = {f"layout/transpose-identity-{n}" for n in range(2, 6)} | {"layout/access-noop"}


# Rules that need another rule to build what they match: helpers run beside them.
HELPERS = {"layout/transpose-injective": ["layout/transpose-compose-4"]}


def test_tables_cover_every_layout_rule():
    rules = {name for name in library().rules if name.startswith("layout/")}
    assert rules == {r[0] for r in REACH}
    assert rules == {r[0] for r in REFUSE} | UNCONDITIONAL


@pytest.mark.parametrize("rule, text, shapes, pattern", REACH, ids=[r[0] for r in REACH])
def test_sound(rule, text, shapes, pattern):
    if rule in COLLAPSING:
        check_collapses(rule, text, shapes, pattern)   # pattern: the sub-term it collapsed to
    elif rule == "layout/transpose-injective":
        _check_injective_sound(text, shapes)
    else:
        check_sound(rule, text, shapes, helpers=HELPERS.get(rule, ()))


def _check_injective_sound(text, shapes):
    """transpose-injective merges child classes, not the root: the merged class of
    (transpose x id) now holds x, its one acyclic member ((transpose x id) refers to its
    own class), which must equal (transpose x id) on random data."""
    eg, _, report = run_rule("layout/transpose-injective", text, shapes, helpers=HELPERS["layout/transpose-injective"])
    assert fired(report, "layout/transpose-injective")
    merged = eg.add(apsat.parse(ID4, shapes))
    assert eg.matches(X4, merged)
    tensors = random_tensors(shapes, seed=0)
    want = evaluate(apsat.parse(ID4, shapes), tensors)
    progs = members(eg, merged, 20)
    assert [p.to_text() for p in progs] == [X4]
    for prog in progs:
        np.testing.assert_allclose(evaluate(prog, tensors), want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("rule, text, shapes, pattern", REACH, ids=[r[0] for r in REACH])
def test_reaches(rule, text, shapes, pattern):
    check_reaches(rule, text, shapes, pattern, helpers=HELPERS.get(rule, ()))


@pytest.mark.parametrize("rule, text, shapes", REFUSE, ids=[r[0] for r in REFUSE])
def test_refuses(rule, text, shapes):
    if rule in HELPERS:          # the helpers change the e-graph: only the rule must not fire
        _, _, report = run_rule(rule, text, shapes, helpers=HELPERS[rule])
        assert not fired(report, rule)
    else:
        check_refuses(rule, text, shapes)


# ---- the whole family --------------------------------------------------------------------------

def _saturate(text, shapes, **limits):
    return saturate_family("layout", text, shapes, **limits)


def _all_members_equal(eg, root, text, shapes):
    tensors = random_tensors(shapes, seed=3)
    want = evaluate(apsat.parse(text, shapes), tensors)
    progs = members(eg, root, 20)
    for prog in progs:
        np.testing.assert_allclose(evaluate(prog, tensors), want, rtol=RTOL, atol=ATOL)
    return progs


def test_nhwc_region_cancels():
    """NCHW -> NHWC, relu, a residual add with another NHWC tensor, sigmoid, back to NCHW:
    the transposes move to the region's boundary and cancel, leaving the NCHW region."""
    shapes = {"x": (2, 3, 4, 5), "y": (2, 3, 4, 5)}
    nhwc = f"(compute relu {tr(X4, *NHWC)})"
    add = f"(compute elementwise-add (access-pair {nhwc} {tr(at('y', 4), *NHWC)}))"
    text = tr(f"(compute sigmoid {add})", *NCHW)
    eg, root, report = _saturate(text, shapes)
    assert report["stop_reason"] == "saturated"
    assert eg.matches(f"(compute sigmoid (compute elementwise-add (access-pair (compute relu {X4}) {at('y', 4)})))",
                      root)
    best = apsat.extract(eg, root)
    assert "access-transpose" not in best.to_text()
    _all_members_equal(eg, root, text, shapes)


def test_systolic_weight_prelayout_through_general_rules():
    """A matmul's weight operand (access (transpose (access w 1) (1 0)) 0) also becomes the
    pre-transposed tensor through the general access rules."""
    text = f"(systolic-array 4 5 {at('x', 1)} {SYS_W})"
    shapes = {"x": (3, 4), "w": (5, 4)}
    eg, root, report = _saturate(text, shapes)
    assert eg.matches("(systolic-array 4 5 ?a (access-transpose (access-tensor w) (list 1 0)))", root)
    weight = eg.add(apsat.parse(SYS_W, shapes))
    assert eg.matches("(access-transpose (access-tensor w) (list 1 0))", weight)
    _all_members_equal(eg, root, text, shapes)


def test_convolution_chain_keeps_its_activations_nhwc():
    """conv -> relu -> padded conv, as the importer writes it (each conv's NHWC result
    transposed back to NCHW): the second conv reads the first one's NHWC result, and the
    extracted program keeps only the output's transpose."""
    shapes = {"x": (1, 3, 10, 10), "w1": (4, 3, 3, 3), "w2": (5, 4, 3, 3)}

    def conv(x, w):
        win = f"(access-squeeze (access-windows (access {x} 1) (shape {shapes[w][1]} 3 3) (shape 1 1 1)) 1)"
        return tr(f"(compute dot-product (access-cartesian-product {win} {at(w, 1)}))", *NCHW)

    first = f"(compute relu {conv('(access-tensor x)', 'w1')})"
    padded = f"(access-pad (access-pad {first} zero-padding 2 1 1) zero-padding 3 1 1)"
    text = conv(padded, "w2")
    eg, root, report = _saturate(text, shapes)
    assert report["stop_reason"] == "saturated"
    best = apsat.extract(eg, root, cost="gpu")
    assert best.to_text().count("(list 0 3 1 2)") == 1
    assert "(shape 3 3 4)" in best.to_text()            # the second conv's NHWC windows
    _all_members_equal(eg, root, text, shapes)
