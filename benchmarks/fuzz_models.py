"""Malformed ONNX models for benchmarks/fuzz.py, one generator family a function.

`MODEL_FAMILIES` maps a family name to `gen(rng) -> bytes`: the bytes of one model file,
built from a small valid base model (`base_model(rng)`: Conv/Relu, MatMul/Add, a small
convnet, ConstantOfShape or Reshape graphs of a few KB, made with onnx.helper) and
mutated. A family is deterministic in its `random.Random`, so a case's seed regenerates it.
The cases are meant to be malformed, but some mutations leave a valid model (a bit flip in
a weight's bytes, a NaN weight): the CLI must then accept it.
"""
from __future__ import annotations

import random

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F = TensorProto.FLOAT
HUGE = 2 ** 20          # two such dims: 2**40 elements, which must be refused, not allocated


def _vi(name, dims, elem=F):
    return helper.make_tensor_value_info(name, elem, dims)


def _model(nodes, inputs, outputs, inits=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "fuzz", inputs, outputs,
                              initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in inits])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _w(rng, *shape):
    return np.asarray([rng.gauss(0, 0.3) for _ in range(int(np.prod(shape)))], np.float32).reshape(shape)


def _conv_relu(rng):
    return _model([helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
                   helper.make_node("Relu", ["c"], ["y"])],
                  [_vi("x", [1, 3, 8, 8])], [_vi("y", [1, 4, 8, 8])],
                  [("W", _w(rng, 4, 3, 3, 3)), ("B", _w(rng, 4))])


def _matmul_add(rng):
    return _model([helper.make_node("MatMul", ["x", "W"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
                   helper.make_node("Relu", ["a"], ["y"])],
                  [_vi("x", [2, 8])], [_vi("y", [2, 4])], [("W", _w(rng, 8, 4)), ("b", _w(rng, 4))])


def _convnet(rng):
    return _model([helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
                   helper.make_node("Relu", ["c"], ["r"]),
                   helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
                   helper.make_node("Flatten", ["p"], ["f"], axis=1),
                   helper.make_node("Gemm", ["f", "W2", "B2"], ["y"], transB=1)],
                  [_vi("x", [1, 3, 8, 8])], [_vi("y", [1, 10])],
                  [("W", _w(rng, 4, 3, 3, 3)), ("B", _w(rng, 4)), ("W2", _w(rng, 10, 64)), ("B2", _w(rng, 10))])


def _const_of_shape(rng):
    fill = helper.make_tensor("v", F, [1], [0.5])
    return _model([helper.make_node("ConstantOfShape", ["s"], ["k"], value=fill),
                   helper.make_node("Add", ["x", "k"], ["y"])],
                  [_vi("x", [2, 3])], [_vi("y", [2, 3])], [("s", np.array([2, 3], np.int64))])


def _reshape(rng):
    return _model([helper.make_node("Reshape", ["x", "s"], ["r"]), helper.make_node("Relu", ["r"], ["y"])],
                  [_vi("x", [2, 6])], [_vi("y", [3, 4])], [("s", np.array([3, 4], np.int64))])


BASES = {"conv-relu": _conv_relu, "matmul-add": _matmul_add, "convnet": _convnet,
         "constant-of-shape": _const_of_shape, "reshape": _reshape}


def base_model(rng, name: str | None = None) -> onnx.ModelProto:
    """A small valid model: `name` from BASES, or one chosen by `rng`."""
    return BASES[name or rng.choice(sorted(BASES))](rng)


# ---- byte-level ---------------------------------------------------------------------------

def truncate(rng) -> bytes:
    """The base model's bytes cut at a random point."""
    data = base_model(rng).SerializeToString()
    return data[:rng.randrange(1, len(data))]


def bitflip(rng) -> bytes:
    """The base model's bytes with 1 to 16 bits flipped, bytes replaced, deleted or inserted."""
    data = bytearray(base_model(rng).SerializeToString())
    for _ in range(rng.choice([1, 1, 2, 4, 16])):
        pos = rng.randrange(len(data))
        how = rng.random()
        if how < 0.6:
            data[pos] ^= 1 << rng.randrange(8)
        elif how < 0.8:
            data[pos] = rng.randrange(256)
        elif how < 0.9:
            del data[pos:pos + rng.randrange(1, 8)]
        else:
            data[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 8)))
    return bytes(data)


# ---- graph-level: each mutates a base model --------------------------------------------------

