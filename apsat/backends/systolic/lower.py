"""Lowering: an extracted Program becomes a Stream of accelerator instructions.

The program's terms are walked children first. Views (the workload classification's
VIEW_OPS: access, reshape, windows, slice, broadcast, ...) become address patterns over a
DRAM buffer and emit nothing; every other term is materialised into a DRAM buffer by the
instructions of its kind:

  systolic-array, fused-dot-bias(-act)   GEMM on the array (gemm.py), the accumulators
                                         starting from the fused bias, the activation as
                                         a vector epilogue before the store; on a
                                         flexible array a one-row product may share its
                                         columns with the vector unit (shared.py)
  compute OP                             the vector unit (vector.py); a dot-product over
                                         an access-pair (grouped, depthwise convolutions):
                                         one GEMM per group or VEC dot (grouped.py);
                                         any other dot-product: HOST
  attention                              Q.K^T and P.V on the array, the softmax on
                                         the vector unit, the scores kept in the ofmap
                                         when they fit, else the unfused chain
                                         (attention.py)
  access-transpose / -pad / -concatenate DMA copies (vector.py)
  opaque                                 HOST (onnxruntime runs the ONNX node)

Three options change how much the stream follows the extractor's cost model:
  im2col="model" (default): windows formed on chip when their input fits the ifmap
      scratchpad, else the im2col matrix is materialised in DRAM (cost_systolic._im2col);
      "gather": a DMA gathers the windows from DRAM instead of materialising them (it
      reads each tile's share of the input, as SCALE-Sim reads a convolution's ifmap).
  fold_copies=False (default): transposes, pads and concatenations are DMA copies, as
      the cost model prices them; True: transposes and pads become address patterns of
      their consumers (a strided or zero-filling DMA), so they move no data of their
      own, and concatenations along the last axis are built in place from GEMM results
      and inner concatenations (inplace.py; other parts are still copied).
  fuse_zips=False (default): an element-wise op over a pair runs as its own vector pass,
      as the cost model prices it; True: where one operand is a fused-dot-bias(-act) that
      nothing else reads (a residual add after a convolution), the op joins the GEMM's
      epilogue (gemm.residual_fusions): the other operand's blocks are loaded beside the
      output blocks and the product's result never goes to DRAM. An add to a product
      without activation is not zipped at all: the accumulators start from the other
      operand's blocks (as Gemmini's D operand does), so only the maps after it (a relu)
      are left for the vector unit.

Anything a lowering cannot map (an operand that is not a view of one buffer, an item that
does not fit a scratchpad half, a dot-product left off the array) becomes a HOST step
(host.py) that runs the term with the reference interpreter, with the reason recorded:
nothing is dropped.
Terms that depend only on weights and literals (weight transposes, BatchNorm folded into
weights) go to the stream's `init` section, run once when the model is loaded.
"""
from __future__ import annotations

import math

from apsat.backends.systolic import attention, gemm, inplace, vector
from apsat.backends.systolic.host import emit_host
from apsat.backends.systolic.isa import SCRATCHPADS, Buffer, Copy, Group, Host, Load, Region, Slot, Stream, View
from apsat.backends.systolic.views import dims_after, footprint
from apsat.lang.program import Program
from apsat.lang.term import Term
from apsat.errors import ApsatError
from apsat.lang.ops import COPY_OPS, VIEW_OPS
from apsat.targets.accelerator import Accelerator


class Unlowerable(Exception):
    """A term this lowering cannot map onto the accelerator; the message is the reason
    the HOST step records."""


_RESHAPES = ("access-squeeze", "access-insert-axis", "access-flatten", "access-reshape")


