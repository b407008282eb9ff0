"""What one e-node asks of any machine: arithmetic, elements read, elements written.

Target-neutral figures that the target cost models (cost_gpu.py, cost_systolic.py) turn
into time. Every op of the registry has a role (apsat/lang/spec.py ROLES), and the classes
below are the registry's (apsat/lang/ops.py):

  VIEW_OPS    access patterns that only re-index data (no kernel, nothing moved). Their
              data is read by the kernel that consumes them.
  COPY_OPS    access patterns a machine must materialise: a transpose, concatenation or
              padding is a copy (read and write every element).
  KERNEL_OPS  compute: `compute OP`, the kernel atoms (ATOM_OPS: the fused atoms, the
              systolic-array atom).
  HOST_OPS    opaque ONNX nodes, run outside the compiled program.

Arithmetic is each op's registry formula (`OpSpec.flops`, apsat/lang/arithmetic.py).

Context enters the cost in three places (the issue's list; this module holds the last two):
  1. DAG cost: a shared e-class is paid once (the extractors, apsat/extract/check.dag_cost).
  2. Fused atoms: `fused-dot-bias-act` reads its operands and writes one result, and so
     does `compute (chain F G)`, one element-wise kernel for a chain of element-wise ops
     (its arithmetic is the sum of its parts'); the unfused chain writes and re-reads
     every intermediate (`traffic` below).
  3. Materialisation: a kernel reads the *underlying* data of its operand views
     (`footprints`: a convolution over `access-windows` reads the input once, not once per
     window), and every kernel or copy writes its result, which its consumers read again.
     A choice that forces a copy (a transpose) pays for it.
"""
from __future__ import annotations

from apsat.errors import ExtractionError
import math

from apsat.extract.decode import compute_op_term, expr_child_classes
from apsat.extract.graph import ExtractionGraph
from apsat.lang.arithmetic import elements
from apsat.lang.ops import OPS, VIEW_OPS


def needs_shapes(graph: ExtractionGraph, model: str) -> dict:
    """The graph's class shapes, or a one-line error saying how to provide them."""
    if graph.shapes is None:
        raise ExtractionError(f"cost model {model!r} needs e-class shapes: extract from an EGraph "
                         "(apsat.extract.extract), not from a bare extraction-gym file")
    return graph.shapes


def footprints(graph: ExtractionGraph, shapes: dict) -> dict[str, float]:
    """Class id -> elements of distinct stored data a kernel reads when it reads this
    class: the class's own size for materialised results (kernels, copies, host steps,
    tensors), the data underneath for views (a window view reads its input once, a
    cartesian product both operands, a slice at most its input). Views of one value can
    differ (a class holds `x` and `reshape(x)` alike), so the least over members is kept,
    relaxed to a fixed point. Classes without a shape are absent."""
    fp: dict[str, float] = {}
    views = []
    for nid, node in graph.nodes.items():
        op, cls = node["op"], node["eclass"]
        if op not in OPS or cls not in shapes:
            continue
        if op in VIEW_OPS and op not in ("access-tensor", "access-literal"):
            views.append((nid, op, cls, expr_child_classes(graph, nid)))
        else:
            fp[cls] = min(fp.get(cls, math.inf), float(elements(shapes[cls])))
    changed = True
    while changed:   # each pass lowers some class or stops; values only decrease
        changed = False
        for nid, op, cls, kids in views:
            if any(k not in fp for k in kids):
                continue
            value = sum(fp[k] for k in kids)
            if op == "access-slice":
                value = min(value, float(elements(shapes[cls])))
            if value < fp.get(cls, math.inf):
                fp[cls] = value
                changed = True
    return fp


def compute_op(graph: ExtractionGraph, nid: str) -> str:
    """The name of node `nid`'s compute operator (`compute` and the fused atoms carry one
    as their first argument)."""
    return graph.nodes[graph.classes[graph.node_classes[nid][0]][0]]["op"]


def flops(graph: ExtractionGraph, nid: str, shapes: dict) -> float:
    """Arithmetic operations of a node: its op's registry formula over the shapes of its
    class and its operands' (0 for views, copies and host steps, which compute nothing)."""
    node = graph.nodes[nid]
    spec = OPS.get(node["op"])
    if spec is None or spec.flops is None:
        return 0.0
    operator = None
    if spec.signature[0] == "compute-op":
        operator = compute_op_term(graph, graph.node_classes[nid][0])
    kids = [shapes.get(k) for k in expr_child_classes(graph, nid)]
    return spec.flops(operator, shapes[node["eclass"]], kids)


def traffic(graph: ExtractionGraph, nid: str, shapes: dict, fp: dict) -> tuple[float, float]:
    """(elements read, elements written) by a kernel, copy or host node: the footprints of
    its operands and its own result. Views move nothing: (0, 0)."""
    node = graph.nodes[nid]
    if node["op"] in VIEW_OPS:
        return 0.0, 0.0
    reads = sum(fp.get(k, math.inf) for k in expr_child_classes(graph, nid))
    return reads, float(elements(shapes[node["eclass"]]))
