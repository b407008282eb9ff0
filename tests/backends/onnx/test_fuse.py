"""The exporter's graph passes (fuse.py, fuse_seq.py, tidy.py) on small hand-written graphs.

Each test writes a graph in the unfused form the walk can leave, runs the pass, checks the
op types after it, and runs both graphs in onnxruntime (no graph optimisation, so what
runs is what was written) on seeded random inputs: equal within rtol 1e-4, atol 1e-5.
Where a pass must not apply (a second reader, a divisor that is not the window count, a
planner that writes the producer to memory), the graph keeps its ops and still equals
itself. These graphs come from no program: unless a test says otherwise, the plan puts
every node in one kernel with its reader (every value written for one term, none stored).
"""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from apsat.backends.onnx.fuse import fuse
from apsat.backends.onnx.peep import Planned
from apsat.backends.onnx.tidy import tidy

RNG = np.random.default_rng(0)


def _model(nodes, inputs: dict, outputs: dict, consts: dict) -> onnx.ModelProto:
    g = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(k, TensorProto.FLOAT, d) for k, d in inputs.items()],
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, d) for k, d in outputs.items()],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 23), helper.make_opsetid("com.microsoft", 1)])


def _run(model, feed: dict) -> list:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, feed)


def _all_together(model) -> Planned:
    """A plan with every value written for one term that no kernel stores."""
    return Planned({o: "one term" for n in model.graph.node for o in n.output}, frozenset())


def _passes(model, inputs: dict, plan: Planned | None = None) -> list:
    """Fuse (by `plan`, or every node with its reader) and tidy a copy of `model`; assert
    it equals the original; its op types."""
    feed = {k: RNG.standard_normal(d).astype(np.float32) for k, d in inputs.items()}
    want = _run(model, feed)
    fused = onnx.ModelProto()
    fused.CopyFrom(model)
    fuse(fused, plan or _all_together(model))
    tidy(fused.graph)
    onnx.checker.check_model(fused, full_check=True)
    for w, g in zip(want, _run(fused, feed)):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    return [n.op_type for n in fused.graph.node]


def _f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def test_conv_bias_residual_and_relu_become_one_fused_conv():
    # conv(x) + c (per channel) + x -> relu  =>  FusedConv(x, w, c, x, activation=Relu)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "bias"], ["cb"]),
             helper.make_node("Add", ["cb", "x"], ["s"]),
             helper.make_node("Relu", ["s"], ["y"])]
    m = _model(nodes, {"x": [1, 8, 6, 6]}, {"y": [1, 8, 6, 6]}, {"w": _f32(8, 8, 3, 3), "bias": _f32(1, 8, 1, 1)})
    assert _passes(m, {"x": [1, 8, 6, 6]}) == ["FusedConv"]


