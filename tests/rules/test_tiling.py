"""The tiling family (apsat/rules/tiling.egg): every rule sound, reaching its goal, and
refusing where its condition fails; the whole family tiles a 32x32 access into 8x8 tiles.

Soundness tolerance (the harness's rtol 1e-4 / atol 1e-5): slices, concatenates, pads and
transposes move data exactly, but splitting a dot-product over its item axis adds the
partial sums in another order, which in float32 moves results by a few ulps.
"""
import numpy as np
import pytest

import apsat
from apsat.lang.evaluate import evaluate
from harness import (RTOL, ATOL, check_collapses, check_reaches, check_refuses, check_sound, library, members, random_tensors, saturate_family)

A = "(access (access-tensor a) 1)"
B = "(access (access-tensor b) 1)"
C = "(access (access-tensor c) 1)"
T = "(access (access-tensor t) 1)"


def cp(x, y):
    return f"(access-cartesian-product {x} {y})"


def dot(x):
    return f"(compute dot-product {x})"


# rule name, program text, tensor shapes, a pattern the root e-class must then hold
REACH = [
    ("tiling/halve-access", T, {"t": (16, 8)},
     "(access-concatenate (access (access-slice (access-tensor t) 0 0 8) 1)"
     " (access (access-slice (access-tensor t) 0 8 16) 1) 0)"),
    ("tiling/segment-access", T, {"t": (24, 4)},
     "(access-concatenate (access (access-slice (access-tensor t) 0 0 8) 1)"
     " (access (access-slice (access-tensor t) 0 8 24) 1) 0)"),
    ("tiling/pad-access", T, {"t": (27, 4)},
     "(access-slice (access (access-pad (access-tensor t) zero-padding 0 0 5) 1) 0 0 27)"),
    ("tiling/pad-through-access", "(access (access-pad (access-tensor t) zero-padding 0 0 5) 1)", {"t": (27, 4)},
     f"(access-pad {T} zero-padding 0 0 5)"),
    ("tiling/slice-of-slice", f"(access-slice (access-slice {T} 0 4 12) 0 2 6)", {"t": (16, 4)},
     f"(access-slice {T} 0 6 10)"),
    ("tiling/slice-commute", f"(access-slice (access-slice {T} 1 0 2) 0 4 12)", {"t": (16, 4)},
     f"(access-slice (access-slice {T} 0 4 12) 1 0 2)"),
    ("tiling/slice-whole", f"(access-slice {T} 0 0 16)", {"t": (16, 4)}, T),
    ("tiling/slice-of-concat-left", f"(access-slice (access-concatenate {A} {B} 0) 0 1 3)",
     {"a": (4, 3), "b": (5, 3)}, f"(access-slice {A} 0 1 3)"),
    ("tiling/slice-of-concat-right", f"(access-slice (access-concatenate {A} {B} 0) 0 5 8)",
     {"a": (4, 3), "b": (5, 3)}, f"(access-slice {B} 0 1 4)"),
    ("tiling/slice-of-pad", f"(access-slice (access-pad {T} zero-padding 0 2 3) 0 3 5)", {"t": (4, 3)},
     f"(access-slice {T} 0 1 3)"),
    ("tiling/concat-cartesian-left", cp(f"(access-concatenate {A} {B} 0)", C),
     {"a": (2, 3), "b": (4, 3), "c": (5, 3)},
     f"(access-concatenate {cp(A, C)} {cp(B, C)} 0)"),
    ("tiling/concat-cartesian-right", cp(A, f"(access-concatenate {B} {C} 0)"),
     {"a": (2, 3), "b": (4, 3), "c": (5, 3)},
     f"(access-concatenate {cp(A, B)} {cp(A, C)} 1)"),
    ("tiling/concat-compute", f"(compute relu (access-concatenate {A} {B} 0))", {"a": (2, 3), "b": (4, 3)},
     f"(access-concatenate (compute relu {A}) (compute relu {B}) 0)"),
    ("tiling/dot-concat-item",
     dot(cp(f"(access-concatenate {A} (access (access-tensor a1) 1) 1)",
            f"(access-concatenate {B} (access (access-tensor b1) 1) 1)")),
     {"a": (2, 3), "a1": (2, 5), "b": (4, 3), "b1": (4, 5)},
     f"(compute elementwise-add (access-pair {dot(cp(A, B))}"
     f" {dot(cp('(access (access-tensor a1) 1)', '(access (access-tensor b1) 1)'))}))"),
    ("tiling/dot-concat-item-left",
     dot(cp(f"(access-concatenate {A} (access (access-tensor a1) 1) 1)", C)),
     {"a": (2, 3), "a1": (2, 5), "c": (4, 8)},
     f"(compute elementwise-add (access-pair {dot(cp(A, f'(access-slice {C} 1 0 3)'))}"
     f" {dot(cp('(access (access-tensor a1) 1)', f'(access-slice {C} 1 3 8)'))}))"),
    ("tiling/dot-concat-item-right",
     dot(cp(C, f"(access-concatenate {B} (access (access-tensor b1) 1) 1)")),
     {"b": (2, 3), "b1": (2, 5), "c": (4, 8)},
     f"(compute elementwise-add (access-pair {dot(cp(f'(access-slice {C} 1 0 3)', B))}"
     f" {dot(cp(f'(access-slice {C} 1 3 8)', '(access (access-tensor b1) 1)'))}))"),
    ("tiling/dot-pad-item",
     dot(cp(f"(access-slice (access-pad {A} zero-padding 1 0 5) 1 0 27)",
            f"(access-slice (access-pad {B} zero-padding 1 0 5) 1 0 27)")),
     {"a": (2, 27), "b": (3, 27)},
     dot(cp(f"(access-pad {A} zero-padding 1 0 5)", f"(access-pad {B} zero-padding 1 0 5)"))),
    ("tiling/slice-cartesian-left", f"(access-slice {cp(A, B)} 0 1 3)", {"a": (4, 3), "b": (5, 3)},
     cp(f"(access-slice {A} 0 1 3)", B)),
    ("tiling/slice-cartesian-right", f"(access-slice {cp(A, B)} 1 1 4)", {"a": (4, 3), "b": (5, 3)},
     cp(A, f"(access-slice {B} 0 1 4)")),
    ("tiling/slice-compute", f"(access-slice (compute relu {A}) 0 1 3)", {"a": (4, 3)},
     f"(compute relu (access-slice {A} 0 1 3))"),
    ("tiling/unslice-cartesian-left", cp(f"(access-slice {A} 0 1 3)", B), {"a": (4, 3), "b": (5, 3)},
     f"(access-slice {cp(A, B)} 0 1 3)"),
    ("tiling/unslice-cartesian-right", cp(A, f"(access-slice {B} 0 1 4)"), {"a": (4, 3), "b": (5, 3)},
     f"(access-slice {cp(A, B)} 1 1 4)"),
    ("tiling/unslice-compute", f"(compute relu (access-slice {A} 0 1 3))", {"a": (4, 3)},
     f"(access-slice (compute relu {A}) 0 1 3)"),
]

