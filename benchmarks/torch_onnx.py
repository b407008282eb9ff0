"""An ONNX model as a PyTorch eager module: the "PyTorch eager" and torch.compile baseline of
the GPU benchmarks, computing exactly the function the ONNX file computes.

`to_torch` plans the graph once, with static shapes. A node whose inputs are all constants
(initializers, Constant nodes, Shape of a static tensor, ...) is folded then, so shape
arithmetic never reaches `forward`; each other node becomes a step, a closure over torch /
torch.nn.functional whose attributes and shape-like inputs are already Python values, built
by the op's builder `(node) -> step` in OPS. `forward` runs the steps in order with no
Python branching on data, so torch.compile traces it as one graph.
"""
from __future__ import annotations

import functools
import math

import onnx
import torch
import torch.nn.functional as F
from onnx import helper, numpy_helper

# ONNX element types; FLOAT (1) is the module's dtype: a float16 module stays so through Casts
_TYPES = {1: None, 2: torch.uint8, 3: torch.int8, 5: torch.int16, 6: torch.int32,
          7: torch.int64, 9: torch.bool, 10: torch.float16, 11: torch.float64, 16: torch.bfloat16}


class _Node:
    """What a builder sees of one node: its attributes and the static facts about its
    inputs (every input as a tensor: the constant's value, or a meta tensor)."""

    def __init__(self, proto, opset, fdt, consts, metas):
        self.proto, self.op, self.opset, self.fdt = proto, proto.op_type, opset, fdt
        self.name, self.outputs = proto.name or proto.output[0], list(proto.output)
        self.attrs = {a.name: _attr(a) for a in proto.attribute}
        self.extras = []            # constants a builder adds as further inputs of its step
        self._consts, self._metas = consts, metas

    def attr(self, name, default=None):
        return self.attrs.get(name, default)

    def has(self, i):
        return i < len(self.proto.input) and self.proto.input[i] != ""

    def is_const(self, i):
        return self.has(i) and self.proto.input[i] in self._consts

    def input(self, i):
        name = self.proto.input[i]
        return self._consts[name] if name in self._consts else self._metas[name]

    def shape(self, i):
        return tuple(self.input(i).shape)

    def value(self, i):             # a shape-like input must be a constant: shapes are static
        if not self.is_const(i):
            raise _unsupported(self.proto, f"a non-constant input {i} of op")
        return self._consts[self.proto.input[i]]

    def ints(self, i, attr=None):   # opsets moved axes, pads ... from attributes to inputs
        if attr is not None and not self.has(i):
            return self.attr(attr)
        return [int(v) for v in self.value(i).reshape(-1).tolist()]


def _attr(a):
    v = helper.get_attribute_value(a)
    return v.decode() if isinstance(v, bytes) else list(v) if isinstance(v, (list, tuple)) else v


def _unsupported(node, what="op"):
    return NotImplementedError(f"torch_onnx: {what} {node.op_type} ({node.name or node.output[0]}) is not supported")


def _torch_pads(lo, hi):       # F.pad's order: the last dimension first, (begin, end) for each
    return [p for b, e in zip(reversed(lo), reversed(hi)) for p in (b, e)]


def _refuse(n, refused, what):     # the unsupported-op error for `what` of node n, if refused
    if refused:
        raise _unsupported(n.proto, f"{what} of op")


def _constant(n):
    key = next((k for k in ("value", "value_float", "value_floats", "value_int", "value_ints") if k in n.attrs), None)
    _refuse(n, key is None, "a sparse or string value")
    if key == "value":
        return torch.from_numpy(numpy_helper.to_array(n.attrs[key]).copy())
    return torch.tensor(n.attrs[key], dtype=torch.float32 if "float" in key else torch.int64)


