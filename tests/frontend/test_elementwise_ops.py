"""The element-wise ONNX ops the language lowers (registry entries in apsat/lang/ops.py,
lowerings in apsat/frontend/lowering.py): each on a one-op model, imported, checked for
its compute operator (never an opaque call) and compared with onnxruntime through the
reference interpreter on seeded inputs that cover where the op is interesting: both signs,
thresholds, ties, zeros, large magnitudes. Then end to end: Conv -> HardSwish fused as a
matmul epilogue on the gpu target, run on the systolic simulator, and a chain of new ops
through the Triton kernels.

Tolerances: rtol 1e-5, atol 1e-6 everywhere (1e-5 both, as tests/test_leaky_relu.py, for the
optimised conv). onnxruntime's exp, log1p, tanh, erf, cos and sin (Eigen, MLAS) differ from
numpy's float32 by an ulp or two, which that covers; the tanh GELU reaches ~1e-6 absolute
near x = 8 (one ulp of the result), also inside rtol. Comparisons, logic, floor, ceil,
sign, abs, min, max, mod and the piecewise-linear activations are exact.

Booleans are float32 0.0/1.0 inside the language. Comparison and logic results are Cast to
FLOAT in these models (onnxruntime's outputs are then floats too); boolean inputs of
Not/And/Or/Xor come from Greater nodes on float inputs.
"""
from __future__ import annotations

import models
from oracles import assert_program_equals
import numpy as np
import pytest
from onnx import TensorProto, helper

import apsat
from apsat.lang.evaluate import evaluate
from apsat.pipeline.zoo import ort_run

TOL = {"rtol": 1e-5, "atol": 1e-6}
# A select computes both branches in numpy: exp overflows, log meets negatives, 1/0, where
# the other branch (or the op's own inf/nan, compared with equal_nan) is the answer.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

# Values every unary case sees besides N(0, 3): thresholds of hard-sigmoid (+-2.5), hard-swish
# (+-3), ties at 0 and +-0.5 (floor/ceil), tiny and huge magnitudes (softplus(100) is 100).
SPECIAL = [0.0, -0.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 3.0, -3.0, 2.99, -2.99, 3.01, -3.01,
           1e-3, -1e-3, 20.0, -20.0, 100.0, -100.0, 2.0, -2.0, 1e-30, -1e-30]


def _mixed(shape, seed, special=SPECIAL):
    """N(0, 3) values with `special` written over the first elements."""
    x = (3 * np.random.default_rng(seed).standard_normal(shape)).astype(np.float32).reshape(-1)
    x[: len(special)] = np.asarray(special, np.float32)[: x.size]
    return x.reshape(shape)


def _ties(shape, seed):
    """Half-integers in [-2, 2]: comparisons meet many equal pairs, and exact zeros."""
    return (np.round(2 * np.random.default_rng(seed).uniform(-2, 2, shape)) / 2).astype(np.float32)


def _divisors(shape, seed):
    """|y| in [0.5, 3] of both signs, and one zero (nan on both sides)."""
    rng = np.random.default_rng(seed)
    y = (rng.choice([-1.0, 1.0], shape) * rng.uniform(0.5, 3.0, shape)).astype(np.float32)
    y.reshape(-1)[0] = 0.0
    return y


def _cast(op, n_inputs, attrs=None):
    """A model: `op` on float inputs x0.. whose (boolean) output is Cast to FLOAT as y."""
    names = [f"x{i}" for i in range(n_inputs)]
    return [helper.make_node(op, names, ["b"], **(attrs or {})),
            helper.make_node("Cast", ["b"], ["y"], to=TensorProto.FLOAT)]


def _logic(op, n_inputs):
    """`op` on booleans x_i > 0, Cast to FLOAT as y."""
    nodes = [helper.make_node("Greater", [f"x{i}", "zero"], [f"g{i}"]) for i in range(n_inputs)]
    nodes.append(helper.make_node(op, [f"g{i}" for i in range(n_inputs)], ["b"]))
    nodes.append(helper.make_node("Cast", ["b"], ["y"], to=TensorProto.FLOAT))
    return nodes


