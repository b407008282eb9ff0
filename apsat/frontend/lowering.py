"""ONNX op -> access-pattern language: `LOWERINGS[op_type](ctx) -> [term per output]`.

A lowering reads one node through `NodeCtx` (its inputs as terms, their dims, constant
inputs as numpy arrays, attributes) and returns one term per ONNX output, None for an
output it does not produce. It raises `Unlowerable` when this node or attribute combination
has no lowering (the importer emits an opaque call, or folds a node whose inputs are all
constants), `NodeProblem`/`BadAttribute` when the node itself is malformed (the importer
turns them into a ModelError naming the node). Layout ops live in lowering_tensor.py,
convolutions, pools and matrix products in lowering_nn.py, one family a module beside it
(lowering_reduce, lowering_norm, lowering_convtranspose, lowering_resize), element-wise
ops here.
"""
from __future__ import annotations

import numpy as np
import onnx

from apsat.frontend import lowering_convtranspose as convt
from apsat.frontend import lowering_gather as gather
from apsat.frontend.lowering_einsum import lower_einsum
from apsat.frontend.lowering_scatter import lower_scatter_elements, lower_scatter_nd
from apsat.frontend.lowering_topk import lower_topk
from apsat.frontend import lowering_nn as nn
from apsat.frontend import lowering_norm as norm
from apsat.frontend import lowering_reduce as red
from apsat.frontend import lowering_resize as resize
from apsat.frontend import lowering_tensor as tensor
from apsat.frontend.builder import Builder
from apsat.frontend.lowering_tensor import Unlowerable

FLOAT_MAX = 3.4028234663852886e38     # Clip's default bounds: float32's range


class NodeProblem(Exception):
    """The node is malformed (dims that do not fit, an out-of-range constant input)."""


class BadAttribute(NodeProblem):
    """A malformed attribute: `attr` names it."""

    def __init__(self, attr: str, msg: str):
        super().__init__(msg)
        self.attr = attr


class NodeCtx:
    """What a lowering sees of one ONNX node. `state` is the importer, which knows every
    value: `.value(name)` (a Term or a folded constant with `.value`), `.term(name)`
    (the value as a term, constants materialised as weights or literals),
    `.add_weight(name, array)` and `.is_used(name)`."""

    def __init__(self, node, index: int, opset: int, builder: Builder, state):
        self.node, self.index, self.opset, self.b = node, index, opset, builder
        self.op = node.op_type
        self.n_inputs = len(node.input)
        self._state = state
        self._attrs = {a.name: a for a in node.attribute}

    # ---- inputs ------------------------------------------------------------------------

    def has(self, i: int) -> bool:
        """Whether optional input i is given."""
        return i < len(self.node.input) and self.node.input[i] != ""

    def _name(self, i: int) -> str:
        if not self.has(i):
            raise NodeProblem(f"input {i} is missing")
        return self.node.input[i]

    def term(self, i: int):
        return self._state.term(self._name(i))

    def dims(self, i: int) -> tuple[int, ...]:
        v = self._state.value(self._name(i))
        return tuple(v.value.shape) if hasattr(v, "value") else self.b.dims(v)

    def elem_type(self, i: int) -> int:
        """Input i's ONNX element type (0 when unknown)."""
        return self._state.info.get(self._name(i), (0, None))[0]

    def const(self, i: int):
        """Input i's value when it is a constant (folded at import), else None."""
        if not self.has(i):
            return None
        v = self._state.value(self.node.input[i])
        return np.asarray(v.value) if hasattr(v, "value") else None

    def static(self, i: int) -> np.ndarray:
        """Input i's constant value; Unlowerable when it is only known at run time."""
        v = self.const(i)
        if v is None:
            raise Unlowerable(f"{self.op} input {i} is not a constant")
        return v

    # ---- attributes and outputs --------------------------------------------------------

    def attr(self, name: str, default=None):
        a = self._attrs.get(name)
        if a is None:
            return default
        v = onnx.helper.get_attribute_value(a)
        return v.decode() if isinstance(v, bytes) else v

    def ints(self, name: str, default=None):
        v = self.attr(name, None)
        if v is None:
            return default
        if not isinstance(v, (list, tuple)) or not all(isinstance(x, int) for x in v):
            self.bad_attr(name, f"needs a list of ints, got {v!r}")
        return [int(x) for x in v]

    def bad_attr(self, attr: str, msg: str):
        raise BadAttribute(attr, msg)

    def fail(self, msg: str):
        raise NodeProblem(msg)

    def output_used(self, k: int) -> bool:
        return k < len(self.node.output) and self._state.is_used(self.node.output[k])

    def add_weight(self, suffix: str, array: np.ndarray):
        """A constant this lowering needs (e.g. AveragePool's counts) as a named weight."""
        return self._state.add_weight(f"{self.node.output[0]}__{suffix}", array)

    def follows_symbol(self, n: int) -> bool:
        """Whether a size stands for a symbolic dim (apsat.frontend.symbol_folding): what
        the lowering builds of that size must then be computed, not a constant."""
        return n in self._state.symbolic.sizes

    def add_range(self, suffix: str, n: int):
        """0, 1, ..., n-1 as a weight made afresh at every size (a generated Range)."""
        t = self.add_weight(suffix, np.arange(n, dtype=np.float32))
        self._state.symbolic.generated[t.args[0]] = (0.0, 1.0)
        return t


