"""An export that keeps the original's symbolic dims: its sizes computed from Shape at run time.

`dynamic_export(export_at, symbols, signature)` exports the program at the representative
values and at one other value of each set of symbols (all 2**k corners, k symbols), and a
last time with every symbol at a third value. Node for node the exports must be the same
graph; an integer tensor that differs (a Reshape target, a Slice end, an Expand shape) is
fitted element by element as a polynomial with one coefficient per set of symbols
(`batch*seq*32`, `seq - 1`), which the third export must confirm. Why export several times
rather than carry symbols through the export: the export folds, fuses and lays out with
numpy on concrete arrays; the program it walks is already general
(apsat.pipeline.generalise), so every size that differs between two exports is one that
the program states, and comparing exports finds each one wherever the walk put it.

A fitted tensor becomes a few int64 nodes at the head of the graph, from
`Shape(input, start=axis, end=axis+1)` of the input that declares each symbol; a float
tensor of symbolic shape that is one value repeated becomes ConstantOfShape, a Range of
symbolic length a Range node. Inputs and outputs keep the original's dim names; anything
else that differs between the exports is ExportError naming it.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from apsat.backends.onnx.views import ExportError
from apsat.lang.fit import FitError, corners, fit, text

_INTS = (TensorProto.INT64, TensorProto.INT32)


def dynamic_export(export_at, symbols: dict[str, tuple[int, int, int]], signature: dict) -> onnx.ModelProto:
    """The ONNX model `export_at(values)` gives, with every size that follows the symbols
    computed at run time. `symbols`: name -> (representative, other, third value);
    `signature`: input name -> declared dims (ints and symbol names)."""
    points = corners(symbols)
    models = [export_at(values) for _, values in points]
    third_values = {n: v[2] for n, v in symbols.items()}
    third = export_at(third_values)
    base = models[0]
    for m in models[1:] + [third]:
        _same_graph(base.graph, m.graph)
    fits = {}
    for init in base.graph.initializer:
        arrays = [_init(m.graph, init.name) for m in models]
        if all(a.shape == arrays[0].shape and np.array_equal(a, arrays[0]) for a in arrays):
            continue
        fits[init.name] = _fit_tensor(init, arrays, points, _init(third.graph, init.name), third_values)
    out = onnx.ModelProto()
    out.CopyFrom(base)
    _rewrite(out.graph, fits, symbols, signature, _output_dims(models, points, third, third_values))
    hinted = {i for n in out.graph.node if n.op_type == "Attention" for i in n.input}
    out.graph.value_info.extend(_value_infos(models, points, third, third_values, set(fits), hinted))
    from apsat.backends.onnx.export import check

    check(out)              # onnx.checker with shape inference, over the symbolic dims too
    return out


def _same_graph(a, b) -> None:
    if len(a.node) != len(b.node):
        raise ExportError(f"the export has {len(a.node)} nodes at one size and {len(b.node)} at "
                          "another; it cannot keep the symbolic dims")
    for x, y in zip(a.node, b.node):
        if (x.op_type, list(x.input), list(x.output)) != (y.op_type, list(y.input), list(y.output)) \
                or x.attribute != y.attribute:
            raise ExportError(f"the export's node {x.name or x.op_type!r} changes with the symbolic dims")
    if {i.name for i in a.initializer} != {i.name for i in b.initializer}:
        raise ExportError("the export's constants change with the symbolic dims")


def _init(graph, name: str) -> np.ndarray:
    return numpy_helper.to_array(next(i for i in graph.initializer if i.name == name))


def _fit_values(values, points, third, third_values) -> list[dict]:
    try:
        return fit(values, points, third, third_values)
    except FitError as e:
        raise ExportError(f"the export cannot keep the symbolic dims: {e}") from None


def _fit_tensor(init, arrays, points, third, third_values):
    """How a differing constant is made at run time: ("ints", shape, polys) for whole
    numbers in a tensor of fixed shape (a Reshape target; a row stride in a float); ("fill", value, dims polys) or ("range", start, delta, length poly) for
    a float one of symbolic shape."""
    shapes = [a.shape for a in arrays]
    if all(s == shapes[0] for s in shapes) and third.shape == shapes[0] \
            and all(np.all(np.mod(a, 1) == 0) for a in arrays + [third]):
        return ("ints", shapes[0], _fit_values(arrays, points, third, third_values))
    dims = _fit_values([np.array(s) for s in shapes], points, np.array(third.shape), third_values)
    flat = [a.ravel() for a in arrays + [third]]
    if all(f.size and np.all(f == flat[0][0]) for f in flat):
        return ("fill", init.data_type, float(flat[0][0]), dims)
    if all(a.ndim == 1 and a.size > 1 for a in arrays):
        start, delta = float(arrays[0][0]), float(arrays[0][1] - arrays[0][0])
        if all(np.array_equal(a, start + delta * np.arange(a.size)) for a in arrays + [third]):
            return ("range", init.data_type, start, delta, dims)
    raise ExportError(f"constant {init.name!r} of the export changes with the symbolic dims "
                      "and is not one value repeated or a range")


def _output_dims(models, points, third, third_values) -> dict[str, list]:
    """Each graph output's dims as polynomials (fitted like the constants)."""
    out = {}
    for i, o in enumerate(models[0].graph.output):
        shapes = [np.array([d.dim_value for d in m.graph.output[i].type.tensor_type.shape.dim]) for m in models]
        want = np.array([d.dim_value for d in third.graph.output[i].type.tensor_type.shape.dim])
        out[o.name] = _fit_values(shapes, points, want, third_values)
    return out


