"""ONNX TopK over a short axis (a mixture-of-experts router's choice among its experts) as
comparisons, counts and selections, so that no host step is left in the model.

Along the axis (n values, n <= TOPK_LIMIT), element i's rank is the number of elements that
come before it: larger ones (smaller ones with largest=0), and equal ones at a lower index,
which is onnxruntime's order for ties. Output r is then the element of rank r: its value
(a select of the element whose rank is r, summed with zeros: exact, infinities included) and
its index. Both outputs come sorted, which sorted=0 allows. The pairwise comparisons cost
n * n values a row, hence the limit; a longer axis stays an opaque call.
"""
from __future__ import annotations

import numpy as np

from apsat.frontend.lowering_tensor import Unlowerable, axis_last, normalize_axis

TOPK_LIMIT = 512         # n * n comparisons a row: 262,144 values at the limit


def lower_topk(ctx):
    """(Values, Indices) of ONNX TopK with a constant K (module doc)."""
    b, dims = ctx.b, ctx.dims(0)
    axis = normalize_axis(ctx, ctx.attr("axis", -1), len(dims))
    k = int(ctx.static(1).reshape(-1)[0]) if ctx.opset >= 10 else int(ctx.attr("k", 1))
    n = dims[axis]
    if n > TOPK_LIMIT:
        raise Unlowerable(f"TopK over {n} > {TOPK_LIMIT} values")
    if not 1 <= k <= n:
        ctx.fail(f"K = {k} is outside 1..{n}")
    perm, back = axis_last(len(dims), axis)
    x = b.transpose(ctx.term(0), perm)
    rows = tuple(dims[a] for a in perm[:-1])
    square = rows + (n, n)
    mine = b.expand(b.reshape(x, rows + (n, 1)), square)          # [.., i, j] = x_i
    other = b.expand(b.reshape(x, rows + (1, n)), square)         # [.., i, j] = x_j
    before = b.elementwise("greater" if ctx.attr("largest", 1) else "less", [other, mine])
    j, i = np.meshgrid(np.arange(n), np.arange(n))
    tie = b.elementwise("logical-and", [b.elementwise("equal", [other, mine]),
                                        ctx.add_weight("lower_index", (j < i).astype(np.float32))])
    rank = b.compute("reduce-sum", b.at(b.elementwise("logical-or", [before, tie]), len(rows) + 1))
    picks = rows + (k, n)
    chosen = b.elementwise("equal", [b.expand(b.reshape(rank, rows + (1, n)), picks),
                                     ctx.add_weight("rank", np.arange(k, dtype=np.float32).reshape(k, 1))])
    zero = b.literal(0.0)

    def pick(source):
        """sum over i of source_i where element i has rank r: the rank-r element's source."""
        s = b.select(chosen, b.expand(b.reshape(source, rows + (1, n)), picks), zero)
        return b.compute("reduce-sum", b.at(s, len(rows) + 1))

    index = ctx.add_weight("position", np.arange(n, dtype=np.float32))
    outs = [pick(x), pick(b.expand(index, rows + (n,)))]
    return [b.transpose(o, back) for o in outs]