# rule name, a program where the rule's condition fails, tensor shapes
REFUSE = [
    ("tiling/halve-access", T, {"t": (8, 12)}),                       # 8 is the limit, 12 no power of two
    ("tiling/segment-access", T, {"t": (16, 8)}),                     # powers of two are halved instead
    ("tiling/segment-access", T, {"t": (20, 4)}),                     # not a multiple of 8
    ("tiling/pad-access", T, {"t": (24, 8)}),                         # already multiples of 8
    ("tiling/pad-access", T, {"t": (7, 5)}),                          # no dim above the limit
    ("tiling/slice-commute", f"(access-slice (access-slice {T} 0 4 12) 1 0 2)", {"t": (16, 4)}),
    ("tiling/slice-whole", f"(access-slice {T} 0 0 8)", {"t": (16, 4)}),
    ("tiling/slice-of-concat-left", f"(access-slice (access-concatenate {A} {B} 0) 0 2 6)",
     {"a": (4, 3), "b": (5, 3)}),                                     # straddles the seam
    ("tiling/slice-of-concat-right", f"(access-slice (access-concatenate {A} {B} 0) 0 2 6)",
     {"a": (4, 3), "b": (5, 3)}),
    ("tiling/slice-of-pad", f"(access-slice (access-pad {T} zero-padding 0 2 3) 0 1 5)", {"t": (4, 3)}),
    ("tiling/concat-cartesian-left", cp(f"(access-concatenate {A} {B} 1)", C),
     {"a": (2, 3), "b": (2, 4), "c": (5, 7)}),                        # item axis: not a block of rows
    ("tiling/concat-cartesian-right", cp(C, f"(access-concatenate {A} {B} 1)"),
     {"a": (2, 3), "b": (2, 4), "c": (5, 7)}),
    ("tiling/concat-compute", f"(compute relu (access-concatenate {A} {B} 1))", {"a": (2, 3), "b": (2, 4)}),
    ("tiling/dot-concat-item",                                        # split at different offsets
     dot(cp(f"(access-concatenate {A} (access (access-tensor a1) 1) 1)",
            f"(access-concatenate {B} (access (access-tensor b1) 1) 1)")),
     {"a": (2, 3), "a1": (2, 5), "b": (4, 5), "b1": (4, 3)}),
    ("tiling/dot-concat-item-left",                                   # concatenated on an iterated axis
     dot(cp(f"(access-concatenate {A} (access (access-tensor a1) 1) 0)", C)),
     {"a": (2, 3), "a1": (5, 3), "c": (4, 3)}),
    ("tiling/dot-concat-item-right",
     dot(cp(C, f"(access-concatenate {B} (access (access-tensor b1) 1) 0)")),
     {"b": (2, 3), "b1": (5, 3), "c": (4, 3)}),
    ("tiling/dot-pad-item",                                           # min-padding is not zero
     dot(cp(f"(access-slice (access-pad {A} min-padding 1 0 5) 1 0 27)",
            f"(access-slice (access-pad {B} min-padding 1 0 5) 1 0 27)")),
     {"a": (2, 27), "b": (3, 27)}),
    ("tiling/dot-pad-item",                                           # the slices cut real data
     dot(cp(f"(access-slice (access-pad {A} zero-padding 1 0 5) 1 0 20)",
            f"(access-slice (access-pad {B} zero-padding 1 0 5) 1 0 20)")),
     {"a": (2, 27), "b": (3, 27)}),
    ("tiling/slice-cartesian-left", f"(access-slice {cp(A, B)} 3 0 2)", {"a": (4, 3), "b": (5, 3)}),
    ("tiling/slice-cartesian-right", f"(access-slice {cp(A, B)} 3 0 2)", {"a": (4, 3), "b": (5, 3)}),
    ("tiling/slice-compute", f"(access-slice (compute relu {A}) 1 0 2)", {"a": (4, 3)}),
    ("tiling/unslice-cartesian-left", cp(f"(access-slice {A} 1 0 3)", B), {"a": (4, 5), "b": (5, 3)}),
    ("tiling/unslice-cartesian-right", cp(B, f"(access-slice {A} 1 0 3)"), {"a": (4, 5), "b": (5, 3)}),
    ("tiling/unslice-compute", f"(compute relu (access-slice {A} 1 0 2))", {"a": (4, 3)}),
]

