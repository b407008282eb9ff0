"""The attention atom, `(attention SAFE qk bias v)`, on the systolic accelerator.

Per head (an index of the leading iterated axes I..) the atom is two products and a
softmax: S = Q . K^T (Q m x d, K^T d x n) on the array, plus the bias, softmax over each
row of S on the vector unit (SAFE: a row whose softmax is NaN becomes 0), then P . V
(V n x e) on the array. The head's operands are address patterns over the pair's and
v's buffers: Q is the pair's operand 0 at key 0, K^T its operand 1 at query 0 read
transposed, V v's values at query 0 read transposed. Leading axes along which K, V
(and so the whole head's keys) do not change, immediately before m (grouped-query
attention's query groups), are merged into the head's rows: K and V are then loaded
once for the whole group of query heads.

Scores on chip. The fit (targets.systolic.attention_plan, which the cost model calls
too): a block of r query rows needs r x (n + e) words of one ofmap half (r x (3n + e)
with SAFE) for its scores and outputs, and r x d of one ifmap half for its queries; r
is the most that fit, cut to whole row folds of the array when the head has more rows;
the scores fit when r >= 1 (and a K^T column and a V row fit a filter half). The
halves alternate between blocks. K^T and V of a head are held in one filter half for
all its blocks when they fit it together (the halves alternate between heads), else
they are streamed per block in chunks, which is taken only while that re-reading moves
no more DRAM words than spilling the scores would. A block:
  LOAD   the bias rows into the scores block (the accumulators start from them, as a
         fused-dot-bias starts from its bias; with SAFE the block is [is-nan | 0 | S],
         3n words a row, and the bias is read through a zero-padding address pattern,
         so the same LOAD clears the select's columns; a scalar bias is one word;
         the literal 0 without SAFE: no LOAD, the first passes overwrite)
  MATMUL Q rows . K^T into the scores columns, fold by fold in the product's dataflow
  VEC    row softmax over each score row, in place; SAFE: map is-nan into the first n
         columns and row select over the (3, n) rows (the exporters' Where(IsNaN(p),
         0, p)), back into the scores columns
  MATMUL P (read by the array from the ofmap) . V into the output rows beside them
  STORE  the output rows
The array runs a block's Q.K^T before the previous block's P.V, so each softmax
overlaps the next block's scores.

When the scores do not fit (or streaming K and V would cost more than spilling), or
the pair is not a per-head matrix product (operand 0 varying along the keys,
operand 1 or v along the queries, an operand not a view of one buffer), the atom
lowers as its unfused expansion, exactly the chain the attention-fusion rules read
(apsat/rules/attention-fusion.egg): the batched Q.K^T (grouped.py), the bias add,
the softmax, SAFE's is-nan, concatenations and select, and the batched P.V, each
through the backend's own lowering (a part that cannot be mapped is a HOST step with
its reason), so the scores go to DRAM and back as the unfused program's do.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from apsat.backends.systolic.isa import ARRAY, Matmul, Operand, Preload, Region, Slot, Store, Vec
from apsat.backends.systolic.tiles import folds, whole
from apsat.backends.systolic.split_item import Terms, lower_expansion
from apsat.lang.term import Term
from apsat.targets.systolic import attention_heads, attention_plan

__all__ = ["lower_attention", "expansion"]


@dataclass
class Heads:
    """The atom read as per-head products: `groups` index tuples over the leading axes
    `group_axes` (each head's rows are m times the `merged` axes' sizes, `rows`), the
    (base, steps) of the pair's operands, of v and of the bias (None: nothing to load,
    a literal 0 without SAFE), whether the bias is a scalar, the output buffer."""

    groups: list
    group_axes: tuple
    merged: tuple
    rows: int
    d: int
    n: int
    e: int
    rank: int
    q: tuple
    k: tuple
    v: tuple
    bias: tuple
    scalar_bias: bool
    out: str


def lower_attention(L, t) -> None:
    """Lower `t` = (attention SAFE qk bias v) into its buffer: on chip when its scores
    fit (see the module docstring), else its unfused expansion."""
    heads, why = _heads(L, t)
    plan = attention_plan(L.acc, heads.rows, heads.d, heads.n, heads.e, bool(t.args[0])) if heads else None
    if plan is not None and plan.rows:
        _on_chip(L, t, heads, plan)
        return
    _lower_expansion(L, t, plan.reason if plan is not None else why)


# ---- reading the atom as per-head products --------------------------------------------------

def _heads(L, t):
    """(Heads, "") when the pair is a matrix product per head, else (None, why not)."""
    from apsat.backends.systolic.grouped import _before_broadcast

    safe, qk, bias, v = t.args
    if qk.op != "access-pair":
        return None, "the scores operand is not an access-pair"
    (iq, (_, d)), e = L.program.shape_of(qk), L.dims(v)[-2]
    rank, (m, n) = len(iq), iq[-2:]
    scalar = L.dims(bias) == ()
    zero = scalar and bias.op == "access-literal" and float(bias.args[0]) == 0.0
    chains = [L.chain(x) for x in (qk.args[0], qk.args[1], v)]
    chains.append(None if zero and not safe else L.chain(bias))    # SAFE loads zeros through it
    if any(c is None for c in chains[:3]) or chains[3] is None and not (zero and not safe):
        return None, "an operand is not a view of one buffer"
    pre = [_before_broadcast(L, c, rank, rank + 1)[2] for c in chains[:3]]
    if n > 1 and pre[0][-1] != 1 or m > 1 and (pre[1][-2] != 1 or pre[2][-2] != 1):
        return None, "the pair is not q broadcast over the keys and k over the queries"
    _, rows, merged = attention_heads(iq, pre[1], pre[2])
    group_axes = tuple(range(rank - 2 - len(merged)))
    groups = list(itertools.product(*(range(iq[a]) for a in group_axes)))
    return Heads(groups, group_axes, merged, rows, d, n, e, rank, *chains, scalar, L.buf_of[t]), ""


def _pick(h: Heads, steps, index, fixed) -> tuple:
    """`steps`, then head `index` on the group axes and index 0 on axes `fixed`."""
    return (tuple(steps) + tuple(("slice", a, i, i + 1) for a, i in zip(h.group_axes, index))
            + tuple(("slice", a, 0, 1) for a in fixed))


def _views(L, h: Heads, index, safe: bool) -> dict:
    """The head's matrices: q (rows x d), kt (d x n), v (n x e), start (the rows the
    scores block starts from: the bias, zero-padded on the left with SAFE; None: none)."""
    r = h.rank
    keys = h.merged + (r - 2,)
    out = {"q": L.view(h.q[0], _pick(h, h.q[1], index, (r - 1,)) + (("reshape", (h.rows, h.d)),)),
           "kt": L.view(h.k[0], _pick(h, h.k[1], index, keys) + (("reshape", (h.n, h.d)), ("transpose", (1, 0)))),
           "v": L.view(h.v[0], _pick(h, h.v[1], index, keys) + (("reshape", (h.e, h.n)), ("transpose", (1, 0))))}
    out["start"] = None
    if h.bias is not None:
        if h.scalar_bias:
            steps = tuple(h.bias[1]) + (("reshape", (1, 1)), ("broadcast", (h.rows, h.n)))
        else:
            steps = _pick(h, h.bias[1], index, ()) + (("reshape", (h.rows, h.n)),)
        if safe:
            steps += (("pad", 1, 2 * h.n, 0, 0.0),)       # [0 | 0 | bias]: the select's columns cleared
        out["start"] = L.view(h.bias[0], steps)
    return out


# ---- on chip --------------------------------------------------------------------------------

@dataclass
class _Block:
    """One block of query rows [r0, r1) of head `head`: its scores block `w` (scores in
    columns [s0, s0 + n)), output rows `o`, and where its head's V is held (None:
    streamed)."""

    head: int
    r0: int
    r1: int
    w: Slot
    o: Slot
    s0: int
    views: dict
    v_held: Slot | None


def _on_chip(L, t, h: Heads, plan) -> None:
    safe = bool(t.args[0])
    L.begin(t, "attention", f"attention {len(h.groups)} heads of {h.rows}x{h.n}, {plan.rows} rows a block"
            + (", nan-safe" if safe else ""), m=h.rows, k=h.d, n=h.n, a_mode="dense")
    L.stream.groups[L.tag].dataflow = plan.qk_dataflow
    held: tuple = (None, None)
    previous = None
    for gi, index in enumerate(h.groups):
        views = _views(L, h, index, safe)
        if plan.resident:       # K^T and V of the head in one filter half (alternating by head)
            base = (gi % 2) * L.half_words("filter")
            held = (L.load("filter", base, views["kt"], Region(0, h.d, 0, h.n)),
                    L.load("filter", base + h.d * h.n, views["v"], Region(0, h.n, 0, h.e)))
        for r0, r1 in folds(h.rows, plan.rows):
            block = _scores(L, h, plan, gi, r0, r1, views, held)
            _softmax(L, h, block, safe)
            if previous is not None:       # the previous block's P.V after this block's scores
                _values(L, h, plan, previous)
            previous = block
    _values(L, h, plan, previous)


def _scores(L, h: Heads, plan, gi, r0, r1, views, held) -> _Block:
    """Q rows [r0, r1) . K^T into a new scores block, the bias first."""
    rb, n = r1 - r0, h.n
    half = L.half("ofmap")
    w = Slot("ofmap", half, rb, plan.width * n)
    o = Slot("ofmap", half + w.words, rb, h.e)
    s0 = (plan.width - 1) * n
    q = L.load("ifmap", L.half("ifmap"), views["q"], Region(r0, r1, 0, h.d))
    started = views["start"] is not None
    if started:
        L.load("ofmap", w.offset, views["start"], Region(r0, r1, 0, w.cols))
    for c0, c1 in folds(n, plan.key_cols):
        kt = held[0] if plan.resident else L.load("filter", L.half("filter"), views["kt"], Region(0, h.d, c0, c1))
        kc = c0 if plan.resident else 0
        _product(L, plan.qk_dataflow, Operand(w, Region(0, rb, s0 + c0, s0 + c1)), whole(q),
                 Operand(kt, Region(0, h.d, kc, kc + c1 - c0)), started)
    return _Block(gi, r0, r1, w, o, s0, views, held[1] if plan.resident else None)


def _softmax(L, h: Heads, b: _Block, safe: bool) -> None:
    """Softmax over each score row in place; SAFE: NaN rows to 0 through the select."""
    rb, n = b.r1 - b.r0, h.n
    p = Operand(b.w, Region(0, rb, b.s0, b.s0 + n))
    L.emit(Vec("row", "softmax", p, (p,), (n,), L.tag))
    if safe:
        L.emit(Vec("map", "is-nan", Operand(b.w, Region(0, rb, 0, n)), (p,), (), L.tag))
        L.emit(Vec("row", "select", p, (whole(b.w),), (3, n), L.tag))


def _values(L, h: Heads, plan, b: _Block) -> None:
    """P . V into the block's output rows (V chunks accumulating), then their STORE."""
    rb = b.r1 - b.r0
    for n0, n1 in folds(h.n, plan.value_rows):
        if b.v_held is not None:
            v = Operand(b.v_held, Region(n0, n1, 0, h.e))
        else:
            v = whole(L.load("filter", L.half("filter"), b.views["v"], Region(n0, n1, 0, h.e)))
        _product(L, plan.pv_dataflow, whole(b.o), Operand(b.w, Region(0, rb, b.s0 + n0, b.s0 + n1)), v, n0 > 0)
    row = b.head * h.rows
    L.emit(Store(h.out, (len(h.groups) * h.rows, h.e), Region(row + b.r0, row + b.r1, 0, h.e), b.o, False, L.tag))