# ---- elementwise ----------------------------------------------------------------------------

def _binary(op):
    def lower(ctx):
        """numpy-broadcast both operands, `access-pair`, `compute op`."""
        return [ctx.b.elementwise(op, [ctx.term(0), ctx.term(1)])]
    return lower


def lower_sum(ctx):
    """n-ary Sum as a left-to-right chain of pairs (ONNX's summation order)."""
    return [ctx.b.elementwise("elementwise-add", [ctx.term(i) for i in range(ctx.n_inputs)])]


def lower_mean(ctx):
    total = lower_sum(ctx)[0]
    return [ctx.b.elementwise("elementwise-div", [total, ctx.b.literal(ctx.n_inputs)])]


def lower_where(ctx):
    """Each operand broadcast to the output and given a leading item axis, the three
    concatenated into item (3,), `compute select` (the condition is carried as float)."""
    b = ctx.b
    terms = [ctx.term(i) for i in range(3)]
    out = tuple(np.broadcast_shapes(*(b.dims(t) for t in terms)))
    # insert-axis at the split lands in the iterated dims; re-access makes it the item
    parts = [b.at(b.insert_axis(b.expand(t, out), len(out)), len(out)) for t in terms]
    acc = parts[0]
    for p in parts[1:]:
        acc = b.make("access-concatenate", acc, p, len(out))
    return [b.compute("select", acc)]


def _unary(op):
    def lower(ctx):
        """`compute op` keeps every dim (it applies per element)."""
        return [ctx.b.compute(op, ctx.term(0))]
    return lower


def lower_clip(ctx):
    """Bounds from attributes (opset < 11) or constant inputs; missing ones are float32's
    range. Non-constant bounds are Unlowerable."""
    if ctx.opset < 11:
        lo, hi = ctx.attr("min", -FLOAT_MAX), ctx.attr("max", FLOAT_MAX)
    else:
        lo = float(ctx.static(1).reshape(-1)[0]) if ctx.has(1) else -FLOAT_MAX
        hi = float(ctx.static(2).reshape(-1)[0]) if ctx.has(2) else FLOAT_MAX
    lo, hi = max(float(lo), -FLOAT_MAX), min(float(hi), FLOAT_MAX)   # literals must be finite
    return [ctx.b.compute("clip", ctx.term(0), lo, hi)]


def lower_leaky_relu(ctx):
    """`compute (leaky-relu alpha)`; alpha defaults to 0.01, as ONNX's."""
    return [ctx.b.compute("leaky-relu", ctx.term(0), float(ctx.attr("alpha", 0.01)))]


def _variadic(op):
    def lower(ctx):
        """Every input numpy-broadcast, a left-to-right chain of pairs (ONNX's order)."""
        return [ctx.b.elementwise(op, [ctx.term(i) for i in range(ctx.n_inputs)])]
    return lower


def _with_attrs(op, **defaults):
    def lower(ctx):
        """`compute (op attrs...)` with the float attributes in order, ONNX's defaults for
        the missing ones."""
        return [ctx.b.compute(op, ctx.term(0), *(float(ctx.attr(k, d)) for k, d in defaults.items()))]
    return lower


def lower_prelu(ctx):
    """The slope broadcast to X (unidirectional: X's dims are the output's), `compute prelu`.
    Before opset 7 a (C,) slope was per channel, not numpy-broadcast: Unlowerable."""
    if ctx.opset < 7:
        raise Unlowerable("PRelu before opset 7 broadcasts its slope per channel")
    if np.broadcast_shapes(ctx.dims(0), ctx.dims(1)) != ctx.dims(0):
        ctx.fail(f"slope dims {ctx.dims(1)} do not broadcast to X's {ctx.dims(0)}")
    return [ctx.b.elementwise("prelu", [ctx.term(0), ctx.term(1)])]


def lower_mod(ctx):
    """fmod=0 (ONNX's default): the divisor's sign, `elementwise-mod`; fmod=1: C's fmod,
    the dividend's sign, `elementwise-fmod`."""
    fmod = ctx.attr("fmod", 0)
    if fmod not in (0, 1):
        ctx.bad_attr("fmod", f"must be 0 or 1, got {fmod!r}")
    op = "elementwise-fmod" if fmod else "elementwise-mod"
    return [ctx.b.elementwise(op, [ctx.term(0), ctx.term(1)])]


def lower_gelu(ctx):
    """ONNX Gelu (opset 20): approximate="none" is the erf form `gelu`, "tanh" `gelu-tanh`."""
    approximate = ctx.attr("approximate", "none")
    if approximate not in ("none", "tanh"):
        ctx.bad_attr("approximate", f"must be 'none' or 'tanh', got {approximate!r}")
    return [ctx.b.compute("gelu" if approximate == "none" else "gelu-tanh", ctx.term(0))]