# Rules whose left side being well-shaped implies the right side is: no condition to refuse.
UNCONDITIONAL = {"tiling/slice-of-slice", "tiling/pad-through-access"}


def test_tables_cover_every_tiling_rule():
    rules = {name for name in library().rules if name.startswith("tiling/")}
    assert rules == {r[0] for r in REACH}
    assert rules == {r[0] for r in REFUSE} | UNCONDITIONAL


# Rules that union a term with one of its own sub-terms: the root e-class then has one
# acyclic member (the sub-term) besides the original, which check_sound cannot sample.
COLLAPSING = {"tiling/slice-whole"}


@pytest.mark.parametrize("rule, text, shapes, pattern", REACH, ids=[r[0] for r in REACH])
def test_sound(rule, text, shapes, pattern):
    if rule in COLLAPSING:
        check_collapses(rule, text, shapes, pattern)   # pattern: the sub-term it collapsed to
    else:
        check_sound(rule, text, shapes)


@pytest.mark.parametrize("rule, text, shapes, pattern", REACH, ids=[r[0] for r in REACH])
def test_reaches(rule, text, shapes, pattern):
    check_reaches(rule, text, shapes, pattern)


@pytest.mark.parametrize("rule, text, shapes", REFUSE, ids=[r[0] for r in REFUSE])
def test_refuses(rule, text, shapes):
    check_refuses(rule, text, shapes)


