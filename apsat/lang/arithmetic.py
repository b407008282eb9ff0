"""Arithmetic of the language's nodes, target-neutral: what the registry's `flops` fields
mean (apsat/lang/ops.py). The cost models (apsat/extract) and the backends' figures read
these, so an op's arithmetic is stated once.

A compute operator declares a figure per input element (contractions, reductions, n-ary
operators: one step per operand element) or per output element (maps, normalisations);
a chain is the sum of its parts. An Expr op's `flops(operator, out_shape, arg_shapes)` is
one of the functions below.
"""
from __future__ import annotations

import math


def elements(shape) -> int:
    """Number of elements of an access shape ((iterated), (item))."""
    return math.prod(shape[0]) * math.prod(shape[1])


def operator_flops(op, inputs: float, outputs: float) -> float:
    """Arithmetic of compute operator term `op` over `inputs` input and `outputs` output
    elements. A chain is the sum of its parts: F over the inputs, then each unary map over
    the outputs (F's result has the chain's output size: the maps keep it)."""
    from apsat.lang.ops import COMPUTE_OPS   # here, not at the top: the registry imports us

    if op.op == "chain":
        f, g = op.args
        return operator_flops(f, inputs, outputs) + operator_flops(g, outputs, outputs)
    spec = COMPUTE_OPS[op.op]
    if spec.flops_in:
        return float(spec.flops_in * inputs)
    return float(spec.flops_out * outputs)


def compute_flops(operator, out, args) -> float:
    """`compute OP x`: the operator over x's elements."""
    return operator_flops(operator, elements(args[0]), elements(out))


def fused_dot_flops(operator, out, args) -> float:
    """The fused atoms: a multiply and an add per item element and output, the bias add,
    and the activation's arithmetic (when `operator` is one) per output."""
    item = math.prod(args[0][1])
    act = int(operator_flops(operator, 1, 1)) if operator is not None else 0
    return float(elements(out) * (2 * item + 1 + act))


def systolic_flops(operator, out, args) -> float:
    """`systolic-array rows cols a b`: a ((batch), (rows)) by ((), (rows, cols)) product."""
    (batch, _), (_, (rows, cols)) = args[0], args[1]
    return 2.0 * math.prod(batch) * rows * cols


def attention_flops(operator, out, args) -> float:
    """`attention`: the scores (a multiply and an add per d, the bias add), the softmax
    (max, exp, sum, scale: 4 per score) and p.v (a multiply and an add per n) per output."""
    (iq, (_, d)), _, (iv, (n,)) = args
    scores = math.prod(iq)
    return float(scores * (2 * d + 1 + 4) + elements(out) * 2 * n)
