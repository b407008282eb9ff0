"""Constants as terms: which constants the importer writes as literals.

Rules match a constant by its value, `(access-literal V)`, laid against a tensor as
`(access-broadcast (access-reshape (access-literal V) ONES) DIMS)`. So a constant that
holds one value is that literal whatever its source (an initializer, a Constant node, a
value folded at import such as sqrt(2/pi) or a ConstantOfShape fill):

- one element (a scalar, a [1, 1] initializer): a literal wherever it is read, as before;
- more elements, all equal (a [768] or [1, 1, 768] tensor of 0.5, what some exporters
  write instead of a scalar): a literal where element-wise arithmetic reads it as a value
  (VALUE_INPUTS), broadcast to the constant's own dims, so the operation's output keeps
  the dims it had (a constant larger than the other operand still sets them); the
  builder's `expand` then broadcasts the literal itself to the output, which is the form a
  scalar gets. Elsewhere (a Reshape's shape, a Gather's indices, a Conv's or MatMul's
  weight, an Identity) the tensor stays what it was: a named weight, or a constant the
  lowering reads as numbers.

Special values (docs/special-values.md) stay weights: NaN and ±inf (a literal is finite),
and -0.0, because terms and egglog compare literals by value: a -0.0 literal is the same
node as 0.0, and x + (-0.0), which is x, would become x + 0.0, which is +0 where x is -0.
A tensor mixing 0.0 and -0.0 holds two values.

A tensor of more than one zero stays a weight too: it is how a freshly initialised layer
writes its bias (every transformers Linear), and the fusion rules take a bias as a
per-channel tensor (fusion.egg's channel vector), not as a literal. As a literal 0, a
MatMul + bias + GELU no longer became one fused atom on the systolic target (the real
zoo's convnext: modelled cost 41168 -> 46822; bert 3932 -> 4098). No rule matches a zero
by value where such a tensor stands; a zero of one element is a literal, as before.
"""
from __future__ import annotations

import math

import numpy as np

from apsat.lang.term import Term

# ONNX op -> the inputs it reads as element-wise values (None: all of them). Where's
# condition is a mask, not a value; PRelu's slope is a factor like Mul's.
VALUE_INPUTS: dict[str, tuple[int, ...] | None] = {
    "Add": None, "Sub": None, "Mul": None, "Div": None, "Pow": None, "Mod": None,
    "Sum": None, "Mean": None, "Max": None, "Min": None, "PRelu": (1,), "Where": (1, 2)}
SAMPLES = 8              # elements compared before the scan: a random weight fails here
CHUNK = 1 << 20          # elements compared at a time: the scan's temporary stays small
MAX_STRIDED = 1 << 24    # a non-contiguous constant larger than this is not scanned (below)


def reads_value(node, name: str) -> bool:
    """Whether ONNX `node` (the one being lowered; None outside a lowering) reads input
    `name` as an element-wise value."""
    if node is None or node.domain not in ("", "ai.onnx") or node.op_type not in VALUE_INPUTS:
        return False
    positions = VALUE_INPUTS[node.op_type]
    return any(n == name and (positions is None or k in positions) for k, n in enumerate(node.input))


def literal_value(value: float) -> bool:
    """Whether a literal may stand for `value`: finite, and not -0.0 (see the module)."""
    return math.isfinite(value) and not (value == 0.0 and math.copysign(1.0, value) < 0)


def repeated_value(arr) -> float | None:
    """The one value every element of `arr` holds, when a literal may stand for it; None
    otherwise. Never copies `arr` (a memory-mapped weight stays on disk until read): axes
    of stride 0 (a ConstantOfShape fill, a broadcast view) are read once; SAMPLES elements
    spread over the tensor are compared first, which ends the check on any weight that
    varies; then contiguous data is compared CHUNK elements at a time. A non-contiguous
    constant (a folded Slice or Transpose view of a weight) over MAX_STRIDED elements is
    not scanned: comparing it takes a temporary of its size, and such a view is not the
    repeated scalar an exporter writes."""
    a = np.asarray(arr)
    if a.dtype.kind not in "fiub" or a.size == 0:
        return None
    a = a[tuple(slice(0, 1) if s == 0 else slice(None) for s in a.strides)]
    first = a[(0,) * a.ndim]
    value = float(first)
    if not literal_value(value):
        return None
    if a.size == 1:
        return value
    signed_zero = value == 0.0 and a.dtype.kind == "f"       # +0.0 only: -0.0 is another value
    if np.any(a.flat[np.linspace(0, a.size - 1, SAMPLES).astype(np.int64)] != first):
        return None
    if a.flags.c_contiguous:
        flat = a.reshape(-1)
        blocks = (flat[lo:lo + CHUNK] for lo in range(0, flat.size, CHUNK))
    elif a.size <= MAX_STRIDED:
        blocks = iter([a])
    else:
        return None
    for block in blocks:
        if not np.all(block == first) or (signed_zero and np.signbit(block).any()):
            return None
    return value


class ConstantTerms:
    """The terms of one importer's constants: literals (above) or named weights, each made
    once per constant and form."""

    def __init__(self, importer):
        self.imp = importer
        self._terms: dict[str, Term] = {}         # name -> literal of one element, or weight
        self._values: dict[str, Term | None] = {}  # name -> literal over its dims, None: not one value

    def term(self, name: str, value) -> Term:
        """Constant `name` (holding `value`) as the node being lowered reads it."""
        imp = self.imp
        if reads_value(imp.lowering, name):
            if name not in self._values:
                arr = np.asarray(value)
                v = repeated_value(arr)
                zeros = v == 0.0 and arr.size > 1        # a bias: the fusion rules want the tensor (above)
                self._values[name] = None if v is None or zeros else literal(imp.b, v, arr.shape)
            if self._values[name] is not None:
                return self._values[name]
        if name not in self._terms:
            arr = np.asarray(value)
            v = float(arr.reshape(-1)[0]) if arr.size == 1 and arr.dtype.kind in "fiub" else None
            if v is not None and literal_value(v):
                self._terms[name] = literal(imp.b, v, arr.shape)
            else:
                t = self._terms[name] = imp.add_weight(name, arr, typed=True)
                imp.symbolic.weight_made(name, t.args[0])
        return self._terms[name]


def literal(b, value: float, dims) -> Term:
    """`value` as a term of `dims`: the literal reshaped to as many 1s, broadcast to dims."""
    t = b.literal(value)
    if not dims:
        return t
    return b.broadcast(b.reshape(t, (1,) * len(dims)), dims)