def elem_type(rng):
    """An input, output or initializer of a wrong, undefined or unknown element type, or a Cast to one."""
    m = base_model(rng)
    bad = rng.choice([0, TensorProto.INT64, TensorProto.INT32, TensorProto.BOOL, TensorProto.STRING,
                      TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.UINT8, TensorProto.COMPLEX64,
                      TensorProto.FLOAT8E4M3FN, 99, 12345])
    where = rng.random()
    if where < 0.4:
        rng.choice(list(m.graph.input) + list(m.graph.output)).type.tensor_type.elem_type = bad
    elif where < 0.8:
        rng.choice(list(m.graph.initializer)).data_type = bad      # bytes no longer fit the type
    else:                                                           # a Cast to the bad type
        first = m.graph.node[0]
        first.input[0] = "xc"
        m.graph.node.insert(0, helper.make_node("Cast", ["x"], ["xc"], to=bad))
    return m


def _set_dims(vi, dims):
    shape = vi.type.tensor_type.shape
    del shape.dim[:]
    for d in dims:
        shape.dim.add().dim_value = d


def rank_dim(rng):
    """A declared shape with a dim added, dropped, changed or cleared, or an initializer
    whose dims no longer fit its data."""
    m = base_model(rng)
    if rng.random() < 0.5:
        vi = rng.choice(list(m.graph.input) + list(m.graph.output))
        d = [x.dim_value for x in vi.type.tensor_type.shape.dim]
        _set_dims(vi, [d + [rng.choice([1, 2, 3, 7])], d[:-1], d[:-1] + [rng.choice([1, 2, 5, 9, 64])], []]
                  [rng.randrange(4)])
    else:
        init = rng.choice(list(m.graph.initializer))
        d = list(init.dims)
        d = [d[:-1] or [2], d + [rng.choice([1, 2, 3])], [x + rng.choice([-1, 1]) for x in d]][rng.randrange(3)]
        del init.dims[:]
        init.dims.extend(max(x, 1) for x in d)
    return m


def dims(rng):
    """Zero, negative and huge dims on inputs, outputs and initializers."""
    m = base_model(rng)
    value = rng.choice([0, -1, -7, HUGE, 2 ** 31, 2 ** 40, 2 ** 62])
    if rng.random() < 0.6:
        vi = rng.choice(list(m.graph.input) + list(m.graph.output))
        d = [x.dim_value for x in vi.type.tensor_type.shape.dim]
        d[rng.randrange(len(d))] = value
        _set_dims(vi, d)
    else:
        init = rng.choice(list(m.graph.initializer))
        d = list(init.dims)
        d[rng.randrange(len(d))] = value
        del init.dims[:]
        init.dims.extend(d)
    return m


def _one_op(op, x_dims, const=None, const_name="s", extra_inputs=()):
    """y = op(x, const) over an input x of `x_dims` (None: no x) and an int64 or float constant."""
    inputs = (["x"] if x_dims is not None else []) + list(extra_inputs) + ([const_name] if const is not None else [])
    inits = [(const_name, np.asarray(const))] if const is not None else []
    return _model([helper.make_node(op, inputs, ["y"])], [_vi("x", x_dims)] if x_dims is not None else [],
                  [_vi("y", None)], inits)


def huge(rng):
    """2**40 elements and more, by every route a small file can ask for them."""
    big = [HUGE, HUGE] if rng.random() < 0.7 else [2 ** 13] * 4
    shape = np.array(big, np.int64)
    route = rng.randrange(8)
    if route == 7:
        m = _model([helper.make_node("Add", ["x", "w"], ["y"])], [_vi("x", [1, 1])], [_vi("y", None)])
        w = m.graph.initializer.add()                # dims, and no data
        w.name, w.data_type, w.raw_data = "w", F, b""
        w.dims.extend(big)
        return m
    return [lambda: _one_op("Relu", big), lambda: _one_op("ConstantOfShape", None, shape),
            lambda: _one_op("Expand", [1, 1], shape), lambda: _one_op("Reshape", [2, 3], shape),
            lambda: _one_op("Tile", [2, 3], shape), lambda: _one_op("Pad", [2, 3], np.array([0, 0] + big[:2]))
            if len(big) == 2 else _one_op("Tile", [1, 1, 1, 1], shape),
            lambda: _one_op("Resize", [1, 1, 2, 2], np.array([1, 1, HUGE, HUGE], np.float32), "sc", [""])][route]()