def _sub(op: Operand, r0, r1, c0, c1) -> Operand:
    """Rows [r0, r1) and columns [c0, c1) of an operand, relative to its region."""
    g = op.region
    return Operand(op.slot, Region(g.r0 + r0, g.r0 + r1, g.c0 + c0, g.c0 + c1))


def _product(L, df: str, dst: Operand, a: Operand, b: Operand, onto: bool) -> None:
    """dst (+)= a . b with both operands on chip, one MATMUL a fold in dataflow `df`
    (os: output tiles; ws: B's tiles PRELOADed, A streams; is: A's tiles PRELOADed, B
    streams), each paying its fold's fill, as gemm_cost counts a product's folds."""
    m, k, n = a.region.rows, a.region.cols, b.region.cols
    R, C = L.acc.rows, L.acc.cols
    if df == "os":
        for i0, i1 in folds(m, R):
            for j0, j1 in folds(n, C):
                L.emit(Matmul(_sub(dst, i0, i1, j0, j1), _sub(a, i0, i1, 0, k), _sub(b, 0, k, j0, j1),
                              i1 - i0, k, j1 - j0, onto, True, L.tag, df))
        return
    for k0, k1 in folds(k, R):
        for j0, j1 in folds(n if df == "ws" else m, C):
            if df == "ws":
                L.emit(Preload(_sub(b, k0, k1, j0, j1), L.tag))
                L.emit(Matmul(_sub(dst, 0, m, j0, j1), _sub(a, 0, m, k0, k1), ARRAY,
                              m, k1 - k0, j1 - j0, onto or k0 > 0, True, L.tag, df))
            else:
                L.emit(Preload(_sub(a, j0, j1, k0, k1), L.tag))
                L.emit(Matmul(_sub(dst, j0, j1, 0, n), ARRAY, _sub(b, k0, k1, 0, n),
                              j1 - j0, k1 - k0, n, onto or k0 > 0, True, L.tag, df))