def _unary_case(op, operator, attrs=None, values=_mixed, opset=17, shape=(4, 5, 6)):
    """A one-node case: `op` on x0, expected to lower to compute `operator`."""
    return {"nodes": [helper.make_node(op, ["x0"], ["y"], **(attrs or {}))], "shapes": [shape],
            "values": [values], "operators": {operator}, "opset": opset}


def _binary_case(op, operator, shapes=((3, 1, 5), (4, 1)), values=(_mixed, _mixed), attrs=None,
                 opset=17, nodes=None):
    """A case over several inputs (broadcast by default): `op` on x0, x1, ..., or `nodes`;
    `operator` names the compute operators (one or several) the import must contain."""
    nodes = nodes or [helper.make_node(op, [f"x{i}" for i in range(len(shapes))], ["y"], **(attrs or {}))]
    return {"nodes": nodes, "shapes": list(shapes), "values": list(values),
            "operators": {operator} if isinstance(operator, str) else set(operator), "opset": opset}


def _log_values(shape, seed):
    """Positive values of many magnitudes, plus 0 (-inf) and a negative (nan)."""
    x = np.abs(_mixed(shape, seed, [0.0, 1e-30, 1.0, 100.0, 1e30]))
    x.reshape(-1)[5] = -1.0
    return x


CASES = {
    "HardSwish": _unary_case("HardSwish", "hard-swish"),
    "HardSigmoid": _unary_case("HardSigmoid", "hard-sigmoid"),
    "HardSigmoid-alpha-beta": _unary_case("HardSigmoid", "hard-sigmoid", {"alpha": 0.3, "beta": 0.4}),
    "Elu": _unary_case("Elu", "elu"),
    "Elu-alpha": _unary_case("Elu", "elu", {"alpha": 0.7}),
    "Selu": _unary_case("Selu", "selu"),
    "Selu-alpha-gamma": _unary_case("Selu", "selu", {"alpha": 1.5, "gamma": 2.0}),
    "Softplus": _unary_case("Softplus", "softplus"),
    "Softsign": _unary_case("Softsign", "softsign"),
    "Mish": _unary_case("Mish", "mish", opset=18),
    "Gelu-none": _unary_case("Gelu", "gelu", opset=20),
    "Gelu-tanh": _unary_case("Gelu", "gelu-tanh", {"approximate": "tanh"}, opset=20),
    "Abs": _unary_case("Abs", "abs"),
    "Log": _unary_case("Log", "log", values=_log_values),
    "Reciprocal": _unary_case("Reciprocal", "reciprocal"),
    "Floor": _unary_case("Floor", "floor"),
    "Ceil": _unary_case("Ceil", "ceil"),
    "Cos": _unary_case("Cos", "cos"),
    "Sin": _unary_case("Sin", "sin"),
    "Sign": _unary_case("Sign", "sign"),
    "Neg": _unary_case("Neg", "negative"),
    "Relu": _unary_case("Relu", "relu"),
    "PRelu-per-channel": _binary_case("PRelu", "prelu", shapes=((2, 3, 4, 5), (3, 1, 1))),
    "PRelu-last-axis": _binary_case("PRelu", "prelu", shapes=((2, 3, 5), (5,))),
    "Max-2-broadcast": _binary_case("Max", "elementwise-max", values=(_ties, _ties)),
    "Max-3": _binary_case("Max", "elementwise-max", shapes=((3, 1, 5), (4, 1), (5,)), values=(_ties,) * 3),
    "Max-1": _binary_case("Max", (), shapes=((3, 4),), values=(_ties,)),    # Max(x) is x: no compute
    "Min-3": _binary_case("Min", "elementwise-min", shapes=((3, 1, 5), (4, 1), (5,)), values=(_ties,) * 3),
    "Mod-fmod": _binary_case("Mod", "elementwise-fmod", values=(_mixed, _divisors), attrs={"fmod": 1}),
    # fmod=0 on floats is ONNX Mod-28's (onnxruntime refuses it before opset 28)
    "Mod-floor": _binary_case("Mod", "elementwise-mod", values=(_mixed, _divisors), opset=28),
    "Equal": _binary_case("Equal", "equal", values=(_ties, _ties), nodes=_cast("Equal", 2)),
    "Less": _binary_case("Less", "less", values=(_ties, _ties), nodes=_cast("Less", 2)),
    "LessOrEqual": _binary_case("LessOrEqual", "less-equal", values=(_ties, _ties),
                                nodes=_cast("LessOrEqual", 2)),
    "Greater": _binary_case("Greater", "greater", values=(_ties, _ties), nodes=_cast("Greater", 2)),
    "GreaterOrEqual": _binary_case("GreaterOrEqual", "greater-equal", values=(_ties, _ties),
                                   nodes=_cast("GreaterOrEqual", 2)),
    "Not": _binary_case("Not", ("logical-not", "greater"), shapes=((4, 5),), values=(_ties,),
                        nodes=_logic("Not", 1)),
    "And": _binary_case("And", ("logical-and", "greater"), values=(_ties, _ties), nodes=_logic("And", 2)),
    "Or": _binary_case("Or", ("logical-or", "greater"), values=(_ties, _ties), nodes=_logic("Or", 2)),
    "Xor": _binary_case("Xor", ("logical-xor", "greater"), values=(_ties, _ties), nodes=_logic("Xor", 2)),
    "Where-of-Less": _binary_case("Where", ("select", "less"), values=(_ties, _ties), nodes=[
        helper.make_node("Less", ["x0", "x1"], ["c"]), helper.make_node("Where", ["c", "x0", "x1"], ["y"])]),
}


