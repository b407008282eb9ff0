"""GEMMs on the array: an (m x k) . (k x n) product tiled for its dataflow (the
accelerator's, or on a flexible array the one gemm_cost finds fastest for the product).

The tiling follows the analytical model in apsat/targets/systolic.py (gemm_cost), so the
stream moves the words that model counts and runs the folds it counts:

  os  (Sr, Sc, T) = (m, n, k): outputs stationary. Column folds outer, row folds inner;
      B's column block is loaded once per column fold when it fits a filter half (else
      B streams in k-chunks per fold); A's row blocks are re-read per column fold unless
      all of A fits an ifmap half. A fold whose operands exceed a half is streamed in
      k-chunks that accumulate in the PEs (one fill per fold).
  ws  (k, n, m): weight tiles stationary (PRELOAD), A streams through, each row fold's
      partial sums drain to DRAM (STORE accumulate, as SCALE-Sim counts them).
  is  (k, m, n): input tiles stationary, B streams, partial sums as ws.

Outputs collect in an ofmap half: consecutive folds fill one block, which is stored when
full, so DRAM writes start once a half is full and the array fills the other half
meanwhile (the double buffering SCALE-Sim assumes). A fused bias and activation run on
the vector unit over the block before its store; under ws/is with several row folds the
last fold first loads the partial sums back and accumulates onto them, so the epilogue
sees final values.

im2col: a left operand that reads its base buffer's words more than once (windows) is
formed on chip from the whole input held in the ifmap scratchpad when that input fits
it (cost_systolic._im2col's condition, a_mode "resident"), else materialised in DRAM by
a COPY first ("im2col"), or with the lowering option im2col="gather" loaded tile by tile
through the windows' address pattern, each tile reading its share of the input
("gather").
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from apsat.backends.systolic.isa import ARRAY, Copy, Matmul, Operand, Preload, Region, Slot, Store, Vec
from apsat.backends.systolic.views import footprint
from apsat.errors import ApsatError
from apsat.targets.systolic import fused_gemm_cost


@dataclass
class Gemm:
    """A product to tile: A (`a`, an m x k matrix view), B (`b`, k x n), into buffer `c`
    (m x n, or rows [c_row0, c_row0 + m) of c read as a c_rows x n matrix when c_rows is
    set: one group of a grouped product); `a_mode` dense / resident / im2col; `a_full`:
    the resident input as one 1 x size view; optional `bias` (a 1 x n view) and
    activation `act` (operator text); optional `res`, an m x n view zipped onto the
    result by operator `res_op` (the result its first operand unless `res_first`): an
    element-wise consumer, such as a residual add, fused into the epilogue."""

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
    res: str | None = None
    res_op: str | None = None
    res_first: bool = False

    def c_region(self, region: Region) -> tuple[tuple[int, int], Region]:
        """(matrix shape of c, `region` of the product placed in it)."""
        r = Region(region.r0 + self.c_row0, region.r1 + self.c_row0, region.c0, region.c1)
        return (self.c_rows or self.m, self.n), r

    @property
    def epilogue(self) -> bool:
        """Whether a bias, an activation or a zip runs over the result before it is stored."""
        return self.bias is not None or self.act is not None or self.res is not None

    @property
    def epilogue_ops(self) -> float:
        """Vector operations per output of the epilogue (the cost model's figures)."""
        from apsat.backends.systolic.vector import operator_term
        from apsat.extract.workload import operator_flops

        ops = 1.0 if self.bias is not None else 0.0
        if self.act is not None:
            ops += operator_flops(operator_term(self.act), 1, 1)
        if self.res is not None:
            ops += operator_flops(operator_term(self.res_op), 2, 1)
        return ops

    @property
    def copies(self) -> int:
        """Output-sized blocks an output block needs in the ofmap: 2 with a zipped operand."""
        return 2 if self.res is not None else 1


def _folds(size: int, step: int) -> list[tuple[int, int]]:
    return [(i, min(i + step, size)) for i in range(0, size, step)]


def _even(size: int, step: int) -> list[tuple[int, int]]:
    """As few chunks of at most `step` as _folds, of near-equal sizes: a short last
    chunk would leave too little time to load the next one behind it."""
    parts = -(-size // step)
    return [(size * i // parts, size * (i + 1) // parts) for i in range(parts)]


def _whole(slot: Slot) -> Operand:
    return Operand(slot, Region(0, slot.rows, 0, slot.cols))


def _refuse(L, what: str) -> None:
    raise ApsatError(f"accelerator {L.acc.name!r}: {what}")


# ---- entry points ---------------------------------------------------------------------------

def lower_systolic(L, t) -> None:
    """`systolic-array rows cols a b`: a ((batch),(rows)) times b ((),(rows, cols))."""
    rows, cols, a, b = t.args
    m = math.prod(L.program.shape_of(a)[0])
    ba, sa = L.need_chain(a, "the array's left operand")
    bb, sb = L.need_chain(b, "the array's right operand")
    _lower(L, t, "systolic-array", m, rows, cols, ba, sa, L.matrix(bb, sb, rows, cols), None, None)


def lower_fused(L, t, zip_with=None) -> None:
    """`fused-dot-bias(-act) [OP] a b bias`: a ((ia),(item)) . b ((ib),(item)) + bias.
    zip_with: (consumer term, other operand term, operator text, whether the other
    operand comes first) for an element-wise consumer fused into the epilogue (see
    residual_fusions); the result then goes to the consumer's buffer under its tag."""
    from apsat.backends.systolic.vector import op_text

    act = op_text(t.args[0]) if t.op == "fused-dot-bias-act" else None
    a, b, bias = t.args[-3:]
    (ia, item), (ib, _) = L.program.shape_of(a), L.program.shape_of(b)
    m, k, n = math.prod(ia), math.prod(item), math.prod(ib)
    ba, sa = L.need_chain(a, "the fused kernel's left operand")
    bb, sb = L.need_chain(b, "the fused kernel's right operand")
    bc, sc = L.need_chain(bias, "the fused kernel's bias")
    # B is read transposed ((n x k) -> (k x n)): a strided DMA pattern, not a copy.
    bview = L.view(bb, sb + (("reshape", (n, k)), ("transpose", (1, 0))))
    label = t.op + (f" {act}" if act else "")
    extra = {}
    if zip_with is not None:
        consumer, other, text, first = zip_with
        bo, so = L.need_chain(other, "the fused element-wise operand")
        extra = {"res": L.matrix(bo, so, m, n), "res_op": text, "res_first": first}
        label += f" + {text}"
        t = consumer
    _lower(L, t, label, m, k, n, ba, sa, bview, L.matrix(bc, sc, 1, n), act, extra)


def _lower(L, t, label, m, k, n, base_a, steps_a, bview, bias, act, extra=None) -> None:
    aview = L.matrix(base_a, steps_a, m, k)
    mode = a_mode(L, base_a, aview, m * k, L.im2col == "model")
    L.begin(t, "gemm", label, m=m, k=k, n=n, a_mode=mode)
    product(L, Gemm(m, k, n, aview, bview, L.buf_of[t], mode, None, bias, act, **(extra or {})))


def residual_fusions(L, order) -> dict:
    """{consumer: (gemm term, other operand, operator text, other first)} for each
    `compute OP (access-pair X Y)` whose OP is one binary element-wise operator (then
    unary ones: a chain such as add-then-relu) and one of whose operands is a
    fused-dot-bias(-act) that nothing else reads, outside the init section, with the
    same dims as the other operand: the GEMM's epilogue applies OP as its output
    blocks drain, so the product's result never goes to DRAM. (The cost model prices
    the two apart; the stream is the cheaper for it.)"""
    from apsat.backends.systolic.vector import PAIRWISE, UNARY, op_parts, op_text

    users: dict = {}
    for t in order:
        for c in t.children():
            users[c] = users.get(c, 0) + 1
    outputs = set(L.program.outputs.values())
    found, taken = {}, set()
    for t in order:
        if t.op != "compute" or t.args[1].op != "access-pair" or L.const.get(t, False):
            continue
        parts = op_parts(t.args[0])
        if parts[0] not in PAIRWISE or not all(p in UNARY for p in parts[1:]):
            continue
        pair = t.args[1].args
        for i in (0, 1):
            g = pair[i]
            while g.op == "access" and users.get(g, 0) == 1 and g not in outputs:
                g = g.args[0]
            if (g.op in ("fused-dot-bias", "fused-dot-bias-act") and users.get(g, 0) == 1
                    and g not in outputs and g not in taken and L.dims(pair[0]) == L.dims(pair[1])):
                found[t] = (g, pair[1 - i], op_text(t.args[0]), i == 1)
                taken.add(g)
                break
    return found


def a_mode(L, base_a: str, aview: str, words: int, materialise: bool) -> str:
    """dense, or for a window view (it reads its base's words more than once): resident
    when the base fits the ifmap scratchpad, else im2col (materialise) or gather."""
    if footprint(L.stream.buffers[base_a].dims, L.stream.views[aview].steps) >= words:
        return "dense"
    if L.stream.buffers[base_a].size <= L.acc.ifmap_words:
        return "resident"
    return "im2col" if materialise else "gather"


def product(L, g: Gemm) -> None:
    """Emit the instructions of product `g` (its a_mode set) in the dataflow
    fused_gemm_cost gives it with its epilogue: the accelerator's, or a flexible array's
    best for this product. The group records it (the last product of a grouped
    convolution's groups)."""
    acc = L.acc
    m, k, base_a = g.m, g.k, L.stream.views[g.a].base
    base_size = L.stream.buffers[base_a].size
    mode, aview = g.a_mode, g.a
    if mode == "resident":
        g.a_full = L.view(base_a, (("reshape", (1, base_size)),))
    elif mode == "im2col":
        # The windows do not fit on chip: write the im2col matrix to DRAM, then read it densely.
        mat = L.new_buffer((m, k))
        L.emit(Copy(mat, aview, L.dram_words(aview, m * k), tag=L.tag))
        g.a = L.buffer_matrix(mat, m, k)
    L.dataflow = fused_gemm_cost(acc, g.m, g.k, g.n, g.epilogue_ops)[0].dataflow
    L.stream.groups[L.tag].dataflow = L.dataflow
    {"os": _os, "ws": _ws, "is": _is}[L.dataflow](L, g)


# ---- shared steps ---------------------------------------------------------------------------

def _load_a_resident(L, g) -> Slot:
    """The whole input of an on-chip im2col operand, at offset 0 of the ifmap."""
    size = L.stream.buffers[L.stream.views[g.a_full].base].size
    return L.load("ifmap", 0, g.a_full, Region(0, 1, 0, size))


def _a_operand(g, slot: Slot, region: Region, origin=(0, 0)) -> Operand:
    """Rows/cols `region` of A from `slot`: through the im2col view for a resident input,
    else relative to the block's origin (its first row and column in A)."""
    if g.a_mode == "resident":
        return Operand(slot, region, g.a)
    r, c = origin
    return Operand(slot, Region(region.r0 - r, region.r1 - r, region.c0 - c, region.c1 - c))


def _pass(L, dst: Operand, a, b, m, k, n, accumulate: bool, fill: bool) -> None:
    L.emit(Matmul(dst, a, b, m, k, n, accumulate, fill, L.tag, L.dataflow))


def _block(L, rows: int, cols: int) -> Slot:
    """An ofmap block in the next half (the bias row, when there is one, follows it)."""
    return Slot("ofmap", L.half("ofmap"), rows, cols)


def _finish(L, g, oslot: Slot, region: Region, epilogue: bool, accumulate: bool) -> None:
    """Epilogue (bias row, activation) over the block when asked, then its STORE."""
    if epilogue:
        full = _whole(oslot)
        if g.bias is not None:
            bslot = L.load("ofmap", oslot.offset + oslot.words, g.bias, Region(0, 1, region.c0, region.c1))
            L.emit(Vec("bias", "elementwise-add", full, (full, _whole(bslot)), (), L.tag))
        if g.act is not None:
            L.emit(Vec("map", g.act, full, (full,), (), L.tag))
        if g.res is not None:
            after = oslot.offset + oslot.words + (region.cols if g.bias is not None else 0)
            other = _whole(L.load("ofmap", after, g.res, region))
            L.emit(Vec("zip", g.res_op, full, (other, full) if g.res_first else (full, other), (), L.tag))
    shape, where = g.c_region(region)
    L.emit(Store(g.c, shape, where, oslot, accumulate, L.tag))


class _Deferred:
    """The `_finish` of the previous output block, held back so that the next block's
    partial-sum reload is issued before it: the ofmap DMA runs in order, and the reload
    (into the other half) must not wait behind a store that waits for its epilogue."""

    def __init__(self, L, g):
        self.L, self.g, self.args = L, g, None

    def flush(self) -> None:
        if self.args is not None:
            _finish(self.L, self.g, *self.args)
            self.args = None

    def finish(self, *args) -> None:
        self.flush()
        self.args = args


def _reload_partials(L, g, oslot: Slot, region: Region) -> None:
    """Load partial sums already drained to DRAM into the block (ws/is, last row fold)."""
    shape, where = g.c_region(region)
    L.load("ofmap", oslot.offset, L.buffer_matrix(g.c, *shape), where)


def _out_rows(L, g, width: int, unit: int) -> int:
    """Rows of a `width`-column output block that fit an ofmap half with its bias row,
    in whole multiples of `unit` rows when at least one fits; refuse when not even
    min(unit, m) rows fit."""
    room = L.half_words("ofmap") - (width if g.bias is not None else 0)
    rows = room // (width * g.copies)
    need = min(unit, g.m)
    if rows < need:
        _refuse(L, f"half of the ofmap scratchpad ({L.half_words('ofmap')} words) cannot hold "
                   f"a {need}x{width} output tile{' and its bias row' if g.bias is not None else ''}")
    return rows if rows < unit else rows - rows % unit


# ---- output stationary ----------------------------------------------------------------------

def _os(L, g) -> None:
    acc = L.acc
    R, C = acc.rows, acc.cols
    Ha, Hb = L.half_words("ifmap"), L.half_words("filter")
    m, k, n = g.m, g.k, g.n
    mr, nc = min(R, m), min(C, n)
    if g.a_mode == "resident":
        a_mode = "resident"
    elif m * k <= Ha:
        a_mode = "all"
    elif mr * k <= Ha:
        a_mode = "rows"
    else:
        a_mode = "chunk"
    b_mode = "all" if k * n <= Hb else ("col" if k * nc <= Hb else "chunk")
    kc = k
    if a_mode == "chunk":
        kc = min(kc, Ha // mr)
    if b_mode == "chunk":
        kc = min(kc, Hb // nc)
    if kc < 1:
        _refuse(L, f"a half scratchpad cannot hold one {mr}-row slice of A and one "
                   f"{nc}-column slice of B")
    chunks = _even(k, kc)
    rows_blk = _out_rows(L, g, nc, R)
    group_a = max(1, Ha // (R * k)) if a_mode == "rows" else 0

    a_slot = b_slot = None
    if a_mode == "resident":
        a_slot = _load_a_resident(L, g)
    elif a_mode == "all":
        a_slot = L.load("ifmap", L.half("ifmap"), g.a, Region(0, m, 0, k))
    if b_mode == "all":
        b_slot = L.load("filter", L.half("filter"), g.b, Region(0, k, 0, n))
    for c0, c1 in _folds(n, C):
        nt = c1 - c0
        bcol = L.load("filter", L.half("filter"), g.b, Region(0, k, c0, c1)) if b_mode == "col" else None
        a_rows, a_origin = None, 0
        for br0, br1 in _folds(m, rows_blk):
            oslot = _block(L, br1 - br0, nt)
            for r0, r1 in ((r, min(r + R, br1)) for r in range(br0, br1, R)):
                if a_mode == "rows" and (r0 // R) % group_a == 0:
                    a_origin = r0
                    a_rows = L.load("ifmap", L.half("ifmap"), g.a, Region(r0, min(m, r0 + group_a * R), 0, k))
                for k0, k1 in chunks:
                    reg = Region(r0, r1, k0, k1)
                    if a_mode in ("resident", "all"):
                        a = _a_operand(g, a_slot, reg)
                    elif a_mode == "rows":
                        a = _a_operand(g, a_rows, reg, (a_origin, 0))
                    else:
                        a = _whole(L.load("ifmap", L.half("ifmap"), g.a, reg))
                    if b_mode == "all":
                        b = Operand(b_slot, Region(k0, k1, c0, c1))
                    elif b_mode == "col":
                        b = Operand(bcol, Region(k0, k1, 0, nt))
                    else:
                        b = _whole(L.load("filter", L.half("filter"), g.b, Region(k0, k1, c0, c1)))
                    dst = Operand(oslot, Region(r0 - br0, r1 - br0, 0, nt))
                    _pass(L, dst, a, b, r1 - r0, k1 - k0, nt, k0 > 0, k1 == k)
            _finish(L, g, oslot, Region(br0, br1, c0, c1), g.epilogue, False)


# ---- weight stationary ----------------------------------------------------------------------

def _a_source(L, g):
    """How A is held: ("resident" | "all", slot) loaded now, or ("fold", None)."""
    if g.a_mode == "resident":
        return "resident", _load_a_resident(L, g)
    if g.m * g.k <= L.half_words("ifmap"):
        return "all", L.load("ifmap", L.half("ifmap"), g.a, Region(0, g.m, 0, g.k))
    return "fold", None


def _partials(g, ri: int, n_row_folds: int):
    """(reload partial sums first, apply the epilogue, store accumulating) for row fold
    ri of a ws/is product."""
    last = ri == n_row_folds - 1
    reload = last and g.epilogue and n_row_folds > 1
    return reload, last and g.epilogue, ri > 0 and not reload


def _ws(L, g) -> None:
    acc = L.acc
    R, C = acc.rows, acc.cols
    Ha, Hb, Ho = L.half_words("ifmap"), L.half_words("filter"), L.half_words("ofmap")
    m, k, n = g.m, g.k, g.n
    kr, nc = min(R, k), min(C, n)
    if kr * nc > Hb:
        _refuse(L, f"half of the filter scratchpad ({Hb} words) cannot hold one {kr}x{nc} weight tile")
    a_how, a_slot = _a_source(L, g)
    # All of B in one filter half: loaded once up front (the model's prefetch), tiles
    # preloaded from it; else one weight tile per fold, double buffered.
    b_all = L.load("filter", L.half("filter"), g.b, Region(0, k, 0, n)) if k * n <= Hb else None

    def weights(k0, k1, c0, c1):
        """PRELOAD the weight tile B[k0:k1, c0:c1] (loading it first unless B is on chip)."""
        if b_all is not None:
            L.emit(Preload(Operand(b_all, Region(k0, k1, c0, c1)), L.tag))
        else:
            w = L.load("filter", L.half("filter"), g.b, Region(k0, k1, c0, c1))
            L.emit(Preload(_whole(w), L.tag))

    k_folds, n_folds = _folds(k, R), _folds(n, C)
    bias_row = 1 if g.bias is not None else 0
    whole_m = (a_how != "fold" or m * kr <= Ha) and (g.copies * m + bias_row) * nc <= Ho
    if whole_m:
        # Each fold streams all of A's rows: folds of one row fold share A's k-slice, and
        # consecutive column folds fill one block (m x several column folds).
        per_block = max(1, Ho // ((g.copies * m + bias_row) * C)) if n > C else 1
        for ri, (k0, k1) in enumerate(k_folds):
            reload, epi, accumulate = _partials(g, ri, len(k_folds))
            a_fold = L.load("ifmap", L.half("ifmap"), g.a, Region(0, m, k0, k1)) if a_how == "fold" else None
            done = _Deferred(L, g)
            for gi in range(0, len(n_folds), per_block):
                grp = n_folds[gi: gi + per_block]
                cg0, cg1 = grp[0][0], grp[-1][1]
                oslot = _block(L, m, cg1 - cg0)
                if reload:
                    _reload_partials(L, g, oslot, Region(0, m, cg0, cg1))
                done.flush()
                for c0, c1 in grp:
                    weights(k0, k1, c0, c1)
                    reg = Region(0, m, k0, k1)
                    a = _a_operand(g, a_fold, reg, (0, k0)) if a_how == "fold" else _a_operand(g, a_slot, reg)
                    _pass(L, Operand(oslot, Region(0, m, c0 - cg0, c1 - cg0)), a, ARRAY,
                          m, k1 - k0, c1 - c0, reload, True)
                done.finish(oslot, Region(0, m, cg0, cg1), epi, accumulate)
            done.flush()
        return
    # Large m: each fold streams A in chunks of rows that fit an ifmap half and an ofmap
    # half; only the fold's first chunk pays the fill.
    rows = _out_rows(L, g, nc, 1)
    if a_how == "fold":
        rows = min(rows, Ha // kr)
    for c0, c1 in n_folds:
        for ri, (k0, k1) in enumerate(k_folds):
            reload, epi, accumulate = _partials(g, ri, len(k_folds))
            weights(k0, k1, c0, c1)
            done = _Deferred(L, g)
            for m0, m1 in _even(m, rows):
                oslot = _block(L, m1 - m0, c1 - c0)
                if reload:
                    _reload_partials(L, g, oslot, Region(m0, m1, c0, c1))
                done.flush()
                reg = Region(m0, m1, k0, k1)
                if a_how == "fold":
                    a = _whole(L.load("ifmap", L.half("ifmap"), g.a, reg))
                else:
                    a = _a_operand(g, a_slot, reg)
                _pass(L, _whole(oslot), a, ARRAY, m1 - m0, k1 - k0, c1 - c0, reload, m0 == 0)
                done.finish(oslot, Region(m0, m1, c0, c1), epi, accumulate)
            done.flush()


# ---- input stationary -----------------------------------------------------------------------

def _is(L, g) -> None:
    acc = L.acc
    R, C = acc.rows, acc.cols
    Ha, Hb, Ho = L.half_words("ifmap"), L.half_words("filter"), L.half_words("ofmap")
    m, k, n = g.m, g.k, g.n
    kr, mc = min(R, k), min(C, m)
    if g.a_mode != "resident" and mc * kr > Ha:
        _refuse(L, f"half of the ifmap scratchpad ({Ha} words) cannot hold one {mc}x{kr} input tile")
    a_how, a_slot = _a_source(L, g)
    b_how = "all" if k * n <= Hb else ("fold" if kr * n <= Hb else "chunk")
    b_slot = L.load("filter", L.half("filter"), g.b, Region(0, k, 0, n)) if b_how == "all" else None
    k_folds, m_folds = _folds(k, R), _folds(m, C)

    def stationary(c0, c1, k0, k1):
        """PRELOAD the input tile A[c0:c1, k0:k1] (loading it first unless A is on chip)."""
        reg = Region(c0, c1, k0, k1)
        if a_how == "fold":
            a = _whole(L.load("ifmap", L.half("ifmap"), g.a, reg))
        else:
            a = _a_operand(g, a_slot, reg)
        L.emit(Preload(a, L.tag))

    bias_cols = n if g.bias is not None else 0
    if b_how != "chunk" and g.copies * mc * n + bias_cols <= Ho:
        # Each fold streams all of B's columns: folds of one row fold share B's k-slice,
        # and consecutive m folds fill one block (several m folds x n).
        per_block = max(1, (Ho - bias_cols) // (g.copies * C * n)) if m > C else 1
        for ri, (k0, k1) in enumerate(k_folds):
            reload, epi, accumulate = _partials(g, ri, len(k_folds))
            b_fold = L.load("filter", L.half("filter"), g.b, Region(k0, k1, 0, n)) if b_how == "fold" else None
            done = _Deferred(L, g)
            for gi in range(0, len(m_folds), per_block):
                grp = m_folds[gi: gi + per_block]
                mg0, mg1 = grp[0][0], grp[-1][1]
                oslot = _block(L, mg1 - mg0, n)
                if reload:
                    _reload_partials(L, g, oslot, Region(mg0, mg1, 0, n))
                done.flush()
                for c0, c1 in grp:
                    stationary(c0, c1, k0, k1)
                    b = Operand(b_slot, Region(k0, k1, 0, n)) if b_how == "all" else \
                        Operand(b_fold, Region(0, k1 - k0, 0, n))
                    _pass(L, Operand(oslot, Region(c0 - mg0, c1 - mg0, 0, n)), ARRAY, b,
                          c1 - c0, k1 - k0, n, reload, True)
                done.finish(oslot, Region(mg0, mg1, 0, n), epi, accumulate)
            done.flush()
        return
    # Large n: each fold streams B in column chunks that fit a filter half and an ofmap
    # half; only the fold's first chunk pays the fill.
    room = Ho // (g.copies * mc + (1 if g.bias is not None else 0))
    if room < 1:
        _refuse(L, f"half of the ofmap scratchpad ({Ho} words) cannot hold a {mc}x1 output tile")
    cols = room if b_how == "all" else min(room, Hb // kr)
    for c0, c1 in m_folds:
        for ri, (k0, k1) in enumerate(k_folds):
            reload, epi, accumulate = _partials(g, ri, len(k_folds))
            stationary(c0, c1, k0, k1)
            done = _Deferred(L, g)
            for n0, n1 in _even(n, cols):
                oslot = _block(L, c1 - c0, n1 - n0)
                if reload:
                    _reload_partials(L, g, oslot, Region(c0, c1, n0, n1))
                done.flush()
                reg = Region(k0, k1, n0, n1)
                b = Operand(b_slot, reg) if b_how == "all" else \
                    _whole(L.load("filter", L.half("filter"), g.b, reg))
                _pass(L, _whole(oslot), ARRAY, b, c1 - c0, k1 - k0, n1 - n0, reload, n0 == 0)
                done.finish(oslot, Region(c0, c1, n0, n1), epi, accumulate)
            done.flush()