# ---- spilled: the unfused expansion ---------------------------------------------------------

def expansion(t, iq: tuple, e: int, scalar_bias: bool, zero_bias: bool) -> tuple[Term, list]:
    """(root, new terms children first) of the unfused chain `t` stands for, written as
    the importer writes it and the attention-fusion rules read it: S = dot-product over
    qk, + bias (a scalar bias broadcast; none when it is the literal 0), P = softmax over
    S's last axis, SAFE: select over the concatenated (is-nan P, 0, P), then P reshaped
    to (I.., m, 1, n), broadcast over e and paired with v for a second dot-product.
    `iq` is qk's iterated dims (I.., m, n), `e` the values' width; `scalar_bias`: the bias
    is a scalar, `zero_bias`: it is the literal 0."""
    safe, qk, bias, v = t.args
    r, n = len(iq), iq[-1]
    made = Terms()
    mk, compute, new = made.mk, made.compute, made.new

    def broadcast_scalar(x):
        return mk("access-broadcast", mk("access-reshape", x, Term("access-shape", ((1,) * r, ()))),
                  Term("access-shape", (tuple(iq), ())))

    s = compute("dot-product", qk)
    if not zero_bias:
        b = broadcast_scalar(bias) if scalar_bias else bias
        s = compute("elementwise-add", mk("access-pair", s, b))
    p = compute("softmax", mk("access", s, r - 1))
    if safe:
        def part(x):
            return mk("access", mk("access-insert-axis", x, r), r)
        nan = mk("access", compute("is-nan", p), r)
        zero = broadcast_scalar(mk("access-literal", 0.0))
        inner = mk("access-concatenate", part(nan), part(zero), r)
        p = compute("select", mk("access-concatenate", inner, part(mk("access", p, r)), r))
    pb = mk("access-broadcast", mk("access-reshape", p, Term("access-shape", (tuple(iq[:-1]) + (1, n), ()))),
            Term("access-shape", (tuple(iq[:-1]) + (e,), (n,))))
    return compute("dot-product", mk("access-pair", pb, v)), new


def _lower_expansion(L, t, why: str) -> None:
    """Lower the unfused expansion of `t` term by term into `t`'s buffer. Its terms are
    private to this atom: terms the program may hold elsewhere keep their own buffers
    (the buffer map is restored after), and only `t`'s operands' terms, lowered before
    it, are read from their buffers (split_item.lower_expansion). The groups it makes
    name why the scores spilled."""
    _, qk, bias, v = t.args
    iq = tuple(L.program.shape_of(qk)[0])
    scalar = L.dims(bias) == ()
    zero = scalar and bias.op == "access-literal" and float(bias.args[0]) == 0.0
    root, new = expansion(t, iq, L.dims(v)[-2], scalar, zero)
    lower_expansion(L, t, root, new, f"attention spilled: {why}")
