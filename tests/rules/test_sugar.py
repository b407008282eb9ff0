"""The short pattern form (apsat/rules/sugar.py) and the fusion rules written in it.

Expansion: each operator of the table becomes its registry operator in the importer's
encoding, a number a broadcast literal (exact where float32 holds it, else bounded by the
tolerance), a commutative operator's constant operand second, a variadic operator folded
left; the rule keeps the pattern's line and name, also in the user-rule check's message.
Errors: each malformed pattern is one RuleError `path:line: reason`.

Spellings: every activation spelling a fusion rule in the short form takes, written as an
exporter writes it (onnx.helper; the exporter's node order, constants on its side) after a
MatMul. On the imported program the rule alone fires and every sampled member of the root
e-class equals the original under the reference interpreter (harness.check_sound: rtol
1e-4, atol 1e-5); `apsat.optimize` leaves one `fused-dot-bias-act OP` and no other compute
operator, and verifies against onnxruntime (apsat.pipeline.verify: apsat's float32 error
against a float64 run of the model at most 8 times onnxruntime's own, plus 4 float32 ulps
of the output's scale); with one constant 1% off, the rule does not fire.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from harness import check_refuses, check_sound
from models import make_model
from onnx import helper, numpy_helper

import apsat
from apsat.errors import RuleError, UnsoundRuleError
from apsat.explore.egraph import EGraph
from apsat.lang.ops import COMPUTE_OPS
from apsat.rules.library import RuleLibrary
from apsat.rules.sexpr import Atom, Form, calls, read_forms
from apsat.rules.sugar import DEFAULT_TOLERANCE, OPERATORS, SYMBOLS, expand_pattern

DOCS = Path(__file__).resolve().parents[2] / "docs" / "rules.md"


def expanded(pattern: str, path: str = "user.egg") -> Form:
    """The rule form a pattern's text expands to."""
    return read_forms(expand_pattern(path, read_forms(pattern)[0]))[0]


def left_side(rule: Form):
    """The left side of an expanded rule: the pattern bound to ?root in its query."""
    return rule.items[1].items[0].items[2]


def facts(rule: Form) -> list[tuple[str, str, float]]:
    """The query's bounds on numbers: (comparison, variable, value)."""
    return [(f.head, f.items[1].text, float(f.items[2].text)) for f in rule.items[1].items[1:]]


def text(node) -> str:
    return node.text if isinstance(node, Atom) else "(" + " ".join(text(i) for i in node.items) + ")"


# ---- expansion --------------------------------------------------------------------------------

@pytest.mark.parametrize("op", sorted(OPERATORS))
def test_each_operator_is_its_registry_operator_in_the_importers_encoding(op):
    """Every table entry (registry name or symbol) is `compute` of the registry operator's
    egglog constructor: a unary map over its operand with its parameters first, a binary
    one over the `access-pair` of its two operands."""
    spec = OPERATORS[op]
    params = ["2" if kind == "int" else "1.5" for kind in spec.params]
    operands = ["x"] if spec.operands == 1 else ["x", "y"]
    lhs = left_side(expanded(f"(pattern ({' '.join([op] + params + operands)}) x :ruleset r)"))
    assert lhs.head == "compute"
    head, arg = lhs.items[1], lhs.items[2]
    assert head.head == COMPUTE_OPS[spec.name].egg and len(head.items) == 1 + len(params)
    assert text(arg) == ("x" if spec.operands == 1 else "(access-pair x y)")


def test_symbols_name_registry_operators():
    assert all(OPERATORS[s] is OPERATORS[name] for s, name in SYMBOLS.items())
    assert OPERATORS["exp"].egg == "exp-op" and OPERATORS["log"].egg == "log-op"    # egglog's spelling


def test_a_number_is_a_broadcast_literal_bounded_by_the_tolerance():
    rule = expanded("(pattern (* x 2.7) (relu x) :ruleset r :tolerance 0.01)")
    constant = left_side(rule).items[2].items[2]
    assert [f.head for f in calls(constant)] == ["access-broadcast", "access-reshape", "access-literal"]
    var = constant.items[1].items[1].items[1].text
    (ge, v1, low), (le, v2, high) = facts(rule)
    assert (ge, le, v1, v2) == (">=", "<=", var, var)
    assert low == pytest.approx(2.7 * 0.99) and high == pytest.approx(2.7 * 1.01)


