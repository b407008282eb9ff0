"""Special values through every backend: NaN, +-inf, +-0, subnormals and each operator's
thresholds, against onnxruntime on the original ONNX model.

The cases are generated from the registry: every element-wise operator (ops.UNARY_MAPS and
ops.NARY_OPS) has an ONNX form below, and a test fails when an operator has none. They run
as four models (the unary maps on one input; the binary operators on every pair of special
values; Mod, which onnxruntime takes on floats only from opset 28; every activation fused
into a matrix product), each through:

  reference   the imported program under the reference interpreter
  optimised   the gpu target's extracted program under the reference interpreter
  triton      the gpu target's Triton kernels (the interpreter on a CPU)
  systolic    the systolic:32x32 instruction stream on the simulator
  export      the gpu target's program exported as ONNX, run by onnxruntime

and the CUDA C kernels' scalar code (cannot run without a GPU) is compiled as host C++ with
g++ and run on the same values.

Equality (`assert_same_values`): NaN at exactly the positions onnxruntime has NaN; infinities
equal; where both results are zero, the same sign; every other value within rtol 1e-5 and
atol 1e-6 (onnxruntime's transcendental functions differ from numpy's, libm's and
Triton's by an ulp or two; tanh and sigmoid flush results below ~1e-38 differently).
Through a matrix product -0 becomes +0 on every side (the accumulator starts at +0).
"""
from __future__ import annotations

import ctypes
import shutil
import subprocess

import models
import numpy as np
import pytest
from onnx import TensorProto, helper

import apsat
from apsat.lang.evaluate import evaluate
from apsat.lang.ops import ACTIVATIONS, NARY_OPS, UNARY_MAPS
from apsat.pipeline.zoo import ort_run

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
RTOL, ATOL = 1e-5, 1e-6
F32 = np.finfo(np.float32)
# NaN, infinities, signed zeros, subnormals, the extremes, and thresholds: clip's 0 and 6,
# hard-sigmoid's +-2.5, hard-swish's +-3, ties at +-0.5 for floor/ceil, exp's overflow
# either side of 88.7, softplus's large arguments, 1 and -1 for pow's edges.
SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 1e-40, -1e-40,
                    F32.max, -F32.max, F32.tiny, 1.0, -1.0, 0.5, -0.5, 2.5, -2.5, 3.0, -3.0,
                    6.0, 7.0, 88.0, 89.0, -88.0, -104.0, 100.0, -100.0, 1e-3, 2.0],
                   np.float32)
# operands of the binary operators: every pair of these
PAIRED = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 1.0, -1.0, 0.5, -2.0,
                   3.0, 2.5, F32.max], np.float32)


def _node(op, ins, out, **attrs):
    return helper.make_node(op, ins, [out], **attrs)


def _to_float(op, ins, out, **attrs):
    """`op` (boolean out), Cast to FLOAT."""
    return [_node(op, ins, out + "_b", **attrs), _node("Cast", [out + "_b"], out, to=TensorProto.FLOAT)]


def _bools(ins, tag):
    """Each input Cast to BOOL (nonzero, NaN included)."""
    return [_node("Cast", [x], f"{x}_{tag}_b", to=TensorProto.BOOL) for x in ins], [f"{x}_{tag}_b" for x in ins]


def _logic(op, ins, out):
    casts, names = _bools(ins, out)
    return casts + _to_float(op, names, out)


