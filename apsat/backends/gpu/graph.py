"""The kernel graph: what the lowering (apsat/backends/gpu/lower.py) produces and the
code generators, runner and report consume.

Buffers are arrays of their term's element type in device memory (f32, f16 or bf16;
exact values, integers and masks, are float32), row-major. Steps run in list order: a
`Kernel` (one generated kernel: elementwise, gemm, reduce or attention) or a `HostStep` (a term no
kernel expresses, run on the host). Each step names the buffers it reads and the one it
writes, so the graph is also a networkx DiGraph (`to_networkx`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from apsat.backends.gpu.expr import Ix
from apsat.lang import dtypes
from apsat.lang.program import Program
from apsat.targets.gpu import BYTES, Roofline

HALF = frozenset({dtypes.F16, dtypes.BF16})


@dataclass
class Buffer:
    """An array in device memory: a program input or weight (`tensor` names it), or the
    result of a kernel or host step; row-major over `dims`, of element type `dtype`
    (dtypes.F32, F16 or BF16: the program's type of the term it holds, f32 for exact
    values)."""

    name: str
    dims: tuple[int, ...]
    kind: str                  # "input" | "kernel" | "host"
    tensor: str | None = None  # the program's tensor name, for inputs
    dtype: str = dtypes.F32

    @property
    def elements(self) -> int:
        return math.prod(self.dims)


@dataclass
class Kernel:
    """One generated kernel. `kind` is "elementwise", "gemm", "reduce" or "attention".

    axes: loop-variable groups, name -> dims; elementwise {"o"}; gemm {"b", "m", "n", "k"}
    (the batch, matrix and contraction axes); reduce {"r", "c"} (rows and columns);
    attention {"b", "m", "n", "d", "e"} (the batch dims I.., then one dim each: queries,
    keys, the q.k width, the value width).
    values: the expressions, over variables named <group><axis> (o0, m1, ka0 ...):
    elementwise {"out"}; gemm {"a", "b", "out"} (a over b/m/ka, b over b/kb/n, out over
    b/m/n and ("sym", "acc")); reduce {"elem", "out"} (out reads ("sym", "acc"), the
    reduced value or, for softmax and the norms, the normalised element); attention
    {"q" over b/m0/dq0, "k" over b/nk0/dk0, "bias" over b/m0/ns0 (a constant when the
    bias is a scalar literal), "v" over b/ev0/nv0, "out" over b/m0/e0 and ("sym", "acc"),
    the softmax-weighted sum of v for the element} (apsat/backends/gpu/attention.py).
    store: the element offset in `out` that `values["out"]` goes to (None: elementwise,
    whose output is contiguous over its own index space).
    op: for reduce, sum | max | mean | softmax | layer-norm | rms-norm; `eps` for the norms; for
    attention, safe (a row whose softmax is NaN, every score -inf, gives 0: the atom's
    SAFE 1) | plain (it gives NaN, as softmax does).
    types: buffer name -> element type of the output and of every buffer read (absent:
    f32). operand: the element type of a gemm's or attention's product operands (f16 or
    bf16: `tl.dot` on half operands, tensor cores, float32 accumulation; f32: the
    "ieee" fp32 product).
    stats: for gemm, the row statistics (folds.RowStats) of the normalisations its
    operand or epilogue reads, computed before the main loop over the row variables
    (b/m) and s0, s1, ...; values read them as ("sym", "<name>_mean"/"<name>_den").
    """

    name: str
    kind: str
    out: str
    reads: list[str]
    axes: dict
    values: dict
    store: Ix | None
    covers: list[str]
    op: str = ""
    eps: float = 0.0
    stats: list = field(default_factory=list)
    types: dict = field(default_factory=dict)
    operand: str = dtypes.F32
    tiles: dict = field(default_factory=dict)
    flops: float = 0.0
    elements_read: float = 0.0
    elements_written: float = 0.0
    bytes_moved: float | None = None   # by each buffer's element width; None: 4 bytes each

    @property
    def bytes(self) -> float:
        """Bytes moved in the ideal case: each buffer read once, the result written once,
        each at its element type's width (dtypes.BYTES)."""
        if self.bytes_moved is not None:
            return self.bytes_moved
        return (self.elements_read + self.elements_written) * BYTES["fp32"]

    @property
    def modelled_us(self) -> float:
        """Roofline time on an H100 (apsat/extract/cost_gpu.py prices e-nodes the same way):
        gemm and attention (both tl.dot) at the matrix peak of their operands' type (fp32,
        or the tensor-core rate of f16/bf16), as cost_gpu prices matmuls and the atoms;
        bytes by each buffer's element width; with a calibration in force
        (apsat/targets/gpu_calibration.py), its figures for this kernel's kind."""
        return Roofline("fp32").kernel_us(self.flops, self.elements_read + self.elements_written,
                                          self.kind in ("gemm", "attention"), self.kind,
                                          dtype=self.operand, moved_bytes=self.bytes_moved)


