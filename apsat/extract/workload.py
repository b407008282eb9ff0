"""What one e-node asks of any machine: arithmetic, elements read, elements written.

Target-neutral figures that the target cost models (cost_gpu.py, cost_systolic.py) turn
into time. Every op of the registry is classified here, once:

  VIEW_OPS    access patterns that only re-index data (no kernel, nothing moved). Their
              data is read by the kernel that consumes them.
  COPY_OPS    access patterns a machine must materialise: a transpose, concatenation or
              padding is a copy (read and write every element).
  KERNEL_OPS  compute: `compute OP`, the fused atoms, the systolic-array atom.
  HOST_OPS    opaque ONNX nodes, run outside the compiled program.

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

import math

from apsat.lang.ops import COMPUTE_OPS, OPS
from apsat.extract.decode import compute_op_term, expr_child_classes
from apsat.extract.graph import ExtractionGraph

VIEW_OPS = frozenset({
    "access-tensor", "access", "access-reshape", "access-flatten", "access-squeeze",
    "access-insert-axis", "access-slice", "access-windows", "access-dilated-windows",
    "access-cartesian-product", "access-pair", "access-broadcast", "access-literal"})
COPY_OPS = frozenset({"access-transpose", "access-concatenate", "access-pad"})
KERNEL_OPS = frozenset({"compute", "fused-dot-bias", "fused-dot-bias-act", "systolic-array"})
HOST_OPS = frozenset({"opaque"})

# Arithmetic per element of a compute operator's input item (dot-product, reductions and
# n-ary ops: one multiply or add per input element) or per output element (unary ops:
# transcendental ones cost a few operations, normalisations a pass for each statistic).
FLOPS_PER_INPUT = {"dot-product": 1, "reduce-sum": 1, "reduce-max": 1, "reduce-mean": 1,
                   "elementwise-add": 1, "elementwise-mul": 1, "elementwise-sub": 1,
                   "elementwise-div": 1, "elementwise-pow": 4, "select": 1}
FLOPS_PER_OUTPUT = {"relu": 1, "negative": 1, "clip": 2, "sqrt": 4, "exp": 4, "erf": 8,
                    "tanh": 8, "sigmoid": 6, "gelu": 12, "softmax": 6, "layer-norm": 8, "lrn": 12}
# Compute operators made of others, whose arithmetic is their parts' (operator_flops).
COMPOSITE_OPS = frozenset({"chain"})


def elements(shape) -> int:
    """Number of elements of an access shape ((iterated), (item))."""
    return math.prod(shape[0]) * math.prod(shape[1])


def needs_shapes(graph: ExtractionGraph, model: str) -> dict:
    """The graph's class shapes, or a one-line error saying how to provide them."""
    if graph.shapes is None:
        raise ValueError(f"cost model {model!r} needs e-class shapes: extract from an EGraph "
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


def operator_flops(op, inputs: float, outputs: float) -> float:
    """Arithmetic of compute operator term `op` over `inputs` input and `outputs` output
    elements. A chain is the sum of its parts: F over the inputs, then each unary map over
    the outputs (F's result has the chain's output size: the maps keep it)."""
    if op.op == "chain":
        f, g = op.args
        return operator_flops(f, inputs, outputs) + operator_flops(g, outputs, outputs)
    if op.op in FLOPS_PER_INPUT:
        return float(FLOPS_PER_INPUT[op.op] * inputs)
    return float(FLOPS_PER_OUTPUT[op.op] * outputs)


def flops(graph: ExtractionGraph, nid: str, shapes: dict) -> float:
    """Arithmetic operations of a kernel node (0 for views, copies and host steps)."""
    node = graph.nodes[nid]
    op, kids = node["op"], expr_child_classes(graph, nid)
    out = elements(shapes[node["eclass"]])
    if op == "compute":
        operator = compute_op_term(graph, graph.node_classes[nid][0])
        return operator_flops(operator, elements(shapes[kids[0]]), out)
    if op in ("fused-dot-bias", "fused-dot-bias-act"):
        item = math.prod(shapes[kids[0]][1])
        act = FLOPS_PER_OUTPUT[compute_op(graph, nid)] if op == "fused-dot-bias-act" else 0
        return float(out * (2 * item + 1 + act))
    if op == "systolic-array":
        (batch, _), (_, (rows, cols)) = shapes[kids[0]], shapes[kids[1]]
        return 2.0 * math.prod(batch) * rows * cols
    return 0.0


def traffic(graph: ExtractionGraph, nid: str, shapes: dict, fp: dict) -> tuple[float, float]:
    """(elements read, elements written) by a kernel, copy or host node: the footprints of
    its operands and its own result. Views move nothing: (0, 0)."""
    node = graph.nodes[nid]
    if node["op"] in VIEW_OPS:
        return 0.0, 0.0
    reads = sum(fp.get(k, math.inf) for k in expr_child_classes(graph, nid))
    return reads, float(elements(shapes[node["eclass"]]))


def check_classified() -> None:
    """Raise if an op of the registry is in none or several of the op classes above, or a
    compute operator has no arithmetic figure (tests/test_registry.py calls this)."""
    groups = (VIEW_OPS, COPY_OPS, KERNEL_OPS, HOST_OPS)
    for op in OPS:
        hits = sum(op in g for g in groups)
        if hits != 1:
            raise AssertionError(f"op {op} is in {hits} of the workload classes (needs exactly 1)")
    for name in COMPUTE_OPS:
        if name in COMPOSITE_OPS:
            continue
        if (name in FLOPS_PER_INPUT) == (name in FLOPS_PER_OUTPUT):
            raise AssertionError(f"compute operator {name} needs exactly one arithmetic figure")