# operator -> nodes computing it on inputs `ins` into `out` (opset 20)
UNARY = {
    "relu": lambda i, o: [_node("Relu", i, o)],
    # a cast to float16 and back: rounding, overflow to +-inf, NaN and -0 kept
    "cast": lambda i, o: [_node("Cast", i, o + "_h", to=10), _node("Cast", [o + "_h"], o, to=1)],
    "negative": lambda i, o: [_node("Neg", i, o)],
    "sqrt": lambda i, o: [_node("Sqrt", i, o)],
    "exp": lambda i, o: [_node("Exp", i, o)],
    "erf": lambda i, o: [_node("Erf", i, o)],
    "tanh": lambda i, o: [_node("Tanh", i, o)],
    "sigmoid": lambda i, o: [_node("Sigmoid", i, o)],
    "clip": lambda i, o: [_node("Clip", i + ["zero", "six"], o)],
    "gelu": lambda i, o: [_node("Gelu", i, o)],
    "gelu-tanh": lambda i, o: [_node("Gelu", i, o, approximate="tanh")],
    "silu": lambda i, o: [_node("Sigmoid", i, o + "_s"), _node("Mul", [i[0], o + "_s"], o)],
    "hard-sigmoid": lambda i, o: [_node("HardSigmoid", i, o)],
    "hard-swish": lambda i, o: [_node("HardSwish", i, o)],
    "elu": lambda i, o: [_node("Elu", i, o)],
    "selu": lambda i, o: [_node("Selu", i, o)],
    "softplus": lambda i, o: [_node("Softplus", i, o)],
    "softsign": lambda i, o: [_node("Softsign", i, o)],
    "mish": lambda i, o: [_node("Mish", i, o)],
    "abs": lambda i, o: [_node("Abs", i, o)],
    "reciprocal": lambda i, o: [_node("Reciprocal", i, o)],
    "floor": lambda i, o: [_node("Floor", i, o)],
    "ceil": lambda i, o: [_node("Ceil", i, o)],
    "cos": lambda i, o: [_node("Cos", i, o)],
    "sin": lambda i, o: [_node("Sin", i, o)],
    "sign": lambda i, o: [_node("Sign", i, o)],
    "logical-not": lambda i, o: _logic("Not", i, o),
    "nonzero": lambda i, o: [_node("Cast", i, o + "_b", to=TensorProto.BOOL),
                             _node("Cast", [o + "_b"], o, to=TensorProto.FLOAT)],
    "is-nan": lambda i, o: _to_float("IsNaN", i, o),
    "leaky-relu": lambda i, o: [_node("LeakyRelu", i, o, alpha=0.1)],
    "log": lambda i, o: [_node("Log", i, o)],
}
BINARY = {
    "elementwise-add": lambda i, o: [_node("Add", i, o)],
    "elementwise-mul": lambda i, o: [_node("Mul", i, o)],
    "elementwise-sub": lambda i, o: [_node("Sub", i, o)],
    "elementwise-div": lambda i, o: [_node("Div", i, o)],
    "elementwise-pow": lambda i, o: [_node("Pow", i, o)],
    "select": lambda i, o: [_node("Cast", [i[0]], o + "_c", to=TensorProto.BOOL),
                            _node("Where", [o + "_c", i[1], i[0]], o)],
    "prelu": lambda i, o: [_node("PRelu", i, o)],
    "elementwise-max": lambda i, o: [_node("Max", i, o)],
    "elementwise-min": lambda i, o: [_node("Min", i, o)],
    "elementwise-fmod": lambda i, o: [_node("Mod", i, o, fmod=1)],
    "equal": lambda i, o: _to_float("Equal", i, o),
    "less": lambda i, o: _to_float("Less", i, o),
    "less-equal": lambda i, o: _to_float("LessOrEqual", i, o),
    "greater": lambda i, o: _to_float("Greater", i, o),
    "greater-equal": lambda i, o: _to_float("GreaterOrEqual", i, o),
    "logical-and": lambda i, o: _logic("And", i, o),
    "logical-or": lambda i, o: _logic("Or", i, o),
    "logical-xor": lambda i, o: _logic("Xor", i, o),
}
# Mod on floats with fmod=0 is ONNX Mod-28's (onnxruntime refuses it before)
BINARY_28 = {"elementwise-mod": lambda i, o: [_node("Mod", i, o)]}
# Scalar literals some forms read, and pow's literal exponents (each a kernel special case)
WEIGHTS = {"zero": np.float32(0.0), "six": np.float32(6.0)}


def _pairs():
    a, b = np.meshgrid(PAIRED, PAIRED, indexing="ij")
    return a.ravel().copy(), b.ravel().copy()