def test_the_default_tolerance_is_relative():
    (_, _, low), (_, _, high) = facts(expanded("(pattern (* x 0.044715) (relu x) :ruleset r)"))
    assert (low, high) == (pytest.approx(0.044715 * (1 - DEFAULT_TOLERANCE), rel=1e-12),
                           pytest.approx(0.044715 * (1 + DEFAULT_TOLERANCE), rel=1e-12))


@pytest.mark.parametrize("number, literal", [("0", "0.0"), ("2.5", "2.5"), ("3", "3.0"), ("-6", "-6.0")])
def test_a_number_float32_holds_is_matched_exactly_as_an_f64_literal(number, literal):
    """access-literal takes an f64 (the importer writes Pow's exponent 3 as 3.0); a value
    float32 holds exactly is that literal, with no bounds, whatever the tolerance."""
    rule = expanded(f"(pattern (* x {number}) (relu x) :ruleset r :tolerance 0.1)")
    assert text(left_side(rule).items[2].items[2].items[1].items[1]) == f"(access-literal {literal})"
    assert facts(rule) == []


def test_a_commutative_operators_constant_goes_second_and_others_keep_their_order():
    assert text(expanded("(pattern (* 0.5 x) x :ruleset r)")) == text(expanded("(pattern (* x 0.5) x :ruleset r)"))
    sub = left_side(expanded("(pattern (- 0.5 x) x :ruleset r)")).items[2]
    assert sub.items[1].head == "access-broadcast" and text(sub.items[2]) == "x"


def test_a_variadic_operator_folds_left_and_a_binary_one_takes_two():
    assert text(expanded("(pattern (* a b c) a :ruleset r)")) == text(expanded("(pattern (* (* a b) c) a :ruleset r)"))
    with pytest.raises(RuleError, match="'pow' takes 2 arguments, got 3"):
        expanded("(pattern (pow a b c) a :ruleset r)")


def test_variables_are_written_as_given_and_may_stand_for_parameters():
    rule = expanded("(pattern (clip lo hi (+ x x)) (hard-sigmoid lo hi x) :ruleset r)")
    assert text(left_side(rule)) == "(compute (clip lo hi) (compute (elementwise-add) (access-pair x x)))"
    assert text(rule.items[2]) == "((union ?root (compute (hard-sigmoid lo hi) x)))"
    assert facts(rule) == []


def test_the_right_side_applies_unary_maps_with_literal_parameters():
    rule = expanded("(pattern (* x 2) (relu (leaky-relu 0.5 x)) :ruleset r :name \"r/n\")")
    assert text(rule.items[2]) == "((union ?root (compute (relu) (compute (leaky-relu 0.5) x))))"
    assert [text(i) for i in rule.items[3:]] == [":ruleset", "r", ":name", '"r/n"']


def _user_file(tmp_path, body: str) -> Path:
    path = tmp_path / "user.egg"
    path.write_text("; a user family\n(ruleset userfam)\n" + body)
    return path


def test_rules_keep_the_patterns_line_and_name_and_later_forms_keep_theirs(tmp_path):
    path = _user_file(tmp_path, (
        "; x * 1 -> x\n"
        "(pattern (* x 1)\n"
        "         x :ruleset userfam)\n"
        "; x * 2 -> relu x (loaded, never run)\n"
        '(pattern (* x 2) (relu x) :ruleset userfam :name "userfam/two")\n'
        "; relu(relu x) -> relu x\n"
        "(rewrite (compute (relu) (compute (relu) x)) (compute (relu) x) :ruleset userfam)\n"))
    rules = {r.name: r.line for r in RuleLibrary([path]).rulesets["userfam"]}
    assert rules == {"user:4": 4, "userfam/two": 7, "user:9": 9}


def test_a_user_pattern_fires_on_an_imported_model(tmp_path):
    """`x * 1 -> x` in the short form matches the importer's Mul by a Constant 1.0."""
    path = _user_file(tmp_path, "; x * 1 -> x\n(pattern (* x 1) x :ruleset userfam :name \"userfam/times-one\")\n")
    nodes = [helper.make_node("Constant", [], ["one"], value=numpy_helper.from_array(np.array(1.0, np.float32))),
             helper.make_node("Mul", ["one", "x"], ["y"])]
    model = apsat.load_onnx(make_model(nodes, {"x": (2, 3)}, ["y"]))
    eg = EGraph()
    root = eg.add(model.program)
    lib = RuleLibrary([path])
    lib.load_into(eg, ["userfam"])
    report = eg.run(["userfam"], iter_limit=3)
    assert report["rule_matches"].get("userfam/times-one", 0) >= 1
    assert eg.matches("(access (access-tensor x) 2)", root)


