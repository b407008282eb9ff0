"""CUDA C++ code generation for the kernel graph, and compilation with nvcc.

The same kernels as the Triton generator, from the same expressions, as one
`extern "C" __global__` function per .cu file (sizes are `constexpr int`s):

* elementwise: one thread per output element, 256 threads a block;
* gemm: a shared-memory tiled matmul: a 16 x 16 thread block computes a BM x BN tile
  (BM, BN in {32, 64}), each thread a (BM/16) x (BN/16) register block; each BK = 16 slice
  of A and B is staged in shared memory (the operands' loads, padding and window
  arithmetic included, happen while staging); the epilogue runs per output element;
* reduce: one warp per row, eight rows a block; lanes stride over the row and combine with
  warp shuffles; softmax and layer norm take three passes over the row, like the Triton
  kernels;
* attention: one block per (tile of ROWS query rows, batch index), one warp per query
  row; each BN-key tile of K and V is staged in shared memory, lane j scores key j, the
  warp keeps the online softmax (running max and sum, combined with shuffles) and each
  lane accumulates p.v for the value columns e = lane, lane + 32, ... (no tensor cores).

Arithmetic is fp32 with IEEE division and square root (nvcc's defaults; no fast math).
Buffers have their element type: half loads are widened, stores round once to the buffer's
type, and a gemm on f16/bf16 operands multiplies on tensor cores through WMMA with float32
accumulation (cuda_wmma.py). The attention kernel reads half operands widened into float
tiles and multiplies in float (no tensor cores).
Index arithmetic is 32-bit: the lowering refuses buffers of 2**31 elements or more.

`compile_cuda(source, path)` runs `nvcc -arch=sm_90 -cubin -Xptxas -v` and parses ptxas's
register, shared-memory and spill figures; `nvcc_path()` says whether nvcc is here.
"""
from __future__ import annotations

import math

import numpy as np

from apsat.backends.gpu import cuda_wmma as wm
from apsat.backends.gpu.cuda_compile import compile_cuda, nvcc_path
from apsat.backends.gpu.cuda_prelude import ROUND, WARP_REDUCE
from apsat.backends.gpu.cuda_norms import gemm_row_stats, stat_syms
from apsat.backends.gpu.emit import Dialect, axis_defs, defined_body, emit, indent, used_vars
from apsat.backends.gpu.expr import DEFINED, var
from apsat.backends.gpu.graph import Kernel
from apsat.backends.gpu.tiling import cuda_attention_tiles, cuda_gemm_tiles

ROWS_PER_BLOCK = 8       # reduce: warps (rows) per block
THREADS = 256


class CudaDialect(Dialect):
    """Values as CUDA C float expressions; out-of-range threads never reach a load, so
    only padding conditions guard loads."""

    floordiv = "/"
    indent_unit = "  "
    int_cast = "(int){}"

    def __init__(self, types: dict | None = None):
        """types: buffer -> element type (absent: f32); half loads are widened to float."""
        self.types = types or {}

    @staticmethod
    def int_assign(name, text):
        """An index variable's definition (assign is for float values)."""
        return f"const int {name} = {text};"

    def const(self, v: float) -> str:
        if math.isinf(v):
            return "__int_as_float(0x7f800000)" if v > 0 else "__int_as_float(0xff800000)"
        if math.isnan(v):
            return "__int_as_float(0x7fffffff)"
        text = repr(float(np.float32(v)))
        return f"{text}f" if ("." in text or "e" in text) else f"{text}.0f"

    def load(self, buf, offset, conds, varying):
        text = wm.widened(self.types, buf, f"{param(buf)}[{offset}]")
        if not conds:
            return text
        return f"({' && '.join(conds)} ? {text} : 0.0f)"

    def call(self, fn, a, nodes=()):
        table = {"add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})",
                 "div": "({0} / {1})", "neg": "(-{0})", "sqrt": "sqrtf({0})", "exp": "expf({0})",
                 "erf": "erff({0})", "tanh": "tanhf({0})",
                 "sigmoid": "(1.0f / (1.0f + expf(-({0}))))", "abs": "fabsf({0})",
                 "log": "logf({0})", "log1p": "log1pf({0})", "recip": "(1.0f / {0})",
                 "floor": "floorf({0})", "ceil": "ceilf({0})", "cos": "cosf({0})",
                 "sin": "sinf({0})", "pow": "powf({0}, {1})", "fmod": "fmodf({0}, {1})",
                 "round": "apsat_round({0}, {1})"}
        if fn in DEFINED:          # max, min: DEVICE_FUNCTIONS (fmaxf / fminf drop NaN)
            return f"apsat_{fn}({', '.join(a)})"
        return table[fn].format(*a)

    def where(self, cond, a, b):
        return f"({cond} ? {a} : {b})"

    def nz(self, a):
        return f"({a} != 0.0f)"

    def assign(self, name, text):
        return f"const float {name} = {text};"


