"""A one-row product split between the array and the vector unit
(targets.vector_share: the split, its figures and why).

The array part is the product's first columns, tiled as any product in the dataflow the
split names; its input row is loaded whole into an ifmap half. The vector part reads that
same row and streams the last columns of B, as rows of B transposed, through two slots in
the other ifmap half: one VEC dot per slot (VEC dotacc adds a later k-chunk of a long
row), the results a column of the ofmap's top words with the bias loaded beside them,
then the bias add, the activation and one STORE.

The units run their instructions in stream order, so the two parts' instructions are
interleaved by when each would run if the parts kept pace (the array's pass cycles, the
vector unit's VEC cycles): neither part's DMA or vector work queues behind the other's.
"""
from __future__ import annotations

import dataclasses

from apsat.backends.systolic.dataflows import TILINGS
from apsat.backends.systolic.isa import Load, Operand, Region, Slot, Store, Vec
from apsat.backends.systolic.tiles import whole
from apsat.backends.systolic.timing import footprint_of
from apsat.errors import ApsatError
from apsat.targets.vector_share import VectorShare, k_chunks, vector_rows, vector_slot


def shareable(g) -> bool:
    """Whether product `g` can be split at all: one dense row, a plain output (not placed
    in a larger matrix), no zipped or starting operand, not batched. (The cost model
    prices the product alone; where it priced a split that one of these forbids, the
    product runs whole on the array, slower than priced. None arises in the light zoo.)"""
    return (g.m == 1 and g.a_mode == "dense" and g.res is None and g.start is None
            and not g.c_rows and not g.c_cols and g.blocks == 1)


def lower_shared(L, g, share: VectorShare) -> None:
    """Emit product `g` split as `share` says (see the module docstring)."""
    na = g.n - share.cols
    vector_half = L.half("ifmap")            # the array part's input row takes the other half
    L.dataflow = share.array.dataflow
    group = L.stream.groups[L.tag]
    group.dataflow, group.vector_cols = L.dataflow, share.cols
    group.label += f" (vector unit: {share.cols} of {g.n} columns)"
    part = dataclasses.replace(g, n=na, b=_columns(L, g.b, 0, na), c_cols=g.n, c_col0=0,
                               bias=None if g.bias is None else _columns(L, g.bias, 0, na))
    main, L.seq = L.seq, []
    TILINGS[L.dataflow](L, part)
    array_part, L.seq = L.seq, main
    row = _input_row(L, array_part, g)
    vector_part = _vector_part(L, g, na, row, vector_half)
    array_fp, vector_fp = _footprints(L, array_part), _footprints(L, vector_part)
    _check_apart(L, array_fp, vector_fp, row)
    for ins in _interleave(array_part, array_fp, vector_part, vector_fp):
        L.emit(ins)


def _columns(L, view: str, c0: int, c1: int) -> str:
    """Columns [c0, c1) of a matrix view."""
    v = L.stream.views[view]
    return L.view(v.base, tuple(v.steps) + (("slice", 1, c0, c1),))


def _rows_of_transpose(L, view: str) -> str:
    """A matrix view read transposed (its columns as rows)."""
    v = L.stream.views[view]
    return L.view(v.base, tuple(v.steps) + (("transpose", (1, 0)),))


def _input_row(L, instructions, g) -> Slot:
    """The slot the array part loaded its whole input row into."""
    for ins in instructions:
        if isinstance(ins, Load) and ins.src == g.a and ins.region == Region(0, 1, 0, g.k):
            return ins.dst
    raise ApsatError(f"accelerator {L.acc.name!r}: internal: the array part of a shared "
                     "product did not hold its input row whole")