# ---- the whole family --------------------------------------------------------------------------

def _saturate(text, shapes, **limits):
    return saturate_family("tiling", text, shapes, **limits)


def _tile(i, j, s=8):
    """Tile (i, j) of (access t 1): both slices on the tensor, axis 0 innermost, re-accessed."""
    return (f"(access (access-slice (access-slice (access-tensor t) 0 {s * i} {s * i + s})"
            f" 1 {s * j} {s * j + s}) 1)")


def _tree(parts, axis):
    """Balanced concatenate tree of `parts` along `axis` (what halving builds)."""
    while len(parts) > 1:
        parts = [f"(access-concatenate {parts[k]} {parts[k + 1]} {axis})" for k in range(0, len(parts), 2)]
    return parts[0]


def test_acceptance_32x32_tiled_into_16_tiles_of_8x8():
    """(access t 1), t 32x32, under the whole family: the root e-class holds the halving
    tree of all 16 tiles (rows on axis 0, then each row band on axis 1), each tile being
    (access (access-slice (access-slice (access-tensor t) 0 8i 8i+8) 1 8j 8j+8) 1); the
    family saturates, small, and every extractable member equals t."""
    shapes = {"t": (32, 32)}
    eg, root, report = _saturate(T, shapes)
    assert report["stop_reason"] == "saturated"
    rows = [_tree([_tile(i, j) for j in range(4)], 1) for i in range(4)]
    assert eg.matches(_tree(rows, 0), root)
    assert eg.size()[0] < 2000
    tensors = random_tensors(shapes)
    progs = members(eg, root, 20)
    assert len(progs) >= 3
    for prog in progs:
        np.testing.assert_array_equal(evaluate(prog, tensors), tensors["t"])


def test_family_tiles_a_matmul_soundly():
    """A 16x16 by 16x16 matmul under the whole family: the root holds a row-block form and
    a split reduction, and up to 20 sampled members all equal the matmul."""
    text = dot(cp(A, B))
    shapes = {"a": (16, 16), "b": (16, 16)}
    eg, root, report = _saturate(text, shapes, iter_limit=12, node_limit=20_000)
    assert report["rule_matches"].get("tiling/dot-concat-item", 0) > 0
    top = dot(cp("(access (access-slice (access-tensor a) 0 0 8) 1)", B))
    assert eg.matches(f"(access-concatenate {top} ?rest 0)", root)
    assert eg.matches("(compute elementwise-add (access-pair ?lo ?hi))", root)
    tensors = random_tensors(shapes, seed=1)
    want = evaluate(apsat.parse(text, shapes), tensors)
    progs = members(eg, root, 20)
    assert len(progs) >= 3
    for prog in progs:
        np.testing.assert_allclose(evaluate(prog, tensors), want, rtol=RTOL, atol=ATOL)


def test_family_pads_a_ragged_reduction():
    """K = 27: both operands get zero-padded to 32 and the padded product is in the root."""
    text = dot(cp(A, B))
    shapes = {"a": (4, 27), "b": (5, 27)}
    eg, root, report = _saturate(text, shapes, iter_limit=10, node_limit=20_000)
    assert report["rule_matches"].get("tiling/dot-pad-item", 0) > 0
    assert eg.matches(dot(cp(f"(access-pad {A} zero-padding 1 0 5)", f"(access-pad {B} zero-padding 1 0 5)")), root)
    tensors = random_tensors(shapes, seed=2)
    want = evaluate(apsat.parse(text, shapes), tensors)
    for prog in members(eg, root, 20):
        np.testing.assert_allclose(evaluate(prog, tensors), want, rtol=RTOL, atol=ATOL)
