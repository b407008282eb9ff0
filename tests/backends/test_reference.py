"""The reference interpreter against independent numpy formulations, one construct at a time.

Tolerances: data-movement ops (access, transpose, windows, pad, ...) copy or view values, so
they are compared exactly. Arithmetic runs in float32 in the interpreter and in float64 in
the references here; a float32 sum of n terms of size ~1 is off by ~n * 6e-8 relative, so
sums of up to a few hundred terms are checked at rtol 1e-5 / atol 1e-6 (TOL), and the one
transcendental chain (LRN's power) at rtol 1e-5 / atol 1e-6 as well. erf goes through
float64 math.erf, so it is checked to 1e-7 absolute (float32 rounding of values in [-1, 1]
is at most 6e-8).
"""
from __future__ import annotations

import math
import tracemalloc

import numpy as np

import pytest
from onnx import TensorProto, helper

import apsat
from apsat.lang import opaque_eval
from apsat.lang import semantics as compute_semantics
from apsat.lang.evaluate import COMPUTE_EVALUATORS, EVALUATORS, EvaluationError, evaluate
from apsat.lang.ops import COMPUTE_OPS, OPS
from apsat.lang.program import OpaqueNode, Program
from apsat.lang.syntax import parse_term

TOL = dict(rtol=1e-5, atol=1e-6)
OPSETS = (("", 17),)


def rng(seed=0):
    return np.random.default_rng(seed)


def run(text: str, **tensors):
    """Parse `text` with the tensors' shapes, evaluate, and check the result has the dims
    of the program's access shape (iterated ++ item)."""
    prog = apsat.parse(text, shapes={k: v.shape for k, v in tensors.items()})
    out = evaluate(prog, tensors)
    it, item = prog.shape
    assert out.shape == it + item and out.dtype == np.float32
    return out