def _vector_part(L, g, na: int, row: Slot, half: int) -> list:
    """The shared columns' instructions in order: the slots' loads one VEC ahead, the
    dots, the bias add, the activation, the store."""
    acc, k, cols = L.acc, g.k, g.n - na
    words, rows = vector_slot(acc), vector_rows(acc, k, cols)
    bt = _rows_of_transpose(L, g.b)
    out = Slot("ofmap", acc.ofmap_words - 2 * cols, cols, 1)
    units = [(r0, min(r0 + rows, cols), k0, k1) for r0 in range(0, cols, rows) for k0, k1 in k_chunks(k, words)]
    loads = [_load(L, Slot("ifmap", half + (i % 2) * words, r1 - r0, k1 - k0), bt, Region(na + r0, na + r1, k0, k1))
             for i, (r0, r1, k0, k1) in enumerate(units)]
    seq = loads[:2]
    for i, (r0, r1, k0, k1) in enumerate(units):
        mode = "dot" if k0 == 0 else "dotacc"
        seq.append(Vec(mode, "dot-product", Operand(out, Region(r0, r1, 0, 1)),
                       (Operand(row, Region(0, 1, k0, k1)), whole(loads[i].dst)), (), L.tag))
        if i + 2 < len(loads):
            seq.append(loads[i + 2])
    if g.bias is not None:
        bias = Slot("ofmap", out.offset + cols, cols, 1)
        seq.append(_load(L, bias, _rows_of_transpose(L, g.bias), Region(na, g.n, 0, 1)))
        seq.append(Vec("bias", "add", whole(out), (whole(out), whole(bias)), (), L.tag))
    if g.act is not None:
        seq.append(Vec("map", g.act, whole(out), (whole(out),), (), L.tag))
    seq.append(Store(g.c, (g.n, 1), Region(na, g.n, 0, 1), out, False, L.tag))
    return seq


def _load(L, slot: Slot, view: str, region: Region) -> Load:
    """A LOAD of `region` of `view` into `slot`, not yet emitted."""
    return Load(slot, view, region, L.dram_words(view, region.size), L.tag)


def _footprints(L, instructions) -> list:
    """(units, cycles, scratchpad word ranges) of each instruction, as the cycle model
    sees them (timing.footprint_of)."""
    out = []
    for ins in instructions:
        units, cycles, reads, writes, _, _ = footprint_of(L.stream, ins)
        out.append((units, cycles, {r for r in reads + writes if r[0].startswith("sp:")}))
    return out


def _check_apart(L, array_fp, vector_fp, row: Slot) -> None:
    """The two parts share no scratchpad words but the input row (they run at once)."""
    taken = set().union(*(ranges for _, _, ranges in array_fp))
    sp, lo_row, hi_row = "sp:" + row.sp, row.offset, row.offset + row.words
    for name, lo, hi in set().union(*(ranges for _, _, ranges in vector_fp)):
        if name == sp and lo_row <= lo and hi <= hi_row:
            continue            # the input row, which the vector part only reads
        for other, o_lo, o_hi in taken:
            if other == name and lo < o_hi and o_lo < hi:
                raise ApsatError(f"accelerator {L.acc.name!r}: internal: a shared product's vector "
                                 f"part ({name}[{lo}:{hi})) overlaps its array part ({other}[{o_lo}:{o_hi}))")


def _interleave(array_part, array_fp, vector_part, vector_fp):
    """The two instruction lists merged by their unwaited start times on their own unit
    (the array's pass cycles, the vector unit's VEC cycles; each list keeps its order,
    ties go to the array part)."""
    a = _start_times(array_part, array_fp, "array")
    v = _start_times(vector_part, vector_fp, "vector")
    i = j = 0
    while i < len(a) or j < len(v):
        if j == len(v) or (i < len(a) and a[i][0] <= v[j][0]):
            yield a[i][1]
            i += 1
        else:
            yield v[j][1]
            j += 1


def _start_times(instructions, fps, unit: str) -> list:
    """(when the instruction would start if `unit` never waited, instruction)."""
    t, out = 0, []
    for ins, (units, cycles, _) in zip(instructions, fps):
        out.append((t, ins))
        t += cycles if unit in units else 0
    return out
