"""The Triton helper functions generated kernels call (split out of triton.py, which
writes the kernels): each a `@triton.jit` function in the kernel's own file."""
from __future__ import annotations

# Generated kernels call Triton builtins and the helpers below only, never the @jit
# functions of triton.language.standard (tl.zeros, tl.sum, tl.max, tl.sigmoid): those are compiled
# or interpreted depending on TRITON_INTERPRET when triton is first imported, and a kernel
# interpreted on the CPU cannot call a compiled one; the helpers live in the kernel's own
# file, whose @triton.jit functions the runner rebinds as interpreter functions on the CPU.
HELPERS = {
    "sum": '''@triton.jit
def _add(a, b):
    return a + b
''',
    "tanh": '''@triton.jit
def _tanh(x):
    # tanh from exp(-2|x|): no overflow; absolute error ~1e-7 near 0
    # x itself at +-0 (tanh(-0) = -0) and NaN
    t = tl.exp(-2.0 * tl.abs(x))
    y = (1.0 - t) / (1.0 + t)
    return tl.where(x < 0, -y, tl.where(x > 0, y, x))
''',
    "log1p": '''@triton.jit
def _log1p(x):
    # log(1 + x) = log(u) * x / (u - 1) for u = 1 + x rounded (the rounding of u cancels);
    # x itself where u - 1 is 0 (|x| below half an ulp of 1), u where u is infinite
    u = 1.0 + x
    d = u - 1.0
    r = tl.where(u == float("inf"), u, tl.log(u) * (x / tl.where(d == 0.0, 1.0, d)))
    return tl.where(d == 0.0, x, r)
''',
    "fmod": '''@triton.jit
def _fmod(a, b):
    # C's fmodf. Float % is LLVM's frem, which NVPTX computes as a - trunc(a / b) * b: a
    # quotient rounded to the next integer leaves r outside fmodf's range (a's sign,
    # |r| < |b|), so step it back by |b|: exact while |a / b| < 2**23 (nothing to do under
    # the interpreter, whose % is np.fmod)
    # (nested wheres, not &: the interpreter cannot & a scalar condition with a block)
    r = a % b
    m = tl.abs(b)
    r = tl.where(a >= 0.0, tl.where(r < 0.0, r + m, r), tl.where(r > 0.0, r - m, r))
    return tl.where(tl.abs(r) >= m, tl.where(a < 0.0, r + m, r - m), r)
''',
    "powc": '''@triton.jit
def _powc(a, b: tl.constexpr, INTEGRAL: tl.constexpr, ODD: tl.constexpr):
    # a ** b for a literal b (not 0, 0.5, 1, 2, 3: those are multiplications or sqrt), as
    # C's powf: the sign from a's sign bit (-0 and -inf too) for an odd b, NaN for a finite
    # negative a and a non-integer b
    r = tl.math.exp2(b * tl.math.log2(tl.abs(a)))
    if ODD:
        r = tl.where(tl.where(a == 0.0, 1.0 / a, a) < 0.0, -r, r)
    if not INTEGRAL:
        r = tl.where(a < 0, tl.where(a == float("-inf"), r, float("nan")), r)
    return tl.where(tl.abs(a) == 1.0, tl.where(a == 1.0, 1.0, r), r)
''',
    "round": '''@triton.jit
def _round(x, code):
    # a cast: to nearest even in the type the code names (10 f16, 16 bf16, else f32), back
    # in float32; the code is a literal, so the selects fold
    h = x.to(tl.float16).to(tl.float32)
    b = x.to(tl.bfloat16).to(tl.float32)
    return tl.where(code == 10.0, h, tl.where(code == 16.0, b, x))
''',
    "pow": '''@triton.jit
def _pow(a, b):
    # C's powf (onnxruntime's Pow): |a| ** b as exp2(b * log2|a|); the sign from a's sign
    # bit (-0 and -inf too) for an odd integer b; NaN for a finite negative a and a
    # non-integer b; 1 for pow(a, 0), pow(1, b) and pow(-1, +-inf), where the exp2 form
    # meets 0 * inf or NaN
    a, b = tl.broadcast(a, b)
    r = tl.math.exp2(b * tl.math.log2(tl.abs(a)))
    bi = tl.math.floor(b)
    odd = (bi == b) & ((bi - 2.0 * tl.math.floor(bi * 0.5)) == 1.0)
    r = tl.where((tl.where(a == 0.0, 1.0 / a, a) < 0.0) & odd, -r, r)
    r = tl.where((a < 0.0) & (a > float("-inf")) & (bi != b), float("nan"), r)
    r = tl.where(tl.abs(a) == 1.0, tl.where(tl.abs(b) == float("inf"), 1.0, r), r)
    r = tl.where(a == 1.0, 1.0, r)
    r = tl.where(b == 1.0, a, r)     # exactly a (exp2 of a rounded log2 is not, near the range's end)
    return tl.where(b == 0.0, 1.0, r)
''',
}