def zero_size(rng):
    """A zero-element tensor: an input, initializer, ConstantOfShape, Slice, Reshape or MatMul operand."""
    route = rng.randrange(6)
    if route == 4:
        return _model([helper.make_node("Slice", ["x", "st", "en"], ["s"]), helper.make_node("Relu", ["s"], ["y"])],
                      [_vi("x", [4, 3])], [_vi("y", None)],
                      [("st", np.array([2], np.int64)), ("en", np.array([2], np.int64))])
    return [lambda: _one_op("Relu", [0, 3]), lambda: _one_op("Add", [2, 3], np.zeros((0, 3), np.float32), "w"),
            lambda: _one_op("ConstantOfShape", None, np.array([0, 4], np.int64)),
            lambda: _one_op("Reshape", [0, 3], np.array([3, 0], np.int64)), None,
            lambda: _one_op("MatMul", [2, 0], np.zeros((0, 4), np.float32), "w")][route]()


def missing_init(rng):
    """An initializer removed (sometimes still declared as an input, or the first input removed too)."""
    m = base_model(rng)
    inits = list(m.graph.initializer)
    victim = rng.choice(inits)
    m.graph.initializer.remove(victim)
    if rng.random() < 0.3:                           # old style: still declared as an input
        m.graph.input.append(_vi(victim.name, list(victim.dims), victim.data_type))
    elif rng.random() < 0.3:
        m.graph.input.remove(m.graph.input[0])
    return m


_BAD_ATTRS = {
    "kernel_shape": [[], [0, 0], [9, 9], [-3, 3], [3]], "pads": [[-1, -1, -1, -1], [1], [HUGE] * 4, [0] * 6],
    "strides": [[0, 0], [-1, 1], [HUGE, 1], [1]], "dilations": [[0, 1], [-2, -2], [HUGE, HUGE]],
    "group": [0, -1, 3, HUGE], "axis": [99, -99, 2 ** 62], "transB": [7, -1], "alpha": [float("nan"), 1e39],
    "auto_pad": ["SIDEWAYS", "", "VALID"], "ceil_mode": [5], "storage_order": [3]}


def attributes(rng):
    """An attribute removed, of the wrong type, unknown, or out of range (_BAD_ATTRS)."""
    m = base_model(rng)
    node = rng.choice(list(m.graph.node))
    how = rng.random()
    if how < 0.25 and node.attribute:
        node.attribute.remove(rng.choice(list(node.attribute)))
    elif how < 0.45 and node.attribute:                   # right name, wrong attribute type
        attr = rng.choice(list(node.attribute))
        value = rng.choice([1.5, 3, "text", [1, 2], [0.5, 0.5]])
        attr.CopyFrom(helper.make_attribute(attr.name, value))
    elif how < 0.55:
        node.attribute.append(helper.make_attribute(rng.choice(["frob", "", "kernel_shape"]), rng.choice([1, "x"])))
    else:
        name = rng.choice(sorted(_BAD_ATTRS))
        keep = [a for a in node.attribute if a.name != name]
        del node.attribute[:]
        value = rng.choice(_BAD_ATTRS[name])
        attr = helper.make_attribute(name, value) if value != [] else \
            onnx.AttributeProto(name=name, type=onnx.AttributeProto.INTS)
        node.attribute.extend(keep + [attr])
    return m


def names(rng):
    """Duplicate, dangling, empty and clashing value names."""
    m = base_model(rng)
    nodes, g = list(m.graph.node), m.graph
    how = rng.randrange(7)
    if how == 0 and len(nodes) > 1:                  # two nodes write one value
        nodes[0].output[0] = nodes[-1].output[0]
    elif how == 1:
        node = rng.choice(nodes)
        node.input[rng.randrange(len(node.input))] = rng.choice(["ghost", "", " ", "y"])
    elif how == 2:                                   # a node writes a graph input
        rng.choice(nodes).output[0] = g.input[0].name if g.input else "x"
    elif how == 3:
        g.input.append(g.input[0] if g.input else _vi("x", [1]))
    elif how == 4 and g.initializer:                 # an initializer twice, with other dims
        dup = onnx.TensorProto()
        dup.CopyFrom(g.initializer[0])
        dup.dims[0] += 1
        g.initializer.append(dup)
    elif how == 5:
        g.output.append(g.output[0])
    else:
        g.output[0].name = rng.choice(["nothing", "", g.input[0].name if g.input else "x"])
    return m


def cycles(rng):
    """A node reading its own output, a back edge or a two-node cycle (nodes sometimes reversed)."""
    m = base_model(rng)
    nodes = list(m.graph.node)
    how = rng.randrange(3)
    if how == 0 or len(nodes) < 2:                   # a node reads its own output
        node = rng.choice(nodes)
        node.input[0] = node.output[0]
    elif how == 1:                                   # a back edge: the first node reads the last's output
        nodes[0].input[0] = nodes[-1].output[0]
    else:                                            # a two-node cycle
        a, b = nodes[0], nodes[1]
        b.input[0], a.input[0] = a.output[0], b.output[0]
    if rng.random() < 0.5:
        m.graph.node.reverse()
    return m


