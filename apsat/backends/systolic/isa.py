"""The systolic accelerator's instruction stream, as data.

A `Stream` is what `compile` produces and what `simulate` and `cycles` consume: the
accelerator it targets, the DRAM buffers (model inputs, weights, constants, temporaries),
the views that address them, and two instruction lists: `init` (work that depends only on
weights, run once when the model is loaded: weight transposes, BatchNorm folding) and
`main` (run per inference).

Memories:
  DRAM         named buffers, each a dense row-major float32 tensor (`Buffer`).
  scratchpads  "ifmap", "filter", "ofmap", each `Accelerator.<sp>_words` words. A `Slot`
               is a 2-D block held at a word offset; the lowering keeps the two halves
               ([0, S/2) and [S/2, S)) apart so one can fill while the other is in use
               (double buffering). A resident tensor (an im2col input formed on chip) is
               one 1 x size block at offset 0.
  array        the PE array's stationary registers (ws: a weight tile, is: an input
               tile), written by PRELOAD.

Instructions (one dataclass each; `tag` names the lowered program node they belong to):
  LOAD     DMA DRAM -> scratchpad: a region of a view's 2-D matrix form into a slot.
  STORE    DMA scratchpad -> DRAM: a slot into a region of a buffer's matrix form;
           `accumulate` adds to DRAM instead (partial sums of the ws/is dataflows, drained
           per row fold as SCALE-Sim counts them, summed at the memory side).
  COPY     DMA DRAM -> DRAM through an address pattern: transpose, pad, concatenate
           parts and im2col matrices that do not fit on chip.
  PRELOAD  scratchpad block -> the array's stationary registers (ws, is).
  MATMUL   one pass through the array: dst (+)= a @ b on 2-D blocks, a or b "array"
           for the stationary operand; `fill` marks the pass that pays the fold's
           pipeline fill (a fold streamed in several chunks pays it once); `init`, a
           bias row the accumulators start from; `blocks`, a block-diagonal a (batched
           depthwise filters: one MAC in `blocks` is useful).
  VEC      the vector unit on scratchpad blocks: map (unary elementwise), zip (binary
           elementwise), row (an operator over each row's item: reductions, softmax,
           LRN...), axis0 (the block is one item: an operator across its rows, such as
           LRN across channels), bias (add a row vector to every row; the lowering starts
           GEMM accumulators from the bias instead, MATMUL init).
  HOST     a step the accelerator does not run, done by the host on DRAM buffers: a
           sub-program in the language's surface syntax (opaque ONNX nodes, dot-products
           left off the array, operators whose item does not fit a scratchpad half).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Union

from apsat.targets.systolic import Accelerator

SCRATCHPADS = ("ifmap", "filter", "ofmap")
BUFFER_KINDS = ("input", "weight", "const", "temp")
VEC_MODES = ("map", "zip", "row", "axis0", "bias")


@dataclass(frozen=True)
class Slot:
    """A rows x cols block (row-major) held in scratchpad `sp` from word `offset`."""

    sp: str
    offset: int
    rows: int
    cols: int

    @property
    def words(self) -> int:
        """Words the block occupies."""
        return self.rows * self.cols

    def text(self) -> str:
        """`sp@offset:RxC`, as the text form writes it."""
        return f"{self.sp}@{self.offset}:{self.rows}x{self.cols}"


@dataclass(frozen=True)
class Region:
    """Rows [r0, r1) x columns [c0, c1) of a 2-D matrix."""

    r0: int
    r1: int
    c0: int
    c1: int

    @property
    def rows(self) -> int:
        """r1 - r0."""
        return self.r1 - self.r0

    @property
    def cols(self) -> int:
        """c1 - c0."""
        return self.c1 - self.c0

    @property
    def size(self) -> int:
        """Elements in the region."""
        return self.rows * self.cols

    def text(self) -> str:
        """`[r0:r1,c0:c1]`, as the text form writes it."""
        return f"[{self.r0}:{self.r1},{self.c0}:{self.c1}]"


@dataclass(frozen=True)
class Operand:
    """What an on-chip instruction reads or writes: `region` of the block in `slot`; with
    `view`, the block is a resident tensor (the view's base buffer, flattened) and the
    region is taken from that view's matrix form, formed on chip (im2col addressing)."""

    slot: Slot
    region: Region
    view: str | None = None

    def text(self) -> str:
        """The slot, `/view` for a resident input, then the region."""
        via = f"/{self.view}" if self.view else ""
        return f"{self.slot.text()}{via}{self.region.text()}"

    def word_range(self) -> tuple[int, int]:
        """Scratchpad words [lo, hi) the operand touches (the rows it spans; all of a
        resident block)."""
        s = self.slot
        if self.view is not None:
            return s.offset, s.offset + s.words
        return s.offset + self.region.r0 * s.cols, s.offset + self.region.r1 * s.cols


ARRAY = "array"       # the stationary operand held in the PE array (PRELOAD's target)


@dataclass(frozen=True)
class Buffer:
    """A DRAM tensor: `kind` input (fed per inference), weight (fed at load time), const
    (a literal; `value` holds it) or temp (written by the stream). Input and weight
    buffers name the program `tensor` they hold (buffer names are short identifiers:
    x0.., w0.., c0.., t0..; tensor names may be anything ONNX allows)."""

    name: str
    dims: tuple[int, ...]
    kind: str
    tensor: str | None = None
    value: float | None = None

    @property
    def size(self) -> int:
        """Elements of the buffer."""
        return math.prod(self.dims)


@dataclass(frozen=True)
class View:
    """An address pattern over one buffer: `steps` applied to the buffer's dims in order
    give an array of `dims` (see apsat.backends.systolic.views for the step kinds).
    Views are addressing, never instructions."""

    name: str
    base: str
    steps: tuple
    dims: tuple[int, ...]

    @property
    def size(self) -> int:
        """Elements the view addresses."""
        return math.prod(self.dims)


@dataclass(frozen=True)
class Load:
    """DMA: `region` of view `src` (2-D) into `dst`; `words` are the DRAM words read
    (fewer than the block for broadcasts and overlapping windows)."""

    dst: Slot
    src: str
    region: Region
    words: int
    tag: str = ""


@dataclass(frozen=True)
class Store:
    """DMA: the block in `src` into `region` of buffer `dst` viewed as a `shape[0]` x
    `shape[1]` matrix; `accumulate` adds it to what DRAM holds."""

    dst: str
    shape: tuple[int, int]
    region: Region
    src: Slot
    accumulate: bool = False
    tag: str = ""


@dataclass(frozen=True)
class Copy:
    """DMA DRAM -> DRAM: view `src` (dims equal to the destination part) into buffer `dst`,
    all of it (`axis` None) or indices [lo, hi) of `axis`; `words` DRAM words read."""

    dst: str
    src: str
    words: int
    axis: int | None = None
    lo: int = 0
    hi: int = 0
    tag: str = ""


@dataclass(frozen=True)
class Gather:
    """DMA gather DRAM -> DRAM: buffer `dst` is view `src` along `axis` at the positions
    view `index` holds (float32-carried integers read as the language's access-gather
    reads them: negative from the end, clamped); `words` DRAM words read (the gathered
    elements and the indices)."""

    dst: str
    src: str
    index: str
    axis: int
    words: int
    tag: str = ""


@dataclass(frozen=True)
class Preload:
    """The block `src` becomes the array's stationary operand (its load time is part of
    the fold's fill, as the analytical model counts it)."""

    src: Operand
    tag: str = ""


@dataclass(frozen=True)
class Matmul:
    """One pass: dst (+)= a @ b, a (m x k), b (k x n), dst (m x n); a or b may be ARRAY.
    `fill`: this pass pays the fold's pipeline fill. `dataflow`: the array's
    configuration for the pass (os, ws or is; "" for the accelerator's own, which a
    flexible array does not have). `init`: a one-row block the accumulators start from,
    repeated over dst's rows (a bias: dst = init + a @ b; Gemmini's D operand), so the
    vector unit has no bias to add. `blocks`: a is block-diagonal with this many blocks
    (several small products batched on the array, grouped.py), so only m*k*n / blocks
    of the pass's MACs are useful work; the cycle report counts those."""

    dst: Operand
    a: Union[Operand, str]
    b: Union[Operand, str]
    m: int
    k: int
    n: int
    accumulate: bool = False
    fill: bool = True
    tag: str = ""
    dataflow: str = ""
    init: Operand | None = None
    blocks: int = 1


DOT_MODES = ("dot", "dotacc")      # VEC modes that are row dot-products (MACs on the vector unit)


@dataclass(frozen=True)
class Vec:
    """The vector unit: `mode` map / zip / row / axis0 / bias / dot applies compute
    operator `op` (surface syntax: `relu`, `(clip 0.0 6.0)`; bias adds) to the `srcs`
    blocks, result in `dst`. row: each source row is reshaped to `item` and the operator
    reduces or normalises it; axis0: the whole block is one item (its rows the item's
    first axis); dot: row i of dst (one column) is the dot-product of row i of the two
    sources, or of the first source's one row and row i of the second (a grouped or
    depthwise convolution off the array, the vector unit's columns of a one-row
    product); dotacc: as dot, added to what dst holds (a later k-chunk)."""

    mode: str
    op: str
    dst: Operand
    srcs: tuple
    item: tuple[int, ...] = ()
    tag: str = ""


@dataclass(frozen=True)
class Host:
    """The host evaluates `term` (surface syntax; tensors are DRAM buffers) into buffer
    `dst`. `reads`: DRAM words it reads; `macs`: multiply-accumulates (a dot-product left
    off the array); `reason`: why the accelerator does not run it."""

    dst: str
    term: str
    reads: int
    macs: int
    reason: str
    tag: str = ""


Instruction = Union[Load, Store, Copy, Gather, Preload, Matmul, Vec, Host]
OPCODES = {Load: "LOAD", Store: "STORE", Copy: "COPY", Gather: "GATHER", Preload: "PRELOAD", Matmul: "MATMUL",
           Vec: "VEC", Host: "HOST"}


@dataclass
class Group:
    """One lowered program node: `kind` gemm / grouped / attention / vector / copy / host,
    `label` what it is (op name), and for GEMMs the product's m, k, n (attention: a
    head's query rows, d and keys), how the left operand is read
    (`a_mode`: dense, resident (im2col formed on chip) or im2col (materialised)), the
    dataflow it runs in and `vector_cols`, its last columns run on the vector unit
    (a one-row product's share, targets.vector_share; 0: none)."""

    tag: str
    kind: str
    label: str
    m: int = 0
    k: int = 0
    n: int = 0
    a_mode: str = ""
    dataflow: str = ""
    vector_cols: int = 0


@dataclass
class Stream:
    """A compiled program: see the module docstring. `outputs` maps each program output to
    the view that reads it; `opaque` holds the ONNX nodes HOST steps call (by key);
    `options` the lowering options it was compiled with (apsat.backends.systolic.lower)."""

    accel: Accelerator
    buffers: dict[str, Buffer] = field(default_factory=dict)
    views: dict[str, View] = field(default_factory=dict)
    init: list = field(default_factory=list)
    main: list = field(default_factory=list)
    outputs: dict[str, str] = field(default_factory=dict)
    groups: dict[str, Group] = field(default_factory=dict)
    opaque: dict = field(default_factory=dict)
    options: dict = field(default_factory=lambda: {"im2col": "model", "fold_copies": False})

    def instructions(self):
        """init then main instructions, in order."""
        yield from self.init
        yield from self.main

    def host_steps(self) -> list[dict]:
        """Every HOST instruction as {tag, section, reason, term} (the report names them)."""
        out = []
        for section, seq in (("init", self.init), ("main", self.main)):
            out += [{"tag": i.tag, "section": section, "reason": i.reason,
                     "term": i.term if len(i.term) <= 200 else i.term[:200] + " ..."}
                    for i in seq if isinstance(i, Host)]
        return out

    def counts(self) -> dict[str, int]:
        """Instructions per opcode (init and main together)."""
        c: dict[str, int] = {}
        for ins in self.instructions():
            op = OPCODES[type(ins)]
            c[op] = c.get(op, 0) + 1
        return c
