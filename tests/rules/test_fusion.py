"""The `fusion` rules (apsat/rules/fusion.egg): per rule soundness, reach and refusal on
small programs written the way the importer writes them, then the acceptance checks on
whole models: light ResNet-50 (Conv -> BatchNorm -> Relu becomes fused kernels with the
BatchNorm folded into the weights, verified against onnxruntime), the GELU MLP and a small
convnet with conv biases."""

import numpy as np
import onnx
import pytest

import apsat
from apsat.pipeline import zoo
from apsat.lang.evaluate import evaluate
from apsat.explore.egraph import EGraph
from apsat.errors import ShapeError
from apsat.egraph.driver import egg_term
from apsat.lang.ops import ACTIVATIONS, EGG_NAMES, OPS, UNARY_MAPS
from apsat.lang.syntax import parse_term
from apsat.lang.term import postorder
from apsat.rules.library import RuleLibrary
from apsat.pipeline.verify import run_oracle, verify_program
from fresh import fresh_egraph
from harness import check_reaches, check_refuses, check_sound, fired, run_rule
from test_syntax import operator_head

import models

# ---- small programs --------------------------------------------------------------------------

A = "(access (access-tensor a) 1)"                      # a (5, 6): 5 rows
W = "(access (access-tensor w) 1)"                      # w (4, 6): 4 output columns
MM = f"(compute dot-product (access-cartesian-product {A} {W}))"          # ((5, 4), ())
WIN = ("(access-squeeze (access-windows (access (access-tensor x) 1) (shape 3 3 3) (shape 1 1 1)) 1)")
CW = "(access (access-tensor cw) 1)"                    # conv weight (5, 3, 3, 3)
CONV_NHWC = f"(compute dot-product (access-cartesian-product {WIN} {CW}))"  # ((1, 4, 4, 5), ())
CONV = f"(access-transpose {CONV_NHWC} (list 0 3 1 2))"                    # NCHW (1, 5, 4, 4)
# the same convolution over NHWC data xh (1, 6, 6, 3), weights permuted to ((5), (3, 3, 3)) by (0 2 3 1)
WIN_P = "(access-squeeze (access-windows (access (access-tensor xh) 1) (shape 3 3 3) (shape 1 1 1)) 3)"
CW_P = "(access-transpose (access (access-tensor cw) 1) (list 0 2 3 1))"
CONV_P = f"(access-transpose (compute dot-product (access-cartesian-product {WIN_P} {CW_P})) (list 0 3 1 2))"
CFDB_P = f"(fused-dot-bias {WIN_P} {CW_P} (access (access-tensor cb) 1))"
# a grouped convolution the importer's way: 2 groups of 2 -> 3 channels, 3x3 over gx (1, 4, 6, 6),
# weights gw (6, 2, 3, 3), result reshaped to NCHW (1, 6, 4, 4)
GFULL = "(access-shape (shape 1 2 3 4 4) (shape 2 3 3))"
GWIN = ("(access-broadcast (access-insert-axis (access-squeeze (access-windows (access-reshape (access-tensor gx) "
        f"(access-shape (shape 1 2) (shape 2 6 6))) (shape 2 3 3) (shape 1 1 1)) 2) 2) {GFULL})")
GWT = f"(access-broadcast (access-reshape (access-tensor gw) (access-shape (shape 1 2 3 1 1) (shape 2 3 3))) {GFULL}"
GROUPED = (f"(access-reshape (compute dot-product (access-pair {GWIN} {GWT}))) "
           "(access-shape (shape 1 6 4 4) (shape)))")
SHAPES = {"a": (5, 6), "w": (4, 6), "b": (4,), "r": (5,), "x": (1, 3, 6, 6), "cw": (5, 3, 3, 3),
          "cb": (5,), "s": (5,), "q": (4,), "wt": (6, 4), "xh": (1, 6, 6, 3),
          "gx": (1, 4, 6, 6), "gw": (6, 2, 3, 3), "gs": (6,), "gh": (4,), "s2": (5,)}


def vec(name, reshape, target=None):
    """A 1-D tensor laid along one axis the importer's way: reshape to (1.. n ..1), broadcast."""
    r = f"(access-reshape (access-tensor {name}) (access-shape (shape {reshape}) (shape)))"
    return r if target is None else f"(access-broadcast {r} (access-shape (shape {target}) (shape)))"


def add(x, y):
    return f"(compute elementwise-add (access-pair {x} {y}))"


def mul(x, y):
    return f"(compute elementwise-mul (access-pair {x} {y}))"


