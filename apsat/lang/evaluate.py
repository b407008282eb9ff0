"""Reference interpreter: numpy ground truth for every construct of the language.

    evaluate(program, tensors) -> np.ndarray            (program with one output)
    evaluate(program, tensors) -> {name: np.ndarray}    (several outputs)

`tensors` maps every tensor name the program reads to an array of exactly the shape in
`program.tensor_shapes`; results are fresh float32 arrays of shape iterated ++ item dims
of each output's access shape. Problems raise `EvaluationError` (an ApsatError and a
ValueError) naming the tensor, op or opaque call.

Values: see apsat.lang.semantics. Access ops return numpy views wherever numpy
can (windows, transposes, slices, broadcasts), `access-cartesian-product` and `access-pair`
return lazy values, and a cartesian product consumed by `compute dot-product` becomes a
matmul, so VGG19's first convolution written literally (~3.7e9 elements) costs its
im2col matrix only. Terms are walked children-first with `program.terms()` (no recursion)
and a value is dropped once its last consumer has run.

Tables checked against the op registry by tests: `EVALUATORS[op](ev, term, vals)` for
every ops.OPS name (`vals`: the values of term.children(), in order); `COMPUTE_EVALUATORS`
is the registry's own (each ComputeSpec's `evaluate`, apsat/lang/semantics.py).
"""
from __future__ import annotations

from collections import Counter

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from apsat.lang.dtypes import F32, round_to
from apsat.lang.ops import COMPUTE_OPS, OPS
from apsat.lang.program import Program
from apsat.lang.semantics import (EvaluationError, LazyCartesian, LazyPair, apply_compute,
                                  contract, dense, gather_indices, lazy_ok)
from apsat.lang.opaque_eval import evaluate_opaque as _opaque
from apsat.lang.term import Term

__all__ = ["evaluate", "EVALUATORS", "COMPUTE_EVALUATORS", "EvaluationError"]

COMPUTE_EVALUATORS = {name: spec.evaluate for name, spec in COMPUTE_OPS.items()}


class _Evaluation:
    """State of one evaluate() call: the program, the caller's tensors, and which terms
    may keep an integer dtype (those consumed only by opaque calls)."""

    def __init__(self, program: Program, tensors: dict, opaque_only: set[Term]):
        self.program, self.tensors, self.opaque_only = program, tensors, opaque_only

    def n_iter(self, term: Term) -> int:
        """Number of iterated dims of a term's access shape."""
        return len(self.program.shape_of(term)[0])

    def dims(self, term: Term) -> tuple[int, ...]:
        """All dims (iterated ++ item) of a term's access shape."""
        it, item = self.program.shape_of(term)
        return it + item


# ---- access ops -----------------------------------------------------------------------------

def _access_tensor(ev, term, vals):
    """The named tensor, checked against the program's shape; float32 unless an integer or
    bool tensor feeds opaque calls only (casting int64 indices to float32 could round)."""
    name = term.args[0]
    if name not in ev.tensors:
        raise EvaluationError(f"access-tensor: no value given for tensor {name!r} "
                              f"(expected shape {ev.program.tensor_shapes[name]})")
    x = np.asarray(ev.tensors[name])
    want = ev.program.tensor_shapes[name]
    if x.shape != want:
        raise EvaluationError(f"access-tensor: tensor {name!r} has shape {x.shape}, "
                              f"the program expects {want}")
    keep = term in ev.opaque_only and (x.dtype.kind in "biu")
    return x if keep or x.dtype == np.float32 else x.astype(np.float32)


@lazy_ok
def _access(ev, term, vals):
    """Same array, new split; a lazy value passes through when the split is unchanged."""
    (x,) = vals
    if not isinstance(x, np.ndarray) and term.args[1] == ev.n_iter(term.args[0]):
        return x
    return dense(x)


def _transpose(ev, term, vals):
    return vals[0].transpose(term.args[1])


def _windows_view(x, n_iter, window, strides, dilations):
    """out[i.., o.., w..] = x[i.., o*s + w*d] over the item axes: a view, never a copy."""
    spans = tuple((w - 1) * d + 1 for w, d in zip(window, dilations))
    view = sliding_window_view(x, spans, axis=tuple(range(n_iter, x.ndim)))
    step = (slice(None),) * n_iter + tuple(slice(None, None, s) for s in strides) \
        + tuple(slice(None, None, d) for d in dilations)
    return view[step]


