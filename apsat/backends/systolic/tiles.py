"""The pieces every dataflow's tiling of a GEMM is built from (apsat.backends.systolic.
dataflows): the product to tile (`Gemm`), fold and chunk ranges, operand access, array
passes, output blocks and their epilogue and store (see gemm.py for the scheme)."""
from __future__ import annotations

from dataclasses import dataclass

from apsat.backends.systolic.isa import Matmul, Operand, Region, Slot, Store, Vec
from apsat.errors import ApsatError


@dataclass
class Gemm:
    """A product to tile: A (`a`, an m x k matrix view), B (`b`, k x n), into buffer `c`
    (m x n; rows [c_row0, c_row0 + m) of c read as a c_rows x n matrix when c_rows is
    set: one group of a grouped product; columns [c_col0, c_col0 + n) of c read with
    c_cols columns when c_cols is set: a part of a concatenation built in place).
    `a_mode` dense / resident / im2col; `a_full`: the resident input as one 1 x size
    view. Optional `bias` (a 1 x n view: the accumulators start from it, see bias_row)
    and activation `act` (operator text); optional `res`, an m x n view zipped onto the
    result by operator `res_op` (the result its first operand unless `res_first`): an
    element-wise consumer, such as a residual add, fused into the epilogue; or `start`,
    an m x n view the accumulators start from (a residual added before any activation:
    c = start + bias + a . b, see start_block). `blocks`: A is block-diagonal with that
    many blocks (batched depthwise filters, grouped.py)."""

    m: int
    k: int
    n: int
    a: str
    b: str
    c: str
    a_mode: str = "dense"
    a_full: str | None = None
    bias: str | None = None
    act: str | None = None
    c_rows: int = 0
    c_row0: int = 0
    c_cols: int = 0
    c_col0: int = 0
    res: str | None = None
    res_op: str | None = None
    res_first: bool = False
    start: str | None = None
    blocks: int = 1

    def c_region(self, region: Region) -> tuple[tuple[int, int], Region]:
        """(matrix shape of c, `region` of the product placed in it)."""
        r = Region(region.r0 + self.c_row0, region.r1 + self.c_row0, region.c0 + self.c_col0,
                   region.c1 + self.c_col0)
        return (self.c_rows or self.m, self.c_cols or self.n), r

    @property
    def epilogue(self) -> bool:
        """Whether an activation or a zip runs over the result before it is stored (the
        bias needs none: the accumulators start from it)."""
        return self.act is not None or self.res is not None

    @property
    def epilogue_ops(self) -> float:
        """Vector operations per output of the epilogue (the cost model's figures)."""
        from apsat.backends.systolic.vector import operator_term
        from apsat.lang.arithmetic import operator_flops

        ops = 0.0
        if self.act is not None:
            ops += operator_flops(operator_term(self.act), 1, 1)
        if self.res is not None:
            ops += operator_flops(operator_term(self.res_op), 2, 1)
        return ops

    @property
    def copies(self) -> int:
        """Output-sized blocks an output block needs in the ofmap: 2 with a zipped operand."""
        return 2 if self.res is not None else 1


def folds(size: int, step: int) -> list[tuple[int, int]]:
    """[i, i + step) ranges covering [0, size): the array's folds (the last may be short)."""
    return [(i, min(i + step, size)) for i in range(0, size, step)]


