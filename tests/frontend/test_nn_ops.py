"""Reductions, ArgMax/ArgMin, Instance/GroupNormalization, ConvTranspose and Resize lowered
into the language (apsat/frontend/lowering_reduce.py, lowering_norm.py,
lowering_convtranspose.py, lowering_resize.py): each single-op model imports with no
`opaque` term, carries the constructs its lowering is made of, and the reference
interpreter equals onnxruntime on seeded N(0, 1) inputs. One model per family is also
optimised for gpu and systolic:32x32 (the simulated instruction stream equals
onnxruntime with no host steps). Cases the language cannot express stay opaque calls.

Tolerances: rtol 1e-5 / atol 1e-5 throughout. Reductions, normalisations, transposed
convolutions and interpolations are short float32 sums (at most 80 terms here) that
onnxruntime adds in another order (and Resize weights it computes per output pixel where
the language multiplies by a matrix per axis): observed differences are below 6e-7.
Nearest resizing, ArgMax/ArgMin and the max-based reductions are exact.
"""
from __future__ import annotations

import functools

import models
from oracles import assert_program_equals
import numpy as np
import pytest
from onnx import TensorProto, helper

import apsat
from apsat.frontend.importer import Importer
from apsat.lang.evaluate import evaluate
from apsat.pipeline.zoo import ort_run

TOL = {"rtol": 1e-5, "atol": 1e-5}
RNG = np.random.default_rng(0)


def _w(*shape, scale=0.3):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _i(*vals):
    return np.array(vals, dtype=np.int64)


def _f(*vals):
    return np.array(vals, dtype=np.float32)


def _inputs(dims: dict, seed: int = 0, transform=None) -> dict:
    rng = np.random.default_rng(seed)
    out = {n: rng.standard_normal(d).astype(np.float32) for n, d in dims.items()}
    return {n: transform(v) for n, v in out.items()} if transform else out


def constructs(program) -> set[str]:
    """Every op of the program, and `compute OP` for each compute operator it applies."""
    ops = {t.op for t in program.terms()}
    return ops | {f"compute {t.args[0].op}" for t in program.terms() if t.op == "compute"}


def check(proto, want_constructs=(), opaque=False, transform=None, seed=0):
    """Import; no opaque term (or some, if `opaque`); the wanted constructs present; the
    reference interpreter (run by the Model: opaque calls through onnxruntime) equals
    onnxruntime (TOL). Returns the program's constructs."""
    model = apsat.load_onnx(proto)
    found = constructs(model.program)
    assert ("opaque" in found) == opaque, model.opaque_ops()
    assert set(want_constructs) <= found, sorted(set(want_constructs) - found)
    inputs = _inputs(model.inputs, seed, transform)
    want = ort_run(proto, inputs)
    if opaque:
        got = model.run(inputs)
    else:
        got = evaluate(model.program, {**model.weights, **inputs})
        got = got if isinstance(got, dict) else {next(iter(model.program.outputs)): got}
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, **TOL, err_msg=name)
    return found


def shaped(proto, dims):
    """`proto` with its one output declared float32 of `dims` (onnx's inference leaves
    function ops' outputs, GroupNormalization's, unshaped, which the checker refuses)."""
    del proto.graph.output[:]
    proto.graph.output.extend([helper.make_tensor_value_info("y0", TensorProto.FLOAT, list(dims))])
    return proto


# ---- reductions ----------------------------------------------------------------------------

def _reduce(op, axes, opset=18, **attrs):
    """A Reduce node on (2, 3, 4): axes as input from opset 18 (13 for ReduceSum), else
    as attribute; axes None leaves them out."""
    as_input = opset >= (13 if op == "ReduceSum" else 18)
    inputs = [(2, 3, 4)] + ([_i(*axes)] if as_input and axes is not None else [])
    if not as_input and axes is not None:
        attrs["axes"] = list(axes)
    return models.single_op(op, inputs, attrs, opset=opset)