def _group_model(forms: dict, n_inputs: int, size: int, opset: int):
    """One model computing every form on x0 (and x1), output y_<operator> each."""
    ins = [f"x{i}" for i in range(n_inputs)]
    nodes, outs = [], []
    for op, form in forms.items():
        nodes += form(ins, f"y_{op}")
        outs.append(f"y_{op}")
    used = {n for node in nodes for n in node.input}
    weights = {k: v for k, v in WEIGHTS.items() if k in used}
    return models.make_model(nodes, {x: (size,) for x in ins}, outs, weights, opset=opset)


def _pow_literals_model():
    """x ** e for the literal exponents the kernels treat apart (multiplications, sqrt,
    a reciprocal) and two they do not."""
    exps = {"p0": 0.0, "p05": 0.5, "p1": 1.0, "p2": 2.0, "p3": 3.0, "pm1": -1.0, "p15": 1.5, "pm3": -3.0}
    nodes = [_node("Pow", ["x0", f"e_{k}"], f"y_{k}") for k in exps]
    weights = {f"e_{k}": np.float32(v) for k, v in exps.items()}
    return models.make_model(nodes, {"x0": (SPECIAL.size,)}, [f"y_{k}" for k in exps], weights, opset=20)


def _fused_model():
    """For each activation: act(x @ W + b) with x (n, 1) the special values (an input:
    weights may not hold NaN), W = [[1, -1]] and b zeros, so the activation sees +-x
    exactly, as a product's epilogue."""
    nodes, outs, weights = [], [], {}
    for op in sorted(ACTIVATIONS):
        weights[f"w_{op}"] = np.array([[1.0, -1.0]], np.float32)
        weights[f"b_{op}"] = np.zeros(2, np.float32)
        nodes += [_node("MatMul", ["x", f"w_{op}"], f"m_{op}"), _node("Add", [f"m_{op}", f"b_{op}"], f"a_{op}")]
        nodes += UNARY[op]([f"a_{op}"], f"y_{op}")
        outs.append(f"y_{op}")
    weights.update({k: v for k, v in WEIGHTS.items() if any(k in nd.input for nd in nodes)})
    return models.make_model(nodes, {"x": (SPECIAL.size, 1)}, outs, weights, opset=20)


def _groups():
    a, b = _pairs()
    return {
        "unary": (_group_model(UNARY, 1, SPECIAL.size, 20), {"x0": SPECIAL}),
        "binary": (_group_model(BINARY, 2, a.size, 20), {"x0": a, "x1": b}),
        "mod": (_group_model(BINARY_28, 2, a.size, 28), {"x0": a, "x1": b}),
        "pow-literal": (_pow_literals_model(), {"x0": SPECIAL}),
        "fused": (_fused_model(), {"x": SPECIAL.reshape(-1, 1)}),
    }


GROUPS = _groups()


# onnxruntime's CPU Where gives +0 where it selects a -0 from its first input; the ONNX
# definition selects the element itself (-0), which every backend here does
ZERO_SIGN_EXEMPT = ("y_select",)


def assert_same_values(got, want, what: str, zero_sign: bool = True):
    """got equals want as the module doc says: NaN where want has NaN, equal infinities,
    the sign of zeros, else within RTOL/ATOL. The message names the first differences."""
    got = np.asarray(got, np.float32).reshape(np.shape(want))
    want = np.asarray(want, np.float32)
    nan_differs = np.isnan(got) != np.isnan(want)
    inf_differs = (np.isinf(got) | np.isinf(want)) & ~(got == want)
    zeros = (got == 0) & (want == 0)
    sign_differs = zeros & (np.signbit(got) != np.signbit(want)) & zero_sign
    finite = np.isfinite(got) & np.isfinite(want)
    with np.errstate(all="ignore"):
        far = finite & (np.abs(got.astype(np.float64) - want) > ATOL + RTOL * np.abs(want.astype(np.float64)))
    bad = nan_differs | inf_differs | sign_differs | far
    if bad.any():
        idx = np.flatnonzero(bad.reshape(-1))[:6]
        shown = ", ".join(f"[{i}] got {got.reshape(-1)[i]!r} want {want.reshape(-1)[i]!r}" for i in idx)
        raise AssertionError(f"{what}: {int(bad.sum())} of {bad.size} values differ: {shown}")


