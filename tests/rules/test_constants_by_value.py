"""A rule matches a constant by its value whatever its source: a constant holding one value
becomes a literal at import (apsat/frontend/constants.py): one element wherever it is
read, and more elements all equal (a [N] or [1, 1, N] tensor, what some exporters write
instead of a scalar, or a value folded at import) where element-wise arithmetic reads it.
Operand order does not matter (apsat/rules/commute.py). The erf-GELU after a MatMul fuses
into the product's atom with its 1.414 / 1 / 0.5 as Constant nodes, initializers,
equal-valued tensors or folded values, each on either side of its operator; the result
equals onnxruntime (apsat.pipeline.verify's float64 rule, and directly: rtol 1e-5, atol
1e-6, the fused gelu rounding differently from the chain by a few ulps). Shapes, indices
and special values (NaN, ±inf, -0.0: docs/special-values.md) keep their meaning."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from models import make_model
from onnx import TensorProto, helper, numpy_helper

import apsat
from apsat.frontend import constants
from apsat.lang.evaluate import evaluate

SOURCES = ["constant", "initializer", "vector", "row-tensor", "folded"]


def _const_node(name: str, value) -> helper.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value)))


def _gelu_after_matmul(source: str, constants_first: bool):
    """y = gelu_erf(x @ w): x * 0.5 * (1 + erf(x / 1.4142135)), its three constants given
    as `source`: "constant" nodes or "initializer"s of one element; initializers of 24
    equal elements shaped [24] ("vector") or [1, 1, 24] ("row-tensor", x then (1, 3, 16));
    or "folded" at import (Sqrt of a Constant 2, a ConstantOfShape fill [24] of 1, an
    Expand of a Constant 0.5 to [1, 24]). Written left of each operator when
    `constants_first`. Returns (model, input dims)."""
    rng = np.random.default_rng(0)
    weights = {"w": (rng.standard_normal((16, 24)) * 0.3).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"])]
    values = {"c_sqrt2": 1.4142135, "c_one": 1.0, "c_half": 0.5}
    dims = {"vector": (24,), "row-tensor": (1, 1, 24)}.get(source)
    for name, v in values.items():
        if source == "initializer":
            weights[name] = np.array(v, np.float32)
        elif dims is not None:
            weights[name] = np.full(dims, v, np.float32)
        elif source == "constant":
            nodes.append(_const_node(name, np.array(v, np.float32)))
    if source == "folded":
        nodes += [_const_node("two", np.array(2.0, np.float32)), helper.make_node("Sqrt", ["two"], ["c_sqrt2"]),
                  _const_node("n", np.array([24], np.int64)),
                  helper.make_node("ConstantOfShape", ["n"], ["c_one"],
                                   value=numpy_helper.from_array(np.array([1.0], np.float32))),
                  _const_node("half", np.array(0.5, np.float32)), _const_node("row", np.array([1, 24], np.int64)),
                  helper.make_node("Expand", ["half", "row"], ["c_half"])]

    def op(kind, a, b, out):
        nodes.append(helper.make_node(kind, [b, a] if constants_first and kind != "Div" else [a, b], [out]))

    op("Div", "h", "c_sqrt2", "s")
    nodes.append(helper.make_node("Erf", ["s"], ["e"]))
    op("Add", "e", "c_one", "e1")
    op("Mul", "h", "e1", "m")
    op("Mul", "m", "c_half", "y")
    x_dims = (1, 3, 16) if source == "row-tensor" else (3, 16)
    return make_model(nodes, {"x": x_dims}, ["y"], weights), x_dims


def _onnxruntime(model, feeds: dict) -> list:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("constants_first", [False, True])
def test_erf_gelu_fuses_whatever_the_constants_source_and_order(source, constants_first):
    model, x_dims = _gelu_after_matmul(source, constants_first)
    m = apsat.load_onnx(model)
    res = apsat.optimize(m, target="gpu", verify=True)
    acts = [t.args[0].op for t in res.program.terms() if t.op == "fused-dot-bias-act"]
    assert acts == ["gelu"], res.program.to_text()[:400]
    assert res.report["verification"]["ok"]
    x = np.random.default_rng(1).standard_normal(x_dims).astype(np.float32)
    got = evaluate(res.program, {**m.weights, "x": x})
    want = _onnxruntime(model, {"x": x})[0]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("source", ["initializer", "vector", "row-tensor", "folded"])
def test_a_constant_holding_one_value_is_a_literal(source):
    """Whatever its shape or source, the constant is a literal and no weight: only the
    MatMul's w is left."""
    m = apsat.load_onnx(_gelu_after_matmul(source, False)[0])
    assert set(m.weights) == {"w"}
    literals = {t.args[0] for t in m.program.terms() if t.op == "access-literal"}
    assert {1.0, 0.5} <= literals and any(abs(v - 1.4142135) < 1e-6 for v in literals)


