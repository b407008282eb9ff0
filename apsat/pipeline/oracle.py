"""The float64 yardstick verification measures float32 error against.

`float64_run(model_proto, inputs)` runs a float64 copy of the ORIGINAL model in
onnxruntime (CPU, graph optimisations off): every float32, float16 and bfloat16
initializer, graph input, output and value_info, every Cast to one of those, Constant
and ConstantOfShape value becomes double, and the float inputs are fed as double. Inputs
an op's schema takes as float only (Resize's scales) are cast back to float where they
are read. A half-precision model is so measured against the same yardstick: until
2026-11-27 its copy converted float32 only, so an fp16 model's "float64" run was its own
fp16 run, and onnxruntime's error in fp16 counted as none.

onnxruntime has no double kernel for some ops. Conv, AveragePool, GlobalAveragePool and
LRN, which sum many products, are rewritten into double-kernel ops (apsat.pipeline.oracle_ops).
An elementwise op (Erf, HardSigmoid, ...) runs in float32 between Casts: one float32
rounding of that op's result, where the float32 run has that rounding and every other.
Any other op without a double kernel (a com.microsoft op, an op nothing here rewrites)
leaves no float64 copy: `float64_run` raises `NoFloat64` with the reason, and
verification falls back to the fixed-tolerance rule (apsat.pipeline.verify).
"""
from __future__ import annotations

import re

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from apsat.pipeline.oracle_ops import DECOMPOSE, CannotDecompose

FLOAT, DOUBLE = TensorProto.FLOAT, TensorProto.DOUBLE
# the element types the copy makes double: what the model computes in short of float64
NARROW_FLOATS = frozenset({TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16})
# what a copy turns into what: (element type, numpy dtype, the element types it replaces)
_TO_DOUBLE = (DOUBLE, np.float64, NARROW_FLOATS)
_NARROW_DTYPES = ("float32", "float16", "bfloat16")
# Elementwise ops: run in float32 inside the float64 copy when onnxruntime has no double
# kernel, each result element then carrying one float32 rounding (<= 2^-24 relative).
ELEMENTWISE = {"Erf", "HardSigmoid", "HardSwish", "Gelu", "Softplus", "Softsign", "Selu", "Elu",
               "Celu", "ThresholdedRelu", "LeakyRelu", "Mish", "Sin", "Cos", "Tan", "Asin", "Acos",
               "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "Round", "Sign", "Shrink",
               "IsInf", "IsNaN", "Mod"}
# Ops onnxruntime 1.32's CPU provider runs in float32 only (measured); others found when a
# session refuses the copy are added as they come (`_NO_DOUBLE`).
# HardSwish and Gelu are function ops that onnxruntime expands into HardSigmoid and Erf.
_NO_DOUBLE = {"Conv", "AveragePool", "GlobalAveragePool", "LRN", "InstanceNormalization", "Erf", "HardSigmoid", "HardSwish", "Gelu"}
_NO_KERNEL = re.compile(r"Could not find an implementation for (\w+)\(\d+\)")
# Float initializers of this many elements or more reach onnxruntime as graph inputs fed
# numpy arrays, so the copy's protobuf stays small (no serialising of VGG19's 1.1 GB of
# doubles, no 2 GiB protobuf limit) and onnxruntime holds no copy of them.
EXTERNAL_ELEMENTS = 1024
# The float64 copy's weights are twice the model's float32 bytes on top of them: past this
# (a 0.27B-parameter model) the copy is not made and verification uses the fixed-tolerance
# rule, so that a model's verification needs little more memory than its weights.
FLOAT64_WEIGHT_BYTES = 2 * 2**30
_DTYPE_ATTR_OPS = {"EyeLike", "RandomNormal", "RandomUniform", "RandomNormalLike",
                   "RandomUniformLike", "Bernoulli"}


class NoFloat64(Exception):
    """No float64 copy of the model runs in onnxruntime; the message says why."""