class Lowering:
    """State of one compile: the program, the stream being built, which buffer holds each
    materialised term, and which half of each scratchpad is next (double buffering)."""

    def __init__(self, program: Program, accel: Accelerator, weights=(), im2col: str = "model",
                 fold_copies: bool = False, fuse_zips: bool = False):
        if not isinstance(accel, Accelerator):
            raise ApsatError(f"systolic compile: expected an Accelerator, got {type(accel).__name__}")
        if im2col not in ("model", "gather"):
            raise ApsatError(f"systolic compile: im2col must be 'model' or 'gather', got {im2col!r}")
        self.program, self.acc = program, accel
        self.stream = Stream(accel, options={"im2col": im2col, "fold_copies": bool(fold_copies),
                                             "fuse_zips": bool(fuse_zips)})
        self.im2col, self.fold, self.fuse_zips = im2col, bool(fold_copies), bool(fuse_zips)
        self.weights = set(weights)
        self.buf_of: dict[Term, str] = {}
        self.const: dict[Term, bool] = {}
        self.tensor_buf: dict[str, str] = {}
        self.placed: dict[Term, inplace.Placement] = {}     # terms stored in a concatenation's buffer
        self._view_key: dict[tuple, str] = {}
        self._next_half = {sp: 0 for sp in SCRATCHPADS}
        self._next_part: dict[tuple, int] = {}
        self._count = {"x": 0, "w": 0, "c": 0, "t": 0, "v": 0, "L": 0}
        self.seq: list = self.stream.main
        self.tag = ""
        self.dataflow = ""            # the dataflow of the product being emitted (gemm.product)
        self.blocks = 1               # its A's diagonal blocks (gemm.product, tiles.emit_pass)

    # ---- names, buffers, views -------------------------------------------------------------

    def _name(self, prefix: str) -> str:
        n = self._count[prefix]
        self._count[prefix] += 1
        return f"{prefix}{n}"

    def new_buffer(self, dims, kind: str = "temp", tensor=None, value=None) -> str:
        """A fresh DRAM buffer of `dims`; returns its name."""
        prefix = {"input": "x", "weight": "w", "const": "c", "temp": "t"}[kind]
        name = self._name(prefix)
        self.stream.buffers[name] = Buffer(name, tuple(int(d) for d in dims), kind, tensor, value)
        return name

    def view(self, base: str, steps=()) -> str:
        """The view of `base` through `steps` (identical views are shared)."""
        steps = _simplify(self.stream.buffers[base].dims, tuple(steps))
        key = (base, steps)
        if key not in self._view_key:
            name = self._name("v")
            dims = dims_after(self.stream.buffers[base].dims, steps)
            self.stream.views[name] = View(name, base, steps, dims)
            self._view_key[key] = name
        return self._view_key[key]

    def matrix(self, base: str, steps, rows: int, cols: int) -> str:
        """A view of `base` through `steps`, then read as a rows x cols matrix."""
        return self.view(base, tuple(steps) + (("reshape", (rows, cols)),))

    def buffer_matrix(self, buf: str, rows: int, cols: int) -> str:
        """Buffer `buf` read as a rows x cols matrix."""
        return self.view(buf, (("reshape", (rows, cols)),))

    def dram_words(self, view: str, elements: int) -> int:
        """DRAM words a DMA reads for `elements` of `view`: its share of the view's
        footprint (broadcasts and overlapping windows read each base word once)."""
        v = self.stream.views[view]
        fp = footprint(self.stream.buffers[v.base].dims, v.steps)
        return elements if fp >= v.size else max(1, math.ceil(elements * fp / max(v.size, 1)))

    def dims(self, term: Term) -> tuple:
        """All dims (iterated ++ item) of a term's access shape."""
        it, item = self.program.shape_of(term)
        return tuple(it) + tuple(item)

    def split(self, term: Term) -> int:
        """How many of a term's dims are iterated."""
        return len(self.program.shape_of(term)[0])

    def tensor_buffer(self, name: str) -> str:
        """The DRAM buffer of program tensor `name` (an input or a weight), made on first use."""
        if name not in self.tensor_buf:
            kind = "weight" if name in self.weights else "input"
            self.tensor_buf[name] = self.new_buffer(self.program.tensor_shapes[name], kind, tensor=name)
        return self.tensor_buf[name]

    def chain(self, term: Term):
        """(base buffer, steps) when `term` is a view of one buffer, else None (a pair or
        cartesian product, which only their consumers understand)."""
        steps = []
        t = term
        while True:
            if t in self.buf_of:
                base = self.buf_of[t]
                if t in self.placed:
                    steps.append(self.placed[t].step())
                break
            op = t.op
            if op == "access-tensor":
                base = self.tensor_buffer(t.args[0])
                break
            if op == "access-literal":
                base = self.new_buffer((), "const", value=float(t.args[0]))
                self.buf_of[t] = base
                break
            if op == "access":
                t = t.args[0]
                continue
            if op in _RESHAPES:
                steps.append(("reshape", self.dims(t)))
            elif op in ("access-windows", "access-dilated-windows"):
                child = t.args[0]
                dil = t.args[3] if op == "access-dilated-windows" else (1,) * len(t.args[1])
                steps.append(("windows", tuple(t.args[1]), tuple(t.args[2]), tuple(dil), self.split(child)))
            elif op == "access-slice":
                steps.append(("slice",) + tuple(t.args[1:4]))
            elif op == "access-broadcast":
                steps.append(("broadcast", self.dims(t)))
            elif op == "access-transpose" and self.fold:
                steps.append(("transpose", tuple(t.args[1])))
            elif op == "access-pad" and self.fold:
                _, pad_type, axis, before, after = t.args
                steps.append(("pad", axis, before, after, 0.0 if pad_type.op == "zero-padding" else -math.inf))
            else:
                return None
            t = t.args[0]
        return base, tuple(reversed(steps))

    def need_chain(self, term: Term, what: str):
        """chain(term), or Unlowerable naming `what` when it is not a view of one buffer."""
        c = self.chain(term)
        if c is None:
            raise Unlowerable(f"{what} is not a view of one buffer ({term.op})")
        return c

    # ---- emitting ---------------------------------------------------------------------------

    def half(self, sp: str) -> int:
        """Word offset of the next half of scratchpad `sp` (the halves alternate)."""
        h = self._next_half[sp]
        self._next_half[sp] ^= 1
        return h * (getattr(self.acc, f"{sp}_words") // 2)

    def part(self, sp: str, slots: int) -> int:
        """Word offset of the next of `slots` equal parts of scratchpad `sp` (they rotate;
        2: the halves, see half)."""
        if slots == 2:
            return self.half(sp)
        i = self._next_part.get((sp, slots), 0)
        self._next_part[(sp, slots)] = (i + 1) % slots
        return i * (getattr(self.acc, f"{sp}_words") // slots)

    def half_words(self, sp: str) -> int:
        """Words in one half of scratchpad `sp`."""
        return getattr(self.acc, f"{sp}_words") // 2

    def emit(self, ins) -> None:
        """Append an instruction to the current section (init or main)."""
        self.seq.append(ins)

    def load(self, sp: str, offset: int, view: str, region: Region) -> Slot:
        """LOAD `region` of `view` into a slot of `sp` at `offset`; returns the slot."""
        slot = Slot(sp, offset, region.rows, region.cols)
        self.emit(Load(slot, view, region, self.dram_words(view, region.size), self.tag))
        return slot

    def begin(self, term: Term, kind: str, label: str, **gemm_fields) -> None:
        """Start the instructions of one program node: a new tag and group, in the init
        section when the node depends on weights and literals only."""
        self.tag = self._name("L")
        self.stream.groups[self.tag] = Group(self.tag, kind, label, **gemm_fields)
        self.seq = self.stream.init if self.const.get(term, False) else self.stream.main

    # ---- the walk ---------------------------------------------------------------------------

    def run(self) -> Stream:
        """Lower every materialised term (children first) and the outputs; the Stream."""
        order = self.program.terms()
        for t in order:
            self.const[t] = self._is_const(t)
        fused = gemm.residual_fusions(self, order) if self.fuse_zips else {}
        deferred = {f[0] for f in fused.values()}
        if self.fold:
            self.placed = inplace.plan(self, order, deferred)
            roots = {p.root for p in self.placed.values()}
            for root in (t for t in order if t in roots):      # in program order: stable names
                self.buf_of[root] = self.new_buffer(self.dims(root))
        for t in order:
            if t.op in VIEW_OPS or (self.fold and t.op in ("access-transpose", "access-pad")):
                continue
            if t in deferred:               # lowered with its consumer's epilogue
                continue
            if t in self.placed:
                self.buf_of[t] = self.buf_of[self.placed[t].root]
            elif t not in self.buf_of:
                self.buf_of[t] = self.new_buffer(self.dims(t))
            if t in fused and self._attempt(lambda: gemm.lower_fused(self, fused[t][0], (t,) + fused[t][1:]))[0]:
                continue
            if t in fused:                   # the fused form did not lower: the GEMM first
                g = fused[t][0]
                self.buf_of[g] = self.new_buffer(self.dims(g))
                self._lower_or_host(g)
            self._lower_or_host(t)
        for name, t in self.program.outputs.items():
            c = self.chain(t)
            if c is None:                 # an output that is a pair or product: build it
                self.buf_of[t] = self.new_buffer(self.dims(t))
                emit_host(self, t, "output is not a view of one buffer")
                c = (self.buf_of[t], ())
            self.stream.outputs[name] = self.view(c[0], c[1] + (("reshape", self.dims(t)),))
        return self.stream

    def _attempt(self, lower) -> tuple[bool, str]:
        """Run `lower`; on Unlowerable undo what it emitted. (lowered, why not)."""
        mark = (len(self.stream.init), len(self.stream.main), len(self.stream.groups))
        try:
            lower()
            return True, ""
        except Unlowerable as why:
            del self.stream.init[mark[0]:], self.stream.main[mark[1]:]
            for tag in list(self.stream.groups)[mark[2]:]:
                del self.stream.groups[tag]
            return False, str(why)

    def _lower_or_host(self, t: Term) -> None:
        """Lower `t`, or make it a host step naming why not (a term placed in a
        concatenation's buffer: into a buffer of its own, then copied into place)."""
        ok, why = self._attempt(lambda: self._lower(t))
        if ok:
            return
        p = self.placed.get(t)
        if p is None:
            emit_host(self, t, why)
            return
        root = self.buf_of[t]
        self.buf_of[t] = own = self.new_buffer(self.dims(t))
        del self.placed[t]
        emit_host(self, t, why)
        v = self.view(own)
        self.emit(Copy(root, v, self.stream.views[v].size, p.axis, p.offset, p.offset + p.width, self.tag))
        self.buf_of[t], self.placed[t] = root, p

    def _is_const(self, t: Term) -> bool:
        if t.op == "access-tensor":
            return t.args[0] in self.weights
        if t.op == "access-literal":
            return True
        kids = list(t.children())
        return bool(kids) and all(self.const[c] for c in kids) or (t.op == "opaque" and not kids)

    def _lower(self, t: Term) -> None:
        op = t.op
        if op == "systolic-array":
            gemm.lower_systolic(self, t)
        elif op in ("fused-dot-bias", "fused-dot-bias-act"):
            gemm.lower_fused(self, t)
        elif op == "attention":
            attention.lower_attention(self, t)
        elif op == "compute":
            vector.lower_compute(self, t)
        elif op in COPY_OPS:
            vector.lower_copy(self, t)
        elif op == "opaque":
            raise Unlowerable(f"opaque ONNX node {t.args[0]!r} (onnxruntime on the host)")
        else:
            raise Unlowerable(f"no accelerator lowering for {op}")


def _simplify(base_dims: tuple, steps: tuple) -> tuple:
    """Merge consecutive reshapes and drop reshapes to the dims already there."""
    out: list = []
    dims = tuple(base_dims)
    for s in steps:
        if s[0] == "reshape":
            if out and out[-1][0] == "reshape":
                out.pop()
                dims = dims_after(base_dims, out)
            if tuple(s[1]) == dims:
                continue
        out.append(s)
        dims = dims_after(base_dims, out)
    return tuple(out)


def compile_program(program: Program, accel: Accelerator, weights=(), im2col: str = "model",
                    fold_copies: bool = False, fuse_zips: bool = False) -> Stream:
    """Lower `program` for `accel`; `weights` names the tensors known at load time (their
    consumers that need nothing else go to the init section); `im2col`, `fold_copies`
    and `fuse_zips` as in the module docstring."""
    return Lowering(program, accel, weights, im2col, fold_copies, fuse_zips).run()


def host_program(stream: Stream, ins: Host) -> Program:
    """The single-output Program a HOST instruction runs (tensors are DRAM buffers)."""
    from apsat.lang.syntax import parse_term

    term = parse_term(ins.term)
    shapes = {n: b.dims for n, b in stream.buffers.items()}
    return Program({"out": term}, shapes, dict(stream.opaque))


__all__ = ["compile_program", "host_program", "Lowering", "Unlowerable"]
