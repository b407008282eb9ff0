"""ONNX -> Program: `load_onnx(path_or_modelproto, input_shapes=None) -> Model`.

Steps: read the file; check the graph's structure (dangling inputs, unknown ops) and fix
the true inputs' dims (symbolic dims need `input_shapes=`); run onnx.checker and shape
inference (strict, with data propagation) on a skeleton of the model that leaves large
weights' bytes out; then walk the nodes in order. Each node is
  - folded to numpy arrays when its inputs are all import-time constants (Shape of a static
    tensor counts) and it computes on shape-like data (see `_should_fold`);
  - lowered into the access-pattern language by `LOWERINGS[op]` (lowering.py);
  - otherwise an opaque call that onnxruntime runs alone (`OpaqueNode`).
Every problem is a one-line ModelError naming the file, node or input. A checker or
strict-inference complaint is raised after the walk, so a malformed node is named by the
walk's own message (op type, index, name, attribute) when it has one.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from apsat.frontend.folding import Const, FoldError, fold, fold_shape
from apsat.frontend.lowering import LOWERINGS, BadAttribute, NodeCtx, NodeProblem
from apsat.frontend.lowering_tensor import Builder, Unlowerable
from apsat.lang.program import OpaqueNode, Program
from apsat.lang.term import Term
from apsat.errors import ModelError, ShapeError
from apsat.frontend.model import Model

__all__ = ["load_onnx", "LOWERINGS"]

FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16,
               onnx.TensorProto.BFLOAT16}
SKELETON_MAX_ELEMENTS = 4096   # larger float initializers reach checker/inference as inputs


def load_onnx(source, input_shapes: dict | None = None) -> Model:
    """Import an ONNX model (a path or a ModelProto). `input_shapes` (name -> dims)
    overrides the declared dims of graph inputs, e.g. to fix a symbolic batch size."""
    start = time.perf_counter()
    proto, path = _read(source)
    label = str(path) if path else ""
    _check_structure(proto, label)
    inputs = _true_inputs(proto, input_shapes or {}, label)
    skeleton = _skeleton(proto, inputs)
    info, complaint = _infer(skeleton, label)
    importer = Importer(proto, inputs, info, label)
    try:
        program = importer.run()
    except ModelError:
        raise                          # names the node: more specific than the checker
    except Exception as e:             # a model the checker refused can trip the walk anywhere
        if complaint:
            raise ModelError(complaint) from None
        raise ModelError(f"{_at(label)}import failed ({type(e).__name__}: {_first_line(e)})") from None
    if complaint:
        raise ModelError(complaint)
    return Model(program=program, inputs=inputs, weights=importer.weights, onnx=proto,
                 path=path, import_seconds=time.perf_counter() - start)


# ---- reading and checking -------------------------------------------------------------------

def _at(label: str) -> str:
    """Message prefix naming the file ("" for a ModelProto)."""
    return f"{label}: " if label else ""


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _read(source) -> tuple[onnx.ModelProto, Path | None]:
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
            proto = onnx.load(str(path))
        except Exception as e:        # protobuf's DecodeError, or external-data trouble
            what = "truncated or corrupt ONNX file" if head == b"\x08" else "not an ONNX file"
            raise ModelError(f"{path}: {what} (its protobuf does not parse: "
                             f"{_first_line(e).split(': ')[-1]})") from None
    if not proto.HasField("graph") or proto.ir_version == 0:
        raise ModelError(f"{path or 'model'}: not an ONNX model (no graph or IR version)")
    return proto, path


def _where(idx: int, node) -> str:
    """How messages name a node: op type, index, and name when it has one."""
    return f"{node.op_type} node {idx}" + (f" {node.name!r}" if node.name else "")


def _check_structure(proto, label: str):
    """Dangling inputs and ops unknown to onnx, named, before onnx.checker's wording."""
    g = proto.graph
    produced = {i.name for i in g.input} | {i.name for i in g.initializer}
    later = {o for n in g.node for o in n.output}
    for idx, node in enumerate(g.node):
        for name in node.input:
            if name and name not in produced:
                why = ("is produced only by a later node (nodes not in topological order)"
                       if name in later else "is produced by no node, initializer or graph input")
                raise ModelError(f"{_at(label)}{_where(idx, node)} reads {name!r}, which {why}")
        if node.domain in ("", "ai.onnx") and not onnx.defs.has(node.op_type):
            raise ModelError(f"{_at(label)}{_where(idx, node)}: unknown op {node.op_type!r} (not an "
                             f"ONNX op); onnx cannot infer its output shape")
        produced.update(o for o in node.output if o)
    for out in g.output:
        if out.name not in produced:
            raise ModelError(f"{_at(label)}graph output {out.name!r} is produced by no node")


