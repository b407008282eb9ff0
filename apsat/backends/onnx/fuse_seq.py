"""Sequence-model forms: what a transformer's export leaves for one node to do.

    Attention(q * c, k * c', ..)          -> Attention(q, k, .., scale=c * c')
    Slice(x, 0:a), Slice(x, a:b), ..      -> Split(x)      # slices tiling one axis (q, k, v)
    LayerNormalization(x, s) * c + d      -> LayerNormalization(x, s * c, d)   # also RMS
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from apsat.backends.onnx.peep import (Planned, absorb, attrs, const, followed, initializer, ints, is_const, other, scalar,
                                      sole_reader)


def _attention_scale(g, shapes: dict, plan: Planned) -> bool:
    """Attention(q * c, ..) -> Attention(q, .., scale * c) for a scalar c on q or k, also
    where Reshapes lie between the Mul and the Attention."""
    made = {n.output[0]: n for n in g.node}
    for att in [n for n in g.node if n.op_type == "Attention" and n.domain == ""]:
        for reader, pos in ((att, 0), (att, 1)):
            node = made.get(reader.input[pos])
            while node is not None and node.op_type == "Reshape" and sole_reader(g, node.output[0]) is not None:
                reader, pos, node = node, 0, made.get(node.input[0])
            c = _scaled(g, node)
            if c is None or sole_reader(g, node.output[0]) is None or not plan.together(node, att):
                continue
            reader.input[pos] = next(i for i in node.input if scalar(g, i) is None)
            scale = float(attrs(att).get("scale", 1.0)) * c
            kept = [a for a in att.attribute if a.name != "scale"]
            del att.attribute[:]
            att.attribute.extend(kept + [helper.make_attribute("scale", scale)])
            g.node.remove(node)
            return True
    return False


def _norm_affine(g, shapes: dict, plan: Planned) -> bool:
    """Norm(x, s) * c -> Norm(x, s * c); LayerNormalization(x, s) + d -> (x, s, d): c and
    d constants over the normalised axes only."""
    def norm(n):
        return n.op_type in ("LayerNormalization", "RMSNormalization") and n.domain == "" \
            and len(n.output) == 1 and is_const(g, n.input[1])
    for node, reader in followed(g, norm, lambda n, r: r.op_type in ("Mul", "Add"), plan):
        out = shapes.get(node.output[0])
        c = const(g, other(reader, node.output[0]) or "")
        if out is None or c is None or shapes.get(reader.output[0]) != out:
            continue
        axis = attrs(node).get("axis", -1) % len(out)
        inner = _over(c, out, axis)
        has_bias = len(node.input) > 2 and node.input[2]
        if inner is None or (reader.op_type == "Add" and (node.op_type != "LayerNormalization" or has_bias)):
            continue
        scale = const(g, node.input[1])
        if reader.op_type == "Mul":
            node.input[1] = initializer(g, f"{reader.output[0]}_scale", np.broadcast_to(scale, out[axis:]) * inner)
            if has_bias:
                node.input[2] = initializer(g, f"{reader.output[0]}_bias", const(g, node.input[2]) * inner)
        else:
            node.input.extend([""] * (2 - len(node.input)) + [initializer(g, f"{reader.output[0]}_bias", inner)])
        absorb(g, node, reader)
        return True
    return False


def _over(c: np.ndarray, out: tuple, axis: int) -> np.ndarray | None:
    """`c` over the trailing axes out[axis:] when it broadcasts over `out` and is constant
    along the axes before `axis`; else None."""
    if c.ndim > len(out) or c.dtype != np.float32:
        return None
    full = c.reshape((1,) * (len(out) - c.ndim) + c.shape)
    if any(d != 1 for d in full.shape[:axis]):
        return None
    try:
        return np.ascontiguousarray(np.broadcast_to(full.reshape(full.shape[axis:]), out[axis:]))
    except ValueError:
        return None


def _scaled(g, node) -> float | None:
    """c when `node` is Mul(x, c) with c a float scalar constant and x no constant."""
    if node is None or node.op_type != "Mul" or len(node.input) != 2:
        return None
    cs = [scalar(g, i) for i in node.input]
    if sum(c is not None for c in cs) != 1:
        return None
    return next(c for c in cs if c is not None)


def _split(g, shapes: dict, plan: Planned) -> bool:
    """Slices of one value along one axis that tile it exactly -> one Split, in the first
    slice's place; every such group in one sweep. Why one sweep, nodes and initializers
    indexed once: a group a call, each scanning the graph and the initializers for every
    slice's bounds, took minutes on a chain of 1,666 slice pairs."""
    inits, known = {i.name: i for i in g.initializer}, {}

    def bound(name):
        """The int an initializer of one element holds, else None."""
        if name not in known:
            v = numpy_helper.to_array(inits[name]) if name in inits else None
            known[name] = int(v.reshape(-1)[0]) if v is not None and v.size == 1 else None
        return known[name]
    groups: dict = {}
    for n in g.node:
        bounds = [bound(i) for i in n.input[1:4]] if n.op_type == "Slice" and len(n.input) == 4 else []
        if bounds and all(b is not None for b in bounds):
            groups.setdefault((n.input[0], bounds[2]), []).append((bounds[0], bounds[1], n.name))
    nodes = {n.name: (k, n) for k, n in enumerate(g.node)}
    splits, dropped = {}, set()
    for (src, axis), parts in groups.items():
        dims = shapes.get(src)
        parts.sort()
        if dims is None or len(parts) < 2 or parts[0][0] != 0 or parts[-1][1] != dims[axis] \
                or any(a[1] != b[0] for a, b in zip(parts, parts[1:])):
            continue
        names = [p[2] for p in parts]
        splits[min(names, key=lambda m: nodes[m][0])] = helper.make_node(
            "Split", [src, ints(g, f"{names[0]}_sizes", [hi - lo for lo, hi, _ in parts])],
            [nodes[m][1].output[0] for m in names], name=f"{names[0]}_split", axis=axis)
        dropped.update(names)
    if not splits:
        return False
    kept = [onnx.NodeProto.FromString((splits[n.name] if n.name in splits else n).SerializeToString())
            for n in g.node if n.name in splits or n.name not in dropped]   # copies: g.node is cleared
    del g.node[:]
    g.node.extend(kept)
    return True


SEQUENCE_PASSES = (_attention_scale, _split, _norm_affine)
