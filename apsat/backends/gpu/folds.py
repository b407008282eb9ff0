"""Reductions read inside another kernel (views.Values calls these; inline.py decides
when): a small reduction unrolled, and a row normalisation read through its row's
statistics.

* `unrolled`: a reduction over at most UNROLL_LIMIT values an output (a 3x3 pool, a
  depthwise 3x3 convolution), its values folded in order where it is read.
* `normalised`: layer-norm or rms-norm at an element, (x - mean) / den or x / den, with
  mean and den symbols of the element's row. The kernel computes them before its main
  loop, in a pass over the row (RowStats: the element expression over the row's columns,
  in variables s0, s1, ...), the same float32 steps the norm's own kernel takes. A gemm
  reading a norm's output as its A operand (a transformer's LayerNorm before the QKV or
  MLP projection) or in its epilogue (a post-norm residual) so needs no norm kernel.
"""
from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass

from apsat.backends.gpu.emit import used_vars
from apsat.backends.gpu.expr import call, const, fconst, var

# Reductions a kernel may compute inline, unrolled, when their item is small (at most
# UNROLL_LIMIT values an output): each folds its item with one function, a mean then
# divides by the count; a dot-product folds its operands' products.
FOLD = {"reduce-sum": "add", "reduce-mean": "add", "reduce-max": "max", "dot-product": "add"}
UNROLL_LIMIT = 27
# Row normalisations read through their row's statistics (semantics.layer_norm, rms_norm).
NORMALISED = ("layer-norm", "rms-norm")


@dataclass
class RowStats:
    """The statistics of one row of a normalisation, computed by the reading kernel
    before its main loop: `name`_mean (layer-norm only) and `name`_den, the row's
    sqrt(variance + eps) or sqrt(mean square + eps). elem: the row's element over the
    column variables s0, s1, ... (sizes `cols`) and the kernel's own row variables.
    term: the normalisation, to materialise instead when the kernel cannot do this."""

    name: str
    op: str
    eps: float
    elem: tuple
    cols: tuple
    term: object

    @property
    def symbols(self) -> tuple[str, ...]:
        """The names of the values the kernel defines for the row ("<name>_den", and
        "<name>_mean" first for layer-norm)."""
        return ((f"{self.name}_den",) if self.op == "rms-norm"
                else (f"{self.name}_mean", f"{self.name}_den"))


def taps(program, t) -> tuple[int, ...]:
    """The dims a reduction t folds per output: its item (a dot-product's without the
    operand axis)."""
    item = program.shape_of(t.args[1])[1]
    return tuple(item[1:] if t.args[0].op == "dot-product" else item)


def unrolled(vals, t, idx, conds):
    """Reduction t at index idx: its item's values folded in order."""
    name, x_term = t.args[0].op, t.args[1]
    folded = taps(vals.program, t)
    acc = None
    for tap in itertools.product(*(range(d) for d in folded)):
        tap = tuple(const(k) for k in tap)
        if name == "dot-product":
            v = vals.value(x_term, idx + (const(0),) + tap, conds)
            for o in range(1, vals.program.shape_of(x_term)[1][0]):
                v = call("mul", v, vals.value(x_term, idx + (const(o),) + tap, conds))
        else:
            v = vals.value(x_term, idx + tap, conds)
        acc = v if acc is None else call(FOLD[name], acc, v)
    if name == "reduce-mean":
        acc = call("div", acc, fconst(float(math.prod(folded))))
    return acc


def normalised(vals, t, idx, conds):
    """Normalisation t at index idx, through its row's statistics (registered in
    vals.stats, one RowStats per distinct row index)."""
    op, x_term = t.args[0].op, t.args[1]
    n = len(vals.program.shape_of(x_term)[0])
    rows, cols = tuple(idx[:n]), vals.dims(x_term)[n:]
    key = (t, rows)
    if key not in vals.stats:
        name = f"st{len(vals.stats)}"
        s = tuple(var(f"s{i}", d) for i, d in enumerate(cols))
        eps = float(t.args[0].args[0]) if t.args[0].args else 0.0
        vals.stats[key] = RowStats(name, op, eps, vals.value(x_term, rows + s), tuple(cols), t)
    *mean, den = (("sym", s) for s in vals.stats[key].symbols)
    x = vals.value(x_term, idx, conds)
    return call("div", call("sub", x, mean[0]) if mean else x, den)


_ROW_VARS = re.compile(r"[bms]\d+")


def row_stats(kernel, vals) -> list:
    """The RowStats of the norms kernel's values read inline (folds.normalised), in
    order; NeedsBuffer where the kernel cannot compute them before its main loop.
    Moved here from lower.py, which calls it for every kernel it finishes."""
    from apsat.backends.gpu.views import NeedsBuffer     # views reads norms through this module

    stats = list(vals.stats.values())
    for st in stats:
        if kernel.kind != "gemm":
            raise NeedsBuffer(st.term, f"a {kernel.kind} kernel reads {st.op} inline")
        cross = sorted(v for v in used_vars(st.elem) if not _ROW_VARS.fullmatch(v))
        if cross:
            raise NeedsBuffer(st.term, f"{st.op}'s rows vary along {', '.join(cross)}")
        kernel.flops += 3.0 * math.prod(st.cols) * math.prod(
            math.prod(d) for g, d in kernel.axes.items() if g in "bm")
    return stats