def test_every_element_wise_operator_has_a_special_value_case():
    """The registry's element-wise operators (chain aside: it is its parts) are all covered,
    and every activation fused into a product."""
    covered = set(UNARY) | set(BINARY) | set(BINARY_28)
    assert (UNARY_MAPS | NARY_OPS) - covered == set(), f"no special-value case: {(UNARY_MAPS | NARY_OPS) - covered}"
    assert ACTIVATIONS <= set(UNARY)


class _Once(dict):
    """A dict whose missing entries `make(self, key)` makes when first read; then kept."""

    def __init__(self, make, **given):
        super().__init__(given)
        self.make = make

    def __missing__(self, key):
        value = self[key] = self.make(self, key)
        return value


MAKE = {"model": lambda r: apsat.load_onnx(r["proto"]), "want": lambda r: ort_run(r["proto"], r["inputs"]),
        "gpu": lambda r: apsat.optimize(r["model"], target="gpu", verify=False),
        "systolic": lambda r: apsat.optimize(r["model"], target="systolic:32x32", verify=False)}


@pytest.fixture(scope="module")
def results():
    """Per group: the imported model, onnxruntime's outputs, and the gpu and systolic
    optimisations, each computed once for the module's tests when one first reads it: a
    worker given only some of them (pytest-xdist splits a module) computes what those read,
    not every group's (the fused model's gpu optimisation alone is 13 s). Tests only read."""
    return _Once(lambda _, name: _Once(lambda r, key: MAKE[key](r), proto=GROUPS[name][0], inputs=GROUPS[name][1]))


def _compute_operators(program) -> set:
    return {t.args[0].op for t in program.terms() if t.op in ("compute", "fused-dot-bias-act")}


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_import_keeps_each_operator(results, group):
    """The models import to the operators they are meant to test (not opaque calls)."""
    r = results[group]
    assert not r["model"].program.opaque_nodes
    forms = {"unary": UNARY, "binary": BINARY, "mod": BINARY_28}.get(group, {})
    assert set(forms) <= _compute_operators(r["model"].program) | {"silu"}


def test_activations_are_fused_into_products(results):
    """Every activation of the fused model is a product's epilogue on the gpu target."""
    terms = [t for t in results["fused"]["gpu"].program.terms() if t.op == "fused-dot-bias-act"]
    assert {t.args[0].op for t in terms} == set(ACTIVATIONS)


def _outputs(got, names):
    return got if isinstance(got, dict) else {names[0]: got}


def _run(backend: str, r: dict) -> dict:
    names = list(r["want"])
    tensors = {**r["model"].weights, **r["inputs"]}
    if backend == "reference":
        return _outputs(evaluate(r["model"].program, tensors), names)
    if backend == "optimised":
        return _outputs(evaluate(r["gpu"].program, tensors), names)
    if backend == "triton":
        pytest.importorskip("torch", reason="the GPU backend needs torch (pip install apsat[gpu])")
        pytest.importorskip("triton", reason="the GPU backend needs triton (pip install apsat[gpu])")
        from apsat.backends.gpu.runner import run_kernels

        got = _outputs(run_kernels(r["gpu"].program, tensors), names)
        return {k: v.numpy() if hasattr(v, "numpy") else np.asarray(v) for k, v in got.items()}
    if backend == "systolic":
        from apsat.backends import systolic

        res = r["systolic"]
        stream = systolic.compile(res.program, "systolic:32x32", weights=res.model.weights)
        return systolic.simulate(stream, tensors)
    if backend == "export":
        return ort_run(r["gpu"].to_onnx(), r["inputs"])
    raise AssertionError(backend)


@pytest.mark.parametrize("backend", ["reference", "optimised", "triton", "systolic", "export"])
@pytest.mark.parametrize("group", sorted(GROUPS))
def test_special_values_equal_onnxruntime(results, group, backend):
    r = results[group]
    got = _run(backend, r)
    failures = []
    for name, want in r["want"].items():
        try:
            assert_same_values(got[name], want, f"{group} {backend} {name}", name not in ZERO_SIGN_EXEMPT)
        except AssertionError as e:
            failures.append(str(e))
    assert not failures, "\n".join(failures)