def _windows(ev, term, vals):
    _, window, strides = term.args
    return _windows_view(vals[0], ev.n_iter(term.args[0]), window, strides, (1,) * len(window))


def _dilated_windows(ev, term, vals):
    _, window, strides, dilations = term.args
    return _windows_view(vals[0], ev.n_iter(term.args[0]), window, strides, dilations)


@lazy_ok
def _cartesian(ev, term, vals):
    """Lazy: built only by a consumer other than dot-product (within the size limit)."""
    a, b = (dense(v) for v in vals)
    return LazyCartesian(a, b, ev.n_iter(term.args[0]), ev.n_iter(term.args[1]))


@lazy_ok
def _pair(ev, term, vals):
    """Lazy: dot-product and elementwise ops read the two operands directly."""
    a, b = (dense(v) for v in vals)
    return LazyPair(a, b, ev.n_iter(term.args[0]))


def _squeeze(ev, term, vals):
    return np.squeeze(vals[0], axis=term.args[1])


def _insert_axis(ev, term, vals):
    return np.expand_dims(vals[0], axis=term.args[1])


def _flatten(ev, term, vals):
    it, item = ev.program.shape_of(term)
    return vals[0].reshape(it + item)


def _reshape(ev, term, vals):
    """Row-major reinterpretation with the target access shape's dims."""
    return vals[0].reshape(ev.dims(term))


def _slice(ev, term, vals):
    _, axis, lo, hi = term.args
    return vals[0][(slice(None),) * axis + (slice(lo, hi),)]


def _concatenate(ev, term, vals):
    return np.concatenate(vals, axis=term.args[2])


def _gather(ev, term, vals):
    data, index = vals
    axis = term.args[2]
    return np.take(data, gather_indices(index, data.shape[axis]), axis=axis)


def _pad(ev, term, vals):
    """zero-padding pads 0; min-padding pads -inf (the identity of max pooling)."""
    _, pad_type, axis, before, after = term.args
    x = vals[0]
    width = [(0, 0)] * x.ndim
    width[axis] = (before, after)
    fill = 0.0 if pad_type.op == "zero-padding" else -np.inf
    return np.pad(x, width, mode="constant", constant_values=np.asarray(fill, x.dtype))


def _broadcast(ev, term, vals):
    """A read-only view with the size-1 dims repeated (no copy)."""
    return np.broadcast_to(vals[0], ev.dims(term))


def _literal(ev, term, vals):
    return np.asarray(term.args[0], dtype=np.float32)


@lazy_ok
def _compute(ev, term, vals):
    op = term.args[0]
    return apply_compute(op.op, op.args, vals[0], ev.n_iter(term.args[1]))


def _systolic(ev, term, vals):
    """a ((batch), (rows)) @ b ((), (rows, cols)) -> ((batch), (cols)), float32 matmul."""
    a, b = vals
    return np.matmul(a, b)


def _fused_dot_bias(ev, term, vals):
    """dot-product of the cartesian product of a and b (a matmul, never built) plus the
    bias ((ib), ()) broadcast over a's iterated dims: out[i.., j..] = a.b + bias[j..]."""
    a, b, bias = vals[-3:]
    out = contract(*LazyCartesian(a, b, ev.n_iter(term.args[-3]), ev.n_iter(term.args[-2])).operands(),
                   ev.n_iter(term.args[-3]) + ev.n_iter(term.args[-2]))
    return out + bias


def _fused_dot_bias_act(ev, term, vals):
    """fused-dot-bias, then the elementwise activation (the compute operator's semantics)."""
    op = term.args[0]
    y = _fused_dot_bias(ev, term, vals)
    return apply_compute(op.op, op.args, y, y.ndim)


@lazy_ok
def _attention(ev, term, vals):
    """softmax(qk's products + bias) . v over n, in float32 (the registry entry's doc)."""
    safe = term.args[0]
    qk, bias, v = vals
    n_iter = ev.n_iter(term.args[1])
    s = apply_compute("dot-product", (), qk, n_iter) + dense(bias)
    p = apply_compute("softmax", (), s, n_iter - 1)
    if safe:
        p = np.where(np.isnan(p), np.float32(0.0), p)
    return np.einsum("...n,...en->...e", p, dense(v), dtype=np.float32)


