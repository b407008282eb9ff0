"""Triton code of row normalisations: the norm kernel's passes over its rows
(`norm_rows`, for triton._reduce) and the pass before a gemm's main loop that computes
the statistics of a norm the gemm reads inline (`gemm_row_stats`, folds.RowStats). Both
take the norm's float32 steps: the mean, then the centred variance (layer-norm), or the
mean square (rms-norm)."""
from __future__ import annotations

import math

from apsat.backends.gpu.emit import axis_defs, emit, indent, used_vars
from apsat.backends.gpu.expr import var
from apsat.backends.gpu.tiling import next_pow2


def norm_rows(op: str, d, chunk, finish, eps: float) -> list[str]:
    """A normalisation row by row (layer-norm: mean, then variance; rms-norm: mean
    square), then each element normalised and stored through `finish`."""
    lines = ["part = tl.full((BR, BC), 0.0, tl.float32)"]
    d.helpers.add("sum")
    if op == "rms-norm":
        lines += chunk("a", ["part += tl.where(mask, x * x, 0.0)"])
        lines.append(f"rms_den = tl.sqrt_rn(tl.reduce(part, 1, _add)[:, None] / COLS + {d.const(eps)})")
        return lines + chunk("b", ["acc = x / rms_den"] + finish({"acc": "acc"}, "mask"))
    lines += chunk("a", ["part += tl.where(mask, x, 0.0)"])
    lines.append("mean = tl.reduce(part, 1, _add)[:, None] / COLS")
    lines.append("part = tl.full((BR, BC), 0.0, tl.float32)")
    lines += chunk("b", ["part += tl.where(mask, (x - mean) * (x - mean), 0.0)"])
    lines.append(f"rstd_den = tl.sqrt_rn(tl.reduce(part, 1, _add)[:, None] / COLS + {d.const(eps)})")
    return lines + chunk("c", ["acc = (x - mean) / rstd_den"] + finish({"acc": "acc"}, "mask"))


def gemm_row_stats(st, d, consts) -> list[str]:
    """The pass over this tile's rows (rm) that computes a norm's statistics before the
    gemm's main loop (folds.RowStats): <name>_mean and <name>_den, [BM, 1] each, in the
    norm kernel's float32 steps (mean, then the centred variance; rms-norm: mean square)."""
    cols = math.prod(st.cols)
    big = f"{st.name.upper()}_COLS"
    consts[big] = cols
    consts["SC"] = max(consts.get("SC", 16), min(64, next_pow2(cols)))
    ds = type(d)("mask_s")
    ds.helpers = d.helpers
    d.helpers.add("sum")

    def chunk(tag, use):
        body = ["sc = cs + tl.arange(0, SC)[None, :]", f"mask_s = (rm < M) & (sc < {big})"]
        body += axis_defs(ds, "s", st.cols, var("sc", cols), ds.assign, used_vars(st.elem))
        el, te = emit(ds, {"x": st.elem}, {}, f"{st.name}{tag}_")
        body += el + [f"x = {te['x']}", use]
        return ["part = tl.full((BM, SC), 0.0, tl.float32)", f"for cs in range(0, {big}, SC):"] + indent(body)

    eps = d.const(st.eps)
    total = "tl.reduce(part, 1, _add)[:, None]"
    if st.op == "rms-norm":
        return chunk("a", "part += tl.where(mask_s, x * x, 0.0)") + [
            f"{st.name}_den = tl.sqrt_rn({total} / {big} + {eps})"]
    mean = f"{st.name}_mean"
    return (chunk("a", "part += tl.where(mask_s, x, 0.0)") + [f"{mean} = {total} / {big}"]
            + chunk("b", f"part += tl.where(mask_s, (x - {mean}) * (x - {mean}), 0.0)")
            + [f"{st.name}_den = tl.sqrt_rn({total} / {big} + {eps})"])
