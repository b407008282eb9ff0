"""ONNX model builders shared by tests (onnx.helper, static shapes, opset 17 by default).

    make_model(nodes, inputs, outputs, weights)   any graph; output types by shape inference
    single_op(op, inputs, attrs)                  one node: inputs are shapes (graph inputs)
                                                  or arrays (initializers)
    attention_block(), gelu_mlp(), small_convnet()  small real-world blocks
    elementwise_chain(ops)                        Add -> Relu -> Sigmoid and other element-wise runs
    conv_batchnorm()                              Conv -> BatchNormalization -> Relu (folds into weights)
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

FLOAT = TensorProto.FLOAT


def make_model(nodes, inputs: dict, outputs: list[str], weights: dict | None = None,
               opset: int = 17, extra_opsets: dict | None = None) -> onnx.ModelProto:
    """A model over `nodes`. `inputs`: name -> dims (float32 graph inputs); `weights`:
    name -> array (initializers); outputs are typed and shaped by shape inference."""
    weights = weights or {}
    graph = helper.make_graph(
        nodes, "test",
        [helper.make_tensor_value_info(n, FLOAT, list(d)) for n, d in inputs.items()],
        [helper.make_tensor_value_info(n, 0, None) for n in outputs],   # typed by inference
        initializer=[numpy_helper.from_array(np.asarray(v), n) for n, v in weights.items()])
    opsets = [helper.make_opsetid("", opset)]
    opsets += [helper.make_opsetid(d, v) for d, v in (extra_opsets or {}).items()]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    inferred = onnx.shape_inference.infer_shapes(model)
    del model.graph.output[:]
    model.graph.output.extend(inferred.graph.output)
    return model


def single_op(op: str, inputs: list, attrs: dict | None = None, n_outputs: int = 1,
              opset: int = 17, domain: str = "") -> onnx.ModelProto:
    """One `op` node. Each input is dims (a float32 graph input), an ndarray (an
    initializer), or None (an omitted optional input). Outputs are y0, y1, ..."""
    names, graph_inputs, weights = [], {}, {}
    for i, spec in enumerate(inputs):
        if spec is None:
            names.append("")
        elif isinstance(spec, np.ndarray):
            names.append(f"w{i}")
            weights[f"w{i}"] = spec
        else:
            names.append(f"x{i}")
            graph_inputs[f"x{i}"] = tuple(spec)
    outs = [f"y{k}" for k in range(n_outputs)]
    node = helper.make_node(op, names, outs, domain=domain, **(attrs or {}))
    return make_model([node], graph_inputs, outs, weights, opset=opset)


def _w(rng, *shape, scale=None):
    scale = 1.0 / np.sqrt(shape[0]) if scale is None else scale
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _const(name, value):
    tensor = numpy_helper.from_array(np.asarray(value), name + "_v")
    return helper.make_node("Constant", [], [name], value=tensor)


def attention_block(batch=2, seq=8, d_model=32, heads=4, seed=0, opset=17) -> onnx.ModelProto:
    """Pre-LN self-attention with a residual: LayerNormalization, Q/K/V projections,
    heads split by Reshape+Transpose, softmax(Q K^T / sqrt(d)) V, heads merged, output
    projection, Add. The head reshape target is computed from Shape/Gather/Concat and the
    scale from Shape/Gather/Cast/Sqrt, as exporters write them, so both must fold."""
    rng = np.random.default_rng(seed)
    dh = d_model // heads
    w = {"ln_s": 1 + 0.1 * _w(rng, d_model, scale=1.0), "ln_b": 0.1 * _w(rng, d_model, scale=1.0)}
    for p in "qkvo":
        w[f"W{p}"], w[f"b{p}"] = _w(rng, d_model, d_model), 0.1 * _w(rng, d_model, scale=1.0)
    w["merge"] = np.array([batch, seq, d_model], dtype=np.int64)
    nodes = [
        helper.make_node("LayerNormalization", ["x", "ln_s", "ln_b"], ["h"], axis=-1, epsilon=1e-5),
        helper.make_node("Shape", ["x"], ["shp"]),
        _const("i0", np.array([0], dtype=np.int64)), _const("i1", np.array([1], dtype=np.int64)),
        helper.make_node("Gather", ["shp", "i0"], ["B"], axis=0),
        helper.make_node("Gather", ["shp", "i1"], ["S"], axis=0),
        _const("hd", np.array([heads, dh], dtype=np.int64)),
        helper.make_node("Concat", ["B", "S", "hd"], ["split_shape"], axis=0),
    ]
    for p in "qkv":
        nodes += [helper.make_node("MatMul", ["h", f"W{p}"], [f"{p}m"]),
                  helper.make_node("Add", [f"{p}m", f"b{p}"], [f"{p}a"]),
                  helper.make_node("Reshape", [f"{p}a", "split_shape"], [f"{p}r"])]
    nodes += [
        helper.make_node("Transpose", ["qr"], ["q"], perm=[0, 2, 1, 3]),
        helper.make_node("Transpose", ["kr"], ["kt"], perm=[0, 2, 3, 1]),
        helper.make_node("Transpose", ["vr"], ["v"], perm=[0, 2, 1, 3]),
        helper.make_node("MatMul", ["q", "kt"], ["scores"]),
        helper.make_node("Shape", ["q"], ["qshape"]),
        _const("i3", np.array(3, dtype=np.int64)),
        helper.make_node("Gather", ["qshape", "i3"], ["dh_int"], axis=0),
        helper.make_node("Cast", ["dh_int"], ["dh_f"], to=FLOAT),
        helper.make_node("Sqrt", ["dh_f"], ["scale"]),
        helper.make_node("Div", ["scores", "scale"], ["scaled"]),
        helper.make_node("Softmax", ["scaled"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "v"], ["ctx"]),
        helper.make_node("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["ctx_t", "merge"], ["merged"]),
        helper.make_node("MatMul", ["merged", "Wo"], ["om"]),
        helper.make_node("Add", ["om", "bo"], ["oa"]),
        helper.make_node("Add", ["x", "oa"], ["y"]),
    ]
    return make_model(nodes, {"x": (batch, seq, d_model)}, ["y"], w, opset=opset)


def gelu_mlp(batch=2, seq=8, d_model=16, hidden=64, seed=0, opset=17) -> onnx.ModelProto:
    """MatMul + bias, GELU written with Erf as exporters do (x * 0.5 * (1 + erf(x / sqrt 2))),
    MatMul + bias."""
    rng = np.random.default_rng(seed)
    w = {"W1": _w(rng, d_model, hidden), "b1": 0.1 * _w(rng, hidden, scale=1.0),
         "W2": _w(rng, hidden, d_model), "b2": 0.1 * _w(rng, d_model, scale=1.0)}
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["m1"]),
        helper.make_node("Add", ["m1", "b1"], ["h"]),
        _const("sqrt2", np.array(np.sqrt(2.0), dtype=np.float32)),
        _const("one", np.array(1.0, dtype=np.float32)),
        _const("half", np.array(0.5, dtype=np.float32)),
        helper.make_node("Div", ["h", "sqrt2"], ["hs"]),
        helper.make_node("Erf", ["hs"], ["e"]),
        helper.make_node("Add", ["e", "one"], ["e1"]),
        helper.make_node("Mul", ["h", "e1"], ["he"]),
        helper.make_node("Mul", ["he", "half"], ["g"]),
        helper.make_node("MatMul", ["g", "W2"], ["m2"]),
        helper.make_node("Add", ["m2", "b2"], ["y"]),
    ]
    return make_model(nodes, {"x": (batch, seq, d_model)}, ["y"], w, opset=opset)


def small_convnet(seed=0, opset=17) -> onnx.ModelProto:
    """Conv+bias+Relu twice with a residual Add, MaxPool, GlobalAveragePool, Flatten, Gemm."""
    rng = np.random.default_rng(seed)
    w = {"c1w": _w(rng, 8, 3, 3, 3, scale=1 / np.sqrt(27)), "c1b": 0.1 * _w(rng, 8, scale=1.0),
         "c2w": _w(rng, 8, 8, 3, 3, scale=1 / np.sqrt(72)), "c2b": 0.1 * _w(rng, 8, scale=1.0),
         "fw": _w(rng, 10, 8, scale=1 / np.sqrt(8)), "fb": 0.1 * _w(rng, 10, scale=1.0)}
    nodes = [
        helper.make_node("Conv", ["x", "c1w", "c1b"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "c2w", "c2b"], ["c2"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c2", "r1"], ["res"]),
        helper.make_node("Relu", ["res"], ["r2"]),
        helper.make_node("MaxPool", ["r2"], ["mp"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("GlobalAveragePool", ["mp"], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["flat"], axis=1),
        helper.make_node("Gemm", ["flat", "fw", "fb"], ["y"], transB=1),
    ]
    return make_model(nodes, {"x": (1, 3, 16, 16)}, ["y"], w, opset=opset)


def shared_branch_convnet(channels=64, size=32, seed=0, opset=17) -> onnx.ModelProto:
    """The shared-branch trap: y = conv1(x); out = y + conv2(relu6(y)). Fusing relu6 into
    conv1 helps the second branch only if conv1 is not then computed twice."""
    rng = np.random.default_rng(seed)
    c = channels
    w = {"w1": _w(rng, c, c, 3, 3, scale=1 / np.sqrt(9 * c)), "b1": 0.1 * _w(rng, c, scale=1.0),
         "w2": _w(rng, c, c, 3, 3, scale=1 / np.sqrt(9 * c)), "b2": 0.1 * _w(rng, c, scale=1.0),
         "lo": np.array(0.0, np.float32), "hi": np.array(6.0, np.float32)}
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Clip", ["y", "lo", "hi"], ["r"]),
        helper.make_node("Conv", ["r", "w2", "b2"], ["z"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["y", "z"], ["out"]),
    ]
    return make_model(nodes, {"x": (1, c, size, size)}, ["out"], w, opset=opset)


def mlp3(batch=5, sizes=(20, 37, 29, 10), seed=0, opset=17) -> onnx.ModelProto:
    """A 3-layer perceptron: Gemm + Relu, Gemm + Relu, Gemm (sizes not multiples of 16)."""
    rng = np.random.default_rng(seed)
    w, nodes, prev = {}, [], "x"
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        w[f"W{i}"] = _w(rng, n_out, n_in, scale=1 / np.sqrt(n_in))
        w[f"b{i}"] = 0.1 * _w(rng, n_out, scale=1.0)
        last = i == len(sizes) - 2
        out = "y" if last else f"g{i}"
        nodes.append(helper.make_node("Gemm", [prev, f"W{i}", f"b{i}"], [out], transB=1))
        if not last:
            nodes.append(helper.make_node("Relu", [out], [f"h{i}"]))
            prev = f"h{i}"
    return make_model(nodes, {"x": (batch, sizes[0])}, ["y"], w, opset=opset)


def encoder_block(batch=2, seq=8, d_model=32, heads=4, hidden=64, seed=0, opset=17) -> onnx.ModelProto:
    """A pre-LN transformer encoder block: attention_block() (LayerNormalization,
    attention with softmax, residual), then LayerNormalization, gelu_mlp() and a second
    residual Add. The MLP's names are prefixed `mlp_`."""
    att = attention_block(batch, seq, d_model, heads, seed, opset)
    mlp = gelu_mlp(batch, seq, d_model, hidden, seed + 1, opset)
    rng = np.random.default_rng(seed + 2)
    weights = {i.name: numpy_helper.to_array(i) for i in att.graph.initializer}
    weights.update({f"mlp_{i.name}": numpy_helper.to_array(i) for i in mlp.graph.initializer})
    weights["ln2_s"] = 1 + 0.1 * _w(rng, d_model, scale=1.0)
    weights["ln2_b"] = 0.1 * _w(rng, d_model, scale=1.0)
    nodes = list(att.graph.node)
    nodes.append(helper.make_node("LayerNormalization", ["y", "ln2_s", "ln2_b"], ["h2"],
                                  axis=-1, epsilon=1e-5))

    def rename(name):
        return "h2" if name == "x" else f"mlp_{name}" if name else name

    for node in mlp.graph.node:
        n = onnx.NodeProto()
        n.CopyFrom(node)
        n.input[:] = [rename(i) for i in node.input]
        n.output[:] = [rename(o) for o in node.output]
        n.name = f"mlp_{node.name}" if node.name else ""
        nodes.append(n)
    nodes.append(helper.make_node("Add", ["y", "mlp_y"], ["out"]))
    return make_model(nodes, {"x": (batch, seq, d_model)}, ["out"], weights, opset=opset)


