"""The light model zoo shipped inside the `onnx` package, and the oracle to compare with.

The nine `onnx/backend/test/data/light/*.onnx` models (opset 9) store every weight as a
ConstantOfShape filled with 0.02, so their stored outputs say nothing. `randomize_weights`
gives them seeded random weights; `ort_run` runs a model in onnxruntime as a plain oracle
(2 threads, graph optimisations off); `logits_output` adds the input of a final Softmax
as an extra graph output (`softmax_logits` names it), so the logits are compared too: a
softmax over 1000 classes squashes most errors in its input.
"""
from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from apsat.pipeline.inputs import random_inputs  # noqa: F401  (the zoo's inputs; re-exported)
from apsat.errors import ModelError


def light_model_paths() -> list[Path]:
    """The light models inside the installed onnx package, sorted by name."""
    root = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
    return sorted(root.glob("*.onnx"))


def _random_weight(name: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """N(0, 1/fan_in) for >= 2-D weights (fan_in = prod(shape[1:])); 1 + 0.1 N(0, 1) for
    1-D parameters, so BatchNorm variances stay positive. Seeded per name, so a weight's
    values do not depend on which other weights the model has."""
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    if len(shape) >= 2:
        w = rng.standard_normal(shape, dtype=np.float32)
        w *= np.float32(1.0 / np.sqrt(np.prod(shape[1:])))     # in place: VGG's fc6 is 400 MB
        return w
    return (1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)


def _is_constant_valued(init) -> bool:
    """A float initializer whose elements are all equal (a placeholder, not trained)."""
    if init.data_type != onnx.TensorProto.FLOAT or int(np.prod(init.dims)) < 2:
        return False
    arr = numpy_helper.to_array(init)
    return bool(np.all(arr == arr.reshape(-1)[0]))


def randomize_weights(model_proto: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """A copy whose float ConstantOfShape weights (with a constant shape) and constant-
    valued float initializers are seeded random initializers (see `_random_weight`).
    Shape initializers no longer read are dropped (with their old-style graph inputs).
    Large tensors are written in place (raw_data), never copied between messages."""
    model = onnx.ModelProto()
    model.CopyFrom(model_proto)
    g = model.graph
    inits = {i.name: i for i in g.initializer}
    replaced = []
    for idx in range(len(g.node) - 1, -1, -1):
        node = g.node[idx]
        value = next((a.t for a in node.attribute if a.name == "value"), None)
        is_float = value is None or value.data_type == onnx.TensorProto.FLOAT
        if node.op_type == "ConstantOfShape" and is_float and node.input[0] in inits:
            shape = tuple(int(d) for d in numpy_helper.to_array(inits[node.input[0]]).reshape(-1))
            replaced.append((node.output[0], shape))
            del g.node[idx]
    for init in g.initializer:
        if _is_constant_valued(init):
            _fill(init, init.name, tuple(init.dims), seed)
    for name, shape in reversed(replaced):
        _fill(g.initializer.add(), name, shape, seed)
        if model.ir_version < 4:     # IR < 4: every initializer is also a graph input
            g.input.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, list(shape)))
    _drop_unread_initializers(g)
    return model


def _fill(tensor, name: str, shape: tuple[int, ...], seed: int):
    """Overwrite a TensorProto in place with `_random_weight(name, shape, seed)`."""
    tensor.Clear()
    tensor.name = name
    tensor.data_type = onnx.TensorProto.FLOAT
    tensor.dims.extend(shape)
    tensor.raw_data = _random_weight(name, shape, seed).astype("<f4", copy=False).tobytes()


def _drop_unread_initializers(g):
    read = {i for n in g.node for i in n.input} | {o.name for o in g.output}
    dead = {i.name for i in g.initializer if i.name not in read}
    for field in (g.initializer, g.input):
        for idx in range(len(field) - 1, -1, -1):
            if field[idx].name in dead:
                del field[idx]


# onnx.helper.make_model stamps the newest IR version, which a released onnxruntime may
# refuse ("Unsupported model IR version"). IR 10 covers every opset the importer reads, so
# the oracle runs newer-stamped models with their IR version lowered to it.
ORT_IR_VERSION = 10


