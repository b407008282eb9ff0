"""Element types and dims of one node's outputs, where onnx's whole-graph inference left
them unknown.

onnx's shape inference gives up on a value whose shape comes through a chain of shape
arithmetic it does not propagate (an attention mask's `Expand` whose target shape runs
through Shape, Equal, Where and ConstantOfShape). By the time the importer reaches such
a node, it has folded that chain to constants and knows every input's dims, so the node
alone is easy: `infer_node` runs onnx's inference on a one-node model whose constant
inputs are initializers and whose other inputs have their concrete dims. Where onnx still
cannot say, and the op's output shape does not depend on the input values, onnxruntime
runs the node once on zeros of those dims and its result's shape is the answer.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

# Ops whose output shape depends on the values read, not only on the input shapes: running
# them on zeros would give a wrong answer, so their shapes stay unknown.
VALUE_DEPENDENT_SHAPES = frozenset({"NonZero", "Unique", "Compress", "NonMaxSuppression", "TopK",
                                    "Loop", "If", "Scan", "StringSplit", "RandomNormal",
                                    "RandomUniform", "Multinomial", "Bernoulli"})
ORT_IR_VERSION = 10          # onnxruntime 1.31+ accepts up to IR 11
MAX_PROBE_ELEMENTS = 1 << 24   # zeros fed to onnxruntime: at most 64 MiB of float32 per input


def infer_node(node, inputs: list, opsets: dict[str, int], probe: bool = True) -> list[tuple[int, tuple | None]]:
    """(ONNX element type or 0, dims or None) for each output of `node`. `inputs` holds,
    per node input, None (omitted), a numpy array (a constant) or (element type, dims).
    `probe`: where onnx cannot say, run the node on zeros in onnxruntime."""
    model = _one_node_model(node, inputs, opsets)
    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
        known = _value_info(inferred)
    except Exception:
        known = {}
    found = [known.get(name, (0, None)) for name in node.output]
    if not probe or all(dims is not None for _, dims in found) or node.op_type in VALUE_DEPENDENT_SHAPES:
        return found
    probed = _probe_with_onnxruntime(node, inputs, opsets, [elem for elem, _ in found])
    return [f if f[1] is not None or p is None else (f[0] or p[0], p[1])
            for f, p in zip(found, probed)]


def _one_node_model(node, inputs: list, opsets: dict[str, int], out_types=None):
    """A model of the lone node: constants as initializers, other inputs as typed graph
    inputs; every output declared without a shape, of type `out_types[k]` (default 0:
    unknown, which onnx's inference accepts and onnxruntime does not)."""
    graph_inputs, inits = [], []
    for name, v in zip(node.input, inputs):
        if not name or v is None:
            continue
        if isinstance(v, np.ndarray):
            inits.append(numpy_helper.from_array(np.asarray(v, order="C"), name))
        else:
            graph_inputs.append(helper.make_tensor_value_info(name, v[0] or onnx.TensorProto.FLOAT,
                                                              list(v[1])))
    types = out_types or [0] * len(node.output)
    outs = [helper.make_tensor_value_info(o, t, None) for o, t in zip(node.output, types) if o]
    graph = helper.make_graph([node], "node", graph_inputs, outs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()])
    model.ir_version = ORT_IR_VERSION
    return model


def _value_info(model) -> dict:
    out = {}
    for vi in list(model.graph.value_info) + list(model.graph.output):
        t = vi.type.tensor_type
        dims = None
        if t.HasField("shape") and all(d.HasField("dim_value") for d in t.shape.dim):
            dims = tuple(int(d.dim_value) for d in t.shape.dim)
        out[vi.name] = (t.elem_type, dims)
    return out


def _probe_with_onnxruntime(node, inputs: list, opsets: dict[str, int], out_types: list) -> list:
    """Run the node once on zeros of its inputs' dims; per output (type, dims) or None.
    Outputs need their element types (`out_types`) for onnxruntime to load the node."""
    import onnxruntime as ort

    if not all(out_types):
        return [None] * len(node.output)
    feeds = {}
    for name, v in zip(node.input, inputs):
        if name and v is not None and not isinstance(v, np.ndarray):
            if int(np.prod(v[1], dtype=np.int64)) > MAX_PROBE_ELEMENTS:
                return [None] * len(node.output)
            dtype = helper.tensor_dtype_to_np_dtype(v[0] or onnx.TensorProto.FLOAT)
            feeds[name] = np.zeros(v[1], dtype=dtype)
    model = _one_node_model(node, inputs, opsets, out_types)
    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        names = [o for o in node.output if o]
        values = dict(zip(names, sess.run(names, feeds)))
    except Exception:
        return [None] * len(node.output)
    return [None if name not in values else
            (helper.np_dtype_to_tensor_dtype(values[name].dtype), tuple(values[name].shape))
            for name in node.output]
