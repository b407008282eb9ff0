"""Sibling products merged into one wider gemm before lowering.

Products that read the same A operand with different weights (a transformer's Q, K and V
projections, Llama's gate and up projections, an Inception module's 1x1 branches) become
one product over the weights concatenated along n; each original product is a slice of
it, a view its consumers index into. One kernel reads A once instead of once a product.

The e-graph has the same merge as rewrite rules, but greedy-DAG extraction cannot take
it: it prices each slice as the whole wider product, blind to the other slices sharing
it. Here the sharing is visible, so the lowering (lower.py) builds both kernel graphs
and keeps the merged one when it has fewer kernels.

Merged: `fused-dot-bias`, `fused-dot-bias-act` and `compute dot-product` over
`access-cartesian-product`, in any mix, reading one A term; each with a single n axis,
its weights (and bias) weight-only, so no product can depend on a sibling. Llama's gate
(with SiLU in its atom) and up (a plain product) merge: the activation then applies to
the gate's slice. A program output is never merged (it would need a copy out).
"""
from __future__ import annotations

from apsat.backends.gpu.inline import weight_only
from apsat.lang.program import Program, apply_shape_rule
from apsat.lang.term import Term


def merge_siblings(program: Program) -> Program:
    """`program` with each group of sibling products replaced by slices of one product
    (the module doc); `program` itself when there is none."""
    groups: dict = {}
    outputs, known = set(program.outputs.values()), {}     # known: weight_only's memo
    for t in program.terms():
        key = None if t in outputs else _sibling_key(program, t, known)
        if key is not None:
            groups.setdefault(key, []).append(t)
    shapes: dict = {}

    def shape_of(term):
        return shapes[term] if term in shapes else program.shape_of(term)

    def make(op, *args):
        term = Term(op, tuple(args))
        if term not in shapes:
            shapes[term] = apply_shape_rule(op, term.args, shape_of, program.tensor_shapes)
        return term

    replace: dict[Term, Term] = {}
    for ts in groups.values():
        if len(ts) > 1:
            replace.update(_merge(program, ts, make))
    if not replace:
        return program
    return _rebuild(program, replace, shapes)


def _sibling_key(program: Program, t: Term, known: dict):
    """The key products sharing their A operand have in common (A and the contracted
    dims), or None when t is not a product that can merge."""
    parts = _parts(t)
    if parts is None:
        return None
    a, b, bias = parts
    if len(program.shape_of(b)[0]) != 1 or not weight_only(program, b, known):
        return None
    if bias is not None and not weight_only(program, bias, known):
        return None
    return (a, program.shape_of(b)[1])


def _parts(t: Term):
    """(A, B, bias or None) of a product: fused-dot-bias(-act), or a dot-product over a
    cartesian product (no bias); None for anything else."""
    if t.op == "fused-dot-bias":
        return t.args
    if t.op == "fused-dot-bias-act":
        return t.args[1:]
    if t.op == "compute" and t.args[0].op == "dot-product" and t.args[1].op == "access-cartesian-product":
        return (*t.args[1].args, None)
    return None


def _merge(program: Program, ts: list, make) -> dict:
    """{product: its slice of the merged product} for one group of siblings. The merged
    product is a fused-dot-bias over the weights and biases concatenated along n (a
    product without a bias contributes zeros); one activation shared by every sibling
    stays in the atom, else each sibling applies its own to its slice."""
    def cat(parts):
        out = parts[0]
        for p in parts[1:]:
            out = make("access-concatenate", out, p, 0)
        return out

    def zeros(n):
        one = make("access-reshape", make("access-literal", 0.0), Term("access-shape", ((1,), ())))
        return make("access-broadcast", one, Term("access-shape", ((n,), ())))

    parts = [_parts(t) for t in ts]
    a = parts[0][0]
    widths = [program.shape_of(b)[0][0] for _, b, _ in parts]
    weights = cat([b for _, b, _ in parts])
    bias = cat([c if c is not None else zeros(n) for (_, _, c), n in zip(parts, widths)])
    acts = {t.args[0] if t.op == "fused-dot-bias-act" else None for t in ts}
    shared = acts.pop() if len(acts) == 1 else None
    merged = (make("fused-dot-bias-act", shared, a, weights, bias) if shared is not None
              else make("fused-dot-bias", a, weights, bias))
    axis = len(program.shape_of(a)[0])
    out, lo = {}, 0
    for t, n in zip(ts, widths):
        piece = make("access-slice", merged, axis, lo, lo + n)
        if t.op == "fused-dot-bias-act" and shared is None:
            piece = make("compute", t.args[0], piece)
        out[t] = piece
        lo += n
    return out


def _rebuild(program: Program, replace: dict, shapes: dict) -> Program:
    """The program with the replaced terms' uses reading their replacements, rebuilt
    bottom-up (a replacement's own operands are rebuilt too: a later layer's A reads an
    earlier layer's merged products); each term keeps its shape."""
    memo: dict[Term, Term] = {}
    known: dict = {}
    for root in program.outputs.values():
        stack = [root]
        while stack:
            u = stack[-1]
            if u in memo:
                stack.pop()
                continue
            src = replace.get(u, u)
            todo = [c for c in src.children() if c not in memo]
            if todo:
                stack.extend(todo)
                continue
            stack.pop()
            memo[u] = _with_children(src, memo)
            known[memo[u]] = shapes[u] if u in shapes else program.shape_of(u)
    outputs = {k: memo[t] for k, t in program.outputs.items()}
    return Program(outputs, program.tensor_shapes, program.opaque_nodes, program.weights,
                   program.cost, program.extraction, known_shapes=known)


def _with_children(t: Term, memo: dict) -> Term:
    """t with each child term (also inside a tuple of terms) replaced by memo's."""
    args = tuple(memo.get(a, a) if isinstance(a, Term) else
                 tuple(memo.get(b, b) if isinstance(b, Term) else b for b in a) if isinstance(a, tuple) else a
                 for a in t.args)
    return t if args == t.args else Term(t.op, args)
