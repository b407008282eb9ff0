"""The vector unit and the DMA copies.

`compute OP x` runs on the vector unit in tiles that fit scratchpad halves: LOAD the
operand tile(s) (ifmap, and filter for the second operand of a pair), VEC into an ofmap
half, STORE; consecutive tiles alternate halves, so the DMA overlaps the vector unit.
Three shapes of work:

  map  a unary elementwise operator (relu, clip, exp, sigmoid, ...): the operand is read
       as one flat row and cut into chunks.
  zip  an elementwise operator over `access-pair a b` (add, mul, sub, div, pow): a and b
       flat, chunk by chunk (a broadcast operand reads only its distinct words).
  row  anything that works on a whole item (reductions such as pooling, softmax,
       layer-norm, LRN, n-ary ops over a single operand): rows of (iterated) x (item),
       several rows a tile.
  axis0  an operator that works across the item's first axis only, independently at
       every position of the rest (LRN across channels, n-ary ops over a single
       operand) when a whole item does not fit: each tile is item[0] rows by a chunk of
       the rest. An item that fits no mode is a HOST step.

`compute dot-product` over an access-pair (a grouped or depthwise convolution) goes to
grouped.py: one GEMM per group on the array, or VEC dot on the vector unit. Any other
dot-product off the array is a HOST step (the host does it one MAC a cycle, as the cost
model prices it). Copies (access-transpose, -pad, -concatenate) are DMA COPYs
from DRAM to DRAM through an address pattern (a transpose or pad step added to the
operand's view); a concatenation is one COPY per part.
"""
from __future__ import annotations

import math
from functools import lru_cache

from apsat.backends.systolic import inplace
from apsat.backends.systolic.split_item import lower_split
from apsat.backends.systolic.isa import Copy, Gather, Operand, Region, Slot, Store, Vec
from apsat.lang.ops import COMPUTE_OPS, NARY_OPS, UNARY_MAPS

# The registry's operator classes: unary maps (UNARY_MAPS) run as maps, n-ary operators
# that take two operands as zips over a pair, operators that combine values across the item's first
# axis only (the rest independent) as axis0 tiles when an item does not fit.
PAIRWISE = frozenset(n for n in NARY_OPS if COMPUTE_OPS[n].arity in (0, 2))
FIRST_AXIS = frozenset(n for n, s in COMPUTE_OPS.items() if s.first_axis)


def op_text(op) -> str:
    """A compute operator term as surface syntax: `relu`, `(clip 0.0 6.0)`,
    `(chain elementwise-add relu)`. A chain runs as one VEC with this text: a zip when its
    first part is pairwise over an access-pair, a map when every part is unary, else a row
    (a chain over n-ary operands whose item does not fit a scratchpad half is a HOST step:
    FIRST_AXIS names no chain); the simulator evaluates the text through the reference
    semantics (apsat.lang.semantics.apply_compute), which applies the parts in order."""
    from apsat.lang.syntax import compute_op_text

    return compute_op_text(op)


def parse_op(text: str) -> tuple[str, tuple]:
    """(name, params) of an operator written by op_text; a chain's params are its two
    operator terms (what apsat.lang.semantics.apply_compute takes)."""
    op = operator_term(text)
    return op.op, op.args


@lru_cache(maxsize=None)
def operator_term(text: str):
    """The operator term op_text wrote as `text`. Cached: the simulator and the cycle model
    read it for every VEC of a stream, and a stream repeats a few operators many times."""
    from apsat.lang.syntax import parse_compute_op

    return parse_compute_op(text)


def op_parts(op) -> tuple[str, ...]:
    """Names of the operators `op` applies, in order: a chain's parts (F first, then its
    unary maps), else just op's name. A chain runs as map or zip like its parts would."""
    from apsat.lang.ops import chain_parts

    return tuple(part.op for part in chain_parts(op))


def _flat(L, term, what: str):
    base, steps = L.need_chain(term, what)
    size = math.prod(L.dims(term))
    return L.matrix(base, steps, 1, size), size