AXES_VARIANTS = {
    "one": ([1], {}), "neg-nokeep": ([-1], {"keepdims": 0}), "two": ([0, 2], {}),
    "two-nokeep": ([2, 0], {"keepdims": 0}), "all": (None, {}), "all-nokeep": (None, {"keepdims": 0}),
    "noop": ([], {"noop_with_empty_axes": 1}),
}
REDUCE_OPS = {
    "ReduceMax": ["compute reduce-max"], "ReduceSum": ["compute reduce-sum"],
    "ReduceMean": ["compute reduce-mean"], "ReduceMin": ["compute reduce-max", "compute negative"],
    "ReduceL1": ["compute reduce-sum", "compute abs"], "ReduceL2": ["compute reduce-sum", "compute sqrt"],
    "ReduceSumSquare": ["compute reduce-sum", "compute elementwise-mul"],
    "ReduceLogSumExp": ["compute reduce-sum", "compute reduce-max", "compute exp", "compute log"],
    "ReduceLogSum": ["compute reduce-sum", "compute log"], "ReduceProd": ["compute elementwise-mul"],
}
POSITIVE = {"ReduceLogSum"}          # log of a sum: keep it real


@pytest.mark.parametrize("variant", sorted(AXES_VARIANTS))
@pytest.mark.parametrize("op", sorted(REDUCE_OPS))
def test_reductions_opset18(op, variant):
    """Every Reduce op with axes as input: one, negative, two (unsorted), all, none
    (noop_with_empty_axes: the element-wise maps still apply, as in onnxruntime), with and
    without keepdims."""
    axes, attrs = AXES_VARIANTS[variant]
    want = REDUCE_OPS[op]
    if variant == "noop":                  # nothing reduced; ReduceProd multiplies nothing
        want = [c for c in want if "reduce" not in c and op != "ReduceProd"]
    too_long = op == "ReduceProd" and variant.startswith("all")     # 24 elements > 16
    check(_reduce(op, axes, 18, **attrs), [] if too_long else want, opaque=too_long,
          transform=np.abs if op in POSITIVE else None)


@pytest.mark.parametrize("op", sorted(REDUCE_OPS))
def test_reductions_axes_attribute(op):
    """Opset 13: axes as the attribute (ReduceSum: as the input already), keepdims 0."""
    check(_reduce(op, [0, -1], 13, keepdims=0), REDUCE_OPS[op],
          transform=np.abs if op in POSITIVE else None)


def test_reduce_logsumexp_is_shifted_by_the_max():
    """Values near 200 and more: exp would overflow float32 without the max shift."""
    nodes = [helper.make_node("Mul", ["x", "k"], ["h"]),
             helper.make_node("ReduceLogSumExp", ["h", "axes"], ["y"], keepdims=0)]
    check(models.make_model(nodes, {"x": (3, 5)}, ["y"], {"k": _f(80.0), "axes": _i(1)}, opset=18),
          ["compute log"], transform=lambda v: np.abs(v) + 2)


def test_reduce_prod_over_more_than_16_elements_is_an_opaque_call():
    check(models.single_op("ReduceProd", [(2, 5, 4), _i(1, 2)], opset=18), opaque=True)


# ---- ArgMax / ArgMin ------------------------------------------------------------------------

def _arg(op, dims, opset=13, **attrs):
    """op -> Cast to float (the language carries the indices as float32 values)."""
    nodes = [helper.make_node(op, ["x"], ["i"], **attrs),
             helper.make_node("Cast", ["i"], ["y"], to=TensorProto.FLOAT)]
    return models.make_model(nodes, {"x": dims}, ["y"], opset=opset)


ARG_VARIANTS = {"default": {}, "axis1": {"axis": 1}, "last-nokeep": {"axis": -1, "keepdims": 0},
                "last-index": {"axis": 1, "select_last_index": 1}}


@pytest.mark.parametrize("variant", sorted(ARG_VARIANTS))
@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_argmax_argmin(op, variant):
    want = ["compute reduce-max", "compute select", "compute elementwise-sub"]
    check(_arg(op, (3, 4, 5), **ARG_VARIANTS[variant]), want)