BIAS = vec("b", "1 4", "5 4")                 # per output column of MM
ROWVEC = vec("r", "5 1", "5 4")               # per row of MM: not a bias of the product
CVEC = vec("cb", "1 5 1 1", "1 5 4 4")        # per channel of CONV
SVEC = vec("s", "1 5 1 1", "1 5 4 4")
S2VEC = vec("s2", "1 5 1 1", "1 5 4 4")          # a second per-channel vector (a Caffe Scale)
HVEC = vec("q", "1 1 4 1", "1 5 4 4")         # along H of CONV: not per channel
GSVEC = vec("gs", "1 6 1 1", "1 6 4 4")       # per channel of GROUPED
GHVEC = vec("gh", "1 1 4 1", "1 6 4 4")       # along H of GROUPED: not per channel
FDB = f"(fused-dot-bias {A} {W} (access (access-tensor b) 1))"
CFDB = f"(fused-dot-bias {WIN} {CW} (access (access-tensor cb) 1))"


def lit(value, rank=2, target="5 4"):
    ones = " ".join(["1"] * rank)
    return (f"(access-broadcast (access-reshape (access-literal {value}) (access-shape (shape {ones}) (shape))) "
            f"(access-shape (shape {target}) (shape)))")


def gelu_tanh_text(x, c=0.044714998453855515, swap=False):
    """The tanh GELU with its constant outermost, as the regroup rules leave GPT-2's
    (x * 0.5) * (1 + ..) (tests/rules/test_sugar.py checks that grouping end to end), each
    constant second as the importer writes it: (x * (1 + tanh((x + x^3 * c) * sqrt(2/pi))))
    * 0.5; `swap`: the inner product's operands (neither a constant) the other way round."""
    cube = mul(f"(compute elementwise-pow (access-pair {x} {lit(3.0)}))", lit(c))
    inner = f"(compute tanh {mul(add(x, cube), lit(0.7978845834732056))})"
    rest = add(inner, lit(1.0))
    return mul(mul(rest, x) if swap else mul(x, rest), lit(0.5))


def gelu_text(x, sqrt2=1.4142135381698608):
    erf = f"(compute erf (compute elementwise-div (access-pair {x} {lit(sqrt2)})))"
    return mul(mul(x, add(erf, lit(1.0))), lit(0.5))



def zero(m):
    """The zero bias of shape ((m), ()) the unbiased rules build."""
    return ("(access-broadcast (access-reshape (access-literal 0.0) (access-shape (shape 1) (shape))) "
            f"(access-shape (shape {m}) (shape)))")


ZERO4, ZERO5 = zero(4), zero(5)                 # for MM (4 columns) and CONV (5 channels)
# b iterates over two axes ((2, 2), (6)): the zero bias would need two dims
MM_SPLIT2 = "(compute dot-product (access-cartesian-product (access (access-tensor a) 1) (access (access-tensor w3) 2)))"

# The activation rules, for each of language.egg's activations (ops.ACTIVATIONS):
# (rule, program, pattern expected in the root e-class), then (rule, program it must not rewrite).
def head(op: str) -> str:
    """Operator `op` as surface syntax with sample parameters (clip as relu6)."""
    return "(clip 0.0 6.0)" if op == "clip" else operator_head(op)


def egg_head(op: str) -> str:
    """The same as an egglog ComputeOp term: `(relu)`, `(clip 0.0 6.0)`, `(sqrt-op)`."""
    text = head(op).strip("()").split(" ", 1)
    return "(" + " ".join([EGG_NAMES.get(op, op)] + text[1:]) + ")"


ACTS = [head(a) for a in sorted(ACTIVATIONS)]
CONV_FDB = f"(access-transpose {CFDB} (list 0 3 1 2))"
ACTIVATION_REACH = [case for act in ACTS for case in [
    ("fusion/activation", f"(compute {act} {FDB})", f"(fused-dot-bias-act {act} ?a ?b ?c)"),
    ("fusion/activation-transposed", f"(compute {act} {CONV_FDB})",
     f"(access-transpose (fused-dot-bias-act {act} ?a ?b ?c) (list 0 3 1 2))"),
    # no bias: the activation goes into the atom with a zero bias
    ("fusion/activation-unbiased", f"(compute {act} {MM})", f"(fused-dot-bias-act {act} ?a ?b {ZERO4})"),
    ("fusion/activation-unbiased-transposed", f"(compute {act} {CONV})",
     f"(access-transpose (fused-dot-bias-act {act} ?a ?b {ZERO5}) (list 0 3 1 2))"),
    # a product viewed back to another shape before its activation (GPT-2's Conv1D)
    ("fusion/activation-reshaped", f"(compute {act} (access-reshape {FDB} (access-shape (shape 20) (shape))))",
     f"(access-reshape (compute {act} (fused-dot-bias ?a ?b ?c)) ?s)"),
]]
# unary maps that are not activations (exp, negative, sqrt, erf) stay where they are
ACTIVATION_REFUSE = [
    ("fusion/activation", f"(compute exp {FDB})"),
    ("fusion/activation", f"(compute negative {FDB})"),
    ("fusion/activation-transposed", f"(compute sqrt {CONV_FDB})"),
    ("fusion/activation-transposed", f"(compute softmax {CONV_FDB})"),
    ("fusion/activation-unbiased", f"(compute erf {MM})"),
    ("fusion/activation-unbiased", f"(compute reduce-sum {MM})"),
    ("fusion/activation-unbiased-transposed", f"(compute exp {CONV})"),
    ("fusion/activation-reshaped", f"(compute exp (access-reshape {FDB} (access-shape (shape 20) (shape))))"),
] + [case for act in ACTS for case in [
    ("fusion/activation-unbiased", f"(compute {act} {MM_SPLIT2})"),            # b not split 1
    ("fusion/activation-unbiased-transposed", f"(compute {act} (access-transpose {MM_SPLIT2} (list 0 2 1)))"),
]]