def ort_session(model_proto: onnx.ModelProto):
    """An onnxruntime InferenceSession of the model on the CPU, 2 threads, no graph
    optimisation (the plain oracle: no fused kernels that reorder arithmetic). A model
    stamped with an IR version above ORT_IR_VERSION runs as a copy stamped ORT_IR_VERSION.
    Large weights reach it best as inputs (`weights_as_inputs`). onnxruntime's own
    exception when it refuses the model."""
    import onnxruntime as ort

    if model_proto.ir_version > ORT_IR_VERSION:
        model_proto = onnx.ModelProto.FromString(model_proto.SerializeToString())
        model_proto.ir_version = ORT_IR_VERSION
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 4     # fatal only: every error is raised to the caller, who reports it once
    return ort.InferenceSession(model_proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def without_initializers(model_proto: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of every field of the model but its graph's initializers (cheap: no weight
    bytes), for a caller to add the initializers it keeps."""
    model = onnx.ModelProto()
    model.ir_version, g, src = model_proto.ir_version, model.graph, model_proto.graph
    model.opset_import.extend(model_proto.opset_import)
    model.functions.extend(model_proto.functions)
    for field in ("node", "input", "output", "value_info", "sparse_initializer"):
        getattr(g, field).extend(getattr(src, field))
    g.name = src.name
    return model


def weights_as_inputs(model_proto: onnx.ModelProto, names) -> onnx.ModelProto:
    """A copy (without those tensors' bytes) whose initializers in `names` are typed graph
    inputs instead: fed at run time, onnxruntime reads the arrays where they lie, where
    it copies an initializer (external ones included) into the session."""
    names = set(names)
    model = without_initializers(model_proto)
    declared = {i.name for i in model_proto.graph.input}
    for init in model_proto.graph.initializer:
        if init.name not in names:
            model.graph.initializer.append(init)
        elif init.name not in declared:
            model.graph.input.append(helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    return model


def ort_run(model_proto: onnx.ModelProto, inputs: dict, weights: dict | None = None) -> dict[str, np.ndarray]:
    """All graph outputs from onnxruntime (`ort_session`) on `inputs`; `weights` (name ->
    array, the model's external-data weights) are fed as inputs (`weights_as_inputs`).
    ModelError (one line) when onnxruntime refuses the model."""
    if weights:
        model_proto, inputs = weights_as_inputs(model_proto, weights), {**inputs, **weights}
    try:
        sess = ort_session(model_proto)
        names = [o.name for o in sess.get_outputs()]
        return dict(zip(names, sess.run(names, inputs)))
    except Exception as e:   # the oracle refuses the model: an unregistered op, an old opset, ...
        text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelError(f"onnxruntime cannot run the model, so it cannot be verified "
                         f"(--no-verify skips it): {text}") from None


def softmax_logits(model_proto: onnx.ModelProto) -> list[str]:
    """Names of the inputs of the Softmax nodes that produce graph outputs (the logits)."""
    outs = {o.name for o in model_proto.graph.output}
    return [n.input[0] for n in model_proto.graph.node
            if n.op_type == "Softmax" and n.output[0] in outs and n.input[0] not in outs]


def logits_output(model_proto: onnx.ModelProto) -> onnx.ModelProto:
    """A copy with the logits (`softmax_logits`) added as extra graph outputs, typed and
    shaped by shape inference; the model itself when there are none."""
    added = softmax_logits(model_proto)
    if not added:
        return model_proto
    model = onnx.ModelProto()
    model.CopyFrom(model_proto)
    inferred = onnx.shape_inference.infer_shapes(without_big_weights(model))
    known = {vi.name: vi for vi in inferred.graph.value_info}
    for name in added:
        model.graph.output.append(known.get(name) or
                                  helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    return model


def without_big_weights(model):
    """Same graph, float weights as typed inputs: shape inference need not copy their bytes."""
    return weights_as_inputs(model, [i.name for i in model.graph.initializer
                                     if i.data_type == onnx.TensorProto.FLOAT])