# ---- the CUDA C kernels' scalar code, compiled for the host ----------------------------------

HOST_PRELUDE = """#include <math.h>
#include <stdint.h>
#include <string.h>
// the CUDA intrinsic the dialect writes infinities and NaN with, and its function qualifiers
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, sizeof f); return f; }
#define __device__
#define __forceinline__ static inline
// cuda_fp16.h and cuda_bf16.h's conversions (a cast), on the host: GCC's _Float16 rounds to
// nearest even; bfloat16 by its bits (round to nearest even, NaN kept)
typedef _Float16 __half;
static inline __half __float2half_rn(float x) { return (__half)x; }
static inline float __half2float(__half h) { return (float)h; }
static inline float __float2bfloat16_rn(float x) {
  uint32_t u; memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return x;
  u += 0x7fffu + ((u >> 16) & 1u); u &= 0xffff0000u; memcpy(&x, &u, 4); return x;
}
static inline float __bfloat162float(float b) { return b; }
"""


def _cuda_scalar(op: str, params: tuple, n_operands: int) -> tuple[list[str], str]:
    """(statements, result text) of the CUDA C dialect for operator `op` on operands
    x0, x1, ...: exactly the text its kernels contain for one element."""
    from apsat.backends.gpu import views
    from apsat.backends.gpu.cuda import CudaDialect
    from apsat.backends.gpu.emit import emit

    xs = [("sym", f"x{i}") for i in range(n_operands)]
    value = views.unary(op, params, xs[0]) if op in UNARY_MAPS else views.nary(op, xs)
    lines, texts = emit(CudaDialect(), {"y": value}, {f"x{i}": f"x{i}" for i in range(n_operands)}, "t")
    return lines, texts["y"]


def _host_library(tmp_path, functions: dict):
    """Compile {name: (n_operands, lines, result)} as one shared library of
    `void name(const float* X0, ..., float* Y, int n)`; returns the loaded library."""
    from apsat.backends.gpu.cuda import DEVICE_FUNCTIONS

    src = [HOST_PRELUDE, DEVICE_FUNCTIONS]
    for name, (n, lines, result) in functions.items():
        args = ", ".join([f"const float* X{i}" for i in range(n)] + ["float* Y", "int n"])
        loads = " ".join(f"const float x{i} = X{i}[i];" for i in range(n))
        body = "\n    ".join(lines)
        src.append(f'extern "C" void {name}({args}) {{\n  for (int i = 0; i < n; ++i) {{\n'
                   f"    {loads}\n    {body}\n    Y[i] = {result};\n  }}\n}}\n")
    path = tmp_path / "scalar.cpp"
    path.write_text("\n".join(src))
    lib = tmp_path / "scalar.so"
    # no fast-math and no contraction: the kernels are compiled with IEEE division and square root
    subprocess.run(["g++", "-O2", "-fno-fast-math", "-ffp-contract=off", "-shared", "-fPIC",
                    str(path), "-o", str(lib)], check=True, capture_output=True, text=True)
    return ctypes.CDLL(str(lib))