def test_a_wrong_user_pattern_is_caught_by_the_rule_check_at_its_line(tmp_path):
    """optimize checks a user file's rules on the model (docs/rules.md): the expansion of
    `x * 2 -> relu x` is unsound there, and the message names the pattern's line."""
    path = _user_file(tmp_path, "; x * 2 -> relu x, wrong\n(pattern (* x 2)\n   (relu x) :ruleset userfam)\n")
    nodes = [helper.make_node("Constant", [], ["two"], value=numpy_helper.from_array(np.array(2.0, np.float32))),
             helper.make_node("Mul", ["x", "two"], ["y"])]
    with pytest.raises(UnsoundRuleError, match=f"^{path}:4: rule 'user:4' is unsound"):
        apsat.optimize(apsat.load_onnx(make_model(nodes, {"x": (2, 3)}, ["y"])), target="gpu", rules=[path])


# ---- errors -----------------------------------------------------------------------------------

DEEP = "(relu " * 101 + "x" + ")" * 101


@pytest.mark.parametrize("body, line, reason", [
    ("(pattern (frob x) (relu x) :ruleset userfam)\n", 3, "unknown element-wise operator 'frob'"),
    ("(pattern (- x)\n (relu x) :ruleset userfam)\n", 3, "'-' takes 2 arguments, got 1"),
    ("(pattern (* x) (relu x) :ruleset userfam)\n", 3, "'*' takes at least 2 arguments, got 1"),
    ("(pattern (relu\n (clip 0 x)) (relu x) :ruleset userfam)\n", 4, "'clip' takes 3 arguments, got 2"),
    ("(pattern (relu x)\n (tanh y) :ruleset userfam)\n", 4, "variable 'y' on the right side is not bound"),
    ("(pattern (relu x) (tanh x))\n", 3, "pattern has no :ruleset"),
    ("(pattern (relu x) (tanh x) :ruleset userfam\n :tolerance -1e-6)\n", 4, "bad :tolerance -1e-6"),
    ("(pattern (relu x) (tanh x) :ruleset userfam :tolerance 1)\n", 3, "bad :tolerance 1"),
    ("(pattern (relu x) (tanh x) :ruleset userfam :tolerance tight)\n", 3, "bad :tolerance tight"),
    ("(pattern (relu x) (tanh x) :ruleset userfam :tolerance)\n", 3, ":tolerance takes a name"),
    ("(pattern (relu x) (tanh x) :ruleset userfam :when ((= x x)))\n", 3, "unknown keyword :when"),
    ("(pattern (relu x) (tanh x) :ruleset nowhere)\n", 3, "unknown ruleset 'nowhere'"),
    ("(pattern (relu x) (tanh x) :ruleset userfam :name plain)\n", 3, ":name takes a string"),
    ("(pattern (relu x) :ruleset userfam)\n", 3, "needs a left and a right side, got 1 parts"),
    ("(pattern x (relu x) :ruleset userfam)\n", 3, "must apply an operator, not be a bare variable"),
    ("(pattern (+ x\n 1e999) x :ruleset userfam)\n", 4, "1e999 is not a finite number"),
    ("(pattern (* x (+ 1 2)) x :ruleset userfam)\n", 3, "over numbers only is one constant at import"),
    ("(pattern (* x tanh) x :ruleset userfam)\n", 3, "'tanh' is an operator"),
    ("(pattern (* x \"s\") x :ruleset userfam)\n", 3, "'\"s\"' is neither a number nor a variable"),
    ("(pattern (clip x 6 x) x :ruleset userfam)\n", 3, "'x' is a float parameter and an expression"),
    ("(pattern (clip (relu x) 6 x) x :ruleset userfam)\n", 3, "parameter is a number or a variable"),
    ("(pattern (relu x) (+ x x) :ruleset userfam)\n", 3, "the right side applies unary maps only, not '+'"),
    ("(pattern (relu x) 2.0 :ruleset userfam)\n", 3, "a number on the right side"),
    (f"(pattern {DEEP} x :ruleset userfam)\n", 3, "nests more than 100 deep"),
])
def test_a_malformed_pattern_is_one_rule_error_at_its_line(tmp_path, capfd, body, line, reason):
    path = _user_file(tmp_path, body)
    with pytest.raises(RuleError) as err:
        RuleLibrary([path])
    message = str(err.value)
    assert message.startswith(f"{path}:{line}: ") and reason in message and "\n" not in message, message
    assert capfd.readouterr().err == ""


