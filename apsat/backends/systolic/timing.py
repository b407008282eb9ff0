"""Cycle and traffic model of a Stream.

Per-instruction time comes from the analytical model in apsat/targets/systolic.py, the
one the extractor's cost model uses (nothing is re-derived here):

  MATMUL   gemm_cost(acc, m, k, n).compute_cycles + 1 for a pass that pays the fold's
           fill; a continuation chunk of a fold saves Accelerator.fill_cycles(). (The +1:
           gemm_cost, like SCALE-Sim, leaves a layer's last cycle uncounted; a pass
           occupies the array for all of its cycles, so one whole GEMM's array time is
           gemm_cost's compute_cycles + 1.)
  PRELOAD  0: the stationary load is part of the fold's fill in that model.
  LOAD, STORE  dram_cycles(acc, words, width) on the DRAM interface of the scratchpad
           involved (each scratchpad has its own, SCALE-Sim's model); width is
           operand_bytes, or accumulator_bytes for the stores of a ws/is product with
           more than one row fold and its reloads of them (Accelerator.output_bytes,
           as the analytical model counts them).
  COPY     max of dram_cycles of its reads (ifmap interface) and writes (ofmap interface).
  VEC      vector_cycles(acc, elements, ops per element), the operator's arithmetic from
           apsat.lang.arithmetic (the registry's figures); dot and dotacc
           VECTOR_OPS_PER_MAC a MAC (targets.pair_dot).
  HOST     the cost model's host figures: a hand-off, one MAC a cycle for a dot-product,
           and its DRAM traffic.

Scheduling: each unit (the three DMA interfaces, the array, the vector unit, the host)
runs its instructions in stream order; an instruction starts when its unit is free and
its data dependences allow, found from the scratchpad word ranges and DRAM buffers each
instruction reads and writes (read after write, write after read, write after write).
A block is usable when its LOAD has finished; a STORE starts when all of its block has
been computed and its words leave evenly over its duration, so a LOAD or a pass may
overwrite the block right behind it. With the lowering's double buffering (a block per
scratchpad half) this reproduces the analytical model's streaming: the first blocks are
the prefetch, each later block loads while the previous one computes, outputs drain
once a half is full.
"""
from __future__ import annotations

import math

from apsat.backends.systolic.isa import ARRAY, DOT_MODES, Copy, Gather, Host, Load, Matmul, Preload, Store, Stream, Vec
from apsat.backends.systolic.vector import operator_term
from apsat.lang.arithmetic import operator_flops
from apsat.targets.pair_dot import VECTOR_OPS_PER_MAC
from apsat.targets.accelerator import OS_BLOCKED
from apsat.targets.systolic import HOST_HANDOFF_CYCLES, HOST_MACS_PER_CYCLE, dram_cycles, gemm_cost, vector_cycles

UNITS = ("dma.ifmap", "dma.filter", "dma.ofmap", "array", "vector", "host")
_KEEP = 64          # events kept per resource (older ones are long finished)


def pass_cycles(acc, ins: Matmul) -> int:
    """Cycles the array spends on one MATMUL pass in its dataflow (see the module
    docstring)."""
    df = ins.dataflow or acc.dataflow
    if df == OS_BLOCKED:        # osk's passes are os passes; only their order differs
        df = "os"
    c = gemm_cost(acc, ins.m, ins.k, ins.n, df).compute_cycles + 1
    return c if ins.fill else c - acc.fill_cycles(df)


def vec_cycles(acc, ins: Vec) -> int:
    """Cycles of the vector unit for one VEC: the cost model's arithmetic per element."""
    out = ins.dst.region.size
    if ins.mode == "bias":
        return vector_cycles(acc, out, 1)
    if ins.mode in DOT_MODES:
        return vector_cycles(acc, dot_macs(ins), VECTOR_OPS_PER_MAC)
    work = operator_flops(operator_term(ins.op), sum(s.region.size for s in ins.srcs), out)
    return vector_cycles(acc, math.ceil(work), 1)


