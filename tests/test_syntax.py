"""Surface syntax: parsing Glenside's programs, printing back, shapes, and parse errors."""
import pytest

import apsat
from apsat.lang.ops import COMPUTE_OPS, OPS
from apsat.lang.syntax import parse_term, to_text
from apsat.errors import ParseError, ShapeError

CONV = ("(compute dot-product (access-cartesian-product (access (access-tensor w) 1) "
        "(access-squeeze (access-windows (access (access-tensor t) 0) (shape 3 3 3) (shape 1 1 1)) 0)))")

# One program per op (and per compute operator), used for round-trip tests; each
# parses, prints back identically, and has a valid shape under SHAPES.
SHAPES = {"t": (3, 32, 32), "w": (8, 3, 3, 3), "x": (900, 27), "m": (4, 6), "v": (6,)}
EXAMPLES = [
    CONV,
    "(access-windows (access (access-tensor t) 0) (shape 3 3 3) (shape 1 1 1))",
    "(access-dilated-windows (access (access-tensor t) 1) (shape 3 3) (shape 2 2) (shape 2 2))",
    "(access-transpose (access (access-tensor w) 1) (list 1 0 2 3))",
    "(access-flatten (access (access-tensor w) 1))",
    "(access-reshape (access (access-tensor m) 1) (access-shape (shape 2 2) (shape 6)))",
    "(access-slice (access (access-tensor m) 1) 1 2 5)",
    "(access-concatenate (access (access-tensor m) 1) (access (access-tensor m) 1) 0)",
    "(access-gather (access (access-tensor m) 1) (access (access-tensor v) 1) 1)",
    "(access-gather (access-tensor t) (access-tensor m) 0)",
    "(access-pad (access (access-tensor t) 1) zero-padding 1 2 2)",
    "(access-pad (access (access-tensor t) 1) min-padding 2 0 1)",
    "(access-insert-axis (access (access-tensor m) 1) 0)",
    "(access-squeeze (access-insert-axis (access (access-tensor m) 1) 2) 2)",
    "(compute elementwise-add (access-pair (access (access-tensor m) 1) (access (access-tensor m) 1)))",
    "(access-broadcast (access (access-reshape (access-tensor v) (access-shape (shape) (shape 1 6))) 1) "
    "(access-shape (shape 4) (shape 6)))",
    "(compute (clip -1.0 6.0) (access-literal 0.5))",
    "(fused-dot-bias (access (access-tensor m) 1) (access (access-tensor m) 1) "
    "(compute reduce-sum (access (access-tensor m) 1)))",
    "(fused-dot-bias-act (clip 0.0 6.0) (access (access-tensor m) 1) (access (access-tensor m) 1) "
    "(compute reduce-sum (access (access-tensor m) 1)))",
    "(compute (lrn 5 0.0001 0.75 1.0) (access (access-tensor t) 0))",
    "(compute (layer-norm 1e-05) (access (access-tensor m) 1))",
    "(compute (rms-norm 1e-06) (access (access-tensor m) 1))",
    "(systolic-array 27 8 (access (access-tensor x) 1) "
    "(access (access-transpose (access (access-reshape (access-tensor w) (access-shape (shape 8) (shape 27))) 1) (list 1 0)) 0))",
    "(attention 1 (access-pair (access-broadcast (access-reshape (access-tensor m) (access-shape (shape 4 1) (shape 6))) "
    "(access-shape (shape 4 4) (shape 6))) (access-broadcast (access-reshape (access-tensor m) "
    "(access-shape (shape 1 4) (shape 6))) (access-shape (shape 4 4) (shape 6)))) (access-literal 0.0) "
    "(access-broadcast (access-reshape (access-transpose (access-tensor m) (list 1 0)) (access-shape (shape 1 6) (shape 4))) "
    "(access-shape (shape 4 6) (shape 4))))",
    '(opaque node0 (args (access-tensor m) (access-tensor v)) (shape 4 6))',
    "(compute (chain (chain elementwise-mul (clip -1.0 6.0)) sqrt) "
    "(access-pair (access (access-tensor m) 1) (access (access-tensor m) 1)))",
]


@pytest.mark.parametrize("text", EXAMPLES)
def test_round_trip(text):
    term = parse_term(text)
    assert to_text(term) == " ".join(text.split())
    assert parse_term(to_text(term)) is term  # interned: same term object
    apsat.parse(text, SHAPES)  # shapes fit


def test_examples_cover_every_op():
    ops = {t.op for text in EXAMPLES for t in apsat.parse(text, SHAPES).terms()}
    assert ops == set(OPS)


# A sample parameter of each kind; operator-valued parameters (chain's F and G) by position.
OPERATOR_PARAMS = ("elementwise-add", "relu")


def operator_head(op: str) -> str:
    """`op` with sample parameters, as surface syntax: `relu`, `(clip 0.5 0.5)`,
    `(chain elementwise-add relu)`."""
    spec = COMPUTE_OPS[op]
    if "compute-op" in spec.params:
        params = " ".join(OPERATOR_PARAMS)
    else:
        params = " ".join(str(p) for p in spec.example_params())
    return f"({op} {params})" if params else op


@pytest.mark.parametrize("op", sorted(COMPUTE_OPS))
def test_every_compute_operator_round_trips(op):
    head = operator_head(op)
    n = {"elementwise-sub": 2, "elementwise-div": 2, "elementwise-pow": 2, "select": 3}.get(op, 2)
    text = f"(compute {head} (access (access-tensor a) 1))"
    prog = apsat.parse(text, {"a": (5, n, 4)})
    assert to_text(prog.root) == text