def float64_run(model_proto: onnx.ModelProto, inputs: dict,
                external: dict | None = None) -> tuple[dict[str, np.ndarray], list[str]]:
    """(every graph output of the float64 copy on `inputs` (float inputs as double), notes
    saying which ops were rewritten or ran in float32). `external`: name -> array of the
    weights the proto keeps as external data. NoFloat64 when no copy runs, or when its
    weights would pass FLOAT64_WEIGHT_BYTES."""
    from apsat.pipeline.zoo import ort_session, weights_as_inputs

    external = external or {}
    big = [i for i in model_proto.graph.initializer
           if i.data_type in NARROW_FLOATS and (_elements(i) >= EXTERNAL_ELEMENTS or i.name in external)]
    need = 8 * sum(_elements(i) for i in big)
    if need > FLOAT64_WEIGHT_BYTES:
        raise NoFloat64(f"its weights in float64 would take {need / 2**30:.1f} GiB "
                        f"(more than {FLOAT64_WEIGHT_BYTES / 2**30:.0f} GiB)")

    feeds = {k: np.asarray(v).astype(np.float64) if np.asarray(v).dtype.name in _NARROW_DTYPES else v
             for k, v in inputs.items()}
    shapes, floats = infer(model_proto, {k: np.shape(v) for k, v in inputs.items()})
    unknown = [n for n in _decomposed_inputs(model_proto.graph) if not _known(shapes.get(n))]
    if unknown:     # shape inference fell short (a Reshape fed by computed shapes)
        shapes.update(measured_shapes(model_proto, inputs, unknown))
    weights = {i.name: (external[i.name] if i.name in external else numpy_helper.to_array(i)).astype(np.float64)
               for i in big}
    for _ in range(8):     # each refusal names one more op without a double kernel
        copy, notes = float64_copy(model_proto, shapes, floats, set(weights))
        try:   # the weights fed as inputs: onnxruntime copies initializers, not feeds
            sess = ort_session(weights_as_inputs(copy, weights))
        except Exception as e:     # onnxruntime refuses the copy: find out why
            text = _first_line(e)
            missing = _NO_KERNEL.search(text)
            if missing is None or missing.group(1) in _NO_DOUBLE:
                raise NoFloat64(f"onnxruntime refuses the float64 copy: {text}") from None
            _NO_DOUBLE.add(missing.group(1))
            continue
        names = [o.name for o in sess.get_outputs()]
        try:
            return dict(zip(names, sess.run(names, {**feeds, **weights}))), notes
        except Exception as e:     # a kernel that refuses doubles only when it runs
            raise NoFloat64(f"the float64 copy fails in onnxruntime: {_first_line(e)}") from None
    raise NoFloat64("onnxruntime refuses the float64 copy: too many ops without a double kernel")


def _first_line(e: Exception) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def _elements(init) -> int:
    return int(np.prod(init.dims)) if init.dims else 1


def infer(model_proto: onnx.ModelProto, input_dims: dict) -> tuple[dict[str, tuple], set[str]]:
    """(value name -> dims (ints, None for an unknown dim), names of the float32, float16 and
    bfloat16 values), by
    onnx shape inference with the graph inputs' dims set to `input_dims`; weights by their
    own dims and type."""
    from apsat.pipeline.zoo import without_big_weights

    sk = without_big_weights(model_proto)
    for vi in sk.graph.input:
        if vi.name in input_dims:
            shape = vi.type.tensor_type.shape
            shape.ClearField("dim")
            for d in input_dims[vi.name]:
                shape.dim.add().dim_value = int(d)
    try:
        sk = onnx.shape_inference.infer_shapes(sk, data_prop=True)
    except Exception:      # an op onnx cannot infer: what needs a shape measures it
        pass
    shapes = {i.name: tuple(i.dims) for i in model_proto.graph.initializer}
    floats = {i.name for i in model_proto.graph.initializer if i.data_type in NARROW_FLOATS}
    for vi in [*sk.graph.input, *sk.graph.value_info, *sk.graph.output, *model_proto.graph.value_info]:
        t = vi.type.tensor_type
        floats |= {vi.name} if t.elem_type in NARROW_FLOATS else set()
        if t.HasField("shape") and vi.name not in shapes:
            shapes[vi.name] = tuple(d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim)
    return shapes, floats


def _decomposed_inputs(g) -> list[str]:
    """The values whose dims the rewrites need: data and weight inputs of rewritten ops."""
    return sorted({name for n in g.node if n.op_type in DECOMPOSE for name in n.input[:2] if name})


def _known(dims) -> bool:
    return dims is not None and all(isinstance(d, int) and d > 0 for d in dims)