_PLAIN = {"Abs": torch.abs, "Cos": torch.cos, "Erf": torch.erf, "IsNaN": torch.isnan,
          "Log": torch.log, "Neg": torch.neg, "Not": torch.logical_not, "Relu": F.relu,
          "Sigmoid": torch.sigmoid, "Sin": torch.sin, "Sqrt": torch.sqrt, "Tanh": torch.tanh,
          "HardSwish": F.hardswish,       # x * clamp(x/6 + 1/2, 0, 1), as ONNX defines it
          "Add": torch.add, "Sub": torch.sub, "Mul": torch.mul, "MatMul": torch.matmul,
          "And": torch.logical_and, "Equal": torch.eq, "Less": torch.lt, "LessOrEqual": torch.le,
          "GreaterOrEqual": torch.ge, "Where": torch.where,
          "Sum": lambda *xs: functools.reduce(torch.add, xs),
          "Min": lambda *xs: functools.reduce(torch.minimum, xs),
          # inference: Dropout passes its input through (reading its mask is refused)
          "Identity": lambda x: x, "Dropout": lambda x, *_: x}

# Op type -> builder. The one-liners bind their static facts as keyword-only defaults.
OPS = {name: (lambda n, fn=fn: fn) for name, fn in _PLAIN.items()}
OPS.update({
    "Constant": _constant,
    # a one-element `value` tensor, float32 zero when absent
    "ConstantOfShape": lambda n: (torch.from_numpy(numpy_helper.to_array(n.attr("value")).copy())
                                  if "value" in n.attrs else torch.tensor(0.0)).reshape(()).expand(n.ints(0)).clone(),
    # static shapes: Shape is a constant whatever its input (start/end from opset 15)
    "Shape": lambda n: torch.tensor(n.shape(0)[n.attr("start", 0):n.attr("end")], dtype=torch.int64),
    "Range": lambda n: torch.arange(*(n.value(i).item() for i in range(3)), dtype=n.input(0).dtype),
    # integer Div truncates towards zero, as onnxruntime's does
    "Div": lambda n: torch.div if n.input(0).dtype.is_floating_point
                     else functools.partial(torch.div, rounding_mode="trunc"),
    # fmod=0: the result takes the divisor's sign (Python's %), fmod=1 the dividend's
    "Mod": lambda n: torch.fmod if n.attr("fmod", 0) else torch.remainder,
    # the result has the base's type, whatever the exponent's
    "Pow": lambda n: lambda x, y, *, t=n.input(0).dtype: torch.pow(x, y).to(t),
    "Cast": lambda n: lambda x, *, t=_TYPES[n.attr("to")] or n.fdt: x.to(t),
    # bounds are inputs from opset 11, attributes before; an absent one is no bound
    "Clip": lambda n: lambda x, *_, lo=n.value(1).item() if n.has(1) else n.attr("min"),
                             hi=n.value(2).item() if n.has(2) else n.attr("max"): torch.clamp(x, lo, hi),
    # alpha 1/6, beta 1/2 is F.hardsigmoid: one kernel in eager mode
    "HardSigmoid": lambda n: F.hardsigmoid if abs(n.attr("alpha", 0.2) - 1 / 6) < 1e-7 and n.attr("beta", 0.5) == 0.5
                   else lambda x, *, a=n.attr("alpha", 0.2), b=n.attr("beta", 0.5): torch.clamp(x * a + b, 0.0, 1.0),
    "Transpose": lambda n: lambda x, *, p=n.attr("perm") or list(range(len(n.shape(0))))[::-1]: x.permute(p),
    # bidirectional broadcast: the output may be larger than the shape input asks
    "Expand": lambda n: lambda x, _, *, s=torch.broadcast_shapes(n.shape(0), tuple(n.ints(1))): x.expand(s),
    "Concat": lambda n: lambda *xs, a=n.attr("axis"): torch.cat(xs, a),
    "GlobalAveragePool": lambda n: lambda x, *, a=list(range(2, len(n.shape(0)))): x.mean(a, keepdim=True),
    "BatchNormalization": lambda n: _refuse(n, n.attr("training_mode", 0), "training mode") or (
        lambda x, s, b, m, v, *, eps=n.attr("epsilon", 1e-5): F.batch_norm(x, m, v, s, b, False, 0.0, eps)),
    # both divide by (bias + alpha / size * the window's sum of squares) ** beta; torch
    # centres an even window one place off ONNX's
    "LRN": lambda n: _refuse(n, n.attr("size") % 2 == 0, "even size") or functools.partial(F.local_response_norm,
        size=n.attr("size"), alpha=n.attr("alpha", 1e-4), beta=n.attr("beta", 0.75), k=n.attr("bias", 1.0)),
    # the last index dimension addresses the leading data dimensions
    "ScatterND": lambda n: _refuse(n, n.attr("reduction", "none") != "none", "reduction") or (
        lambda x, i, u: x.index_put(tuple(i.unbind(-1)), u)),
})


