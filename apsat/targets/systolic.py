"""The systolic-array accelerator's analytical cycle/traffic model (its description, the
`Accelerator` dataclass with its presets and TOML files, is apsat/targets/accelerator.py).

This module is the single source of truth for what a GEMM costs on a systolic array: the
extractor's systolic cost model and the accelerator backend's cycle model both call
`gemm_cost`, `vector_cycles` and `dram_cycles`; nothing else re-derives these numbers
(apsat/targets/pair_dot.py builds grouped and depthwise products' costs from them).

The model follows SCALE-Sim 3.0 (`scalesim` on PyPI), which it is calibrated against
(`benchmarks/calibrate_systolic.py`, data in `tests/targets/data/`):

* An (m x k) . (k x n) product is a conv layer with P = m output pixels, window R*S*C = k
  and n filters. A dataflow maps it onto the array as (Sr, Sc, T): os (m, n, k), ws
  (k, n, m), is (k, m, n); Sr is folded over the array's rows, Sc over its columns, T is
  the number of cycles operands stream through one fold.
* Compute: every fold takes T + fill cycles, fill = rows + cols - 2 (os) or
  2*rows + cols - 2 (ws, is: the stationary tile is loaded first), and the last cycle is
  not counted: compute = F * (T + fill) - 1 with F = ceil(Sr/rows) * ceil(Sc/cols).
  This reproduces SCALE-Sim's "Total Cycles" exactly when bandwidth is unlimited (its
  CALC mode), for any array shape.
* Traffic (DRAM words): each scratchpad is double buffered, half of it ("active")
  feeding the array while the other half fills. os: A (m x k) is read once if it fits in
  its active half, else once per column fold; B (k x n) once if one column fold
  (k x cols) fits, else once per row fold; every output is written once. ws: B's tiles
  are stationary and read once; A as in os. is: A's tiles are stationary and read once;
  B is read once if it fits, else once per column fold. ws and is drain partial sums
  after every row fold (SCALE-Sim does not accumulate them on chip): m*n*ceil(Sr/rows)
  words written.
* Stalls: each scratchpad has its own DRAM interface of `dram_bandwidth` words/cycle
  (SCALE-Sim's model), and the array waits for the slowest: total = max(compute,
  read_end(ifmap), read_end(filter), write_end(ofmap)). A read operand's first active
  half is loaded before the layer (SCALE-Sim leaves that out of "Total Cycles"), the
  rest streams from the first cycle, and the compute that consumes the last half
  follows it: read_end = (W - S/2)/bw + compute * (S/2)/W. Outputs start draining once
  half the ofmap scratchpad is full, and at the end up to all of it (one half draining,
  one full) drains after the layer: write_end = compute * (S/2)/W + (W - S)/bw. (W:
  words moved, S: scratchpad words; no stall where W fits.) The write side is
  calibrated on SCALE-Sim's USER-mode runs (within 2.2 %); SCALE-Sim's read buffer
  over-fetches and counts each read stall twice (see benchmarks/calibrate_systolic.py),
  so read stalls follow the streaming model above rather than SCALE-Sim.

A flexible array (dataflow "flex") runs each product in one of the three dataflows or,
where os would re-read B per row fold, in osk, os with its loops turned (os_blocking).
fused_gemm_cost chooses: the fewest DRAM words within the accelerator's flex_slack (by
default FLEX_CYCLE_SLACK) of the fewest cycles; every figure above is then that
dataflow's. osk is not SCALE-Sim's: its passes are os passes, its traffic and extra
fills are counted as os_blocking describes. A flexible array's one-row products may also
hand columns to the vector unit (apsat/targets/vector_share.py).

Units: one word is one tensor element. Scratchpad sizes are given in kB of SCALE-Sim's
one-byte words, so 1 kB holds 1024 words (elements).
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from apsat.targets.accelerator import FLEX, FLEX_DATAFLOWS, OS_BLOCKED, Accelerator
from apsat.errors import ApsatError

HOST_MACS_PER_CYCLE = 1.0       # a scalar host core, in accelerator cycles
HOST_HANDOFF_CYCLES = 10_000.0  # synchronising with the host for one step


@dataclass(frozen=True)
class GemmCost:
    """What one (m x k) . (k x n) product costs on an accelerator (see the module
    docstring for the model). Cycle counts are integers; `total_cycles` is the one number
    a cost model wants.

    dataflow: the dataflow the product runs in (os, ws, is, or a flexible array's osk).
    sr, sc, t: the dataflow's mapping (spatial rows, spatial columns, temporal).
    row_folds, col_folds, folds: ceil(sr/rows), ceil(sc/cols), their product.
    compute_cycles: folds * (t + fill) - 1, the cycles with unlimited bandwidth.
    ifmap_reads, filter_reads, ofmap_writes: DRAM words moved for the m x k operand, the
        k x n operand and the m x n result (re-fetches and partial sums included).
    stall_cycles: cycles the array waits for DRAM; total_cycles = compute + stall.
    macs: m * k * n; utilization: macs / (rows * cols * total_cycles) (1 x 1 array,
        1 x 1 x 1 product: 0 cycles, utilization counted over one).
    """

    m: int
    k: int
    n: int
    dataflow: str
    sr: int
    sc: int
    t: int
    row_folds: int
    col_folds: int
    compute_cycles: int
    ifmap_reads: int
    filter_reads: int
    ofmap_writes: int
    stall_cycles: int
    total_cycles: int
    utilization: float

    @property
    def folds(self) -> int:
        """Number of folds (row_folds * col_folds)."""
        return self.row_folds * self.col_folds

    @property
    def macs(self) -> int:
        """Multiply-accumulates of the product (m * k * n)."""
        return self.m * self.k * self.n

    @property
    def dram_words(self) -> int:
        """All DRAM words moved: reads plus writes."""
        return self.ifmap_reads + self.filter_reads + self.ofmap_writes


def _mapping(dataflow: str, m: int, k: int, n: int) -> tuple[int, int, int]:
    if dataflow in ("os", OS_BLOCKED):
        return m, n, k
    if dataflow == "ws":
        return k, n, m
    return k, m, n                       # is


def _read_end(words: int, active: int, bw: float, compute: int) -> float:
    """When a read interface lets the array finish: the first active half is loaded
    before the layer starts, the remaining words stream at bw from its first cycle, and
    the compute that consumes the last active half follows the last word."""
    if words <= active or math.isinf(bw):
        return 0.0
    return (words - active) / bw + compute * active / words


def _write_end(words: int, capacity: int, bw: float, compute: int) -> float:
    """When the write interface lets the array finish: draining starts once the first
    half is full (after compute * half / words cycles at the average output rate), then
    runs at bw; at the end up to the whole scratchpad (one half draining, one full) may
    still be on chip, and it drains after the layer."""
    if words <= capacity or math.isinf(bw):
        return 0.0
    return compute * (capacity // 2) / words + (words - capacity) / bw


def gemm_cost(acc: Accelerator, m: int, k: int, n: int, dataflow: str | None = None) -> GemmCost:
    """The cost of an (m x k) . (k x n) product on `acc`, mapped as SCALE-Sim maps a conv
    layer with P = m output pixels, window k and n filters, in `dataflow` (os, ws or is;
    default: the accelerator's, or for a flexible array the one fused_gemm_cost picks
    with no epilogue).
    m, k, n are positive ints (numpy integers too; ApsatError otherwise). Pure and cheap
    (O(1)): call it per e-node."""
    for v, label in ((m, "m"), (k, "k"), (n, "n")):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
            raise ApsatError(f"gemm_cost: {label} must be a positive integer, got {v!r}")
    m, k, n = int(m), int(k), int(n)
    if dataflow is None and acc.dataflow == FLEX:
        return fused_gemm_cost(acc, m, k, n, 0)[0]
    df = dataflow or acc.dataflow
    if df not in FLEX_DATAFLOWS:
        raise ApsatError(f"gemm_cost: unknown dataflow {df!r} (use os, ws, is or osk)")
    if df == OS_BLOCKED and os_blocking(acc, m, k, n) is None:
        raise ApsatError(f"gemm_cost: osk needs B's column block ({k} x {min(acc.cols, n)}) "
                         f"to exceed a filter half; it is os here")
    return _gemm_cost(acc, m, k, n, df)


def os_blocking(acc: Accelerator, m: int, k: int, n: int) -> int | None:
    """The largest k-chunk of the osk loop order for an (m x k) . (k x n) product (the
    backend cuts k into as few near-equal chunks of at most this), or None where
    B's column block (k x cols) fits a filter half (os reads B once there). osk is os
    with the loops turned so that B is not re-read per row fold: per column fold, when
    the column block fits the whole filter scratchpad it is loaded there once (k: one
    chunk, no prefetch of the next), and the passes are os's; else per output block (the
    row folds whose outputs fill an ofmap half) each chunk of B that fits a filter half
    (and, unless all of A fits an ifmap half, whose A slice of `rows` rows fits an
    ifmap half) is loaded once and passes through all the block's row folds, which
    accumulate in the ofmap: every chunk's pass pays the fill."""
    nc = min(acc.cols, n)
    half_f = acc.filter_words // 2
    if k * nc <= half_f:
        return None
    if k * nc <= acc.filter_words:
        return k
    chunk = half_f // nc
    if m * k > acc.ifmap_words // 2:
        chunk = min(chunk, (acc.ifmap_words // 2) // min(acc.rows, m))
    return max(1, chunk)


def _osk_rows(acc: Accelerator, m: int, n: int) -> int:
    """Rows of an osk output block: the row folds whose outputs fill an ofmap half."""
    nc = min(acc.cols, n)
    rows = (acc.ofmap_words // 2) // nc
    return max(min(acc.rows, m), rows - rows % acc.rows)


def _gemm_cost(acc: Accelerator, m: int, k: int, n: int, df: str) -> GemmCost:
    rows, cols = acc.rows, acc.cols
    sr, sc, t = _mapping(df, m, k, n)
    fr, fc = -(-sr // rows), -(-sc // cols)
    compute = fr * fc * (t + acc.fill_cycles(df)) - 1

    a_act, b_act = acc.ifmap_words // 2, acc.filter_words // 2
    a_words, b_words = m * k, k * n
    stall = 0
    if df == OS_BLOCKED:
        # As os, but B is read once per column fold (resident) or once per output block.
        chunk = os_blocking(acc, m, k, n)
        a_reads = a_words if a_words <= a_act else a_words * fc
        c_writes = m * n
        if chunk >= k:
            b_reads = b_words
            stall = (fc - 1) * dram_cycles(acc, k * min(cols, n))   # no prefetch of the next
        else:
            chunks = -(-k // chunk)
            compute = fr * fc * (k + chunks * acc.fill_cycles(df)) - 1
            b_reads = b_words * -(-m // _osk_rows(acc, m, n))
    elif df == "os":
        # A (m x k) streams along the rows, re-read per column fold unless it all fits;
        # one column fold of B (k x cols) is reused across the row folds if it fits.
        a_reads = a_words if a_words <= a_act else a_words * fc
        b_reads = b_words if (b_words <= b_act or k * cols <= b_act) else b_words * fr
        c_writes = m * n
    elif df == "ws":
        # B's tiles are stationary (each read once); A (m x k) streams per column fold.
        a_reads = a_words if a_words <= a_act else a_words * fc
        b_reads = b_words
        c_writes = m * n * fr
    else:
        # is: A's tiles are stationary; B (k x n) streams per column fold.
        a_reads = a_words
        b_reads = b_words if b_words <= b_act else b_words * fc
        c_writes = m * n * fr

    bw = acc.dram_bandwidth
    end = max(compute,
              _read_end(a_reads, a_act, bw, compute),
              _read_end(b_reads, b_act, bw, compute),
              _write_end(c_writes, acc.ofmap_words, bw, compute))
    total = max(compute, math.ceil(end)) + stall
    return GemmCost(m, k, n, df, sr, sc, t, fr, fc, compute, a_reads, b_reads, c_writes,
                    total - compute, total, m * k * n / (rows * cols * max(total, 1)))


def closed_form_cycles(acc: Accelerator, m: int, k: int, n: int) -> int:
    """SCALE-Sim's total cycles with unlimited bandwidth (its CALC mode): F * (T + fill)
    - 1 (see the module docstring). Equals gemm_cost(...).compute_cycles."""
    return gemm_cost(acc, m, k, n).compute_cycles


def dram_cycles(acc: Accelerator, words: int) -> int:
    """Cycles one DRAM interface needs to move `words` words (ceil(words / bandwidth));
    0 for no words or unlimited bandwidth."""
    if words <= 0 or math.isinf(acc.dram_bandwidth):
        return 0
    return math.ceil(words / acc.dram_bandwidth)


def vector_cycles(acc: Accelerator, elements: int, ops_per_element: float = 1) -> int:
    """Cycles of the vector unit for `elements` elements at `ops_per_element` operations
    each: ceil(elements * ops_per_element / vector_lanes); 0 for no work. DRAM traffic is
    not included (add dram_cycles where operands are not on chip)."""
    work = elements * ops_per_element
    return 0 if work <= 0 else math.ceil(work / acc.vector_lanes)


def fused_gemm_cost(acc: Accelerator, m: int, k: int, n: int, epilogue_ops: float) -> tuple[GemmCost, int]:
    """(the product's GemmCost, total cycles) for an (m x k) . (k x n) product followed
    by a vector epilogue of `epilogue_ops` operations per output (bias, activation, a
    fused element-wise operand). The epilogue runs block by block as outputs drain, so it
    overlaps the passes that produce final values (all of them under os; under ws and is
    only the last row fold's, the earlier ones drain partial sums) and adds what it
    cannot hide. A flexible array takes, among the dataflows within acc.flex_slack of
    the fewest total cycles so counted, the one of fewest DRAM words (ties: fewer
    cycles, then os, ws, is); the cost model and the lowering both call this."""
    options = []
    for df in acc.dataflows:
        if df == OS_BLOCKED and os_blocking(acc, m, k, n) is None:
            continue
        c = gemm_cost(acc, m, k, n, df)
        vec = vector_cycles(acc, m * n, epilogue_ops) if epilogue_ops > 0 else 0
        # os and osk finish output blocks all along; ws and is only in the last row fold
        window = c.compute_cycles if df in ("os", OS_BLOCKED) else c.compute_cycles // c.row_folds
        options.append((c, c.total_cycles + max(0, vec - window)))
    fastest = min(total for _, total in options)
    near = [o for o in options if o[1] <= fastest * (1 + acc.flex_slack)]
    return min(near, key=lambda o: (o[0].dram_words, o[1]))