def test_the_docs_table_lists_every_operator():
    """docs/rules.md's short-form section names each operator the registry gives."""
    section = DOCS.read_text().split("## Patterns in the short form", 1)[1].split("\n## ", 1)[0]
    missing = [op for op in OPERATORS if f"`{op}`" not in section and f"`{op} " not in section]
    assert not missing, f"docs/rules.md's operator table lacks {missing}"


# ---- the activation spellings -----------------------------------------------------------------

class Nodes:
    """ONNX nodes written one op at a time; constants are Constant nodes of float32 scalars.
    `off` scales every constant within 1e-6 of its key by 1.01 (a spelling with that
    constant wrong)."""

    def __init__(self, off: float | None = None):
        self.nodes, self.off = [], off

    def op(self, kind: str, *inputs: str, **attrs) -> str:
        out = f"t{len(self.nodes)}"
        self.nodes.append(helper.make_node(kind, list(inputs), [out], **attrs))
        return out

    def const(self, value: float) -> str:
        if self.off is not None and math.isclose(value, self.off, rel_tol=1e-6):
            value *= 1.01
        return self.op("Constant", value=numpy_helper.from_array(np.array(value, np.float32)))


def gelu_erf_torch(g, x):          # torch.onnx's Gelu before opset 20: (x * (erf(x / sqrt 2) + 1)) * 0.5
    e = g.op("Erf", g.op("Div", x, g.const(1.4142135623730951)))
    return g.op("Mul", g.op("Mul", x, g.op("Add", e, g.const(1.0))), g.const(0.5))


def gelu_erf_reciprocal(g, x):     # torch's decomposition: a * 0.5 * (1 + erf(a * M_SQRT1_2))
    e = g.op("Erf", g.op("Mul", x, g.const(0.7071067811865476)))
    return g.op("Mul", g.op("Mul", x, g.const(0.5)), g.op("Add", g.const(1.0), e))


def gelu_erf_reciprocal_outermost(g, x):    # the same, written (x * (1 + erf(..))) * 0.5
    e = g.op("Erf", g.op("Mul", x, g.const(0.7071067811865476)))
    return g.op("Mul", g.op("Mul", x, g.op("Add", g.const(1.0), e)), g.const(0.5))


def gelu_erf_halved(g, x):         # tf.nn.gelu: 0.5 * x * (1 + erf(x / 1.4142135623730951))
    e = g.op("Erf", g.op("Div", x, g.const(1.4142135623730951)))
    return g.op("Mul", g.op("Mul", g.const(0.5), x), g.op("Add", g.const(1.0), e))


def _tanh_cdf_inner(g, x, cube):   # tanh(sqrt(2/pi) * (x + 0.044715 * cube)), constants first
    inner = g.op("Add", x, g.op("Mul", g.const(0.044715), cube))
    return g.op("Tanh", g.op("Mul", g.const(math.sqrt(2 / math.pi)), inner))


def gelu_tanh_gpt2(g, x):          # GPT-2: 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * pow(x, 3))))
    t = _tanh_cdf_inner(g, x, g.op("Pow", x, g.const(3.0)))
    return g.op("Mul", g.op("Mul", g.const(0.5), x), g.op("Add", g.const(1.0), t))


def gelu_tanh_pow_outermost(g, x):  # GPT-2's formula written (x * (1 + tanh(..))) * 0.5
    t = _tanh_cdf_inner(g, x, g.op("Pow", x, g.const(3.0)))
    return g.op("Mul", g.op("Mul", x, g.op("Add", g.const(1.0), t)), g.const(0.5))


def gelu_tanh_cubed(g, x):         # GPT-2's, x^3 as JAX's integer_pow writes it: (x * x) * x
    t = _tanh_cdf_inner(g, x, g.op("Mul", g.op("Mul", x, x), x))
    return g.op("Mul", g.op("Mul", g.const(0.5), x), g.op("Add", g.const(1.0), t))