def _model(case):
    """The case's ONNX model (inputs x0, x1, ...; a `zero` weight for the logic cases)."""
    inputs = {f"x{i}": s for i, s in enumerate(case["shapes"])}
    uses_zero = any("zero" in n.input for n in case["nodes"])
    weights = {"zero": np.zeros((), np.float32)} if uses_zero else None
    return models.make_model(case["nodes"], inputs, ["y"], weights, opset=case["opset"])


def _compute_operators(program) -> set[str]:
    return {t.args[0].op for t in program.terms() if t.op == "compute"}


@pytest.mark.parametrize("name", sorted(CASES))
def test_lowered_op_equals_onnxruntime(name):
    case = CASES[name]
    proto = _model(case)
    model = apsat.load_onnx(proto)
    assert not model.program.opaque_nodes, f"{name}: opaque calls {model.opaque_ops()}"
    assert not any(t.op == "opaque" for t in model.program.terms())
    assert case["operators"] <= _compute_operators(model.program), _compute_operators(model.program)
    inputs = {f"x{i}": make(s, seed=10 * i + len(name))
              for i, (s, make) in enumerate(zip(case["shapes"], case["values"]))}
    got = evaluate(model.program, {**model.weights, **inputs})
    got = got["y"] if isinstance(got, dict) else got
    want = ort_run(proto, inputs)["y"]
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want.astype(np.float32), equal_nan=True, err_msg=name, **TOL)


@pytest.mark.parametrize("op, attrs, opset, bad", [
    ("Gelu", {"approximate": "fast"}, 20, "approximate"),
    ("Mod", {"fmod": 2}, 17, "fmod"),
])
def test_bad_attributes_name_themselves(op, attrs, opset, bad):
    from apsat.errors import ModelError

    proto = models.single_op(op, [(2, 3)] * (2 if op == "Mod" else 1), attrs, opset=opset)
    with pytest.raises(ModelError, match=bad):
        apsat.load_onnx(proto)


