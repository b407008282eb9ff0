"""Reading an ONNX model and checking it before the importer's walk (importer.py).

`read_model` loads the file (or takes a ModelProto); `check_structure` names dangling
inputs and unknown ops; `true_inputs` fixes the true inputs' dims; `model_skeleton` leaves
large weights' bytes out, so that `infer_and_check` can run shape inference and
onnx.checker on it cheaply. Every problem is a one-line ModelError naming the file, node
or input.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from apsat.errors import ModelError
from apsat.lang import dtypes
from apsat.frontend.limits import type_name

FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16,
               onnx.TensorProto.BFLOAT16}
HALF_FLOAT_TYPES = frozenset({onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16})
# the language's element type of each ONNX float type and numpy float dtype (doubles are
# computed in f32; apsat/lang/dtypes.py)
ONNX_FLOATS = {**dtypes.NAMES, onnx.TensorProto.DOUBLE: dtypes.F32}
NUMPY_FLOATS = {"float32": dtypes.F32, "float64": dtypes.F32, "float16": dtypes.F16, "bfloat16": dtypes.BF16}
SKELETON_MAX_ELEMENTS = 4096   # larger float initializers reach checker/inference as inputs


def half_float_types(proto) -> list[str]:
    """The half-precision element types ("bfloat16", "float16") among the model's weights,
    graph inputs and outputs, sorted."""
    g = proto.graph
    held = {i.data_type for i in g.initializer} | {v.type.tensor_type.elem_type for v in [*g.input, *g.output]}
    return sorted(onnx.TensorProto.DataType.Name(t).lower() for t in held & HALF_FLOAT_TYPES)


def is_half(value) -> bool:
    """`value` is a float16 or bfloat16 array."""
    return value is not None and np.asarray(value).dtype.name in ("float16", "bfloat16")


def widened(value):
    """A float16 or bfloat16 array as float32 (exactly); any other value as it is."""
    return np.asarray(value).astype(np.float32) if is_half(value) else value


def narrow_float_notice(proto) -> list[str]:
    """A notice where the model's weights, inputs or outputs are float16 or bfloat16: apsat
    computes and exports them in their type (apsat/lang/dtypes.py) and verifies against a
    float64 run with the type's tolerance (apsat.pipeline.verify.HALF_ULPS)."""
    narrow = half_float_types(proto)
    if not narrow:
        return []
    return [f"the model holds {' and '.join(narrow)} values: apsat computes them in their type (each node "
            "rounded once, products and reductions accumulating in float32) and exports them in it; "
            "verification allows 8 ulps of the type against a float64 run"]


def file_prefix(label: str) -> str:
    """Message prefix naming the file ("" for a ModelProto)."""
    return f"{label}: " if label else ""


def first_line(e: Exception) -> str:
    """The first line of an exception's message (its type name when the message is empty)."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def read_model(source) -> tuple[onnx.ModelProto, Path | None, dict]:
    """(the ModelProto, its path or None, name -> memmap of each large external-data
    weight) from a path or a ModelProto; a file's external data is mapped, not read
    (apsat.frontend.external). ModelError for a missing, empty or unparsable file, a
    protobuf that is not a model, and external data that is missing or short."""
    from apsat.frontend.external import open_external

    if isinstance(source, onnx.ModelProto):
        proto, path = source, None
    else:
        path = Path(source)
        if not path.exists():
            raise ModelError(f"{path}: no such file")
        if not path.is_file():
            raise ModelError(f"{path}: not a file")
        with open(path, "rb") as f:
            head = f.read(1)
        if not head:
            raise ModelError(f"{path}: empty file, not an ONNX model")
        try:
            proto = onnx.load(str(path), load_external_data=False)
        except Exception as e:        # protobuf's DecodeError
            what = "truncated or corrupt ONNX file" if head == b"\x08" else "not an ONNX file"
            raise ModelError(f"{path}: {what} (its protobuf does not parse: "
                             f"{first_line(e).split(': ')[-1]})") from None
    if not proto.HasField("graph") or proto.ir_version == 0:
        raise ModelError(f"{path or 'model'}: not an ONNX model (no graph or IR version)")
    external = open_external(proto, path.parent, str(path)) if path else {}
    return proto, path, external


def node_name(idx: int, node) -> str:
    """How messages name a node: op type, index, and name when it has one."""
    return f"{node.op_type} node {idx}" + (f" {node.name!r}" if node.name else "")


def check_structure(proto, label: str):
    """A graph with no outputs, dangling inputs and ops unknown to onnx, named, before
    onnx.checker's wording."""
    g = proto.graph
    if not g.output:
        raise ModelError(f"{file_prefix(label)}the graph has no outputs: nothing to optimise")
    produced = {i.name for i in g.input} | {i.name for i in g.initializer}
    later = {o for n in g.node for o in n.output}
    for idx, node in enumerate(g.node):
        for name in node.input:
            if name and name not in produced:
                why = ("is produced only by a later node (nodes not in topological order)"
                       if name in later else "is produced by no node, initializer or graph input")
                raise ModelError(f"{file_prefix(label)}{node_name(idx, node)} reads {name!r}, which {why}")
        if node.domain in ("", "ai.onnx") and not onnx.defs.has(node.op_type):
            raise ModelError(f"{file_prefix(label)}{node_name(idx, node)}: unknown op {node.op_type!r} "
                             f"(not an ONNX op); onnx cannot infer its output shape")
        produced.update(o for o in node.output if o)
    for out in g.output:
        if out.name not in produced:
            raise ModelError(f"{file_prefix(label)}graph output {out.name!r} is produced by no node")


