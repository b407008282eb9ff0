"""The op registry: one entry per construct of the access-pattern language.

Each op is declared here once (the fields are apsat/lang/spec.py's): its signature, its
shape rule (apsat/lang/shapes.py), its role on a machine, its arithmetic, its flags, its
reference semantics, and for an element-wise operator the formula every backend computes.
Everything else is derived: the egglog declarations and classification facts
(apsat/lang/egg_gen.py), the operator sets below, the cost models' workload classes, the
interpreter's operator table. tests/test_registry.py walks the registry through every
backend and cost model. Adding an op is one entry here plus its importer mapping
(apsat/frontend/lowering.py); docs/adding-an-op.md says more.

An access pattern's shape is a pair ((iterated dims), (item dims)), after Glenside.
Argument kinds:
  expr          a child Expr term
  int, float    a literal
  name          a tensor name or opaque-call key (a string)
  list          an int tuple written `(list 1 0)`
  shape         an int tuple written `(shape 3 3 3)`
  exprs         a tuple of Expr terms written `(args e1 e2 ...)`
  access-shape  an `(access-shape (shape ..) (shape ..))` term
  pad-type      `zero-padding` or `min-padding`
  compute-op    a compute operator term: `dot-product`, `relu`, `(clip 0.0 6.0)`, ...

Compute operators take literal parameters (`clip lo hi`) or operator-valued ones: `(chain F
G)` applies G to the result of F, item by item, and is written with its operators as
arguments, `(chain elementwise-add relu)`, `(chain (chain elementwise-mul tanh) (clip 0.0 6.0))`.
"""
from __future__ import annotations

import math

from apsat.lang import arithmetic as ar
from apsat.lang import semantics as sem
from apsat.lang import shapes as sh
from apsat.lang.formula import (SQRT2, X, absolute, arg, call, ceil, cos, erf, exp, floor, fmod,
                                lift, log1p, maximum, minimum, neg, nz, param, power, recip,
                                select, sigmoid, sin, sqrt, tanh)
from apsat.lang.spec import ComputeSpec, OpSpec
from apsat.lang.term import ATTRIBUTE_OPS

Dims = tuple[int, ...]
AccessShape = tuple[Dims, Dims]
X0, X1, X2 = arg(0), arg(1), arg(2)

# ---- formulas several element-wise entries share, in onnxruntime's float32 steps ----------------

# log(1 + e**x) as x + log1p(e**-x) for x >= 0 and log1p(e**x) below: e** never overflows
# where it is selected (softplus(100) is 100), and tiny results keep their value, as onnxruntime's.
SOFTPLUS = select(X >= 0.0, X + log1p(exp(-X)), log1p(exp(X)))
GELU_B = math.sqrt(2.0 / math.pi)           # tanh GELU: tanh(x * (C * x * x + B)), onnxruntime's
GELU_C = 0.044715 * GELU_B                  # factoring of sqrt(2/pi) * (x + 0.044715 x**3)
ONE, ZERO = lift(1.0), lift(0.0)            # booleans and comparison results: 1.0 / 0.0


def _hard_sigmoid(x, alpha, beta):
    """max(0, min(1, alpha * x + beta)) in onnxruntime's order."""
    return maximum(minimum(alpha * x + beta, 1.0), 0.0)


def _floor_mod(a, b):
    """a - floor(a / b) * b, exactly: C's fmod r (the sign of a), plus b where r is not 0
    and r and b differ in sign (numpy's and onnxruntime's float mod); a zero has b's sign."""
    r = fmod(a, b)
    # a zero remainder takes the divisor's sign (mod(0, -3) = -0, mod(-0, 3) = +0), as numpy's
    # and onnxruntime's; -|r|, not a literal -0.0, which equals 0.0 as a formula node
    zero = absolute(r)
    return select(nz(r), select(r >= 0.0, select(b >= 0.0, r, r + b), select(b >= 0.0, r + b, r)),
                  select(b >= 0.0, zero, neg(zero)))