def _case_ids(cases):
    """Test ids: the rule name, with the operator on top for the activation rules (which
    have one case per activation)."""
    return [f"{c[0]}[{c[1].split()[1].strip('(')}]" if c[0].startswith("fusion/activation") else c[0]
            for c in cases]


# (rule, program, pattern expected in the root e-class)
REACH = [
    ("fusion/bias", add(MM, BIAS), "(fused-dot-bias ?a ?b ?c)"),
    ("fusion/bias-unbroadcast",
     add("(compute dot-product (access-cartesian-product (access (access-tensor r1) 1) (access (access-tensor w) 1)))",
         vec("b", "1 4")), "(fused-dot-bias ?a ?b ?c)"),
    ("fusion/bias", add(BIAS, MM), "(fused-dot-bias ?a ?b ?c)"),
    ("fusion/bias-transposed", add(CONV, CVEC), "(access-transpose (fused-dot-bias ?a ?b ?c) (list 0 3 1 2))"),
    ("fusion/bias-transposed", add(CVEC, CONV),
     "(access-transpose (fused-dot-bias ?a ?b ?c) (list 0 3 1 2))"),
    ("fusion/bias-accumulate", add(FDB, BIAS), "(fused-dot-bias ?a ?b (compute elementwise-add ?p))"),
    ("fusion/bias-accumulate-transposed", add(f"(access-transpose {CFDB} (list 0 3 1 2))", SVEC),
     "(access-transpose (fused-dot-bias ?a ?b (compute elementwise-add ?p)) (list 0 3 1 2))"),
    ("fusion/scale-fold", mul(MM, BIAS),
     "(compute dot-product (access-cartesian-product ?a (compute elementwise-mul ?p)))"),
    ("fusion/scale-fold-transposed", mul(CONV, SVEC),
     "(access-transpose (compute dot-product (access-cartesian-product ?a (compute elementwise-mul ?p))) "
     "(list 0 3 1 2))"),
    ("fusion/scale-fold-biased-transposed", mul(f"(access-transpose {CFDB} (list 0 3 1 2))", SVEC),
     "(access-transpose (fused-dot-bias ?a (compute elementwise-mul ?p) (compute elementwise-mul ?q)) "
     "(list 0 3 1 2))"),
    ("fusion/scale-fold-transposed-nhwc", mul(CONV_P, SVEC),
     "(access-transpose (compute dot-product (access-cartesian-product ?a (compute elementwise-mul ?p))) "
     "(list 0 3 1 2))"),
    ("fusion/scale-fold-biased-transposed-nhwc", mul(f"(access-transpose {CFDB_P} (list 0 3 1 2))", SVEC),
     "(access-transpose (fused-dot-bias ?a (compute elementwise-mul ?p) (compute elementwise-mul ?q)) "
     "(list 0 3 1 2))"),
    ("fusion/scale-merge", mul(mul(CONV, SVEC), S2VEC),
     "(compute elementwise-mul (access-pair ?x (access-broadcast (access-reshape (compute elementwise-mul ?p) ?r) ?t)))"),
    ("fusion/shift-scale-merge", mul(add(CONV, CVEC), S2VEC),
     "(compute elementwise-add (access-pair (compute elementwise-mul ?q) "
     "(access-broadcast (access-reshape (compute elementwise-mul ?p) ?r) ?t)))"),
    ("fusion/shift-merge", add(add(CONV, CVEC), S2VEC),
     "(compute elementwise-add (access-pair ?x (access-broadcast (access-reshape (compute elementwise-add ?p) ?r) ?t)))"),
    ("fusion/scale-fold-grouped", mul(GROUPED, GSVEC),
     "(access-reshape (compute dot-product (access-pair ?x (access-broadcast (access-reshape "
     "(compute elementwise-mul ?p) ?lw) ?tw))) ?ly)"),
    ("fusion/gelu-erf", gelu_text(MM), "(compute gelu ?x)"),
    ("fusion/gelu-tanh", gelu_tanh_text(MM), "(compute gelu-tanh ?x)"),
    ("fusion/gelu-tanh", gelu_tanh_text(MM, swap=True), "(compute gelu-tanh ?x)"),   # written once
    ("fusion/silu", mul(MM, f"(compute sigmoid {MM})"), "(compute silu ?x)"),
    ("fusion/silu", mul(f"(compute sigmoid {MM})", MM), "(compute silu ?x)"),
    *ACTIVATION_REACH,
    # runs of element-wise ops: one chain operator (residual add -> relu, mul -> tanh)
    ("fusion/chain", f"(compute relu {add(A, A)})", "(compute (chain elementwise-add relu) ?x)"),
]
SHAPES["r1"], SHAPES["m14"], SHAPES["w3"] = (1, 6), (1, 4), (2, 2, 6)
SHAPES["c3"], SHAPES["a2"] = (5, 3, 6), (5, 6)
P = "(access-pair (access (access-tensor a) 2) (access (access-tensor a2) 2))"   # empty items
# More programs for fusion/chain: (program, pattern expected in the root e-class)
CHAINS = [
    (f"(compute tanh (compute elementwise-mul {P}))", "(compute (chain elementwise-mul tanh) ?x)"),
    (f"(compute (clip 0.0 6.0) (compute sigmoid (compute relu {add(A, A)})))",
     "(compute (chain (chain (chain elementwise-add relu) sigmoid) (clip 0.0 6.0)) ?x)"),
    (f"(compute sigmoid (compute (clip -1.0 1.0) (compute exp {A})))",
     "(compute (chain (chain exp (clip -1.0 1.0)) sigmoid) ?x)"),
    ("(compute gelu (compute select (access (access-tensor c3) 1)))", "(compute (chain select gelu) ?x)"),
    (f"(compute negative (compute erf (compute elementwise-sub {P})))",
     "(compute (chain (chain elementwise-sub erf) negative) ?x)"),
]

