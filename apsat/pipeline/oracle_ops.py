"""Float64 stand-ins for the ONNX ops that onnxruntime's CPU provider runs in float32 only.

onnxruntime (1.32) registers no double kernel for Conv, AveragePool, GlobalAveragePool or
LRN, and these ops are where a CNN's float32 rounding comes from, so running them in
float32 inside the float64 copy would hide what verification measures. Each is rewritten
here into ops that do have double kernels and mean the same at every opset from 5 on
(Reshape, Gather, Mul, MatMul, Add, Div, Pow, Shape): a convolution or pooling window
becomes a Gather of every window's elements by a precomputed index table (padding
gathers element 0 and is multiplied by a 0/1 mask) and a MatMul that sums them.

`DECOMPOSE[op](node, shapes, tag)` -> (nodes, initializers) replacing `node`, where
`shapes` maps value names to static dims (shape inference of the original model) and
`tag` is a unique prefix for new names; it raises `CannotDecompose` (with the reason)
where it cannot: an unknown shape, an attribute it does not read.
"""
from __future__ import annotations

import numpy as np
from onnx import helper, numpy_helper


class CannotDecompose(Exception):
    """The node cannot be rewritten into double-kernel ops; the message says why."""


def _attrs(node) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _dims(shapes: dict, name: str, node) -> tuple[int, ...]:
    dims = shapes.get(name)
    if dims is None or any(not isinstance(d, int) or d <= 0 for d in dims):
        raise CannotDecompose(f"{node.op_type} {node.name or node.output[0]!r}: "
                              f"the shape of {name!r} is not known statically")
    return tuple(dims)


def _const(tag: str, suffix: str, value: np.ndarray):
    return numpy_helper.from_array(np.ascontiguousarray(value), f"{tag}/{suffix}")


