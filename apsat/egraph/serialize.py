"""The e-graph as extraction-gym JSON, read from egglog's frozen tables (EGraph.serialize).

Why not egglog's own serializer: it writes every row of every function (the shape
analysis, list helpers and handles too) and is ~10x slower on this language; here only the
language's constructors and their literals become nodes.

Why the shapes ride along: egglog has already derived the access shape of every e-class
(the `ndim`, `split` and `dim` functions of language.egg, checked for conflicts after every
change), so they are exported with the classes, as `class_data[c]["shape"]` =
[[iterated dims], [item dims]]. Extraction's cost models and decoding read them from there
and no second shape pass over the e-classes runs in Python. Exporting and reading them
costs about half of what that pass did (CPU seconds; ResNet-50 saturated for
systolic:32x32, 40k classes: 0.27 + 0.06 s against 0.79 s; Inception-v2, 64k classes,
the light zoo's largest: 0.62 + 0.11 s against 1.38 s).

The element types ride along the same way: each Expr class with a `has-type` row (the
e-graph's type analysis, apsat/lang/dtypes.py) gets `class_data[c]["dtype"]` ("f32",
"f16" or "bf16"; absent for exact values), which the gpu cost model reads to price bytes
by element width and products at their type's peak.
"""
from __future__ import annotations

import contextlib
import gc
import json
import re

from apsat.lang import dtypes
from apsat.lang.ops import COMPUTE_OPS, EGG_NAMES, OPS, PAD_TYPES

# Constructors the serialized e-graph keeps (analysis tables and handles are left out).
SORT_OF = {**{op: "Expr" for op in OPS},
           **{EGG_NAMES.get(op, op): "ComputeOp" for op in COMPUTE_OPS},
           **{p: "PadType" for p in PAD_TYPES}, "access-shape": "AccessShape",
           "inil": "IList", "icons": "IList", "enil": "ExprList", "econs": "ExprList"}
EGG_TO_REGISTRY = {v: k for k, v in EGG_NAMES.items()}   # egglog's spelling -> registry op
_VALUE = re.compile(r"Value\((-?\d+)\)")


def raw_id(value) -> str:
    """egglog's id for a Value (what `Value(N)` prints; the serializer's `Sort-N`)."""
    return _VALUE.fullmatch(str(value)).group(1)


class _Ids(dict):
    """Value -> egglog id, each Value's text parsed once (a serialisation meets every
    class id several times: as a node's class, as children, in the shape tables)."""

    def __missing__(self, value) -> str:
        self[value] = text = raw_id(value)
        return text


def serialize(g, roots: list[str]) -> dict:
    """Extraction-gym JSON, parsed, of bindings EGraph `g` with root classes `roots`; the
    contract is EGraph.serialize's."""
    with _collector_paused():
        frozen = g.freeze().functions
        ids = _Ids()
        nodes, class_data = _nodes(g, frozen, ids)
        for cls, shape in class_shapes(g, frozen, ids).items():
            if cls in class_data:
                class_data[cls]["shape"] = shape
        for cls, dtype in class_types(g, frozen, ids).items():
            if cls in class_data:
                class_data[cls]["dtype"] = dtype
    return {"nodes": nodes, "root_eclasses": roots, "class_data": class_data}


@contextlib.contextmanager
def _collector_paused():
    """Pause Python's cyclic garbage collector for the block. Why: serialising allocates
    some ten containers per e-node, none in a cycle, and while they pile up the collector
    keeps tracing every object alive, the e-graph's programs included (ResNet-50
    saturated for systolic:32x32: 0.84 s with it running, 0.58 s paused)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _nodes(g, frozen, ids: _Ids) -> tuple[dict, dict]:
    """(nodes, class_data) of the language's constructor rows, in table order, and of the
    literals they use (one `primitive-SORT-N` node per literal, made at its first use)."""
    nodes, class_data, first = {}, {}, {}
    literal = {"i64": lambda v: str(g.value_to_i64(v)), "f64": lambda v: repr(g.value_to_f64(v)),
               "String": lambda v: json.dumps(g.value_to_string(v))}

    def child(value, sort: str) -> str:
        if sort in literal:
            node_id = f"primitive-{sort}-{ids[value]}"
            if node_id not in nodes:
                nodes[node_id] = {"op": literal[sort](value), "children": [],
                                  "eclass": f"{sort}-{ids[value]}", "cost": 1.0, "subsumed": False}
                class_data[f"{sort}-{ids[value]}"] = {"type": sort}
            return node_id
        return first[f"{sort}-{ids[value]}"]

    table = [(op, fn) for op, fn in frozen.items() if op in SORT_OF]
    for op, fn in table:       # representatives first: children may come later
        for k, row in enumerate(fn.rows):
            first.setdefault(f"{SORT_OF[op]}-{ids[row.output]}", f"function-{k}-{op}")
    for op, fn in table:
        sort = SORT_OF[op]
        for k, row in enumerate(fn.rows):
            eclass = f"{sort}-{ids[row.output]}"
            nodes[f"function-{k}-{op}"] = {
                "op": EGG_TO_REGISTRY.get(op, op),
                "children": [child(v, s) for v, s in zip(row.inputs, fn.input_sorts)],
                "eclass": eclass, "cost": 1.0, "subsumed": bool(row.subsumed)}
            class_data[eclass] = {"type": sort}
    return nodes, class_data


def class_types(g, frozen, ids: _Ids | None = None) -> dict[str, str]:
    """Expr class id -> element type name, from egglog's `has-type` rows (none: exact
    values, or an e-graph without the type analysis). A class has at most one type: two
    are a type-conflict, which the driver raises before anything is serialised."""
    if "has-type" not in frozen:
        return {}
    ids = _Ids() if ids is None else ids
    return {f"Expr-{ids[row.inputs[0]]}": dtypes.NAMES[g.value_to_i64(row.inputs[1])]
            for row in frozen["has-type"].rows if g.value_to_i64(row.inputs[1]) in dtypes.NAMES}


def class_shapes(g, frozen, ids: _Ids | None = None) -> dict[str, list[list[int]]]:
    """Expr class id -> [[iterated dims], [item dims]], from egglog's `ndim`, `split` and
    `dim` tables (what EGraph.shape_of reads for one class). A class whose rank or one of
    whose dims egglog has not derived is left out: after the driver's shape saturation
    there is none, unless a shape rule is missing."""
    ids = _Ids() if ids is None else ids
    i64 = g.value_to_i64
    # Keyed by Value (hashing one is cheaper than parsing its id); ids only for the result.
    split = {row.inputs[0]: i64(row.output) for row in frozen["split"].rows}
    dims: dict = {}
    for row in frozen["dim"].rows:
        e, i = row.inputs
        dims.setdefault(e, {})[i64(i)] = i64(row.output)
    out = {}
    for row in frozen["ndim"].rows:
        e = row.inputs[0]
        n, s, known = i64(row.output), split.get(e), dims.get(e, {})
        if s is None or any(i not in known for i in range(n)):
            continue
        ds = [known[i] for i in range(n)]
        out[f"Expr-{ids[e]}"] = [ds[:s], ds[s:]]
    return out