def _reshape(n):
    """The four as one reshape to their static output shape."""
    dims = list(n.shape(0))
    if n.op == "Reshape":             # allowzero=0: a 0 copies the input's dimension
        shape = [dims[i] if d == 0 and not n.attr("allowzero", 0) else d for i, d in enumerate(n.ints(1))]
    elif n.op == "Flatten":
        axis = n.attr("axis", 1) + (len(dims) if n.attr("axis", 1) < 0 else 0)     # in [-r, r]
        shape = [math.prod(dims[:axis]), math.prod(dims[axis:])]
    elif n.op == "Squeeze":           # no axes: every dimension of size 1
        axes = n.ints(1, "axes")
        axes = {a % len(dims) for a in axes} if axes is not None else {i for i, d in enumerate(dims) if d == 1}
        shape = [d for i, d in enumerate(dims) if i not in axes]
    else:                             # Unsqueeze's axes index its output
        axes, shape = n.ints(1, "axes"), dims
        for a in sorted(a % (len(dims) + len(axes)) for a in axes):
            shape.insert(a, 1)
    return lambda x, *_: x.reshape(shape)


def _split(n):
    axis = n.attr("axis", 0)
    size, sizes = n.shape(0)[axis], n.ints(1, "split")
    if sizes is None:     # equal parts; with num_outputs (opset 18) the last may be shorter
        part = -(-size // n.attr("num_outputs", len(n.outputs)))
        sizes = [part] * (size // part) + ([size % part] if size % part else [])
    return lambda x, *_: torch.split(x, sizes, axis)


def _slice(n):
    dims = n.shape(0)
    starts, ends = n.ints(1, "starts"), n.ints(2, "ends")
    axes = n.ints(3, "axes") or list(range(len(starts)))
    steps = n.ints(4) if n.has(4) else [1] * len(starts)
    index, flips = [slice(None)] * len(dims), []
    for start, end, axis, step in zip(starts, ends, axes, steps):
        axis, d = axis % len(dims), dims[axis]
        start, end = start + d if start < 0 else start, end + d if end < 0 else end
        if step > 0:      # clamped to [0, d]: an oversized end (INT64_MAX) means "to the end"
            index[axis] = slice(min(max(start, 0), d), min(max(end, 0), d), step)
        else:             # clamped to [0, d-1] and [-1, d-1]; torch has no negative step: flip
            flips.append(axis)
            index[axis] = slice(d - 1 - min(max(start, 0), d - 1), d - 1 - min(max(end, -1), d - 1), -step)
    index = tuple(index)
    return lambda x, *_: (x.flip(flips) if flips else x)[index]


def _pad(n):
    mode, rank = n.attr("mode", "constant"), len(n.shape(0))
    _refuse(n, mode != "constant", f"mode {mode}")
    pads = n.ints(1, "pads")
    axes = [a % rank for a in n.ints(3)] if n.has(3) else list(range(rank))    # opset 18
    lo, hi = [0] * rank, [0] * rank
    for k, a in enumerate(axes):
        lo[a], hi[a] = pads[k], pads[k + len(axes)]
    value = n.value(2).item() if n.has(2) else n.attr("value", 0.0)
    pad = _torch_pads(lo, hi)         # a negative pad crops, in F.pad as in ONNX
    return lambda x, *_: F.pad(x, pad, value=value)


def _gather(n):
    dims = n.shape(0)
    axis = n.attr("axis", 0) % len(dims)
    size = dims[axis]
    if n.op == "GatherElements":      # negative indices count from the end: i % size, one kernel
        return lambda x, i: torch.gather(x, axis, i % size)
    if n.is_const(1) and not n.shape(1):
        index = int(n.value(1).item()) % size        # a constant scalar index: a select
        return lambda x, _: x.select(axis, index)
    shape = dims[:axis] + n.shape(1) + dims[axis + 1:]
    return lambda x, i: x.index_select(axis, (i % size).reshape(-1)).reshape(shape)


def _reduce_mean(n):
    # axes: an input from opset 18, an attribute before; none: all, or none with noop_with_empty_axes
    axes = n.ints(1, "axes") or ([] if n.attr("noop_with_empty_axes", 0) else list(range(len(n.shape(0)))))
    keep = bool(n.attr("keepdims", 1))
    return lambda x, *_: x.mean(axes, keep) if axes else x


def _softmax(n):
    if n.opset >= 13:
        return functools.partial(F.softmax, dim=n.attr("axis", -1))
    # before opset 13: over the input coerced to 2-D at axis (default 1), i.e. dims[axis:]
    dims, axis = n.shape(0), n.attr("axis", 1) % len(n.shape(0))
    flat = (math.prod(dims[:axis]), math.prod(dims[axis:]))
    return lambda x: F.softmax(x.reshape(flat), 1).reshape(dims)


def _layer_norm(n):
    dims = n.shape(0)
    norm, eps = dims[n.attr("axis", -1) % len(dims):], n.attr("epsilon", 1e-5)
    if n.shape(1) == norm and (not n.has(2) or n.shape(2) == norm):
        return lambda x, w, b=None: F.layer_norm(x, norm, w, b, eps)
    # a scale or bias only broadcastable to the normalised shape
    return lambda x, w, b=None: F.layer_norm(x, norm, None, None, eps) * w + (0.0 if b is None else b)


def _gemm(n):
    ta, tb, alpha, beta = n.attr("transA", 0), n.attr("transB", 0), n.attr("alpha", 1.0), n.attr("beta", 1.0)
    if (ta, tb, alpha, beta) == (0, 1, 1.0, 1.0) and (not n.has(2) or n.shape(2) == n.shape(1)[:1]):
        return F.linear               # what an eager model writes: one addmm
    return lambda a, b, c=None: alpha * ((a.t() if ta else a) @ (b.t() if tb else b)) + (0 if c is None else beta * c)


def _window(n, kernel):
    """strides, dilations and (begin, end) pads of a conv or pool, auto_pad resolved
    against the static input shape (SAME_UPPER puts the odd pad at the end)."""
    r = len(kernel)
    strides, dilations = n.attr("strides", [1] * r), n.attr("dilations", [1] * r)
    auto = n.attr("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        lo, hi = [], []
        for size, k, s, d in zip(n.shape(0)[2:], kernel, strides, dilations):
            total = max(0, (-(-size // s) - 1) * s + (k - 1) * d + 1 - size)
            lo.append(total // 2 if auto == "SAME_UPPER" else total - total // 2)
            hi.append(total - lo[-1])
        return strides, dilations, lo, hi
    pads = [0] * (2 * r) if auto == "VALID" else n.attr("pads", [0] * (2 * r))
    return strides, dilations, pads[:r], pads[r:]


def _conv(n):
    kernel = n.attr("kernel_shape", list(n.shape(1)[2:]))
    strides, dilations, lo, hi = _window(n, kernel)
    conv, group = (F.conv1d, F.conv2d, F.conv3d)[len(kernel) - 1], n.attr("group", 1)
    pad = _torch_pads(lo, hi) if lo != hi else None       # torch pads both sides alike: pad first
    return lambda x, w, b=None: conv(F.pad(x, pad) if pad else x, w, b, strides, 0 if pad else lo, dilations, group)


def _pool(n):
    """Both pools. An uneven pad, or one over torch's limit of half the kernel, is padded first;
    count_include_pad=0 then divides each window's sum by its real elements' count, a constant."""
    kernel, ceil = n.attr("kernel_shape"), bool(n.attr("ceil_mode", 0))
    strides, dilations, lo, hi = _window(n, kernel)
    r, average = len(kernel), n.op == "AveragePool"
    _refuse(n, average and any(d != 1 for d in dilations), "dilation")
    pool = getattr(F, f"{'avg' if average else 'max'}_pool{r}d")
    include = bool(n.attr("count_include_pad", 0))
    if lo == hi and all(p <= k // 2 for p, k in zip(lo, kernel)):
        return lambda x: pool(x, kernel, strides, lo, *((ceil, include) if average else (dilations, ceil)))
    _refuse(n, ceil, "ceil_mode with uneven pads")
    pad = _torch_pads(lo, hi)
    if not average:
        return lambda x: pool(F.pad(x, pad, value=-math.inf), kernel, strides, 0, dilations)
    if include:
        return lambda x: pool(F.pad(x, pad), kernel, strides)
    n.extras.append(pool(F.pad(torch.ones((1, 1) + n.shape(0)[2:]), pad), kernel, strides))
    return lambda x, inside: pool(F.pad(x, pad), kernel, strides) / inside


OPS.update(dict.fromkeys(("Reshape", "Flatten", "Squeeze", "Unsqueeze"), _reshape), Split=_split, Slice=_slice,
           Pad=_pad, Gather=_gather, GatherElements=_gather, ReduceMean=_reduce_mean, Softmax=_softmax,
           LayerNormalization=_layer_norm, Gemm=_gemm, Conv=_conv, MaxPool=_pool, AveragePool=_pool)


# ---- planning and the module -------------------------------------------------------------

class OnnxModule(torch.nn.Module):
    """The planned graph. `forward(*inputs)` takes the graph inputs in graph order (torch
    tensors of the planned shapes; float ones in the module's dtype, integer ones in their
    own) and always returns a tuple of the graph outputs in graph order, even for one.
    `steps`: the (op type, node name, fn, input names, output names) that forward runs."""

    def __init__(self, inputs, outputs, steps, consts):
        super().__init__()
        self.input_names, self.output_names, self.steps = list(inputs), list(outputs), steps
        self._consts = [(name, f"c{k}") for k, name in enumerate(consts)]   # ONNX names hold dots
        for (_, attr), tensor in zip(self._consts, consts.values()):
            self.register_buffer(attr, tensor)

    def forward(self, *inputs):
        if len(inputs) != len(self.input_names):
            raise TypeError(f"expected the inputs {self.input_names}, got {len(inputs)} tensors")
        env = dict(zip(self.input_names, inputs))
        env.update((name, getattr(self, attr)) for name, attr in self._consts)
        for _, _, fn, ins, outs in self.steps:
            result = fn(*[env[i] if i else None for i in ins])
            result = result if isinstance(result, (tuple, list)) else (result,)
            env.update((name, value) for name, value in zip(outs, result) if name)
        return tuple(env[name] for name in self.output_names)


def _input_specs(graph, input_shapes, dtype):
    """(name, shape, torch dtype) of each graph input but initializers (old models list them)."""
    inits, specs, given = {i.name for i in graph.initializer}, [], dict(input_shapes or {})
    for value in (v for v in graph.input if v.name not in inits):
        t = value.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else d.dim_param or "?" for d in t.shape.dim]
        if value.name in given:
            dims = [int(d) for d in given.pop(value.name)]
        elif not t.HasField("shape") or not all(isinstance(d, int) for d in dims):
            raise ValueError(f"torch_onnx: input {value.name!r} has a symbolic shape "
                             f"{dims if t.HasField('shape') else '(unknown rank)'}: give it in input_shapes")
        specs.append((value.name, tuple(dims), dtype if t.elem_type in (1, 10, 11, 16) else _TYPES[t.elem_type]))
    if given:
        raise ValueError(f"torch_onnx: input_shapes names no graph input: {sorted(given)}")
    return specs


def _plan(graph, opset, specs, dtype):
    """Fold every node whose inputs are constants (in float32); run the others on meta tensors
    (floats in the module's dtype) for the next nodes' shapes. Returns the steps, constants,
    and {output name: error} for outputs no builder gives (an error if something reads one)."""
    consts = {i.name: torch.from_numpy(numpy_helper.to_array(i).copy()) for i in graph.initializer}
    metas = {name: torch.empty(shape, dtype=t, device="meta") for name, shape, t in specs}
    steps, missing = [], {}
    for node in graph.node:
        if node.domain not in ("", "ai.onnx") or node.op_type not in OPS:
            raise _unsupported(node)
        for i in (i for i in node.input if i in missing):
            raise missing[i]
        fold = all(i == "" or i in consts for i in node.input)
        n = _Node(node, opset, torch.float32 if fold else dtype, consts, metas)
        fn, ins = OPS[node.op_type](n), list(node.input)
        for k, extra in enumerate(n.extras):
            ins.append(f"{n.name}:extra{k}")
            consts[ins[-1]] = extra
        if isinstance(fn, torch.Tensor):
            result, fold = fn, True
        elif fold:
            result = fn(*[consts[i] if i else None for i in ins])
        else:
            result = fn(*[None if not i else metas[i] if i in metas else consts[i].to(
                "meta", dtype if consts[i].is_floating_point() else None) for i in ins])
            steps.append((node.op_type, n.name, fn, ins, list(node.output)))
        result = result if isinstance(result, (tuple, list)) else (result,)
        for k, name in enumerate(node.output):
            if name and k >= len(result):
                missing[name] = _unsupported(node, f"output {k} of op")
            elif name:
                (consts if fold else metas)[name] = result[k]
    return steps, consts, missing


def to_torch(model: onnx.ModelProto, device="cpu", dtype=torch.float32,
             input_shapes: dict | None = None) -> OnnxModule:
    """An OnnxModule computing `model` on `device` (see OnnxModule for forward's contract).
    Shapes are static: `input_shapes` ({input name: shape}) overrides the model's, and an
    input with a symbolic dimension and no given shape is a ValueError naming it. Float
    inputs, initializers and folded float constants are in `dtype` (registered buffers);
    integer and bool ones keep their type. Initializers that are also listed as graph
    inputs are constants, not forward arguments. An op without a builder, or an attribute,
    input or output of one that is not supported, is a NotImplementedError here."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    specs = _input_specs(model.graph, input_shapes, dtype)
    steps, consts, missing = _plan(model.graph, opset, specs, dtype)
    outputs = [o.name for o in model.graph.output]
    needed, live = set(outputs), []
    for step in reversed(steps):      # the steps the outputs need, and the names they read
        if any(o in needed for o in step[4]):
            live.append(step)
            needed.update(i for i in step[3] if i)
    for name in sorted(needed & missing.keys()):     # a graph output no builder gives
        raise missing[name]
    buffers = {name: (t.to(dtype) if t.is_floating_point() else t).to(device).contiguous()
               for name, t in consts.items() if name in needed}
    return OnnxModule([s[0] for s in specs], outputs, live[::-1], buffers)
