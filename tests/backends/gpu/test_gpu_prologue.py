"""Prologues: an element-wise chain that no producer's epilogue takes is computed inside
its one consumer kernel's operand loads (DenseNet's BatchNorm and ReLU before each
convolution, a squeeze-excitation's channel scale before the projection). Each case checks
which kernels remain and equals onnxruntime under the Triton interpreter
(apsat.pipeline.verify's tolerances: rtol 1e-4, atol 1e-5 x the output's scale)."""
from __future__ import annotations

import numpy as np
from gpu_cases import optimized_matches_onnxruntime
from models import make_model
from onnx import helper

import apsat
from apsat.backends.gpu.expr import value_nodes
from apsat.backends.gpu.lower import lower


def _run(model, triton_run):
    """The per-inference kernels, after checking them against onnxruntime; without the
    copy of an output that is a view (NCHW of the gemm's rows)."""
    _, graph = optimized_matches_onnxruntime(model, triton_run)
    once = {s.name for s in graph.prepare_steps}
    return [k for k in graph.kernels if k.name not in once and not k.name.endswith("_copy")]


def _dense_layer(seed=0):
    """Concat(x, x2) -> BatchNorm -> Relu -> Conv 3x3 padded: DenseNet's pre-activation
    layer. The shift is non-zero, so relu(bn(0)) != 0 and the padding must stay outside
    the prologue (a padded element is 0, not the chain at 0)."""
    rng = np.random.default_rng(seed)
    c = 6
    w = {"scale": rng.uniform(0.5, 1.5, c).astype(np.float32),
         "shift": rng.uniform(0.2, 1.0, c).astype(np.float32),
         "mean": rng.standard_normal(c).astype(np.float32),
         "var": rng.uniform(0.5, 1.5, c).astype(np.float32),
         "w": (rng.standard_normal((5, c, 3, 3)) * 0.3).astype(np.float32)}
    nodes = [helper.make_node("Concat", ["x", "x2"], ["cat"], axis=1),
             helper.make_node("BatchNormalization", ["cat", "scale", "shift", "mean", "var"], ["b"]),
             helper.make_node("Relu", ["b"], ["r"]),
             helper.make_node("Conv", ["r", "w"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])]
    return make_model(nodes, {"x": (1, 2, 7, 7), "x2": (1, 4, 7, 7)}, ["y"], w)


def _squeeze_excite(seed=0):
    """GlobalAveragePool -> Sigmoid -> Mul(x, s) -> Conv 1x1: the channel scale of a
    squeeze-excitation block before the projection."""
    rng = np.random.default_rng(seed)
    w = {"w": (rng.standard_normal((5, 8, 1, 1)) * 0.3).astype(np.float32)}
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["p"]),
             helper.make_node("Sigmoid", ["p"], ["s"]),
             helper.make_node("Mul", ["x", "s"], ["m"]),
             helper.make_node("Conv", ["m", "w"], ["y"], kernel_shape=[1, 1])]
    return make_model(nodes, {"x": (1, 8, 5, 6)}, ["y"], w)


def test_batchnorm_relu_before_a_padded_conv_is_its_prologue(triton_run):
    kernels = _run(_dense_layer(), triton_run)
    assert [k.kind for k in kernels] == ["gemm"]
    tags = {v[:2] for v in value_nodes(kernels[0].values["a"])}
    # the chain (relu is max(x, 0) after BatchNorm's multiply-add) is in the conv's operand
    assert {("call", "max"), ("call", "mul"), ("call", "add")} <= tags
    assert any(t[0] == "where" for t in tags)          # and the padding wraps it


def test_channel_scale_is_the_projection_prologue(triton_run):
    kernels = _run(_squeeze_excite(), triton_run)
    # the pool (its sigmoid in the epilogue), then the 1x1 conv reading x * s
    assert [k.kind for k in kernels] == ["reduce", "gemm"]
    assert all(k.kind != "elementwise" for k in kernels)


def test_a_chain_with_two_consumers_keeps_its_kernel():
    """Relu read by a 1x1 and a 3x3 convolution (different windows, so not one merged
    product): computed once, stored, read twice (no recompute across kernels)."""
    rng = np.random.default_rng(1)
    w = {"w1": (rng.standard_normal((3, 4, 1, 1)) * 0.3).astype(np.float32),
         "w2": (rng.standard_normal((3, 4, 3, 3)) * 0.3).astype(np.float32),
         "b": rng.standard_normal((1, 4, 1, 1)).astype(np.float32)}
    nodes = [helper.make_node("Add", ["x", "b"], ["a"]),
             helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Conv", ["r", "w1"], ["y1"], kernel_shape=[1, 1]),
             helper.make_node("Conv", ["r", "w2"], ["y2"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])]
    res = apsat.optimize(apsat.load_onnx(make_model(nodes, {"x": (1, 4, 5, 5)}, ["y1", "y2"], w)),
                         target="gpu")
    assert res.report["verification"]["ok"]
    kinds = [k.kind for k in lower(res.program).kernels if not k.name.endswith("_copy")]
    assert kinds.count("elementwise") == 1 and kinds.count("gemm") == 2