@pytest.mark.parametrize("last", [0, 1])
@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_argmax_argmin_ties_pick_the_first_or_last_index(op, last):
    """Inputs rounded to integers tie often (and -0 ties with 0)."""
    proto = _arg(op, (6, 7), axis=1, select_last_index=last)
    for seed in range(3):
        check(proto, transform=np.round, seed=seed)


# ---- normalisation ---------------------------------------------------------------------------

@pytest.mark.parametrize("dims", [(2, 3, 5, 6), (2, 3, 7)], ids=["4d", "3d"])
def test_instance_norm(dims):
    c = dims[1]
    proto = models.single_op("InstanceNormalization", [dims, _w(c, scale=1.0), _w(c, scale=1.0)],
                             {"epsilon": 1e-3})
    check(proto, ["compute layer-norm", "compute elementwise-mul", "compute elementwise-add"])


@pytest.mark.parametrize("groups", [2, 4])
def test_group_norm_opset21_per_channel(groups):
    dims = (2, 8, 5, 3)
    proto = models.single_op("GroupNormalization", [dims, _w(8, scale=1.0), _w(8, scale=1.0)],
                             {"num_groups": groups, "epsilon": 1e-4}, opset=21)
    check(shaped(proto, dims), ["compute layer-norm", "access-reshape"])


@pytest.mark.parametrize("groups", [2, 4])
def test_group_norm_opset18_per_group(groups):
    """onnx's checker refuses opset-18 GroupNormalization (deprecated by opset 21), so
    load_onnx does too: the lowering is driven through the importer's walk directly, with
    the output's type given, and compared with onnxruntime, which runs it."""
    dims = (2, 8, 5, 3)
    proto = shaped(models.single_op("GroupNormalization", [dims, _w(groups, scale=1.0),
                                                           _w(groups, scale=1.0)],
                                    {"num_groups": groups}, opset=18), dims)
    importer = Importer(proto, {"x0": dims}, {"y0": (TensorProto.FLOAT, dims)})
    program = importer.run()
    assert "opaque" not in constructs(program) and "compute layer-norm" in constructs(program)
    inputs = _inputs({"x0": dims})
    got = evaluate(program, {**importer.weights, **inputs})
    np.testing.assert_allclose(got, ort_run(proto, inputs)["y0"], **TOL)


# ---- ConvTranspose ---------------------------------------------------------------------------