def test_chain_operators_parse_print_and_shape():
    """(chain F G): operators as parameters, nested to the left; its item shape is G's rule
    over F's; F must be element-wise and G a unary map."""
    from apsat.lang.syntax import compute_op_text, parse_compute_op

    text = "(chain (chain elementwise-sub exp) (clip 0.0 6.0))"
    op = parse_compute_op(text)
    assert op.op == "chain" and op.args[1].args == (0.0, 6.0) and op.args[0].args[0].op == "elementwise-sub"
    assert compute_op_text(op) == text and parse_compute_op(compute_op_text(op)) is op
    pair = "(access-pair (access (access-tensor m) 1) (access (access-tensor m) 1))"
    assert apsat.parse(f"(compute {text} {pair})", SHAPES).shape == ((4,), (6,))
    for bad in ("(chain softmax relu)", "(chain relu softmax)", "(chain dot-product relu)",
                "(chain relu elementwise-add)", "(chain relu (chain relu exp))"):
        with pytest.raises(ShapeError, match="chain: "):
            apsat.parse(f"(compute {bad} (access (access-tensor m) 1))", SHAPES)
    with pytest.raises(ParseError, match="chain takes 2 parameters"):
        parse_term("(compute (chain relu) (access-tensor m))")
    assert parse_term("(compute (chain ?f relu) ?x)", allow_vars=True).args[0].args[0].op == "?var"


def test_glenside_shapes():
    assert apsat.parse("(access-windows (access (access-tensor t) 0) (shape 3 3 3) (shape 1 1 1))",
                       {"t": (3, 32, 32)}).shape == ((1, 30, 30), (3, 3, 3))
    assert apsat.parse(CONV, SHAPES).shape == ((8, 30, 30), ())
    mm = "(compute dot-product (access-cartesian-product (access (access-tensor w) 1) (access (access-tensor x) 1)))"
    assert apsat.parse(mm, {"w": (8, 27), "x": (900, 27)}).shape == ((8, 900), ())


@pytest.mark.parametrize("text, message", [
    ("(access (access-tensor t) 1", r"missing '\)'"),
    ("(access (access-tensor t))", "takes 2 arguments"),
    ("(acess (access-tensor t) 1)", "unknown op 'acess'"),
    ("(compute frobnicate (access-tensor t))", "unknown compute operator"),
    ("(access (access-tensor t) one)", "expected an integer"),
    ("(access-pad (access-tensor t) pink-padding 0 1 1)", "unknown pad type"),
    ("(access ?x 1)", "expected an expression"),
])
def test_parse_errors_name_the_problem(text, message):
    with pytest.raises(ParseError, match=message):
        parse_term(text)


@pytest.mark.parametrize("text, shapes, message", [
    ("(access-tensor q)", {}, "no shape given for tensor 'q'"),
    ("(access-pair (access-tensor a) (access-tensor b))", {"a": (2,), "b": (3,)}, "shapes differ"),
    ("(access-transpose (access-tensor a) (list 0 0))", {"a": (2, 2)}, "not a permutation"),
    ("(access-windows (access (access-tensor a) 0) (shape 5) (shape 1))", {"a": (3,)}, "does not fit"),
])
def test_shape_errors(text, shapes, message):
    with pytest.raises(ShapeError, match=message):
        apsat.parse(text, shapes)


def test_deep_program_does_not_recurse():
    text = "(access-tensor a)"
    for _ in range(5000):
        text = f"(compute relu {text})"
    prog = apsat.parse(text, {"a": (2,)})
    assert prog.shape == ((), (2,)) and len(prog.terms()) == 5001
    assert to_text(prog.root) == text


def test_dag_text_is_linear_and_round_trips():
    from apsat.lang.syntax import parse_dag_text, to_dag_text

    # a residual chain whose tree form has 2**200 nodes
    cur = parse_term("(access (access-tensor x) 1)")
    for _ in range(200):
        relu = parse_term("(compute relu ?a)", allow_vars=True)
        relu = type(cur)("compute", (relu.args[0], cur))
        cur = type(cur)("compute", (parse_term("(compute elementwise-add ?a)", allow_vars=True).args[0],
                                    type(cur)("access-pair", (relu, cur))))
    text = to_dag_text({"y": cur})
    assert len(text) < 100_000
    assert parse_dag_text(text)["y"] is cur


@pytest.mark.parametrize("text, message", [
    ("%1 = (access %0 1)\noutput y = %1", "used before it is defined"),
    ("%0 = (access-tensor x)", "no 'output"),
    ("y (access-tensor x)", "expected '%N = EXPR'"),
])
def test_dag_text_errors(text, message):
    from apsat.lang.syntax import parse_dag_text

    with pytest.raises(ParseError, match=message):
        parse_dag_text(text)


def test_evaluate_without_copy_leaves_a_broadcast_a_view():
    # copy=False (the ONNX export's weight folding) keeps a broadcast a stride-0 view of
    # the input; the default returns a fresh array that never aliases it
    import numpy as np

    from apsat.lang.evaluate import evaluate
    program = apsat.parse("(access-broadcast (access (access-tensor w) 0) (access-shape (shape) (shape 3 4)))",
                          {"w": (1, 4)})
    w = np.arange(4, dtype=np.float32).reshape(1, 4)
    view = evaluate(program, {"w": w}, copy=False)
    fresh = evaluate(program, {"w": w})
    assert view.shape == fresh.shape == (3, 4) and view.strides[0] == 0
    np.testing.assert_array_equal(view, fresh)
    assert not np.shares_memory(fresh, w)
