"""Triton code generation for the kernel graph (compiled ahead of time by
apsat/backends/gpu/aot.py, run by the generated runner).

Each kernel becomes one Python file holding one `@triton.jit` function. Every size and
stride is a compile-time constant (the loop bounds and tile sizes are `tl.constexpr`
parameters, the per-axis strides are literals in the index arithmetic), so Triton
specialises the kernel to the model's shapes; edges that are not multiples of a tile are
masked. Each file also carries `launch(out, *inputs)` (grid and constants filled in) and
`SIGNATURE`/`CONSTEXPRS` for compiling it without a GPU.

Buffers hold their term's element type (graph.Buffer.dtype). Loads of f16/bf16 buffers
are widened to float32 at once, so every element-wise step, reduction and epilogue computes
in float32 registers, and a store rounds once to its buffer's type. Products of f32
operands use `tl.dot(..., input_precision="ieee")` (never tf32); products of f16/bf16
operands (Kernel.operand) pass them to `tl.dot(a, b, out_dtype=tl.float32)`, tensor cores
with float32 accumulation: an operand loaded as it is stored stays half, one computed in
the kernel (a prologue) is rounded to the operand type first, as the reference rounds that
term. Square roots are `sqrt_rn`, and element-wise arithmetic is not contracted into FMAs
(`enable_fp_fusion=False`, Triton 3.10's default), so epilogues round like the reference. The epilogue of a matmul or reduction is the kernel
graph's value for the element, stored where the graph says (through the inverse of the
consumer's view path). The attention kernel (`_attention`) is FlashAttention's loop: per
query tile, scores against one key tile at a time, an online softmax, p.v accumulated.

`run(program, inputs)` lowers, writes the kernels and a runner module into a private cache
folder (apsat/backends/gpu/runner.py writes it), and launches them on torch tensors: on the
GPU when torch sees one, else under the Triton interpreter (the runner rebinds each kernel
module's @triton.jit functions as interpreter functions; no environment variable is set),
which is how the tests check every kernel on a CPU.
"""
from __future__ import annotations

import math

import numpy as np

from apsat.backends.gpu.triton_helpers import HELPERS
from apsat.backends.gpu.emit import Dialect, axis_defs, defined_body, emit, used_vars
from apsat.backends.gpu.emit import indent as _indent
from apsat.backends.gpu.expr import DEFINED, var
from apsat.backends.gpu.graph import Kernel
from apsat.backends.gpu.tiling import attention_pad
from apsat.backends.gpu.triton_norms import gemm_row_stats, norm_rows
from apsat.lang import dtypes

IDENTITY = {"sum": "0.0", "mean": "0.0", "max": 'float("-inf")'}
TL_TYPE = {dtypes.F32: "tl.float32", dtypes.F16: "tl.float16", dtypes.BF16: "tl.bfloat16"}
SIG_TYPE = {dtypes.F32: "*fp32", dtypes.F16: "*fp16", dtypes.BF16: "*bf16"}