def dot_macs(ins: Vec) -> int:
    """MACs of a VEC dot or dotacc: its second source's elements (the first may be one
    row read against each of its rows)."""
    return ins.srcs[1].region.size


def _whole(name: str) -> tuple:
    return (name, 0, 1)


def _dram(stream: Stream, buf: str) -> tuple:
    """All of DRAM buffer `buf`."""
    return ("dram:" + buf, 0, max(stream.buffers[buf].size, 1))


def _dram_rows(buf: str, cols: int, region) -> tuple:
    """The words of `region` of buffer `buf` read as a row-major matrix `cols` wide: from
    its first word to its last (the columns between its rows included)."""
    return ("dram:" + buf, region.r0 * cols + region.c0, (region.r1 - 1) * cols + region.c1)


def _dram_view(stream: Stream, view: str, region) -> tuple:
    """The DRAM words a LOAD of `region` of `view` touches: exact for a view that only
    reshapes its buffer (a dense matrix), else all of the buffer."""
    v = stream.views[view]
    if len(v.dims) == 2 and all(step[0] == "reshape" for step in v.steps):
        return _dram_rows(v.base, v.dims[1], region)
    return _dram(stream, v.base)


def accumulator_buffers(stream: Stream, seq) -> set[str]:
    """The DRAM buffers that hold accumulators: those the stores of a ws/is product with
    more than one row fold write (partial sums drain there and the last fold adds to
    them or reloads them)."""
    out = set()
    for ins in seq:
        if isinstance(ins, Store):
            info = stream.groups.get(ins.tag)
            if info is not None and info.kind == "gemm":
                df = info.dataflow or stream.accel.dataflow
                if stream.accel.output_bytes(df, -(-info.k // stream.accel.rows)) > stream.accel.operand_bytes:
                    out.add(ins.dst)
    return out


def element_bytes(stream: Stream, ins, accumulators: set[str]) -> int:
    """Bytes a DRAM word of `ins` moves: accumulator_bytes for a STORE into, or a LOAD
    into the ofmap from, one of `accumulators` (accumulator_buffers), else
    operand_bytes."""
    acc = stream.accel
    if isinstance(ins, Store) and ins.dst in accumulators:
        return acc.accumulator_width
    if isinstance(ins, Load) and ins.dst.sp == "ofmap" and stream.views[ins.src].base in accumulators:
        return acc.accumulator_width
    return acc.operand_bytes


def footprint_of(stream: Stream, ins, width: int | None = None):
    """(units, duration, reads, writes, dram reads {buffer: words}, dram writes
    {buffer: words}) of one instruction. reads/writes: (resource, lo, hi) with
    resources "sp:<scratchpad>" and "dram:<buffer>" (word ranges: a STORE's and a dense
    LOAD's span of rows, else the whole buffer) and "array". `width`: bytes a DRAM word
    moves (element_bytes; default operand_bytes)."""
    acc = stream.accel
    kind = type(ins)
    if kind is Load:
        base = stream.views[ins.src].base
        lo = ins.dst.offset
        return ((f"dma.{ins.dst.sp}",), dram_cycles(acc, ins.words, width),
                [_dram_view(stream, ins.src, ins.region)],
                [("sp:" + ins.dst.sp, lo, lo + ins.dst.words)], {base: ins.words}, {})
    if kind is Store:
        lo = ins.src.offset
        words = ins.region.size
        return ((f"dma.{ins.src.sp}",), dram_cycles(acc, words, width), [("sp:" + ins.src.sp, lo, lo + ins.src.words)],
                [_dram_rows(ins.dst, ins.shape[1], ins.region)], {}, {ins.dst: words})
    if kind is Copy:
        base = stream.views[ins.src].base
        written = stream.views[ins.src].size
        return (("dma.ifmap", "dma.ofmap"), max(dram_cycles(acc, ins.words), dram_cycles(acc, written)),
                [_dram(stream, base)], [_dram(stream, ins.dst)],
                {base: ins.words}, {ins.dst: written})
    if kind is Gather:
        bases = [stream.views[v].base for v in (ins.src, ins.index)]
        written = stream.buffers[ins.dst].size
        return (("dma.ifmap", "dma.ofmap"), max(dram_cycles(acc, ins.words), dram_cycles(acc, written)),
                [_dram(stream, b) for b in bases], [_dram(stream, ins.dst)],
                {b: ins.words for b in bases[:1]}, {ins.dst: written})
    if kind is Preload:
        return (("array",), 0, [_operand(ins.src)], [_whole(ARRAY)], {}, {})
    if kind is Matmul:
        reads = [_operand(x) for x in (ins.a, ins.b)]
        if ins.init is not None:
            reads.append(_operand(ins.init))
        if ins.accumulate:
            reads.append(_operand(ins.dst))
        return (("array",), pass_cycles(acc, ins), reads, [_operand(ins.dst)], {}, {})
    if kind is Vec:
        reads = [_operand(s) for s in ins.srcs] + ([_operand(ins.dst)] if ins.mode == "dotacc" else [])
        return (("vector",), vec_cycles(acc, ins), reads, [_operand(ins.dst)], {}, {})
    if kind is Host:
        from apsat.backends.systolic.lower import host_program

        bufs = host_program(stream, ins).tensor_names()
        written = stream.buffers[ins.dst].size
        cycles = HOST_HANDOFF_CYCLES + ins.macs / HOST_MACS_PER_CYCLE + dram_cycles(acc, ins.reads + written)
        return (("host",), int(math.ceil(cycles)), [_dram(stream, b) for b in bufs],
                [_dram(stream, ins.dst)],
                {b: stream.buffers[b].size for b in bufs}, {ins.dst: written})
    raise TypeError(f"unknown instruction {ins!r}")


def _operand(op) -> tuple:
    if op == ARRAY:
        return _whole(ARRAY)
    lo, hi = op.word_range()
    return ("sp:" + op.slot.sp, lo, hi)


class _Event:
    __slots__ = ("lo", "hi", "start", "end", "streaming")

    def __init__(self, lo, hi, start, end, streaming):
        self.lo, self.hi, self.start, self.end, self.streaming = lo, hi, start, end, streaming

    def at(self, x: float) -> float:
        """When this transfer has reached word x of its range (its end if not streaming)."""
        if not self.streaming or self.hi <= self.lo:
            return self.end
        return self.start + (min(x, self.hi) - self.lo) / (self.hi - self.lo) * (self.end - self.start)


def _bound(ev: _Event, lo: int, hi: int, duration: int, streaming: bool) -> float:
    """Earliest start for an access of [lo, hi) (taking `duration`, streaming or not)
    that must follow event ev on the overlap: at every word x of the overlap the
    access reaches x no earlier than ev does."""
    a, b = max(lo, ev.lo), min(hi, ev.hi)
    if not streaming:
        return ev.at(b)
    span = max(hi - lo, 1)
    return max(ev.at(x) - (x - lo) / span * duration for x in (a, b))


class Schedule:
    """List scheduling of a sequence of instructions (see the module docstring)."""

    def __init__(self):
        self.free = {u: 0.0 for u in UNITS}
        self.busy = {u: 0.0 for u in UNITS}
        self.writes: dict[str, list] = {}
        self.reads: dict[str, list] = {}

    def place(self, units, duration, reads, writes, streaming, overwrite=None) -> tuple[float, float]:
        """Schedule one instruction; returns (start, end). It waits until every word it
        reads has been written (as a streaming transfer reaches it); `overwrite`: it
        overwrites its destination progressively, so it may start while earlier readers
        still drain it, word for word behind them (default: `streaming`); `streaming`:
        its own transfer progresses evenly over its duration (a LOAD's words arrive, a
        STORE's words leave, progressively)."""
        overwrite = streaming if overwrite is None else overwrite
        start = max(self.free[u] for u in units)
        for res, lo, hi in reads:
            for ev in self.writes.get(res, ()):
                if ev.lo < hi and lo < ev.hi:
                    start = max(start, ev.at(min(hi, ev.hi)))
        for res, lo, hi in writes:
            for ev in self.reads.get(res, []) + self.writes.get(res, []):
                if ev.lo < hi and lo < ev.hi:
                    start = max(start, _bound(ev, lo, hi, duration, overwrite))
        end = start + duration
        for u in units:
            self.free[u] = end
            self.busy[u] += duration
        for res, lo, hi in reads:
            self.reads.setdefault(res, []).append(_Event(lo, hi, start, end, streaming))
            del self.reads[res][:-_KEEP]
        for res, lo, hi in writes:
            # what this write covers is superseded: later accesses order against it
            self.reads[res] = [e for e in self.reads.get(res, []) if not (lo <= e.lo and e.hi <= hi)]
            ws = [e for e in self.writes.get(res, []) if not (lo <= e.lo and e.hi <= hi)]
            ws.append(_Event(lo, hi, start, end, streaming))
            self.writes[res] = ws[-_KEEP:]
        return start, end


def _run(stream: Stream, seq, groups: dict, tensors: dict, section: str) -> dict:
    sched = Schedule()
    reads_total = writes_total = read_bytes = write_bytes = 0
    macs = host_macs = vector_macs = 0
    accumulators = accumulator_buffers(stream, seq)
    for ins in seq:
        width = element_bytes(stream, ins, accumulators)
        units, duration, reads, writes, dr, dw = footprint_of(stream, ins, width)
        # A block is usable once its LOAD has finished (double buffering: the next one
        # loads meanwhile); a STORE frees its block's words as they leave; a LOAD or a
        # pass may overwrite a block behind the STORE draining it, word for word.
        start, end = sched.place(units, duration, reads, writes, isinstance(ins, Store),
                                 isinstance(ins, (Load, Matmul)))
        g = groups.setdefault(ins.tag, {"start": start, "end": end, "array_start": None,
                                        "array_end": None, "macs": 0, "dram_reads": 0,
                                        "dram_writes": 0, "section": section})
        g["start"], g["end"] = min(g["start"], start), max(g["end"], end)
        if isinstance(ins, Matmul):
            useful = ins.m * ins.k * ins.n // ins.blocks     # a block-diagonal a: the rest are zeros
            macs += useful
            g["macs"] += useful
            g["array_start"] = start if g["array_start"] is None else min(g["array_start"], start)
            g["array_end"] = end if g["array_end"] is None else max(g["array_end"], end)
        elif isinstance(ins, Host):
            host_macs += ins.macs
            g["macs"] += ins.macs
        elif isinstance(ins, Vec) and ins.mode in DOT_MODES:
            vector_macs += dot_macs(ins)
            g["macs"] += dot_macs(ins)
        for b, w in dr.items():
            tensors.setdefault(b, [0, 0])[0] += w
            reads_total += w
            read_bytes += w * width
            g["dram_reads"] += w
        for b, w in dw.items():
            tensors.setdefault(b, [0, 0])[1] += w
            writes_total += w
            write_bytes += w * width
            g["dram_writes"] += w
    total = max(sched.free.values())
    return {"cycles": int(math.ceil(total)), "busy": {u: int(math.ceil(b)) for u, b in sched.busy.items()},
            "macs": macs, "host_macs": host_macs, "vector_macs": vector_macs, "dram_reads": reads_total, "dram_writes": writes_total,
            "dram_bytes": read_bytes + write_bytes}


def cycles(stream: Stream) -> dict:
    """The cycle and traffic report of `stream` (main section per inference; init, run
    once at load time, reported apart):

      total_cycles, init_cycles; busy (cycles per unit); macs (on the array),
      host_macs and vector_macs (dot-products on the host and on the vector unit);
      compute_bound_cycles = (macs + host_macs + vector_macs) / (rows * cols);
      utilization = compute_bound_cycles / total_cycles (against the compute bound);
      array_utilization = macs / (rows * cols * total_cycles); array_efficiency = macs /
      (rows * cols * busy array cycles): the utilisation the array's own passes allow
      (pipeline fills, folds narrower than the array), the ceiling with DMA, vector and
      host work perfectly hidden;
      dram {reads, writes, total (words), bytes (what they take: element_bytes),
      per_tensor {buffer: {reads, writes, tensor}}};
      groups [{tag, kind, label, cycles, ...}] per lowered program node, GEMMs with
      gemm_cost's figures for their array part beside the stream's (array_span: first
      pass start to last pass end; the first pass waits for its operand blocks, the
      prefetch SCALE-Sim counts outside its total cycles; vector_cols: columns run on
      the vector unit); host_steps; instructions (per opcode).
    """
    acc = stream.accel
    groups: dict[str, dict] = {}
    per_tensor: dict[str, list] = {}
    init = _run(stream, stream.init, groups, {}, "init")
    main = _run(stream, stream.main, groups, per_tensor, "main")
    peak = acc.rows * acc.cols
    total = main["cycles"]
    bound = (main["macs"] + main["host_macs"] + main["vector_macs"]) / peak
    return {
        "accelerator": acc.name, "rows": acc.rows, "cols": acc.cols, "dataflow": acc.dataflow,
        "total_cycles": total, "init_cycles": init["cycles"],
        "busy": main["busy"], "macs": main["macs"], "host_macs": main["host_macs"],
        "vector_macs": main["vector_macs"],
        "compute_bound_cycles": bound,
        "utilization": bound / total if total else 0.0,
        "array_utilization": main["macs"] / (peak * total) if total else 0.0,
        "array_efficiency": main["macs"] / (peak * main["busy"]["array"]) if main["busy"]["array"] else 0.0,
        "dram": {"reads": main["dram_reads"], "writes": main["dram_writes"],
                 "total": main["dram_reads"] + main["dram_writes"], "bytes": main["dram_bytes"],
                 "init_reads": init["dram_reads"], "init_writes": init["dram_writes"],
                 "per_tensor": {b: {"reads": r, "writes": w, "tensor": stream.buffers[b].tensor}
                                for b, (r, w) in per_tensor.items()}},
        "groups": [_group_row(stream, tag, g) for tag, g in groups.items()],
        "host_steps": stream.host_steps(),
        "instructions": stream.counts(),
    }


def _group_row(stream: Stream, tag: str, g: dict) -> dict:
    """The report's row for one lowered program node (`g`: its figures from _run), a
    GEMM's with gemm_cost's figures for its array part beside the stream's."""
    info = stream.groups.get(tag)
    row = {"tag": tag, "kind": info.kind if info else "", "label": info.label if info else "",
           "section": g["section"], "cycles": int(math.ceil(g["end"] - g["start"])),
           "macs": g["macs"], "dram_reads": g["dram_reads"], "dram_writes": g["dram_writes"]}
    if info is not None and info.kind == "gemm":
        # the array's part of the product (a one-row product's last columns may run on
        # the vector unit: vector_cols)
        gc = gemm_cost(stream.accel, info.m, info.k, info.n - info.vector_cols, info.dataflow or None)
        row.update(m=info.m, k=info.k, n=info.n, a_mode=info.a_mode, dataflow=gc.dataflow,
                   vector_cols=info.vector_cols,
                   array_span=int(math.ceil(g["array_end"] - g["array_start"])),
                   gemm_cost_total=gc.total_cycles, gemm_cost_compute=gc.compute_cycles,
                   gemm_cost_dram=gc.dram_words)
    return row