def test_a_constant_folded_from_constants_is_a_literal():
    """sqrt(2 / pi) computed by Div and Sqrt of Constant nodes (GPT-2's gelu-tanh as some
    exporters write it) folds at import to the literal the gelu-tanh rule matches."""
    nodes = [_const_node("two", np.array(2.0, np.float32)), _const_node("pi", np.array(np.pi, np.float32)),
             helper.make_node("Div", ["two", "pi"], ["r"]), helper.make_node("Sqrt", ["r"], ["c"])]
    for name, v in {"half": 0.5, "one": 1.0, "k": 0.044715, "three": 3.0}.items():
        nodes.append(_const_node(name, np.array(v, np.float32)))
    for kind, a, b, out in [("Pow", "x", "three", "x3"), ("Mul", "x3", "k", "kx3"), ("Add", "x", "kx3", "inner"),
                            ("Mul", "inner", "c", "arg")]:
        nodes.append(helper.make_node(kind, [a, b], [out]))
    nodes.append(helper.make_node("Tanh", ["arg"], ["t"]))
    for kind, a, b, out in [("Add", "t", "one", "t1"), ("Mul", "x", "half", "xh"), ("Mul", "xh", "t1", "y")]:
        nodes.append(helper.make_node(kind, [a, b], [out]))
    model = make_model(nodes, {"x": (3, 16)}, ["y"])
    m = apsat.load_onnx(model)
    assert not m.weights
    assert any(t.op == "access-literal" and abs(t.args[0] - 0.7978846) < 1e-6 for t in m.program.terms())
    res = apsat.optimize(m, target="gpu", verify=True)
    ops = [t.args[0].op for t in res.program.terms() if t.op == "compute"]
    assert ops == ["gelu-tanh"], ops
    x = np.random.default_rng(2).standard_normal((3, 16)).astype(np.float32)
    np.testing.assert_allclose(evaluate(res.program, {"x": x}), _onnxruntime(model, {"x": x})[0],
                               rtol=1e-5, atol=1e-6)


def _check_against_onnxruntime(model, feeds: dict, exact: bool = False):
    """The imported program (before any rule) on `feeds` equals onnxruntime: same shape,
    NaN at the same places, the same sign where both are zero, values within rtol 1e-6
    (`exact`: bit for bit). Returns the imported model."""
    m = apsat.load_onnx(model)
    got = evaluate(m.program, {**m.weights, **feeds})
    want = _onnxruntime(model, feeds)[0]
    assert got.shape == want.shape
    if exact:
        assert np.array_equal(got.view(np.int32), want.astype(np.float32).view(np.int32))
    else:
        np.testing.assert_allclose(got, want, rtol=1e-6)
    return m


def test_a_constant_larger_than_the_other_operand_keeps_the_output_dims():
    """x (1, 8) + c (4, 8) of 0.5 is (4, 8): the literal is laid over c's dims, then over
    the output."""
    model = make_model([helper.make_node("Add", ["x", "c"], ["y"])], {"x": (1, 8)}, ["y"],
                       {"c": np.full((4, 8), 0.5, np.float32)})
    x = np.random.default_rng(0).standard_normal((1, 8)).astype(np.float32)
    m = _check_against_onnxruntime(model, {"x": x}, exact=True)
    assert not m.weights and {t.args[0] for t in m.program.terms() if t.op == "access-literal"} == {0.5}


