"""The `norm-fusion` rules (apsat/rules/norm-fusion.egg): RMSNorm as exporters write it
becomes `rms-norm`, soundly (harness tolerance rtol 1e-4 / atol 1e-5), and look-alikes
(another exponent, the mean over another axis) are refused. Each spelling an exporter
writes: the square as Pow(x, 2) or Mul(x, x); x times 1 / d as Div(1, d) or Reciprocal(d),
or x divided by d. The spelling rules (`square`, `reciprocal`) are sound on their own;
then end to end, ONNX models in every spelling become one `rms-norm` and equal
onnxruntime, on both targets' default plans."""

import numpy as np
import onnxruntime as ort
import pytest
from harness import check_reaches, check_refuses, check_sound
from models import make_model
from onnx import helper

import apsat
from apsat.lang.evaluate import evaluate

SHAPES = {"x": (1, 5, 8)}
X = "(access (access-tensor x) 3)"
HELPERS = ["norm-fusion/aux-rms-denominator"]
RMS_NORM = "(access (compute (rms-norm 1e-06) (access ?x 2)) 3)"


def lit(value: float, reshape: str = "(shape 1 1 1)", target: str = "(shape 1 5 8)") -> str:
    return (f"(access-broadcast (access-reshape (access-literal {value}) (access-shape {reshape} (shape))) "
            f"(access-shape {target} (shape)))")


def rms(power: float | None = None, axis: int = 2, eps: float = 1e-6, inverse: str = "reciprocal") -> str:
    """RMSNorm of x over `axis`.. as the importer writes it: the square x * x (or x ** power),
    then x * reciprocal(d) ("reciprocal"), x * (1 / d) ("div-one") or x / d ("divide")."""
    mean_shape = "(shape 1 5 1)" if axis == 2 else "(shape 1 1 1)"
    square = (f"(compute elementwise-mul (access-pair {X} {X}))" if power is None
              else f"(compute elementwise-pow (access-pair {X} {lit(power)}))")
    mean = (f"(access-reshape (compute reduce-mean (access {square} {axis})) "
            f"(access-shape {mean_shape} (shape)))")
    d = f"(compute sqrt (compute elementwise-add (access-pair {mean} {lit(eps, target=mean_shape)})))"
    if inverse == "divide":
        return f"(compute elementwise-div (access-pair {X} (access-broadcast {d} (access-shape (shape 1 5 8) (shape)))))"
    inv = (f"(compute reciprocal {d})" if inverse == "reciprocal"
           else f"(compute elementwise-div (access-pair {lit(1.0, target=mean_shape)} {d}))")
    return f"(compute elementwise-mul (access-pair {X} (access-broadcast {inv} (access-shape (shape 1 5 8) (shape)))))"


# ---- the rules alone ----------------------------------------------------------------------

@pytest.mark.parametrize("rule,inverse", [("norm-fusion/rms", "reciprocal"), ("norm-fusion/rms-divided", "divide")])
def test_rms_sound_and_reach(rule, inverse):
    assert check_sound(rule, rms(inverse=inverse), SHAPES, helpers=HELPERS) >= 2
    check_reaches(rule, rms(inverse=inverse), SHAPES, RMS_NORM, helpers=HELPERS)


@pytest.mark.parametrize("rule,inverse", [("norm-fusion/rms", "reciprocal"), ("norm-fusion/rms-divided", "divide")])
def test_rms_needs_its_denominator_helper(rule, inverse):
    check_refuses(rule, rms(inverse=inverse), SHAPES)


def test_rms_refuses_the_unnormalised_spellings():
    """The main rule reads one form: Pow's square and Div(1, d) reach it through the
    spelling rules (test_every_spelling_fuses_from_onnx), not by themselves."""
    check_refuses("norm-fusion/rms", rms(power=2.0), SHAPES, helpers=HELPERS)
    check_refuses("norm-fusion/rms", rms(inverse="div-one"), SHAPES, helpers=HELPERS)


def test_rms_refuses_a_mean_over_more_than_the_last_axis():
    check_refuses("norm-fusion/rms", rms(axis=1), SHAPES, helpers=HELPERS)
    check_refuses("norm-fusion/rms-divided", rms(axis=1, inverse="divide"), SHAPES, helpers=HELPERS)


# (rule, the spelling it reads, what it writes, the same spelling with another constant)
NORMALISERS = [
    ("norm-fusion/square", f"(compute elementwise-pow (access-pair {X} {lit(2.0)}))",
     f"(compute elementwise-mul (access-pair {X} {X}))", f"(compute elementwise-pow (access-pair {X} {lit(3.0)}))"),
    ("norm-fusion/reciprocal", f"(compute elementwise-div (access-pair {lit(1.0)} {X}))",
     f"(compute reciprocal {X})", f"(compute elementwise-div (access-pair {lit(2.0)} {X}))"),
]