# (rule, program whose condition fails)
REFUSE = [
    ("fusion/bias", add(MM, ROWVEC)),                                   # vector along the rows
    ("fusion/bias-unbroadcast",
     add("(compute dot-product (access-cartesian-product (access (access-tensor r1) 1) (access (access-tensor w) 1)))",
         "(access-reshape (access-tensor m14) (access-shape (shape 1 4) (shape)))")),  # not 1-D
    ("fusion/bias", add(ROWVEC, MM)),
    ("fusion/bias-transposed", add(CONV, HVEC)),                        # along H, not channels
    ("fusion/bias-transposed", add(HVEC, CONV)),
    ("fusion/bias-accumulate", add(FDB, ROWVEC)),
    ("fusion/bias-accumulate-transposed", add(f"(access-transpose {CFDB} (list 0 3 1 2))", HVEC)),
    ("fusion/scale-fold", mul(MM, ROWVEC)),
    # weight operand not a named tensor accessed by rows: its dims are not known as a list
    ("fusion/scale-fold", mul("(compute dot-product (access-cartesian-product "
                              f"{A} (access-transpose (access (access-tensor wt) 1) (list 1 0))))", BIAS)),
    ("fusion/scale-fold-transposed", mul(CONV, HVEC)),
    ("fusion/scale-fold-grouped", mul(GROUPED, GHVEC)),                       # not per channel
    ("fusion/scale-fold-transposed-nhwc", mul(CONV_P, HVEC)),                 # not per channel
    ("fusion/scale-fold-biased-transposed-nhwc", mul(f"(access-transpose {CFDB_P} (list 0 3 1 2))", HVEC)),
    # permuted weights, but not by (0 2 3 1): its item is not the tensor's (kh, kw, c)
    ("fusion/scale-fold-transposed-nhwc", mul(
        "(access-transpose (compute dot-product (access-cartesian-product "
        f"{WIN_P} (access-transpose (access (access-tensor cw) 1) (list 0 1 3 2)))) (list 0 3 1 2))", SVEC)),
    ("fusion/scale-fold-biased-transposed", mul(f"(access-transpose {CFDB} (list 0 3 1 2))", HVEC)),
    # two vectors of one length along different axes (H, then W) are not one per-channel vector
    ("fusion/scale-merge", mul(mul(CONV, HVEC), vec("q", "1 1 1 4", "1 5 4 4"))),
    ("fusion/shift-merge", add(add(CONV, HVEC), vec("q", "1 1 1 4", "1 5 4 4"))),
    ("fusion/shift-scale-merge", mul(add(CONV, CVEC), HVEC)),         # lengths 5 and 4
    ("fusion/gelu-erf", gelu_text(MM, sqrt2=1.7320508075688772)),      # x / sqrt 3: not GELU
    ("fusion/gelu-tanh", gelu_tanh_text(MM, c=0.05)),                   # 0.05 x^3: not GELU
    ("fusion/silu", mul(A, "(compute sigmoid (access (access-tensor a2) 1))")),  # x * sigmoid(y)
    ("fusion/silu", mul("(compute sigmoid (access (access-tensor a2) 1))", A)),
    *ACTIVATION_REFUSE,
    # not element-wise on top or underneath: softmax/layer-norm/lrn/reductions/dot-product
    ("fusion/chain", f"(compute softmax {add(A, A)})"),                    # softmax after an add
    ("fusion/chain", f"(compute (layer-norm 1e-05) (compute relu {A}))"),
    ("fusion/chain", "(compute (lrn 3 0.0001 0.75 1.0) (compute exp (access (access-tensor x) 2)))"),
    ("fusion/chain", f"(compute reduce-sum (compute relu {A}))"),
    ("fusion/chain", f"(compute relu {MM})"),                              # no chain from a matmul
    ("fusion/chain", f"(compute relu (compute softmax {A}))"),
    ("fusion/chain", f"(compute relu (compute reduce-max {A}))"),
    ("fusion/chain", f"(compute relu {FDB})"),                             # a fused atom is no compute
    ("fusion/chain", f"(compute elementwise-add (access-pair (compute relu {A}) {A}))"),  # not unary on top
]


