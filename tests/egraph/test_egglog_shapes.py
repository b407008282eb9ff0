"""The shape analysis in language.egg mirrors the Python shape rules (apsat/lang/shapes.py).

Every e-class of a set of programs that covers every op and compute operator of the
registry gets the same ((iterated), (item)) shape from egglog as from `infer_shapes`,
both with egglog deriving every shape (seed_every=0) and with every term seeded from
Python (seed_every=1, where any disagreement would be a flagged conflict). Terms that
Python rejects are flagged ill-shaped by egglog too.
"""
import pytest

import apsat
from apsat.egraph.driver import egg_term
from apsat.explore.egraph import EGraph
from apsat.lang.ops import COMPUTE_OPS, NARY_OPS, OPS, UNARY_MAPS
from apsat.lang.syntax import parse_term
from apsat.lang.term import Term, postorder
from apsat.errors import ShapeError
from fresh import fresh_egraph
from test_syntax import operator_head

SHAPES = {"t": (3, 32, 32), "w": (8, 3, 3, 3), "x": (3, 4), "y": (3, 4), "z": (4, 6),
          "v": (1, 4), "q": (2, 3, 4), "c": (4, 3, 4), "bias3": (3,)}
X, Y, Q = "(access (access-tensor x) 1)", "(access (access-tensor y) 1)", "(access (access-tensor q) 1)"
WINDOWS = "(access-windows (access (access-tensor t) 0) (shape 3 3 3) (shape 1 1 1))"
CONV = (f"(compute dot-product (access-cartesian-product (access (access-tensor w) 1) "
        f"(access-squeeze {WINDOWS} 0)))")

# (program text, expected shape of the output) - expected values worked out by hand.
PROGRAMS = [
    (WINDOWS, ((1, 30, 30), (3, 3, 3))),                       # Glenside's windows example
    (CONV, ((8, 30, 30), ())),                                  # Glenside's conv2d
    (f"(access-transpose {Q} (list 2 0 1))", ((4,), (2, 3))),
    ("(access-dilated-windows (access (access-tensor t) 1) (shape 3 3) (shape 2 2) (shape 2 2))",
     ((3, 14, 14), (3, 3))),
    (f"(access-insert-axis {X} 2)", ((3,), (4, 1))),
    (f"(access-insert-axis {X} 0)", ((1, 3), (4,))),
    (f"(access-insert-axis {X} 1)", ((3, 1), (4,))),
    ("(access-squeeze (access (access-tensor v) 1) 0)", ((), (4,))),
    ("(access-flatten (access (access-tensor q) 2))", ((6,), (4,))),
    (f"(access-reshape {Q} (access-shape (shape 6) (shape 2 2)))", ((6,), (2, 2))),
    (f"(access-slice {Q} 2 1 3)", ((2,), (3, 2))),
    (f"(access-slice {Q} 0 1 2)", ((1,), (3, 4))),
    (f"(access-concatenate {X} {Y} 0)", ((6,), (4,))),
    (f"(access-pad {X} min-padding 1 2 1)", ((3,), (7,))),
    (f"(access-pad {X} zero-padding 0 1 0)", ((4,), (4,))),
    ("(access-broadcast (access (access-tensor v) 1) (access-shape (shape 3) (shape 4)))", ((3,), (4,))),
    ("(compute elementwise-mul (access-pair (access-broadcast (access-insert-axis "
     "(access-insert-axis (access-literal 2.0) 0) 0) (access-shape (shape 3 4) (shape))) "
     "(access (access-tensor x) 2)))", ((3, 4), ())),
    (f"(systolic-array 4 6 {X} (access (access-tensor z) 0))", ((3,), (6,))),
    (f"(opaque MyOp (args {X} (access-tensor y)) (shape 5 7))", ((), (5, 7))),
    ("(opaque Const (args) (shape 2))", ((), (2,))),
    (f"(compute relu (access-transpose (compute elementwise-add (access-pair {X} {X})) (list 1 0)))",
     ((4,), (3,))),
    (f"(compute dot-product (access-cartesian-product {X} "
     f"(access-transpose (access (access-tensor z) 1) (list 1 0))))", ((3, 6), ())),
    ("(compute select (access (access-tensor c) 1))", ((4,), (4,))),
    ("(compute elementwise-add (access (access-tensor c) 1))", ((4,), (4,))),
    (f"(compute (lrn 5 0.0001 0.75 1.0) {Q})", ((2,), (3, 4))),
    (f"(compute (clip 0.0 6.0) {X})", ((3,), (4,))),
    (f"(compute (layer-norm 1e-05) {X})", ((3,), (4,))),
    (f"(compute (rms-norm 1e-06) {X})", ((3,), (4,))),
]
PROGRAMS += [(f"(compute {op} {Q})", ((2,), ())) for op in ("reduce-sum", "reduce-max", "reduce-mean")]
PROGRAMS += [(f"(compute {operator_head(op)} {Q})", ((2,), (3, 4)))   # every unary map, as registered
             for op in sorted(UNARY_MAPS | {"softmax"})]