OPS: dict[str, OpSpec] = {s.name: s for s in [
    OpSpec("access-tensor", ("name",), sh.access_tensor,
           "A named tensor (input or weight) accessed as ((), dims).", ("<graph input>", "<initializer>"),
           "view"),
    OpSpec("access", ("expr", "int"), sh.access,
           "Re-split an access: the first k dims are iterated, the rest are the item.", ("<layout>",),
           "view"),
    OpSpec("access-transpose", ("expr", "list"), sh.access_transpose,
           "Permute all dims; the split stays at the same position.", ("Transpose",), "copy"),
    OpSpec("access-cartesian-product", ("expr", "expr"), sh.access_cartesian_product,
           "Every pair of items of a and b: ((ia ++ ib), (2, item)).", ("Conv", "Gemm", "MatMul"), "view"),
    OpSpec("access-windows", ("expr", "shape", "shape"), sh.access_windows,
           "Sliding windows (window shape, strides) over the item dims.", ("Conv", "MaxPool", "AveragePool"),
           "view"),
    OpSpec("access-dilated-windows", ("expr", "shape", "shape", "shape"), sh.access_dilated_windows,
           "access-windows with dilations (window elements spaced apart).", ("Conv",), "view"),
    OpSpec("access-squeeze", ("expr", "int"), sh.access_squeeze,
           "Remove a dim of size 1.", ("Squeeze", "Conv"), "view"),
    OpSpec("access-insert-axis", ("expr", "int"), sh.access_insert_axis,
           "Insert a dim of size 1.", ("Unsqueeze", "MatMul"), "view"),
    OpSpec("access-flatten", ("expr",), sh.access_flatten,
           "Flatten the iterated dims to one and the item dims to one.",
           "produced by rules (im2col); the importer uses access-reshape", "view"),
    OpSpec("access-reshape", ("expr", "access-shape"), sh.access_reshape,
           "Reinterpret the elements (row-major) with a new access shape.",
           ("Reshape", "Flatten", "GlobalAveragePool"), "view"),
    OpSpec("access-slice", ("expr", "int", "int", "int"), sh.access_slice,
           "Keep [low, high) of one axis.", ("Slice", "Split", "Gather"), "view"),
    OpSpec("access-concatenate", ("expr", "expr", "int"), sh.access_concatenate,
           "Join two accesses along an axis.", ("Concat", "Gather"), "copy"),
    OpSpec("access-gather", ("expr", "expr", "int"), sh.access_gather,
           "Gather along one axis by data-dependent indices, as ONNX Gather: `access-gather "
           "data indices k` with data dims D and indices dims I has dims D[:k] ++ I ++ D[k+1:], "
           "all iterated; out[.., i.., ..] = data[.., idx[i..], ..]. An index is a float32-carried "
           "integer; a negative one counts from the end (idx + D[k]), and one outside [0, D[k]) "
           "is clamped into it on every backend (ONNX leaves it an error).",
           ("Gather", "GatherElements", "GatherND", "Pad"), "copy"),
    OpSpec("access-pad", ("expr", "pad-type", "int", "int", "int"), sh.access_pad,
           "Pad one axis (zero-padding, or min-padding = -inf for max pooling).", ("Conv", "MaxPool", "Pad"),
           "copy"),
    OpSpec("access-pair", ("expr", "expr"), sh.access_pair,
           "Pair two equal-shaped accesses item by item: item (2, item).", ("Add", "Mul", "Sub", "Div", "Pow"),
           "view"),
    OpSpec("access-broadcast", ("expr", "access-shape"), sh.access_broadcast,
           "Broadcast dims of size 1 to a target access shape (same rank).", ("Expand", "Add", "Mul"), "view"),
    OpSpec("access-literal", ("float",), sh.access_literal,
           "A scalar constant with shape ((), ()).", ("BatchNormalization", "Constant"), "view"),
    OpSpec("compute", ("compute-op", "expr"), sh.compute,
           "Apply a compute operator to every item.", ("Relu", "Softmax", "Conv"), "compute", ar.compute_flops),
    OpSpec("systolic-array", ("int", "int", "expr", "expr"), sh.systolic_array,
           "Hardware atom: a ((batch),(rows)) times b ((),(rows, cols)) matmul on a systolic array.",
           "hardware atom, produced only by the systolic rules", "atom", ar.systolic_flops),
    OpSpec("opaque", ("name", "exprs", "shape"), sh.opaque,
           "An ONNX node the language does not cover, run by onnxruntime: ((), out dims).",
           ("<any op without a lowering>",), "host"),
    # Fused kernel atoms (produced by apsat/rules/fusion.egg, never by the importer).
    OpSpec("fused-dot-bias", ("expr", "expr", "expr"), sh.fused_dot_bias,
           "Kernel atom: matmul/convolution plus per-output-column bias. For a ((ia), item), "
           "b ((ib), item), bias ((ib), ()): out[i.., j..] = sum over item of "
           "a[i.., item] * b[j.., item] + bias[j..], shape ((ia ++ ib), ()); i.e. "
           "`compute dot-product (access-cartesian-product a b)` plus bias broadcast over ia.",
           "kernel atom, produced only by the fusion rules", "atom", ar.fused_dot_flops),
    OpSpec("fused-dot-bias-act", ("compute-op", "expr", "expr", "expr"), sh.fused_dot_bias_act,
           "Kernel atom: `fused-dot-bias a b bias` followed by an elementwise activation OP "
           "(one of ops.ACTIVATIONS) applied to every element: "
           "out = OP(fused-dot-bias a b bias), shape ((ia ++ ib), ()).",
           "kernel atom, produced only by the fusion rules", "atom", ar.fused_dot_flops),
    OpSpec("attention", ("int", "expr", "expr", "expr"), sh.attention,
           "Kernel atom: scaled dot-product attention, softmax(q.k + bias).v, the scores never "
           "stored. `attention SAFE qk bias v`: qk ((I.., m, n), (2, d)) pairs each query row "
           "with each key (as the importer's batched Q.K^T); bias ((I.., m, n), ()) is added to "
           "the scores (a mask; `(access-literal 0.0)` for none); v ((I.., m, e), (n)) holds the "
           "values, read along n. s = sum_d qk[.., 0, d] * qk[.., 1, d] + bias; p = softmax of s "
           "over n (with SAFE 1 a row whose softmax is NaN, every score -inf, becomes 0, as "
           "exporters' Where(IsNaN(p), 0, p)); out[I.., m, e] = sum_n p[.., n] * v[.., m, e, n], "
           "shape ((I.., m, e), ()).",
           "kernel atom, produced only by the attention rules", "atom", ar.attention_flops),
]}

