"""The primitive scalar functions, and what each gives at NaN, +-inf and -0: one table.

Every element-wise operator of the registry is a formula over these functions
(apsat/lang/formula.py). This table is the one place that says what a primitive means, and
every reading takes it from here:

- the reference interpreter evaluates `numpy` (apsat/lang/semantics.py), and so does the
  systolic simulator's vector unit, which runs the reference's element-wise code;
- each kernel dialect (Triton, CUDA C) writes a primitive that has a `kernel` definition
  as a function of its own whose body is that definition (apsat/backends/gpu/expr.py
  `defined`), never with a hardware instruction of other semantics; the others it spells
  with the instruction or library function whose IEEE 754 behaviour is the contract's;
- the ONNX export writes `onnx`, the ONNX operator whose definition this is.

The contract is ONNX's as onnxruntime computes it (checked by
tests/backends/test_special_values.py on NaN, +-inf, +-0, subnormals and thresholds,
through every backend). Where it matters:

- `max` and `min` propagate NaN from either operand and give the *second* operand on a tie,
  so max(-0, +0) is +0 and max(+0, -0) is -0 (ONNX Max/Min, numpy's maximum/minimum).
  Triton's tl.maximum / tl.minimum and C's fmaxf / fminf return the other operand where
  one is NaN (IEEE maxNum), which is why kernels build them from comparisons instead.
  With the tie rule, relu is max(0, x) (relu(-0) = -0, as onnxruntime's Relu) and clip is
  min(hi, max(lo, x)) (clip(-0, 0, 6) = -0, as onnxruntime's Clip).
- comparisons (the formulas' `ge` condition) are false where either side is NaN; `nz` is
  true for NaN (a Cast of NaN to bool is true).
- `pow` follows C's powf (ONNX Pow in onnxruntime): pow(x, 0) = 1 and pow(1, y) = 1 even for
  NaN, pow(-inf, 0.5) = +inf and pow(-0, 0.5) = +0 (not sqrt's NaN and -0).
- the rest are IEEE 754 operations or C99 library functions at their edges: 1/(+-0) =
  +-inf, log(+-0) = -inf, log(x < 0) = NaN, sqrt(-0) = -0, exp(-inf) = 0, tanh(+-inf) =
  +-1, tanh(-0) = -0, fmod(x, 0) = NaN, fmod(+-inf, y) = NaN.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

_ERF_CHUNK = 1 << 16


def _erf(x):
    """Gauss error function, math.erf in float64 (exact to double precision), chunked
    because np.frompyfunc makes one Python float per element."""
    flat = np.ascontiguousarray(x, dtype=np.float64).reshape(-1)
    out = np.empty(flat.shape, dtype=np.float32)
    f = np.frompyfunc(math.erf, 1, 1)
    for lo in range(0, flat.size, _ERF_CHUNK):
        out[lo: lo + _ERF_CHUNK] = f(flat[lo: lo + _ERF_CHUNK]).astype(np.float64)
    return out.reshape(np.shape(x))


def _sigmoid(x):
    """1 / (1 + e**-x) without overflow: uses e**-|x| on both sides of 0."""
    z = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + z), z / (1 + z)).astype(np.float32)


def _round(x, code):
    """x rounded to the element type whose ONNX code is `code` (one value: a cast's
    parameter), kept as float32 (apsat/lang/dtypes.py)."""
    from apsat.lang.dtypes import code_name, round_to

    return round_to(x, code_name(np.asarray(code).reshape(-1)[0]))


def _pow(a, b):
    """C's powf elementwise. numpy's power takes a square root where the exponent is a
    scalar 0.5 (or one broadcast), which gives NaN at -inf and -0 at -0 where powf gives
    +inf and +0."""
    r = np.power(a, b)
    half = np.asarray(b) == 0.5
    if half.any():
        r = np.where(half & np.isneginf(a), np.float32(np.inf), np.where(half & (a == 0), np.float32(0.0), r))
    return r


# Definitions for the kernel IR, as formula nodes (apsat/lang/formula.py's tuple trees, the
# `ge` condition false on NaN): built from comparisons and selects, whose IEEE behaviour
# every dialect shares.
_A, _B = ("arg", 0), ("arg", 1)


def _ge(x, y):
    return ("ge", x, y)


def _sel(cond, x, y):
    return ("select", cond, x, y)


# b where b >= a (ties: b); a where a > b; else one of them is NaN: the NaN one (a is NaN
# exactly where a >= a fails)
_MAX = _sel(_ge(_B, _A), _B, _sel(_ge(_A, _B), _A, _sel(_ge(_A, _A), _B, _A)))
# b where a >= b (ties: b); a where a < b; else the NaN one
_MIN = _sel(_ge(_A, _B), _B, _sel(_ge(_B, _A), _A, _sel(_ge(_A, _A), _B, _A)))


@dataclass(frozen=True)
class Primitive:
    """One primitive scalar function.

    name     what formulas call it (formula.call(name, ...))
    arity    number of operands
    flops    arithmetic of one evaluation, for the cost models (transcendentals a few)
    numpy    the float32 reading, elementwise over arrays (the reference interpreter's)
    onnx     the ONNX operator that computes exactly this ("Mod fmod=1": with attributes;
             None: the export writes it from other operators)
    kernel   None, or the formula node that defines it for generated kernels, when the
             hardware's own instruction has other semantics at special values
    edges    what it gives at NaN, +-inf and +-0, in words
    """

    name: str
    arity: int
    flops: int
    numpy: Callable
    onnx: str | None
    edges: str
    kernel: tuple | None = None


PRIMITIVES: dict[str, Primitive] = {p.name: p for p in [
    Primitive("neg", 1, 1, np.negative, "Neg", "-x: flips the sign of zeros and infinities; NaN stays NaN."),
    Primitive("sqrt", 1, 4, np.sqrt, "Sqrt", "IEEE: sqrt(-0) = -0, sqrt(x < 0) = NaN, sqrt(inf) = inf."),
    Primitive("exp", 1, 4, np.exp, "Exp", "exp(-inf) = 0, exp(inf) = inf, overflow to inf past ~88.7."),
    Primitive("erf", 1, 8, _erf, "Erf", "erf(+-inf) = +-1, erf(-0) = -0."),
    Primitive("tanh", 1, 8, np.tanh, "Tanh", "tanh(+-inf) = +-1, tanh(-0) = -0."),
    Primitive("sigmoid", 1, 6, _sigmoid, "Sigmoid", "sigmoid(-inf) = 0, sigmoid(inf) = 1; results below ~1e-38 may flush to 0."),
    Primitive("abs", 1, 1, np.abs, "Abs", "|x|: abs(-0) = +0, abs(-inf) = inf."),
    Primitive("log", 1, 4, np.log, "Log", "log(+-0) = -inf, log(x < 0) = NaN, log(inf) = inf."),
    Primitive("log1p", 1, 6, np.log1p, None,
              "log(1 + x) without rounding 1 + x: log1p(-0) = -0, log1p(-1) = -inf, log1p(x < -1) = NaN."),
    Primitive("recip", 1, 1, lambda x: np.float32(1) / x, "Reciprocal", "1 / x: 1 / +-0 = +-inf, 1 / +-inf = +-0."),
    Primitive("floor", 1, 1, np.floor, "Floor", "keeps +-0, +-inf and NaN."),
    Primitive("ceil", 1, 1, np.ceil, "Ceil", "keeps +-0, +-inf and NaN; ceil(-0.5) = -0."),
    Primitive("cos", 1, 8, np.cos, "Cos", "cos(+-inf) = NaN."),
    Primitive("sin", 1, 8, np.sin, "Sin", "sin(+-inf) = NaN, sin(-0) = -0."),
    Primitive("add", 2, 1, np.add, "Add", "IEEE: inf + -inf = NaN, -0 + -0 = -0, -0 + 0 = +0."),
    Primitive("sub", 2, 1, np.subtract, "Sub", "IEEE: inf - inf = NaN, 0 - 0 = +0."),
    Primitive("mul", 2, 1, np.multiply, "Mul", "IEEE: 0 * inf = NaN; the sign is the XOR of the signs."),
    Primitive("div", 2, 1, np.divide, "Div", "IEEE: x / +-0 = +-inf (sign XOR), 0 / 0 = inf / inf = NaN."),
    Primitive("pow", 2, 4, _pow, "Pow",
              "C's powf: pow(x, +-0) = 1 and pow(1, y) = 1 (NaN included), pow(-1, +-inf) = 1, "
              "pow(-inf, 0.5) = inf, pow(-0, 0.5) = +0, pow(x < 0, non-integer) = NaN."),
    Primitive("round", 2, 1, _round, "Cast",
              "x rounded to nearest even in the element type coded by the second operand (1 f32, 10 f16, "
              "16 bf16; a literal): overflow gives +-inf, NaN and +-0 stay."),
    Primitive("max", 2, 1, np.maximum, "Max",
              "NaN if either operand is NaN; the second operand on a tie (max(-0, +0) = +0).", _MAX),
    Primitive("min", 2, 1, np.minimum, "Min",
              "NaN if either operand is NaN; the second operand on a tie (min(+0, -0) = -0).", _MIN),
    Primitive("fmod", 2, 4, np.fmod, "Mod fmod=1",
              "C's fmodf, exact, the sign of the dividend: fmod(x, 0) = NaN, fmod(inf, y) = NaN, "
              "fmod(x, inf) = x."),
]}
