"""CUDA C of the row statistics a gemm computes before its main loop for a norm it
reads inline (folds.RowStats): one warp a tile row, the norm kernel's float32 steps
(cuda._reduce), into shared memory that the A staging and the epilogue read."""
from __future__ import annotations

import math

from apsat.backends.gpu.emit import axis_defs, emit, indent, used_vars
from apsat.backends.gpu.expr import var


def stat_syms(stats: list, row: str) -> dict:
    """The row statistics' symbols, read from shared memory at tile row `row`."""
    return {s: f"{s}_s[{row}]" for st in stats for s in st.symbols}


def gemm_row_stats(st, d, m_dims, m) -> list[str]:
    """The pass that computes a norm's statistics for this tile's BM rows before the main
    loop (folds.RowStats), one warp a row, into shared memory: the norm kernel's steps."""
    cols = math.prod(st.cols)
    used = used_vars(st.elem)
    body = (axis_defs(d, "m", m_dims, var("rm", m), d.int_assign, used)
            + axis_defs(d, "s", st.cols, var("sc", cols), d.int_assign, used))
    el, te = emit(d, {"x": st.elem}, {}, f"{st.name}_")
    body += el + [f"const float x = {te['x']};"]

    def row_pass(use):
        return ([f"if (rm < M) for (int sc = lane; sc < {cols}; sc += 32) {{"]
                + indent(body + [use], 1, d.indent_unit) + ["}"])

    eps = d.const(st.eps)
    inner = ["const int rm = rm0 + lm;", "float part = 0.0f;"]
    if st.op == "rms-norm":
        inner += row_pass("part += x * x;")
    else:
        inner += row_pass("part += x;") + [f"const float mean = warp_sum(part) / {cols}.0f;", "part = 0.0f;"]
        inner += row_pass("part += (x - mean) * (x - mean);")
    inner += [f"const float den = sqrtf(warp_sum(part) / {cols}.0f + {eps});"]
    # each symbol <name>_mean / <name>_den from the local mean / den, by lane 0
    keep = " ".join(f"{s}_s[lm] = {s.rsplit('_', 1)[1]};" for s in st.symbols)
    inner.append(f"if (lane == 0) {{ {keep} }}")
    shared = ", ".join(f"{s}_s[BM]" for s in st.symbols)
    return ([f"__shared__ float {shared};   // {st.op} rows",
             "{", "  const int lane = tid & 31;",
             "  for (int lm = tid >> 5; lm < BM; lm += 8) {"]   # warp-uniform: full-warp sums
            + indent(inner, 2, d.indent_unit) + ["  }", "}", "__syncthreads();"])