class TritonDialect(Dialect):
    """Values as Triton tensor expressions. `base_mask` names the mask of the section
    being emitted (lanes past a tile's edge); loads that depend on a loop variable use it."""

    floordiv = "//"
    int_cast = "{}.to(tl.int32)"

    def __init__(self, base_mask: str, types: dict | None = None, keep: str | None = None):
        """types: buffer -> element type (absent: f32); a half buffer's loads are widened
        to float32, except those of type `keep` (a product operand read as stored)."""
        self.base_mask = base_mask
        self.helpers: set[str] = set()
        self.types, self.keep = types or {}, keep

    def const(self, v: float) -> str:
        if math.isinf(v):
            return 'float("inf")' if v > 0 else 'float("-inf")'
        if math.isnan(v):
            return 'float("nan")'
        return repr(float(np.float32(v)))

    def load(self, buf, offset, conds, varying):
        masks = ([self.base_mask] if varying else []) + conds
        text = (f"tl.load({buf}_ptr + {offset})" if not masks else
                f"tl.load({buf}_ptr + {offset}, mask={' & '.join(masks)}, other=0.0)")
        dtype = self.types.get(buf, dtypes.F32)
        return text if dtype in (dtypes.F32, self.keep) else f"{text}.to(tl.float32)"

    def call(self, fn, a, nodes=()):
        if fn == "pow" and len(nodes) == 2 and nodes[1][0] == "const":
            e = nodes[1][1]        # a literal exponent: its parity is known here
            integral = float(e).is_integer()
            self.helpers.add("powc")
            return f"_powc({a[0]}, {a[1]}, {integral}, {integral and int(e) % 2 == 1})"
        simple = {"add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})",
                  "div": "({0} / {1})", "neg": "(-{0})", "sqrt": "tl.sqrt_rn({0})", "exp": "tl.exp({0})",
                  "erf": "tl.math.erf({0})", "sigmoid": "(1.0 / (1.0 + tl.exp(-{0})))",
                  "abs": "tl.abs({0})",
                  "log": "tl.log({0})", "recip": "(1.0 / {0})", "floor": "tl.floor({0})",
                  "ceil": "tl.ceil({0})", "cos": "tl.cos({0})", "sin": "tl.sin({0})"}
        if fn in simple:
            return simple[fn].format(*a)
        if fn not in HELPERS:
            raise ValueError(f"Triton has no spelling of {fn!r}")
        # tanh, log1p, fmod, pow: not in the interpreter's tl.math; max, min: the primitive
        # table's definitions (tl.maximum / tl.minimum drop NaN)
        self.helpers.add(fn)
        return f"_{fn}({', '.join(a)})"

    def where(self, cond, a, b):
        return f"tl.where({cond}, {a}, {b})"

    def assign(self, name, text):
        return f"{name} = {text}"




def _defined_helper(fn: str) -> str:
    """The @triton.jit function `_fn(a, b)` of a primitive the table defines for kernels
    (max, min), its body that definition's comparisons and selects; the reductions
    combine with `_max` too, so a maximum propagates NaN wherever a kernel takes one."""
    lines, result = defined_body(TritonDialect(""), fn)
    body = "".join(f"    {ln}\n" for ln in lines)
    return f"@triton.jit\ndef _{fn}(a, b):\n    # apsat/lang/primitives.py's {fn}\n{body}    return {result}\n"


HELPERS.update({fn: _defined_helper(fn) for fn in DEFINED})


def _stored(k: Kernel, text: str) -> str:
    """The float32 value `text` as k's output buffer stores it: rounded once to its type."""
    dtype = k.types.get(k.out, dtypes.F32)
    return text if dtype == dtypes.F32 else f"({text}).to({TL_TYPE[dtype]})"


def _operand(k: Kernel, text: str) -> str:
    """A product operand as tl.dot takes it: f32 as it is; f16/bf16 rounded to the
    operand type (a no-op for a half load, the reference's rounding for a prologue)."""
    return text if k.operand == dtypes.F32 else f"{text}.to({TL_TYPE[k.operand]})"


def _dot(k: Kernel, a: str, b: str) -> str:
    """tl.dot of a and b: f32 operands in IEEE fp32; half operands on tensor cores,
    accumulated in float32."""
    if k.operand == dtypes.F32:
        return f'tl.dot({a}, {b}, input_precision="ieee")'
    return f"tl.dot({a}, {b}, out_dtype=tl.float32)"


def _dialects(k: Kernel, *masks: str, keep=None):
    """TritonDialects over k's buffer types, sharing one helper set."""
    out = [TritonDialect(m, k.types, keep) for m in masks]
    for d in out[1:]:
        d.helpers = out[0].helpers
    return out


def _keep(k: Kernel, value) -> str | None:
    """The operand type for a product operand that is a plain load (kept half, not
    widened and narrowed again), else None."""
    return k.operand if k.operand != dtypes.F32 and value[0] == "load" else None