def conv_ref(x, w, stride=1, dil=1, pad=0, groups=1):
    """Direct convolution by explicit loops over output positions (float64)."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    ho = (h + 2 * pad - dil * (kh - 1) - 1) // stride + 1
    wo = (wd + 2 * pad - dil * (kw - 1) - 1) // stride + 1
    og = o // groups
    out = np.zeros((n, o, ho, wo))
    for b in range(n):
        for oc in range(o):
            g = oc // og
            for i in range(ho):
                for j in range(wo):
                    patch = xp[b, g * cg:(g + 1) * cg,
                               i * stride: i * stride + dil * (kh - 1) + 1: dil,
                               j * stride: j * stride + dil * (kw - 1) + 1: dil]
                    out[b, oc, i, j] = (patch * w[oc]).sum()
    return out


# ---- registry ------------------------------------------------------------------------------

def test_tables_cover_the_registry_exactly():
    assert set(EVALUATORS) == set(OPS), set(EVALUATORS) ^ set(OPS)
    assert set(COMPUTE_EVALUATORS) == set(COMPUTE_OPS), set(COMPUTE_EVALUATORS) ^ set(COMPUTE_OPS)


# ---- tensors and errors --------------------------------------------------------------------

def test_access_tensor_casts_to_float32_and_access_only_resplits():
    x = rng().standard_normal((2, 3, 4))          # float64 in, float32 out
    np.testing.assert_array_equal(run("(access-tensor x)", x=x), x.astype(np.float32))
    np.testing.assert_array_equal(run("(access (access-tensor x) 1)", x=x), x.astype(np.float32))


def test_missing_tensor_names_it():
    prog = apsat.parse("(compute relu (access-tensor weights))", shapes={"weights": (2, 3)})
    with pytest.raises(EvaluationError, match="'weights'"):
        evaluate(prog, {})


def test_wrong_tensor_shape_names_it_and_both_shapes():
    prog = apsat.parse("(access-tensor x)", shapes={"x": (2, 3)})
    with pytest.raises(ValueError, match=r"'x' has shape \(3, 2\).*\(2, 3\)"):
        evaluate(prog, {"x": np.zeros((3, 2), np.float32)})


def test_result_never_aliases_an_input():
    x = np.ones((2, 3), np.float32)
    out = run("(access-tensor x)", x=x)
    out[:] = 5
    assert x[0, 0] == 1


def test_several_outputs_give_a_dict():
    x = rng().standard_normal((2, 3)).astype(np.float32)
    t = parse_term("(access-tensor x)")
    prog = Program({"y": parse_term("(compute relu (access (access-tensor x) 2))"),
                    "z": parse_term("(compute reduce-sum (access (access-tensor x) 1))"), "t": t},
                   {"x": (2, 3)})
    out = evaluate(prog, {"x": x})
    assert set(out) == {"y", "z", "t"}
    np.testing.assert_array_equal(out["y"], np.maximum(x, 0))
    np.testing.assert_allclose(out["z"], x.sum(1), **TOL)
    np.testing.assert_array_equal(out["t"], x)


# ---- data movement (exact) -----------------------------------------------------------------

def test_transpose():
    x = rng().standard_normal((2, 3, 4)).astype(np.float32)
    np.testing.assert_array_equal(run("(access-transpose (access (access-tensor x) 1) (list 2 0 1))", x=x),
                                  x.transpose(2, 0, 1))


@pytest.mark.parametrize("split,axis", [(1, 0), (1, 2), (2, 1)])
def test_squeeze_and_insert_axis(split, axis):
    x = rng().standard_normal((2, 3, 4)).astype(np.float32)
    ins = run(f"(access-insert-axis (access (access-tensor x) {split}) {axis})", x=x)
    np.testing.assert_array_equal(ins, np.expand_dims(x, axis))
    back = run(f"(access-squeeze (access-insert-axis (access (access-tensor x) {split}) {axis}) {axis})", x=x)
    np.testing.assert_array_equal(back, x)


def test_flatten_and_reshape_are_row_major():
    x = rng().standard_normal((2, 3, 4, 5)).astype(np.float32)
    np.testing.assert_array_equal(run("(access-flatten (access (access-tensor x) 2))", x=x), x.reshape(6, 20))
    out = run("(access-reshape (access (access-tensor x) 1) (access-shape (shape 4 6) (shape 5)))", x=x)
    np.testing.assert_array_equal(out, x.reshape(4, 6, 5))


@pytest.mark.parametrize("axis,lo,hi", [(0, 1, 2), (2, 0, 3), (1, 1, 3)])
def test_slice(axis, lo, hi):
    x = rng().standard_normal((2, 3, 4)).astype(np.float32)
    out = run(f"(access-slice (access (access-tensor x) 1) {axis} {lo} {hi})", x=x)
    np.testing.assert_array_equal(out, np.take(x, range(lo, hi), axis=axis))


def test_concatenate():
    a = rng(1).standard_normal((2, 3, 4)).astype(np.float32)
    b = rng(2).standard_normal((2, 5, 4)).astype(np.float32)
    out = run("(access-concatenate (access (access-tensor a) 1) (access (access-tensor b) 1) 1)", a=a, b=b)
    np.testing.assert_array_equal(out, np.concatenate([a, b], axis=1))


def test_pad_zero_and_min():
    x = rng().standard_normal((2, 3)).astype(np.float32)
    zero = run("(access-pad (access (access-tensor x) 1) zero-padding 1 2 1)", x=x)
    assert zero.shape == (2, 6)
    np.testing.assert_array_equal(zero[:, 2:5], x)
    assert (zero[:, :2] == 0).all() and (zero[:, 5:] == 0).all()
    low = run("(access-pad (access (access-tensor x) 1) min-padding 0 1 0)", x=x)
    assert low.shape == (3, 3) and np.isneginf(low[0]).all()
    np.testing.assert_array_equal(low[1:], x)


def test_pair_value_stacks_at_the_split():
    a = rng(1).standard_normal((2, 3, 4)).astype(np.float32)
    b = rng(2).standard_normal((2, 3, 4)).astype(np.float32)
    out = run("(access-pair (access (access-tensor a) 2) (access (access-tensor b) 2))", a=a, b=b)
    assert out.shape == (2, 3, 2, 4)
    np.testing.assert_array_equal(out[:, :, 0], a)
    np.testing.assert_array_equal(out[:, :, 1], b)


def test_broadcast():
    x = rng().standard_normal((1, 3, 1)).astype(np.float32)
    out = run("(access-broadcast (access (access-tensor x) 1) (access-shape (shape 4) (shape 3 5)))", x=x)
    np.testing.assert_array_equal(out, np.broadcast_to(x, (4, 3, 5)))


def test_literal_is_a_float32_scalar_and_scales_via_broadcast():
    prog = apsat.parse("(access-literal 2.5)", shapes={})
    out = evaluate(prog, {})
    assert out.shape == () and out.dtype == np.float32 and out == 2.5
    x = rng().standard_normal((2, 3)).astype(np.float32)
    scaled = run("(compute elementwise-mul (access-pair (access (access-tensor x) 2) (access-broadcast "
                 "(access-insert-axis (access-insert-axis (access-literal 2.5) 0) 0) "
                 "(access-shape (shape 2 3) (shape)))))", x=x)
    np.testing.assert_array_equal(scaled, x * np.float32(2.5))


def test_windows_match_index_formula():
    x = rng().standard_normal((2, 7, 9)).astype(np.float32)
    out = run("(access-windows (access (access-tensor x) 1) (shape 3 2) (shape 2 3))", x=x)
    assert out.shape == (2, 3, 3, 3, 2)
    for i, o1, o2, w1, w2 in np.ndindex(out.shape):
        assert out[i, o1, o2, w1, w2] == x[i, o1 * 2 + w1, o2 * 3 + w2]


def test_dilated_windows_match_index_formula():
    x = rng().standard_normal((2, 9, 10)).astype(np.float32)
    out = run("(access-dilated-windows (access (access-tensor x) 1) (shape 3 2) (shape 2 1) (shape 2 3))", x=x)
    assert out.shape == (2, 3, 7, 3, 2)
    for i, o1, o2, w1, w2 in np.ndindex(out.shape):
        assert out[i, o1, o2, w1, w2] == x[i, o1 * 2 + w1 * 2, o2 + w2 * 3]


def test_cartesian_product_value_when_materialised():
    a = rng(1).standard_normal((2, 3, 4)).astype(np.float32)
    b = rng(2).standard_normal((5, 3, 4)).astype(np.float32)
    out = run("(access-cartesian-product (access (access-tensor a) 1) (access (access-tensor b) 1))", a=a, b=b)
    assert out.shape == (2, 5, 2, 3, 4)
    for i in range(2):
        for j in range(5):
            np.testing.assert_array_equal(out[i, j, 0], a[i])
            np.testing.assert_array_equal(out[i, j, 1], b[j])


def test_materialising_a_huge_cartesian_product_is_refused(monkeypatch):
    monkeypatch.setattr(compute_semantics, "MATERIALISE_LIMIT", 1000)
    a = np.zeros((20, 3), np.float32)
    prog = apsat.parse("(access-transpose (access-cartesian-product (access (access-tensor a) 1) "
                       "(access (access-tensor a) 1)) (list 1 0 2 3))", shapes={"a": (20, 3)})
    with pytest.raises(EvaluationError, match="access-cartesian-product.*2,400 elements"):
        evaluate(prog, {"a": a})


# ---- compute operators ---------------------------------------------------------------------

def test_systolic_array():
    a = rng(1).standard_normal((4, 5, 3)).astype(np.float32)
    b = rng(2).standard_normal((3, 6)).astype(np.float32)
    out = run("(systolic-array 3 6 (access (access-tensor a) 2) (access (access-tensor b) 0))", a=a, b=b)
    np.testing.assert_allclose(out, np.einsum("ijk,kl->ijl", a.astype(np.float64), b), **TOL)


def test_dot_product_dense_pair_and_three_operands():
    x2 = rng(1).standard_normal((4, 2, 5)).astype(np.float32)
    out = run("(compute dot-product (access (access-tensor x) 1))", x=x2)
    np.testing.assert_allclose(out, (x2[:, 0].astype(np.float64) * x2[:, 1]).sum(1), **TOL)
    x3 = rng(2).standard_normal((4, 3, 5, 2)).astype(np.float32)
    out = run("(compute dot-product (access (access-tensor x) 1))", x=x3)
    np.testing.assert_allclose(out, x3.astype(np.float64).prod(axis=1).sum(axis=(1, 2)), **TOL)


def test_dot_product_of_a_pair_with_an_item_axis_broadcast_on_one_side():
    a = rng(1).standard_normal((4, 1, 5)).astype(np.float32)
    b = rng(2).standard_normal((4, 3, 5)).astype(np.float32)
    out = run("(compute dot-product (access-pair (access-broadcast (access (access-tensor a) 1) "
              "(access-shape (shape 4) (shape 3 5))) (access (access-tensor b) 1)))", a=a, b=b)
    np.testing.assert_allclose(out, (a.astype(np.float64) * b).sum(axis=(1, 2)), **TOL)


def test_dot_product_of_a_pair_broadcast_on_the_same_iterated_axis():
    # both operands constant along axis 0: the result is too (computed once, then broadcast)
    a = rng(1).standard_normal((1, 3, 5)).astype(np.float32)
    b = rng(2).standard_normal((1, 1, 5)).astype(np.float32)
    target = "(access-shape (shape 4 3) (shape 5))"
    out = run(f"(compute dot-product (access-pair (access-broadcast (access (access-tensor a) 2) {target}) "
              f"(access-broadcast (access (access-tensor b) 2) {target})))", a=a, b=b)
    ref = np.broadcast_to((a.astype(np.float64) * b).sum(-1), (4, 3))
    np.testing.assert_allclose(out, ref, **TOL)


def test_resplit_with_the_same_split_keeps_a_cartesian_product_lazy(monkeypatch):
    monkeypatch.setattr(compute_semantics, "MATERIALISE_LIMIT", 10)
    a = rng(1).standard_normal((6, 4)).astype(np.float32)
    b = rng(2).standard_normal((5, 4)).astype(np.float32)
    out = run("(compute dot-product (access (access-cartesian-product (access (access-tensor a) 1) "
              "(access (access-tensor b) 1)) 2))", a=a, b=b)
    np.testing.assert_allclose(out, a.astype(np.float64) @ b.T, **TOL)


UNARY = {
    "relu": lambda x: np.maximum(x, 0),
    "negative": lambda x: -x,
    "sqrt": lambda x: np.sqrt(np.abs(x)),
    "exp": np.exp,
    "tanh": np.tanh,
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "(clip -0.5 0.25)": lambda x: np.minimum(np.maximum(x, -0.5), 0.25),
}


@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary_operators(op):
    x = rng().standard_normal((3, 4, 5)).astype(np.float32) * 3
    if op == "sqrt":
        x = np.abs(x)
    out = run(f"(compute {op} (access (access-tensor x) 1))", x=x)
    np.testing.assert_allclose(out, UNARY[op](x.astype(np.float64)), **TOL)


def test_sigmoid_saturates_without_nan():
    x = np.array([-1000, -100, 0, 100, 1000], np.float32)
    out = run("(compute sigmoid (access-tensor x))", x=x)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, [0, 3.7835e-44, 0.5, 1, 1], rtol=1e-3, atol=0)   # e**-100 is a denormal


def test_erf_matches_math_erf_to_1e_7():
    x = np.concatenate([np.linspace(-6, 6, 20001), rng().standard_normal(70000)]).astype(np.float32)
    out = run("(compute erf (access-tensor x))", x=x)
    ref = np.array([math.erf(v) for v in x.astype(np.float64)])
    assert np.abs(out - ref).max() <= 1e-7


@pytest.mark.parametrize("op,fn", [("reduce-sum", np.sum), ("reduce-max", np.max), ("reduce-mean", np.mean)])
def test_reductions_over_all_item_axes(op, fn):
    x = rng().standard_normal((3, 4, 5, 6)).astype(np.float32)
    out = run(f"(compute {op} (access (access-tensor x) 1))", x=x)
    np.testing.assert_allclose(out, fn(x.astype(np.float64), axis=(1, 2, 3)), **TOL)


def test_softmax_over_all_item_axes_jointly_and_stable():
    x = (rng().standard_normal((3, 4, 5)) * 50 + 1000).astype(np.float32)   # exp would overflow
    out = run("(compute softmax (access (access-tensor x) 1))", x=x)
    x64 = x.astype(np.float64).reshape(3, 20)
    e = np.exp(x64 - x64.max(1, keepdims=True))
    np.testing.assert_allclose(out, (e / e.sum(1, keepdims=True)).reshape(3, 4, 5), **TOL)


def test_layer_norm():
    x = (rng().standard_normal((3, 4, 5)) * 2 + 1).astype(np.float32)
    out = run("(compute (layer-norm 1e-05) (access (access-tensor x) 1))", x=x)
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=(1, 2), keepdims=True)
    var = ((x64 - mean) ** 2).mean(axis=(1, 2), keepdims=True)
    np.testing.assert_allclose(out, (x64 - mean) / np.sqrt(var + 1e-5), rtol=1e-5, atol=1e-5)


def lrn_ref(x, size, alpha, beta, bias):
    """ONNX LRN spelled out per channel (float64), channels on axis 1."""
    c = x.shape[1]
    out = np.empty_like(x, dtype=np.float64)
    for ch in range(c):
        lo, hi = max(0, ch - (size - 1) // 2), min(c - 1, ch + math.ceil((size - 1) / 2))
        sq = (x[:, lo:hi + 1].astype(np.float64) ** 2).sum(axis=1)
        out[:, ch] = x[:, ch] / (bias + alpha / size * sq) ** beta
    return out


def opaque_program(node, args: str, out_shape, shapes, input_types, output_type=TensorProto.FLOAT,
                   arg_inputs=(0,), constants=None, output_index=0, key="op"):
    """A one-output Program calling ONNX `node` through `opaque`."""
    term = parse_term(f"(opaque {key} (args {args}) (shape {' '.join(map(str, out_shape))}))")
    spec = OpaqueNode(node.SerializeToString(), tuple(arg_inputs), dict(constants or {}),
                      tuple(input_types), output_index, output_type, OPSETS)
    return Program({"out": term}, shapes, {key: spec})


@pytest.mark.parametrize("size", [3, 4, 5])
def test_lrn_matches_onnx_formula_and_onnxruntime(size):
    x = rng(size).standard_normal((2, 7, 3, 4)).astype(np.float32)
    alpha, beta, bias = 0.5, 0.75, 2.0
    out = run(f"(compute (lrn {size} {alpha} {beta} {bias}) (access (access-tensor x) 1))", x=x)
    np.testing.assert_allclose(out, lrn_ref(x, size, alpha, beta, bias), **TOL)
    if size % 2 == 0:
        return          # onnxruntime's CPU LRN accepts odd sizes only
    node = helper.make_node("LRN", ["x"], ["y"], size=size, alpha=alpha, beta=beta, bias=bias)
    ort = evaluate(opaque_program(node, "(access-tensor x)", x.shape, {"x": x.shape}, [TensorProto.FLOAT]), {"x": x})
    np.testing.assert_allclose(out, ort, **TOL)


def test_elementwise_add_and_mul_fold_the_operand_axis():
    x = rng().standard_normal((4, 3, 5)).astype(np.float32)
    add = run("(compute elementwise-add (access (access-tensor x) 1))", x=x)
    np.testing.assert_allclose(add, x.astype(np.float64).sum(1), **TOL)
    mul = run("(compute elementwise-mul (access (access-tensor x) 1))", x=x)
    np.testing.assert_allclose(mul, x.astype(np.float64).prod(1), **TOL)


@pytest.mark.parametrize("op,fn", [("elementwise-add", np.add), ("elementwise-mul", np.multiply),
                                   ("elementwise-sub", np.subtract), ("elementwise-div", np.divide),
                                   ("elementwise-pow", np.power)])
def test_binary_operators_on_pairs(op, fn):
    a = rng(1).uniform(0.5, 2, (3, 4)).astype(np.float32)
    b = rng(2).uniform(-2, 2, (3, 4)).astype(np.float32)
    out = run(f"(compute {op} (access-pair (access (access-tensor a) 1) (access (access-tensor b) 1)))", a=a, b=b)
    np.testing.assert_allclose(out, fn(a.astype(np.float64), b), **TOL)
    # the same through a materialised item axis (pair built as a tensor)
    x = np.stack([a, b], axis=1)
    out = run(f"(compute {op} (access (access-tensor x) 1))", x=x)
    np.testing.assert_allclose(out, fn(a.astype(np.float64), b), **TOL)


def test_select():
    x = rng().standard_normal((5, 3, 4)).astype(np.float32)
    x[:, 0] = (x[:, 0] > 0)
    out = run("(compute select (access (access-tensor x) 1))", x=x)
    np.testing.assert_array_equal(out, np.where(x[:, 0] != 0, x[:, 1], x[:, 2]))


# ---- convolutions and pooling --------------------------------------------------------------

def test_glenside_conv_example():
    w = rng(1).standard_normal((8, 3, 3, 3)).astype(np.float32)
    x = rng(2).standard_normal((3, 32, 32)).astype(np.float32)
    text = ("(compute dot-product (access-cartesian-product (access (access-tensor w) 1) "
            "(access-squeeze (access-windows (access (access-tensor x) 0) (shape 3 3 3) (shape 1 1 1)) 0)))")
    assert apsat.parse(text, {"w": w.shape, "x": x.shape}).shape == ((8, 30, 30), ())
    out = run(text, w=w, x=x)
    np.testing.assert_allclose(out, conv_ref(x[None], w)[0], **TOL)


@pytest.mark.parametrize("stride,dil,pad", [(1, 1, 0), (2, 1, 1), (1, 2, 2), (2, 3, 1)])
def test_conv2d_windows_cartesian_dot_product(stride, dil, pad):
    x = rng(1).standard_normal((2, 3, 11, 10)).astype(np.float32)
    w = rng(2).standard_normal((4, 3, 3, 3)).astype(np.float32)
    text = (f"(access-transpose (compute dot-product (access-cartesian-product (access (access-tensor w) 1) "
            f"(access-squeeze (access-dilated-windows (access (access-pad (access-pad (access-tensor x) "
            f"zero-padding 2 {pad} {pad}) zero-padding 3 {pad} {pad}) 1) (shape 3 3 3) (shape 1 {stride} {stride}) "
            f"(shape 1 {dil} {dil})) 1))) (list 1 0 2 3))")
    out = run(text, x=x, w=w)
    np.testing.assert_allclose(out, conv_ref(x, w, stride, dil, pad), **TOL)


def test_max_pool_with_min_padding():
    x = rng().standard_normal((2, 3, 7, 6)).astype(np.float32)
    out = run("(compute reduce-max (access-windows (access (access-pad (access-pad (access-tensor x) "
              "min-padding 2 1 1) min-padding 3 1 1) 2) (shape 3 3) (shape 2 2)))", x=x)
    ref = np.empty((2, 3, 4, 3), np.float32)
    for i in range(4):
        for j in range(3):
            ref[:, :, i, j] = x[:, :, max(0, 2 * i - 1): 2 * i + 2, max(0, 2 * j - 1): 2 * j + 2].max(axis=(2, 3))
    np.testing.assert_array_equal(out, ref)


def grouped_conv_text(n, g, og, cg, h, w, k, s):
    """Grouped convolution as dot-product(pair(broadcast(weights), broadcast(windows))):
    both operands broadcast to ((N, G, Og, Ho, Wo), (Cg, K, K))."""
    ho, wo = (h - k) // s + 1, (w - k) // s + 1
    target = f"(access-shape (shape {n} {g} {og} {ho} {wo}) (shape {cg} {k} {k}))"
    xw = (f"(access-insert-axis (access-squeeze (access-windows (access (access-reshape (access-tensor x) "
          f"(access-shape (shape {n} {g} {cg} {h} {w}) (shape))) 2) (shape {cg} {k} {k}) (shape 1 {s} {s})) 2) 2)")
    ww = f"(access-reshape (access-tensor w) (access-shape (shape 1 {g} {og} 1 1) (shape {cg} {k} {k})))"
    return (f"(access-reshape (compute dot-product (access-pair (access-broadcast {ww} {target}) "
            f"(access-broadcast {xw} {target}))) (access-shape (shape {n} {g * og} {ho} {wo}) (shape)))")


def test_grouped_convolution_via_pair_of_broadcasts():
    n, g, og, cg, h, w, k, s = 2, 3, 2, 4, 9, 8, 3, 2
    x = rng(1).standard_normal((n, g * cg, h, w)).astype(np.float32)
    wt = rng(2).standard_normal((g * og, cg, k, k)).astype(np.float32)
    out = run(grouped_conv_text(n, g, og, cg, h, w, k, s), x=x, w=wt)
    np.testing.assert_allclose(out, conv_ref(x, wt, stride=s, groups=g), **TOL)


def test_grouped_convolution_never_expands_its_broadcasts(monkeypatch):
    # Expanded, each broadcast operand would be 8*16*32*32*16*9 = 18.9M floats (75 MB);
    # the im2col of the windows is 16x smaller (4.7 MB).
    monkeypatch.setattr(compute_semantics, "MATERIALISE_LIMIT", 2 ** 20)
    n, g, og, cg, h, w, k, s = 1, 8, 16, 16, 34, 34, 3, 1
    x = rng(1).standard_normal((n, g * cg, h, w)).astype(np.float32)
    wt = rng(2).standard_normal((g * og, cg, k, k)).astype(np.float32)
    tracemalloc.start()
    try:
        out = run(grouped_conv_text(n, g, og, cg, h, w, k, s), x=x, w=wt)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 30e6, f"peak {peak / 1e6:.0f} MB"
    # spot-check a few outputs against the direct sum
    for b, oc, i, j in [(0, 0, 0, 0), (0, 37, 5, 17), (0, 127, 31, 31)]:
        gi = oc // og
        ref = (x[b, gi * cg:(gi + 1) * cg, i:i + k, j:j + k].astype(np.float64) * wt[oc]).sum()
        assert abs(out[b, oc, i, j] - ref) <= 1e-5 * abs(ref) + 1e-4


def test_dot_product_over_a_large_cartesian_product_is_never_built(monkeypatch):
    # ((50176),(27)) x ((64),(27)): built, the product would be 50176*64*2*27 floats
    # (694 MB); as a matmul it costs the 12.8 MB result.
    monkeypatch.setattr(compute_semantics, "MATERIALISE_LIMIT", 2 ** 20)
    a = rng(1).standard_normal((50176, 27)).astype(np.float32)
    b = rng(2).standard_normal((64, 27)).astype(np.float32)
    prog = apsat.parse("(compute dot-product (access-cartesian-product (access (access-tensor a) 1) "
                       "(access (access-tensor b) 1)))", shapes={"a": a.shape, "b": b.shape})
    tracemalloc.start()
    try:
        out = evaluate(prog, {"a": a, "b": b})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert out.shape == (50176, 64)
    assert peak < 60e6, f"peak {peak / 1e6:.0f} MB"
    np.testing.assert_allclose(out, a.astype(np.float64) @ b.T.astype(np.float64), rtol=1e-5, atol=1e-5)


def test_intermediates_are_freed_after_their_last_use():
    # 40 chained ops over a 4 MB tensor: all values alive would be ~160 MB.
    x = rng().standard_normal((1000, 1000)).astype(np.float32)
    text = "(access-tensor x)"
    for i in range(40):
        text = f"(compute {'relu' if i % 2 else 'negative'} (access {text} 1))"
    prog = apsat.parse(text, shapes={"x": x.shape})
    tracemalloc.start()
    try:
        evaluate(prog, {"x": x})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 25e6, f"peak {peak / 1e6:.0f} MB"


# ---- opaque calls (onnxruntime) ------------------------------------------------------------

def test_opaque_hard_sigmoid():
    x = rng().standard_normal((2, 3)).astype(np.float32) * 4
    node = helper.make_node("HardSigmoid", ["x"], ["y"], alpha=0.3, beta=0.4)
    prog = opaque_program(node, "(access-tensor x)", (2, 3), {"x": (2, 3)}, [TensorProto.FLOAT])
    np.testing.assert_allclose(evaluate(prog, {"x": x}), np.clip(0.3 * x + 0.4, 0, 1), **TOL)


def test_opaque_cos_on_a_computed_argument_and_session_reuse():
    x = rng().standard_normal((2, 3)).astype(np.float32)
    node = helper.make_node("Cos", ["in0"], ["out0"])
    prog = opaque_program(node, "(compute relu (access (access-tensor x) 2))", (2, 3), {"x": (2, 3)},
                          [TensorProto.FLOAT])
    np.testing.assert_allclose(evaluate(prog, {"x": x}), np.cos(np.maximum(x, 0)), **TOL)
    sessions = len(opaque_eval._SESSIONS)
    evaluate(prog, {"x": x})
    assert len(opaque_eval._SESSIONS) == sessions


def test_opaque_constant_input_and_second_output():
    # TopK with k as a constant initializer; output 1 (indices, int64) comes back as float32.
    x = rng().standard_normal((3, 6)).astype(np.float32)
    node = helper.make_node("TopK", ["x", "k"], ["values", "indices"], axis=1)
    types = [TensorProto.FLOAT, TensorProto.INT64]
    for index, out_type in [(0, TensorProto.FLOAT), (1, TensorProto.INT64)]:
        prog = opaque_program(node, "(access-tensor x)", (3, 2), {"x": (3, 6)}, types, out_type,
                              constants={1: np.array([2], np.int64)}, output_index=index, key=f"topk{index}")
        out = evaluate(prog, {"x": x})
        order = np.argsort(-x, axis=1)[:, :2]
        want = np.take_along_axis(x, order, 1) if index == 0 else order
        assert out.dtype == np.float32
        np.testing.assert_array_equal(out, want.astype(np.float32))


def test_opaque_integer_tensors_keep_their_dtype():
    # 2**40 + 1 and 2**40 are equal in float32: the difference is 1 only if the int64
    # tensors reach onnxruntime uncast, through a chain of two opaque calls.
    a = np.array([2 ** 40 + 1, 7], np.int64)
    b = np.array([2 ** 40, 5], np.int64)
    ident = helper.make_node("Identity", ["i"], ["o"])
    sub = helper.make_node("Sub", ["p", "q"], ["r"])
    i64 = TensorProto.INT64
    term = parse_term("(opaque sub (args (opaque id (args (access-tensor a)) (shape 2)) (access-tensor b)) (shape 2))")
    prog = Program({"out": term}, {"a": (2,), "b": (2,)}, {
        "id": OpaqueNode(ident.SerializeToString(), (0,), {}, (i64,), 0, i64, OPSETS),
        "sub": OpaqueNode(sub.SerializeToString(), (0, 1), {}, (i64, i64), 0, i64, OPSETS)})
    out = evaluate(prog, {"a": a, "b": b})
    np.testing.assert_array_equal(out, np.array([1, 2], np.float32))


def test_opaque_wrong_declared_shape_is_a_clear_error():
    node = helper.make_node("Cos", ["x"], ["y"])
    prog = opaque_program(node, "(access-tensor x)", (3, 2), {"x": (2, 3)}, [TensorProto.FLOAT], key="cosbad")
    with pytest.raises(EvaluationError, match=r"opaque 'cosbad'.*\(2, 3\).*\(3, 2\)"):
        evaluate(prog, {"x": np.zeros((2, 3), np.float32)})


def test_opaque_without_its_node_is_a_clear_error():
    prog = Program({"out": parse_term("(opaque ghost (args (access-tensor x)) (shape 2))")}, {"x": (2,)})
    with pytest.raises(EvaluationError, match="'ghost'"):
        evaluate(prog, {"x": np.zeros(2, np.float32)})