def _pads(attrs: dict, spatial, kernel, strides, dilations, node) -> tuple[list[int], list[int]]:
    """(begin, end) padding per spatial axis, `auto_pad` resolved as ONNX defines it."""
    rank = len(spatial)
    auto = attrs.get("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    if auto in ("NOTSET", ""):
        pads = list(attrs.get("pads", [0] * 2 * rank))
        return pads[:rank], pads[rank:]
    if auto == "VALID":
        return [0] * rank, [0] * rank
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        raise CannotDecompose(f"{node.op_type}: auto_pad {auto!r}")
    begin, end = [], []
    for s, k, st, d in zip(spatial, kernel, strides, dilations):
        total = max(0, (-(-s // st) - 1) * st + (k - 1) * d + 1 - s)
        small = total // 2
        begin.append(small if auto == "SAME_UPPER" else total - small)
        end.append(total - begin[-1])
    return begin, end


def _windows(spatial, kernel, strides, dilations, begin, end, ceil_mode=False):
    """(flat source index, inside-input mask, inside-padding mask, output dims) of every
    (kernel offset, output position) pair, each table shaped [prod(kernel), prod(out)]."""
    out = []
    for s, k, st, d, b, e in zip(spatial, kernel, strides, dilations, begin, end):
        span = s + b + e - d * (k - 1) - 1
        n = (-(-span // st) if ceil_mode else span // st) + 1
        if ceil_mode and (n - 1) * st >= s + b:     # a last window starting in the end padding
            n -= 1
        out.append(n)
    grids = np.meshgrid(*[np.arange(k) for k in kernel], *[np.arange(n) for n in out], indexing="ij")
    rank = len(spatial)
    pos = [grids[rank + i] * strides[i] + grids[i] * dilations[i] - begin[i] for i in range(rank)]
    inside = np.logical_and.reduce([(p >= 0) & (p < s) for p, s in zip(pos, spatial)])
    padded = np.logical_and.reduce([(p >= -b) & (p < s + e) for p, s, b, e in zip(pos, spatial, begin, end)])
    flat = np.ravel_multi_index(tuple(np.where(inside, p, 0) for p in pos), tuple(spatial))
    shape = (int(np.prod(kernel)), int(np.prod(out)))
    return (flat.reshape(shape).astype(np.int64), inside.reshape(shape), padded.reshape(shape), out)


def _gather_windows(x: str, idx, mask, tag: str, nodes: list, inits: list) -> str:
    """[N, C, *S] -> [N, C, K, L]: every window's elements, padding as zeros."""
    inits += [_const(tag, "flat", np.array([0, 0, -1], np.int64)), _const(tag, "idx", idx)]
    nodes += [helper.make_node("Reshape", [x, f"{tag}/flat"], [f"{tag}/xf"]),
              helper.make_node("Gather", [f"{tag}/xf", f"{tag}/idx"], [f"{tag}/g"], axis=2)]
    if mask.all():
        return f"{tag}/g"
    inits.append(_const(tag, "mask", mask.astype(np.float64)))
    nodes.append(helper.make_node("Mul", [f"{tag}/g", f"{tag}/mask"], [f"{tag}/gm"]))
    return f"{tag}/gm"


def conv(node, shapes: dict, tag: str):
    """Conv as Gather (im2col) and one grouped MatMul, plus the bias."""
    a = _attrs(node)
    x_dims, w_dims = _dims(shapes, node.input[0], node), _dims(shapes, node.input[1], node)
    spatial, kernel = x_dims[2:], w_dims[2:]
    rank, m, cg, group = len(spatial), w_dims[0], w_dims[1], a.get("group", 1)
    strides, dilations = list(a.get("strides", [1] * rank)), list(a.get("dilations", [1] * rank))
    begin, end = _pads(a, spatial, kernel, strides, dilations, node)
    idx, inside, _, out = _windows(spatial, kernel, strides, dilations, begin, end)
    nodes, inits = [], []
    g = _gather_windows(node.input[0], idx, inside, tag, nodes, inits)
    k = cg * idx.shape[0]
    inits += [_const(tag, "gshape", np.array([0, group, k, idx.shape[1]], np.int64)),
              _const(tag, "wshape", np.array([group, m // group, k], np.int64)),
              _const(tag, "yshape", np.array([0, m, *out], np.int64))]
    nodes += [helper.make_node("Reshape", [g, f"{tag}/gshape"], [f"{tag}/cols"]),
              helper.make_node("Reshape", [node.input[1], f"{tag}/wshape"], [f"{tag}/w"]),
              helper.make_node("MatMul", [f"{tag}/w", f"{tag}/cols"], [f"{tag}/y"])]
    has_bias = len(node.input) > 2 and node.input[2]
    nodes.append(helper.make_node("Reshape", [f"{tag}/y", f"{tag}/yshape"],
                                  [f"{tag}/yb" if has_bias else node.output[0]]))
    if has_bias:
        inits.append(_const(tag, "bshape", np.array([m] + [1] * rank, np.int64)))
        nodes += [helper.make_node("Reshape", [node.input[2], f"{tag}/bshape"], [f"{tag}/b"]),
                  helper.make_node("Add", [f"{tag}/yb", f"{tag}/b"], [node.output[0]])]
    return nodes, inits


def average_pool(node, shapes: dict, tag: str):
    """AveragePool as Gather, a Mul by 1/count per window and a MatMul by ones over the
    window (count_include_pad counts the padding, never what ceil_mode adds past it)."""
    a = _attrs(node)
    x_dims = _dims(shapes, node.input[0], node)
    spatial, kernel = x_dims[2:], list(a["kernel_shape"])
    rank = len(spatial)
    strides, dilations = list(a.get("strides", [1] * rank)), list(a.get("dilations", [1] * rank))
    begin, end = _pads(a, spatial, kernel, strides, dilations, node)
    idx, inside, padded, out = _windows(spatial, kernel, strides, dilations, begin, end,
                                        bool(a.get("ceil_mode", 0)))
    counted = padded if a.get("count_include_pad", 0) else inside
    weight = np.where(inside, 1.0 / np.maximum(counted.sum(axis=0, keepdims=True), 1), 0.0)
    nodes, inits = [], []
    g = _gather_windows(node.input[0], idx, np.ones_like(inside), tag, nodes, inits)
    inits += [_const(tag, "weight", weight), _const(tag, "ones", np.ones((1, idx.shape[0]))),
              _const(tag, "yshape", np.array([0, 0, *out], np.int64))]
    nodes += [helper.make_node("Mul", [g, f"{tag}/weight"], [f"{tag}/gw"]),
              helper.make_node("MatMul", [f"{tag}/ones", f"{tag}/gw"], [f"{tag}/y"]),
              helper.make_node("Reshape", [f"{tag}/y", f"{tag}/yshape"], [node.output[0]])]
    return nodes, inits


def global_average_pool(node, shapes: dict, tag: str):
    """GlobalAveragePool as a MatMul by a column of 1/(spatial size)."""
    x_dims = _dims(shapes, node.input[0], node)
    size = int(np.prod(x_dims[2:]))
    inits = [_const(tag, "flat", np.array([0, 0, -1], np.int64)),
             _const(tag, "mean", np.full((size, 1), 1.0 / size)),
             _const(tag, "yshape", np.array([0, 0] + [1] * (len(x_dims) - 2), np.int64))]
    nodes = [helper.make_node("Reshape", [node.input[0], f"{tag}/flat"], [f"{tag}/xf"]),
             helper.make_node("MatMul", [f"{tag}/xf", f"{tag}/mean"], [f"{tag}/y"]),
             helper.make_node("Reshape", [f"{tag}/y", f"{tag}/yshape"], [node.output[0]])]
    return nodes, inits


def lrn(node, shapes: dict, tag: str):
    """LRN: x / (bias + alpha/size * (sum of x^2 over the channel window))^beta, the window
    sum a MatMul by a banded [C, C] matrix."""
    a = _attrs(node)
    x_dims = _dims(shapes, node.input[0], node)
    c, size = x_dims[1], int(a["size"])
    lo, hi = (size - 1) // 2, -(-(size - 1) // 2)
    band = np.array([[1.0 if i - lo <= j <= i + hi else 0.0 for j in range(c)] for i in range(c)])
    inits = [_const(tag, "flat", np.array([0, 0, -1], np.int64)), _const(tag, "band", band),
             _const(tag, "alpha", np.array(a.get("alpha", 1e-4) / size)),
             _const(tag, "bias", np.array(float(a.get("bias", 1.0)))),
             _const(tag, "beta", np.array(float(a.get("beta", 0.75))))]
    x = node.input[0]
    nodes = [helper.make_node("Mul", [x, x], [f"{tag}/sq"]),
             helper.make_node("Reshape", [f"{tag}/sq", f"{tag}/flat"], [f"{tag}/sqf"]),
             helper.make_node("MatMul", [f"{tag}/band", f"{tag}/sqf"], [f"{tag}/sumf"]),
             helper.make_node("Shape", [x], [f"{tag}/xshape"]),
             helper.make_node("Reshape", [f"{tag}/sumf", f"{tag}/xshape"], [f"{tag}/sum"]),
             helper.make_node("Mul", [f"{tag}/sum", f"{tag}/alpha"], [f"{tag}/scaled"]),
             helper.make_node("Add", [f"{tag}/scaled", f"{tag}/bias"], [f"{tag}/base"]),
             helper.make_node("Pow", [f"{tag}/base", f"{tag}/beta"], [f"{tag}/den"]),
             helper.make_node("Div", [x, f"{tag}/den"], [node.output[0]])]
    return nodes, inits


def instance_norm(node, shapes: dict, tag: str):
    """InstanceNormalization: per (n, c), (x - mean) / sqrt(var + eps) * scale + bias over the
    spatial dims, the means MatMuls by a column of 1/(spatial size) (GroupNorm(1) exports
    come as one of these over C x H x W)."""
    x_dims = _dims(shapes, node.input[0], node)
    size, c = int(np.prod(x_dims[2:])), x_dims[1]
    eps = float(_attrs(node).get("epsilon", 1e-5))
    inits = [_const(tag, "flat", np.array([0, 0, -1], np.int64)),
             _const(tag, "mean", np.full((size, 1), 1.0 / size)), _const(tag, "eps", np.array(eps)),
             _const(tag, "col", np.array([c, 1], np.int64)),
             _const(tag, "yshape", np.array(x_dims, np.int64))]
    t = lambda name: f"{tag}/{name}"       # noqa: E731  (a name of this decomposition)
    nodes = [helper.make_node("Reshape", [node.input[0], t("flat")], [t("xf")]),
             helper.make_node("MatMul", [t("xf"), t("mean")], [t("mu")]),
             helper.make_node("Sub", [t("xf"), t("mu")], [t("d")]),
             helper.make_node("Mul", [t("d"), t("d")], [t("d2")]),
             helper.make_node("MatMul", [t("d2"), t("mean")], [t("var")]),
             helper.make_node("Add", [t("var"), t("eps")], [t("ve")]),
             helper.make_node("Sqrt", [t("ve")], [t("sd")]),
             helper.make_node("Div", [t("d"), t("sd")], [t("z")]),
             helper.make_node("Reshape", [node.input[1], t("col")], [t("scale")]),
             helper.make_node("Reshape", [node.input[2], t("col")], [t("bias")]),
             helper.make_node("Mul", [t("z"), t("scale")], [t("zs")]),
             helper.make_node("Add", [t("zs"), t("bias")], [t("y")]),
             helper.make_node("Reshape", [t("y"), t("yshape")], [node.output[0]])]
    return nodes, inits


DECOMPOSE = {"Conv": conv, "AveragePool": average_pool, "GlobalAveragePool": global_average_pool,
             "LRN": lrn, "InstanceNormalization": instance_norm}