def _params(k: Kernel) -> list[str]:
    return ["out_ptr"] + [f"{r}_ptr" for r in k.reads]


def _build(k: Kernel):
    """(body lines, constexprs, grid, dialect, grid keys): a grid entry is ceil(size / tile)
    for a key (size, tile), else the size, both named among the constexprs."""
    lines, consts, keys, d = {"elementwise": _elementwise, "gemm": _gemm, "reduce": _reduce,
                              "attention": _attention}[k.kind](k)
    grid = tuple(-(-consts[a[0]] // consts[a[1]]) if len(a) == 2 else consts[a[0]] for a in keys)
    return lines, consts, grid, d, keys


def launch_plan(k: Kernel) -> dict:
    """{"grid": the launch grid, "constexprs": the compile-time parameters} of kernel k."""
    _, constexprs, grid, _, _ = _build(k)
    return {"grid": tuple(grid), "constexprs": constexprs}


def kernel_source(k: Kernel) -> str:
    """The Triton source file of kernel k (see the module doc for its contents)."""
    body, constexprs, grid, d, keys = _build(k)
    helpers = "\n\n".join(HELPERS[h] for h in sorted(d.helpers))
    params = _params(k) + [f"{c}: tl.constexpr" for c in constexprs]
    cover = ", ".join(k.covers) or k.kind
    tiles = ", ".join(f"{a}={b}" for a, b in k.tiles.items() if a != "modelled_us")
    warps = int(k.tiles.get("num_warps", 4))
    # pipeline stages: Triton's default unless a tuning chose (tuning.py); the interpreter ignores them
    stages = int(k.tiles["num_stages"]) if "num_stages" in k.tiles else None
    sig = {"out_ptr": SIG_TYPE[k.types.get(k.out, dtypes.F32)]}
    sig.update({f"{r}_ptr": SIG_TYPE[k.types.get(r, dtypes.F32)] for r in k.reads})
    sig.update({c: "constexpr" for c in constexprs})
    args = ", ".join(["out"] + k.reads)
    return "\n".join([
        f'"""{k.name}: {k.kind} kernel ({cover}).',
        "",
        "Generated by apsat. Sizes are specialised to the model: loop bounds and tiles are",
        f"tl.constexpr parameters, strides are literals. Tiles: {tiles}.",
        '"""',
        "import triton",
        "import triton.language as tl",
        "",
        "",
        helpers + ("\n\n" if helpers else "") + "@triton.jit",
        f"def {k.name}({', '.join(params)}):",
        *_indent(body),
        "",
        "",
        f"CONSTEXPRS = {constexprs!r}",
        f"SIGNATURE = {sig!r}",
        f"GRID = {tuple(grid)!r}",
        f"GRID_KEYS = {keys!r}",
        f"NUM_WARPS = {warps}",
        *([f"NUM_STAGES = {stages}"] if stages else []),
        f"KERNEL = {k.name}",
        "",
        "",
        f"def launch({args}):",
        f'    """Run {k.name}: writes out from {", ".join(k.reads) or "nothing"} (torch tensors)."""',
        f"    {k.name}[GRID]({args}, **CONSTEXPRS, num_warps=NUM_WARPS"
        + (", num_stages=NUM_STAGES" if stages else "") + ", enable_fp_fusion=False)",
        "",
    ])


def _elementwise(k: Kernel):
    dims = k.axes["o"]
    n = math.prod(dims)
    block = int(k.tiles["BLOCK"])
    d, = _dialects(k, "mask")
    lines = ["pid = tl.program_id(0)", "offs = pid * BLOCK + tl.arange(0, BLOCK)", "mask = offs < N"]
    lines += axis_defs(d, "o", dims, var("offs", n), d.assign, used_vars(k.values["out"]))
    vl, texts = emit(d, {"out": k.values["out"]}, {}, "v")
    lines += vl
    lines.append(f"tl.store(out_ptr + offs, {_stored(k, texts['out'])}, mask=mask)")
    return lines, {"N": n, "BLOCK": block}, (("N", "BLOCK"),), d


def _gemm(k: Kernel):
    ax = k.axes
    bsz, m, n, kk = (math.prod(ax[g]) for g in "bmnk")
    t = k.tiles
    bm, bn, bk = int(t["BM"]), int(t["BN"]), int(t["BK"])
    d, = _dialects(k, "mask")
    da, = _dialects(k, "mask_a", keep=_keep(k, k.values["a"]))
    db, = _dialects(k, "mask_b", keep=_keep(k, k.values["b"]))
    d.helpers = da.helpers = db.helpers
    lines = ["pid_m = tl.program_id(0)", "pid_n = tl.program_id(1)", "pid_b = tl.program_id(2)",
             "rm = pid_m * BM + tl.arange(0, BM)[:, None]",
             "rn = pid_n * BN + tl.arange(0, BN)[None, :]"]
    used = used_vars(*k.values.values(), k.store, *(st.elem for st in k.stats))
    lines += axis_defs(d, "b", ax["b"], var("pid_b", bsz), d.assign, used)
    lines += axis_defs(d, "m", ax["m"], var("rm", m), d.assign, used)
    lines += axis_defs(d, "n", ax["n"], var("rn", n), d.assign, used)
    consts = {"BATCH": bsz, "M": m, "N": n, "K": kk, "BM": bm, "BN": bn, "BK": bk}
    syms = {}
    for st in k.stats:
        lines += gemm_row_stats(st, d, consts)
        syms.update({s: s for s in st.symbols})
    lines.append("acc = tl.full((BM, BN), 0.0, tl.float32)")
    loop = ["rka = ks + tl.arange(0, BK)[None, :]", "rkb = ks + tl.arange(0, BK)[:, None]",
            "mask_a = (rm < M) & (rka < K)", "mask_b = (rkb < K) & (rn < N)"]
    loop += axis_defs(d, "ka", ax["k"], var("rka", kk), d.assign, used)
    loop += axis_defs(d, "kb", ax["k"], var("rkb", kk), d.assign, used)
    la, ta = emit(da, {"a": k.values["a"]}, syms, "va")
    lb, tb = emit(db, {"b": k.values["b"]}, syms, "vb")
    loop += la + ["a = " + _operand(k, f"tl.where(mask_a, {ta['a']}, 0.0)")]
    loop += lb + ["b = " + _operand(k, f"tl.where(mask_b, {tb['b']}, 0.0)")]
    loop.append(f"acc += {_dot(k, 'a', 'b')}")
    lines += ["for ks in range(0, K, BK):"] + _indent(loop)
    lines.append("mask = (rm < M) & (rn < N)")
    le, te = emit(d, {"out": k.values["out"]}, {"acc": "acc", **syms}, "ve")
    lines += le
    lines.append(f"tl.store(out_ptr + {d.ix(k.store)}, {_stored(k, te['out'])}, mask=mask)")
    return lines, consts, (("M", "BM"), ("N", "BN"), ("BATCH",)), d


def _reduce(k: Kernel):
    rows, cols = math.prod(k.axes["r"]), math.prod(k.axes["c"])
    br, bc = int(k.tiles["BR"]), int(k.tiles["BC"])
    d, = _dialects(k, "mask")
    lines = ["pid = tl.program_id(0)", "rr = pid * BR + tl.arange(0, BR)[:, None]",
             "row_mask = rr < ROWS"]
    used = used_vars(*k.values.values(), k.store)
    lines += axis_defs(d, "r", k.axes["r"], var("rr", rows), d.assign, used)

    def chunk(tag, use):
        """A loop over the row in BC-column chunks: x{tag} is the element, `use` consumes it."""
        body = ["cc = cs + tl.arange(0, BC)[None, :]", "mask = row_mask & (cc < COLS)"]
        body += axis_defs(d, "c", k.axes["c"], var("cc", cols), d.assign, used)   # all: harmless
        el, te = emit(d, {"x": k.values["elem"]}, {}, f"x{tag}_")
        body += el + [f"x = {te['x']}"] + use
        return ["for cs in range(0, COLS, BC):"] + _indent(body)

    def finish(syms, store_mask):
        de = TritonDialect(store_mask, k.types)      # per-row results: loads masked by the row
        de.helpers = d.helpers
        el, te = emit(de, {"out": k.values["out"]}, syms, "ve")
        # a reduction to one value stores at a constant offset: `+ rr * 0` keeps the
        # pointer a block of the value's shape, which tl.store requires
        where = d.ix(k.store) + (" + rr * 0" if not k.store.deps() else "")
        return el + [f"tl.store(out_ptr + {where}, {_stored(k, te['out'])}, mask={store_mask})"]

    op = k.op
    if op in ("sum", "mean", "max"):
        ident = IDENTITY[op]
        comb = "_max(part, x)" if op == "max" else "part + x"
        lines.append(f"part = tl.full((BR, BC), {ident}, tl.float32)")
        lines += chunk("a", [f"x = tl.where(mask, x, {ident})", f"part = {comb}"])
        red = "tl.reduce(part, 1, _max)" if op == "max" else "tl.reduce(part, 1, _add)"
        d.helpers.add("max" if op == "max" else "sum")
        lines.append(f"acc = {red}[:, None]" + (" / COLS" if op == "mean" else ""))
        lines += finish({"acc": "acc"}, "row_mask")
    elif op == "softmax":
        lines.append('part = tl.full((BR, BC), float("-inf"), tl.float32)')
        lines += chunk("a", ['part = _max(part, tl.where(mask, x, float("-inf")))'])
        d.helpers.update({"max", "sum"})
        lines.append("mx = tl.reduce(part, 1, _max)[:, None]")
        lines.append("part = tl.full((BR, BC), 0.0, tl.float32)")
        lines += chunk("b", ["part += tl.where(mask, tl.exp(x - mx), 0.0)"])
        lines.append("total = tl.reduce(part, 1, _add)[:, None]")
        lines += chunk("c", ["acc = tl.exp(x - mx) / total"] + finish({"acc": "acc"}, "mask"))
    elif op in ("layer-norm", "rms-norm"):
        lines += norm_rows(op, d, chunk, finish, k.eps)
    else:
        raise AssertionError(op)
    return lines, {"ROWS": rows, "COLS": cols, "BR": br, "BC": bc}, (("ROWS", "BR"),), d


def _attention(k: Kernel):
    """One program per (tile of BM query rows, batch index): q (BM x BD) loaded once; for
    each tile of BN keys, s = q.k^T + bias (masked lanes -inf), an online softmax (running
    max m_i and sum l_i, the accumulator rescaled by exp(m_old - m_new)), acc += p.v. The
    scores never leave registers. SAFE ("safe") gives 0 for a row whose softmax is NaN."""
    ax, t = k.axes, k.tiles
    bsz, m, n, dd, e = (math.prod(ax[g]) for g in "bmnde")
    bm, bn = int(t["BM"]), int(t["BN"])
    bd, be = int(t.get("BD", attention_pad(dd))), int(t.get("BE", attention_pad(e)))
    d, ds = _dialects(k, "mask_o", "mask_s")
    dq, dk, dv = (_dialects(k, f"mask_{x}", keep=_keep(k, k.values[x]))[0] for x in "qkv")
    dq.helpers = dk.helpers = ds.helpers = dv.helpers = d.helpers
    d.helpers.update({"max", "sum"})
    used = used_vars(*k.values.values(), k.store)

    def define(name, text):        # a loop variable, where some value reads it
        return [f"{name} = {text}"] if name in used else []

    lines = ["pid_m = tl.program_id(0)", "pid_b = tl.program_id(1)",
             "rm = pid_m * BM + tl.arange(0, BM)[:, None]", "rd = tl.arange(0, BD)[None, :]",
             "rdk = tl.arange(0, BD)[:, None]", "re = tl.arange(0, BE)[None, :]"]
    lines += axis_defs(d, "b", ax["b"], var("pid_b", bsz), d.assign, used)
    lines += define("m0", "rm") + define("dq0", "rd") + define("dk0", "rdk") + define("e0", "re")
    lines.append("mask_q = (rm < M) & (rd < D)")
    lq, tq = emit(dq, {"q": k.values["q"]}, {}, "vq")
    lines += lq + ["q = " + _operand(k, f"tl.where(mask_q, {tq['q']}, 0.0)"),
                   'm_i = tl.full((BM, 1), float("-inf"), tl.float32)',
                   "l_i = tl.full((BM, 1), 0.0, tl.float32)", "acc = tl.full((BM, BE), 0.0, tl.float32)"]
    loop = ["rn = ns + tl.arange(0, BN)[None, :]", "rnv = ns + tl.arange(0, BN)[:, None]",
            "mask_k = (rdk < D) & (rn < N)", "mask_s = (rm < M) & (rn < N)",
            "mask_v = (rnv < N) & (re < E)"]
    loop += define("nk0", "rn") + define("ns0", "rn") + define("nv0", "rnv") + define("ev0", "re")
    lk, tk = emit(dk, {"k": k.values["k"]}, {}, "vk")
    loop += lk + ["kt = " + _operand(k, f"tl.where(mask_k, {tk['k']}, 0.0)"), f"s = {_dot(k, 'q', 'kt')}"]
    if k.values["bias"] != ("const", 0.0):       # (access-literal 0.0): no bias to add
        lb, tb = emit(ds, {"bias": k.values["bias"]}, {}, "vs")
        loop += lb + [f"s = s + {tb['bias']}"]
    loop += ['s = tl.where(mask_s, s, float("-inf"))',
             "m_new = tl.maximum(m_i, tl.reduce(s, 1, _max)[:, None])",
             # a row whose scores so far are all -inf keeps m_new = -inf: subtract 0
             # there, so its exp(-inf - 0) is 0 and not exp(-inf - -inf) = nan
             'shift = tl.where(m_new == float("-inf"), 0.0, m_new)',
             "alpha = tl.exp(m_i - shift)", "p = tl.exp(s - shift)",
             "l_i = l_i * alpha + tl.reduce(p, 1, _add)[:, None]"]
    lv, tv = emit(dv, {"v": k.values["v"]}, {}, "vv")
    # half operands: p is rounded to v's type for the tensor-core product, as
    # FlashAttention does (the reference keeps it float32 inside the atom)
    loop += lv + ["vt = " + _operand(k, f"tl.where(mask_v, {tv['v']}, 0.0)"),
                  f"acc = acc * alpha + {_dot(k, _operand(k, 'p'), 'vt')}", "m_i = m_new"]
    lines += ["for ns in range(0, N, BN):"] + _indent(loop)
    # every score -inf: l_i = 0 and 0 / 0 is the NaN softmax gives; SAFE makes that row
    # 0, and a row with a NaN score too (its l_i is NaN, so l_i > 0 fails)
    lines.append("acc = tl.where(l_i > 0.0, acc / l_i, 0.0)" if k.op == "safe" else "acc = acc / l_i")
    lines.append("mask_o = (rm < M) & (re < E)")
    le, te = emit(d, {"out": k.values["out"]}, {"acc": "acc"}, "vo")
    # the store's pointer must be a (BM, BE) block even where the offset ignores m or e
    full = "" if {"m0", "e0"} <= k.store.deps() else " + rm * 0 + re * 0"
    lines += le + [f"tl.store(out_ptr + {d.ix(k.store)}{full}, {_stored(k, te['out'])}, mask=mask_o)"]
    consts = {"BATCH": bsz, "M": m, "N": n, "D": dd, "E": e, "BM": bm, "BN": bn, "BD": bd, "BE": be}
    return lines, consts, (("M", "BM"), ("BATCH",)), d