@pytest.mark.parametrize("rule, text, written, other", NORMALISERS, ids=[n[0] for n in NORMALISERS])
def test_normaliser_sound_reaches_and_refuses_another_constant(rule, text, written, other):
    assert check_sound(rule, text, SHAPES) >= 2
    check_reaches(rule, text, SHAPES, written)
    check_refuses(rule, other, SHAPES)


def test_square_keeps_special_values():
    """pow(x, 2) and x * x agree at NaN, ±inf, ±0 and float32's extremes (NaN, +inf, +0)."""
    root_text = f"(compute elementwise-pow (access-pair {X} {lit(2.0)}))"
    special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -3.4e38, 2.5], np.float32)
    x = np.resize(special, (1, 5, 8)).astype(np.float32)
    want = evaluate(apsat.parse(root_text, SHAPES), {"x": x})
    got = evaluate(apsat.parse(f"(compute elementwise-mul (access-pair {X} {X}))", SHAPES), {"x": x})
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert np.array_equal(got[~np.isnan(got)], want[~np.isnan(want)])
    assert not np.signbit(got[got == 0]).any() and not np.signbit(want[want == 0]).any()




# ---- end to end: ONNX models in each spelling ------------------------------------------------

def _rms_model(square: str, inverse: str, eps: float = 1e-6):
    """y = RMSNorm(x) * gamma over the last axis of x (2, 5, 16), written with `square`
    ("Pow" or "Mul") and `inverse` ("Div-one": x * Div(1, d), "Reciprocal": x *
    Reciprocal(d), "Div": Div(x, d)); the constants are initializers."""
    rng = np.random.default_rng(0)
    weights = {"two": np.array(2.0, np.float32), "eps": np.array(eps, np.float32),
               "one": np.array(1.0, np.float32), "axes": np.array([-1], np.int64),
               "gamma": (1 + 0.1 * rng.standard_normal(16)).astype(np.float32)}
    sq = (helper.make_node("Pow", ["x", "two"], ["sq"]) if square == "Pow"
          else helper.make_node("Mul", ["x", "x"], ["sq"]))
    nodes = [sq, helper.make_node("ReduceMean", ["sq", "axes"], ["m"], keepdims=1),
             helper.make_node("Add", ["m", "eps"], ["me"]), helper.make_node("Sqrt", ["me"], ["d"])]
    if inverse == "Div":
        nodes.append(helper.make_node("Div", ["x", "d"], ["n"]))
    else:
        nodes.append(helper.make_node("Reciprocal", ["d"], ["inv"]) if inverse == "Reciprocal"
                     else helper.make_node("Div", ["one", "d"], ["inv"]))
        nodes.append(helper.make_node("Mul", ["x", "inv"], ["n"]))
    nodes.append(helper.make_node("Mul", ["n", "gamma"], ["y"]))
    return make_model(nodes, {"x": (2, 5, 16)}, ["y"], weights, opset=18)


def _ops(program) -> list[str]:
    """The compute operators of `program`, one per compute term."""
    return [t.args[0].op for t in program.terms() if t.op == "compute"]


@pytest.mark.parametrize("square", ["Pow", "Mul"])
@pytest.mark.parametrize("inverse", ["Div-one", "Reciprocal", "Div"])
def test_every_spelling_fuses_from_onnx(square, inverse):
    """One rms-norm and no square root left after optimize; the program equals onnxruntime
    (rtol 1e-5, atol 1e-6: rms-norm sums the squares in another order than ReduceMean)."""
    model = _rms_model(square, inverse)
    m = apsat.load_onnx(model)
    res = apsat.optimize(m, target="gpu", verify=True)
    ops = _ops(res.program)
    assert ops.count("rms-norm") == 1 and "sqrt" not in ops and "reduce-mean" not in ops, ops
    x = np.random.default_rng(1).standard_normal((2, 5, 16)).astype(np.float32)
    got = evaluate(res.program, {**m.weights, "x": x})
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert res.report["verification"]["ok"]


def test_llama_spelling_fuses_on_the_systolic_plan():
    """Mul(x, x) and Div(x, d), as benchmarks/scale_models.py writes RMSNorm: the systolic
    plan has no algebra phase, and norm-fusion's own spelling rules still bring it to
    rms-norm."""
    m = apsat.load_onnx(_rms_model("Mul", "Div"))
    res = apsat.optimize(m, target="systolic:8x8", verify=True)
    assert _ops(res.program).count("rms-norm") == 1
    assert res.report["verification"]["ok"]