def measured_shapes(model_proto: onnx.ModelProto, inputs: dict, names: list[str]) -> dict[str, tuple]:
    """Dims of the float values `names`, from an onnxruntime run of the model that returns
    them as extra graph outputs. They are declared with no type, since onnxruntime
    refuses one that differs from the value's (float where a float16 model has float16)."""
    from apsat.pipeline.zoo import ort_run

    model = onnx.ModelProto()
    model.CopyFrom(model_proto)
    have = {o.name for o in model.graph.output}
    model.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names if n not in have)
    out = ort_run(model, inputs)
    return {n: tuple(out[n].shape) for n in names}


def float64_copy(model_proto: onnx.ModelProto, shapes: dict, floats: set,
                 external: set = frozenset()) -> tuple[onnx.ModelProto, list[str]]:
    """(the float64 copy, notes on ops rewritten or run in float32); NoFloat64 for an op
    without a double kernel that is neither rewritable nor elementwise. `shapes`, `floats`:
    `infer`'s view of the model, which the rewrites need. The top-level initializers named
    in `external` are left for the caller to give onnxruntime (`ort_session`'s external)."""
    from apsat.pipeline.zoo import ORT_IR_VERSION, without_initializers

    model, g = without_initializers(model_proto), model_proto.graph
    model.ir_version = min(model_proto.ir_version, ORT_IR_VERSION)
    for init in g.initializer:
        model.graph.initializer.append(_external(init) if init.name in external else init)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 21)
    tally: dict[str, int] = {}
    _convert_graph(model.graph, opset, floats, shapes, tally)
    notes = [f"{op} x{n} {how}" for (op, how), n in sorted(tally.items())]
    return model, notes


def _external(init) -> onnx.TensorProto:
    """A double initializer whose data onnxruntime takes from outside the model."""
    t = onnx.TensorProto(name=init.name, data_type=DOUBLE, dims=init.dims,
                         data_location=onnx.TensorProto.EXTERNAL)
    t.external_data.add(key="location", value=f"{init.name}.f64")
    return t


def _convert_graph(g, opset: int, floats: set, shapes: dict, tally: dict, prefix: str = "__f64",
                   to: tuple = _TO_DOUBLE):
    """Turn one graph (and its subgraphs) float64 in place (see the module doc), or, with
    another `to`, its other float types `to`'s (retyped_copy); names the copy adds
    start with `prefix`."""
    elem, dtype, replaced = to
    for init in g.initializer:
        if init.data_type in replaced and init.data_location != onnx.TensorProto.EXTERNAL:
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).astype(dtype), init.name))
    for vi in [*g.input, *g.output, *g.value_info]:
        if vi.type.tensor_type.elem_type in replaced:
            vi.type.tensor_type.elem_type = elem
    nodes = []
    for i, node in enumerate(g.node):
        _convert_attributes(node, opset, floats, shapes, tally, f"{prefix}/{i}", to)
        nodes += _replace(node, opset, floats, shapes, f"{prefix}/{i}", g, tally) if elem == DOUBLE else [node]
    del g.node[:]
    g.node.extend(nodes)


def _convert_attributes(node, opset, floats, shapes, tally, tag, to):
    """Element types named by attributes become the copy's; subgraphs are converted."""
    elem, dtype, replaced = to
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            _convert_graph(a.g, opset, floats, shapes, tally, f"{tag}/{a.name}", to)
        elif a.type == onnx.AttributeProto.GRAPHS:
            for k, sub in enumerate(a.graphs):
                _convert_graph(sub, opset, floats, shapes, tally, f"{tag}/{a.name}{k}", to)
    attrs = {a.name: a for a in node.attribute}
    if node.op_type == "Cast" and attrs["to"].i in replaced:
        attrs["to"].i = elem
    elif node.op_type in _DTYPE_ATTR_OPS and "dtype" in attrs and attrs["dtype"].i in replaced:
        attrs["dtype"].i = elem
    elif node.op_type == "ConstantOfShape" and "value" not in attrs and FLOAT in replaced:
        node.attribute.append(helper.make_attribute("value", numpy_helper.from_array(np.zeros(1, dtype))))
    elif node.op_type in ("Constant", "ConstantOfShape"):
        for name in ("value", "value_float", "value_floats"):
            if name in attrs:
                _retyped_value(node, attrs[name], to)