COMPUTE_OPS: dict[str, ComputeSpec] = {s.name: s for s in [
    ComputeSpec("dot-product", (), "contraction", "Multiply along the first item axis, sum everything.",
                ("Conv", "Gemm", "MatMul"), flops_in=1, axis_needed="item has no axis to pair over",
                evaluate=sem.dot_product),
    ComputeSpec("reduce-sum", (), "reduction", "Sum of the item.", ("ReduceSum", "AveragePool"),
                flops_in=1, evaluate=sem.reduce_sum),
    ComputeSpec("reduce-max", (), "reduction", "Maximum of the item.", ("MaxPool", "ReduceMax"),
                flops_in=1, evaluate=sem.reduce_max),
    ComputeSpec("reduce-mean", (), "reduction", "Mean of the item.",
                ("ReduceMean", "AveragePool", "GlobalAveragePool"), flops_in=1, evaluate=sem.reduce_mean),
    ComputeSpec("relu", (), "map", "max(0, x): NaN stays NaN, relu(-0) = -0 (Max's tie rule).",
                ("Relu",), scalar=maximum(0.0, X), activation=True, onnx_out="Relu"),
    ComputeSpec("negative", (), "map", "-x.", ("Neg",), scalar=neg(X), onnx_out="Neg"),
    ComputeSpec("sqrt", (), "map", "Square root.", ("Sqrt", "BatchNormalization"), scalar=sqrt(X),
                egg="sqrt-op", onnx_out="Sqrt"),   # egglog 13.2 has an f64 primitive `sqrt` already
    ComputeSpec("exp", (), "map", "e**x.", ("Exp",), scalar=exp(X),
                egg="exp-op", onnx_out="Exp"),    # egglog 14 adds an f64 primitive `exp`
    ComputeSpec("erf", (), "map", "Gauss error function.", ("Erf",), scalar=erf(X), onnx_out="Erf"),
    ComputeSpec("tanh", (), "map", "Hyperbolic tangent.", ("Tanh",), scalar=tanh(X), activation=True, onnx_out="Tanh"),
    ComputeSpec("sigmoid", (), "map", "1 / (1 + e**-x).", ("Sigmoid",), scalar=sigmoid(X), activation=True, onnx_out="Sigmoid"),
    ComputeSpec("clip", ("float", "float"), "map", "min(hi, max(lo, x)): NaN stays NaN, -0 stays -0.",
                ("Clip",), scalar=minimum(param(1), maximum(param(0), X)), activation=True, evaluate=sem.clip, onnx_out="Clip +"),
    ComputeSpec("softmax", (), "item", "Softmax over all item dims.", ("Softmax",), flops_out=6,
                evaluate=sem.softmax),
    ComputeSpec("layer-norm", ("float",), "item",
                "(x - mean) / sqrt(var + eps) over all item dims (no scale, no bias).",
                ("LayerNormalization",), flops_out=8, evaluate=sem.layer_norm),
    ComputeSpec("rms-norm", ("float",), "item",
                "x / sqrt(mean(x * x) + eps) over all item dims (RMSNorm; no scale).",
                "produced by the norm-fusion rules from the Pow/ReduceMean/Add/Sqrt/Div/Mul "
                "chain exporters write for T5 and Llama", flops_out=5, evaluate=sem.rms_norm),
    ComputeSpec("lrn", ("int", "float", "float", "float"), "item",
                "ONNX LRN (size, alpha, beta, bias) across the first item axis.", ("LRN",), flops_out=12,
                axis_needed="item needs a channel axis", local=True, first_axis=True, evaluate=sem.lrn),
    ComputeSpec("elementwise-add", (), "nary", "Sum over the leading operand axis.",
                ("Add", "Sum", "BatchNormalization"), scalar=X0 + X1, arity=0, onnx_out="Add", commutative=True, associative=True),
    ComputeSpec("elementwise-mul", (), "nary", "Product over the leading operand axis.",
                ("Mul", "BatchNormalization"), scalar=X0 * X1, arity=0, onnx_out="Mul", commutative=True, associative=True),
    ComputeSpec("elementwise-sub", (), "nary", "item[0] - item[1].", ("Sub",), scalar=X0 - X1, arity=2, onnx_out="Sub"),
    ComputeSpec("elementwise-div", (), "nary", "item[0] / item[1].", ("Div",), scalar=X0 / X1, arity=2, onnx_out="Div"),
    ComputeSpec("elementwise-pow", (), "nary", "item[0] ** item[1].", ("Pow",), scalar=power(X0, X1),
                arity=2, onnx_out="Pow"),
    ComputeSpec("select", (), "nary", "item[1] where item[0] != 0 else item[2].", ("Where",),
                scalar=select(nz(X0), X1, X2), arity=3, onnx_out="Where"),
    ComputeSpec("gelu", (), "map",
                "Exact (erf) GELU, elementwise: x * ((erf(x / sqrt 2) + 1) * 0.5) in float32 (the "
                "same rounding as (x * (erf + 1)) * 0.5, halving being exact, without its overflow "
                "at |x| > 1.7e38); also built by the fusion rules from the Div/Erf/Add/Mul pattern "
                "exporters write.",
                ("Gelu",), scalar=X * ((erf(X / SQRT2) + 1.0) * 0.5), activation=True, onnx_out="Gelu"),
    # ONNX element-wise ops. Booleans are float32 0.0/1.0 and read as nonzero = true;
    # comparisons are NaN-false like onnxruntime's (two >= conditions where one cannot say it).
    ComputeSpec("gelu-tanh", (), "map",
                "tanh GELU: 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3))).", ("Gelu",),
                scalar=0.5 * X * (tanh(X * (GELU_C * X * X + GELU_B)) + 1.0), activation=True, onnx_out="Gelu approximate=tanh"),
    ComputeSpec("silu", (), "map",
                "SiLU (swish): x * sigmoid(x); built by the fusion rules from the Mul(x, Sigmoid(x)) "
                "exporters write (EfficientNet, Llama's MLP).", (), scalar=X * sigmoid(X), activation=True,
                onnx_out="com.microsoft:QuickGelu alpha=1.0"),   # onnxruntime's x * sigmoid(alpha * x)
    ComputeSpec("hard-sigmoid", ("float", "float"), "map", "max(0, min(1, alpha * x + beta)).",
                ("HardSigmoid",), scalar=_hard_sigmoid(X, param(0), param(1)), activation=True, onnx_out="HardSigmoid alpha beta"),
    ComputeSpec("hard-swish", (), "map", "x * hard-sigmoid(x) with alpha 1/6, beta 0.5 (ONNX's).",
                ("HardSwish",), scalar=X * _hard_sigmoid(X, 1.0 / 6.0, 0.5), activation=True, onnx_out="HardSwish"),
    ComputeSpec("elu", ("float",), "map", "x where x >= 0, else alpha * (e**x - 1).", ("Elu",),
                scalar=select(X >= 0.0, X, param(0) * (exp(X) - 1.0)), activation=True, onnx_out="Elu alpha"),
    ComputeSpec("selu", ("float", "float"), "map", "gamma * (max(x, 0) + min(alpha * (e**x - 1), 0)).",
                ("Selu",), scalar=param(1) * (maximum(X, 0.0) + minimum(param(0) * (exp(X) - 1.0), 0.0)),
                activation=True, onnx_out="Selu alpha gamma"),
    ComputeSpec("softplus", (), "map", "log(1 + e**x), without overflow.", ("Softplus",),
                scalar=SOFTPLUS, activation=True, onnx_out="Softplus"),
    ComputeSpec("softsign", (), "map", "x / (1 + |x|), as (1 / (1 + |x|)) * x.", ("Softsign",),
                scalar=recip(1.0 + absolute(X)) * X, activation=True, onnx_out="Softsign"),
    ComputeSpec("mish", (), "map", "x * tanh(softplus(x)).", ("Mish",), scalar=X * tanh(SOFTPLUS),
                activation=True, onnx_out="Mish"),
    # egg=: egglog 13.2 has f64 primitives `abs`, `floor` and `ceil` already
    ComputeSpec("abs", (), "map", "|x|.", ("Abs",), scalar=absolute(X), egg="abs-op", onnx_out="Abs"),
    ComputeSpec("reciprocal", (), "map", "1 / x.", ("Reciprocal",), scalar=recip(X), onnx_out="Reciprocal"),
    ComputeSpec("cast", ("int",), "map", "Round to the element type coded by the parameter (ONNX's: 1 f32, "
                "10 f16, 16 bf16); the result has that type (apsat/lang/dtypes.py).", ("Cast",),
                scalar=call("round", X, param(0)), example=(10,), onnx_out="Cast to"),
    ComputeSpec("floor", (), "map", "Round toward -inf.", ("Floor",), scalar=floor(X), egg="floor-op", onnx_out="Floor"),
    ComputeSpec("ceil", (), "map", "Round toward +inf.", ("Ceil",), scalar=ceil(X), egg="ceil-op", onnx_out="Ceil"),
    ComputeSpec("cos", (), "map", "Cosine.", ("Cos",), scalar=cos(X), onnx_out="Cos"),
    ComputeSpec("sin", (), "map", "Sine.", ("Sin",), scalar=sin(X), onnx_out="Sin"),
    # sign: x >= 0 -> 1 or 0; 0 >= x -> -1; neither (NaN) -> x
    ComputeSpec("sign", (), "map", "-1, 0 or 1 by the sign of x; NaN stays NaN.", ("Sign",),
                scalar=select(X >= 0.0, select(nz(X), ONE, ZERO), select(ZERO >= X, -1.0, X)), onnx_out="Sign"),
    ComputeSpec("logical-not", (), "map", "1 where x == 0, else 0.", ("Not",),
                scalar=select(nz(X), ZERO, ONE), onnx_out="Not"),
    ComputeSpec("nonzero", (), "map", "1 where x != 0 (NaN included), else 0: a Cast to bool.",
                ("Cast",), scalar=select(nz(X), ONE, ZERO)),
    ComputeSpec("is-nan", (), "map", "1 where x is NaN (x >= x fails only for NaN), else 0.",
                ("IsNaN",), scalar=select(X >= X, ZERO, ONE), onnx_out="IsNaN"),
    ComputeSpec("prelu", (), "nary", "item[0] where item[0] >= 0, else item[1] * item[0] (slope).",
                ("PRelu",), scalar=select(X0 >= 0.0, X0, X1 * X0), arity=2, onnx_out="PRelu"),
    ComputeSpec("elementwise-max", (), "nary", "Maximum over the leading operand axis.", ("Max",),
                scalar=maximum(X0, X1), arity=0, onnx_out="Max", commutative=True, associative=True),
    ComputeSpec("elementwise-min", (), "nary", "Minimum over the leading operand axis.", ("Min",),
                scalar=minimum(X0, X1), arity=0, onnx_out="Min", commutative=True, associative=True),
    ComputeSpec("elementwise-mod", (), "nary", "item[0] mod item[1] with item[1]'s sign (Mod fmod=0).",
                ("Mod",), scalar=_floor_mod(X0, X1), arity=2),
    ComputeSpec("elementwise-fmod", (), "nary", "C's fmod: item[0]'s sign (Mod fmod=1).", ("Mod",),
                scalar=fmod(X0, X1), arity=2, onnx_out="Mod fmod=1"),
    ComputeSpec("equal", (), "nary", "1 where item[0] == item[1], else 0.", ("Equal",),
                scalar=select(X0 >= X1, select(X1 >= X0, ONE, ZERO), ZERO), arity=2, onnx_out="Equal", commutative=True),
    # a < b: not a >= b, and b >= a (so NaN is 0); equal: a >= b and b >= a
    ComputeSpec("less", (), "nary", "1 where item[0] < item[1], else 0.", ("Less",),
                scalar=select(X0 >= X1, ZERO, select(X1 >= X0, ONE, ZERO)), arity=2, onnx_out="Less"),
    ComputeSpec("less-equal", (), "nary", "1 where item[0] <= item[1], else 0.", ("LessOrEqual",),
                scalar=select(X1 >= X0, ONE, ZERO), arity=2, onnx_out="LessOrEqual"),
    ComputeSpec("greater", (), "nary", "1 where item[0] > item[1], else 0.", ("Greater",),
                scalar=select(X1 >= X0, ZERO, select(X0 >= X1, ONE, ZERO)), arity=2, onnx_out="Greater"),
    ComputeSpec("greater-equal", (), "nary", "1 where item[0] >= item[1], else 0.", ("GreaterOrEqual",),
                scalar=select(X0 >= X1, ONE, ZERO), arity=2, onnx_out="GreaterOrEqual"),
    ComputeSpec("logical-and", (), "nary", "1 where both are nonzero, else 0.", ("And",),
                scalar=select(nz(X0), select(nz(X1), ONE, ZERO), ZERO), arity=2, onnx_out="And", commutative=True, associative=True),
    ComputeSpec("logical-or", (), "nary", "1 where either is nonzero, else 0.", ("Or",),
                scalar=select(nz(X0), ONE, select(nz(X1), ONE, ZERO)), arity=2, onnx_out="Or", commutative=True, associative=True),
    ComputeSpec("logical-xor", (), "nary", "1 where exactly one is nonzero, else 0.", ("Xor",),
                scalar=select(nz(X0), select(nz(X1), ZERO, ONE), select(nz(X1), ONE, ZERO)), arity=2, onnx_out="Xor", commutative=True, associative=True),
    ComputeSpec("chain", ("compute-op", "compute-op"), "chain",
                "(chain F G): G applied to the result of F, item by item, as one element-wise "
                "kernel: (compute (chain F G) x) = (compute G (compute F x)). F is element-wise "
                "(a pairwise/n-ary operator, a unary map, or a chain: chains nest to the left), "
                "G a unary map (ops.UNARY_MAPS); item shape: G's rule applied to F's.",
                "kernel operator, produced only by the fusion rules", evaluate=sem.chain),
    ComputeSpec("leaky-relu", ("float",), "map", "x where x >= 0, else alpha * x.", ("LeakyRelu",),
                scalar=select(X >= 0.0, X, param(0) * X), activation=True, onnx_out="LeakyRelu alpha"),
    ComputeSpec("log", (), "map", "Natural logarithm.", ("Log", "ReduceLogSumExp", "ReduceLogSum"),
                scalar=call("log", X), egg="log-op", onnx_out="Log"),   # egglog has an f64 primitive `log`
]}