def _true_inputs(proto, overrides: dict, label: str) -> dict[str, tuple[int, ...]]:
    """Graph inputs without an initializer (old-style models list weights as inputs),
    with static dims; a symbolic or unknown dim is an error unless overridden."""
    inits = {i.name for i in proto.graph.initializer}
    out = {}
    for vi in proto.graph.input:
        if vi.name in inits:
            continue
        if vi.name in overrides:
            out[vi.name] = tuple(int(d) for d in overrides[vi.name])
            continue
        t = vi.type.tensor_type
        if not t.HasField("shape"):
            raise ModelError(f"{_at(label)}input {vi.name!r} has no shape; pass input_shapes="
                             f"{{{vi.name!r}: (...)}}")
        dims = []
        for axis, d in enumerate(t.shape.dim):
            if not d.HasField("dim_value") or d.dim_value <= 0:
                sym = d.dim_param or "?"
                raise ModelError(f"{_at(label)}input {vi.name!r} has symbolic dim {sym!r} at axis "
                                 f"{axis}; pass input_shapes={{{vi.name!r}: (...)}}")
            dims.append(int(d.dim_value))
        out[vi.name] = tuple(dims)
    unknown = set(overrides) - set(out)
    if unknown:
        raise ModelError(f"{_at(label)}input_shapes names {sorted(unknown)}, which are not graph inputs")
    return out