PROGRAMS += [(f"(compute {op} (access-pair {X} {Y}))", ((3,), (4,)))
             for op in sorted(o for o in NARY_OPS if COMPUTE_OPS[o].arity in (0, 2))]
PROGRAMS += [  # gathers: data dims before the axis, the indices' dims, data dims after
    (f"(access-gather {X} (access (access-tensor v) 1) 1)", ((3, 1, 4), ())),
    (f"(access-gather {Q} {X} 0)", ((3, 4, 3, 4), ())),
]
PROGRAMS += [  # fused atoms (fusion rules)
    (f"(fused-dot-bias {X} {Y} (access (access-tensor bias3) 1))", ((3, 3), ())),
    (f"(fused-dot-bias-act relu {X} {Y} (access (access-tensor bias3) 1))", ((3, 3), ())),
    (f"(compute gelu {X})", ((3,), (4,))),
]
# attention over q (2, 3, 4) as 2 heads of 3 queries and keys of width 4: QK ((2, 3, 3), (2, 4))
QK = ("(access-pair (access-broadcast (access-reshape (access-tensor q) (access-shape (shape 2 3 1) (shape 4))) "
      "(access-shape (shape 2 3 3) (shape 4))) (access-broadcast (access-reshape (access-tensor q) "
      "(access-shape (shape 2 1 3) (shape 4))) (access-shape (shape 2 3 3) (shape 4))))")
VT = ("(access-broadcast (access-reshape (access-transpose (access-tensor q) (list 0 2 1)) "
      "(access-shape (shape 2 1 4) (shape 3))) (access-shape (shape 2 3 4) (shape 3)))")
PROGRAMS += [  # attention atoms (attention rules): ((2, 3, 4), ()), with and without a bias
    (f"(attention 0 {QK} (access-literal 0.0) {VT})", ((2, 3, 4), ())),
    (f"(attention 1 {QK} (compute dot-product {QK}) {VT})", ((2, 3, 4), ())),
]
PROGRAMS += [  # chain operators (fusion/chain): G's item rule over F's
    (f"(compute (chain elementwise-add relu) (access-pair {X} {Y}))", ((3,), (4,))),
    (f"(compute (chain (chain negative exp) (clip 0.0 6.0)) {Q})", ((2,), (3, 4))),
    ("(compute (chain (chain select tanh) sigmoid) (access (access-tensor c) 1))", ((4,), (4,))),
]


def _program(text):
    term = parse_term(text)
    names = {t.args[0] for t in postorder(term) if t.op == "access-tensor"}
    return apsat.Program({"out": term}, {n: SHAPES[n] for n in names})


@pytest.fixture(scope="module", params=[0, 1], ids=["derived", "seeded"])
def loaded(request):
    """One e-graph holding every program, and the programs."""
    eg = EGraph(seed_every=request.param)
    programs = [_program(text) for text, _ in PROGRAMS]
    for p in programs:
        eg.add(p)
    return eg, programs


def test_expected_shapes_are_pythons():
    for text, expected in PROGRAMS:
        assert _program(text).shape == expected, text


def test_every_eclass_matches_infer_shapes(loaded):
    eg, programs = loaded
    checked = 0
    for p in programs:
        for term in p.terms():
            assert eg.shape_of(eg.handle_of(term)) == p.shape_of(term), repr(term)
            checked += 1
    assert checked > 100


def test_programs_cover_the_registry():
    ops, compute_ops = set(), set()
    for text, _ in PROGRAMS:
        for t in postorder(parse_term(text)):
            ops.add(t.op)
            if t.op == "compute":
                compute_ops.add(t.args[0].op)
    assert ops == set(OPS), f"ops not exercised: {set(OPS) - ops}"
    assert compute_ops == set(COMPUTE_OPS), f"compute ops not exercised: {set(COMPUTE_OPS) - compute_ops}"