def _value_infos(models, points, third, third_values, skip: set, names: set) -> list:
    """The shapes of the values `names` as onnx infers them in each export, fitted: dims
    that follow the symbols as dim_params (`batch_size*sequence_length`). onnxruntime's
    own inference knows no dim after a Reshape whose shape is computed at run time, and
    Attention's gives a width of 0 then (hf-persimmon would not load): Attention's inputs
    get their shapes back. Only those: shapes on every value cost DistilBERT 20% at 4 x 40
    in onnxruntime."""
    inferred = [{v.name: v for v in onnx.shape_inference.infer_shapes(m).graph.value_info}
                for m in models + [third]]
    out = []
    for name, vi in inferred[0].items():
        if name not in names or name in skip or any(name not in i or not i[name].type.tensor_type.HasField("shape")
                               for i in inferred):
            continue                   # a value onnx knows no shape of: left for onnxruntime
        dims = [[d.dim_value if d.HasField("dim_value") else None for d in i[name].type.tensor_type.shape.dim]
                for i in inferred]
        if len({len(d) for d in dims}) != 1 or any(None in d for d in dims):
            continue
        try:
            polys = fit([np.array(d) for d in dims[:-1]], points, np.array(dims[-1]), third_values)
        except FitError:
            continue                   # a size no polynomial gives: left for onnxruntime to infer
        shape = [text(p) if any(p) else p.get(frozenset(), 0) for p in polys]
        out.append(helper.make_tensor_value_info(name, vi.type.tensor_type.elem_type, shape))
    return out


class _Prologue:
    """Int64 nodes at the head of the graph that compute sizes from the inputs' shapes."""

    def __init__(self, symbols, signature):
        self.nodes: list = []
        self.inits: list = []
        self.sym: dict[str, str] = {}
        for name, dims in signature.items():
            for axis, d in enumerate(dims):
                if isinstance(d, str) and d in symbols and d not in self.sym:
                    self.sym[d] = self._node("Shape", [name], start=axis, end=axis + 1)

    def _node(self, op, inputs, **attrs) -> str:
        out = f"__dim{len(self.nodes)}"
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def const(self, values) -> str:
        name = f"__dimc{len(self.inits)}"
        self.inits.append(numpy_helper.from_array(np.asarray(values, dtype=np.int64).reshape(-1), name))
        return name

    def poly(self, poly: dict) -> str:
        """A [1] int64 tensor holding the polynomial's value."""
        total = None
        for s, c in sorted(poly.items(), key=lambda sc: sorted(sc[0])):
            term = self.const([c])
            for n in sorted(s):                  # `seq^2` is seq twice
                base, _, exp = n.partition("^")
                for _ in range(int(exp or 1)):
                    term = self._node("Mul", [term, self.sym[base]])
            total = term if total is None else self._node("Add", [total, term])
        return total or self.const([0])

    def tensor(self, polys: list, shape: tuple, name: str, elem: int) -> None:
        """Tensor `name` of `shape` from one polynomial per element."""
        parts = [self.poly(p) for p in polys]
        flat = parts[0] if len(parts) == 1 else self._node("Concat", parts, axis=0)
        shaped = self._node("Reshape", [flat, self.const(list(shape))]) if tuple(shape) != (len(parts),) else flat
        cast = elem if elem != TensorProto.INT64 else None
        self.nodes.append(helper.make_node("Cast" if cast else "Identity", [shaped], [name],
                                           name=f"{name}_dyn", **({"to": cast} if cast else {})))


def _rewrite(graph, fits, symbols, signature, outputs) -> None:
    missing = [s for s in symbols if not any(s in dims for dims in signature.values())]
    if missing:
        raise ExportError(f"symbolic dims {missing} are declared by no input")
    pro = _Prologue(symbols, signature)
    for name, how in fits.items():
        kind = how[0]
        if kind == "ints":
            pro.tensor(how[2], how[1], name, next(i for i in graph.initializer if i.name == name).data_type)
        elif kind == "fill":
            shape = pro._node("Concat", [pro.poly(p) for p in how[3]], axis=0) if len(how[3]) > 1 else pro.poly(how[3][0])
            value = helper.make_tensor("value", how[1], [1], [how[2]])
            pro.nodes.append(helper.make_node("ConstantOfShape", [shape], [name], name=f"{name}_dyn", value=value))
        else:
            _, elem, start, delta, dims = how
            length = pro.poly(dims[0])
            r = pro._node("Range", [_scalar(pro, 0), _squeeze(pro, length), _scalar(pro, 1)])
            scaled = pro._node("Cast", [r], to=elem)
            a = helper.make_tensor(f"{name}_d", elem, [], [delta])
            b = helper.make_tensor(f"{name}_s", elem, [], [start])
            pro.inits.extend([a, b])
            pro.nodes.append(helper.make_node("Add", [pro._node("Mul", [scaled, a.name]), b.name], [name],
                                              name=f"{name}_dyn"))
    keep = [i for i in graph.initializer if i.name not in fits]
    del graph.initializer[:]
    graph.initializer.extend(keep + pro.inits)
    body = list(graph.node)
    del graph.node[:]
    graph.node.extend(pro.nodes + body)
    del graph.value_info[:]
    for vi in graph.input:
        for d, want in zip(vi.type.tensor_type.shape.dim, signature.get(vi.name, ())):
            if isinstance(want, str):
                d.Clear()
                d.dim_param = want
    for vi in graph.output:
        for d, poly in zip(vi.type.tensor_type.shape.dim, outputs[vi.name]):
            if any(s for s in poly):
                d.Clear()
                d.dim_param = text(poly)


def _scalar(pro: _Prologue, value: int) -> str:
    name = f"__dims{len(pro.inits)}"
    pro.inits.append(numpy_helper.from_array(np.array(value, dtype=np.int64), name))
    return name


def _squeeze(pro: _Prologue, one: str) -> str:
    return pro._node("Squeeze", [one])
