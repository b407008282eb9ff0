"""CUDA C of the row statistics a gemm computes before its main loop for a norm it
reads inline (folds.RowStats): one warp a tile row, the norm kernel's float32 steps
(cuda._reduce), into shared memory that the A staging and the epilogue read."""
from __future__ import annotations

import math

from apsat.backends.gpu.emit import axis_defs, emit, used_vars
from apsat.backends.gpu.expr import var


def indent(lines, n=1):
    return ["  " * n + ln for ln in lines]


def _int(name, text):
    return f"const int {name} = {text};"


def stat_syms(stats: list, row: str) -> dict:
    """The row statistics' symbols, read from shared memory at tile row `row`."""
    return {f"{st.name}_{q}": f"{st.name}_{q}_s[{row}]" for st in stats
            for q in (("den",) if st.op == "rms-norm" else ("mean", "den"))}


def gemm_row_stats(st, d, m_dims, m) -> list[str]:
    """The pass that computes a norm's statistics for this tile's BM rows before the main
    loop (folds.RowStats), one warp a row, into shared memory: the norm kernel's steps."""
    cols = math.prod(st.cols)
    used = used_vars(st.elem)
    body = (axis_defs(d, "m", m_dims, var("rm", m), _int, used)
            + axis_defs(d, "s", st.cols, var("sc", cols), _int, used))
    el, te = emit(d, {"x": st.elem}, {}, f"{st.name}_")
    body += el + [f"const float x = {te['x']};"]

    def row_pass(use):
        return ([f"if (rm < M) for (int sc = lane; sc < {cols}; sc += 32) {{"]
                + indent(body + [use]) + ["}"])

    eps = d.const(st.eps)
    inner = ["const int rm = rm0 + lm;", "float part = 0.0f;"]
    keep = f"{st.name}_den_s[lm] = den;"
    if st.op == "rms-norm":
        inner += row_pass("part += x * x;")
    else:
        inner += row_pass("part += x;") + [f"const float mean = warp_sum(part) / {cols}.0f;", "part = 0.0f;"]
        inner += row_pass("part += (x - mean) * (x - mean);")
        keep += f" {st.name}_mean_s[lm] = mean;"
    inner += [f"const float den = sqrtf(warp_sum(part) / {cols}.0f + {eps});",
              f"if (lane == 0) {{ {keep} }}"]
    shared = f"{st.name}_den_s[BM]" + ("" if st.op == "rms-norm" else f", {st.name}_mean_s[BM]")
    return ([f"__shared__ float {shared};   // {st.op} rows",
             "{", "  const int lane = tid & 31;",
             "  for (int lm = tid >> 5; lm < BM; lm += 8) {"]   # warp-uniform: full-warp sums
            + indent(inner, 2) + ["  }", "}", "__syncthreads();"])
