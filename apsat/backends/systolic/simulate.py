"""Functional simulator: executes a Stream instruction by instruction with numpy.

DRAM is a dict of buffers, each scratchpad a dict of blocks by word offset, the array one
stationary block. Every instruction reads only what earlier instructions put where it
reads: a MATMUL takes its operands from scratchpad blocks that LOADs wrote (or from the
PRELOADed array), so a lowering that forgot a load, reused a half too early or stored to
the wrong region produces a wrong number or a SimulationError, never the right answer
by accident. Arithmetic is float32 (operators through apsat.lang.semantics,
the reference interpreter's own semantics); sums over k-chunks and partial sums drained
per row fold are added in a different order than one matmul, so results agree with the
reference to float32 rounding, not bit for bit (see tests for the tolerances).

Element widths (Accelerator.operand_bytes, accumulator_bytes) reach the simulator as the
scratchpads' capacities in words, which every block is checked against: a 2-byte stream
has half the words per scratchpad and tiles to match. Values are not rounded to the
width: a width is bytes an element takes, not a number format (2 bytes may be float16,
bfloat16 or int16, 1 byte int8 or an 8-bit float), so the simulator keeps float32 at
every width, as it always did at 1 byte, and checks the lowering, not the number format.
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np

from apsat.lang.semantics import gather_indices
from apsat.lang.semantics import LazyPair, apply_compute
from apsat.backends.systolic import views as V
from apsat.backends.systolic.isa import (ARRAY, DOT_MODES, SCRATCHPADS, Copy, Gather, Host, Load, Matmul, Operand,
                                         Preload, Slot, Store, Stream, Vec)
from apsat.backends.systolic.vector import parse_op
from apsat.errors import ApsatError

_CACHE_ENTRIES = 4      # matrix forms of views kept (an im2col matrix can be 100+ MB)


class SimulationError(ApsatError):
    """The stream cannot be executed: a missing or mis-shaped tensor, or an instruction
    that reads what no instruction wrote (a lowering bug)."""


class Machine:
    """The accelerator's state while a stream runs (see the module docstring)."""

    def __init__(self, stream: Stream, tensors: dict):
        self.s = stream
        self.dram: dict[str, np.ndarray] = {}
        self.version: dict[str, int] = {}
        for name, b in stream.buffers.items():
            if b.kind in ("input", "weight"):
                if b.tensor not in tensors:
                    raise SimulationError(f"simulate: no value given for tensor {b.tensor!r} "
                                          f"(expected shape {b.dims})")
                x = np.asarray(tensors[b.tensor])
                if x.shape != b.dims:
                    raise SimulationError(f"simulate: tensor {b.tensor!r} has shape {x.shape}, "
                                          f"the stream expects {b.dims}")
                # the language carries integers and booleans as float32 (apsat.frontend.model)
                self.dram[name] = x if x.dtype == np.float32 else x.astype(np.float32)
            elif b.kind == "const":
                self.dram[name] = np.full(b.dims, b.value, dtype=np.float32)
        self.sp: dict[str, dict[int, tuple]] = {sp: {} for sp in SCRATCHPADS}
        self.capacity = {sp: getattr(stream.accel, f"{sp}_words") for sp in SCRATCHPADS}
        self.array = None
        self._loads = 0
        self._cache: OrderedDict = OrderedDict()
        self._hosts: dict[int, object] = {}

    # ---- memories ---------------------------------------------------------------------------

    def buffer(self, name: str) -> np.ndarray:
        """A DRAM buffer (temporaries start as zeros, so partial sums can accumulate)."""
        if name not in self.dram:
            self.dram[name] = np.zeros(self.s.buffers[name].dims, dtype=np.float32)
        return self.dram[name]

    def _written(self, name: str) -> None:
        self.version[name] = self.version.get(name, 0) + 1

    def view_value(self, name: str) -> np.ndarray:
        """The array view `name` gives over its base buffer now."""
        v = self.s.views[name]
        if v.base not in self.dram:
            raise SimulationError(f"simulate: view {name} reads buffer {v.base}, which no "
                                  "instruction has written")
        return V.apply(self.dram[v.base], v.steps)

    def matrix(self, name: str) -> np.ndarray:
        """view_value, cached while its base buffer is unchanged (LOADs take many tiles
        of one im2col matrix, which numpy must copy to reshape)."""
        key = (name, self.version.get(self.s.views[name].base, 0))
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        value = self.view_value(name)
        self._cache[key] = value
        if len(self._cache) > _CACHE_ENTRIES:
            self._cache.popitem(last=False)
        return value

    def put(self, slot: Slot, block: np.ndarray) -> None:
        """Hold `block` at the slot; blocks it overlaps are gone (SimulationError outside
        the scratchpad)."""
        end = slot.offset + slot.words
        if slot.offset < 0 or end > self.capacity[slot.sp]:
            raise SimulationError(f"simulate: block {slot.text()} lies outside the {slot.sp} "
                                  f"scratchpad ({self.capacity[slot.sp]} words)")
        pad = self.sp[slot.sp]
        for off in [o for o, (s, _, _) in pad.items() if o < end and slot.offset < o + s.words]:
            del pad[off]
        self._loads += 1
        pad[slot.offset] = (slot, block, self._loads)

    def get(self, slot: Slot) -> tuple[np.ndarray, int]:
        """(block, load id) held exactly at `slot`; SimulationError when nothing is."""
        found = self.sp[slot.sp].get(slot.offset)
        if found is None or found[0] != slot:
            raise SimulationError(f"simulate: nothing holds block {slot.text()}")
        return found[1], found[2]

    def operand(self, op) -> np.ndarray:
        """The block an on-chip operand reads (ARRAY: the stationary block)."""
        if op == ARRAY:
            if self.array is None:
                raise SimulationError("simulate: MATMUL reads the array before any PRELOAD")
            return self.array
        block, load_id = self.get(op.slot)
        r = op.region
        if op.view is not None:        # a resident input, windows formed on chip
            key = (("resident", load_id), op.view)
            if key not in self._cache:
                v = self.s.views[op.view]
                self._cache[key] = V.apply(block.reshape(self.s.buffers[v.base].dims), v.steps)
                if len(self._cache) > _CACHE_ENTRIES:
                    self._cache.popitem(last=False)
            block = self._cache[key]
        return block[r.r0:r.r1, r.c0:r.c1]

    # ---- instructions -----------------------------------------------------------------------

    def step(self, ins) -> None:
        """Execute one instruction (see apsat.backends.systolic.isa for each kind)."""
        kind = type(ins)
        if kind is Load:
            r = ins.region
            block = np.array(self.matrix(ins.src)[r.r0:r.r1, r.c0:r.c1], dtype=np.float32)
            if block.shape != (ins.dst.rows, ins.dst.cols):
                raise SimulationError(f"simulate: LOAD of {block.shape} into {ins.dst.text()}")
            self.put(ins.dst, block)
        elif kind is Store:
            block, _ = self.get(ins.src)
            mat = self.buffer(ins.dst).reshape(ins.shape)
            r = ins.region
            if ins.accumulate:
                mat[r.r0:r.r1, r.c0:r.c1] += block
            else:
                mat[r.r0:r.r1, r.c0:r.c1] = block
            self._written(ins.dst)
        elif kind is Copy:
            value = self.view_value(ins.src)
            dst = self.buffer(ins.dst)
            if ins.axis is None:
                dst[...] = value
            else:
                dst[(slice(None),) * ins.axis + (slice(ins.lo, ins.hi),)] = value
            self._written(ins.dst)
        elif kind is Gather:
            value = self.view_value(ins.src)
            index = gather_indices(self.view_value(ins.index), value.shape[ins.axis])
            self.buffer(ins.dst)[...] = np.take(value, index, axis=ins.axis)
            self._written(ins.dst)
        elif kind is Preload:
            self.array = np.array(self.operand(ins.src), dtype=np.float32)
        elif kind is Matmul:
            a, b = self.operand(ins.a), self.operand(ins.b)
            if a.shape != (ins.m, ins.k) or b.shape != (ins.k, ins.n):
                raise SimulationError(f"simulate: MATMUL {ins.m}x{ins.k}x{ins.n} got operands "
                                      f"{a.shape} and {b.shape}")
            product = np.matmul(a, b)
            if ins.init is not None:       # the accumulators start from a bias row
                product = product + self.operand(ins.init)
            self._write(ins.dst, product, ins.accumulate)
        elif kind is Vec:
            self._write(ins.dst, self._vec(ins), ins.mode == "dotacc")
        elif kind is Host:
            self._host(ins)
        else:
            raise SimulationError(f"simulate: unknown instruction {ins!r}")

    def _write(self, dst: Operand, value: np.ndarray, accumulate: bool) -> None:
        """Write (or add) a result into a block; a plain write to a block nothing holds
        yet allocates it (the first pass into an output block)."""
        found = self.sp[dst.slot.sp].get(dst.slot.offset)
        if not accumulate and (found is None or found[0] != dst.slot):
            self.put(dst.slot, np.zeros((dst.slot.rows, dst.slot.cols), dtype=np.float32))
        block, _ = self.get(dst.slot)
        r = dst.region
        if value.shape != (r.rows, r.cols):
            raise SimulationError(f"simulate: result {value.shape} does not fit {dst.text()}")
        if accumulate:
            block[r.r0:r.r1, r.c0:r.c1] += value
        else:
            block[r.r0:r.r1, r.c0:r.c1] = value

    def _vec(self, ins: Vec) -> np.ndarray:
        srcs = [self.operand(s) for s in ins.srcs]
        if ins.mode == "bias":
            return srcs[0] + srcs[1]
        if ins.mode in DOT_MODES:        # row dot-products, accumulated in float32
            return np.einsum("ik,ik->i", np.broadcast_to(srcs[0], srcs[1].shape), srcs[1],
                             dtype=np.float32)[:, None]
        name, params = parse_op(ins.op)
        if ins.mode == "map":
            return apply_compute(name, params, srcs[0], 2)
        if ins.mode == "zip":
            return apply_compute(name, params, LazyPair(srcs[0], srcs[1], 2), 2)
        x = srcs[0]
        if ins.mode == "axis0":          # the block is one item: across its rows
            return apply_compute(name, params, x[None], 1)[0].reshape(-1, x.shape[1])
        y = apply_compute(name, params, x.reshape((x.shape[0],) + tuple(ins.item)), 1)
        return y.reshape(x.shape[0], -1)

    def _host(self, ins: Host) -> None:
        from apsat.lang.evaluate import evaluate
        from apsat.backends.systolic.lower import host_program

        prog = self._hosts.get(id(ins))
        if prog is None:
            prog = self._hosts[id(ins)] = host_program(self.s, ins)
        feeds = {}
        for name in prog.tensor_names():
            if name not in self.dram:
                raise SimulationError(f"simulate: HOST {ins.tag} reads buffer {name}, which no "
                                      "instruction has written")
            feeds[name] = self.dram[name]
        out = np.asarray(evaluate(prog, feeds), dtype=np.float32)
        self.dram[ins.dst] = out.reshape(self.s.buffers[ins.dst].dims)
        self._written(ins.dst)


def simulate(stream: Stream, tensors: dict) -> dict[str, np.ndarray]:
    """Run `stream` (init, then main) on `tensors` (program tensor name -> array, inputs and
    weights); returns output name -> float32 array (iterated ++ item dims)."""
    machine = Machine(stream, tensors)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        for ins in stream.init:
            machine.step(ins)
        for ins in stream.main:
            machine.step(ins)
        return {name: np.array(machine.view_value(v), dtype=np.float32)
                for name, v in stream.outputs.items()}
