"""The per-op egglog text of the language, generated from the op registry.

The language's egglog files (language.egg, shape_rules.egg) are hand-written where the text
is not per-op: the shape store, the list helpers, the relational shape rules. Where per-op
text goes, a file has a marker line `;; @generated SECTION` that `expand` replaces with
SECTIONS[SECTION] (apsat/egraph/egglog_io.language_text does, on load):

  compute-ops      `(datatype ComputeOp ...)`: one constructor per ops.COMPUTE_OPS entry,
                   in registry order, its parameters' sorts from `params`
  exprs            `(datatype* (Expr ...) (ExprList ...))`: one constructor per ops.OPS
                   entry, in registry order, its argument sorts from `signature`
  classification   the relations classifying compute operators and one rule per operator
                   asserting its facts, from `kind`, `arity`, `axis_needed`, `activation`
  weight-keys      the weight-only analysis sibling merges read
  types            the element-type analysis (`has-type`, apsat/lang/dtypes.py)

Constructor order and names are the registry's, so the e-graph's tables (and so everything
egglog does) are the same whether an op was written here by hand or generated.
"""
from __future__ import annotations

import re

from apsat.lang.ops import COMPUTE_OPS, OPS

# egglog sort of each argument kind (ops.py's module doc lists the kinds).
SORTS = {"expr": "Expr", "int": "i64", "float": "f64", "name": "String", "list": "IList",
         "shape": "IList", "exprs": "ExprList", "access-shape": "AccessShape",
         "pad-type": "PadType", "compute-op": "ComputeOp"}
MARKER = re.compile(r"^;; @generated ([a-z-]+)[^\n]*$", re.M)

CLASSIFICATION_HEAD = """\
; Classification of the compute operators (generated from ops.COMPUTE_OPS: `kind`, `arity`,
; `axis_needed`, `activation`). One rule per operator (not top-level facts) so each fires
; once, when the operator first appears, asserting all its facts in one step, and
; parameterised operators are classified the same way.
(relation item-scalar (ComputeOp))          ; item -> ()
(relation item-keep (ComputeOp))            ; item -> item
(relation item-whole (ComputeOp String))    ; over the whole item, not value by value (its name)
(relation item-nary (ComputeOp i64))        ; item -> item[1:], item[0] operands (0: at least 2)
(relation item-needs-axis (ComputeOp))      ; the item must have an axis
(relation unary-map (ComputeOp))            ; a unary element-wise map (item -> item, per value)
(relation elementwise-op (ComputeOp))       ; unary maps, n-ary operators, chains of them
(relation activation (ComputeOp))           ; a fused matmul atom may apply it (ops.ACTIVATIONS)
(relation associative (ComputeOp))          ; (a op b) op c = a op (b op c) (ComputeSpec.associative)
"""


def operator_pattern(spec) -> str:
    """A compute operator with a pattern variable per parameter (`leaky-relu-op p0`): the
    head of a rule that asserts facts about every instance of it."""
    return " ".join([spec.egg] + [f"p{i}" for i in range(len(spec.params))])


def _constructor(name: str, kinds) -> str:
    return "(" + " ".join([name] + [SORTS[k] for k in kinds]) + ")"


def compute_ops_text() -> str:
    """`(datatype ComputeOp ...)` with every registry operator's constructor."""
    ctors = [_constructor(s.egg, s.params) for s in COMPUTE_OPS.values()]
    return "(datatype ComputeOp\n  " + "\n  ".join(ctors) + ")"


def exprs_text() -> str:
    """`(datatype* (Expr ...) (ExprList ...))` with every registry op's constructor."""
    ctors = [_constructor(s.name, s.signature) for s in OPS.values()]
    return ("(datatype*\n  (Expr\n    " + "\n    ".join(ctors) + ")\n"
            "  (ExprList (enil) (econs Expr ExprList)))")


def facts(spec) -> list[str]:
    """The classification facts of one compute operator, about `o`."""
    out = []
    if spec.kind in ("contraction", "reduction"):
        out.append("(item-scalar o)")
    elif spec.kind in ("map", "item"):
        out.append("(item-keep o)")
    elif spec.kind == "nary":
        out.append(f"(item-nary o {spec.arity})")
    if spec.axis_needed:
        out.append("(item-needs-axis o)")
    if spec.kind == "item":
        out.append(f'(item-whole o "{spec.name}")')
    if spec.kind == "map":
        out.append("(unary-map o)")
    if spec.activation:
        out.append("(activation o)")
    if spec.associative:
        out.append("(associative o)")
    return out


def classification_text() -> str:
    """The classification relations and one rule per operator (chain's facts follow
    from its parts, by the hand-written rules of shape_rules.egg)."""
    rules = []
    for spec in COMPUTE_OPS.values():
        if spec.kind == "chain":
            continue
        rules.append(f"(rule ((= o ({operator_pattern(spec)}))) ({' '.join(facts(spec))}) :ruleset shapes)")
    return CLASSIFICATION_HEAD + "\n".join(rules)


# weight-key of a term made of literals only (a zero bias): above every tensor's order, so
# a key below it names a weight the term reads.
LITERAL_KEY = 1 << 40

# Ops whose result is not given a weight key although every operand has one: a
# concatenation is what merge.egg builds of its members' weights, and a merged product must
# not count as a member of a wider merge (the members stay the model's own products).
NO_WEIGHT_KEY = ("access-concatenate",)