def test_the_plan_says_which_nodes_become_one():
    """Written for two terms: the conv joins its bias-add only where the planner keeps the
    conv's term out of memory; written for one term (an extracted atom), always."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[1, 1]),
             helper.make_node("Add", ["c", "bias"], ["cb"]),
             helper.make_node("Relu", ["cb"], ["y"])]
    m = _model(nodes, {"x": [1, 4, 5, 5]}, {"y": [1, 4, 5, 5]}, {"w": _f32(4, 4, 1, 1), "bias": _f32(1, 4, 1, 1)})
    inputs = {"x": [1, 4, 5, 5]}
    owner = {"c": "conv", "cb": "bias and relu", "y": "bias and relu"}
    assert _passes(m, inputs, Planned(owner, frozenset({"conv"}))) == ["Conv", "Add", "Relu"]
    assert _passes(m, inputs, Planned(owner, frozenset({"bias and relu"}))) == ["FusedConv"]
    # a value written for no term (the tidying made it) stays apart
    assert _passes(m, inputs, Planned({"cb": "t", "y": "t"}, frozenset())) == ["Conv", "Add", "Relu"]


def test_a_conv_read_twice_keeps_its_add():
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[1, 1]),
             helper.make_node("Add", ["c", "bias"], ["y"]),
             helper.make_node("Relu", ["c"], ["z"])]
    m = _model(nodes, {"x": [1, 4, 5, 5]}, {"y": [1, 4, 5, 5], "z": [1, 4, 5, 5]},
               {"w": _f32(4, 4, 1, 1), "bias": _f32(1, 4, 1, 1)})
    assert _passes(m, {"x": [1, 4, 5, 5]}) == ["Conv", "Add", "Relu"]


def test_a_bias_varying_along_space_is_no_conv_bias():
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[1, 1]),
             helper.make_node("Add", ["c", "bias"], ["y"])]
    m = _model(nodes, {"x": [1, 4, 5, 5]}, {"y": [1, 4, 5, 5]}, {"w": _f32(4, 4, 1, 1), "bias": _f32(1, 1, 5, 5)})
    assert _passes(m, {"x": [1, 4, 5, 5]}) == ["Conv", "Add"]


def test_clip_after_a_depthwise_conv_is_its_activation():
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=4),
             helper.make_node("Clip", ["c", "lo", "hi"], ["y"])]
    m = _model(nodes, {"x": [1, 4, 5, 5]}, {"y": [1, 4, 5, 5]},
               {"w": _f32(4, 1, 3, 3), "b": _f32(4), "lo": np.float32(0.0), "hi": np.float32(0.5)})
    assert _passes(m, {"x": [1, 4, 5, 5]}) == ["FusedConv"]


def test_matmul_bias_relu_become_fused_gemm():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]),
             helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"])]
    m = _model(nodes, {"x": [3, 6]}, {"y": [3, 5]}, {"w": _f32(6, 5), "b": _f32(5)})
    assert _passes(m, {"x": [3, 6]}) == ["FusedGemm"]


def test_a_window_sum_over_its_unpadded_count_is_an_exclusive_average_pool():
    attrs = dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1], count_include_pad=1)
    counts = np.outer([2, 3, 3, 2], [2, 3, 3, 2]).astype(np.float32).reshape(1, 1, 4, 4)
    nodes = [helper.make_node("AveragePool", ["x"], ["p"], **attrs),
             helper.make_node("Mul", ["p", "k"], ["s"]),
             helper.make_node("Div", ["s", "n"], ["y"])]
    m = _model(nodes, {"x": [1, 2, 4, 4]}, {"y": [1, 2, 4, 4]}, {"k": np.float32(9.0), "n": counts})
    assert _passes(m, {"x": [1, 2, 4, 4]}) == ["AveragePool"]
    wrong = _model(nodes, {"x": [1, 2, 4, 4]}, {"y": [1, 2, 4, 4]}, {"k": np.float32(9.0), "n": counts + 1})
    assert _passes(wrong, {"x": [1, 2, 4, 4]}) == ["AveragePool", "Mul", "Div"]


def test_scaled_query_and_key_fold_into_attention_scale_and_slices_into_split():
    # qkv = x @ w, split by three Slices; q and k scaled by 0.5 each, through a Reshape
    nodes = [helper.make_node("MatMul", ["x", "w"], ["qkv"])]
    for i, part in enumerate("qkv"):
        nodes.append(helper.make_node("Slice", ["qkv", f"s{i}", f"s{i + 1}", "axis"], [f"{part}2"]))
    for part in "qk":
        nodes += [helper.make_node("Mul", [f"{part}2", "half"], [f"{part}s"]),
                  helper.make_node("Reshape", [f"{part}s", "shape"], [part])]
    nodes += [helper.make_node("Reshape", ["v2", "shape"], ["v"]),
              helper.make_node("Attention", ["q", "k", "v"], ["y"], q_num_heads=2, kv_num_heads=2, scale=1.0)]
    consts = {"w": _f32(8, 24), "half": np.float32(0.5), "shape": np.array([1, 5, 8], np.int64),
              "axis": np.array([1], np.int64), **{f"s{i}": np.array([8 * i], np.int64) for i in range(4)}}
    m = _model(nodes, {"x": [5, 8]}, {"y": [1, 5, 8]}, consts)
    ops = _passes(m, {"x": [5, 8]})
    assert sorted(ops) == ["Attention", "MatMul", "Reshape", "Reshape", "Reshape", "Split"], ops


def test_tidy_shares_equal_nodes_and_merges_nested_concats():
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Relu", ["x"], ["b"]),
             helper.make_node("Concat", ["a", "b"], ["ab"], axis=1),
             helper.make_node("Concat", ["ab", "x"], ["y"], axis=1)]
    m = _model(nodes, {"x": [2, 3]}, {"y": [2, 9]}, {})
    assert _passes(m, {"x": [2, 3]}) == ["Relu", "Concat"]


def test_a_norm_scaled_and_shifted_takes_them_as_its_scale_and_bias():
    nodes = [helper.make_node("LayerNormalization", ["x", "ones"], ["n"], axis=-1),
             helper.make_node("Mul", ["n", "gamma"], ["s"]),
             helper.make_node("Add", ["s", "beta"], ["y"]),
             helper.make_node("RMSNormalization", ["x", "ones"], ["r"], axis=-1),
             helper.make_node("Mul", ["r", "gamma"], ["z"])]
    consts = {"ones": np.ones(6, np.float32), "gamma": _f32(1, 1, 6), "beta": _f32(6)}
    m = _model(nodes, {"x": [2, 3, 6]}, {"y": [2, 3, 6], "z": [2, 3, 6]}, consts)
    assert _passes(m, {"x": [2, 3, 6]}) == ["LayerNormalization", "RMSNormalization"]
    per_row = _model(nodes, {"x": [2, 3, 6]}, {"y": [2, 3, 6], "z": [2, 3, 6]}, {**consts, "gamma": _f32(1, 3, 1)})
    assert _passes(per_row, {"x": [2, 3, 6]}) == ["LayerNormalization", "Mul", "Add", "RMSNormalization", "Mul"]