@pytest.mark.parametrize("rule,text,pattern", REACH, ids=_case_ids(REACH))
def test_reaches(rule, text, pattern):
    check_reaches(rule, text, SHAPES, pattern)


@pytest.mark.parametrize("rule,text,pattern", REACH, ids=_case_ids(REACH))
def test_sound(rule, text, pattern):
    check_sound(rule, text, SHAPES, seed=3)


@pytest.mark.parametrize("rule,text", REFUSE, ids=[f"{r[0]}-{i}" for i, r in enumerate(REFUSE)])
def test_refuses(rule, text):
    check_refuses(rule, text, SHAPES)


@pytest.mark.parametrize("text,pattern", CHAINS, ids=[str(i) for i in range(len(CHAINS))])
def test_chain_reaches_and_is_sound(text, pattern):
    """fusion/chain over longer runs, unary-only runs, n-ary F (select, sub over a pair):
    the left-nested chain of the whole run lands in the root e-class and every member agrees."""
    check_reaches("fusion/chain", text, SHAPES, pattern)
    check_sound("fusion/chain", text, SHAPES, seed=4)


def test_rule_names_in_this_file():
    """Every fusion rule is exercised above, or with the activation spellings in
    test_sugar.py (the coverage test only greps for names)."""
    from test_sugar import SPELLINGS

    names = {r for r in RuleLibrary().rules if r.startswith("fusion/")}
    assert names == {r for r, _, _ in REACH} | {s[0] for s in SPELLINGS}


@pytest.mark.parametrize("op", sorted(UNARY_MAPS))
def test_activation_rule_fires_exactly_for_ops_activations(op):
    """language.egg's `activation` facts are ops.ACTIVATIONS, the operators Python lets
    fused-dot-bias-act apply: of the unary maps, fusion/activation fuses exactly those."""
    text = f"(compute {head(op)} {FDB})"
    _, _, report = run_rule("fusion/activation", text, SHAPES)
    assert bool(fired(report, "fusion/activation")) == (op in ACTIVATIONS)


NOT_ACTIVATIONS = sorted(UNARY_MAPS - ACTIVATIONS)        # erf, exp, negative, sqrt, ...


@pytest.mark.parametrize("op", NOT_ACTIVATIONS)
def test_fused_atom_over_a_non_activation_is_ill_shaped_in_egglog_too(op):
    """Python refuses (fused-dot-bias-act exp ...); egglog flags it as well, both when a
    rewrite builds it (a wrong rule fails the run with ShapeError instead of extraction
    skipping the node) and when the term is added directly."""
    bad = f"(fused-dot-bias-act {head(op)} {A} {W} (access (access-tensor b) 1))"
    with pytest.raises(ShapeError, match="is not an activation"):
        apsat.parse(bad, SHAPES)
    why = r"ill-shaped node .*: fused-dot-bias-act: the unary map is not an activation"
    # fresh e-graphs (tests/fresh.py): the language loaded once, not three times a case
    eg = fresh_egraph()
    eg.add(apsat.parse(f"(compute {head(op)} {FDB})", SHAPES))
    eg.load_text(f"(ruleset wrong-fusion)\n(rewrite (compute {egg_head(op)} (fused-dot-bias a b c)) "
                 f"(fused-dot-bias-act {egg_head(op)} a b c) :ruleset wrong-fusion)")
    with pytest.raises(ShapeError, match=why):
        eg.run(["wrong-fusion"])
    eg = fresh_egraph()
    eg.add(apsat.parse(FDB, SHAPES))
    with pytest.raises(ShapeError, match=why):
        eg.load_text(f"(let $bad {egg_term(parse_term(bad))})")


def test_fused_atoms_over_activations_are_well_shaped_in_egglog():
    """The control: the same rewrite for each activation raises nothing, and the atom gets
    the shape Python gives it."""
    for op in sorted(ACTIVATIONS):
        eg = fresh_egraph()
        root = eg.add(apsat.parse(f"(compute {head(op)} {FDB})", SHAPES))
        eg.load_text(f"(ruleset act)\n(rewrite (compute {egg_head(op)} (fused-dot-bias a b c)) "
                     f"(fused-dot-bias-act {egg_head(op)} a b c) :ruleset act)")
        eg.run(["act"])
        assert eg.matches(f"(fused-dot-bias-act {head(op)} ?a ?b ?c)", root)
        assert eg.shape_of(root) == ((5, 4), ())


