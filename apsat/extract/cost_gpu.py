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

Figures (H100 SXM5, public data sheet): fp32 67 TFLOP/s without tensor cores, tf32
494 TFLOP/s and bf16 989 TFLOP/s dense on tensor cores (matrix products only; element-wise
work stays at the fp32 rate), 3.35 TB/s HBM3, PCIe Gen5 x16 ~64 GB/s, ~3 us per launch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from apsat.extract.constants import weight_only_nodes
from apsat.extract.graph import ExtractionGraph
from apsat.extract.workload import (COPY_OPS, HOST_OPS, KERNEL_OPS, VIEW_OPS, compute_op,
                                    flops, footprints, needs_shapes, traffic)

TFLOPS = {"fp32": 67.0, "tf32": 494.0, "bf16": 989.0}
BYTES = {"fp32": 4, "tf32": 4, "bf16": 2}
HBM_BYTES_PER_US = 3.35e6          # 3.35 TB/s
PCIE_BYTES_PER_US = 64e3           # 64 GB/s
LAUNCH_US = 3.0
MATRIX_OPS = frozenset({"fused-dot-bias", "fused-dot-bias-act", "systolic-array"})


@dataclass
class GpuRoofline:
    """Roofline time (microseconds) of each e-node on an H100 at `precision` ("fp32",
    "tf32" or "bf16"; verification stays fp32 whatever the model assumes)."""

    precision: str = "fp32"
    name: str = "gpu"

    def __post_init__(self):
        if self.precision not in TFLOPS:
            raise ValueError(f"gpu cost model: unknown precision {self.precision!r}; known: {', '.join(TFLOPS)}")

    def kernel_us(self, flop: float, elements_moved: float, matrix: bool) -> float:
        """One kernel's time: launch plus the larger of compute and memory time."""
        peak = TFLOPS[self.precision] if matrix else TFLOPS["fp32"]
        return LAUNCH_US + max(flop / (peak * 1e6), elements_moved * BYTES[self.precision] / HBM_BYTES_PER_US)

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
            if op in COPY_OPS:
                return self.kernel_us(0.0, reads + writes, False)
            if op in HOST_OPS:
                return 2 * LAUNCH_US + (reads + writes) * BYTES["fp32"] / PCIE_BYTES_PER_US
            matrix = op in MATRIX_OPS or (op == "compute" and compute_op(graph, nid) == "dot-product")
            return self.kernel_us(flops(graph, nid, shapes), reads + writes, matrix)
        return cost