def true_inputs(proto, overrides: dict, label: str, representatives: dict | None = None):
    """Graph inputs without an initializer (old-style models list weights as inputs),
    with static dims; returns (name -> dims, notices, symbols, signature). `overrides`
    (name -> dims) replaces an input's dims, as onnxsim's --overwrite-input-shape does; a
    symbolic dim left (`N`, `batch_size`) takes the value an override gave the same name
    on another input, else stays a symbol (apsat.frontend.symbols: name -> Symbol) built at
    its representative value (`representatives`, name -> value, or the role's default),
    with a notice. `signature` gives each input's dims as ints and symbol names. An
    unknown dim (no name) or a missing shape is an error."""
    from apsat.frontend.symbols import choose, fixed_dims
    from apsat.lang.dims import names_in

    inits = {i.name for i in proto.graph.initializer}
    declared = [vi for vi in proto.graph.input if vi.name not in inits]
    unknown = set(overrides) - {vi.name for vi in declared}
    if unknown:
        raise ModelError(f"{file_prefix(label)}input_shapes names {sorted(unknown)}, "
                         f"which are not graph inputs (inputs: {sorted(vi.name for vi in declared)})")
    bound = _bound_dim_params(declared, overrides, label)
    signature = {vi.name: _declared_dims(vi, overrides, bound, label) for vi in declared}
    names = list(dict.fromkeys(n for dims in signature.values() for d in dims if isinstance(d, str)
                               for n in names_in(d)))
    symbols = choose(names, fixed_dims(proto), representatives or {}, file_prefix(label))
    out = {name: tuple(_value(d, symbols, label) if isinstance(d, str) else d for d in dims)
           for name, dims in signature.items()}
    notices = [f"symbolic dim {s.name!r} kept symbolic; the program is built at {s.value} "
               f"(--representative {s.name}=V to choose, --input-shape to fix it)"
               for s in symbols.values()]
    return out, notices, symbols, signature


def _value(dim: str, symbols: dict, label: str) -> int:
    """A symbolic dim's value at the representatives: a name's, or its expression's
    (`past_sequence_length + sequence_length`)."""
    from apsat.lang.dims import Dim, NotGeneral, is_expression, parse

    if dim in symbols or not is_expression(dim):
        return symbols[dim].value
    try:
        value = parse(dim, {n: Dim.symbol(n, s.value) for n, s in symbols.items()}).rep
    except NotGeneral as e:
        raise ModelError(f"{file_prefix(label)}{e}") from None
    if value <= 0:
        raise ModelError(f"{file_prefix(label)}dim {dim!r} is {value} at the representative sizes")
    return value


def _declared_dims(vi, overrides: dict, bound: dict, label: str) -> tuple:
    """An input's dims: ints, and the names of symbolic dims no override fixed."""
    if vi.name in overrides:
        return tuple(int(d) for d in overrides[vi.name])
    t = vi.type.tensor_type
    if not t.HasField("shape"):
        raise ModelError(f"{file_prefix(label)}input {vi.name!r} has no shape; give it one "
                         f"(--input-shape {vi.name}=D0,D1,... or input_shapes=)")
    dims = []
    for axis, d in enumerate(t.shape.dim):
        if d.HasField("dim_value") and d.dim_value > 0:
            dims.append(int(d.dim_value))
        elif d.dim_param:
            dims.append(bound.get(d.dim_param, d.dim_param))
        else:
            raise ModelError(f"{file_prefix(label)}input {vi.name!r} has an unknown dim at axis {axis}; "
                             f"give its shape (--input-shape {vi.name}=D0,D1,... or input_shapes=)")
    return tuple(dims)


def _bound_dim_params(declared, overrides: dict, label: str) -> dict[str, int]:
    """Symbolic dim name -> the value the overridden inputs give it; a name given two
    different values is an error."""
    bound: dict[str, int] = {}
    for vi in declared:
        if vi.name not in overrides:
            continue
        dims = [int(d) for d in overrides[vi.name]]
        if any(d <= 0 for d in dims):
            raise ModelError(f"{file_prefix(label)}input shape for {vi.name!r} must be positive: {dims}")
        shape = vi.type.tensor_type.shape.dim if vi.type.tensor_type.HasField("shape") else []
        if shape and len(shape) != len(dims):
            raise ModelError(f"{file_prefix(label)}input shape for {vi.name!r} has {len(dims)} dims, "
                             f"the input has {len(shape)}")
        for d, value in zip(shape, dims):
            if d.dim_param and bound.setdefault(d.dim_param, value) != value:
                raise ModelError(f"{file_prefix(label)}symbolic dim {d.dim_param!r} is given "
                                 f"{bound[d.dim_param]} and {value}")
    return bound