@dataclass
class HostStep:
    """A term the GPU target cannot express, run on the host: `program` is the term with
    every buffer it reads as a named tensor (reads), evaluated by the reference
    interpreter (which runs opaque nodes in onnxruntime)."""

    name: str
    out: str
    reads: list[str]
    program: Program
    op: str
    runner: str      # "onnxruntime" | "reference"
    reason: str

    @property
    def elements(self) -> int:
        """Elements crossing PCIe: the operands down and the result back."""
        ins = sum(math.prod(d) for d in self.program.tensor_shapes.values())
        return ins + math.prod(self.program.shape[0] + self.program.shape[1])

    @property
    def bytes(self) -> float:
        """Bytes crossing PCIe (cost_gpu's model), fp32."""
        return self.elements * BYTES["fp32"]

    @property
    def modelled_us(self) -> float:
        """A launch each way plus the PCIe transfers (Roofline.host_us: the calibrated
        launch when a calibration is in force)."""
        return Roofline("fp32").host_us(self.elements)


@dataclass
class KernelGraph:
    """Steps (Kernel | HostStep) in execution order, every buffer by name, the program's
    tensor names per input buffer, and output name -> buffer holding it. `weights`: the
    program's tensors known at load time (Program.weights); the steps that read only
    those (and each other's results) are `prepare_steps`, run once, not per inference.
    `stored`: the program's terms whose value the kernels write to memory (or read as an
    input); every other term is computed inside the kernel that reads it. What else
    writes the program (the ONNX export) puts two operations in one node only where
    this plan put them in one kernel."""

    steps: list
    buffers: dict[str, Buffer]
    outputs: dict[str, str]
    weights: frozenset = frozenset()
    stored: frozenset = frozenset()

    @property
    def prepare_steps(self) -> list:
        """Steps whose every read is a weight buffer or another prepare step's result (in
        step order): weight-only work such as BatchNorm folded into weights."""
        known = {b.name for b in self.buffers.values() if b.kind == "input" and b.tensor in self.weights}
        out = []
        for s in self.steps:
            if s.reads and all(r in known for r in s.reads):
                out.append(s)
                known.add(s.out)
        return out

    @property
    def kernels(self) -> list[Kernel]:
        return [s for s in self.steps if isinstance(s, Kernel)]

    @property
    def host_steps(self) -> list[HostStep]:
        return [s for s in self.steps if isinstance(s, HostStep)]

    @property
    def inputs(self) -> list[Buffer]:
        """Input buffers (program tensors), in first-use order."""
        return [b for b in self.buffers.values() if b.kind == "input"]

    def to_networkx(self):
        """The step graph: nodes are step names, an edge runs from the step writing a buffer
        to each step reading it (the `buffer` attribute names it)."""
        import networkx as nx

        g = nx.DiGraph()
        writer = {}
        for s in self.steps:
            g.add_node(s.name, kind=getattr(s, "kind", "host"))
            for r in s.reads:
                if r in writer:
                    g.add_edge(writer[r], s.name, buffer=r)
            writer[s.out] = s.name
        return g