def test_batchnorm_conv_relu_from_the_importer_sound():
    """The exact Conv -> BatchNormalization -> Relu term the importer writes, all fusion rules:
    the root class reaches one fused kernel over folded weights, and every sampled member
    (up to 20) equals the original."""
    from harness import members
    model = models.make_model(
        [onnx.helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
         onnx.helper.make_node("BatchNormalization", ["c", "g", "bb", "mu", "var"], ["n"]),
         onnx.helper.make_node("Relu", ["n"], ["y"])],
        {"x": (1, 3, 8, 8)}, ["y"],
        {k: v for k, v in zip(["w", "g", "bb", "mu", "var"], _bn_weights())})
    m = apsat.load_onnx(model)
    eg = EGraph()
    RuleLibrary().load_into(eg, ["fusion"])
    root = eg.add(m.program)
    eg.run(["fusion"])
    assert eg.matches("(access-transpose (fused-dot-bias-act relu ?x (compute elementwise-mul ?p) ?c) "
                      "(list 0 3 1 2))", root)
    inputs = {**m.weights, "x": np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)}
    want = evaluate(m.program, inputs)
    progs = members(eg, root)
    assert len(progs) >= 2
    for prog in progs:
        np.testing.assert_allclose(evaluate(prog, inputs), want, rtol=1e-4, atol=1e-5)


def _bn_weights():
    rng = np.random.default_rng(1)
    return [(rng.standard_normal((4, 3, 3, 3)) / np.sqrt(27)).astype(np.float32),
            (1 + 0.1 * rng.standard_normal(4)).astype(np.float32),
            (0.1 * rng.standard_normal(4)).astype(np.float32),
            (0.1 * rng.standard_normal(4)).astype(np.float32),
            (1 + 0.1 * np.abs(rng.standard_normal(4))).astype(np.float32)]


# ---- whole models ----------------------------------------------------------------------------

class FusedCheaper:
    """Test cost model: a fused atom costs 1, a compute node 2 (a kernel), any other Expr
    node 1, so a fused kernel is cheaper than the dot-product, add and activation it covers."""

    name = "fused-cheaper"

    def node_cost(self, graph):
        def cost(nid):
            op = graph.nodes[nid]["op"]
            if op not in OPS:
                return 0.0
            return 2.0 if op == "compute" else 1.0
        return cost


def _saturated(m):
    eg = EGraph()
    RuleLibrary().load_into(eg, ["fusion"])
    handles = eg.add_outputs(m.program)
    return eg, handles, eg.run(["fusion"])


def _optimise(m):
    eg, handles, report = _saturated(m)
    return apsat.extract(eg, handles, method="tree", cost=FusedCheaper()), report


def _depends_on(program, inputs):
    """term -> True when its value depends on a graph input (an activation, not a weight)."""
    dep = {}
    for t in program.terms():
        kids = list(t.children())
        dep[t] = (t.op == "access-tensor" and t.args[0] in inputs) or any(dep[k] for k in kids)
    return dep


@pytest.fixture(scope="module")
def resnet():
    path = next(p for p in zoo.light_model_paths() if "resnet50" in p.name)
    m = apsat.load_onnx(zoo.randomize_weights(onnx.load(str(path)), seed=0))
    eg, handles, report = _saturated(m)
    best = apsat.extract(eg, handles, method="tree", cost=FusedCheaper())
    return m, best, report, eg, handles


@pytest.fixture(scope="module")
def resnet_oracle(resnet):
    """onnxruntime's float32 and float64 runs of the model on the seeded inputs, which three
    verifications below judge their programs against (0.5 s each time)."""
    m = resnet[0]
    inputs = zoo.random_inputs(m, 0)
    return inputs, run_oracle(m.onnx, inputs)


def _resnet_counts(m, best):
    # 53 convolutions: 33 Conv->BN->Relu, 16 Conv->BN->(residual Sum), 4 projection
    # shortcuts Conv->BN; plus the final Gemm with its bias.
    counts = best.op_counts()
    assert counts.get("fused-dot-bias-act", 0) == 33
    assert counts.get("fused-dot-bias", 0) == 21
    assert counts.get("compute dot-product", 0) == 0
    # each residual add and the relu after it: one element-wise kernel, not two (other
    # chains, such as sqrt(var + eps), are BatchNorm arithmetic on weights)
    assert counts.get("compute relu", 0) == 0
    dep = _depends_on(best, set(m.inputs))
    chains = [t.args[0] for t in best.terms() if t.op == "compute" and t.args[0].op == "chain" and dep[t]]
    assert len(chains) == 16 and {repr(c) for c in chains} == {"(chain elementwise-add relu)"}
    acts = [t for t in best.terms() if t.op == "fused-dot-bias-act"]
    assert all(t.args[0].op == "relu" for t in acts)


def test_resnet50_conv_bn_relu_become_fused_kernels(resnet):
    m, best, report, _, _ = resnet
    assert report["stop_reason"] == "saturated"
    assert report["rule_matches"].get("fusion/chain", 0) >= 16
    _resnet_counts(m, best)


