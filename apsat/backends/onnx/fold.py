"""Work on weights alone, done once at export: BatchNorm folded into conv weights, weights
transposed or concatenated, constant masks built.

Every term that reads only weights and literals, and is read by a term that does not
(or is an output), is evaluated once by the reference interpreter, the language's ground
truth, so the export computes exactly what the program says. The result is written as a
constant, with every axis along which it does not vary cut to size 1 (ONNX broadcasting
restores it): a bias broadcast over an image is written once, not per pixel.
"""
from __future__ import annotations

from apsat.backends.onnx.graph import const_val
from apsat.backends.onnx.views import compact
from apsat.lang.evaluate import evaluate
from apsat.lang.program import Program
from apsat.lang.term import Term


def weight_only_terms(program: Program, varying=frozenset()) -> set[Term]:
    """The terms that read weights and literals only (no input, no opaque call), those of
    `varying` aside: their shapes follow symbolic dims, so a constant cannot stand for them."""
    known: set[Term] = set()
    for t in program.terms():
        if t.op == "access-tensor":
            if t.args[0] in program.weights:
                known.add(t)
        elif t.op != "opaque" and t not in varying and all(c in known for c in t.children()):
            known.add(t)
    return known


def fold_weights(program: Program, weights: dict, varying=frozenset()) -> dict[Term, object]:
    """Term -> constant Val for each weight-only term some other term (or an output)
    reads; evaluated in one pass of the reference interpreter."""
    known = weight_only_terms(program, varying)
    frontier = {t for t in program.outputs.values() if t in known}
    for t in program.terms():
        if t not in known:
            frontier.update(c for c in t.children() if c in known)
    if not frontier:
        return {}
    order = sorted(frontier, key=id)
    outs = {f"w{i}": t for i, t in enumerate(order)}
    shapes = {t: program.shape_of(t) for t in program.terms()}
    sub = Program(outs, program.tensor_shapes, program.opaque_nodes, program.weights, known_shapes=shapes,
                  tensor_types=program.tensor_types)
    needed = {n: weights[n] for n in sub.tensor_names()}
    values = evaluate(sub, needed, copy=False)     # read only: broadcasts stay views
    if len(outs) == 1:
        values = {"w0": values}
    out = {}
    for key, t in outs.items():
        it, item = program.shape_of(t)
        out[t] = const_val(compact(values[key]), tuple(it) + tuple(item))
    return out