def test_glenside_examples():
    eg = EGraph(seed_every=0)
    assert eg.shape_of(eg.add(_program(WINDOWS))) == ((1, 30, 30), (3, 3, 3))
    assert eg.shape_of(eg.add(_program(CONV))) == ((8, 30, 30), ())


# Terms Python's shape rules reject, one or more per check in ops.py.
BAD = [
    f"(fused-dot-bias {X} {Y} (access (access-tensor x) 1))",
    f"(fused-dot-bias-act softmax {X} {Y} (access (access-tensor bias3) 1))",
    "(access (access-tensor x) 3)",
    f"(access-transpose {X} (list 0 0))",
    f"(access-transpose {X} (list 0))",
    f"(access-transpose {X} (list 0 2))",
    f"(access-cartesian-product {X} (access (access-tensor z) 1))",
    f"(access-windows {X} (shape 5) (shape 1))",
    f"(access-windows {X} (shape 2 2) (shape 1 1))",
    f"(access-windows {X} (shape 2) (shape 0))",
    f"(access-dilated-windows {X} (shape 3) (shape 1) (shape 2))",
    f"(access-dilated-windows {X} (shape 2) (shape 1) (shape 0))",
    f"(access-squeeze {X} 0)",
    f"(access-squeeze {X} 2)",
    f"(access-insert-axis {X} 3)",
    f"(access-reshape {X} (access-shape (shape 5) (shape 2)))",
    f"(access-slice {X} 1 2 9)",
    f"(access-slice {X} 1 2 2)",
    f"(access-slice {X} 2 0 1)",
    f"(access-concatenate {X} (access (access-tensor z) 1) 0)",
    f"(access-concatenate {X} (access (access-tensor y) 0) 1)",
    f"(access-pad {X} zero-padding 0 -1 0)",
    f"(access-pad {X} zero-padding 2 1 0)",
    f"(access-pair {X} (access (access-tensor y) 2))",
    f"(access-pair {X} (access (access-tensor z) 1))",
    f"(access-broadcast {X} (access-shape (shape 3) (shape 5)))",
    f"(access-broadcast {X} (access-shape (shape 3) (shape 4 1)))",
    "(compute dot-product (access (access-tensor x) 2))",
    "(compute (lrn 3 0.1 0.7 1.0) (access (access-tensor x) 2))",
    "(compute elementwise-sub (access (access-tensor x) 0))",
    "(compute elementwise-add (access (access-tensor v) 0))",
    "(compute elementwise-add (access (access-tensor x) 2))",
    "(compute select (access (access-tensor z) 0))",
    f"(systolic-array 4 5 {X} (access (access-tensor z) 0))",
    f"(systolic-array 3 6 {X} (access (access-tensor z) 0))",
    f"(systolic-array 4 6 {X} (access (access-tensor z) 1))",
    f"(compute (chain softmax relu) {X})",
    f"(compute (chain relu softmax) {X})",
    f"(compute (chain (chain (layer-norm 1e-05) relu) exp) {X})",
    f"(compute (chain (rms-norm 1e-06) relu) {X})",
    f"(compute (chain relu (rms-norm 1e-06)) {X})",
    f"(compute (chain dot-product relu) {X})",
    f"(compute (chain relu elementwise-add) {X})",
    f"(compute (chain relu (chain relu exp)) {X})",
    f"(fused-dot-bias-act (chain relu tanh) {X} {Y} (access (access-tensor bias3) 1))",
    f"(attention 2 {QK} (access-literal 0.0) {VT})",
    f"(attention 0 {QK} (access-literal 0.0) {QK})",
    f"(attention 0 {QK} {X} {VT})",
    f"(attention 0 (access (access-tensor q) 2) (access-literal 0.0) {VT})",
    f"(attention 0 {QK} (access-literal 0.0) (access (access-tensor q) 2))",
]


@pytest.mark.parametrize("text", BAD)
def test_terms_python_rejects_are_flagged_by_egglog(text):
    term = parse_term(text)
    with pytest.raises(ShapeError):
        _program(text)
    eg = fresh_egraph()
    for name in SHAPES:        # tensors known, so only the term itself can be wrong
        eg.add(Term("access-tensor", (name,)), shapes={name: SHAPES[name]})
    with pytest.raises(ShapeError, match=rf"ill-shaped node .*: {term.op}: "):
        eg.load_text(f"(let $bad {egg_term(term)})")