@pytest.mark.parametrize("method", ["greedy-dag", "tree"])
def test_resnet50_gpu_cost_model_prefers_fused_atoms_and_chains(resnet, resnet_oracle, method):
    """With chains in the e-graph, the gpu roofline still picks conv + bias + relu atoms
    (a chain over a separate convolution kernel costs a launch and a round trip more), and
    picks the chain for each residual add + relu."""
    m, _, _, eg, handles = resnet
    best = apsat.extract(eg, handles, method=method, cost="gpu")
    _resnet_counts(m, best)
    inputs, oracle = resnet_oracle
    assert verify_program(m, best, inputs, oracle=oracle).ok


def test_resnet50_batchnorm_arithmetic_only_on_weights(resnet):
    m, best, _, _, _ = resnet
    dep = _depends_on(best, set(m.inputs))
    on_activations = [t.args[0].op for t in best.terms() if t.op == "compute" and dep[t]]
    # what is left on activations: residual add + relu chains, pooling and the softmax
    assert sorted(set(on_activations)) == ["chain", "reduce-max", "reduce-mean", "softmax"]
    assert on_activations.count("chain") == 16
    # the BatchNorm scale now multiplies weights: every elementwise-mul is on weights only
    assert sum(1 for t in best.terms() if t.op == "compute" and t.args[0].op == "elementwise-mul") > 0


def test_resnet50_fused_program_verifies_against_onnxruntime(resnet, resnet_oracle):
    m, best, _, _, _ = resnet
    inputs, oracle = resnet_oracle
    v = verify_program(m, best, inputs, oracle=oracle)
    assert v.ok, v


def test_gelu_mlp_fuses_matmul_bias_gelu_and_verifies():
    m = apsat.load_onnx(models.gelu_mlp())
    best, _ = _optimise(m)
    counts = best.op_counts()
    assert counts.get("fused-dot-bias-act", 0) == 1 and counts.get("fused-dot-bias", 0) == 1
    assert [t.args[0].op for t in best.terms() if t.op == "fused-dot-bias-act"] == ["gelu"]
    assert "compute erf" not in counts
    assert verify_program(m, best, zoo.random_inputs(m, 0)).ok


def test_unbiased_conv_relu_and_matmul_relu_fuse_with_a_zero_bias_and_verify():
    """Conv without bias -> Relu and MatMul -> Relu: no add for the bias rules, so the
    unbiased rules fuse them with a zero bias; the result matches onnxruntime."""
    rng = np.random.default_rng(2)
    weights = {"w": (rng.standard_normal((4, 3, 3, 3)) / np.sqrt(27)).astype(np.float32),
               "fw": (rng.standard_normal((256, 10)) / 16).astype(np.float32)}
    model = models.make_model(
        [onnx.helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
         onnx.helper.make_node("Relu", ["c"], ["r"]),
         onnx.helper.make_node("Flatten", ["r"], ["f"], axis=1),
         onnx.helper.make_node("MatMul", ["f", "fw"], ["mm"]),
         onnx.helper.make_node("Relu", ["mm"], ["y"])],
        {"x": (1, 3, 8, 8)}, ["y"], weights)
    m = apsat.load_onnx(model)
    best, report = _optimise(m)
    assert report["rule_matches"].get("fusion/activation-unbiased", 0) >= 1
    assert report["rule_matches"].get("fusion/activation-unbiased-transposed", 0) >= 1
    counts = best.op_counts()
    assert counts.get("fused-dot-bias-act", 0) == 2
    assert "compute dot-product" not in counts and "compute relu" not in counts
    biases = [t.args[3] for t in best.terms() if t.op == "fused-dot-bias-act"]
    assert all(any(u.op == "access-literal" and u.args[0] == 0.0 for u in postorder(b)) for b in biases)
    assert verify_program(m, best, zoo.random_inputs(m, 0)).ok


def test_small_convnet_with_conv_biases_verifies():
    m = apsat.load_onnx(models.small_convnet())
    best, _ = _optimise(m)
    counts = best.op_counts()
    assert counts.get("fused-dot-bias-act", 0) == 1       # conv1 + bias + relu
    assert counts.get("fused-dot-bias", 0) == 2           # conv2 + bias (residual follows), gemm
    assert verify_program(m, best, zoo.random_inputs(m, 0)).ok