def weight_keys_text() -> str:
    """One rule per registry op giving a term whose operands are all weight-only the
    least weight-key among them (the earliest-added weight it reads): the weight-only
    analysis sibling merges read (apsat/rules/merge.egg)."""
    rules = ['(rule ((= e (access-tensor nm)) (weight-order nm k)) ((set (weight-key e) k)) :ruleset shapes)',
             f'(rule ((= e (access-literal v))) ((set (weight-key e) {LITERAL_KEY})) :ruleset shapes)']
    for spec in OPS.values():
        kinds = spec.signature
        if spec.name in NO_WEIGHT_KEY or "exprs" in kinds or "expr" not in kinds:
            continue
        args = [f"a{i}" for i in range(len(kinds))]
        keys = [f"k{i}" for i, k in enumerate(kinds) if k == "expr"]
        query = " ".join(f"(= k{i} (weight-key a{i}))" for i, k in enumerate(kinds) if k == "expr")
        least = keys[0]
        for k in keys[1:]:
            least = f"(min {least} {k})"
        rules.append(f"(rule ((= e ({spec.name} {' '.join(args)})) {query}) "
                     f"((set (weight-key e) {least})) :ruleset shapes)")
    return WEIGHT_KEYS_HEAD + "\n".join(rules)


WEIGHT_KEYS_HEAD = """\
; Weight-only terms (generated from ops.OPS): weight-key e is defined when every tensor e
; reads is a weight (known at load), and is the least weight-order among them; terms of
; literals only get LITERAL_KEY. Concatenations get none (egg_gen.NO_WEIGHT_KEY).
(relation weight-order (String i64))        ; set by the driver for every weight it adds
(function weight-key (Expr) i64 :merge (min old new))
"""


TYPES_HEAD = """\
; Element types (generated from the registry; apsat/lang/dtypes.py says what they mean):
; (has-type e T) for T an ONNX element-type code (1 f32, 10 f16, 16 bf16). Exact values
; (integers, booleans, literals) have none and take their partners'. Two types for one class
; flag (type-conflict e), which the driver raises as a TypeMismatch, as it does a shape
; conflict: so a rewrite whose sides differ in type, or a node whose operands do, is refused.
(relation tensor-type (String i64))         ; set by the driver for every float tensor
(relation opaque-type (String i64))         ; set by the driver: an opaque call's float type
(relation has-type (Expr i64))
(relation type-conflict (Expr))
(relation keeps-type (ComputeOp))           ; the result has the operand's type
(relation sets-type (ComputeOp i64))        ; the result has this type (a cast)
(rule ((has-type e a) (has-type e b) (< a b)) ((type-conflict e)) :ruleset shapes :name "conflict-type")
(rule ((= e (access-tensor nm)) (tensor-type nm t)) ((has-type e t)) :ruleset shapes)
(rule ((= e (opaque nm args sh)) (opaque-type nm t)) ((has-type e t)) :ruleset shapes)
(rule ((= o (cast t))) ((sets-type o t)) :ruleset shapes)
(rule ((= o (chain f g)) (keeps-type f) (keeps-type g)) ((keeps-type o)) :ruleset shapes)
(rule ((= o (chain f g)) (sets-type g t)) ((sets-type o t)) :ruleset shapes)
(rule ((= o (chain f g)) (sets-type f t) (keeps-type g)) ((sets-type o t)) :ruleset shapes)
(rule ((= e (compute o x)) (keeps-type o) (has-type x t)) ((has-type e t)) :ruleset shapes)
(rule ((= e (compute o x)) (sets-type o t)) ((has-type e t)) :ruleset shapes)
"""


def types_text() -> str:
    """The element-type analysis: the hand-written head, one `keeps-type` rule per compute
    operator whose result has its operand's type, and one rule per typed Expr argument of
    every other op (dtypes.typed_args) carrying the argument's type to the node."""
    from apsat.lang.dtypes import EXACT, typed_args

    rules = []
    for spec in COMPUTE_OPS.values():
        if spec.kind == "chain" or spec.name == "cast" or spec.name in EXACT:
            continue
        rules.append(f"(rule ((= o ({operator_pattern(spec)}))) ((keeps-type o)) :ruleset shapes)")
    for spec in OPS.values():
        if spec.name in ("compute", "access-tensor", "opaque"):
            continue
        args = [f"a{i}" for i in range(len(spec.signature))]
        for i in typed_args(spec.name, spec.signature):
            rules.append(f"(rule ((= e ({spec.name} {' '.join(args)})) (has-type a{i} t)) "
                         f"((has-type e t)) :ruleset shapes)")
    return TYPES_HEAD + "\n".join(rules)


SECTIONS = {"compute-ops": compute_ops_text, "exprs": exprs_text,
            "classification": classification_text, "weight-keys": weight_keys_text,
            "types": types_text}


def expand(text: str) -> str:
    """`text` with every `;; @generated SECTION` marker line replaced by that section's
    text. ValueError for an unknown section."""
    def section(match):
        name = match.group(1)
        if name not in SECTIONS:
            raise ValueError(f"unknown generated section {name!r} (known: {', '.join(SECTIONS)})")
        return SECTIONS[name]()
    return MARKER.sub(section, text)