def opset(rng):
    """Opset versions out of range, no opset import, a bad IR version, or a node in an unknown domain."""
    m = base_model(rng)
    how = rng.randrange(5)
    if how == 0:
        m.opset_import[0].version = rng.choice([0, 1, 5, 999, 100000, -1])
    elif how == 1:
        del m.opset_import[:]
    elif how == 2:
        m.ir_version = rng.choice([0, 1, 3, 999, -5])
    elif how == 3:
        rng.choice(list(m.graph.node)).domain = rng.choice(["com.fuzz", "ai.onnx.ml", "com.microsoft", "ai.onnx"])
    else:
        m.opset_import.append(helper.make_opsetid(rng.choice(["com.fuzz", "ai.onnx.ml", ""]), rng.choice([1, 99])))
        rng.choice(list(m.graph.node)).domain = m.opset_import[-1].domain
    return m


def nan_inf(rng):
    """NaN, Inf or 3.4e38 weights, or a Clip with NaN or Inf bounds on the output."""
    m = base_model(rng)
    value = rng.choice([np.nan, np.inf, -np.inf, 3.4e38])
    floats = [t for t in m.graph.initializer if t.data_type == F]
    if floats and rng.random() < 0.8:
        init = rng.choice(floats)
        arr = numpy_helper.to_array(init).copy()
        flat = arr.reshape(-1)
        flat[[rng.randrange(flat.size) for _ in range(rng.choice([1, flat.size]))]] = value
        init.CopyFrom(numpy_helper.from_array(arr, init.name))
    else:                                            # a Clip with NaN or Inf bounds on the output
        out = m.graph.output[0].name
        m.graph.node[-1].output[0] = "pre"
        bounds = [("lo", np.array(value, np.float32)), ("hi", np.array(rng.choice([np.nan, 1.0]), np.float32))]
        m.graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in bounds)
        m.graph.node.append(helper.make_node("Clip", ["pre", "lo", "hi"], [out]))
    return m


def empty(rng):
    """No nodes, no outputs, nothing at all, the input as the output, or no graph."""
    m = base_model(rng)
    g = m.graph
    how = rng.randrange(5)
    if how == 4:
        m.ClearField("graph")
        m.graph.name = "empty"
        return m
    cut = [[g.node], [g.output], [g.node, g.output, g.initializer, g.input], [g.node, g.output]][how]
    for field in cut:                                # 0: outputs produced by nothing
        del field[:]
    if how == 3:                                     # no nodes, the output is the input
        g.output.append(g.input[0])
    return m


_OPS = sorted({s.name for s in onnx.defs.get_all_schemas() if s.domain == "" and not s.deprecated})


def op_swap(rng):
    """A node's op replaced by a random ONNX op (wrong input counts, types, attributes)."""
    m = base_model(rng)
    node = rng.choice(list(m.graph.node))
    node.op_type = rng.choice(_OPS)
    if rng.random() < 0.5:
        del node.attribute[:]
    return m


def rewire(rng):
    """Node inputs re-pointed at other values of the graph (shape and type mismatches)."""
    m = base_model(rng)
    g = m.graph
    values = [i.name for i in g.input] + [t.name for t in g.initializer] + [o for n in g.node for o in n.output]
    for _ in range(rng.choice([1, 1, 2, 3])):
        idx = rng.randrange(len(g.node))
        node = g.node[idx]
        earlier = [i.name for i in g.input] + [t.name for t in g.initializer] + \
            [o for n in list(g.node)[:idx] for o in n.output]
        slot = rng.randrange(len(node.input) + 1)
        pick = rng.choice(earlier if rng.random() < 0.8 else values)
        if slot == len(node.input):
            node.input.append(pick)                  # one input too many
        else:
            node.input[slot] = pick
    return m


MODEL_FAMILIES = {
    "truncate": truncate, "bitflip": bitflip, "elem-type": elem_type, "rank-dim": rank_dim,
    "dims": dims, "huge": huge, "zero-size": zero_size, "missing-init": missing_init,
    "attributes": attributes, "names": names, "cycles": cycles, "opset": opset,
    "nan-inf": nan_inf, "empty": empty, "op-swap": op_swap, "rewire": rewire}


def model_case(family: str, seed: int) -> bytes:
    """The bytes of the model file of case `seed` of `family` (deterministic)."""
    out = MODEL_FAMILIES[family](random.Random(f"{family}:{seed}"))
    return out if isinstance(out, bytes) else out.SerializeToString()
