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
* Stalls: each scratchpad has its own DRAM interface of `dram_bandwidth` bytes/cycle
  (SCALE-Sim's model, in words there), and the array waits for the slowest: total = max(compute,
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

The attention atom: attention_plan (whether its scores stay on chip, in what blocks) and
attention_cycles (what that costs), called by the cost model and the backend alike.

Units (apsat/targets/accelerator.py): a word is one element; traffic is in words and in
bytes (`GemmCost.dram_bytes`: Accelerator.operand_bytes and output_bytes a word); the
scratchpads' words follow from the widths; bandwidth is bytes per cycle.
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
    dram_bytes: the bytes those words take (see the module docstring's units).
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
    dram_bytes: int

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

    c_width = acc.output_bytes(df, fr)      # words a cycle: bytes a cycle over their width
    a_bw, c_bw = acc.dram_bandwidth / acc.operand_bytes, acc.dram_bandwidth / c_width
    end = max(compute,
              _read_end(a_reads, a_act, a_bw, compute),
              _read_end(b_reads, b_act, a_bw, compute),
              _write_end(c_writes, acc.ofmap_words, c_bw, compute))
    total = max(compute, math.ceil(end)) + stall
    return GemmCost(m, k, n, df, sr, sc, t, fr, fc, compute, a_reads, b_reads, c_writes,
                    total - compute, total, m * k * n / (rows * cols * max(total, 1)),
                    (a_reads + b_reads) * acc.operand_bytes + c_writes * c_width)



def closed_form_cycles(acc: Accelerator, m: int, k: int, n: int) -> int:
    """SCALE-Sim's total cycles with unlimited bandwidth (its CALC mode): F * (T + fill)
    - 1 (see the module docstring). Equals gemm_cost(...).compute_cycles."""
    return gemm_cost(acc, m, k, n).compute_cycles


def dram_cycles(acc: Accelerator, words: int, element_bytes: int | None = None) -> int:
    """Cycles one DRAM interface needs to move `words` words of `element_bytes` bytes
    (default acc.operand_bytes): ceil(words * element_bytes / bandwidth); 0 for no words
    or unlimited bandwidth."""
    if words <= 0 or math.isinf(acc.dram_bandwidth):
        return 0
    return math.ceil(words * (element_bytes or acc.operand_bytes) / acc.dram_bandwidth)


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


# ---- the attention atom (apsat/backends/systolic/attention.py runs it this way) -------------

ATTENTION_SPILL_WORDS = 4   # DRAM words a spilled score moves at least: stored, read and
                            # written back by the softmax, read by P.V (the unfused chain)


@dataclass(frozen=True)
class AttentionPlan:
    """How one head of `(attention SAFE qk bias v)` runs on chip: blocks of `rows` query
    rows; a block's scores, `width` words a key (3 with SAFE: the select's is-nan and
    zero columns beside them), and its output rows fill an ofmap half, its queries an
    ifmap half; K^T and V of a head are `resident` in a filter half for all its blocks,
    else streamed per block in `key_cols`-column and `value_rows`-row chunks. The two
    products run in `qk_dataflow` and `pv_dataflow`. rows 0: the scores stay off chip
    (the atom spills to DRAM like the unfused chain), `reason` says why."""

    rows: int
    width: int
    resident: bool = False
    key_cols: int = 0
    value_rows: int = 0
    qk_dataflow: str = ""
    pv_dataflow: str = ""
    reason: str = ""


def attention_heads(iq: tuple, pre_k: tuple, pre_v: tuple) -> tuple[int, int, tuple]:
    """(heads, rows a head, merged axes) of an attention whose scores iterate over `iq`
    (I.., m, n), whose keys vary along `pre_k`'s axes of size > 1 and values along
    `pre_v`'s (their iterated dims before the broadcast): the leading axes just before m
    along which neither varies (grouped-query attention's query groups) are merged into
    a head's rows, so its K and V serve them all."""
    merged = []
    for a in reversed(range(len(iq) - 2)):
        if iq[a] != 1 and (pre_k[a] != 1 or pre_v[a] != 1):
            break
        merged.append(a)
    rows = iq[-2] * math.prod(iq[a] for a in merged)
    return math.prod(iq[:-1]) // rows, rows, tuple(sorted(merged))


def attention_plan(acc: Accelerator, m: int, d: int, n: int, e: int, safe: bool) -> AttentionPlan:
    """The on-chip plan of a head of m queries and n keys of width d, values of width e
    (see AttentionPlan). The scores fit when one query row's scores (width * n words)
    and output (e) fit an ofmap half, its query (d) an ifmap half, and a column of K^T
    (d) and a row of V (e) a filter half; with more rows than the array's in a block,
    blocks are whole row folds. When K^T and V do not fit a filter half together they
    are re-read per block, which is taken only while that moves no more than the
    scores' DRAM round trip would (ATTENTION_SPILL_WORDS a score). The cost model and
    the lowering both call this, so they agree on fit and spill."""
    width = 3 if safe else 1
    ho, hi, hf = acc.ofmap_words // 2, acc.ifmap_words // 2, acc.filter_words // 2
    rows = min(m, ho // (width * n + e), hi // d)
    if rows < m and rows >= acc.rows:
        rows -= rows % acc.rows
    if rows < 1 or d > hf or e > hf:
        return AttentionPlan(0, width, reason=f"a query row's {width * n} scores and {e} outputs do not fit "
                                              f"half of the ofmap ({ho} words), or its {d} query words, a K^T "
                                              "column or a V row half of their scratchpad")
    resident = n * (d + e) <= hf
    key_cols, value_rows = (n, n) if resident else (min(n, hf // d), min(n, hf // e))
    if key_cols < n and key_cols >= acc.cols:
        key_cols -= key_cols % acc.cols
    blocks = -(-m // rows)
    if not resident and (blocks - 1) * n * (d + e) > ATTENTION_SPILL_WORDS * m * n:
        return AttentionPlan(0, width, reason=f"K and V re-read for each of {blocks} blocks move more than "
                                              "the scores' DRAM round trip")
    return AttentionPlan(rows, width, resident, key_cols, value_rows,
                         _onchip_dataflow(acc, rows, d, n), _onchip_dataflow(acc, rows, n, e))


def _onchip_dataflow(acc: Accelerator, m: int, k: int, n: int) -> str:
    """A product whose operands are on chip: the accelerator's dataflow, or on a flexible
    array the one of fewest compute cycles (os, ws, is on ties; DRAM plays no part)."""
    if acc.dataflow != FLEX:
        return acc.dataflow
    return min(("os", "ws", "is"), key=lambda df: gemm_cost(acc, m, k, n, df).compute_cycles)


def _pass_cycles(acc: Accelerator, m: int, k: int, n: int, df: str) -> int:
    """Array cycles of an on-chip product run fold by fold: every fold pays its fill (the
    stream's MATMUL passes, backends/systolic/timing.pass_cycles)."""
    return gemm_cost(acc, m, k, n, df).compute_cycles + 1


def attention_cycles(acc: Accelerator, plan: AttentionPlan, heads: int, m: int, d: int, n: int, e: int,
                     q_words: float, kv_words: float, bias_words: float, vector_ops: float) -> int:
    """Cycles of `heads` heads run on chip by `plan` (rows > 0): the array's passes for
    both products, the vector unit's `vector_ops` operations a score (softmax, SAFE's
    select), and each DMA interface's words (ifmap: the queries; filter: K and V, once
    a head when resident, else once a block; ofmap: the bias and the outputs), which
    overlap one another; one block's vector work is exposed (the array waits for the
    first softmax before its first P.V)."""
    blocks = [(r0, min(m, r0 + plan.rows)) for r0 in range(0, m, plan.rows)]
    k_chunks = [(c, min(n, c + plan.key_cols)) for c in range(0, n, plan.key_cols)]
    v_chunks = [(c, min(n, c + plan.value_rows)) for c in range(0, n, plan.value_rows)]
    array = heads * sum(sum(_pass_cycles(acc, r1 - r0, d, c1 - c0, plan.qk_dataflow) for c0, c1 in k_chunks)
                        + sum(_pass_cycles(acc, r1 - r0, c1 - c0, e, plan.pv_dataflow) for c0, c1 in v_chunks)
                        for r0, r1 in blocks)
    vector = heads * sum(vector_cycles(acc, (r1 - r0) * n, vector_ops) for r0, r1 in blocks)
    kv = kv_words * (1 if plan.resident else len(blocks))
    dma = max(dram_cycles(acc, math.ceil(w)) for w in (q_words, kv, bias_words + heads * m * e))
    return max(array, vector, dma) + vector_cycles(acc, plan.rows * n, vector_ops)