def _grouped_conv_then(reader_nodes, seed=4):
    """Conv 1x1 in 2 groups + per-channel bias (an Add, which the fusion rules leave to
    the lowering for a grouped conv) -> `reader_nodes` (reading "a", writing "y")."""
    rng = np.random.default_rng(seed)
    w = {"w": (rng.standard_normal((6, 2, 1, 1)) * 0.3).astype(np.float32),
         "b": rng.standard_normal((1, 6, 1, 1)).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[1, 1], group=2),
             helper.make_node("Add", ["c", "b"], ["a"]), *reader_nodes]
    return make_model(nodes, {"x": (1, 4, 5, 6)}, ["y"], w)


def test_a_chain_read_by_a_local_operator_rides_on_its_producer(triton_run):
    """Epilogue first: the LRN reads each relu value for 3 channels, so the bias and relu
    are the conv's epilogue, computed once, not the LRN's prologue (AlexNet's conv2)."""
    nodes = [helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("LRN", ["r"], ["y"], size=3, alpha=1e-4, beta=0.75, bias=1.0)]
    kernels = _run(_grouped_conv_then(nodes), triton_run)
    product = [k for k in kernels if k.kind == "gemm"]
    assert len(kernels) == 2 and len(product) == 1
    assert ("call", "max") in {v[:2] for v in value_nodes(product[0].values["out"])}
    assert all("relu" not in k.covers for k in kernels if k.kind != "gemm")


def test_a_chain_read_through_a_concatenation_rides_on_its_producer(triton_run):
    """Epilogue first: relu(concat(conv + bias, x)) (ShuffleNet's unit joins its branch
    with the shortcut, then applies the relu): the bias is the conv's epilogue, not
    recomputed inside the relu's kernel."""
    nodes = [helper.make_node("Concat", ["a", "x"], ["cat"], axis=1),
             helper.make_node("Relu", ["cat"], ["y"])]
    kernels = _run(_grouped_conv_then(nodes), triton_run)
    product = [k for k in kernels if k.kind == "gemm"]
    assert len(kernels) == 2 and len(product) == 1 and "elementwise-add" in product[0].covers
    assert all("elementwise-add" not in k.covers for k in kernels if k.kind != "gemm")


# ---- small reductions, unrolled in their consumer ------------------------------------------

def _pool_then_conv(pool: str, conv_kernel=1, seed=0, **pool_attrs):
    """`pool` (3x3, stride 1, padded) -> Conv `conv_kernel`x`conv_kernel` + bias -> Relu."""
    rng = np.random.default_rng(seed)
    k = conv_kernel
    w = {"w": (rng.standard_normal((5, 6, k, k)) * 0.3).astype(np.float32),
         "b": rng.standard_normal(5).astype(np.float32)}
    nodes = [helper.make_node(pool, ["x"], ["p"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], **pool_attrs),
             helper.make_node("Conv", ["p", "w", "b"], ["c"], kernel_shape=[k, k], pads=[k // 2] * 4),
             helper.make_node("Relu", ["c"], ["y"])]
    return make_model(nodes, {"x": (1, 6, 7, 9)}, ["y"], w)


def test_max_pool_before_a_1x1_conv_is_unrolled_in_it(triton_run):
    """Inception's pool projection: the 3x3 max (padded with -inf) in the conv's loads."""
    kernels = _run(_pool_then_conv("MaxPool"), triton_run)
    assert [k.kind for k in kernels] == ["gemm"]
    assert ("call", "max") in {v[:2] for v in value_nodes(kernels[0].values["a"])}


def test_average_pool_and_its_scale_before_a_1x1_conv_are_unrolled_in_it(triton_run):
    kernels = _run(_pool_then_conv("AveragePool", count_include_pad=0), triton_run)
    assert [k.kind for k in kernels] == ["gemm"]


def test_a_pool_read_by_overlapping_windows_keeps_its_kernel(triton_run):
    """Before a 3x3 conv each pooled value would be recomputed for 9 taps: not unrolled."""
    kernels = _run(_pool_then_conv("MaxPool", conv_kernel=3), triton_run)
    assert [k.kind for k in kernels] == ["reduce", "gemm"]


def test_depthwise_conv_before_a_1x1_conv_is_unrolled_in_it(triton_run):
    """ShuffleNet and MobileNet's depthwise 3x3 then pointwise 1x1: one gemm kernel."""
    rng = np.random.default_rng(2)
    w = {"dw": (rng.standard_normal((6, 1, 3, 3)) * 0.3).astype(np.float32),
         "pw": (rng.standard_normal((4, 6, 1, 1)) * 0.3).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "dw"], ["d"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=6),
             helper.make_node("Conv", ["d", "pw"], ["y"], kernel_shape=[1, 1])]
    kernels = _run(make_model(nodes, {"x": (1, 6, 5, 7)}, ["y"], w), triton_run)
    assert [k.kind for k in kernels] == ["gemm"]


def test_a_pool_before_a_matrix_vector_product_keeps_its_kernel(triton_run):
    """A 4x4 global pool is small, but the classifier (one row per class) would redo it
    per class: the pool stays a kernel."""
    rng = np.random.default_rng(3)
    w = {"w": (rng.standard_normal((6, 5)) * 0.3).astype(np.float32)}
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["p"]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("MatMul", ["f", "w"], ["y"])]
    kernels = _run(make_model(nodes, {"x": (1, 6, 4, 4)}, ["y"], w), triton_run)
    assert [k.kind for k in kernels] == ["reduce", "reduce"]