def _operator_params(program) -> dict:
    """operator -> its literal parameters as imported (clip's bounds, elu's alpha, ...)."""
    out: dict = {}
    for t in program.terms():      # the first of an operator (the cast to f16, not back)
        if t.op == "compute":
            out.setdefault(t.args[0].op, tuple(t.args[0].args))
    return out


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to compile the CUDA C scalar code for the host")
def test_cuda_c_scalar_code_equals_onnxruntime(results, tmp_path):
    """The CUDA C dialect's text for every element-wise operator, compiled as host C++,
    on the special values, against onnxruntime's outputs of the same models."""
    functions, cases = {}, []
    for group, forms in (("unary", UNARY), ("binary", BINARY), ("mod", BINARY_28)):
        r = results[group]
        params = _operator_params(r["model"].program)
        n = 1 if group == "unary" else 2
        for op in forms:
            if op == "select":         # Where(x0 != 0, x1, x0)
                lines, result = _cuda_scalar(op, (), 3)
                functions["op_select"] = (3, lines, result)
                cases.append(("op_select", group, [r["inputs"]["x0"], r["inputs"]["x1"], r["inputs"]["x0"]]))
                continue
            name = "op_" + op.replace("-", "_")
            lines, result = _cuda_scalar(op, params.get(op, ()), n)
            functions[name] = (n, lines, result)
            cases.append((name, group, [r["inputs"][f"x{i}"] for i in range(n)]))
    lib = _host_library(tmp_path, functions)
    failures = []
    for name, group, operands in cases:
        xs = [np.ascontiguousarray(o, np.float32) for o in operands]
        y = np.empty_like(xs[0])
        ptr = ctypes.POINTER(ctypes.c_float)
        getattr(lib, name)(*[x.ctypes.data_as(ptr) for x in xs], y.ctypes.data_as(ptr), ctypes.c_int(y.size))
        op = name[3:].replace("_", "-")
        try:
            assert_same_values(y, results[group]["want"][f"y_{op}"], f"CUDA C (host) {op}",
                               f"y_{op}" not in ZERO_SIGN_EXEMPT)
        except AssertionError as e:
            failures.append(str(e))
    assert not failures, "\n".join(failures)


# ---- maxima over many elements ------------------------------------------------------------------

def _max_reductions_model():
    """ReduceMax over a long last axis (a row reduction kernel) and a padded 3x3 MaxPool
    (unrolled in its consumer) followed by Softmax over rows (whose stabilising row max is
    the same reduction)."""
    nodes = [_node("ReduceMax", ["x", "axes"], "y_reduce", keepdims=0),
             _node("MaxPool", ["img"], "y_pool", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             _node("Softmax", ["x"], "y_softmax", axis=-1)]
    return models.make_model(nodes, {"x": (6, 300), "img": (1, 2, 6, 7)}, ["y_reduce", "y_pool", "y_softmax"],
                             {"axes": np.array([-1], np.int64)}, opset=18)


def _with_specials(shape, seed):
    """N(0, 1) values with NaN in some rows, +-inf in others, a -0 maximum in one."""
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    flat = x.reshape(shape[0] if len(shape) == 2 else -1, -1) if len(shape) == 2 else x.reshape(-1)
    if len(shape) == 2:
        flat[0, 7] = np.nan
        flat[1, 150] = np.inf
        flat[2, 299] = -np.inf
        flat[3, :] = -np.abs(flat[3, :]) - 1.0
        flat[3, 5] = -0.0
        flat[4, [3, 200]] = [np.nan, np.inf]
    else:
        flat[[3, 40, 60]] = [np.nan, np.inf, -np.inf]
    return x


def test_maxima_propagate_nan_in_every_backend():
    """The reference's maxima over many elements propagate NaN (numpy's maximum, the
    primitive table's max); the Triton reduction and pooling kernels and the systolic
    simulator equal them. onnxruntime is no oracle here: its ReduceMax and MaxPool skip or
    mangle NaN (docs/special-values.md), so the reference is."""
    pytest.importorskip("torch", reason="the GPU backend needs torch (pip install apsat[gpu])")
    from apsat.backends import systolic
    from apsat.backends.gpu.runner import run_kernels

    proto = _max_reductions_model()
    inputs = {"x": _with_specials((6, 300), 1), "img": _with_specials((1, 2, 6, 7), 2)}
    model = apsat.load_onnx(proto)
    tensors = {**model.weights, **inputs}
    want = evaluate(model.program, tensors)
    assert np.isnan(want["y_reduce"][[0, 4]]).all() and want["y_reduce"][1] == np.inf
    gpu = apsat.optimize(model, target="gpu", verify=False)
    got = run_kernels(gpu.program, tensors)
    sys = apsat.optimize(model, target="systolic:32x32", verify=False)
    simulated = systolic.simulate(systolic.compile(sys.program, "systolic:32x32", weights=model.weights), tensors)
    for name, value in want.items():
        assert_same_values(got[name], value, f"triton {name}")
        assert_same_values(simulated[name], value, f"systolic {name}")
