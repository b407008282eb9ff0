"""The `gpu` cost model: a roofline per kernel on H100 SXM figures, in microseconds.

A kernel node (apsat/extract/workload.py: `compute`, the fused atoms, `systolic-array` as
a plain matrix multiply) costs
    launch + max(FLOPs / peak, bytes moved / HBM bandwidth)
where bytes moved are its operands' underlying data read plus its result written. So an
intermediate that a fused atom keeps on chip moves no bytes, and one that an unfused chain
materialises is written by its producer and read by its consumer. A copy (transpose,
concatenate, pad: layout changes) costs launch + read and write of its data. Views cost
nothing; their data is paid for by the kernel that reads them. An opaque ONNX node runs on
the host: its operands go down and its result comes back over PCIe, plus a launch each way.
Weight-only work (constants.py: BatchNorm folded into weights, weight layout changes)
costs nothing per inference: the runner does it once, when the model is loaded.

By element type (the serialised classes' `dtype`, ExtractionGraph.dtypes): bytes moved are
each operand's footprint and the result at their classes' element width (dtypes.BYTES;
4 for exact values and untyped classes), and a product of f16 or bf16 operands runs at
that type's tensor-core peak, as the gpu backend's kernels are priced (graph.Kernel).

The machine's figures and one kernel's roofline are the gpu target's (apsat/targets/gpu.py).
Each kernel is priced with its kind (`kernel_kind`), which a fitted calibration
(apsat/targets/gpu_calibration.py) reads: its own fractions of peak bandwidth and FLOP/s.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from apsat.extract.constants import weight_only_nodes
from apsat.extract.graph import ExtractionGraph
from apsat.extract.decode import expr_child_classes
from apsat.extract.workload import compute_op, flops, footprints, needs_shapes, traffic
from apsat.lang.arithmetic import elements
from apsat.lang.dtypes import BYTES
from apsat.lang.ops import ATOM_OPS, CONTRACTIONS, COPY_OPS, HOST_OPS, KERNEL_OPS, LOCAL_OPS, VIEW_OPS
from apsat.targets.gpu import Roofline


def kernel_kind(graph: ExtractionGraph, nid: str) -> str:
    """The GPU kernel kind (gpu_calibration.KINDS) of a kernel or copy node, as the GPU
    backend classifies its kernels: the attention atom "attention"; the other atoms and
    dot-products "gemm"; copies and operators computed element by element
    (ops.LOCAL_OPS, chains included) "elementwise"; the rest (reductions, softmax, the
    norms: operators over a whole item) "reduce"."""
    op = graph.nodes[nid]["op"]
    if op == "attention":
        return "attention"
    if op in ATOM_OPS:
        return "gemm"
    if op in COPY_OPS:
        return "elementwise"
    name = compute_op(graph, nid)
    if name in CONTRACTIONS:
        return "gemm"
    return "elementwise" if name in LOCAL_OPS else "reduce"


@dataclass
class GpuRoofline(Roofline):
    """The gpu cost model: the roofline time (microseconds) of each e-node on the gpu
    target's machine at `precision` (see apsat.targets.gpu.Roofline)."""

    name: str = "gpu"

    def node_cost(self, graph: ExtractionGraph):
        """node id -> microseconds; views 0; a node of a class without a shape costs inf
        (it cannot be priced, so it is never chosen)."""
        shapes = needs_shapes(graph, self.name)
        fp = footprints(graph, shapes)
        once = weight_only_nodes(graph, graph.weights) if graph.weights else set()

        def cost(nid: str) -> float:
            node = graph.nodes[nid]
            op = node["op"]
            if nid in once:
                return 0.0   # weight-only: done once when the model is loaded
            if op in VIEW_OPS or op not in KERNEL_OPS | COPY_OPS | HOST_OPS:
                return 0.0   # views, and the non-Expr nodes (lists, literals, operators)
            if node["eclass"] not in shapes:
                return math.inf
            reads, writes = traffic(graph, nid, shapes, fp)
            if op in HOST_OPS:
                return self.host_us(reads + writes)
            kind = kernel_kind(graph, nid)
            moved = moved_bytes(graph, nid, shapes, fp)
            if op in COPY_OPS:
                return self.kernel_us(0.0, reads + writes, False, kind, moved_bytes=moved)
            return self.kernel_us(flops(graph, nid, shapes), reads + writes, kind in ("gemm", "attention"), kind,
                                  dtype=graph.dtypes.get(node["eclass"]), moved_bytes=moved)
        return cost


def moved_bytes(graph: ExtractionGraph, nid: str, shapes: dict, fp: dict) -> float:
    """Bytes a kernel or copy node moves: workload.traffic's elements, each operand's and
    the result's at its class's element width (4 where the class is untyped: exact values
    are carried as float32). All f32: exactly traffic's elements times 4."""
    def width(c):
        return BYTES.get(graph.dtypes.get(c), 4)
    reads = sum(fp.get(k, math.inf) * width(k) for k in expr_child_classes(graph, nid))
    cls = graph.nodes[nid]["eclass"]
    return reads + float(elements(shapes[cls])) * width(cls)