def input_types(proto) -> dict[str, int]:
    """Each graph input's ONNX element type (initializers' old-style inputs included)."""
    return {vi.name: vi.type.tensor_type.elem_type for vi in proto.graph.input}


def model_skeleton(proto, inputs: dict) -> onnx.ModelProto:
    """The model without large float initializers' bytes (they become typed inputs), and
    with overridden input dims: what checker and shape inference need, cheap to copy."""
    sk = onnx.ModelProto()
    sk.ir_version = proto.ir_version
    sk.opset_import.extend(proto.opset_import)
    g, src = sk.graph, proto.graph
    g.name = src.name or "graph"
    g.node.extend(src.node)
    g.output.extend(src.output)
    g.value_info.extend(src.value_info)
    declared = set()
    for vi in src.input:
        declared.add(vi.name)
        if vi.name in inputs:
            vi = helper.make_tensor_value_info(vi.name, vi.type.tensor_type.elem_type, inputs[vi.name])
        g.input.append(vi)
    for init in src.initializer:
        external = init.data_location == onnx.TensorProto.EXTERNAL   # mapped, not in the proto
        if not external and (init.data_type not in FLOAT_TYPES or int(np.prod(init.dims)) <= SKELETON_MAX_ELEMENTS):
            g.initializer.append(init)
        elif init.name not in declared:
            g.input.append(helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    return sk


def infer_and_check(skeleton, label: str):
    """Shape inference and onnx.checker. Returns ({name: (elem_type, dims or None)} from
    lenient inference, the checker's or strict inference's complaint or None). Complaints
    are raised after the walk, which usually finds the offending node and says more."""
    try:
        lenient = onnx.shape_inference.infer_shapes(skeleton, data_prop=True)
    except Exception as e:
        raise ModelError(f"{file_prefix(label)}onnx shape inference failed: {first_line(e)}") from None
    info = _value_info(lenient)
    mismatch = _type_mismatch(skeleton, info)
    if mismatch:
        raise ModelError(f"{file_prefix(label)}{mismatch}")
    # Graph outputs may omit their shape, which the checker refuses: fill inferred ones.
    for out, inferred in zip(skeleton.graph.output, lenient.graph.output):
        if not out.type.tensor_type.HasField("shape") and inferred.type.tensor_type.HasField("shape"):
            out.CopyFrom(inferred)
    try:
        onnx.checker.check_model(skeleton)
    except Exception as e:
        return info, f"{file_prefix(label)}onnx.checker: {first_line(e)}"
    try:
        onnx.shape_inference.infer_shapes(skeleton, strict_mode=True, data_prop=True)
    except Exception as e:
        return info, f"{file_prefix(label)}onnx shape inference: {first_line(e)}"
    return info, None


def _type_mismatch(model, info: dict) -> str | None:
    """The first node whose inputs bound to one type parameter of its schema have different
    element types (e.g. a float64 weight on a float32 Conv), or an input of a type its
    schema does not allow (a float HannWindow size), described in one line; None if all
    agree. onnx's checker and strict inference let this through; onnxruntime refuses it."""
    opsets = {o.domain or "": o.version for o in model.opset_import}
    for node in model.graph.node:
        try:
            schema = onnx.defs.get_schema(node.op_type, opsets.get(node.domain or "", 1), node.domain or "")
        except Exception:
            continue   # unknown op or domain: the checker and the importer speak about it
        bound: dict[str, tuple[str, int]] = {}
        allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
        for i, name in enumerate(node.input):
            if not name or name not in info or not info[name][0]:
                continue
            formal = schema.inputs[min(i, len(schema.inputs) - 1)] if schema.inputs else None
            if formal is None:
                continue
            ok = allowed.get(formal.type_str, {formal.type_str})
            if type_name(info[name][0]) not in ok:      # info holds tensors only: a seq(...) is refused
                return (f"node {node.name or node.op_type} ({node.op_type}): input {name!r} is "
                        f"{type_name(info[name][0])}, which its {formal.type_str} does not allow "
                        f"({', '.join(sorted(ok)[:8])}{', ...' if len(ok) > 8 else ''})")
            seen = bound.setdefault(formal.type_str, (name, info[name][0]))
            if seen[1] != info[name][0]:
                types = onnx.TensorProto.DataType.Name
                return (f"node {node.name or node.op_type} ({node.op_type}): input {name!r} is "
                        f"{types(info[name][0]).lower()} but {seen[0]!r} is {types(seen[1]).lower()}; "
                        f"inputs bound to type {formal.type_str} must agree")
    return None


def _value_info(model) -> dict:
    out = {}
    g = model.graph
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        t = vi.type.tensor_type
        dims = None
        if t.HasField("shape") and all(d.HasField("dim_value") for d in t.shape.dim):
            dims = tuple(int(d.dim_value) for d in t.shape.dim)
        out[vi.name] = (t.elem_type, dims)
    for init in g.initializer:
        out[init.name] = (init.data_type, tuple(init.dims))
    return out
