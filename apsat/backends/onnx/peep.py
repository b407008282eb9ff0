"""Reading and editing a written graph: a value's readers, constants and static dims, and
the planner's say on which nodes may become one.

The passes of fuse.py and fuse_seq.py read the graph through these. Nodes are told apart
by name (the exporter's names are unique).
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from apsat.backends.onnx.external import stub_value

CONTRIB = "com.microsoft"


def name_nodes(g) -> None:
    """Give every node a name no other node has (the passes tell nodes apart by name)."""
    seen = set()
    for n in g.node:
        if not n.name or n.name in seen:
            n.name = f"{n.output[0]}_{n.op_type.lower()}"
        seen.add(n.name)


def attrs(node) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def sole_reader(g, name: str):
    """The one node reading `name`, or None (several, or a graph output)."""
    if name in {o.name for o in g.output}:
        return None
    readers = [n for n in g.node if name in n.input]
    return readers[0] if len(readers) == 1 else None


class Planned:
    """Which written nodes the planner computes in one kernel, so that the export may write
    them as one node: `owner` maps each written value's name to the program term whose
    walk wrote it, `stored` holds the terms the planner writes to memory (the gpu
    kernel graph's `stored`). A node and its reader may become one where both were
    written for one term (an extracted atom, such as a fused product with its
    activation) or where the planner computes the node's term inside the kernel that
    reads it. A value written for no term (one the tidying made) is kept apart. So the
    export expresses the planner's kernels in ONNX's fused nodes and decides none of
    its own (issue 33: decide once)."""

    def __init__(self, owner: dict, stored: frozenset):
        self.owner, self.stored = owner, stored

    def together(self, node, reader) -> bool:
        a, b = self.owner.get(node.output[0]), self.owner.get(reader.output[0])
        return a is not None and b is not None and (a == b or a not in self.stored)


def followed(g, head, pred, plan: Planned):
    """(node, reader) pairs: a node with head(node) whose sole reader satisfies
    pred(node, reader), where `plan` puts the two in one kernel. The readers are indexed
    once: a caller that changes the graph stops drawing from it."""
    readers: dict = {}
    for n in g.node:
        for i in set(n.input):
            readers.setdefault(i, []).append(n)
    outputs = {o.name for o in g.output}
    for node in list(g.node):
        if head(node):
            found = readers.get(node.output[0], [])
            if len(found) == 1 and node.output[0] not in outputs and pred(node, found[0]) \
                    and plan.together(node, found[0]):
                yield node, found[0]


def absorb(g, node, reader) -> None:
    """`node` takes the reader's place and writes its output (a z input may be computed
    between the two); its own place goes."""
    fused = onnx.NodeProto()
    fused.CopyFrom(node)
    fused.output[0] = reader.output[0]
    reader.CopyFrom(fused)
    g.node.remove(node)


def contrib(node, op_type: str) -> None:
    node.op_type, node.domain = op_type, CONTRIB


def const(g, name: str):
    """An initializer's value (an external-data stub's array: apsat.backends.onnx.external),
    or None when `name` is none."""
    for i in g.initializer:
        if i.name == name:
            value = stub_value(i)
            return numpy_helper.to_array(i) if value is None else value
    return None


def is_const(g, name: str) -> bool:
    """`name` is an initializer (no array is made: a weight may be large)."""
    return any(i.name == name for i in g.initializer)


def other(node, name: str) -> str | None:
    """The one input of a binary node that is not `name`."""
    rest = [i for i in node.input if i != name]
    return rest[0] if len(rest) == 1 and len(node.input) == 2 else None


def initializer(g, name: str, value: np.ndarray) -> str:
    g.initializer.append(numpy_helper.from_array(np.ascontiguousarray(value, np.float32), name))
    return name


def scalar(g, name: str) -> float | None:
    value = const(g, name)
    return None if value is None or value.size != 1 or value.dtype != np.float32 else float(value.reshape(-1)[0])


def ints(g, name: str, values: list) -> str:
    g.initializer.append(numpy_helper.from_array(np.asarray(values, np.int64), name))
    return name


def shapes(model: onnx.ModelProto) -> dict:
    """Every value's static dims, by onnx's shape inference on a copy in which each
    FusedConv / FusedGemm is the plain Conv / Gemm it has the shape of, and each one-input
    contrib op (an element-wise one) an Identity."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for i in [i for i in copy.graph.initializer if i.data_type == onnx.TensorProto.FLOAT]:
        copy.graph.input.append(helper.make_tensor_value_info(i.name, i.data_type, list(i.dims)))
        copy.graph.initializer.remove(i)          # weights: their dims are enough
    for n in copy.graph.node:
        if n.op_type in ("FusedConv", "FusedGemm") and n.domain == CONTRIB:
            kept = [a for a in n.attribute if not a.name.startswith("activation")]
            del n.attribute[:]
            n.attribute.extend(kept)
            del n.input[3:]
            n.op_type, n.domain = n.op_type[len("Fused"):], ""
        elif n.domain == CONTRIB and len(n.input) == 1:     # QuickGelu: element-wise
            del n.attribute[:]
            n.op_type, n.domain = "Identity", ""
    inferred = onnx.shape_inference.infer_shapes(copy)
    out = {}
    g = inferred.graph
    for v in list(g.value_info) + list(g.input) + list(g.output):
        dims = v.type.tensor_type.shape.dim
        if all(d.HasField("dim_value") for d in dims):
            out[v.name] = tuple(d.dim_value for d in dims)
    for i in g.initializer:
        out[i.name] = tuple(i.dims)
    return out