def test_integer_shapes_and_indices_stay_tensors():
    """An equal-valued int64 shape ([4, 4]) still reshapes, equal-valued indices
    ([1, 1, 1]) still gather, and no literal 4 or 1 appears: only element-wise values
    become literals."""
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]),
             helper.make_node("Gather", ["r", "idx"], ["y"], axis=1)]
    model = make_model(nodes, {"x": (16,)}, ["y"], {"shape": np.array([4, 4], np.int64),
                                                    "idx": np.array([1, 1, 1], np.int64)})
    x = np.arange(16, dtype=np.float32)
    m = _check_against_onnxruntime(model, {"x": x}, exact=True)
    assert not any(t.op == "access-literal" for t in m.program.terms())


def test_integer_arithmetic_reads_an_equal_valued_tensor_as_a_literal():
    """Int64 data (a Cast of x) plus an int64 [8] of 3: the Add, exact on float32-carried
    integers, reads the 3 as a literal; the result equals onnxruntime exactly."""
    nodes = [helper.make_node("Cast", ["x"], ["i"], to=TensorProto.INT64),
             helper.make_node("Add", ["i", "three"], ["s"]),
             helper.make_node("Cast", ["s"], ["y"], to=TensorProto.FLOAT)]
    model = make_model(nodes, {"x": (2, 8)}, ["y"], {"three": np.full((8,), 3, np.int64)})
    x = (np.random.default_rng(0).standard_normal((2, 8)) * 10).astype(np.float32)
    m = _check_against_onnxruntime(model, {"x": x}, exact=True)
    assert "three" not in m.weights
    assert any(t.op == "access-literal" and t.args[0] == 3.0 for t in m.program.terms())


def test_a_zero_bias_stays_a_tensor_the_bias_rules_fuse():
    """MatMul + a [24] bias of zeros (a freshly initialised Linear) + erf-GELU: the zeros
    stay a weight, which fusion/bias reads as a per-channel vector, so the three become one
    fused-dot-bias-act gelu, equal to onnxruntime (rtol 1e-5, atol 1e-6)."""
    model, _ = _gelu_after_matmul("constant", False)
    add = helper.make_node("Add", ["h0", "bias"], ["h"])
    model.graph.node[0].output[0] = "h0"
    model.graph.node.insert(1, add)
    model.graph.initializer.append(numpy_helper.from_array(np.zeros(24, np.float32), "bias"))
    m = apsat.load_onnx(model)
    assert "bias" in m.weights
    res = apsat.optimize(m, target="gpu", verify=True)
    acts = [t.args[0].op for t in res.program.terms() if t.op == "fused-dot-bias-act"]
    assert acts == ["gelu"], res.program.to_text()[:400]
    x = np.random.default_rng(3).standard_normal((3, 16)).astype(np.float32)
    np.testing.assert_allclose(evaluate(res.program, {**m.weights, "x": x}), _onnxruntime(model, {"x": x})[0],
                               rtol=1e-5, atol=1e-6)


# ---- special values stay weights ------------------------------------------------------------

SPECIAL_X = np.array([[-0.0, 0.0, 1.5, -2.0, np.inf, -np.inf, 3.0, -0.0]], np.float32)


@pytest.mark.parametrize("fill,kind", [
    (-0.0, "[8] of -0.0"), (-0.0, "scalar -0.0"), (np.inf, "[8] of +inf"), (-np.inf, "[8] of -inf"),
    (None, "0.0 and -0.0 mixed"), (np.nan, "Constant [8] of NaN")])
