"""What a registry entry declares (apsat/lang/ops.py holds the entries).

An op of sort Expr is an `OpSpec`, a compute operator a `ComputeSpec`. Each declares, once,
everything the layers above need to know about it; the other layers derive their tables
from these fields (tests/test_registry.py checks every backend and cost model against them):

  signature / params   argument kinds: the surface syntax, the terms, the egglog
                       declaration (generated, apsat/lang/egg_gen.py)
  shape / kind         the shape rule: Python's (apsat/lang/shapes.py) and, for compute
                       operators, egglog's classification facts (generated from `kind`)
  role                 what a machine does with an Expr op (ROLES): the workload classes
                       of the cost models and backends
  flops                arithmetic: per node for Expr ops, per element for operators
  scalar               an element-wise operator's per-element formula (apsat/lang/formula.py):
                       its reference semantics, its GPU kernel code, its FLOP figure
  evaluate             reference semantics of an operator (default: read from `scalar`)
  activation, local,   flags the fusion rules and backends read
  first_axis
  onnx                 the ONNX ops the importer lowers into it, or why none does
  onnx_out             the ONNX op the exporter writes for an element-wise operator
                       (apsat/backends/onnx/compute.py); none: its formula, op by op
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from apsat.lang import formula as fm
from apsat.lang.semantics import NUMPY, map_evaluator, nary_evaluator
from apsat.lang.shapes import item_shape

# Roles of Expr ops: what any machine does with one node (apsat/extract/workload.py turns
# them into reads, writes and arithmetic).
ROLES = {
    "view": "re-indexes data: no kernel and nothing moved; its reader reads the data underneath",
    "copy": "a layout change a machine materialises: reads and writes every element",
    "compute": "a kernel applying a compute operator to every item",
    "atom": "a kernel atom: a matrix product (with bias, activation) as one kernel",
    "host": "run outside the compiled program (opaque ONNX nodes)",
}

# Kinds of compute operators: how the item's shape changes and what the operator is.
KINDS = {
    "contraction": "item -> (): multiply along the first item axis, sum everything",
    "reduction": "item -> (): one value from the whole item",
    "map": "item -> item, value by value: a unary element-wise map (`scalar` over X)",
    "nary": "item -> item[1:]: element-wise over the item's leading operand axis (`scalar` "
            "over X0, X1, ..., folded left when `arity` is 0)",
    "item": "item -> item, over the whole item (normalisations)",
    "chain": "element-wise operators composed (its parameters)",
}
PARAM_KINDS = ("int", "float", "compute-op")


@dataclass(frozen=True)
class OpSpec:
    """An op of sort Expr.

    `shape(args, arg_shapes, env)` returns the access shape; `arg_shapes` holds the
    AccessShape of each expr argument (tuples for `exprs`) in order. `role` is one of ROLES.
    `flops(operator, out_shape, arg_shapes)` is the arithmetic of one node, `operator` the
    op's compute-operator argument (None when it has none); None for ops that compute
    nothing. Bytes follow from the role (a view moves nothing; any other node reads its
    operands' data and writes its result). `onnx` names the ONNX ops the importer lowers
    into this op, or says why none does."""

    name: str
    signature: tuple[str, ...]
    shape: Callable
    doc: str
    onnx: tuple[str, ...] | str
    role: str
    flops: Callable | None = None

    def __post_init__(self):
        _require(self.role in ROLES, self.name, f"role {self.role!r} is not one of {sorted(ROLES)}")
        _require((self.flops is not None) == (self.role in ("compute", "atom")), self.name,
                 "kernels (compute, atoms) and only they declare their arithmetic")


@dataclass(frozen=True)
class ComputeSpec:
    """A compute operator, applied to every item.

    params      kinds of its parameters: literals (`float`, `int`) or operators
                (`compute-op`: a compute operator term, as `chain` takes)
    kind        one of KINDS: the item rule and the egglog classification facts
    scalar      map and nary kinds: the per-element formula (apsat/lang/formula.py)
    arity       nary kind: operands per item, 0 for two or more (the formula is folded)
    flops_in, flops_out
                arithmetic per input or per output element; a map's per-output and an
                n-ary operator's per-input figure is its formula's (leave them 0)
    axis_needed why the item must have an axis (the shape error), "" when it need not
    activation  a fused matmul atom may apply it as its epilogue (maps only)
    commutative its two operands may be swapped (binary n-ary kinds, checked on the
                formula): a rule pattern over it matches both operand orders
                (apsat/rules/commute.py)
    associative (a op b) op c == a op (b op c) (commutative operators only, checked on the
                formula): the regroup rules move a scalar constant out of a chain of it
                (apsat/rules/regroup.egg), so a rule matches every grouping of one
    local       each output element depends on the same position of the operand only, or
                on a bounded neighbourhood of it (a kernel may compute it inline);
                maps, n-ary operators and chains are
    first_axis  combines values across the item's first axis only, independently at every
                position of the rest (n-ary operators are)
    evaluate    reference semantics `fn(x, n_iter, params)` (apsat/lang/semantics.py);
                element-wise kinds default to their formula's
    example     parameters valid for it, for tests and examples (default: 0.5 for a float,
                3 for an int); an operator whose int means something (cast's type code) says
    egg         egglog constructor name, where egglog has the name already (sqrt)
    onnx_out    the ONNX op the exporter writes over the operands: `Op`, then per literal
                parameter the attribute it sets (`LeakyRelu alpha`), or `+` for parameters
                passed as constant inputs (`Clip +`), and fixed attributes as `name=value`
                (`Mod fmod=1`); `domain:Op` names a contrib op (`com.microsoft:QuickGelu`);
                empty: the exporter writes the formula op by op"""

    name: str
    params: tuple[str, ...]
    kind: str
    doc: str
    onnx: tuple[str, ...] | str
    scalar: fm.Formula | None = None
    arity: int = 1
    flops_in: int = 0
    flops_out: int = 0
    axis_needed: str = ""
    activation: bool = False
    commutative: bool = False
    associative: bool = False
    local: bool | None = None
    first_axis: bool | None = None
    evaluate: Callable | None = None
    example: tuple = ()
    egg: str = ""
    onnx_out: str = ""

    def __post_init__(self):
        _require(self.kind in KINDS, self.name, f"kind {self.kind!r} is not one of {sorted(KINDS)}")
        _require(set(self.params) <= set(PARAM_KINDS), self.name, f"parameter kinds {self.params}")
        elementwise = self.kind in ("map", "nary", "chain")
        derived = {"egg": self.egg or self.name,
                   "local": elementwise if self.local is None else self.local,
                   "first_axis": self.kind == "nary" if self.first_axis is None else self.first_axis}
        if self.kind in ("map", "nary"):
            derived.update(self._from_formula())
        for key, value in derived.items():
            object.__setattr__(self, key, value)
        _require(not self.activation or self.kind == "map", self.name, "only unary maps are activations")
        _require(not self.commutative or (self.kind == "nary" and self.arity in (0, 2) and _symmetric(self.scalar)),
                 self.name, "is declared commutative, but its formula is not a symmetric binary one")
        _require(not self.associative or (self.commutative and _associative(self.scalar)),
                 self.name, "is declared associative, but it is not commutative or its formula does not regroup")
        figures = bool(self.flops_in) + bool(self.flops_out)
        _require(figures == (self.kind != "chain"), self.name,
                 "needs exactly one arithmetic figure (flops_in or flops_out)")
        _require(self.evaluate is not None, self.name, "has no reference semantics (evaluate)")

    def _from_formula(self) -> dict:
        """The fields a map or n-ary operator derives from its formula (and checks)."""
        f = self.scalar
        _require(f is not None, self.name, f"a {self.kind} declares its per-element formula (scalar)")
        _require(not (self.flops_in or self.flops_out), self.name, "its FLOP figure is its formula's")
        operands = 1 if self.kind == "map" else (self.arity or 2)
        _require(fm.operand_count(f) == operands, self.name, f"the formula reads {fm.operand_count(f)} "
                 f"operands, not {operands}")
        _require(fm.param_count(f) <= len(self.params), self.name, "the formula reads missing parameters")
        out = {"flops_out" if self.kind == "map" else "flops_in": fm.flops(f)}
        if self.evaluate is None:
            out["evaluate"] = map_evaluator(f) if self.kind == "map" else nary_evaluator(f, self.arity == 0)
        return out

    def example_params(self) -> tuple:
        """Parameters valid for this operator (`example`, else 0.5 per float, 3 per int)."""
        return self.example or tuple(0.5 if k == "float" else 3 for k in self.params if k != "compute-op")

    def item_shape(self, params: tuple, item: tuple) -> tuple:
        """The result item dims over an item of dims `item` (ShapeError if it does not fit)."""
        return item_shape(self, params, item)


def _require(cond: bool, name: str, msg: str) -> None:
    """A registry entry that breaks the rules of its kind fails at import, naming itself."""
    if not cond:
        raise ValueError(f"op registry: {name}: {msg}")


def _associative(f) -> bool:
    """Whether binary formula f gives f(f(a, b), c) == f(a, f(b, c)) on every triple of
    small integers (exact in float32, so rounding does not hide a wrong claim), signed
    zeros, infinities and NaN, compared bit for bit (NaN with NaN)."""
    values = np.array([0.0, -0.0, 1.0, -1.0, 2.0, -3.0, np.inf, -np.inf, np.nan], np.float32)
    a, b, c = (g.ravel() for g in np.meshgrid(values, values, values, indexing="ij"))
    with np.errstate(all="ignore"):
        left = fm.interpret(f, (fm.interpret(f, (a, b), (), NUMPY), c), (), NUMPY)
        right = fm.interpret(f, (a, fm.interpret(f, (b, c), (), NUMPY)), (), NUMPY)
    return bool(np.array_equal(left, right, equal_nan=True))


def _symmetric(f) -> bool:
    """Whether binary formula f gives the same on (a, b) and (b, a): seeded values with
    ties, zeros, signs, infinities and NaN, compared bit for bit (NaN with NaN)."""
    rng = np.random.default_rng(0)
    special = np.array([0.0, -0.0, 1.0, -1.0, 2.5, np.inf, -np.inf, np.nan], np.float32)
    a = np.concatenate([np.repeat(special, len(special)), rng.standard_normal(64).astype(np.float32)])
    b = np.concatenate([np.tile(special, len(special)), rng.standard_normal(64).astype(np.float32)])
    with np.errstate(all="ignore"):
        one, two = fm.interpret(f, (a, b), (), NUMPY), fm.interpret(f, (b, a), (), NUMPY)
    return bool(np.array_equal(one, two, equal_nan=True))
