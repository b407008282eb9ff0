"""Nodes fused with what reads them, in the forms onnxruntime's CPU kernels take.

The extractor may leave a conv's bias, residual add or activation, a matrix product's
bias or activation, or a pool's divisor as element-wise work of its own (a depthwise conv
whose bias-add it did not fuse, a residual block's add and relu, an average pool written
as a window sum over a count). Each pass folds one such reader into the node before it,
only where that node's output has no other reader, the shapes say the fused node
computes the same values, and the gpu planner computes the two in one kernel (peep.Planned:
the export writes the planner's kernels in ONNX's fused forms and decides no fusion of its
own):

    Conv(x, w[, b]) + c          -> Conv(x, w, b + c)          # c constant per channel
    Conv(x, w, b) + z            -> FusedConv(x, w, b, z)      # z of the conv's shape
    Conv(x, w, b[, z]) -> act    -> FusedConv(.., activation)  # act(conv + b + z)
    MatMul(x, w) + c             -> Gemm(x, w, c)              # x a matrix, c per column
    Gemm(..) -> act              -> FusedGemm(.., activation)
    AveragePool(x) * k / n       -> AveragePool(x, count_include_pad=0)   # n: unpadded count

FusedConv and FusedGemm are onnxruntime's com.microsoft ops.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from apsat.backends.onnx.fuse_seq import SEQUENCE_PASSES
from apsat.backends.onnx.peep import (CONTRIB, Planned, absorb, attrs, const, contrib, followed, initializer, is_const,
                                      name_nodes, other, shapes as static_shapes, sole_reader)

# activations FusedConv applies (its `activation` is the node's op type), with their
# attributes (name, ONNX default) in activation_params order; Clip's bounds are inputs
ACTIVATIONS = {"Relu": (), "Tanh": (), "Sigmoid": (), "LeakyRelu": (("alpha", 0.01),),
               "HardSigmoid": (("alpha", 0.2), ("beta", 0.5)), "Clip": ()}
GEMM_ACTIVATIONS = ("Relu", "Tanh", "Sigmoid", "LeakyRelu")     # FusedGemm's: activation_alpha


def fuse(model: onnx.ModelProto, plan: Planned) -> None:
    """Apply every pass, in place, until none applies; two nodes become one only where
    `plan` puts them in one kernel."""
    shapes = static_shapes(model)   # a fused node has its last reader's shape: computed once
    g = model.graph
    name_nodes(g)
    passes = (_bias, _residual, _activation, _matmul_bias, _gemm_activation, _exclusive_average) + SEQUENCE_PASSES
    while any(p(g, shapes, plan) for p in passes):
        pass


def _open_conv(node) -> bool:
    """A conv whose output is still conv + bias (+ z): no activation applied yet."""
    return (node.op_type, node.domain) in (("Conv", ""), ("FusedConv", CONTRIB)) \
        and attrs(node).get("activation", b"Identity") in (b"Identity", "Identity")


# ---- convs ------------------------------------------------------------------------------

def _bias(g, shapes: dict, plan: Planned) -> bool:
    """Conv(x, w[, b]) + c -> Conv(x, w, b + c), c constant per output channel."""
    for conv, add in followed(g, _open_conv, lambda c, r: r.op_type == "Add" and len(c.input) <= 3, plan):
        c = const(g, other(add, conv.output[0]) or "")
        out = shapes.get(conv.output[0])
        per_channel = None if c is None else _along(c, out, 1)
        if per_channel is None or shapes.get(add.output[0]) != out:
            continue
        if len(conv.input) == 3:
            per_channel = per_channel + const(g, conv.input[2])
        del conv.input[2:]
        conv.input.append(initializer(g, f"{add.output[0]}_bias", per_channel))
        absorb(g, conv, add)
        return True
    return False


def _along(c: np.ndarray, out, axis: int) -> np.ndarray | None:
    """`c` as a 1-D vector along `axis` when it broadcasts over a value of dims `out` and
    varies along that axis only; else None."""
    if out is None or c.ndim > len(out) or c.dtype != np.float32:
        return None
    full = (1,) * (len(out) - c.ndim) + c.shape
    if any(d != 1 for i, d in enumerate(full) if i != axis % len(out)) or full[axis] not in (1, out[axis]):
        return None
    return np.broadcast_to(c.reshape(-1), (out[axis],)).copy()


def _residual(g, shapes: dict, plan: Planned) -> bool:
    """Conv(x, w, b) + z -> FusedConv(x, w, b, z), z computed and of the conv's shape."""
    for conv, add in followed(g, _open_conv, lambda c, r: r.op_type == "Add" and len(c.input) <= 3, plan):
        z = other(add, conv.output[0])
        out = shapes.get(conv.output[0])
        if z is None or is_const(g, z) or out is None or shapes.get(z) != out \
                or shapes.get(add.output[0]) != out:
            continue
        contrib(conv, "FusedConv")
        conv.input.extend([""] * (3 - len(conv.input)) + [z])
        absorb(g, conv, add)
        return True
    return False


def _activation(g, shapes: dict, plan: Planned) -> bool:
    """Conv(..) -> act -> FusedConv(.., activation=act, activation_params)."""
    for conv, act in followed(g, _open_conv, lambda c, r: r.op_type in ACTIVATIONS and r.domain == "", plan):
        params = _activation_params(g, act)
        if params is None:
            continue
        contrib(conv, "FusedConv")
        conv.attribute.extend([helper.make_attribute("activation", act.op_type)])
        if params:
            conv.attribute.append(helper.make_attribute("activation_params", params))
        absorb(g, conv, act)
        return True
    return False