def param(buf: str) -> str:
    """The kernel parameter of buffer `buf`: its name with `_in` appended, so that no
    buffer name (an input's, such as x, v or w, or a C keyword) meets a local of the
    kernel or the language (Triton's parameters carry `_ptr` for the same reason)."""
    return f"{buf}_in"


_int = CudaDialect.int_assign


def _indent(lines, n=1):
    return indent(lines, n, CudaDialect.indent_unit)


HEADER = '''// {name}: {kind} kernel ({covers}).
// Generated by apsat for sm_90: sizes are constexpr, fp32 arithmetic (IEEE div/sqrt).
#include <cuda_fp16.h>
#include <cuda_bf16.h>
'''

def _device_function(fn: str) -> str:
    """`apsat_fn(a, b)`, a primitive the table defines for kernels (max, min), its body
    that definition's comparisons and selects; the reductions use apsat_max too."""
    lines, result = defined_body(CudaDialect(), fn)
    body = "".join(f"  {ln}\n" for ln in lines)
    return (f"// apsat/lang/primitives.py's {fn}\n__device__ __forceinline__ float apsat_{fn}(float a, float b) {{\n"
            f"{body}  return {result};\n}}\n")


# every kernel's prelude: unused ones cost nothing (inlined where called)
DEVICE_FUNCTIONS = "\n".join([_device_function(fn) for fn in sorted(DEFINED)] + [ROUND])

def kernel_source(k: Kernel) -> tuple[str, dict]:
    """(CUDA source of kernel k, launch configuration {"grid", "block", "tiles"})."""
    body, launch, extra = {"elementwise": _elementwise, "gemm": _gemm, "reduce": _reduce,
                           "attention": _attention}[k.kind](k)
    params = [f"{wm.c_type(k.types, k.out)}* __restrict__ out"] + [
        f"const {wm.c_type(k.types, r)}* __restrict__ {param(r)}" for r in k.reads]
    head = HEADER.format(name=k.name, kind=k.kind, covers=", ".join(k.covers) or k.kind) + wm.include(k)
    signature = (f'extern "C" __global__ void __launch_bounds__({launch["block"]}) '
                 f"{k.name}({', '.join(params)}) {{")
    src = "\n".join([head, DEVICE_FUNCTIONS, extra, signature, *_indent(body), "}", ""])
    return src, launch