# ---- opaque calls (onnxruntime) -------------------------------------------------------------

EVALUATORS: dict = {
    "access-tensor": _access_tensor,
    "access": _access,
    "access-transpose": _transpose,
    "access-cartesian-product": _cartesian,
    "access-windows": _windows,
    "access-dilated-windows": _dilated_windows,
    "access-squeeze": _squeeze,
    "access-insert-axis": _insert_axis,
    "access-flatten": _flatten,
    "access-reshape": _reshape,
    "access-slice": _slice,
    "access-concatenate": _concatenate,
    "access-gather": _gather,
    "access-pad": _pad,
    "access-pair": _pair,
    "access-broadcast": _broadcast,
    "access-literal": _literal,
    "compute": _compute,
    "systolic-array": _systolic,
    "opaque": _opaque,
    "fused-dot-bias": _fused_dot_bias,
    "fused-dot-bias-act": _fused_dot_bias_act,
    "attention": _attention,
}


# ---- the walk -------------------------------------------------------------------------------

def _consumers(program: Program, order: list[Term]) -> tuple[Counter, set[Term]]:
    """Uses of each term (one per child slot, one per output) and the terms whose every
    consumer is an opaque call (they may keep an integer dtype)."""
    uses: Counter = Counter()
    non_opaque: set[int] = set()
    for term in order:
        for child in term.children():
            uses[child] += 1
            if term.op != "opaque":
                non_opaque.add(id(child))
    for out in program.outputs.values():
        uses[out] += 1
        non_opaque.add(id(out))
    return uses, {t for t in order if uses[t] and id(t) not in non_opaque}


def evaluate(program: Program, tensors: dict, copy: bool = True):
    """Evaluate `program` on `tensors` (name -> array for every tensor it reads).

    Returns one float32 array (iterated ++ item dims) when the program has one output,
    else a dict output name -> array. Results never alias the caller's tensors; with
    `copy=False` they may be read-only views of them (a broadcast stays a stride-0 view,
    for a caller that only reads them).
    Intermediate values are freed after their last consumer, so peak memory is the live
    frontier of the DAG, not the sum of all values."""
    order = program.terms()
    uses, opaque_only = _consumers(program, order)
    ev = _Evaluation(program, tensors, opaque_only)
    rounded = _rounded_terms(program, order)
    values: dict[Term, object] = {}
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):   # inf and NaN results are values
        for term in order:
            children = list(term.children())
            fn = EVALUATORS[term.op]
            vals = [values[c] for c in children]
            if not getattr(fn, "lazy_ok", False):
                vals = [dense(v) for v in vals]
            values[term] = fn(ev, term, vals)
            if term in rounded:
                values[term] = round_to(dense(values[term]), rounded[term])
            del vals
            for child in children:
                uses[child] -= 1
                if uses[child] == 0:
                    del values[child]
    results = {name: _result(values[t], program.shape_of(t), copy) for name, t in program.outputs.items()}
    return next(iter(results.values())) if len(results) == 1 else results


def _rounded_terms(program: Program, order) -> dict[Term, str]:
    """The terms whose values are rounded to a half type, and the type: the tensors (an
    f16 tensor holds f16 values, whatever array the caller gives) and the nodes that
    compute (apsat/lang/dtypes.py: computed in float32, rounded once). Views and copies
    move values already rounded; f32 programs round nothing."""
    if not program.tensor_types and not any(t.op == "compute" and t.args[0].op == "cast" for t in order):
        return {}
    computing = {name for name, spec in OPS.items() if spec.role in ("compute", "atom")} | {"access-tensor"}
    return {t: program.dtype_of(t) for t in order
            if t.op in computing and program.dtype_of(t) not in (None, F32)}


def _result(value, shape, copy: bool = True) -> np.ndarray:
    """A float32 array of the access shape's dims: fresh (never a view of an input)
    unless `copy` is False."""
    arr = np.array(dense(value), dtype=np.float32, copy=True) if copy else np.asarray(dense(value), np.float32)
    dims = tuple(shape[0]) + tuple(shape[1])
    if arr.shape != dims:       # an interpreter bug, not a user error: say so loudly
        raise AssertionError(f"reference: value shape {arr.shape} != access shape {dims}")
    return arr

