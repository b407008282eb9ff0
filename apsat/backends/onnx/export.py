"""An extracted program as an ONNX model with the original's interface.

`export_onnx(program, model)` writes the program the extractor chose: weights-only work
folded (fold.py), every other term walked into nodes (walk.py), tidied (tidy.py), then
written in ONNX's fused forms where the gpu planner computes nodes in one kernel (fuse.py:
the gpu backend's lowering of this very program says which terms it writes to memory;
the export follows it and decides no fusion of its own) and tidied again.
The graph keeps the original's input and output names and element types: integer inputs
(token ids, masks) stay integers, cast to float where the program computes with them and
fed raw to the embedding lookups that read them; opaque calls are the original nodes.
Symbolic dims are fixed at the sizes the program was built for (the model's metadata says
which). A program ONNX cannot express (a systolic-array atom) is refused in one line.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from apsat.backends.onnx.retype import retype
from apsat.lang.dtypes import CODES
from apsat.backends.onnx.compute import OPSET
from apsat.backends.onnx.external import reading
from apsat.backends.onnx.fuse import fuse
from apsat.backends.onnx.fold import fold_weights, weight_only_terms
from apsat.backends.onnx.graph import Builder, Val, dense, tensor_val
from apsat.backends.onnx.peep import Planned
from apsat.backends.onnx.tidy import tidy
from apsat.backends.onnx.views import ExportError, as_val
from apsat.backends.onnx.walk import Walk
from apsat.lang.ops import OPS

CONTRIB = "com.microsoft"
IR_VERSION = 10


def export_onnx(program, model, metadata: dict | None = None, varying=frozenset(),
                arrays: dict | None = None, stored: frozenset | None = None) -> onnx.ModelProto:
    """The ONNX model of `program` (an extracted Program) for the loaded `model`
    (apsat.load_onnx's Model: its weights and original ModelProto). `metadata` becomes
    the model's metadata_props. `varying`: terms whose shapes follow symbolic dims, which
    are computed by nodes even where they read only weights (apsat.backends.onnx.dynamic
    makes such an export general). With `arrays` (a dict to fill), large constants are
    external-data stubs whose arrays go there, for `external.save_external` to write (a
    model past protobuf's 2 GB); the check then waits for the saved file. `stored`: the
    gpu planner's say for this very program (its KernelGraph's `stored`) where the caller
    has it; else the program is lowered here to ask. ExportError (one line) when the
    program has a term ONNX cannot express."""
    _refuse_hardware(program)
    b = Builder(arrays)
    half = program.half_type()      # a half model's, or a lower precision's (retype below)
    b.float_type = CODES[half] if half else TensorProto.FLOAT
    src = model.onnx.graph
    types = {v.name: v.type.tensor_type.elem_type for v in list(src.input) + list(src.output)}
    consts = fold_weights(program, model.weights, varying)
    leaves = _Leaves(b, program, types, model.weights)
    walk = Walk(b, program, consts, leaves.value, varying)
    folded = weight_only_terms(program, varying)
    walk.run([t for t in program.terms() if t not in folded])
    outputs = []
    for name, term in program.outputs.items():
        v = walk.vals[term]
        value = dense(b, as_val(b, v))
        elem = types.get(name, TensorProto.FLOAT)
        outputs.append(_output(b, name, value, elem, walk.shape(term), CODES.get(program.dtype_of(term)) == elem))
    inputs = [helper.make_tensor_value_info(n, types[n], program.tensor_shapes[n])
              for n in leaves.graph_inputs(src)]
    graph = helper.make_graph(b.nodes, src.name or "apsat", inputs, outputs, list(b.initializers.values()))
    tidy(graph)
    out = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(CONTRIB, 1)],
                            producer_name="apsat", ir_version=IR_VERSION)
    with reading(arrays or {}):
        # a graph output's producer comes to write the output's name (tidy renames it)
        owner = {**program.outputs, **walk.owner}
        fuse(out, Planned(owner, _stored(program) if stored is None else stored))
    tidy(out.graph)
    if half:
        retype(out, OPSET, CODES[half], loose_half=program.float_type() == half)
    if CONTRIB not in _domains(out.graph):
        out.opset_import.pop()
    for key, value in (metadata or {}).items():
        out.metadata_props.add(key=str(key), value=str(value))
    if arrays is None:
        check(out)
    return out


def _stored(program) -> frozenset:
    """The terms the gpu planner writes to memory (its kernel graph's `stored`): what
    the export may not fuse into a reader. A program the gpu lowering cannot take (no
    export of it succeeds either) leaves every term apart."""
    from apsat.backends.gpu.lower import lower
    from apsat.errors import ApsatError

    try:
        return lower(program).stored
    except ApsatError:
        return frozenset(program.terms())


def check(model: onnx.ModelProto) -> None:
    """onnx.checker's full check (shapes inferred and checked); ExportError naming what
    it found."""
    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as e:       # the checker raises several kinds; each is an export bug
        raise ExportError(f"the exported model fails onnx.checker: {str(e).splitlines()[0]}") from None


def _refuse_hardware(program) -> None:
    """Atoms of an accelerator (systolic-array) have no ONNX op: say so before any work."""
    for t in program.terms():
        spec = OPS[t.op]
        if spec.role == "atom" and t.op not in ("fused-dot-bias", "fused-dot-bias-act", "attention"):
            raise ExportError(f"the program holds {t.op}, an accelerator atom with no ONNX form; "
                              f"export the gpu target's program instead")


def _domains(graph) -> set:
    return {n.domain for n in graph.node if n.domain}


def _output(b: Builder, name: str, value: str, elem: int, dims, typed: bool = False) -> onnx.ValueInfoProto:
    """The graph output `name`: the value renamed (its producer writes `name`), cast back
    to the original element type where that is not float and the value is not `typed`
    (computed in that type: retype gives it)."""
    if elem != TensorProto.FLOAT and not typed:
        value = b.op("Cast", [value], to=elem)
    b.nodes.append(helper.make_node("Identity", [value], [name], name=f"{name}_out"))
    return helper.make_tensor_value_info(name, elem, list(dims))


class _Leaves:
    """Graph inputs and opaque calls: the walk's leaves."""

    def __init__(self, b: Builder, program, types: dict, weights: dict):
        self.b, self.p, self.types, self.weights = b, program, types, weights
        self.used: list[str] = []
        self._float: dict[str, str] = {}

    def graph_inputs(self, src) -> list[str]:
        """The original's inputs the program reads, in the original's order."""
        used = set(self.used)
        return [v.name for v in src.input if v.name in used]

    def _use(self, name: str) -> None:
        if name not in self.used:
            self.used.append(name)

    def value(self, t, kids: list):
        if t.op == "access-tensor":
            name = t.args[0]
            if name not in self.types and name not in self.p.weights:   # computed per size (a Range)
                return tensor_val(self.b.const(np.asarray(self.weights[name], np.float32), "generated"),
                                  self.p.tensor_shapes[name])
            self._use(name)
            return tensor_val(self._as_float(name), self.p.tensor_shapes[name])
        return self._opaque(t, kids)

    def _as_float(self, name: str) -> str:
        """The input as the walk computes on it: float32, or its own half type where the
        program computes in it (retype carries that type on)."""
        if self.types.get(name, TensorProto.FLOAT) in (TensorProto.FLOAT, CODES.get(self.p.tensor_types.get(name))):
            return name
        if name not in self._float:
            self._float[name] = self.b.cast(name, TensorProto.FLOAT, self.types[name])
        return self._float[name]

    def _opaque(self, t, kids: list):
        """The original node, fed its arguments in the element types it was declared with."""
        key, args, dims = t.args
        spec = self.p.opaque_nodes[key]
        node = _upgraded(onnx.NodeProto.FromString(spec.node), spec.opsets)
        inputs = list(node.input)
        for pos, arg, val in zip(spec.arg_inputs, args, kids):
            inputs[pos] = self._arg(arg, val, spec.input_types[pos])
        for pos, value in spec.constants.items():
            inputs[pos] = self.b.const(np.asarray(value), "opaque_const", np.asarray(value).dtype)
        outs = [self.b.fresh(node.op_type.lower()) for _ in node.output]
        self.b.nodes.append(helper.make_node(node.op_type, inputs, outs, name=outs[0],
                                             domain=node.domain or None, **_attrs(node)))
        out = outs[spec.output_index]
        if spec.output_type not in (TensorProto.FLOAT, CODES.get(self.p.dtype_of(t))):
            out = self.b.op("Cast", [out], to=TensorProto.FLOAT)
        return tensor_val(out, tuple(dims))

    def _arg(self, arg, val, elem: int) -> str:
        """An opaque call's argument: a graph input of that type as it is, a weight in
        that type, else the value (a float) cast to it."""
        name = arg.args[0] if arg.op == "access-tensor" else None
        if name is not None and name not in self.p.weights and self.types.get(name) == elem:
            self._use(name)
            return name
        if isinstance(val, Val) and val.is_const:      # lazy forms (a pair, windows) are built below
            dtype = helper.tensor_dtype_to_np_dtype(elem)
            return self.b.const(np.broadcast_to(val.aligned_array(), val.shape), "opaque_arg", dtype)
        out = dense(self.b, as_val(self.b, val))
        return out if elem == TensorProto.FLOAT else self.b.cast(out, elem)


def _upgraded(node, opsets) -> onnx.NodeProto:
    """An opaque node as the export's opset reads it: where its op changed between the
    model's opset and OPSET (GridSample's mode "bilinear" became "linear" at 20), onnx's
    version converter rewrites it; a node it cannot convert into one node stays as it was."""
    from onnx import version_converter

    old = dict(opsets).get("", OPSET)
    if node.domain not in ("", "ai.onnx") or old == OPSET:
        return node
    try:
        if onnx.defs.get_schema(node.op_type, old).since_version == onnx.defs.get_schema(node.op_type, OPSET).since_version:
            return node
        graph = helper.make_graph([node], "node", [helper.make_tensor_value_info(i, TensorProto.FLOAT, None)
                                                   for i in dict.fromkeys(node.input) if i],
                                  [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in node.output if o])
        converted = version_converter.convert_version(
            helper.make_model(graph, opset_imports=[helper.make_opsetid("", old)]), OPSET).graph
    except Exception:  # noqa: BLE001 - the converter's own refusal: the node as it was
        return node
    return converted.node[0] if len(converted.node) == 1 and not converted.initializer else node


def _attrs(node) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}

