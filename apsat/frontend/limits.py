"""Checks on what a model declares that onnx.checker lets through but apsat or onnxruntime
cannot take: tensor sizes (refused before anything is allocated), element types and opset
imports. Each problem is a one-line ModelError naming the value, node or domain.

MAX_ELEMENTS bounds every tensor the importer meets (graph inputs, values onnx infers,
lowered and folded values): 2**30 elements, 4 GiB as float32, far above any tensor of the
light or real zoo (VGG-19's largest weight has 102.8M elements); a larger one is far more
likely a corrupt dim than a model, and refusing it from its dims keeps numpy and
onnxruntime from trying to allocate it. Empty tensors (a
zero dim) are refused where they would become values of the program: its kernels and cost
models assume at least one element. Constants folded at import may be empty (shape
arithmetic often slices to nothing).
"""
from __future__ import annotations

import numpy as np
import onnx

from apsat.errors import ModelError

MAX_ELEMENTS = 2 ** 30
OLDEST_OPSET = 7          # onnxruntime, the oracle, implements no older default-domain ops
# Inputs onnxruntime requires to be 1-D (it refuses the model when it runs, where apsat
# would read the values flattened).
ONE_D_INPUTS = {"Reshape": (1,), "Tile": (1,), "Slice": (1, 2, 3, 4)}
_TENSOR_TYPES = frozenset(onnx.TensorProto.DataType.values()) - {onnx.TensorProto.UNDEFINED}


def check_dims(where: str, what: str, dims, empty_ok: bool = False) -> None:
    """ModelError `where: what ...` when `dims` has a negative dim, more than MAX_ELEMENTS
    elements, or (unless `empty_ok`) no element at all. `where` is the message prefix
    (the file and node, without the trailing ": ")."""
    dims = tuple(int(d) for d in dims)
    prefix = f"{where}: " if where else ""
    if any(d < 0 for d in dims):
        raise ModelError(f"{prefix}{what} has a negative dim {dims}")
    count = 1
    for d in dims:
        count *= d                      # Python ints: 2**62 * 2**62 does not wrap
    if count > MAX_ELEMENTS:
        raise ModelError(f"{prefix}{what} has {count} elements (dims {dims}), over apsat's limit of "
                         f"2**30 per tensor")
    if count == 0 and not empty_ok:
        raise ModelError(f"{prefix}{what} has no elements (dims {dims}); apsat needs non-empty tensors")


def check_one_d(where: str, node, dims_of) -> None:
    """ModelError when an input of `node` that ONE_D_INPUTS names is not 1-D;
    `dims_of(k)` gives input k's dims (None when omitted)."""
    for k in ONE_D_INPUTS.get(node.op_type, ()) if node.domain in ("", "ai.onnx") else ():
        dims = dims_of(k) if k < len(node.input) and node.input[k] else None
        if dims is not None and len(dims) != 1:
            raise ModelError(f"{where}: input {node.input[k]!r} must be 1-D, has dims {tuple(dims)}")


def check_no_nan(label: str, name: str, array) -> None:
    """ModelError when a floating-point initializer holds NaN: corrupt weights, whose
    outputs no verification could compare (NaN equals nothing). Inf stays (masks use it)."""
    if array.dtype.kind != "f" or not array.size:
        return
    with np.errstate(invalid="ignore", over="ignore"):
        if np.isfinite(np.add.reduce(array, axis=None, dtype=np.float64)):
            return                      # a finite sum has no NaN: one pass, no temporary
    count = int(np.isnan(array).sum())
    if count:
        prefix = f"{label}: " if label else ""
        raise ModelError(f"{prefix}initializer {name!r} holds {count} NaN value(s) among its "
                         f"{array.size} elements")


def check_strings(proto, label: str) -> None:
    """ModelError for a string field that is not UTF-8 (a corrupt file: protobuf parses
    such a field and hands it back as bytes, which fails wherever it is used as text).
    Every message is visited; tensors only for their names, never their payload."""
    prefix = f"{label}: " if label else ""
    stack = [proto]
    while stack:
        msg = stack.pop()
        try:
            if isinstance(msg, onnx.TensorProto):     # upb gives such a string as bytes
                fields = [("name", [msg.name]), ("doc_string", [msg.doc_string])]
                stack.extend(msg.external_data)
            else:
                fields = []
                for fd, value in msg.ListFields():
                    repeated = fd.is_repeated if hasattr(fd, "is_repeated") else fd.label == fd.LABEL_REPEATED
                    values = value if repeated else [value]
                    if fd.type == fd.TYPE_MESSAGE:
                        stack.extend(values)
                    elif fd.type == fd.TYPE_STRING:
                        fields.append((fd.name, values))
            bad = next((repr(name) for name, values in fields if any(isinstance(v, bytes) for v in values)), None)
        except UnicodeDecodeError:
            bad = "a string field"
        if bad:
            raise ModelError(f"{prefix}corrupt ONNX file: {bad} of a {type(msg).__name__} "
                             f"is not UTF-8 text")


def type_name(elem: int) -> str:
    """An ONNX element type as onnx's schemas write it (`tensor(float)`); `type 12345`
    for a number that is no ONNX type."""
    try:
        return f"tensor({onnx.TensorProto.DataType.Name(elem).lower()})"
    except ValueError:
        return f"type {elem}"


def check_declarations(proto, label: str) -> None:
    """The element types of graph inputs, outputs and initializers (each a real ONNX
    type; onnxruntime refuses undefined ones) and the opset imports (each domain once;
    the default domain's version from OLDEST_OPSET to the newest onnx knows; others positive)."""
    prefix = f"{label}: " if label else ""
    g = proto.graph
    for kind, values in (("input", g.input), ("output", g.output)):
        for vi in values:
            if not vi.type.HasField("tensor_type"):
                raise ModelError(f"{prefix}graph {kind} {vi.name!r} has no tensor type")
            elem = vi.type.tensor_type.elem_type
            if elem not in _TENSOR_TYPES:
                raise ModelError(f"{prefix}graph {kind} {vi.name!r} has element type {elem} "
                                 f"({'undefined' if elem == 0 else 'not an ONNX type'})")
    for init in g.initializer:
        if init.data_type not in _TENSOR_TYPES:
            raise ModelError(f"{prefix}initializer {init.name!r} has element type {init.data_type} "
                             f"({'undefined' if init.data_type == 0 else 'not an ONNX type'})")
    seen: dict[str, int] = {}
    newest = onnx.defs.onnx_opset_version()
    for op in proto.opset_import:
        domain = op.domain or ""
        if domain in seen:
            raise ModelError(f"{prefix}opset of domain {domain or 'ai.onnx'!r} imported twice "
                             f"({seen[domain]} and {op.version})")
        seen[domain] = op.version
        if domain in ("", "ai.onnx") and not OLDEST_OPSET <= op.version <= newest:
            raise ModelError(f"{prefix}opset {op.version} of the default domain: apsat takes "
                             f"{OLDEST_OPSET} (the oldest onnxruntime runs) to {newest} (the newest onnx knows)")
        if op.version < 1:
            raise ModelError(f"{prefix}opset {op.version} of domain {domain!r}: versions start at 1")