def lower_compute(L, t) -> None:
    """`compute OP x` on the vector unit (see the module docstring)."""
    from apsat.backends.systolic.lower import Unlowerable

    op, x = t.args
    name = op.op
    if name == "dot-product":
        return _dot_product(L, t, x)
    it, item = L.program.shape_of(x)
    out = L.buf_of[t]
    text = op_text(op)
    parts = op_parts(op)
    if x.op == "access-pair" and parts[0] in PAIRWISE and all(p in UNARY_MAPS for p in parts[1:]):
        a, sa = _flat(L, x.args[0], f"{name}'s first operand")
        b, _ = _flat(L, x.args[1], f"{name}'s second operand")
        L.begin(t, "vector", name)
        step = min(L.half_words(sp) for sp in ("ifmap", "filter", "ofmap"))
        for e0 in range(0, sa, step):
            reg = Region(0, 1, e0, min(sa, e0 + step))
            sa_ = L.load("ifmap", L.half("ifmap"), a, reg)
            sb_ = L.load("filter", L.half("filter"), b, reg)
            dst = Slot("ofmap", L.half("ofmap"), 1, reg.cols)
            L.emit(Vec("zip", text, _w(dst), (_w(sa_), _w(sb_)), (), L.tag))
            L.emit(Store(out, (1, sa), reg, dst, False, L.tag))
        return
    if all(p in UNARY_MAPS for p in parts):
        a, size = _flat(L, x, f"{name}'s operand")
        L.begin(t, "vector", name)
        step = min(L.half_words("ifmap"), L.half_words("ofmap"))
        for e0 in range(0, size, step):
            reg = Region(0, 1, e0, min(size, e0 + step))
            src = L.load("ifmap", L.half("ifmap"), a, reg)
            dst = Slot("ofmap", L.half("ofmap"), 1, reg.cols)
            L.emit(Vec("map", text, _w(dst), (_w(src),), (), L.tag))
            L.emit(Store(out, (1, size), reg, dst, False, L.tag))
        return
    base, steps = L.need_chain(x, f"{name}'s operand")
    rows, cols = math.prod(it), math.prod(item)
    out_cols = math.prod(COMPUTE_OPS[name].item_shape(op.args, tuple(item)))
    per = min(L.half_words("ifmap") // max(cols, 1), L.half_words("ofmap") // max(out_cols, 1))
    if per < 1 and name in FIRST_AXIS and len(item) > 1:
        _axis0(L, t, base, steps, name, text, rows, tuple(item), out_cols)
        return
    if per < 1 and lower_split(L, t, tuple(it), tuple(item), min(L.half_words("ifmap"), L.half_words("ofmap"))):
        return
    if per < 1:
        raise Unlowerable(f"{name}: an item of {cols} elements does not fit half of a scratchpad")
    a = L.matrix(base, steps, rows, cols)
    L.begin(t, "vector", name)
    for r0 in range(0, rows, per):
        r1 = min(rows, r0 + per)
        src = L.load("ifmap", L.half("ifmap"), a, Region(r0, r1, 0, cols))
        dst = Slot("ofmap", L.half("ofmap"), r1 - r0, out_cols)
        L.emit(Vec("row", text, _w(dst), (_w(src),), tuple(item), L.tag))
        L.emit(Store(out, (rows, out_cols), Region(r0, r1, 0, out_cols), dst, False, L.tag))


def _dot_product(L, t, x) -> None:
    """A dot-product the extractor did not map to systolic-array: over a cartesian product,
    mapped onto the array here (split_item.lower_as_matmul); over a pair, grouped.py; else
    Unlowerable (a HOST step)."""
    from apsat.backends.systolic.lower import Unlowerable

    if x.op == "access-cartesian-product":
        from apsat.backends.systolic.split_item import lower_as_matmul

        return lower_as_matmul(L, t)
    if x.op != "access-pair":
        raise Unlowerable("dot-product left off the array (the extractor did not map it to systolic-array)")
    from apsat.backends.systolic.grouped import lower_pair_dot

    return lower_pair_dot(L, t)


def _axis0(L, t, base, steps, name, text, rows, item, out_cols) -> None:
    """Tiles of item[0] x a chunk of the rest (see `axis0` in the module docstring)."""
    from apsat.backends.systolic.lower import Unlowerable

    first, rest = item[0], math.prod(item[1:])
    out_first = out_cols // rest
    chunk = min(L.half_words("ifmap") // first, L.half_words("ofmap") // out_first)
    if chunk < 1:
        raise Unlowerable(f"{name}: {first} values across the item's first axis do not fit "
                          "half of a scratchpad")
    a = L.matrix(base, steps, rows * first, rest)
    out = L.buf_of[t]
    L.begin(t, "vector", name)
    for r in range(rows):
        for j0 in range(0, rest, chunk):
            j1 = min(rest, j0 + chunk)
            src = L.load("ifmap", L.half("ifmap"), a, Region(r * first, (r + 1) * first, j0, j1))
            dst = Slot("ofmap", L.half("ofmap"), out_first, j1 - j0)
            L.emit(Vec("axis0", text, _w(dst), (_w(src),), (), L.tag))
            L.emit(Store(out, (rows * out_first, rest), Region(r * out_first, (r + 1) * out_first, j0, j1),
                         dst, False, L.tag))


def _w(slot: Slot) -> Operand:
    return Operand(slot, Region(0, slot.rows, 0, slot.cols))


def lower_copy(L, t) -> None:
    """access-transpose / -pad / -concatenate as DMA copies into the term's buffer."""
    out = L.buf_of[t]
    if t.op == "access-concatenate":
        a, b, axis = t.args
        # built in place (inplace.py): the placed parts are there already; the others are
        # copied to their columns, offset by where this concatenation itself lies
        at = L.placed[t].offset if t in L.placed else 0
        lo, begun = 0, False
        for i, term in enumerate((a, b)):
            hi = lo + L.dims(term)[axis]
            q = inplace.producer(L, term)
            p = L.placed.get(q)
            if p is None or L.buf_of.get(q) != out or p.offset != at + lo:
                base, steps = L.need_chain(term, f"concatenate's {('first', 'second')[i]} operand")
                v = L.view(base, steps)
                if not begun:
                    L.begin(t, "copy", t.op)
                    begun = True
                L.emit(Copy(out, v, L.dram_words(v, L.stream.views[v].size), axis, at + lo, at + hi, L.tag))
            lo = hi
        return
    if t.op == "access-gather":
        data, index, axis = t.args
        src, ix = (L.view(*L.need_chain(u, f"access-gather's {w}")) for u, w in ((data, "data"), (index, "indices")))
        words = math.prod(L.dims(t)) + L.dram_words(ix, L.stream.views[ix].size)
        L.begin(t, "copy", t.op)
        L.emit(Gather(out, src, ix, axis, words, L.tag))
        return
    x = t.args[0]
    base, steps = L.need_chain(x, f"{t.op}'s operand")
    if t.op == "access-transpose":
        step = ("transpose", tuple(t.args[1]))
    else:
        _, pad_type, axis, before, after = t.args
        fill = 0.0 if pad_type.op == "zero-padding" else -math.inf
        step = ("pad", axis, before, after, fill)
    v = L.view(base, steps + (step,))
    L.begin(t, "copy", t.op)
    L.emit(Copy(out, v, L.dram_words(v, L.stream.views[v].size), tag=L.tag))