def gelu_tanh_cubed_other_order(g, x):    # the same with x * (x * x), as torch.onnx writes the cube
    t = _tanh_cdf_inner(g, x, g.op("Mul", x, g.op("Mul", x, x)))
    return g.op("Mul", g.op("Mul", g.const(0.5), x), g.op("Add", g.const(1.0), t))


def gelu_tanh_torch(g, x):         # torch.onnx, approximate="tanh": (x * (1 + tanh(...))) * 0.5
    t = _tanh_cdf_inner(g, x, g.op("Mul", x, g.op("Mul", x, x)))
    return g.op("Mul", g.op("Mul", x, g.op("Add", t, g.const(1.0))), g.const(0.5))


def gelu_tanh_jax(g, x):           # JAX: x * cdf, cdf = (1 + tanh(...)) * 0.5, x^3 as (x * x) * x
    t = _tanh_cdf_inner(g, x, g.op("Mul", g.op("Mul", x, x), x))
    return g.op("Mul", x, g.op("Mul", g.op("Add", t, g.const(1.0)), g.const(0.5)))


def _relu6_of_x_plus_3(g, x):      # relu6 exported as Clip with constant bounds (opset 11+)
    return g.op("Clip", g.op("Add", x, g.const(3.0)), g.const(0.0), g.const(6.0))


def hard_sigmoid_div(g, x):        # relu6(x + 3) / 6
    return g.op("Div", _relu6_of_x_plus_3(g, x), g.const(6.0))


def hard_sigmoid_mul(g, x):        # Keras' MobileNetV3: relu6(x + 3) * (1 / 6)
    return g.op("Mul", _relu6_of_x_plus_3(g, x), g.const(1 / 6))


def hard_swish_keras(g, x):        # Keras' MobileNetV3: x * (relu6(x + 3) * (1 / 6))
    return g.op("Mul", x, hard_sigmoid_mul(g, x))


def hard_swish_keras3(g, x):       # Keras 3's hard_silu: x * (relu6(x + 3) / 6)
    return g.op("Mul", x, hard_sigmoid_div(g, x))


def hard_swish_torch13(g, x):      # torch.onnx before opset 14: x * HardSigmoid(x, alpha=1/6)
    return g.op("Mul", x, g.op("HardSigmoid", x, alpha=1 / 6))


def hard_swish_div(g, x):          # torch by hand: x * F.relu6(x + 3) / 6
    return g.op("Div", g.op("Mul", x, _relu6_of_x_plus_3(g, x)), g.const(6.0))


def hard_swish_mul(g, x):          # TF-slim: x * relu6(x + 3) * (1 / 6)
    return g.op("Mul", g.op("Mul", x, _relu6_of_x_plus_3(g, x)), g.const(1 / 6))


def mish_torch(g, x):              # torch.onnx before opset 18: x * tanh(softplus(x))
    return g.op("Mul", x, g.op("Tanh", g.op("Softplus", x)))


def softplus_tf(g, x):             # TF: log(exp(x) + 1)
    return g.op("Log", g.op("Add", g.op("Exp", x), g.const(1.0)))


# (rule, spelling, operator the product fuses with, the constant made wrong for the refusal)
# (rule, spelling, operator, a constant to put 1% off (None: none to), grouped: the
# spelling's constant is not outermost, so the regroup rules bring it to the rule's form)
SPELLINGS = [
    ("fusion/gelu-erf", gelu_erf_torch, "gelu", 1.4142135623730951, False),
    ("fusion/gelu-erf", gelu_erf_halved, "gelu", 0.5, True),
    ("fusion/gelu-erf-reciprocal", gelu_erf_reciprocal, "gelu", 0.7071067811865476, True),
    ("fusion/gelu-erf-reciprocal", gelu_erf_reciprocal_outermost, "gelu", 0.7071067811865476, False),
    ("fusion/gelu-tanh", gelu_tanh_gpt2, "gelu-tanh", 3.0, True),
    ("fusion/gelu-tanh", gelu_tanh_pow_outermost, "gelu-tanh", 3.0, False),
    ("fusion/gelu-tanh-cubed", gelu_tanh_torch, "gelu-tanh", 0.044715, False),
    ("fusion/gelu-tanh-cubed", gelu_tanh_cubed, "gelu-tanh", 0.044715, True),
    ("fusion/gelu-tanh-cubed", gelu_tanh_cubed_other_order, "gelu-tanh", math.sqrt(2 / math.pi), True),
    ("fusion/gelu-tanh-cubed", gelu_tanh_jax, "gelu-tanh", 0.5, True),
    ("fusion/hard-sigmoid-div", hard_sigmoid_div, "hard-sigmoid", 3.0, False),
    ("fusion/hard-sigmoid-mul", hard_sigmoid_mul, "hard-sigmoid", 1 / 6, False),
    ("fusion/hard-swish", hard_swish_torch13, "hard-swish", None, False),     # refused below: alpha 0.2
    ("fusion/hard-swish-div", hard_swish_div, "hard-swish", 6.0, False),
    ("fusion/hard-swish-mul", hard_swish_mul, "hard-swish", 1 / 6, False),
    ("fusion/mish", mish_torch, "mish", None, False),                         # no constant: refused below
    ("fusion/softplus", softplus_tf, "softplus", 1.0, False),
]
REGROUP = ["regroup/constant-outward", "regroup/constant-outward-right"]
IDS = [s[1].__name__ for s in SPELLINGS]


