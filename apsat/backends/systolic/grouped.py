"""Grouped and depthwise convolutions: `compute dot-product (access-pair A B)`.

The importer writes a grouped convolution as a dot-product over a pair of broadcasts
(apsat/targets/pair_product.py reads it as `groups` independent (m x k) . (k x n)
products). `targets.pair_dot.pair_dot_cost` decides where they run, the same call the
extractor's cost model makes:

  array   one GEMM per group (gemm.product), A the group's slice of the operand whose
          axes come first in the result, B the other operand's slice read transposed.
          Each group's m x n result is a contiguous block of the output (the axes are
          groups, rows, columns in that order), stored in place: rows
          [g*m, (g+1)*m) of the output read as a (groups*m) x n matrix. A window operand
          is gathered tile by tile through its address pattern, never materialised.
  batched a depthwise convolution (n = 1: one filter a group) `batch` groups at a time:
          the batch's filters as a block-diagonal (batch x batch*k) matrix (a diagonal
          address pattern over the weights: zeros off the blocks) times its windows as a
          (batch*k x m) matrix, so `batch` filters fill the array's rows where one filter
          would use one. The batch's batch x m result is rows [g0, g0 + batch) of the
          output read as a groups x m matrix. Its MATMULs carry blocks=batch: only one
          MAC in `batch` is useful work, and the report counts only those.
  vector  rows of the pair are loaded as two (rows x k) tiles and VEC dot gives one
          output per row (3 operations a MAC on the vector unit's lanes).

Anything else (a pair whose axes are not in that order, a non-view operand) is left to
the caller, which makes it a HOST step.
"""
from __future__ import annotations

import itertools
import math

from apsat.backends.systolic import gemm
from apsat.backends.systolic.isa import Operand, Region, Slot, Store, Vec
from apsat.backends.systolic.views import dims_after
from apsat.targets.pair_product import PairProduct, pair_product
from apsat.targets.pair_dot import pair_dot_cost


def _before_broadcast(L, chain, n_iter: int, n_dims: int):
    """(base, steps without a final broadcast, their iterated dims, all steps) of an
    operand view."""
    base, steps = chain
    if steps and steps[-1][0] == "broadcast":
        pre = dims_after(L.stream.buffers[base].dims, steps[:-1])
        if len(pre) == n_dims:
            return base, steps[:-1], tuple(pre[:n_iter]), steps
    return base, steps, tuple(dims_after(L.stream.buffers[base].dims, steps)[:n_iter]), steps


def lower_pair_dot(L, t) -> None:
    """Lower `t` = (compute dot-product (access-pair A B)) onto the array or the vector
    unit; Unlowerable when the pair is not a set of independent matrix products."""
    from apsat.backends.systolic.lower import Unlowerable

    pair = t.args[1]
    it, item = L.program.shape_of(pair.args[0])
    n_iter, n_dims = len(it), len(it) + len(item)
    ops = [_before_broadcast(L, L.need_chain(x, f"the dot-product's pair operand {i}"), n_iter, n_dims)
           for i, x in enumerate(pair.args)]
    pp = pair_product(tuple(it), tuple(item), ops[0][2], ops[1][2])
    if pp is None and _reordered(L, t, tuple(it), len(item), [o[2] for o in ops]):
        return
    if pp is None:
        raise Unlowerable("dot-product over a pair whose axes are not groups, rows and columns")
    cost = pair_dot_cost(L.acc, pp.groups, pp.m, pp.k, pp.n)
    if cost.unit == "batched" and _batched(L, t, pp, ops, tuple(it), len(item), cost.batch):
        return
    if cost.unit == "array" or (cost.unit == "batched" and cost.array_cycles <= cost.vector_cycles):
        _on_array(L, t, pp, ops, tuple(it))
    else:
        _on_vector(L, t, pp, ops, tuple(it), math.prod(item))


def _group_steps(steps, group_axes, index) -> tuple:
    """`steps` then a one-index slice of every group axis."""
    return tuple(steps) + tuple(("slice", a, i, i + 1) for a, i in zip(group_axes, index))


def _on_array(L, t, pp: PairProduct, ops, it: tuple) -> None:
    group_axes = [a for a, d in enumerate(it) if d > 1 and all(o[2][a] == d for o in ops)]
    (base_a, steps_a, _, _), (base_b, steps_b, _, _) = ops[pp.left], ops[1 - pp.left]
    m, k, n = pp.m, pp.k, pp.n
    first = L.matrix(base_a, _group_steps(steps_a, group_axes, [0] * len(group_axes)), m, k)
    mode = gemm.a_mode(L, base_a, first, m * k, materialise=False)
    L.begin(t, "grouped", f"dot-product {pp.groups} groups", m=m, k=k, n=n, a_mode=mode)
    out = L.buf_of[t]
    for g, index in enumerate(itertools.product(*(range(it[a]) for a in group_axes))):
        aview = L.matrix(base_a, _group_steps(steps_a, group_axes, index), m, k)
        bview = L.view(base_b, _group_steps(steps_b, group_axes, index)
                       + (("reshape", (n, k)), ("transpose", (1, 0))))
        gemm.product(L, gemm.Gemm(m, k, n, aview, bview, out, mode, c_rows=pp.groups * m, c_row0=g * m))