def grouped_convnet(seed=0, opset=17) -> onnx.ModelProto:
    """A grouped Conv (2 groups) + bias + Relu, a depthwise strided Conv without bias, and
    an AveragePool padded on one side."""
    rng = np.random.default_rng(seed)
    w = {"gw": _w(rng, 8, 2, 3, 3, scale=0.3), "gb": 0.1 * _w(rng, 8, scale=1.0),
         "dw": _w(rng, 8, 1, 3, 3, scale=0.3)}
    nodes = [
        helper.make_node("Conv", ["x", "gw", "gb"], ["g"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=2),
        helper.make_node("Relu", ["g"], ["r"]),
        helper.make_node("Conv", ["r", "dw"], ["d"], kernel_shape=[3, 3], strides=[2, 2], group=8),
        helper.make_node("AveragePool", ["d"], ["y"], kernel_shape=[2, 2], strides=[1, 1], pads=[0, 0, 1, 1]),
    ]
    return make_model(nodes, {"x": (1, 4, 9, 9)}, ["y"], w, opset=opset)


def conv_batchnorm_scale(seed=0, opset=17) -> onnx.ModelProto:
    """Conv (no bias) -> BatchNormalization -> Mul and Add of per-channel vectors laid out
    by Unsqueeze (a Caffe "Scale" layer, as light Inception-v2 has after every
    BatchNorm) -> Relu: both scales fold into the conv's weights, both shifts into its
    bias."""
    rng = np.random.default_rng(seed)
    weights = {"w": _w(rng, 8, 4, 3, 3), "scale": _w(rng, 8, scale=1.0), "shift": _w(rng, 8, scale=1.0),
               "mean": _w(rng, 8, scale=1.0), "var": (np.abs(_w(rng, 8, scale=1.0)) + 0.5).astype(np.float32),
               "sc_w": _w(rng, 8, scale=1.0), "sc_b": _w(rng, 8, scale=1.0),
               "axes": np.array([1, 2], dtype=np.int64)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "scale", "shift", "mean", "var"], ["b"]),
             helper.make_node("Unsqueeze", ["sc_w", "axes"], ["sw"]),
             helper.make_node("Unsqueeze", ["sc_b", "axes"], ["sb"]),
             helper.make_node("Mul", ["b", "sw"], ["m"]),
             helper.make_node("Add", ["m", "sb"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"])]
    return make_model(nodes, {"x": (1, 4, 12, 12)}, ["y"], weights, opset=opset)


def elementwise_chain(ops=("Add", "Relu", "Sigmoid"), shape=(3, 37), seed=0, opset=17) -> onnx.ModelProto:
    """A run of element-wise ops: a binary op of input x and a weight w (Add, Mul, ...),
    then unary ops (Relu, Sigmoid, Tanh, ...), one after the other; output y."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(shape).astype(np.float32)
    nodes, prev = [helper.make_node(ops[0], ["x", "w"], ["h0"])], "h0"
    for i, op in enumerate(ops[1:], 1):
        out = "y" if i == len(ops) - 1 else f"h{i}"
        nodes.append(helper.make_node(op, [prev], [out]))
        prev = out
    return make_model(nodes, {"x": shape}, ["y"], {"w": w}, opset=opset)


def conv_batchnorm(seed=0, opset=17) -> onnx.ModelProto:
    """Conv (no bias) -> BatchNormalization -> Relu: the BatchNorm folds into the conv's
    weights and bias, work on weights alone."""
    rng = np.random.default_rng(seed)
    weights = {"w": _w(rng, 8, 4, 3, 3), "scale": _w(rng, 8, scale=1.0), "shift": _w(rng, 8, scale=1.0),
               "mean": _w(rng, 8, scale=1.0), "var": (np.abs(_w(rng, 8, scale=1.0)) + 0.5).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "scale", "shift", "mean", "var"], ["b"]),
             helper.make_node("Relu", ["b"], ["y"])]
    return make_model(nodes, {"x": (1, 4, 12, 12)}, ["y"], weights, opset=opset)