def test_squeeze_excitation_is_two_kernels_before_the_projection(triton_run):
    """EfficientNet's SE: GlobalAveragePool -> 1x1 conv + SiLU -> 1x1 conv -> Sigmoid ->
    channel scale -> 1x1 projection. The pool and the squeeze conv (SiLU in its
    epilogue) are the block's two kernels; the excite conv over 4 values, its sigmoid
    and the channel scale are unrolled in the projection's operand loads."""
    rng = np.random.default_rng(5)
    c, s = 12, 4
    w = {"w1": (rng.standard_normal((s, c, 1, 1)) * 0.3).astype(np.float32),
         "b1": rng.standard_normal(s).astype(np.float32),
         "w2": (rng.standard_normal((c, s, 1, 1)) * 0.3).astype(np.float32),
         "b2": rng.standard_normal(c).astype(np.float32),
         "wp": (rng.standard_normal((6, c, 1, 1)) * 0.3).astype(np.float32)}
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["p"]),
             helper.make_node("Conv", ["p", "w1", "b1"], ["q"], kernel_shape=[1, 1]),
             helper.make_node("Sigmoid", ["q"], ["qs"]),
             helper.make_node("Mul", ["q", "qs"], ["h"]),
             helper.make_node("Conv", ["h", "w2", "b2"], ["e"], kernel_shape=[1, 1]),
             helper.make_node("Sigmoid", ["e"], ["g"]),
             helper.make_node("Mul", ["x", "g"], ["m"]),
             helper.make_node("Conv", ["m", "wp"], ["y"], kernel_shape=[1, 1])]
    kernels = _run(make_model(nodes, {"x": (1, c, 5, 7)}, ["y"], w), triton_run)
    assert [k.kind for k in kernels] == ["reduce", "reduce", "gemm"]
    assert "silu" in kernels[1].covers
    assert {"dot-product", "sigmoid", "elementwise-mul"} <= set(kernels[2].covers)


def test_a_materialised_norm_takes_its_scale_and_shift_in_its_epilogue():
    """GPT-2 with symbolic dims: its layer norms keep kernels of their own (their readers
    cannot work out the row statistics), and each takes its scale and shift in its
    epilogue, computed once, not in every reader tile's loads; the ONNX export then writes
    each as one LayerNormalization with its scale and bias (no Mul after one)."""
    from pathlib import Path

    res = apsat.optimize(Path(__file__).resolve().parents[2] / "data" / "dynamic" / "gpt2.onnx",
                         target="gpu", verify=False)
    norms = [k for k in res.lowered.artifact.kernels if "layer-norm" in k.covers]
    assert norms and all({"elementwise-mul", "elementwise-add"} <= set(k.covers) for k in norms)
    proto = res.to_onnx()
    made = {o: n.op_type for n in proto.graph.node for o in n.output}
    assert not any(n.op_type == "Mul" and "LayerNormalization" in (made.get(i) for i in n.input)
                   for n in proto.graph.node)