def _skeleton(proto, inputs: dict) -> onnx.ModelProto:
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
        if init.data_type not in FLOAT_TYPES or int(np.prod(init.dims)) <= SKELETON_MAX_ELEMENTS:
            g.initializer.append(init)
        elif init.name not in declared:
            g.input.append(helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    return sk


def _infer(skeleton, label: str):
    """Shape inference and onnx.checker. Returns ({name: (elem_type, dims or None)} from
    lenient inference, the checker's or strict inference's complaint or None). Complaints
    are raised after the walk, which usually finds the offending node and says more."""
    try:
        lenient = onnx.shape_inference.infer_shapes(skeleton, data_prop=True)
    except Exception as e:
        raise ModelError(f"{_at(label)}onnx shape inference failed: {_first_line(e)}") from None
    info = _value_info(lenient)
    mismatch = _type_mismatch(skeleton, info)
    if mismatch:
        raise ModelError(f"{_at(label)}{mismatch}")
    # Graph outputs may omit their shape, which the checker refuses: fill inferred ones.
    for out, inferred in zip(skeleton.graph.output, lenient.graph.output):
        if not out.type.tensor_type.HasField("shape") and inferred.type.tensor_type.HasField("shape"):
            out.CopyFrom(inferred)
    try:
        onnx.checker.check_model(skeleton)
    except Exception as e:
        return info, f"{_at(label)}onnx.checker: {_first_line(e)}"
    try:
        onnx.shape_inference.infer_shapes(skeleton, strict_mode=True, data_prop=True)
    except Exception as e:
        return info, f"{_at(label)}onnx shape inference: {_first_line(e)}"
    return info, None


def _type_mismatch(model, info: dict) -> str | None:
    """The first node whose inputs bound to one type parameter of its schema have different
    element types (e.g. a float64 weight on a float32 Conv), described in one line; None if
    all agree. onnx's checker and strict inference let this through; onnxruntime refuses it."""
    opsets = {o.domain or "": o.version for o in model.opset_import}
    for node in model.graph.node:
        try:
            schema = onnx.defs.get_schema(node.op_type, opsets.get(node.domain or "", 1), node.domain or "")
        except Exception:
            continue   # unknown op or domain: the checker and the importer speak about it
        bound: dict[str, tuple[str, int]] = {}
        for i, name in enumerate(node.input):
            if not name or name not in info or not info[name][0]:
                continue
            formal = schema.inputs[min(i, len(schema.inputs) - 1)] if schema.inputs else None
            if formal is None:
                continue
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


def _tensor_array(init) -> np.ndarray:
    """An initializer's value; float32 raw bytes become a read-only view of one copy
    (numpy_helper.to_array copies twice, ~1 s for VGG19's 548 MB)."""
    if init.data_type == onnx.TensorProto.FLOAT and init.HasField("raw_data") \
            and init.data_location != onnx.TensorProto.EXTERNAL:
        return np.frombuffer(init.raw_data, dtype="<f4").reshape(tuple(init.dims))
    return numpy_helper.to_array(init)


# ---- the walk -------------------------------------------------------------------------------

class Importer:
    """Walks the nodes of one model, keeping each ONNX value as a Term or a Const."""

    def __init__(self, proto, inputs: dict, info: dict, label: str = ""):
        self.proto, self.graph, self.info, self.label = proto, proto.graph, info, label
        self.opsets = {o.domain or "": o.version for o in proto.opset_import}
        self.tensor_shapes: dict[str, tuple] = {}
        self.b = Builder(self.tensor_shapes)
        self.env: dict[str, object] = {}
        self.weights: dict[str, np.ndarray] = {}
        self.opaque_nodes: dict[str, OpaqueNode] = {}
        self._const_terms: dict[str, Term] = {}
        self.inputs = inputs
        self.live, self.used = self._liveness()

    def _liveness(self):
        """Indices of nodes some graph output depends on, and every name they read."""
        needed = {o.name for o in self.graph.output}
        live = set()
        for idx in range(len(self.graph.node) - 1, -1, -1):
            node = self.graph.node[idx]
            if any(o in needed for o in node.output):
                live.add(idx)
                needed.update(i for i in node.input if i)
        return live, needed

    def run(self) -> Program:
        for name, dims in self.inputs.items():
            self.tensor_shapes[name] = dims
            self.env[name] = self.b.tensor(name)
        for init in self.graph.initializer:
            if init.name not in self.inputs and init.name in self.used:
                self.env[init.name] = Const(_tensor_array(init), weight=True)
        for idx, node in enumerate(self.graph.node):
            if idx in self.live:
                self._node(idx, node)
        outputs = {o.name: self.term(o.name) for o in self.graph.output}
        try:
            return Program(outputs, dict(self.tensor_shapes), self.opaque_nodes,
                           weights=frozenset(self.weights))
        except ShapeError as e:       # an importer bug, but never a bare traceback
            raise ModelError(f"{_at(self.label)}imported program is ill-shaped: {e}") from None

    def _where(self, idx: int, node) -> str:
        return _at(self.label) + _where(idx, node)

    # ---- what lowerings see (the `state` of NodeCtx) --------------------------------------

    def value(self, name: str):
        return self.env[name]

    def is_used(self, name: str) -> bool:
        return name in self.used

    def term(self, name: str) -> Term:
        """The value as a term: constants of one element (not initializers) become
        literals, other constants named weights."""
        v = self.env[name]
        if isinstance(v, Term):
            return v
        if name not in self._const_terms:
            arr = np.asarray(v.value)
            scalar = float(arr.reshape(-1)[0]) if arr.size == 1 and arr.dtype.kind in "fiub" else None
            if not v.weight and scalar is not None and np.isfinite(scalar):
                t = self.b.literal(scalar)
                t = self.b.reshape(t, arr.shape) if arr.shape != () else t
            else:
                t = self.add_weight(name, arr)
            self._const_terms[name] = t
        return self._const_terms[name]

    def add_weight(self, name: str, array: np.ndarray) -> Term:
        """Register a float32 weight (a fresh name if taken) and return its access-tensor."""
        base, k = name, 1
        while name in self.tensor_shapes:
            name, k = f"{base}_{k}", k + 1
        arr = np.asarray(array)
        self.weights[name] = arr if arr.dtype == np.float32 else arr.astype(np.float32)
        self.tensor_shapes[name] = tuple(arr.shape)
        return self.b.tensor(name)

    # ---- one node -------------------------------------------------------------------------

    def _node(self, idx: int, node):
        where = self._where(idx, node)
        default = node.domain in ("", "ai.onnx")
        ins = [self.env[n] if n else None for n in node.input]
        if default and node.op_type in ("Shape", "Size") and ins and ins[0] is not None:
            dims = ins[0].value.shape if isinstance(ins[0], Const) else self.b.dims(ins[0])
            self.env[node.output[0]] = Const(fold_shape(node, tuple(dims)))   # dims are static
            return
        all_const = all(v is None or isinstance(v, Const) for v in ins)
        fn = LOWERINGS.get(node.op_type) if default else None
        if all_const and self._should_fold(fn, ins):
            return self._fold(idx, node, ins)
        outs = self._lower(idx, node, fn) if fn is not None else None
        if outs is None:
            return self._fold(idx, node, ins) if all_const else self._opaque(idx, node, ins)
        for name, term in zip(node.output, outs):
            if name and term is not None:
                expect = self.info.get(name, (0, None))[1]
                if expect is not None and expect != self.b.dims(term):
                    raise ModelError(f"{where}: output {name!r} lowers to dims {self.b.dims(term)} "
                                     f"but onnx infers {expect}")
                self.env[name] = term

    @staticmethod
    def _should_fold(fn, ins) -> bool:
        """Fold ops without a lowering, and ops on shape-like data: no float input of more
        than one element. Float tensors (weights) stay in the language, so weights stay
        named tensors that rules can see (a BatchNorm's parameters, an Unsqueeze of one)."""
        if fn is None:
            return True
        return all(v is None or v.value.dtype.kind not in "fc" or v.value.size <= 1 for v in ins)

    def _lower(self, idx: int, node, fn):
        """The node's output terms, or None when it needs an opaque call: Unlowerable, a
        non-float output, or an output the lowering does not produce but someone reads."""
        for name in node.output:
            if name and self.is_used(name) and self.info.get(name, (1, None))[0] not in FLOAT_TYPES | {0}:
                return None
        opset = self.opsets.get(node.domain or "", self.opsets.get("", 1))
        ctx = NodeCtx(node, idx, opset, self.b, self)
        where = self._where(idx, node)
        try:
            outs = fn(ctx)
        except Unlowerable:
            return None
        except BadAttribute as e:
            raise ModelError(f"{where}: attribute {e.attr!r}: {e}") from None
        except (NodeProblem, ShapeError, ValueError) as e:
            raise ModelError(f"{where}: {_first_line(e)}") from None
        for k, name in enumerate(node.output):
            if name and self.is_used(name) and (k >= len(outs) or outs[k] is None):
                return None
        return outs

    def _fold(self, idx: int, node, ins):
        types = [self.info.get(o, (0, None))[0] for o in node.output]
        values = [None if v is None else v.value for v in ins]
        try:
            outs = fold(node, values, self.opsets, types)
        except FoldError as e:
            raise ModelError(f"{self._where(idx, node)}: {e}") from None
        for name, arr in zip(node.output, outs):
            if name:
                self.env[name] = Const(arr)

    def _opaque(self, idx: int, node, ins):
        """One `opaque` term per used output; onnxruntime runs the node alone."""
        where = self._where(idx, node)
        args, arg_inputs, constants, types = [], [], {}, []
        for pos, (name, v) in enumerate(zip(node.input, ins)):
            if not name:
                types.append(0)
                continue
            if isinstance(v, Const):
                constants[pos] = np.asarray(v.value)
                types.append(helper.np_dtype_to_tensor_dtype(constants[pos].dtype))
            else:
                args.append(v)
                arg_inputs.append(pos)
                types.append(self.info.get(name, (onnx.TensorProto.FLOAT, None))[0] or onnx.TensorProto.FLOAT)
        opsets = tuple(sorted(self.opsets.items()))
        for k, name in enumerate(node.output):
            if not name or not self.is_used(name):
                continue
            elem, dims = self.info.get(name, (0, None))
            if dims is None:
                known = node.domain in ("", "ai.onnx") or onnx.defs.has(node.op_type, node.domain)
                what = "no lowering" if known else f"unknown op (domain {node.domain!r})"
                raise ModelError(f"{where}: {what}, and onnx cannot infer the shape of its "
                                 f"output {name!r}")
            self.opaque_nodes[name] = OpaqueNode(
                node=node.SerializeToString(), arg_inputs=tuple(arg_inputs), constants=constants,
                input_types=tuple(types), output_index=k,
                output_type=elem or onnx.TensorProto.FLOAT, opsets=opsets)
            try:
                self.env[name] = self.b.make("opaque", name, tuple(args), tuple(dims))
            except ShapeError as e:
                raise ModelError(f"{where}: {_first_line(e)}") from None