def test_gemm_tanh_gemm_sigmoid_fuse_and_verify():
    rng = np.random.default_rng(0)
    w = {"w1": (rng.standard_normal((16, 12)) / 4).astype(np.float32), "b1": rng.standard_normal(16).astype(np.float32),
         "w2": (rng.standard_normal((5, 16)) / 4).astype(np.float32), "b2": rng.standard_normal(5).astype(np.float32)}
    nodes = [onnx.helper.make_node("Gemm", ["x", "w1", "b1"], ["g1"], transB=1), onnx.helper.make_node("Tanh", ["g1"], ["t"]),
             onnx.helper.make_node("Gemm", ["t", "w2", "b2"], ["g2"], transB=1), onnx.helper.make_node("Sigmoid", ["g2"], ["y"])]
    m = apsat.load_onnx(models.make_model(nodes, {"x": (3, 12)}, ["y"], w))
    best, _ = _optimise(m)
    acts = sorted(t.args[0].op for t in best.terms() if t.op == "fused-dot-bias-act")
    assert acts == ["sigmoid", "tanh"]
    assert verify_program(m, best, zoo.random_inputs(m, 0)).ok


@pytest.mark.parametrize("ops,chain", [
    (("Add", "Relu", "Sigmoid"), "(chain (chain elementwise-add relu) sigmoid)"),
    (("Mul", "Tanh"), "(chain elementwise-mul tanh)"),
], ids=["add-relu-sigmoid", "mul-tanh"])
def test_onnx_elementwise_run_becomes_one_chain_kernel(ops, chain):
    """Imported and optimised for the gpu target (default plan, greedy-dag on the gpu
    roofline): one compute node, the chain, which the model prices as one kernel (half or
    a third of the unfused launches and round trips: the extractor's e-node figures); the
    emitted kernels cost no more than the imported program's; it equals onnxruntime."""
    m = apsat.load_onnx(models.elementwise_chain(ops))
    res = apsat.optimize(m, target="gpu", verify=True)
    computes = [t for t in res.program.terms() if t.op == "compute"]
    assert [repr(t.args[0]) for t in computes] == [chain]
    ext = res.report["extraction"]
    assert ext["node_dag_cost"] < ext["node_dag_cost_before"] / (len(ops) - 0.5)   # launches dominate
    assert ext["dag_cost"] <= ext["dag_cost_before"] and ext["kernels"] == 1
    assert res.report["verification"]["ok"], res.report["verification"]


def test_gpu_cost_model_prices_a_chain_as_one_kernel():
    """The chain costs what one element-wise kernel over its operand costs: one launch,
    its operand read once and its result written once, the parts' arithmetic summed."""
    from apsat.extract.cost_gpu import GpuRoofline
    from apsat.targets.gpu import LAUNCH_US

    shapes = {"x": (256, 1024), "y": (256, 1024)}
    pair = "(access-pair (access (access-tensor x) 2) (access (access-tensor y) 2))"
    chained = apsat.parse(f"(compute (chain (chain elementwise-add relu) sigmoid) {pair})", shapes)
    unfused = apsat.parse(f"(compute sigmoid (compute relu (compute elementwise-add {pair})))", shapes)
    eg = EGraph()
    got = apsat.extract(eg, eg.add(chained), cost="gpu").cost
    n = 256 * 1024
    assert got == pytest.approx(GpuRoofline().kernel_us((1 * 2 + 1 + 6) * n, 3 * n, False))
    eg = EGraph()
    assert apsat.extract(eg, eg.add(unfused), cost="gpu").cost > got + 2 * LAUNCH_US


@pytest.mark.parametrize("target", ["gpu", "systolic:32x32"])
def test_batchnorm_then_a_second_affine_folds_into_one_fused_convolution(target):
    """Conv -> BatchNorm -> Mul/Add of Unsqueezed per-channel vectors -> Relu (light
    Inception-v2's every convolution) under the target's default plan: the affine phase
    merges the two scales and the two shifts, fusion folds them into one conv with a
    ReLU epilogue; what is left beside it is weight-only work; equal to onnxruntime."""
    m = apsat.load_onnx(models.conv_batchnorm_scale())
    eg = EGraph(target=target)
    h = eg.add_outputs(m.program)
    report = eg.saturate()
    assert [p["phase"] for p in report["phases"]][0] == "affine"
    best = apsat.extract(eg, h)
    counts = best.op_counts()
    assert counts.get("fused-dot-bias-act", 0) == 1 and counts.get("fused-dot-bias", 0) == 0
    # no element-wise op reads the convolution's input or output: all of them are weights
    x_terms = {t for t in best.terms() if any(s.op == "access-tensor" and s.args[0] == "x" for s in postorder(t))}
    assert not any(t.op == "compute" for t in x_terms)
    assert verify_program(m, best, zoo.random_inputs(m, 0)).ok


def test_gpt2_products_apply_gelu_tanh():
    """GPT-2 (tests/data/real_zoo) writes its GELU with tanh and Pow(x, 3), constants on
    the left, after a product viewed back to (batch, sequence, width): each MLP product
    takes gelu-tanh as its activation, and the program equals onnxruntime."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "data" / "real_zoo" / "gpt2.onnx"
    res = apsat.optimize(path, target="gpu", verify=True)
    acts = [t.args[0].op for t in res.program.terms() if t.op == "fused-dot-bias-act"]
    assert acts == ["gelu-tanh", "gelu-tanh"]                    # one MLP per layer, 2 layers
    assert res.report["verification"]["ok"]