def lower_constant(ctx):
    """Constant nodes are folded at import; as data the value is a literal (one element)
    or a weight named after the output (see importer.Importer.term)."""
    return [ctx._state.term(ctx.node.output[0])]


LOWERINGS: dict = {
    # elementwise
    "Add": _binary("elementwise-add"),
    "Sub": _binary("elementwise-sub"),
    "Mul": _binary("elementwise-mul"),
    "Div": _binary("elementwise-div"),
    "Pow": _binary("elementwise-pow"),
    "Sum": lower_sum,
    "Mean": lower_mean,
    "Where": lower_where,
    "Relu": _unary("relu"),
    "Neg": _unary("negative"),
    "Sqrt": _unary("sqrt"),
    "Exp": _unary("exp"),
    "Erf": _unary("erf"),
    "Tanh": _unary("tanh"),
    "Sigmoid": _unary("sigmoid"),
    "Clip": lower_clip,
    "LeakyRelu": lower_leaky_relu,
    "HardSigmoid": _with_attrs("hard-sigmoid", alpha=0.2, beta=0.5),
    "HardSwish": _unary("hard-swish"),
    "Elu": _with_attrs("elu", alpha=1.0),
    "Selu": _with_attrs("selu", alpha=1.67326319217681884765625, gamma=1.05070102214813232421875),
    "Softplus": _unary("softplus"),
    "Softsign": _unary("softsign"),
    "Mish": _unary("mish"),
    "Gelu": lower_gelu,
    "PRelu": lower_prelu,
    "Abs": _unary("abs"),
    "Log": _unary("log"),
    "Reciprocal": _unary("reciprocal"),
    "Floor": _unary("floor"),
    "Ceil": _unary("ceil"),
    "Cos": _unary("cos"),
    "Sin": _unary("sin"),
    "Sign": _unary("sign"),
    "Max": _variadic("elementwise-max"),
    "Min": _variadic("elementwise-min"),
    "Mod": lower_mod,
    "Equal": _binary("equal"),
    "Less": _binary("less"),
    "LessOrEqual": _binary("less-equal"),
    "Greater": _binary("greater"),
    "GreaterOrEqual": _binary("greater-equal"),
    "Not": _unary("logical-not"),
    "IsNaN": _unary("is-nan"),
    "And": _binary("logical-and"),
    "Or": _binary("logical-or"),
    "Xor": _binary("logical-xor"),
    "Constant": lower_constant,
    # layout
    "Identity": tensor.lower_identity,
    "Dropout": tensor.lower_identity,
    "Cast": tensor.lower_cast,
    "Transpose": tensor.lower_transpose,
    "Reshape": tensor.lower_reshape,
    "Flatten": tensor.lower_flatten,
    "Squeeze": tensor.lower_squeeze,
    "Unsqueeze": tensor.lower_unsqueeze,
    "Concat": tensor.lower_concat,
    "Slice": tensor.lower_slice,
    "Split": tensor.lower_split,
    "Gather": gather.lower_gather,
    "GatherElements": gather.lower_gather_elements,
    "GatherND": gather.lower_gather_nd,
    "CumSum": gather.lower_cumsum,
    "Einsum": lower_einsum,
    "TopK": lower_topk,
    "ScatterND": lower_scatter_nd,
    "ScatterElements": lower_scatter_elements,
    "Tile": tensor.lower_tile,
    "Expand": tensor.lower_expand,
    "Pad": tensor.lower_pad,
    # neural-network ops
    "Conv": nn.lower_conv,
    "MaxPool": nn.lower_maxpool,
    "AveragePool": nn.lower_averagepool,
    "GlobalAveragePool": nn.lower_globalaveragepool,
    "GlobalMaxPool": nn.lower_globalmaxpool,
    "BatchNormalization": nn.lower_batchnorm,
    "LRN": nn.lower_lrn,
    "LayerNormalization": nn.lower_layernorm,
    "Softmax": nn.lower_softmax,
    "Gemm": nn.lower_gemm,
    "MatMul": nn.lower_matmul,
    "ConvTranspose": convt.lower_convtranspose,
    "InstanceNormalization": norm.lower_instancenorm,
    "GroupNormalization": norm.lower_groupnorm,
    "ReduceMean": red.lower_reducemean,
    "ReduceMax": red.lower_reducemax,
    "ReduceSum": red.lower_reducesum,
    "ReduceMin": red.lower_reducemin,
    "ReduceL1": red.lower_reducel1,
    "ReduceL2": red.lower_reducel2,
    "ReduceSumSquare": red.lower_reducesumsquare,
    "ReduceLogSum": red.lower_reducelogsum,
    "ReduceLogSumExp": red.lower_reducelogsumexp,
    "ReduceProd": red.lower_reduceprod,
    "ArgMax": red.lower_argmax,
    "ArgMin": red.lower_argmax,
    "Resize": resize.lower_resize,
    "Upsample": resize.lower_resize,
}