CONVT = {
    "stride1": ((1, 3, 5, 5), (3, 4, 3, 3), {}),
    "stride2-bias": ((1, 3, 5, 5), (3, 4, 3, 3), {"strides": [2, 2]}),
    "stride2-pads": ((1, 3, 5, 6), (3, 4, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "output-padding": ((1, 3, 5, 6), (3, 4, 3, 3),
                       {"strides": [2, 3], "pads": [1, 0, 1, 2], "output_padding": [1, 2]}),
    "group2": ((2, 4, 5, 5), (4, 3, 3, 2), {"group": 2, "strides": [2, 1]}),
    "dilation2": ((1, 3, 5, 5), (3, 2, 3, 3), {"dilations": [2, 2], "pads": [1, 2, 0, 1]}),
    "pads-beyond-kernel": ((1, 3, 5, 5), (3, 2, 3, 3), {"pads": [3, 3, 3, 3]}),
    "same-upper": ((1, 3, 5, 5), (3, 2, 4, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    "same-lower": ((1, 3, 5, 5), (3, 2, 4, 3), {"strides": [2, 2], "auto_pad": "SAME_LOWER"}),
    "valid": ((1, 3, 5, 5), (3, 2, 4, 3), {"strides": [2, 2], "auto_pad": "VALID"}),
    "output-shape": ((1, 3, 5, 5), (3, 2, 3, 3), {"strides": [2, 2], "output_shape": [10, 9]}),
    "1d": ((2, 3, 7), (3, 2, 3), {"strides": [3], "pads": [1, 0]}),
    "3d": ((1, 2, 3, 4, 3), (2, 2, 2, 2, 2), {"strides": [2, 1, 2]}),
}


@pytest.mark.parametrize("case", sorted(CONVT))
def test_conv_transpose(case):
    xd, wd, attrs = CONVT[case]
    inputs = [xd, _w(*wd)] + ([_w(wd[1] * attrs.get("group", 1))] if "bias" in case else [])
    found = check(models.single_op("ConvTranspose", inputs, attrs),
                  ["compute dot-product", "access-tensor"])
    if "stride2" in case:        # zeros inserted between the input's elements
        assert {"access-insert-axis", "access-pad", "access-reshape"} <= found


def test_conv_transpose_with_a_runtime_weight_is_an_opaque_call():
    check(models.single_op("ConvTranspose", [(1, 2, 4, 4), (2, 2, 3, 3)]), opaque=True)


# ---- Resize and Upsample ---------------------------------------------------------------------

def _resize(dims, scales=None, sizes=None, opset=13, roi=None, **attrs):
    """Resize of a graph input of `dims` with constant scales or sizes."""
    if opset < 11:
        inputs = [dims, scales]
    else:
        inputs = [dims, roi, scales if scales is not None or opset >= 13 else np.zeros(0, np.float32)]
        inputs += [sizes] if sizes is not None else []
    return models.single_op("Resize", inputs, attrs, opset=opset)


COORDS = ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"]
RESIZE = {
    "nearest-x2": (_resize, (1, 2, 4, 5), {"scales": _f(1, 1, 2, 2)}),
    "nearest-x3x2": (_resize, (1, 2, 4, 5), {"scales": _f(1, 1, 3, 2)}),
    "nearest-x3-asymmetric-floor": (_resize, (1, 2, 4, 5), {
        "scales": _f(1, 1, 3, 1), "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}),
    "nearest-x3-asymmetric": (_resize, (1, 2, 4, 5), {    # rounds 2/3 up: not a repeat
        "scales": _f(1, 1, 3, 1), "coordinate_transformation_mode": "asymmetric"}),
    "nearest-size-7x9": (_resize, (1, 2, 4, 5), {"sizes": _i(1, 2, 7, 9)}),
    "nearest-down": (_resize, (1, 2, 8, 9), {"scales": _f(1, 1, 0.5, 0.6)}),
    "nearest-ceil-align": (_resize, (1, 2, 4, 5), {"sizes": _i(1, 2, 7, 9), "nearest_mode": "ceil",
                                                   "coordinate_transformation_mode": "align_corners"}),
    "nearest-floor": (_resize, (1, 2, 4, 5), {"sizes": _i(1, 2, 7, 9), "nearest_mode": "floor"}),
    "nearest-prefer-ceil": (_resize, (1, 2, 4, 5), {"scales": _f(1, 1, 2.5, 1.5),
                                                    "nearest_mode": "round_prefer_ceil",
                                                    "coordinate_transformation_mode": "asymmetric"}),
    "nearest-tf-half-pixel-11": (_resize, (1, 2, 4, 5), {
        "scales": _f(1, 1, 2.5, 1.5), "opset": 11, "roi": np.zeros(0, np.float32),
        "coordinate_transformation_mode": "tf_half_pixel_for_nn"}),
    "nearest-axes-18": (_resize, (2, 3, 4, 5), {"scales": _f(2, 3), "opset": 18, "axes": [2, 3]}),
    "opset10-nearest": (_resize, (1, 2, 4, 5), {"scales": _f(1, 1, 0.5, 3), "opset": 10}),
    "opset10-linear": (_resize, (1, 2, 4, 5), {"scales": _f(1, 1, 2, 1.5), "opset": 10, "mode": "linear"}),
    "linear-2d": (_resize, (3, 7), {"scales": _f(1, 1.6), "mode": "linear"}),
    "linear-symmetric-19": (_resize, (2, 3, 4, 5), {"scales": _f(1, 1, 1.7, 0.8), "mode": "linear", "opset": 19,
                                                     "coordinate_transformation_mode": "half_pixel_symmetric"}),
    "linear-not-larger-18": (_resize, (2, 3, 4, 5), {"sizes": _i(9, 9), "opset": 18, "axes": [2, 3],
                                                      "mode": "linear", "keep_aspect_ratio_policy": "not_larger"}),
    "linear-not-smaller-18": (_resize, (2, 3, 4, 5), {"sizes": _i(9, 9), "opset": 18, "axes": [2, 3],
                                                       "mode": "linear", "keep_aspect_ratio_policy": "not_smaller"}),
    "cubic-exclude-outside": (_resize, (2, 3, 4, 5), {"scales": _f(1, 1, 2, 1.5), "mode": "cubic",
                                                      "exclude_outside": 1, "cubic_coeff_a": -0.5}),
}
for _mode in COORDS:
    RESIZE[f"linear-{_mode}"] = (_resize, (2, 3, 4, 5), {
        "scales": _f(1, 1, 2, 1.5), "mode": "linear", "coordinate_transformation_mode": _mode})
    RESIZE[f"linear-size-{_mode}"] = (_resize, (2, 3, 4, 5), {
        "sizes": _i(2, 3, 3, 11), "mode": "linear", "coordinate_transformation_mode": _mode})
    RESIZE[f"cubic-{_mode}"] = (_resize, (2, 3, 4, 5), {
        "sizes": _i(2, 3, 7, 3), "mode": "cubic", "coordinate_transformation_mode": _mode})


@pytest.mark.parametrize("case", sorted(RESIZE))
def test_resize(case):
    make, dims, kw = RESIZE[case]
    found = check(make(dims, **kw))
    if case in ("nearest-x2", "nearest-x3x2", "nearest-x3-asymmetric-floor"):  # o // f: a broadcast
        assert "access-broadcast" in found and "compute dot-product" not in found
    elif case != "nearest-axes-18":                               # a matmul per resized axis
        assert "compute dot-product" in found and "access-cartesian-product" in found


@pytest.mark.parametrize("opset, attrs, inputs", [
    (9, {}, [(1, 2, 3, 4), _f(1, 1, 2, 2)]),
    (9, {"mode": "linear"}, [(1, 2, 3, 4), _f(1, 1, 2, 2.5)]),
    (7, {"scales": [1.0, 1.0, 2.0, 3.0]}, [(1, 2, 3, 4)]),
], ids=["9-nearest", "9-linear", "7-attribute"])
def test_upsample(opset, attrs, inputs):
    check(models.single_op("Upsample", inputs, attrs, opset=opset))


@pytest.mark.parametrize("proto", [
    lambda: _resize((1, 1, 4, 4), _f(1, 1, 2, 2), roi=_f(0, 0, 0.1, 0.1, 1, 1, 0.9, 0.9), mode="linear",
                    coordinate_transformation_mode="tf_crop_and_resize"),
    lambda: _resize((2, 3, 8, 5), _f(1, 1, 0.5, 2), opset=18, mode="linear", antialias=1),
    lambda: _resize((2, 3, 8, 6), sizes=_i(2, 3, 4, 5), opset=18, mode="cubic", antialias=1),
], ids=["tf-crop-and-resize", "linear-antialias-downscale", "cubic-antialias-downscale"])
def test_resize_cases_the_language_does_not_take_are_opaque_calls(proto):
    model = apsat.load_onnx(proto())
    assert model.opaque_ops() == {"Resize": 1}


# ---- end to end: optimised for both targets --------------------------------------------------

def _node(op, ins, out, **attrs):
    return helper.make_node(op, ins, [out], **attrs)


def _family_reduce():
    """ReduceL2, ReduceLogSumExp, ReduceMin, ReduceL1 and ReduceProd over axis 1, summed."""
    nodes = [_node("ReduceL2", ["x", "a"], "l2"), _node("ReduceLogSumExp", ["x", "a"], "lse"),
             _node("ReduceMin", ["x", "a"], "mn"), _node("ReduceL1", ["x", "a"], "l1"),
             _node("ReduceProd", ["x", "a"], "p"), _node("Sum", ["l2", "lse", "mn", "l1", "p"], "y")]
    return models.make_model(nodes, {"x": (2, 3, 4)}, ["y"], {"a": _i(1)}, opset=18)


def _family_arg():
    """ArgMax (first index) + ArgMin (last index) along axis 1, cast to float."""
    nodes = [_node("ArgMax", ["x"], "i", axis=1), _node("ArgMin", ["x"], "j", axis=1, select_last_index=1),
             _node("Add", ["i", "j"], "k"), _node("Cast", ["k"], "y", to=TensorProto.FLOAT)]
    return models.make_model(nodes, {"x": (3, 5, 4)}, ["y"], opset=13)


def _family_norm():
    """InstanceNormalization then GroupNormalization (2 groups, opset 21)."""
    nodes = [_node("InstanceNormalization", ["x", "s", "b"], "h"),
             _node("GroupNormalization", ["h", "gs", "gb"], "y", num_groups=2)]
    w = {"s": _w(4, scale=1.0), "b": _w(4), "gs": _w(4, scale=1.0), "gb": _w(4)}
    proto = models.make_model(nodes, {"x": (2, 4, 5, 6)}, ["y"], w, opset=21)
    del proto.graph.output[:]
    proto.graph.output.extend([helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 5, 6])])
    return proto


def _family_conv_transpose():
    """Strided ConvTranspose with pads, output_padding and bias, then a grouped, dilated one."""
    nodes = [_node("ConvTranspose", ["x", "w1", "b1"], "h", strides=[2, 2], pads=[1, 1, 1, 1],
                   output_padding=[1, 1]),
             _node("ConvTranspose", ["h", "w2"], "y", group=2, dilations=[2, 1])]
    w = {"w1": _w(4, 4, 3, 3), "b1": _w(4), "w2": _w(4, 3, 3, 3)}
    return models.make_model(nodes, {"x": (1, 4, 5, 5)}, ["y"], w)


def _family_resize():
    """Nearest x2 (a broadcast), then bilinear to 1.5 x 0.5 (a matmul per axis)."""
    nodes = [_node("Resize", ["x", "", "s1"], "h"), _node("Resize", ["h", "", "s2"], "y", mode="linear")]
    return models.make_model(nodes, {"x": (1, 3, 5, 6)}, ["y"], {"s1": _f(1, 1, 2, 2), "s2": _f(1, 1, 1.5, 0.5)})


FAMILIES = {"reduce": _family_reduce, "argmax": _family_arg, "norm": _family_norm,
            "conv-transpose": _family_conv_transpose, "resize": _family_resize}


@functools.lru_cache(maxsize=None)
def _optimized(family: str, target: str):
    """The family's model optimised for `target`, its inputs and onnxruntime's output."""
    res = apsat.optimize(FAMILIES[family](), target=target, verify=False)
    inputs = _inputs(res.model.inputs, transform=np.round if family == "argmax" else None)
    return res, inputs, ort_run(res.model.onnx, inputs)["y"]


@pytest.mark.parametrize("target", ["gpu", "systolic:32x32"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_optimized_family_equals_onnxruntime(family, target):
    res, inputs, want = _optimized(family, target)
    assert "opaque" not in constructs(res.program)
    assert_program_equals(res, {**res.model.weights, **inputs}, want, target, **TOL)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_triton_kernels_equal_onnxruntime(family):
    """The GPU program's Triton kernels too (ConvTranspose's zero insertion once made them
    index a reshape with negative offsets, which Triton's truncating division misreads)."""
    pytest.importorskip("torch", reason="the GPU backend needs torch (pip install apsat[gpu])")
    pytest.importorskip("triton", reason="the GPU backend needs triton (pip install apsat[gpu])")
    from apsat.backends.gpu.runner import run_kernels

    res, inputs, want = _optimized(family, "gpu")
    got = run_kernels(res.program, {**res.model.weights, **inputs})
    np.testing.assert_allclose(got["y"] if isinstance(got, dict) else got, want, **TOL)