def test_special_values_keep_their_meaning(fill, kind):
    """x + c where c holds -0.0 (x + -0.0 is x: a -0 stays -0, where + 0.0 gives +0), ±inf
    or NaN, or mixes 0.0 and -0.0 (two values): c stays a weight, never a literal, and the
    sum equals onnxruntime bit for bit. A -0.0 literal would be the same node as 0.0 (terms
    and egglog compare literals by value)."""
    if kind.startswith("scalar"):
        c = np.array(fill, np.float32)
    elif fill is None:
        c = np.array([0.0, -0.0] * 4, np.float32)
    else:
        c = np.full((8,), fill, np.float32)
    if kind.startswith("Constant"):       # initializers holding NaN are refused at import
        model = make_model([_const_node("c", c), helper.make_node("Add", ["x", "c"], ["y"])], {"x": (1, 8)}, ["y"])
    else:
        model = make_model([helper.make_node("Add", ["x", "c"], ["y"])], {"x": (1, 8)}, ["y"], {"c": c})
    m = apsat.load_onnx(model)
    assert not any(t.op == "access-literal" for t in m.program.terms()), kind
    got = evaluate(m.program, {**m.weights, "x": SPECIAL_X})
    want = _onnxruntime(model, {"x": SPECIAL_X})[0]
    assert np.array_equal(got.view(np.int32), want.view(np.int32)) or (
        np.array_equal(np.isnan(got), np.isnan(want)) and np.array_equal(got[~np.isnan(got)], want[~np.isnan(want)]))


def test_minus_zero_beside_plus_zero_stays_apart():
    """x + (-0.0) and x + 0.0 in one model, both scalars: the first keeps x's -0, the second
    gives +0 there; through optimize and against onnxruntime, bit for bit."""
    nodes = [_const_node("nz", np.array(-0.0, np.float32)), _const_node("pz", np.array(0.0, np.float32)),
             helper.make_node("Add", ["x", "nz"], ["a"]), helper.make_node("Add", ["x", "pz"], ["b"]),
             helper.make_node("Concat", ["a", "b"], ["y"], axis=0)]
    model = make_model(nodes, {"x": (1, 8)}, ["y"])
    m = apsat.load_onnx(model)
    res = apsat.optimize(m, target="gpu")
    got = evaluate(res.program, {**m.weights, "x": SPECIAL_X})
    want = _onnxruntime(model, {"x": SPECIAL_X})[0]
    assert np.signbit(want[0, 0]) and not np.signbit(want[1, 0])       # the case is the one meant
    assert np.array_equal(got.view(np.int32), want.view(np.int32))


# ---- the equality check itself --------------------------------------------------------------

def test_repeated_value_reads_a_broadcast_fill_once():
    """A ConstantOfShape fill is a read-only view with strides 0: 2**40 elements in no
    memory, checked by reading one."""
    fill = np.broadcast_to(np.float32(0.25), (1 << 20, 1 << 20))
    assert constants.repeated_value(fill) == 0.25


def test_repeated_value_scans_every_element():
    """One element that differs, anywhere (here past the sampled ones and the first chunk),
    and the tensor holds two values; -0.0 among +0.0 is another value; 0-D and [1, 1]
    tensors are their element; NaN, inf and -0.0 are no literal."""
    a = np.full(3 * constants.CHUNK + 7, 0.5, np.float32)
    assert constants.repeated_value(a) == 0.5
    a[constants.CHUNK + 12345] = 0.25
    assert constants.repeated_value(a) is None
    z = np.zeros(1000, np.float32)
    z[501] = -0.0
    assert constants.repeated_value(z) is None
    assert constants.repeated_value(np.zeros(1000, np.float32)) == 0.0
    assert constants.repeated_value(np.array(2.0, np.float32)) == 2.0
    assert constants.repeated_value(np.full((1, 1), 7, np.int64)) == 7.0
    for v in (np.nan, np.inf, -np.inf, -0.0):
        assert constants.repeated_value(np.full(4, v, np.float32)) is None


def test_repeated_value_skips_a_large_strided_view():
    """A non-contiguous view (a folded Transpose of a weight) over MAX_STRIDED elements is
    not compared: that would take a temporary of its size; a small one is."""
    small = np.full((64, 32), 3.0, np.float32).T
    assert not small.flags.c_contiguous and constants.repeated_value(small) == 3.0
    big = np.zeros(2 * (constants.MAX_STRIDED + 1), np.uint8)[::2]      # every other byte: strided
    assert not big.flags.c_contiguous and constants.repeated_value(big) is None
    assert constants.repeated_value(np.ascontiguousarray(big)) == 0.0