def _retyped_value(node, attr, to):
    """A Constant's or ConstantOfShape's float value, as a tensor attribute of the copy's
    type."""
    elem, dtype, replaced = to
    if attr.name == "value":
        if attr.t.data_type in replaced:
            attr.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(attr.t).astype(dtype), attr.t.name))
        return
    if FLOAT not in replaced:      # value_float(s) are float32
        return
    value = np.array(attr.f if attr.name == "value_float" else list(attr.floats), np.float32).astype(dtype)
    node.attribute.remove(attr)
    node.attribute.append(helper.make_attribute("value", numpy_helper.from_array(value)))


def retyped_copy(model_proto: onnx.ModelProto, elem: int) -> onnx.ModelProto:
    """The model with its other float32, float16 and bfloat16 weights, values, casts and
    constants made `elem` (TensorProto.FLOAT, FLOAT16 or BFLOAT16), each value rounded to
    it: how a model is given in another precision (benchmarks/precision.py), and, as
    float32_copy, a half-precision model widened exactly."""
    model = onnx.ModelProto()
    model.CopyFrom(model_proto)
    to = (elem, helper.tensor_dtype_to_np_dtype(elem), NARROW_FLOATS - {elem})
    _convert_graph(model.graph, 0, set(), {}, {}, f"__{elem}", to)
    return model


def float32_copy(model_proto: onnx.ModelProto) -> onnx.ModelProto:
    """The model with its float16 and bfloat16 weights, values, casts and constants made
    float32 (each value exactly): where no float64 copy runs, a half-precision model's
    fixed-tolerance yardstick, computed as a float32 model's own would be."""
    return retyped_copy(model_proto, FLOAT)


def _replace(node, opset, floats, shapes, tag, g, tally) -> list:
    """The nodes standing for `node` in the copy: itself, a rewrite into double-kernel ops,
    or itself between Casts to and from float."""
    if node.domain not in ("", "ai.onnx"):
        if any(n in floats for n in [*node.input, *node.output]):
            raise NoFloat64(f"{node.domain}.{node.op_type} has no known double kernel")
        return [node]
    if node.op_type in _NO_DOUBLE and any(n in floats for n in [*node.input, *node.output]):
        if node.op_type in DECOMPOSE:
            try:
                nodes, inits = DECOMPOSE[node.op_type](node, shapes, tag)
            except CannotDecompose as e:
                raise NoFloat64(str(e)) from None
            g.initializer.extend(inits)
            tally[(node.op_type, "rewritten")] = tally.get((node.op_type, "rewritten"), 0) + 1
            return nodes
        if node.op_type not in ELEMENTWISE:
            raise NoFloat64(f"{node.op_type} has no double kernel in onnxruntime")
        tally[(node.op_type, "in float32")] = tally.get((node.op_type, "in float32"), 0) + 1
        return _in_float32(node, floats, tag, range(len(node.input)))
    narrow = _float_only_inputs(node, opset, floats)
    return _in_float32(node, floats, tag, narrow, outputs=False) if narrow else [node]


def _float_only_inputs(node, opset, floats) -> list[int]:
    """Positions of float inputs the op's schema takes as float but not double."""
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, node.domain)
    except Exception:
        return []
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    out = []
    for pos, name in enumerate(node.input):
        if not name or name not in floats or not schema.inputs:
            continue
        formal = schema.inputs[min(pos, len(schema.inputs) - 1)]
        types = allowed.get(formal.type_str, {formal.type_str})
        if "tensor(double)" not in types and "tensor(float)" in types:
            out.append(pos)
    return out


def _in_float32(node, floats, tag, positions, outputs=True) -> list:
    """`node` reading its inputs at `positions` through Casts to float and, with outputs,
    writing its float outputs through Casts to double."""
    before, after = [], []
    for pos in positions:
        name = node.input[pos]
        if name and name in floats:
            before.append(helper.make_node("Cast", [name], [f"{tag}/in{pos}"], to=FLOAT))
            node.input[pos] = f"{tag}/in{pos}"
    for pos, name in enumerate(node.output if outputs else []):
        if name in floats:
            after.append(helper.make_node("Cast", [f"{tag}/out{pos}"], [name], to=DOUBLE))
            node.output[pos] = f"{tag}/out{pos}"
    return before + [node] + after