def after_matmul(spelling, off: float | None = None):
    """y = spelling(x @ w), x (3, 16), w (16, 8) an initializer."""
    g = Nodes(off)
    h = g.op("MatMul", "x", "w")
    y = spelling(g, h)
    w = (np.random.default_rng(0).standard_normal((16, 8)) * 0.4).astype(np.float32)
    return make_model(g.nodes, {"x": (3, 16)}, [y], {"w": w})


def imported(model) -> tuple[str, dict]:
    """The imported program as surface text and its tensor shapes (for the harness)."""
    program = apsat.load_onnx(model).program
    return program.to_text(), dict(program.tensor_shapes)


@pytest.mark.parametrize("rule, spelling, op, key, grouped", SPELLINGS, ids=IDS)
def test_the_rule_alone_is_sound_on_the_imported_spelling(rule, spelling, op, key, grouped):
    """The rule alone (with the regroup rules beside it for a grouped spelling) fires and
    every member of the root class equals the original."""
    check_sound(rule, *imported(after_matmul(spelling)), helpers=REGROUP if grouped else ())


def assert_fuses(spelling, op: str):
    """optimize leaves the product and the spelt activation as one `fused-dot-bias-act op`,
    no compute operator beside it, and verifies against onnxruntime."""
    res = apsat.optimize(apsat.load_onnx(after_matmul(spelling)), target="gpu", verify=True)
    terms = list(res.program.terms())
    assert [t.args[0].op for t in terms if t.op == "fused-dot-bias-act"] == [op], res.program.to_text()[:400]
    assert not [t for t in terms if t.op == "compute"], res.program.to_text()[:400]
    assert res.report["verification"]["ok"], res.report["verification"]


@pytest.mark.parametrize("rule, spelling, op, key, grouped", SPELLINGS, ids=IDS)
def test_the_spelling_fuses_into_the_product_and_equals_onnxruntime(rule, spelling, op, key, grouped):
    assert_fuses(spelling, op)


@pytest.mark.parametrize("rule, spelling, op, key, grouped", [s for s in SPELLINGS if s[3] is not None and not s[4]],
                         ids=[i for i, s in zip(IDS, SPELLINGS) if s[3] is not None and not s[4]])
def test_a_constant_off_by_one_percent_is_refused(rule, spelling, op, key, grouped):
    check_refuses(rule, *imported(after_matmul(spelling, off=key)))


@pytest.mark.parametrize("spelling", [hard_swish_keras, hard_swish_keras3], ids=lambda f: f.__name__)
def test_x_times_a_spelt_hard_sigmoid_takes_two_rules_to_hard_swish(spelling):
    """A hard-sigmoid rule makes x * hard-sigmoid(x), which fusion/hard-swish takes."""
    assert_fuses(spelling, "hard-swish")


def test_hard_swish_refuses_another_hard_sigmoid_and_mish_another_operand():
    """HardSigmoid with ONNX's default alpha 0.2 is not hard-swish's; x * tanh(softplus(y))
    is no mish."""
    check_refuses("fusion/hard-swish", *imported(after_matmul(lambda g, x: g.op("Mul", x, g.op("HardSigmoid", x)))))
    check_refuses("fusion/mish", *imported(after_matmul(
        lambda g, x: g.op("Mul", x, g.op("Tanh", g.op("Softplus", g.op("Relu", x)))))))
