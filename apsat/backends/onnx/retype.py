"""The program's half types written into an export (apsat/lang/dtypes.py says what they mean).

The walk and the fusions write every float value as float32. A program that computes in a
half type keeps its inputs, weights and outputs in that type (`export.py` leaves them so),
and `retype` then gives every value of the graph its type, node by node in order, by the
ONNX schema's type constraints:

- a value has the type its producer's schema gives (onnx's node inference), a contrib op's
  output that of its float inputs;
- the inputs one type variable binds take one type: the half type if any of them has it,
  else float32. A float32 value bound with a half one is an exact value (an index or mask,
  which the language lets take its partner's type) and is cast to the half type;
- a float32 initializer the walk wrote (a constant, a folded weight) takes the type its use
  binds it to, as a literal does in the language; where nothing binds it, in a half model,
  the half type when its values are exact in it (a weight of the model), else float32 (an
  index table past 2048 in f16); in a float32 model computed partly in a half type, float32;
- a graph output whose value has another type than the original's is cast to it.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper, shape_inference

from apsat.lang.dtypes import NAMES, round_to

FLOAT = TensorProto.FLOAT
HALVES = (TensorProto.FLOAT16, TensorProto.BFLOAT16)


def retype(model: onnx.ModelProto, opset: int, half: int, loose_half: bool = True) -> None:
    """Give every value of `model` (an export whose inputs and weights hold their half
    types and whose other floats are float32) its element type, in place. `half`: the
    program's half type (ONNX code); `loose_half`: a float32 initializer nothing binds takes
    it where its values are exact in it (a half model's weights); else (a float32 model
    computed partly in `half`) such an initializer stays float32."""
    _Retyping(model, opset, half if loose_half else None).run()


class _Retyping:
    def __init__(self, model, opset: int, half: int | None):
        self.g, self.opset, self.half = model.graph, opset, half
        self.types = {v.name: v.type.tensor_type.elem_type for v in self.g.input}
        self.inits = {t.name: t for t in self.g.initializer}
        # the walk's float32 initializers: typed by their use (`_bind`)
        self.loose = {n for n, t in self.inits.items() if t.data_type == FLOAT}
        self.types.update((n, t.data_type) for n, t in self.inits.items() if n not in self.loose)
        self.copies: dict[tuple[str, int], str] = {}
        self.nodes: list = []

    def run(self) -> None:
        for node in self.g.node:
            self._bind(node)
            self.nodes.append(node)
            self._infer(node)
        self._outputs()
        del self.g.node[:]
        self.g.node.extend(self.nodes)
        del self.g.value_info[:]
        read = {i for n in self.nodes for i in n.input} | {o.name for o in self.g.output}
        kept = [t for t in self.g.initializer if t.name in read]
        del self.g.initializer[:]
        self.g.initializer.extend(kept)

    # ---- inputs ---------------------------------------------------------------------------

    def _groups(self, node) -> list[list[int]]:
        """The input positions each type variable of the node's schema binds; a contrib op's
        float inputs are one group."""
        schema = _schema(node, self.opset)
        if schema is None:
            return [[i for i, n in enumerate(node.input) if n and self._is_float(n)]]
        formal = schema.inputs
        by_var: dict[str, list[int]] = {}
        for i, name in enumerate(node.input):
            if not name or not formal:
                continue
            f = formal[min(i, len(formal) - 1)]
            if f.type_str.startswith("tensor(") or f.type_str.startswith("seq("):
                continue
            by_var.setdefault(f.type_str, []).append(i)
        return list(by_var.values())

    def _is_float(self, name: str) -> bool:
        return name in self.loose or self.types.get(name) in (FLOAT, *HALVES)

    def _bind(self, node) -> None:
        for group in self._groups(node):
            names = [node.input[i] for i in group]
            known = {self.types[n] for n in names if n not in self.loose and n in self.types}
            half = next((t for t in HALVES if t in known), None)
            if half is None and not known and names and all(n in self.loose for n in names):
                half = self._exact_half(names)
            for i in group:
                name = node.input[i]
                if half is None:
                    if name in self.loose:
                        self.types[name] = FLOAT
                elif name in self.loose:
                    node.input[i] = self._converted(name, half)
                elif self.types.get(name) == FLOAT:
                    node.input[i] = self._cast(name, half)

    def _exact_half(self, names) -> int | None:
        """The program's half type when every one of these loose initializers is exact in
        it, else None."""
        half = self.half
        if half is None:
            return None
        for n in names:
            a = numpy_helper.to_array(self.inits[n])
            with np.errstate(over="ignore", invalid="ignore"):
                if not np.array_equal(round_to(a, NAMES[half]), a, equal_nan=True):
                    return None
        return half

    def _converted(self, name: str, elem: int) -> str:
        """A loose initializer in `elem`: a copy (its values rounded) written once."""
        key = (name, elem)
        if key not in self.copies:
            a = round_to(numpy_helper.to_array(self.inits[name]), NAMES[elem])
            new = f"{name}__{NAMES[elem]}"
            t = numpy_helper.from_array(np.asarray(a).astype(onnx.helper.tensor_dtype_to_np_dtype(elem)), new)
            self.g.initializer.append(t)
            self.types[new] = elem
            self.copies[key] = new
        return self.copies[key]

    def _cast(self, name: str, elem: int) -> str:
        """A float32 value cast to `elem` by one node, written once."""
        key = (name, elem)
        if key not in self.copies:
            new = f"{name}__{NAMES[elem]}"
            self.nodes.append(helper.make_node("Cast", [name], [new], name=new, to=elem))
            self.types[new] = elem
            self.copies[key] = new
        return self.copies[key]

    # ---- outputs ----------------------------------------------------------------------------

    def _infer(self, node) -> None:
        """The types of the node's outputs, from its inputs' (contrib ops: their float
        inputs' type)."""
        schema = _schema(node, self.opset)
        if schema is None:
            elem = next((self.types[n] for n in node.input if n and self.types.get(n) in HALVES), FLOAT)
            self.types.update((o, elem) for o in node.output if o)
            return
        given = {n: helper.make_tensor_type_proto(self.types[n], None) for n in node.input
                 if n and n in self.types}
        try:
            out = shape_inference.infer_node_outputs(schema, node, given)
        except Exception:  # noqa: BLE001 - inference refuses a node whose inputs it cannot type
            out = {}
        for o in node.output:
            if o:
                self.types[o] = out[o].tensor_type.elem_type if o in out else FLOAT

    def _outputs(self) -> None:
        """Each graph output in its declared type: its producer's output renamed to a value
        cast to it where the types differ."""
        for vi in self.g.output:
            want = vi.type.tensor_type.elem_type
            have = self.types.get(vi.name)
            if have is None or have == want:
                continue
            producer = next(n for n in self.nodes if vi.name in n.output)
            inner = f"{vi.name}__{NAMES.get(have, 'value')}"
            producer.output[list(producer.output).index(vi.name)] = inner
            self.nodes.append(helper.make_node("Cast", [inner], [vi.name], name=f"{vi.name}_cast", to=want))


def _schema(node, opset: int):
    """The node's ONNX schema at the export's opset; None for a contrib op."""
    if node.domain not in ("", "ai.onnx"):
        return None
    try:
        return onnx.defs.get_schema(node.op_type, opset)
    except onnx.defs.SchemaError:
        return None