def even_chunks(size: int, step: int) -> list[tuple[int, int]]:
    """As few chunks of at most `step` as folds, of near-equal sizes: a short last
    chunk would leave too little time to load the next one behind it."""
    parts = -(-size // step)
    return [(size * i // parts, size * (i + 1) // parts) for i in range(parts)]


def whole(slot: Slot) -> Operand:
    """All of the block in `slot`."""
    return Operand(slot, Region(0, slot.rows, 0, slot.cols))


def refuse(L, what: str) -> None:
    """Raise ApsatError naming the accelerator: a tile that cannot be formed on it."""
    raise ApsatError(f"accelerator {L.acc.name!r}: {what}")


def load_a_resident(L, g) -> Slot:
    """The whole input of an on-chip im2col operand, at offset 0 of the ifmap."""
    size = L.stream.buffers[L.stream.views[g.a_full].base].size
    return L.load("ifmap", 0, g.a_full, Region(0, 1, 0, size))


def a_operand(g, slot: Slot, region: Region, origin=(0, 0)) -> Operand:
    """Rows/cols `region` of A from `slot`: through the im2col view for a resident input,
    else relative to the block's origin (its first row and column in A)."""
    if g.a_mode == "resident":
        return Operand(slot, region, g.a)
    r, c = origin
    return Operand(slot, Region(region.r0 - r, region.r1 - r, region.c0 - c, region.c1 - c))


def emit_pass(L, dst: Operand, a, b, m, k, n, accumulate: bool, fill: bool, bias: Slot | None = None) -> None:
    """One MATMUL pass in the product's dataflow (L.dataflow, set by gemm.product); with
    `bias` (the block's bias row, bias_row) the accumulators start from its columns
    under dst."""
    init = None if bias is None else Operand(bias, Region(0, 1, dst.region.c0, dst.region.c1))
    L.emit(Matmul(dst, a, b, m, k, n, accumulate, fill, L.tag, L.dataflow, init, L.blocks))


def out_block(L, rows: int, cols: int, slots: int = 2) -> Slot:
    """An ofmap block in the next of `slots` equal parts of the ofmap (2: its halves; the
    bias row, when there is one, follows it)."""
    return Slot("ofmap", L.part("ofmap", slots), rows, cols)


def bias_row(L, g, oslot: Slot, region: Region) -> Slot | None:
    """Load the bias under `region`'s columns into the row after the output block, for
    the block's first passes to start their accumulators from (None without a bias)."""
    if g.bias is None:
        return None
    return L.load("ofmap", oslot.offset + oslot.words, g.bias, Region(0, 1, region.c0, region.c1))


def finish(L, g, oslot: Slot, region: Region, epilogue: bool, accumulate: bool) -> None:
    """Epilogue (activation, zipped operand) over the block when asked, then its STORE."""
    if epilogue:
        full = whole(oslot)
        if g.act is not None:
            L.emit(Vec("map", g.act, full, (full,), (), L.tag))
        if g.res is not None:
            after = oslot.offset + oslot.words + (region.cols if g.bias is not None else 0)
            other = whole(L.load("ofmap", after, g.res, region))
            L.emit(Vec("zip", g.res_op, full, (other, full) if g.res_first else (full, other), (), L.tag))
    shape, where = g.c_region(region)
    L.emit(Store(g.c, shape, where, oslot, accumulate, L.tag))


class Deferred:
    """The `finish` of the last `depth` output blocks, held back so that the next blocks'
    partial-sum reloads and bias rows are issued before them: the ofmap DMA runs in
    order, and a reload (into another slot) must not wait behind a store that waits for
    its epilogue. A block's slot is reused `slots` blocks later, so depth < slots."""

    def __init__(self, L, g, depth: int = 1):
        self.L, self.g, self.depth, self.pending = L, g, depth, []

    def flush(self, keep: int = 0) -> None:
        """Emit the held finishes, oldest first, until at most `keep` remain."""
        while len(self.pending) > keep:
            finish(self.L, self.g, *self.pending.pop(0))

    def finish(self, *args) -> None:
        """Hold this block's finish (emitting the oldest held one beyond `depth`)."""
        self.ready()
        self.pending.append(args)

    def ready(self) -> None:
        """The next block's reload and bias row are issued: release what it need not
        wait for (all but the last depth - 1 held finishes)."""
        self.flush(self.depth - 1)


def start_block(L, g, oslot: Slot, region: Region) -> bool:
    """Load `region` of the values the accumulators start from (g.start) into the block,
    before its first passes, which then accumulate onto them; False (nothing loaded)
    without g.start."""
    if g.start is None:
        return False
    L.load("ofmap", oslot.offset, g.start, region)
    return True


def reload_partials(L, g, oslot: Slot, region: Region) -> None:
    """Load partial sums already drained to DRAM into the block (ws/is, last row fold)."""
    shape, where = g.c_region(region)
    L.load("ofmap", oslot.offset, L.buffer_matrix(g.c, *shape), where)


def out_rows(L, g, width: int, unit: int) -> int:
    """Rows of a `width`-column output block that fit an ofmap half with its bias row,
    in whole multiples of `unit` rows when at least one fits; refuse when not even
    min(unit, m) rows fit."""
    room = L.half_words("ofmap") - (width if g.bias is not None else 0)
    rows = room // (width * g.copies)
    need = min(unit, g.m)
    if rows < need:
        refuse(L, f"half of the ofmap scratchpad ({L.half_words('ofmap')} words) cannot hold "
                   f"a {need}x{width} output tile{' and its bias row' if g.bias is not None else ''}")
    return rows if rows < unit else rows - rows % unit
