"""Element types of the language's values: one table, and the type analysis.

Every float value of a program has an element type, f32, f16 or bf16. Integers and booleans
(indices, masks, comparison results) and literals are *exact* values: they have no type of
their own, are carried as float32 (integers exactly below 2**24) and take the type of the
values they are combined with, as a literal does. Casts between float types are one map
operator, `(compute (cast T) x)` with T the ONNX element-type code (1 f32, 10 f16, 16 bf16),
whose meaning is rounding to T.

What a type means (the reference interpreter, apsat/lang/evaluate.py, is the definition):
- a compute node's result is computed in float32 from its operands and rounded to its type
  once, as onnxruntime does for a half-precision node: products and reductions accumulate in
  float32 whatever their operands' type (`ACCUMULATOR`);
- views and copies move values and never round;
- an operand of f16 and one of f32 in one node is a type error (`TypeMismatch`, a
  ShapeError), as in ONNX: a model converts with Cast, and a rewrite rule whose two sides
  differ in type is refused by the e-graph's analysis (`has-type`, generated from the
  registry by apsat/lang/egg_gen.py), as one whose sides differ in shape is.

Which operand positions carry the value's type (`typed_args`): every Expr argument, except
the indices of a gather and the bias of an attention atom (`UNTYPED_ARGS`). A compute operator's result keeps its operand's type (`KEEPS`),
takes its parameter's (`cast`), or is exact (`EXACT`: comparisons and logic, 0 or 1).
"""
from __future__ import annotations

import numpy as np

from apsat.errors import ShapeError
from apsat.lang.term import Term

F32, F16, BF16 = "f32", "f16", "bf16"
# ONNX TensorProto element-type codes: the `cast` operator's parameter and the egglog facts
CODES = {F32: 1, F16: 10, BF16: 16}
NAMES = {code: name for name, code in CODES.items()}
BYTES = {F32: 4, F16: 2, BF16: 2}
# what products and reductions of each operand type accumulate in
ACCUMULATOR = {F32: F32, F16: F32, BF16: F32}
# the unit roundoff of each type (half an ulp of 1): the per-rounding relative error
UNIT_ROUNDOFF = {F32: 2.0 ** -24, F16: 2.0 ** -11, BF16: 2.0 ** -8}
# compute operators whose result is exact (0 or 1, or an index), whatever the operands' type
EXACT = frozenset({"equal", "less", "less-equal", "greater", "greater-equal", "logical-and",
                   "logical-or", "logical-xor", "logical-not", "nonzero", "is-nan"})
# compute operators `--precision mixed` keeps in float32 (as torch's autocast does): the
# statistics of softmax and the norms, sums and means (long accumulations), and the maps
# whose relative error grows with their argument (exp, log, pow) or near zero (division)
MIXED_FLOAT32 = frozenset({"softmax", "layer-norm", "rms-norm", "lrn", "reduce-sum", "reduce-mean", "exp",
                           "log", "elementwise-pow", "elementwise-div", "reciprocal", "softplus", "mish"})
# Expr argument positions that do not take the node's type: a gather's indices, and the bias
# an attention atom adds to its float32 scores (a mask of float32's minimum is -inf in f16,
# and a row masked everywhere, uniform in float32, would become NaN)
UNTYPED_ARGS = {"access-gather": (1,), "attention": (2,)}


class TypeMismatch(ShapeError):
    """Operands of two element types meet in one node (a ShapeError: ill-formed program)."""


def code_name(code) -> str:
    """The type name of an ONNX element-type code (ValueError for a code the language lacks)."""
    try:
        return NAMES[int(code)]
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"element type {code!r} is not one the language computes in "
                         f"({', '.join(f'{c} {n}' for n, c in CODES.items())})") from None


def round_to(x, dtype: str | None) -> np.ndarray:
    """float32 values rounded to `dtype` (round to nearest even; overflow to +-inf, NaN kept),
    returned as float32. f32 and None (exact) return x unchanged."""
    if dtype in (None, F32):
        return x
    x = np.asarray(x, dtype=np.float32)
    if dtype == F16:
        with np.errstate(over="ignore"):
            return x.astype(np.float16).astype(np.float32)
    if dtype == BF16:
        import ml_dtypes

        return x.astype(ml_dtypes.bfloat16).astype(np.float32)
    raise ValueError(f"unknown element type {dtype!r}")


def compute_result(op_name: str, params: tuple, operand: str | None) -> str | None:
    """The type of `(compute op x)` for x of type `operand`: a cast's parameter, None for the
    exact operators, else the operand's."""
    if op_name == "cast":
        return code_name(params[0])
    if op_name in EXACT:
        return None
    if op_name == "chain":
        first, second = params
        return compute_result(second.op, second.args, compute_result(first.op, first.args, operand))
    return operand


def typed_args(op: str, signature) -> list[int]:
    """Positions of the Expr arguments of `op` whose elements are of the node's type."""
    skip = UNTYPED_ARGS.get(op, ())
    return [i for i, kind in enumerate(signature) if kind in ("expr", "exprs") and i not in skip]


def infer(terms, tensor_types: dict, signature_of, opaque_type=None) -> dict[Term, str | None]:
    """The element type of every term of `terms` (children before parents): a tensor's from
    `tensor_types` (absent: exact), an opaque call's from `opaque_type(term)`, a compute
    node's by `compute_result`, any other node's its typed operands' (None when all are
    exact). TypeMismatch names the node whose operands disagree."""
    types: dict[Term, str | None] = {}
    for t in terms:
        if t.op == "access-tensor":
            types[t] = tensor_types.get(t.args[0])
            continue
        if t.op == "opaque":
            types[t] = opaque_type(t) if opaque_type else None
            continue
        seen = set()
        for i in typed_args(t.op, signature_of(t.op)):
            arg = t.args[i]
            for child in (arg if isinstance(arg, tuple) else (arg,)):
                if types.get(child) is not None:
                    seen.add(types[child])
        if len(seen) > 1:
            raise TypeMismatch(f"{t.op}: operands of types {' and '.join(sorted(seen))} meet in one node "
                               "(a Cast must convert one of them)")
        operand = seen.pop() if seen else None
        if t.op != "compute":
            types[t] = operand
            continue
        try:
            types[t] = compute_result(t.args[0].op, t.args[0].args, operand)
        except ValueError as e:
            raise TypeMismatch(f"compute {t.args[0].op}: {e}") from None
    return types