def _batch_order(n_iter: int, n_item: int, axis: int) -> tuple:
    """Axis order group axis, item axes, the other iterated axes."""
    rest = tuple(a for a in range(n_iter) if a != axis)
    return (axis,) + tuple(range(n_iter, n_iter + n_item)) + rest


def _batched(L, t, pp: PairProduct, ops, it: tuple, n_item: int, batch: int) -> bool:
    """`batch` groups a GEMM (see `batched` in the module docstring); False, emitting
    nothing, when the groups span more than one axis (the caller takes the next best)."""
    axes = [a for a, d in enumerate(it) if d > 1 and all(o[2][a] == d for o in ops)]
    if len(axes) != 1:
        return False
    axis, order, k, m = axes[0], _batch_order(len(it), n_item, axes[0]), pp.k, pp.m
    (base_x, steps_x, _, _), (base_w, steps_w, _, _) = ops[pp.left], ops[1 - pp.left]
    L.begin(t, "grouped", f"dot-product {pp.groups} groups, {batch} a pass", m=batch, k=batch * k, n=m,
            a_mode="dense")
    out = L.buf_of[t]
    for g0 in range(0, pp.groups, batch):
        b = min(batch, pp.groups - g0)
        pick = (("slice", axis, g0, g0 + b), ("transpose", order))
        windows = L.view(base_x, tuple(steps_x) + pick + (("reshape", (b * k, m)),))
        filters = L.view(base_w, tuple(steps_w) + pick + (("reshape", (b, k)), ("diag", 0),
                                                           ("transpose", (2, 0, 1)), ("reshape", (b, b * k))))
        gemm.product(L, gemm.Gemm(b, b * k, m, filters, windows, out, "dense", c_rows=pp.groups, c_row0=g0,
                                  blocks=b))
    return True


def _on_vector(L, t, pp: PairProduct, ops, it: tuple, k: int) -> None:
    from apsat.backends.systolic.lower import Unlowerable

    rows = math.prod(it)
    per = min(L.half_words("ifmap") // k, L.half_words("filter") // k, L.half_words("ofmap"))
    if per < 1:
        raise Unlowerable(f"dot-product: an item of {k} elements does not fit half of a scratchpad")
    # The operands as rows x k matrices, broadcasts included (a DMA reads their distinct words).
    views = [L.matrix(base, steps, rows, k) for base, _, _, steps in ops]
    out = L.buf_of[t]
    L.begin(t, "vector", "dot-product")
    for r0 in range(0, rows, per):
        reg = Region(r0, min(rows, r0 + per), 0, k)
        a = L.load("ifmap", L.half("ifmap"), views[0], reg)
        b = L.load("filter", L.half("filter"), views[1], reg)
        dst = Slot("ofmap", L.half("ofmap"), reg.rows, 1)
        L.emit(Vec("dot", "dot-product", Operand(dst, Region(0, reg.rows, 0, 1)),
                   (Operand(a, Region(0, reg.rows, 0, k)), Operand(b, Region(0, reg.rows, 0, k))), (), L.tag))
        L.emit(Store(out, (rows, 1), Region(reg.r0, reg.r1, 0, 1), dst, False, L.tag))


__all__ = ["lower_pair_dot"]


def _reordered(L, t, it: tuple, n_item: int, pre: list) -> bool:
    """A pair product whose iterated axes are not in the order groups, rows, columns (a
    batched product with one operand broadcast over the batch: Einsum's `...ij,...jk`,
    a position bias shared by every window) lowered as the same product with its axes
    moved into that order (each operand transposed under its broadcast) and the result
    transposed back by one COPY (split_item.lower_expansion). False when some axis varies
    in neither operand."""
    from apsat.backends.systolic.split_item import Terms, lower_expansion, shape

    varies = [[p == d for p, d in zip(q, it)] for q in pre]
    kind = {}
    for a, d in enumerate(it):
        if d > 1 and not (varies[0][a] or varies[1][a]):
            return False
        kind[a] = 0 if d == 1 else (1 if varies[0][a] and varies[1][a] else (2 if varies[0][a] else 3))
    order = sorted(range(len(it)), key=lambda a: ((kind[a] or 4), a))
    perm = tuple(order) + tuple(range(len(it), len(it) + n_item))
    made = Terms()
    mk = made.mk
    operands = []
    for x in t.args[1].args:
        if x.op == "access-broadcast":
            (tit, titem) = x.args[1].args
            target = shape([tit[a] for a in order], titem)
            operands.append(mk("access-broadcast", mk("access-transpose", x.args[0], perm), target))
        else:
            operands.append(mk("access-transpose", x, perm))
    product = made.compute("dot-product", mk("access-pair", *operands))
    root = mk("access-transpose", product, tuple(order.index(a) for a in range(len(it))))
    lower_expansion(L, t, root, made.new, "pair product's axes reordered")
    return True
