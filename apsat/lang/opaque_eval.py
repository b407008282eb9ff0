"""The reference interpreter's `opaque` calls: an ONNX node the language does not cover,
run alone by onnxruntime on its arguments (a one-node model built from the call's node,
constants, types and opsets; sessions cached by content, the most recently used kept).
"""
from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict

import numpy as np

from apsat.lang.program import OpaqueNode
from apsat.lang.semantics import EvaluationError

OPAQUE_IR_VERSION = 10      # onnxruntime 1.31 refuses models newer than IR 13
DEFAULT_OPSETS = (("", 21),)
# opaque-call key -> (InferenceSession, input names, output), least recently used first:
# a long-lived process meets ever new opaque nodes (every model has its own constants), and
# each session holds its model and buffers, so only the MAX_SESSIONS last used are kept
MAX_SESSIONS = 64
_SESSIONS: OrderedDict[bytes, tuple] = OrderedDict()
_SESSIONS_LOCK = threading.Lock()

def _opaque_key(node: OpaqueNode) -> bytes:
    """Everything the one-node model is built from (node bytes, constants, types, opsets)."""
    h = hashlib.sha256(node.node)
    h.update(repr((node.arg_inputs, node.input_types, node.output_index, node.output_type,
                   node.opsets, sorted(node.constants))).encode())
    for pos in sorted(node.constants):
        arr = np.ascontiguousarray(node.constants[pos])
        h.update(repr((arr.dtype.str, arr.shape)).encode())
        h.update(arr.tobytes())
    return h.digest()


def _opaque_model(key: str, node: OpaqueNode):
    """A one-node ModelProto: the call's arguments as graph inputs, constants as
    initializers, the node's output_index-th output as the graph output. Returns the model,
    the graph input name of each argument, and the output name."""
    import onnx
    from onnx import helper, numpy_helper

    proto = onnx.NodeProto.FromString(node.node)
    inputs, inits, declared = [], [], set()
    for pos, name in enumerate(proto.input):
        if not name or name in declared:
            continue                      # omitted optional input, or a repeated one
        declared.add(name)
        np_type = helper.tensor_dtype_to_np_dtype(node.input_types[pos])
        if pos in node.constants:
            inits.append(numpy_helper.from_array(np.asarray(node.constants[pos]).astype(np_type), name))
        elif pos in node.arg_inputs:
            inputs.append(helper.make_tensor_value_info(name, node.input_types[pos], None))
        else:
            raise EvaluationError(f"opaque {key!r} ({proto.op_type}): input {pos} ({name!r}) "
                                  f"is neither an argument nor a constant")
    out = proto.output[node.output_index]
    graph = helper.make_graph([proto], f"apsat_opaque_{proto.op_type}", inputs,
                              [helper.make_tensor_value_info(out, node.output_type, None)],
                              initializer=inits)
    opsets = node.opsets or DEFAULT_OPSETS
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    model.ir_version = OPAQUE_IR_VERSION
    return model, [proto.input[p] for p in node.arg_inputs], out


def _opaque_session(key: str, node: OpaqueNode):
    """(session, argument input names, output name), built once per distinct node while
    it stays among the MAX_SESSIONS most recently used."""
    cache_key = _opaque_key(node)
    with _SESSIONS_LOCK:
        if cache_key in _SESSIONS:
            _SESSIONS.move_to_end(cache_key)
            return _SESSIONS[cache_key]
    import onnxruntime as ort

    model, names, out = _opaque_model(key, node)
    options = ort.SessionOptions()
    options.log_severity_level = 3      # errors only; they are re-raised below anyway
    try:
        sess = ort.InferenceSession(model.SerializeToString(), options,
                                    providers=["CPUExecutionProvider"])
    except Exception as e:  # onnxruntime raises its own exception types
        raise EvaluationError(f"opaque {key!r}: onnxruntime cannot load the node: "
                              f"{str(e).splitlines()[0]}") from None
    with _SESSIONS_LOCK:
        _SESSIONS[cache_key] = (sess, names, out)
        while len(_SESSIONS) > MAX_SESSIONS:
            _SESSIONS.popitem(last=False)
    return sess, names, out


def evaluate_opaque(ev, term, vals):
    """Run the call's ONNX node alone in onnxruntime; arguments cast to its input types."""
    from onnx import helper

    key, _, out_dims = term.args
    node = ev.program.opaque_nodes.get(key)
    if node is None:
        raise EvaluationError(f"opaque {key!r}: the program has no ONNX node for this call")
    sess, names, out = _opaque_session(key, node)
    feeds = {}
    for name, pos, value in zip(names, node.arg_inputs, vals):
        np_type = helper.tensor_dtype_to_np_dtype(node.input_types[pos])
        if np.issubdtype(np_type, np.integer) and value.dtype.kind == "f":
            value = np.rint(value)        # float32-carried integers: round, never truncate
        feeds[name] = np.asarray(value, dtype=np_type, order="C")   # 0-D stays 0-D
    try:
        (result,) = sess.run([out], feeds)
    except Exception as e:
        raise EvaluationError(f"opaque {key!r}: onnxruntime failed: {str(e).splitlines()[0]}") from None
    if result.shape != tuple(out_dims):
        raise EvaluationError(f"opaque {key!r}: onnxruntime returned shape {result.shape}, "
                              f"the call declares {tuple(out_dims)}")
    keep = term in ev.opaque_only and result.dtype.kind in "biu"
    return result if keep else result.astype(np.float32, copy=False)