def test_softplus_and_mish_do_not_overflow():
    """e**x overflows float32 beyond x ~ 88: the formulas select the branch that does not."""
    proto = models.single_op("Softplus", [(6,)])
    x = np.array([100.0, 89.0, 1000.0, -100.0, -1000.0, 0.0], np.float32)
    got = apsat.load_onnx(proto).run({"x0": x})["y0"]
    np.testing.assert_array_equal(got[:3], x[:3])
    assert got[3] > 0 and got[4] == 0 and got[5] == np.float32(np.log(2.0))
    mish = apsat.load_onnx(models.single_op("Mish", [(6,)], opset=18)).run({"x0": x})["y0"]
    np.testing.assert_allclose(mish, ort_run(models.single_op("Mish", [(6,)], opset=18), {"x0": x})["y0"],
                               **TOL)


# ---- end to end ------------------------------------------------------------------------------

def conv_hard_swish():
    """Conv (bias, padding 1) -> HardSwish, NCHW."""
    rng = np.random.default_rng(0)
    w = {"w": (rng.standard_normal((6, 3, 3, 3)) / np.sqrt(27) * 4).astype(np.float32),
         "b": (0.5 * rng.standard_normal(6)).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("HardSwish", ["c"], ["y"])]
    return models.make_model(nodes, {"x": (1, 3, 9, 9)}, ["y"], w)


def _inputs(model, seed=0):
    return {n: (2 * np.random.default_rng(seed).standard_normal(d)).astype(np.float32)
            for n, d in model.inputs.items()}


@pytest.mark.parametrize("target", ["gpu", "systolic:32x32"])
def test_conv_hard_swish_optimised_equals_onnxruntime(target):
    res = apsat.optimize(conv_hard_swish(), target=target, verify=False)
    inputs = _inputs(res.model)
    want = ort_run(res.model.onnx, inputs)["y"]
    tol = {"rtol": 1e-5, "atol": 1e-5}       # a 27-term convolution, summed in another order
    assert_program_equals(res, {**res.model.weights, **inputs}, want, target, **tol)
    ops = {f"{t.op} {t.args[0].op}" for t in res.program.terms() if t.op in ("compute", "fused-dot-bias-act")}
    if target == "gpu":
        assert "fused-dot-bias-act hard-swish" in ops and "compute hard-swish" not in ops, ops


def new_ops_chain():
    """Where(Greater(x, y), x, y) -> Softplus -> Mod(., 0.7, fmod=1) -> Cos -> Mul by
    Sign(x) -> Max with HardSigmoid(y): element-wise kernels of several new operators."""
    nodes = [helper.make_node("Greater", ["x", "y"], ["g"]),
             helper.make_node("Where", ["g", "x", "y"], ["w"]),
             helper.make_node("Softplus", ["w"], ["s"]),
             helper.make_node("Mod", ["s", "k"], ["m"], fmod=1),
             helper.make_node("Cos", ["m"], ["c"]),
             helper.make_node("Sign", ["x"], ["sx"]),
             helper.make_node("Mul", ["c", "sx"], ["p"]),
             helper.make_node("HardSigmoid", ["y"], ["h"], alpha=0.3, beta=0.4),
             helper.make_node("Max", ["p", "h"], ["out"])]
    return models.make_model(nodes, {"x": (3, 17), "y": (3, 17)}, ["out"], {"k": np.array(0.7, np.float32)})


def test_triton_kernels_of_new_ops_equal_onnxruntime():
    pytest.importorskip("torch", reason="the GPU backend needs torch (pip install apsat[gpu])")
    pytest.importorskip("triton", reason="the GPU backend needs triton (pip install apsat[gpu])")
    from apsat.backends.gpu.lower import lower
    from apsat.backends.gpu.runner import run_kernels as run

    res = apsat.optimize(new_ops_chain(), target="gpu", verify=False)
    assert not res.program.opaque_nodes
    graph = lower(res.program)
    assert not graph.host_steps and graph.kernels
    inputs = _inputs(res.model, 1)
    got = run(res.program, {**res.model.weights, **inputs})
    got = got["out"] if isinstance(got, dict) else got
    got = got.numpy() if hasattr(got, "numpy") else np.asarray(got)
    np.testing.assert_allclose(got, ort_run(res.model.onnx, inputs)["out"], **TOL)