# ---- derived sets: every other module reads these, none types them out again ------------------

def _ops_with(role: str) -> frozenset:
    return frozenset(n for n, s in OPS.items() if s.role == role)


def _operators(test) -> frozenset:
    return frozenset(n for n, s in COMPUTE_OPS.items() if test(s))


VIEW_OPS = _ops_with("view")        # re-index only: no kernel, nothing moved
COPY_OPS = _ops_with("copy")        # layout changes a machine materialises
ATOM_OPS = _ops_with("atom")        # kernel atoms: matrix products (+ bias, activation)
KERNEL_OPS = _ops_with("compute") | ATOM_OPS
HOST_OPS = _ops_with("host")        # run outside the compiled program
# Elementwise unary compute operators a fused kernel may apply as its epilogue.
ACTIVATIONS = _operators(lambda s: s.activation)
# Element-wise operators: unary maps (one value in, one out, item kept), n-ary operators
# over the item's leading operand axis, and chains of them (`chain`, see COMPUTE_OPS).
UNARY_MAPS = _operators(lambda s: s.kind == "map")
NARY_OPS = _operators(lambda s: s.kind == "nary")
ELEMENTWISE_OPS = _operators(lambda s: s.kind in ("map", "nary", "chain"))
# Operators a kernel may compute inline, element by element (ComputeSpec.local).
LOCAL_OPS = _operators(lambda s: s.local)
# Matrix work: dot-product (a machine runs it as a matrix product where it can).
CONTRACTIONS = _operators(lambda s: s.kind == "contraction")
FLOPS_PER_INPUT = {n: s.flops_in for n, s in COMPUTE_OPS.items() if s.flops_in}
FLOPS_PER_OUTPUT = {n: s.flops_out for n, s in COMPUTE_OPS.items() if s.flops_out}
# Registry names egglog cannot take as constructor names: the language's constructor is
# renamed (ComputeSpec.egg), the surface syntax is not.
EGG_NAMES = {n: s.egg for n, s in COMPUTE_OPS.items() if s.egg != n}
PAD_TYPES = ("zero-padding", "min-padding")


def chain_parts(op) -> tuple:
    """The operators a compute operator term applies, in order: (F0, G1, G2, ...) for a
    left-nested chain, (op,) for any other operator."""
    parts = []
    while op.op == "chain":
        parts.append(op.args[1])
        op = op.args[0]
    return (op,) + tuple(reversed(parts))


def is_elementwise_op(op) -> bool:
    """True for an element-wise operator term: a unary map, an n-ary operator, or a chain
    whose first part is one and whose other parts are unary maps."""
    first, *rest = chain_parts(op)
    return first.op in UNARY_MAPS | NARY_OPS and all(g.op in UNARY_MAPS for g in rest)


ATTRIBUTE_OPS.update(COMPUTE_OPS, PAD_TYPES, ["access-shape"])