def _activation_params(g, act) -> list | None:
    """FusedConv's activation_params for an activation node, None when they are not
    constants (Clip's bounds are inputs)."""
    if act.op_type != "Clip":
        given = attrs(act)
        return [float(given.get(k, d)) for k, d in ACTIVATIONS[act.op_type]]
    bounds = []
    big = float(np.finfo(np.float32).max)          # an absent bound: no bound
    for k, default in ((1, -big), (2, big)):
        name = act.input[k] if len(act.input) > k else ""
        value = const(g, name) if name else np.float32(default)
        if value is None or value.size != 1:
            return None
        bounds.append(float(value.reshape(-1)[0]))
    return bounds


# ---- matrix products -----------------------------------------------------------------------

def _matmul_bias(g, shapes: dict, plan: Planned) -> bool:
    """MatMul(x, w) + c -> Gemm(x, w, c): x a matrix, w and c constant, c per column."""
    def matrix_product(n):
        return n.op_type == "MatMul" and len(shapes.get(n.input[0], ())) == 2 and is_const(g, n.input[1])
    for mm, add in followed(g, matrix_product, lambda m, r: r.op_type == "Add", plan):
        c = const(g, other(add, mm.output[0]) or "")
        out = shapes.get(mm.output[0])
        column = None if c is None else _along(c, out, 1)
        if column is None or shapes.get(add.output[0]) != out:
            continue
        mm.op_type = "Gemm"
        mm.input.append(initializer(g, f"{add.output[0]}_bias", column))
        absorb(g, mm, add)
        return True
    return False


def _gemm_activation(g, shapes: dict, plan: Planned) -> bool:
    """Gemm(..) -> act -> FusedGemm(.., activation=act, activation_alpha)."""
    for gemm, act in followed(g, lambda n: n.op_type == "Gemm" and n.domain == "",
                               lambda m, r: r.op_type in GEMM_ACTIVATIONS and r.domain == "", plan):
        contrib(gemm, "FusedGemm")
        gemm.attribute.extend([helper.make_attribute("activation", act.op_type)])
        for name, default in ACTIVATIONS[act.op_type]:
            value = float(attrs(act).get(name, default))
            gemm.attribute.append(helper.make_attribute(f"activation_{name}", value))
        absorb(g, gemm, act)
        return True
    return False


# ---- pools ------------------------------------------------------------------------------

def _exclusive_average(g, shapes: dict, plan: Planned) -> bool:
    """AveragePool(x, count_include_pad=1) * k / n -> AveragePool(x, count_include_pad=0),
    k the window's size and n the count of unpadded elements under each window (or k)."""
    def average(n):
        return n.op_type == "AveragePool" and attrs(n).get("count_include_pad") == 1
    for pool, mul in followed(g, average, lambda p, r: r.op_type == "Mul", plan):
        div = sole_reader(g, mul.output[0])
        if div is None or not plan.together(mul, div):
            continue
        given = attrs(pool)
        k = float(np.prod(given["kernel_shape"]))
        scale = const(g, other(mul, pool.output[0]) or "")
        if div is None or div.op_type != "Div" or div.input[0] != mul.output[0] \
                or scale is None or scale.size != 1 or float(scale.reshape(-1)[0]) != k:
            continue
        n = const(g, div.input[1])
        counts = _window_counts(shapes.get(pool.input[0]), given)
        out = shapes.get(div.output[0])
        if n is None or counts is None or out is None or n.ndim > len(out):
            continue
        if np.array_equal(np.broadcast_to(n, out), np.broadcast_to(np.full((1,), k), out)):
            include = 1
        elif np.array_equal(np.broadcast_to(n, out), np.broadcast_to(counts, out)):
            include = 0
        else:
            continue
        kept = [a for a in pool.attribute if a.name != "count_include_pad"]
        del pool.attribute[:]
        pool.attribute.extend(kept + [helper.make_attribute("count_include_pad", include)])
        absorb(g, pool, mul)           # the pool now sits in mul's place, as `mul`
        absorb(g, mul, div)
        return True
    return False


def _window_counts(dims, pool: dict) -> np.ndarray | None:
    """How many unpadded elements each window of a pool (its attributes `pool`) over
    `dims` (N, C, spatial..) covers, as an array over the output's spatial dims (N and C
    size 1)."""
    if dims is None or pool.get("ceil_mode", 0) or any(d != 1 for d in pool.get("dilations", [1])):
        return None
    kernel, spatial = pool["kernel_shape"], dims[2:]
    strides = pool.get("strides", [1] * len(kernel))
    pads = pool.get("pads", [0] * 2 * len(kernel))
    per_axis = []
    for a, (size, k, s) in enumerate(zip(spatial, kernel, strides)):
        lo, hi = pads[a], pads[a + len(kernel)]
        starts = np.arange(0, size + lo + hi - k + 1, s) - lo
        per_axis.append(np.minimum(starts + k, size) - np.maximum(starts, 0))
    counts = per_axis[0]
    for c in per_axis[1:]:
        counts = np.multiply.outer(counts, c)
    return counts.reshape((1, 1) + counts.shape).astype(np.float32)
