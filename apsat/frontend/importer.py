"""ONNX -> Program: `load_onnx(path_or_modelproto, input_shapes=None) -> Model`.

Steps (the first four in reading.py): read the file; check the graph's structure (dangling
inputs, unknown ops) and fix the true inputs' dims (symbolic dims need `input_shapes=`);
run onnx.checker and shape inference (strict, with data propagation) on a skeleton of the
model that leaves large weights' bytes out; then walk the nodes in order. Each node is
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

import numpy as np
import onnx
from onnx import helper, numpy_helper

from apsat.frontend.builder import Builder
from apsat.frontend.constants import ConstantTerms
from apsat.frontend.folding import Const, FoldError, fold, fold_shape
from apsat.frontend.lowering import LOWERINGS, BadAttribute, NodeCtx, NodeProblem
from apsat.frontend.limits import check_declarations, check_dims, check_no_nan, check_one_d, check_strings
from apsat.frontend.lowering_tensor import Unlowerable
from apsat.frontend.node_shapes import infer_node
from apsat.frontend.opaque_import import opaque_terms
from apsat.frontend.symbol_folding import SymbolFolding
from apsat.frontend.symbols import fixed_dims, smaller
from apsat.frontend.reading import (FLOAT_TYPES, NUMPY_FLOATS, ONNX_FLOATS, check_structure, file_prefix, first_line, infer_and_check,
                                    input_types, model_skeleton, narrow_float_notice, node_name, read_model,
                                    true_inputs)
from apsat.lang.program import OpaqueNode, Program
from apsat.lang.evaluate import evaluate
from apsat.lang.term import Term, postorder
from apsat.errors import ModelError, ShapeError
from apsat.frontend.model import Model

__all__ = ["load_onnx", "LOWERINGS"]

# Ops lowered whatever their output's element type: the language computes in float32, and
# these give exact results on integers (|v| < 2**24) and booleans (0.0 / 1.0) carried so:
# layout moves values unchanged, comparisons and logic yield 0/1, sums and products of
# small integers round exactly. Division and Pow on integers are not exact in
# float32, so they stay opaque calls on integer data; Mod is exact (fmod is exact in IEEE
# arithmetic, and the sign fix-up adds small integers). Cast decides per case (lower_cast).
INTEGER_EXACT = frozenset({
    "Identity", "Cast", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Concat",
    "Slice", "Split", "Gather", "Expand", "Pad", "Tile", "Where", "Equal", "Less", "Greater",
    "LessOrEqual", "GreaterOrEqual", "Not", "And", "Or", "Xor", "Add", "Sub", "Mul", "Neg",
    "Abs", "Min", "Max", "Sum", "Relu", "Sign", "ReduceMax", "ReduceMin", "ReduceSum",
    "ArgMax", "ArgMin", "Trilu", "IsNaN", "Mod", "Floor", "Ceil", "GatherElements", "GatherND",
    "CumSum", "TopK", "ScatterND", "ScatterElements", "Clip"})
# Ops that only move data: with every input a constant they fold whatever the element type
# (a gather of a weight table by constant indices, a relative-position bias, is a weight).
FOLD_MOVES = frozenset({"Gather", "GatherElements", "GatherND"})


def load_onnx(source, input_shapes: dict | None = None, representatives: dict | None = None) -> Model:
    """Import an ONNX model (a path or a ModelProto). `input_shapes` (name -> dims)
    overrides the declared dims of graph inputs, as onnxsim's --overwrite-input-shape;
    symbolic dims not fixed so stay symbols (`Model.symbols`), the program built at their
    representative values (`representatives`, name -> value, else each role's default),
    and `Model.notices` says so."""
    start = time.perf_counter()
    proto, path, external = read_model(source)
    label = str(path) if path else ""
    check_strings(proto, label)
    check_structure(proto, label)
    check_declarations(proto, label)
    given, refused = dict(representatives or {}), []
    while True:
        inputs, notices, symbols, signature = true_inputs(proto, input_shapes or {}, label, given)
        try:
            program, importer = _import(proto, inputs, symbols, label, external)
            break
        except ModelError as e:
            lower = smaller(symbols, fixed_dims(proto), set(representatives or {}))
            sizes = ", ".join(f"{s.name}={s.value}" for s in symbols.values())
            if not lower or len(refused) == 4:   # built at the user's sizes, or small already
                raise (ModelError(f"{e} (symbolic dims built at {sizes}; --representative NAME=V "
                                  "chooses others)") if symbols else e) from None
            refused.append(f"{sizes} ({first_line(e).rsplit(': ', 1)[-1][:80]})")
            given.update(lower)
    if refused:                                # a sequence past the model's position table
        notices.append(f"the model does not import with its symbolic dims at {'; at '.join(refused)}")
    notices += narrow_float_notice(proto)
    types = input_types(proto)
    return Model(program=program, inputs=inputs, weights=importer.weights, onnx=proto,
                 path=path, external=external, import_seconds=time.perf_counter() - start,
                 input_types={n: types[n] for n in inputs}, notices=notices,
                 symbols=symbols, signature=signature, generated=importer.symbolic.generated)


def _import(proto, inputs: dict, symbols: dict, label: str, external: dict):
    """(program, importer) for the model with its true inputs at `inputs`; `external`:
    name -> memmap of the weights kept in external data."""
    for name, dims in inputs.items():         # before anything is allocated for them
        check_dims(label, f"input {name!r}", dims)
    skeleton = model_skeleton(proto, inputs)
    info, complaint = infer_and_check(skeleton, label)
    importer = Importer(proto, inputs, info, label, external)
    importer.symbolic = SymbolFolding(s.value for s in symbols.values())
    try:
        program = importer.run()
    except ModelError:
        raise                          # names the node: more specific than the checker
    except Exception as e:             # a model the checker refused can trip the walk anywhere
        if complaint:
            raise ModelError(complaint) from None
        raise ModelError(f"{file_prefix(label)}import failed "
                         f"({type(e).__name__}: {first_line(e)})") from None
    if complaint:
        raise ModelError(complaint)
    return program, importer


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

    def __init__(self, proto, inputs: dict, info: dict, label: str = "", external: dict | None = None):
        self.proto, self.graph, self.info, self.label = proto, proto.graph, info, label
        self.external = external or {}     # name -> memmap of an external-data weight
        self.opsets = {o.domain or "": o.version for o in proto.opset_import}
        self.tensor_shapes: dict[str, tuple] = {}
        self.tensor_types: dict[str, str] = {}   # float inputs and weights: their element type
        self.b = Builder(self.tensor_shapes)
        self.env: dict[str, object] = {}
        self.weights: dict[str, np.ndarray] = {}
        self.opaque_nodes: dict[str, OpaqueNode] = {}
        self.constants = ConstantTerms(self)
        self.lowering = None                 # the node whose lowering runs (constants.py reads it)
        self.inputs = inputs
        self.live, self.used = self._liveness()
        self.symbolic = SymbolFolding()      # load_onnx sets the symbols' sizes

    def _liveness(self):
        """Indices of nodes some graph output depends on, and every name they read."""
        needed = {o.name for o in self.graph.output}
        live = set()
        for idx in range(len(self.graph.node) - 1, -1, -1):
            node = self.graph.node[idx]
            if any(o in needed for o in node.output):
                live.add(idx)
                needed.update(i for i in node.input if i)
                needed.update(outer_names(node))
        return live, needed

    def run(self) -> Program:
        for name, dims in self.inputs.items():
            self.tensor_shapes[name] = dims
            if (elem := self.info.get(name, (0, None))[0]) in ONNX_FLOATS:
                self.tensor_types[name] = ONNX_FLOATS[elem]
            self.env[name] = self.b.tensor(name)
        for init in self.graph.initializer:
            if init.name not in self.inputs and init.name in self.used:
                check_dims(self.label, f"initializer {init.name!r}", init.dims, empty_ok=True)
                try:
                    value = self.external[init.name] if init.name in self.external else _tensor_array(init)
                    self.env[init.name] = Const(value, weight=True)
                except ValueError as e:   # data that does not fill the dims, or a bad type
                    raise ModelError(f"{file_prefix(self.label)}initializer {init.name!r} of dims "
                                     f"{tuple(init.dims)}: {first_line(e)}") from None
                check_no_nan(self.label, init.name, self.env[init.name].value)
        for idx, node in enumerate(self.graph.node):
            if idx in self.live:
                self._node(idx, node)
        outputs = {o.name: self.term(o.name) for o in self.graph.output}
        try:
            return Program(outputs, dict(self.tensor_shapes), self.opaque_nodes, tensor_types=dict(self.tensor_types),
                           weights=frozenset(self.weights) - set(self.symbolic.generated))
        except ShapeError as e:       # an importer bug, but never a bare traceback
            raise ModelError(f"{file_prefix(self.label)}imported program is ill-shaped: {e}") from None

    def _where(self, idx: int, node) -> str:
        """How messages name a node of this model: the file, then node_name."""
        return file_prefix(self.label) + node_name(idx, node)

    # ---- what lowerings see (the `state` of NodeCtx) --------------------------------------

    def value(self, name: str):
        return self.env[name]

    def is_used(self, name: str) -> bool:
        return name in self.used

    def term(self, name: str) -> Term:
        """The value as a term: a constant holding one value becomes a literal where a rule
        may match it by value (constants.py), other constants named weights."""
        v = self.env[name]
        return v if isinstance(v, Term) else self.constants.term(name, v.value)

    def add_weight(self, name: str, array: np.ndarray, typed: bool = False) -> Term:
        """Register a weight as float32 (a fresh name if taken); its access-tensor. `typed`:
        the model's value, keeping its float type; else an exact helper (indices, masks)."""
        base, k = name, 1
        while name in self.tensor_shapes:
            name, k = f"{base}_{k}", k + 1
        arr = np.asarray(array)
        check_dims(self.label, f"value {base!r}", arr.shape)
        self.weights[name] = arr if arr.dtype == np.float32 else arr.astype(np.float32)
        self.tensor_shapes[name] = tuple(arr.shape)
        if typed and arr.dtype.name in NUMPY_FLOATS:
            self.tensor_types[name] = NUMPY_FLOATS[arr.dtype.name]
        return self.b.tensor(name)

    # ---- one node -------------------------------------------------------------------------

    def _node(self, idx: int, node):
        where = self._where(idx, node)
        for name in node.output:              # refused before folding allocates them
            dims = self.info.get(name, (0, None))[1] if name and self.is_used(name) else None
            if dims is not None:
                check_dims(where, f"output {name!r}", dims, empty_ok=True)
        default = node.domain in ("", "ai.onnx")
        if self._empty_outputs(node):
            return
        ins = [self.env[n] if n else None for n in node.input]
        check_one_d(where, node, lambda k: None if ins[k] is None else
                    ins[k].value.shape if isinstance(ins[k], Const) else self.b.dims(ins[k]))
        if default and node.op_type in ("Shape", "Size") and ins and ins[0] is not None:
            dims = ins[0].value.shape if isinstance(ins[0], Const) else self.b.dims(ins[0])
            self.env[node.output[0]] = Const(fold_shape(node, tuple(dims)))   # dims are static
            return
        if default and node.op_type == "If" and ins and isinstance(ins[0], Const):
            return self._inline_branch(idx, node, bool(np.asarray(ins[0].value).reshape(-1)[0]))
        all_const = all(v is None or isinstance(v, Const) for v in ins)
        fn = LOWERINGS.get(node.op_type) if default else None
        if all_const and self._should_fold(fn, ins, node.op_type):
            self._fold(idx, node, ins)
            if not self.symbolic.varies(node, self.env, fn is not None):
                return
        self._complete_info(node, ins)
        if self._empty_outputs(node):       # known empty only now, from the node's own inference
            return
        ins_all = ins
        outs = self._lower(idx, node, fn) if fn is not None else None
        if outs is None:
            if not all_const:
                ins = self._constants_of(node, ins)
            return self._fold(idx, node, ins) if ins is not None else self._opaque(idx, node, ins_all)
        for name, term in zip(node.output, outs):
            if name and term is not None:
                expect = self.info.get(name, (0, None))[1]
                if expect is not None and expect != self.b.dims(term):
                    raise ModelError(f"{where}: output {name!r} lowers to dims {self.b.dims(term)} "
                                     f"but onnx infers {expect}")
                check_dims(where, f"output {name!r}", self.b.dims(term))
                self.env[name] = term

    def _empty_outputs(self, node) -> bool:
        """When every used output has no elements (a partial rotary embedding's empty
        pass-through slice), they are constants: an empty tensor holds no value to compute.
        The language has no empty tensors; a Concat drops such parts, and an op that reads
        one gives another empty constant. True when the node needs nothing more."""
        used = [o for o in node.output if o and self.is_used(o)]
        dims = [self.info.get(o, (0, None))[1] for o in used]
        if not used or any(d is None or 0 not in d for d in dims):
            return False
        for name, d in zip(used, dims):
            elem = self.info.get(name, (0, None))[0] or onnx.TensorProto.FLOAT
            self.env[name] = Const(np.zeros(d, helper.tensor_dtype_to_np_dtype(elem)))
        return True

    def _inline_branch(self, idx: int, node, condition: bool):
        """An If whose condition is known at import (an exporter's shape check): the branch
        it takes is imported in its place, node by node, and its outputs are the If's."""
        branch = next(helper.get_attribute_value(a) for a in node.attribute
                      if a.name == ("then_branch" if condition else "else_branch"))
        self.used.update(o.name for o in branch.output)
        for sub in reversed(branch.node):      # what the branch's own nodes read, outer values too
            self.used.update(i for i in sub.input if i)
            self.used.update(outer_names(sub))
        for sub in branch.node:
            self._node(idx, sub)
        for name, out in zip(node.output, branch.output):
            if name:
                self.env[name] = self.env[out.name]

    @staticmethod
    def _should_fold(fn, ins, node_op: str = "") -> bool:
        """Fold ops without a lowering, and ops on shape-like data: no float input of more
        than one element. Float tensors (weights) stay in the language, so weights stay
        named tensors that rules can see (a BatchNorm's parameters, an Unsqueeze of one)."""
        if fn is None or node_op in FOLD_MOVES:
            return True
        return all(v is None or v.value.dtype.kind not in "fc" or v.value.size <= 1 for v in ins)

    def _complete_info(self, node, ins):
        """Element types and dims of the node's used outputs that onnx's whole-graph
        inference left unknown, from the node alone on its known inputs (node_shapes)."""
        if all(self.info.get(o, (0, None))[1] is not None and self.info[o][0]
               for o in node.output if o and self.is_used(o)):
            return
        described = []
        for name, v in zip(node.input, ins):
            if v is None:
                described.append(None)
            elif isinstance(v, Const):
                described.append(np.asarray(v.value))
            else:
                described.append((self.info.get(name, (0, None))[0], self.b.dims(v)))
        for name, (elem, dims) in zip(node.output, infer_node(node, described, self.opsets)):
            old_elem, old_dims = self.info.get(name, (0, None))
            self.info[name] = (old_elem or elem, old_dims if old_dims is not None else dims)

    def _constants_of(self, node, ins):
        """The inputs as constants when every term among them computes on weights and
        literals only (a float mask built in the language, which an op without a lowering,
        such as Swin's ScatterND, reads): evaluated once here, so the node folds instead
        of running on the host at every inference. None when one depends on an input."""
        terms = {name: v for name, v in zip(node.input, ins) if isinstance(v, Term)}
        reads = {t.args[0] for t in postorder(list(terms.values())) if t.op in ("access-tensor", "opaque")}
        if reads & (set(self.inputs) | set(self.opaque_nodes)) or any(
                t.op == "opaque" for t in postorder(list(terms.values()))):
            return None
        program = Program(terms, dict(self.tensor_shapes), {}, weights=frozenset(self.weights))
        values = evaluate(program, self.weights)
        values = values if isinstance(values, dict) else {next(iter(terms)): values}
        out = []
        for name, v in zip(node.input, ins):
            if isinstance(v, Term):
                elem = self.info.get(name, (onnx.TensorProto.FLOAT, None))[0] or onnx.TensorProto.FLOAT
                arr = np.asarray(values[name])
                want = helper.tensor_dtype_to_np_dtype(elem)
                v = Const(np.rint(arr).astype(want) if np.dtype(want).kind in "biu" else arr.astype(want))
            out.append(v)
        return out

    def _lower(self, idx: int, node, fn):
        """The node's output terms, or None when it needs an opaque call: Unlowerable, an
        integer or boolean output of an op that is not exact on float32-carried integers
        (INTEGER_EXACT), or an output the lowering does not produce but someone reads."""
        for name in node.output:
            elem = self.info.get(name, (0, None))[0]
            if name and self.is_used(name) and elem not in FLOAT_TYPES | {0} \
                    and node.op_type not in INTEGER_EXACT:
                return None
        opset = self.opsets.get(node.domain or "", self.opsets.get("", 1))
        ctx = NodeCtx(node, idx, opset, self.b, self)
        where = self._where(idx, node)
        self.lowering = node
        try:
            outs = fn(ctx)
        except Unlowerable:
            return None
        except BadAttribute as e:
            raise ModelError(f"{where}: attribute {e.attr!r}: {e}") from None
        except (NodeProblem, ShapeError, ValueError) as e:
            raise ModelError(f"{where}: {first_line(e)}") from None
        finally:
            self.lowering = None
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
        opaque_terms(self, self._where(idx, node), node, ins)


def outer_names(node) -> set[str]:
    """The values a node's subgraphs (If's branches, Loop's body) read from outside
    themselves: inputs the liveness walk would otherwise not see."""
    out: set[str] = set()
    for a in node.attribute:
        graphs = [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
        for g in graphs:
            made = {i.name for i in g.input} | {i.name for i in g.initializer}
            for sub in g.node:
                out.update(i for i in sub.input if i and i not in made)
                out.update(outer_names(sub) - made)
                made.update(sub.output)
    return out
