"""The three dataflows' tilings of a GEMM (gemm.py describes the scheme): output stationary
(`os`), weight stationary (`ws`) and input stationary (`is`), and a flexible array's
fourth loop order, `osk` (os reading B once per output block). Each emits the
instructions of one product whose a_mode is set; `TILINGS` maps a dataflow to its
function."""
from __future__ import annotations

from apsat.backends.systolic.isa import ARRAY, Operand, Preload, Region
from apsat.backends.systolic.tiles import (Deferred, a_operand, bias_row, emit_pass, even_chunks, folds, load_a_resident, out_block, out_rows, refuse,
                                           reload_partials, start_block, whole)
from apsat.targets.systolic import os_blocking


def _sizes(L, g):
    """(rows, cols, ifmap half, filter half, ofmap half, m, k, n): what every tiling sizes
    its folds and blocks by."""
    half = L.half_words
    return (L.acc.rows, L.acc.cols, half("ifmap"), half("filter"), half("ofmap"), g.m, g.k, g.n)


# ---- output stationary ----------------------------------------------------------------------

def _os(L, g, b_whole: bool = False) -> None:
    """os; with `b_whole`, a column block of B that does not fit a filter half is loaded
    into the whole filter scratchpad, once per column fold (osk's first case)."""
    R, C, Ha, _, _, m, k, n = _sizes(L, g)
    a_mode, b_mode, chunks = _os_modes(L, g, b_whole)
    rows_blk = out_rows(L, g, min(C, n), R)
    group_a = max(1, Ha // (R * k)) if a_mode == "rows" else 0

    # A's rows for the passes: all of A, or (a_mode "rows") the row folds loaded last, whose
    # first row is a_origin
    a_held, a_origin, b_slot = None, 0, None
    if a_mode == "resident":
        a_held = load_a_resident(L, g)
    elif a_mode == "all":
        a_held = L.load("ifmap", L.half("ifmap"), g.a, Region(0, m, 0, k))
    if b_mode == "all":
        b_slot = L.load("filter", L.half("filter"), g.b, Region(0, k, 0, n))
    done = Deferred(L, g)       # across column folds too: the next block's bias row goes first
    for c0, c1 in folds(n, C):
        nt = c1 - c0
        bcol = (L.load("filter", 0 if b_whole else L.half("filter"), g.b, Region(0, k, c0, c1))
                if b_mode == "col" else None)
        for br0, br1 in folds(m, rows_blk):
            oslot = out_block(L, br1 - br0, nt)
            started = start_block(L, g, oslot, Region(br0, br1, c0, c1))
            brow = bias_row(L, g, oslot, Region(br0, br1, c0, c1))
            done.ready()        # the previous block's store queues behind this bias row
            for r0, r1 in ((r, min(r + R, br1)) for r in range(br0, br1, R)):
                if a_mode == "rows" and (r0 // R) % group_a == 0:
                    a_origin = r0
                    a_held = L.load("ifmap", L.half("ifmap"), g.a, Region(r0, min(m, r0 + group_a * R), 0, k))
                for k0, k1 in chunks:
                    reg = Region(r0, r1, k0, k1)
                    a = (whole(L.load("ifmap", L.half("ifmap"), g.a, reg)) if a_mode == "chunk"
                         else a_operand(g, a_held, reg, (a_origin, 0)))
                    b = _os_b(L, g, b_mode, b_slot, bcol, Region(k0, k1, c0, c1))
                    dst = Operand(oslot, Region(r0 - br0, r1 - br0, 0, nt))
                    emit_pass(L, dst, a, b, r1 - r0, k1 - k0, nt, k0 > 0 or started, k1 == k,
                              brow if k0 == 0 else None)
            done.finish(oslot, Region(br0, br1, c0, c1), g.epilogue, False)
    done.flush()


def _os_modes(L, g, b_whole: bool) -> tuple[str, str, list[tuple[int, int]]]:
    """How os holds its operands, and its k-chunks: (a_mode, b_mode, chunks). A is
    "resident" (an on-chip im2col input), "all" (in an ifmap half), "rows" (slices of
    row folds, as many as fit an ifmap half per load) or "chunk" (loaded per pass); B is
    "all", "col" (a column fold's block per load) or "chunk". Refuses when a scratchpad
    half cannot hold even a one-wide k-chunk of the operands loaded per pass."""
    R, C, Ha, Hb, _, m, k, n = _sizes(L, g)
    mr, nc = min(R, m), min(C, n)
    if g.a_mode == "resident":
        a_mode = "resident"
    elif m * k <= Ha:
        a_mode = "all"
    elif mr * k <= Ha:
        a_mode = "rows"
    else:
        a_mode = "chunk"
    b_mode = "all" if k * n <= Hb else ("col" if k * nc <= Hb or b_whole else "chunk")
    kc = k
    if a_mode == "chunk":
        kc = min(kc, Ha // mr)
    if b_mode == "chunk":
        kc = min(kc, Hb // nc)
    if kc < 1:
        refuse(L, f"a half scratchpad cannot hold one {mr}-row slice of A and one "
                   f"{nc}-column slice of B")
    return a_mode, b_mode, even_chunks(k, kc)


def _os_b(L, g, b_mode: str, b_slot, bcol, reg: Region) -> Operand:
    """B's operand for the pass over `reg` (a k-chunk of a column fold, in B's
    coordinates): from all of B (`b_slot`), from the column fold's block (`bcol`), or
    loaded now."""
    if b_mode == "all":
        return Operand(b_slot, reg)
    if b_mode == "col":
        return Operand(bcol, Region(reg.r0, reg.r1, 0, reg.c1 - reg.c0))
    return whole(L.load("filter", L.half("filter"), g.b, reg))


def _osk(L, g) -> None:
    """osk (targets.systolic.os_blocking): per column fold and output block, each chunk of
    B is loaded once and passes through all the block's row folds, which accumulate in
    the block (each chunk's pass pays the fill); B's column block in the whole filter
    scratchpad when it fits there (os's passes, B read once per column fold)."""
    R, C, _, _, _, m, k, n = _sizes(L, g)
    chunk = os_blocking(L.acc, m, k, n)
    if chunk is None or chunk >= k:
        _os(L, g, b_whole=chunk is not None)
        return
    nc = min(C, n)
    _, a_slot = _a_source(L, g)             # None: A's slices are loaded per pass
    chunks = even_chunks(k, chunk)
    done = Deferred(L, g)
    for c0, c1 in folds(n, C):
        nt = c1 - c0
        for br0, br1 in folds(m, out_rows(L, g, nc, R)):
            region = Region(br0, br1, c0, c1)
            oslot = out_block(L, br1 - br0, nt)
            started = start_block(L, g, oslot, region)
            brow = bias_row(L, g, oslot, region)
            done.ready()
            for ci, (k0, k1) in enumerate(chunks):
                b = whole(L.load("filter", L.half("filter"), g.b, Region(k0, k1, c0, c1)))
                for r0, r1 in folds(br1 - br0, R):
                    reg = Region(br0 + r0, br0 + r1, k0, k1)
                    a = (a_operand(g, a_slot, reg) if a_slot is not None
                         else whole(L.load("ifmap", L.half("ifmap"), g.a, reg)))
                    emit_pass(L, Operand(oslot, Region(r0, r1, 0, nt)), a, b, r1 - r0, k1 - k0, nt,
                              ci > 0 or started, True, brow if ci == 0 else None)
            done.finish(oslot, region, g.epilogue, False)
    done.flush()


# Output blocks a pipelined fold rotates through (see _chunked_folds).
PIPELINED_SLOTS = 4


def _slot_room(L, g, spatial: int, spatial_rows: bool) -> int:
    """How much of the streamed dimension fits one of PIPELINED_SLOTS equal parts of the
    ofmap beside `spatial` outputs of the other (0: none): rows of a ws block (`spatial`
    columns, its bias row after it), columns of an is block (`spatial` rows, one bias
    word a column)."""
    words = L.acc.ofmap_words // PIPELINED_SLOTS
    bias = g.bias is not None
    if spatial_rows:
        return words // (g.copies * spatial + bias)
    return (words - (spatial if bias else 0)) // (spatial * g.copies)


# ---- weight and input stationary ------------------------------------------------------------
# The two are mirror images: ws holds weight tiles (k x n folds) and streams A's m rows; is
# holds input tiles (k x m folds) and streams B's n columns. Their spatial folds are the
# output's columns (ws) or rows (is), the streamed dimension the other; the loops below
# take that orientation and what differs (how each operand is held) as arguments.

def _a_source(L, g):
    """How A is held: ("resident" | "all", slot) loaded now, or ("fold", None)."""
    if g.a_mode == "resident":
        return "resident", load_a_resident(L, g)
    if g.m * g.k <= L.half_words("ifmap"):
        return "all", L.load("ifmap", L.half("ifmap"), g.a, Region(0, g.m, 0, g.k))
    return "fold", None


def _partials(g, ri: int, n_row_folds: int):
    """(reload partial sums first, apply the epilogue, store accumulating) for row fold
    ri of a ws/is product. (The first row fold starts from g.start where there is one:
    _start.)"""
    last = ri == n_row_folds - 1
    reload = last and g.epilogue and n_row_folds > 1
    return reload, last and g.epilogue, ri > 0 and not reload


def _start(L, g, oslot, region, ri: int, reload: bool) -> bool:
    """Load what the block's passes in row fold ri accumulate onto (the partial sums when
    reloading, g.start in the first row fold); whether they accumulate."""
    if reload:
        reload_partials(L, g, oslot, region)
        return True
    return ri == 0 and start_block(L, g, oslot, region)


def _region(spatial_rows: bool, s0, s1, t0, t1) -> Region:
    """The output region of spatial range [s0, s1) and streamed range [t0, t1): is's
    spatial folds are output rows, ws's output columns."""
    return Region(s0, s1, t0, t1) if spatial_rows else Region(t0, t1, s0, s1)


def _grouped_folds(L, g, k_folds, s_folds, per_block, t_size, spatial_rows, load_fold, preload, fold_pass):
    """Each fold streams the whole streamed dimension (t_size): row folds outer, and the
    spatial folds of one row fold grouped `per_block` to an output block. load_fold(k0, k1)
    loads what the row fold's passes share; preload(s0, s1, k0, k1) holds a stationary
    tile; fold_pass(dst, shared, s0, s1, k0, k1, onto, bias) emits its pass (onto: it
    accumulates onto what _start loaded; bias: the block's bias row in the first row
    fold, which starts the sums)."""
    for ri, (k0, k1) in enumerate(k_folds):
        reload, epi, accumulate = _partials(g, ri, len(k_folds))
        shared = load_fold(k0, k1)
        done = Deferred(L, g)
        for gi in range(0, len(s_folds), per_block):
            grp = s_folds[gi: gi + per_block]
            g0 = grp[0][0]
            region = _region(spatial_rows, g0, grp[-1][1], 0, t_size)
            oslot = out_block(L, region.rows, region.cols)
            onto = _start(L, g, oslot, region, ri, reload)
            brow = bias_row(L, g, oslot, region) if ri == 0 else None
            done.ready()
            for s0, s1 in grp:
                preload(s0, s1, k0, k1)
                dst = Operand(oslot, _region(spatial_rows, s0 - g0, s1 - g0, 0, t_size))
                fold_pass(dst, shared, s0, s1, k0, k1, onto, brow)
            done.finish(oslot, region, epi, accumulate)
        done.flush()


def _chunked_folds(L, g, s_folds, k_folds, t_chunks, spatial_rows, preload, chunk_pass, pipelined_chunks=None):
    """The streamed dimension in chunks that fit the scratchpads: per spatial fold and
    row fold the stationary tile is held once and the chunks pass one after the other
    (only the first pays the fill), each into its own output block. chunk_pass(oslot, s0,
    s1, k0, k1, t0, t1, onto, bias) emits a chunk's pass (onto, bias as in _grouped_folds).
    A fold whose blocks need the ofmap DMA or the vector unit besides their store (a
    partial-sum reload, a bias row, an epilogue) takes `pipelined_chunks` (chunks that
    fit a quarter of the ofmap, when given): with two halves a block's pass would wait for
    the block before last to finish its epilogue and store, and for the reload or bias
    row queued behind that store, on every chunk. Such a fold that ends a spatial fold
    hands its held stores on to the next spatial fold when that one is pipelined too
    (their output regions are disjoint): else the next fold's first bias row or start
    would queue behind the last epilogue's store, and the array wait for both."""
    last = len(k_folds) - 1
    done = None
    for si, (s0, s1) in enumerate(s_folds):
        for ri, (k0, k1) in enumerate(k_folds):
            reload, epi, accumulate = _partials(g, ri, len(k_folds))
            preload(s0, s1, k0, k1)
            pipelined = _pipelined(g, ri, last, epi, reload, pipelined_chunks)
            slots = PIPELINED_SLOTS if pipelined else 2
            done = done or Deferred(L, g, slots // 2)
            for t0, t1 in (pipelined_chunks if pipelined else t_chunks):
                region = _region(spatial_rows, s0, s1, t0, t1)
                oslot = out_block(L, region.rows, region.cols, slots)
                onto = _start(L, g, oslot, region, ri, reload)
                brow = bias_row(L, g, oslot, region) if ri == 0 else None
                done.ready()
                chunk_pass(oslot, s0, s1, k0, k1, t0, t1, onto, brow)
                done.finish(oslot, region, epi, accumulate)
            carry = (ri == last and si + 1 < len(s_folds) and pipelined
                     and _pipelined(g, 0, last, epi and last == 0, False, pipelined_chunks))
            if not carry:
                done.flush()
                done = None


def _pipelined(g, ri: int, last: int, epi: bool, reload: bool, pipelined_chunks) -> bool:
    """Whether row fold ri takes the quarter blocks (_chunked_folds): its blocks need
    the vector unit (an epilogue) or the ofmap DMA (a reload, a bias row, a start)
    besides their store, and quarter chunks were given."""
    loads = ri == 0 and (g.bias is not None or g.start is not None)
    return pipelined_chunks is not None and (epi or reload or loads)


def _ws(L, g) -> None:
    R, C, Ha, Hb, Ho, m, k, n = _sizes(L, g)
    kr, nc = min(R, k), min(C, n)
    if kr * nc > Hb:
        refuse(L, f"half of the filter scratchpad ({Hb} words) cannot hold one {kr}x{nc} weight tile")
    a_how, a_slot = _a_source(L, g)
    # All of B in one filter half: loaded once up front (the model's prefetch), tiles
    # preloaded from it; else one weight tile per fold, double buffered.
    b_all = L.load("filter", L.half("filter"), g.b, Region(0, k, 0, n)) if k * n <= Hb else None

    def weights(c0, c1, k0, k1):
        """PRELOAD the weight tile B[k0:k1, c0:c1] (loading it first unless B is on chip)."""
        if b_all is not None:
            L.emit(Preload(Operand(b_all, Region(k0, k1, c0, c1)), L.tag))
        else:
            w = L.load("filter", L.half("filter"), g.b, Region(k0, k1, c0, c1))
            L.emit(Preload(whole(w), L.tag))

    k_folds, n_folds = folds(k, R), folds(n, C)
    bias_rows = 1 if g.bias is not None else 0      # the block's bias row (tiles.bias_row)
    if (a_how != "fold" or m * kr <= Ha) and (g.copies * m + bias_rows) * nc <= Ho:
        # Each fold streams all of A's rows: folds of one row fold share A's k-slice, and
        # consecutive column folds fill one block (m x several column folds).
        per_block = max(1, Ho // ((g.copies * m + bias_rows) * C)) if n > C else 1

        def a_fold(k0, k1):
            return L.load("ifmap", L.half("ifmap"), g.a, Region(0, m, k0, k1)) if a_how == "fold" else None

        def fold_pass(dst, held, c0, c1, k0, k1, onto, brow):
            reg = Region(0, m, k0, k1)
            a = a_operand(g, held, reg, (0, k0)) if a_how == "fold" else a_operand(g, a_slot, reg)
            emit_pass(L, dst, a, ARRAY, m, k1 - k0, c1 - c0, onto, True, brow)

        _grouped_folds(L, g, k_folds, n_folds, per_block, m, False, a_fold, weights, fold_pass)
        return
    # Large m: each fold streams A in chunks of rows that fit an ifmap half and an ofmap
    # half; only the fold's first chunk pays the fill.
    rows = out_rows(L, g, nc, 1)
    if a_how == "fold":
        rows = min(rows, Ha // kr)

    def chunk_pass(oslot, c0, c1, k0, k1, m0, m1, onto, brow):
        reg = Region(m0, m1, k0, k1)
        a = whole(L.load("ifmap", L.half("ifmap"), g.a, reg)) if a_how == "fold" else a_operand(g, a_slot, reg)
        emit_pass(L, whole(oslot), a, ARRAY, m1 - m0, k1 - k0, c1 - c0, onto, m0 == 0, brow)

    quarter = _slot_room(L, g, nc, False)
    if a_how == "fold":
        quarter = min(quarter, Ha // kr)
    _chunked_folds(L, g, n_folds, k_folds, even_chunks(m, rows), False, weights, chunk_pass,
                   even_chunks(m, quarter) if quarter >= 1 else None)


def _is(L, g) -> None:
    R, C, Ha, Hb, Ho, m, k, n = _sizes(L, g)
    kr, mc = min(R, k), min(C, m)
    if g.a_mode != "resident" and mc * kr > Ha:
        refuse(L, f"half of the ifmap scratchpad ({Ha} words) cannot hold one {mc}x{kr} input tile")
    a_how, a_slot = _a_source(L, g)
    b_how = "all" if k * n <= Hb else ("fold" if kr * n <= Hb else "chunk")
    b_slot = L.load("filter", L.half("filter"), g.b, Region(0, k, 0, n)) if b_how == "all" else None
    k_folds, m_folds = folds(k, R), folds(m, C)

    def stationary(c0, c1, k0, k1):
        """PRELOAD the input tile A[c0:c1, k0:k1] (loading it first unless A is on chip)."""
        reg = Region(c0, c1, k0, k1)
        if a_how == "fold":
            a = whole(L.load("ifmap", L.half("ifmap"), g.a, reg))
        else:
            a = a_operand(g, a_slot, reg)
        L.emit(Preload(a, L.tag))

    bias_cols = n if g.bias is not None else 0
    if b_how != "chunk" and g.copies * mc * n + bias_cols <= Ho:
        # Each fold streams all of B's columns: folds of one row fold share B's k-slice,
        # and consecutive m folds fill one block (several m folds x n).
        per_block = max(1, (Ho - bias_cols) // (g.copies * C * n)) if m > C else 1

        def b_fold(k0, k1):
            return L.load("filter", L.half("filter"), g.b, Region(k0, k1, 0, n)) if b_how == "fold" else None

        def fold_pass(dst, held, c0, c1, k0, k1, onto, brow):
            b = Operand(b_slot, Region(k0, k1, 0, n)) if b_how == "all" else Operand(held, Region(0, k1 - k0, 0, n))
            emit_pass(L, dst, ARRAY, b, c1 - c0, k1 - k0, n, onto, True, brow)

        _grouped_folds(L, g, k_folds, m_folds, per_block, n, True, b_fold, stationary, fold_pass)
        return
    # Large n: each fold streams B in column chunks that fit a filter half and an ofmap
    # half; only the fold's first chunk pays the fill.
    room = Ho // (g.copies * mc + (1 if g.bias is not None else 0))
    if room < 1:
        refuse(L, f"half of the ofmap scratchpad ({Ho} words) cannot hold a {mc}x1 output tile")
    cols = room if b_how == "all" else min(room, Hb // kr)

    def chunk_pass(oslot, c0, c1, k0, k1, n0, n1, onto, brow):
        reg = Region(k0, k1, n0, n1)
        b = Operand(b_slot, reg) if b_how == "all" else whole(L.load("filter", L.half("filter"), g.b, reg))
        emit_pass(L, whole(oslot), ARRAY, b, c1 - c0, k1 - k0, n1 - n0, onto, n0 == 0, brow)

    quarter = _slot_room(L, g, mc, True)
    if b_how != "all":
        quarter = min(quarter, Hb // kr)
    _chunked_folds(L, g, m_folds, k_folds, even_chunks(n, cols), True, stationary, chunk_pass,
                   even_chunks(n, quarter) if quarter >= 1 else None)


TILINGS = {"os": _os, "ws": _ws, "is": _is, "osk": _osk}