def launch_plan(k: Kernel) -> dict:
    """Kernel k's launch configuration {"grid", "block"} (with "tiles" for gemm and
    attention), without generating its source: the runner's and the report's tables."""
    size = {g: math.prod(d) for g, d in k.axes.items()}
    if k.kind == "elementwise":
        return {"grid": (-(-size["o"] // THREADS), 1, 1), "block": THREADS}
    if k.kind == "reduce":
        return {"grid": (-(-size["r"] // ROWS_PER_BLOCK), 1, 1), "block": 32 * ROWS_PER_BLOCK}
    if k.kind == "gemm":
        tiles = cuda_gemm_tiles(k.tiles)
        grid = (-(-size["m"] // tiles["BM"]), -(-size["n"] // tiles["BN"]), size["b"])
        return {"grid": grid, "block": THREADS, "tiles": tiles}
    tiles = cuda_attention_tiles(size["n"], size["d"], size["e"])
    return {"grid": (-(-size["m"] // tiles["ROWS"]), size["b"], 1), "block": tiles["threads"], "tiles": tiles}


def _stored(k: Kernel, text: str) -> str:
    """The float value `text` as k's output buffer stores it: rounded once to its type."""
    return wm.narrowed(k.types.get(k.out, "f32"), text)


def _elementwise(k: Kernel):
    dims = k.axes["o"]
    n = math.prod(dims)
    d = CudaDialect(k.types)
    lines = [f"constexpr int N = {n};",
             f"const int offs = blockIdx.x * {THREADS} + threadIdx.x;",
             "if (offs >= N) return;"]
    lines += axis_defs(d, "o", dims, var("offs", n), _int, used_vars(k.values["out"]))
    vl, t = emit(d, {"out": k.values["out"]}, {}, "v")
    lines += vl + [f"out[offs] = {_stored(k, t['out'])};"]
    return lines, launch_plan(k), ""


def _gemm(k: Kernel):
    ax = k.axes
    bsz, m, n, kk = (math.prod(ax[g]) for g in "bmnk")
    launch = launch_plan(k)
    bm, bn, bk = (launch["tiles"][t] for t in ("BM", "BN", "BK"))
    d = CudaDialect(k.types)
    tc = wm.uses_wmma(k)     # half operands: tensor cores (cuda_wmma.py)
    used = used_vars(*k.values.values(), k.store)
    lines = [f"constexpr int M = {m}, N = {n}, K = {kk};",
             f"constexpr int BM = {bm}, BN = {bn}, BK = {bk}, TM = BM / 16, TN = BN / 16;",
             *(wm.shared(k) if tc else ["__shared__ float As[BK][BM];", "__shared__ float Bs[BK][BN];"]),
             "const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;",
             "const int rm0 = blockIdx.x * BM, rn0 = blockIdx.y * BN;"]
    used |= used_vars(*(st.elem for st in k.stats))
    batch = axis_defs(d, "b", ax["b"], var("pid_b", bsz), _int, used)
    lines += (["const int pid_b = blockIdx.z;"] + batch) if batch else []
    for st in k.stats:
        lines += gemm_row_stats(st, d, ax["m"], m)
    lines += [] if tc else ["float acc[TM][TN];",
                            "#pragma unroll", "for (int i = 0; i < TM; ++i)",
                            "  #pragma unroll", "  for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;"]
    # each section defines only the variables it reads (nvcc warns about unused ones)
    used_a, used_b = used_vars(k.values["a"]), used_vars(k.values["b"])
    used_e = used_vars(k.values["out"], k.store)
    la, ta = emit(d, {"a": k.values["a"]}, stat_syms(k.stats, "lm"), "va")
    lb, tb = emit(d, {"b": k.values["b"]}, {}, "vb")
    stage_a = (["const int lm = e / BK, lk = e % BK;", "const int rm = rm0 + lm, rka = ks + lk;",
                "float v = 0.0f;", "if (rm < M && rka < K) {"]
               + _indent(axis_defs(d, "m", ax["m"], var("rm", m), _int, used_a)
                         + axis_defs(d, "ka", ax["k"], var("rka", kk), _int, used_a) + la
                         + [f"v = {ta['a']};"]) + ["}", wm.staged(k, "As[lm][lk]", "v") if tc else "As[lk][lm] = v;"])
    stage_b = (["const int lk = e / BN, ln = e % BN;", "const int rkb = ks + lk, rn = rn0 + ln;",
                "float v = 0.0f;", "if (rkb < K && rn < N) {"]
               + _indent(axis_defs(d, "n", ax["n"], var("rn", n), _int, used_b)
                         + axis_defs(d, "kb", ax["k"], var("rkb", kk), _int, used_b) + lb
                         + [f"v = {tb['b']};"]) + ["}", wm.staged(k, "Bs[lk][ln]", "v") if tc else "Bs[lk][ln] = v;"])
    inner = ["float ra[TM], rb[TN];",
             "#pragma unroll", "for (int i = 0; i < TM; ++i) ra[i] = As[kk][ty + 16 * i];",
             "#pragma unroll", "for (int j = 0; j < TN; ++j) rb[j] = Bs[kk][tx + 16 * j];",
             "#pragma unroll", "for (int i = 0; i < TM; ++i)",
             "  #pragma unroll", "  for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(ra[i], rb[j], acc[i][j]);"]
    products = wm.inner(k, bm, bn) if tc else ["#pragma unroll", "for (int kk = 0; kk < BK; ++kk) {"] + _indent(inner) + ["}"]
    loop = (["for (int e = tid; e < BM * BK; e += 256) {"] + _indent(stage_a) + ["}"]
            + ["for (int e = tid; e < BK * BN; e += 256) {"] + _indent(stage_b) + ["}"]
            + ["__syncthreads();"] + products + ["__syncthreads();"])
    lines += ["for (int ks = 0; ks < K; ks += BK) {"] + _indent(loop) + ["}"] + (wm.drain(bm, bn) if tc else [])
    acc = "Cs[ty + 16 * i][tx + 16 * j]" if tc else "acc[i][j]"
    le, te = emit(d, {"out": k.values["out"]}, {"acc": acc, **stat_syms(k.stats, "ty + 16 * i")}, "ve")
    epi = (["const int rm = rm0 + ty + 16 * i, rn = rn0 + tx + 16 * j;", "if (rm < M && rn < N) {"]
           + _indent(axis_defs(d, "m", ax["m"], var("rm", m), _int, used_e)
                     + axis_defs(d, "n", ax["n"], var("rn", n), _int, used_e) + le
                     + [f"out[{d.ix(k.store)}] = {_stored(k, te['out'])};"]) + ["}"])
    lines += ["#pragma unroll", "for (int i = 0; i < TM; ++i) {", "  #pragma unroll",
              "  for (int j = 0; j < TN; ++j) {"] + _indent(epi, 2) + ["  }", "}"]
    return lines, launch, WARP_REDUCE if k.stats else ""


def _reduce(k: Kernel):
    rows, cols = math.prod(k.axes["r"]), math.prod(k.axes["c"])
    d = CudaDialect(k.types)
    used = used_vars(*k.values.values(), k.store)
    lines = [f"constexpr int ROWS = {rows}, COLS = {cols};",
             "const int lane = threadIdx.x & 31;",
             f"const int rr = blockIdx.x * {ROWS_PER_BLOCK} + (threadIdx.x >> 5);",
             "if (rr >= ROWS) return;   // uniform per warp: the shuffles below stay full-warp"]
    lines += axis_defs(d, "r", k.axes["r"], var("rr", rows), _int, used)

    def chunk(tag, use, epilogue=False):
        needed = used_vars(k.values["elem"]) | (used_vars(k.values["out"], k.store) if epilogue else set())
        body = axis_defs(d, "c", k.axes["c"], var("cc", cols), _int, needed)
        el, te = emit(d, {"x": k.values["elem"]}, {}, f"x{tag}_")
        body += el + [f"const float x = {te['x']};"] + use
        return ["for (int cc = lane; cc < COLS; cc += 32) {"] + _indent(body) + ["}"]

    def finish(acc):
        el, te = emit(d, {"out": k.values["out"]}, {"acc": acc}, "ve")
        return el + [f"out[{d.ix(k.store)}] = {_stored(k, te['out'])};"]

    op = k.op
    if op in ("sum", "mean", "max"):
        ident = d.const(-math.inf) if op == "max" else "0.0f"
        lines.append(f"float part = {ident};")
        lines += chunk("a", ["part = apsat_max(part, x);" if op == "max" else "part += x;"])
        red = "warp_max(part)" if op == "max" else "warp_sum(part)"
        lines.append(f"const float acc = {red}" + (" / (float)COLS;" if op == "mean" else ";"))
        lines += ["if (lane == 0) {"] + _indent(finish("acc")) + ["}"]
    elif op == "softmax":
        lines.append(f"float part = {d.const(-math.inf)};")
        lines += chunk("a", ["part = apsat_max(part, x);"])
        lines += ["const float mx = warp_max(part);", "part = 0.0f;"]
        lines += chunk("b", ["part += expf(x - mx);"])
        lines.append("const float total = warp_sum(part);")
        lines += chunk("c", ["const float acc = expf(x - mx) / total;"] + finish("acc"), True)
    elif op == "layer-norm":
        lines.append("float part = 0.0f;")
        lines += chunk("a", ["part += x;"])
        lines += ["const float mean = warp_sum(part) / (float)COLS;", "part = 0.0f;"]
        lines += chunk("b", ["part += (x - mean) * (x - mean);"])
        lines.append(f"const float den = sqrtf(warp_sum(part) / (float)COLS + {d.const(k.eps)});")
        lines += chunk("c", ["const float acc = (x - mean) / den;"] + finish("acc"), True)
    elif op == "rms-norm":
        lines.append("float part = 0.0f;")
        lines += chunk("a", ["part += x * x;"])
        lines.append(f"const float den = sqrtf(warp_sum(part) / (float)COLS + {d.const(k.eps)});")
        lines += chunk("b", ["const float acc = x / den;"] + finish("acc"), True)
    else:
        raise AssertionError(op)
    return lines, launch_plan(k), WARP_REDUCE


def _online_softmax(neg_inf: str) -> list[str]:
    """One key tile's step of the online softmax for a warp's row (score `s` per lane):
    the running max and sum rescaled, the tile's probabilities through Ps into acc."""
    return ["const float m_new = fmaxf(m_i, warp_max(s));",
            "// all -inf so far: subtract 0, so exp(-inf - 0) = 0, not nan",
            f"const float shift = m_new == {neg_inf} ? 0.0f : m_new;",
            "const float alpha = expf(m_i - shift), p = expf(s - shift);",
            "l_i = l_i * alpha + warp_sum(p);", "m_i = m_new;",
            "if (lane < BN) Ps[w][lane] = p;", "__syncwarp();",
            "#pragma unroll", "for (int i = 0; i < EPL; ++i) {",
            "  const int ee = lane + 32 * i;", "  float a = acc[i] * alpha;",
            "  if (ee < E)", "    for (int j = 0; j < BN; ++j) a += Ps[w][j] * Vs[j][ee];",
            "  acc[i] = a;", "}", "__syncthreads();   // done with Ks, Vs and Ps"]


def _attention(k: Kernel):
    """FlashAttention in CUDA C (the module doc); the Triton kernel's online softmax, its
    -inf guard and its SAFE rule (triton._attention)."""
    ax = k.axes
    bsz, m, n, dd, e = (math.prod(ax[g]) for g in "bmnde")
    launch = launch_plan(k)
    rows, bn, threads = (launch["tiles"][t] for t in ("ROWS", "BN", "threads"))
    d = CudaDialect(k.types)
    neg_inf = d.const(-math.inf)
    used = used_vars(*k.values.values(), k.store)

    def section(key, defs, syms=None, prefix="v"):
        """Definitions of the loop variables value `key` reads (from `defs`: name -> text),
        its statements, and its text."""
        need = used_vars(k.values[key]) | (used_vars(k.store) if key == "out" else set())
        lines = [_int(name, text) for name, text in defs.items() if name in need]
        vl, te = emit(d, {key: k.values[key]}, syms or {}, prefix)
        return lines + vl, te[key]

    def stage(array, width, index, key, defs, prefix):
        """Cooperatively copy a tile of value `key` (zero past the edges) into `array`."""
        body, text = section(key, defs, prefix=prefix)
        return ([f"for (int i = tid; i < {array[1]} * {width}; i += {threads}) {{",
                 f"  const int j = i / {width}, c = i % {width};", "  float x = 0.0f;",
                 f"  if ({index}) {{"] + _indent(body + [f"x = {text};"], 2)
                + ["  }", f"  {array[0]}[j][c] = x;", "}"])

    lines = [f"constexpr int M = {m}, N = {n}, D = {dd}, E = {e};",
             f"constexpr int ROWS = {rows}, BN = {bn}, EPL = {-(-e // 32)};",
             "__shared__ float Qs[ROWS][D];",
             "__shared__ float Ks[BN][D + 1];   // + 1: lanes read rows of K, no bank conflicts",
             "__shared__ float Vs[BN][E];", "__shared__ float Ps[ROWS][BN];",
             "const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;",
             "const int m_base = blockIdx.x * ROWS, rm = m_base + w;   // this warp's query row"]
    batch = axis_defs(d, "b", ax["b"], var("pid_b", bsz), _int, used)
    lines += (["const int pid_b = blockIdx.y;"] + batch) if batch else []
    lines += stage(("Qs", "ROWS"), "D", "m_base + j < M", "q", {"m0": "m_base + j", "dq0": "c"}, "vq")
    lines += [f"float m_i = {neg_inf}, l_i = 0.0f;", "float acc[EPL];", "#pragma unroll",
              "for (int i = 0; i < EPL; ++i) acc[i] = 0.0f;"]
    loop = stage(("Ks", "BN"), "D", "ns + j < N", "k", {"nk0": "ns + j", "dk0": "c"}, "vk")
    loop += stage(("Vs", "BN"), "E", "ns + j < N", "v", {"nv0": "ns + j", "ev0": "c"}, "vv")
    loop.append("__syncthreads();   // the tiles (and, the first time, Qs) are in place")
    sb, tb = section("bias", {"m0": "rm", "ns0": "sn"}, prefix="vs")
    score = (["float dot = 0.0f;", "for (int c = 0; c < D; ++c) dot += Qs[w][c] * Ks[lane][c];"]
             + sb + [f"s = dot + {tb};" if k.values["bias"] != ("const", 0.0) else "s = dot;"])
    # all 32 lanes of every warp (rows past M too) reach the shuffles: no early return
    loop += [f"float s = {neg_inf};", "const int sn = ns + lane;", "if (rm < M && lane < BN && sn < N) {"]
    loop += _indent(score) + ["}"] + _online_softmax(neg_inf)
    lines += ["for (int ns = 0; ns < N; ns += BN) {"] + _indent(loop) + ["}"]
    norm = "l_i > 0.0f ? acc[i] / l_i : 0.0f" if k.op == "safe" else "acc[i] / l_i"
    so, to = section("out", {"m0": "rm", "e0": "ee"}, {"acc": "o"}, "ve")
    fin = ["const int ee = lane + 32 * i;", "if (ee < E) {"] + _indent(
        [f"const float o = {norm};"] + so + [f"out[{d.ix(k.store)}] = {_stored(k, to)};"]) + ["}"]
    lines += (["if (rm < M) {", "  #pragma unroll", "  for (int i = 0; i < EPL; ++i) {"]
              + _indent(fin, 2) + ["  }", "}"])
    return lines, launch, WARP_REDUCE


__all__ = ["CudaDialect", "compile_cuda", "kernel_source", "launch_plan", "nvcc_path", "param"]
