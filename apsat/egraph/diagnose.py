"""One-line messages for the shape errors egglog flags (EGraph._check_shapes).

The shape rules (language.egg, shape_rules.egg) flag an e-class rather than panic: an
ill-shaped node asserts `(shape-invalid e "reason")`, two different shape facts for one
class `(shape-conflict e)`. These functions read egglog's frozen tables once the driver's
check has found a flag, to name the class a user can act on: its handles, its nodes' ops
and the shapes that disagree. Split out of driver.py, which keeps the e-graph itself.
"""
from __future__ import annotations

from apsat.egraph.serialize import SORT_OF, raw_id
from apsat.lang import dtypes


def describe(g, flag: str) -> str:
    """One line naming the first e-class flagged with `flag` ("shape-invalid" or
    "shape-conflict") in bindings EGraph `g`: a conflict whose children are not themselves
    in conflict when there is one (the cause rather than a class it spread to)."""
    frozen = g.freeze().functions
    flagged: dict = {}
    for row in frozen[flag].rows:
        why = g.value_to_string(row.inputs[1]) if flag == "shape-invalid" else None
        flagged.setdefault(row.inputs[0], why)
    ops, kids = _expr_nodes(frozen)
    cause = [c for c in flagged if not (kids.get(c, set()) & flagged.keys())]
    cls = (cause or list(flagged))[0]
    handles = [f"(handle {g.value_to_i64(r.inputs[0])})"
               for r in frozen["handle"].rows if r.output == cls] if "handle" in frozen else []
    where = (f"e-class Expr-{raw_id(cls)} ({', '.join(handles[:3]) or 'no handle'}; "
             f"nodes: {', '.join(sorted(ops.get(cls, ())))})")
    more = f"; {len(flagged) - 1} more e-class(es) flagged" if len(flagged) > 1 else ""
    if flag == "shape-invalid":
        return f"ill-shaped node in {where}: {flagged[cls]}{more}"
    if flag == "type-conflict":
        types = sorted(dtypes.NAMES.get(g.value_to_i64(r.inputs[1]), "?") for r in frozen["has-type"].rows
                       if r.inputs[0] == cls)
        return f"element types {' and '.join(types)} meet in {where} (a Cast must convert one){more}"
    ranks, dims = _shape_facts(g, frozen, cls)
    if not ranks:
        return f"shape conflict in {where}{more}"
    return (f"shape conflict in {where}: {_fmt_shape(ranks, dims, min)} vs "
            f"{_fmt_shape(ranks, dims, max)}{more}")


def _expr_nodes(frozen) -> tuple[dict, dict]:
    """Class Value -> ops of its Expr nodes, and -> the Expr classes of their children."""
    ops, kids = {}, {}
    for op, fn in frozen.items():
        if SORT_OF.get(op) == "Expr":
            for row in fn.rows:
                ops.setdefault(row.output, set()).add(op)
                kids.setdefault(row.output, set()).update(
                    v for v, s in zip(row.inputs, fn.input_sorts) if s == "Expr")
    return ops, kids


def _shape_facts(g, frozen, cls) -> tuple[list, dict]:
    """Every (ndim, split) fact of class `cls`, sorted, and axis -> the dims asserted for it
    (the facts keep every value ever derived; the ndim/split/dim views keep the least)."""
    i64 = g.value_to_i64
    ranks = sorted((i64(r.inputs[1]), i64(r.inputs[2])) for r in frozen["shape-rank"].rows
                   if r.inputs[0] == cls)
    dims: dict[int, list] = {}
    for r in frozen["shape-dim"].rows:
        if r.inputs[0] == cls:
            dims.setdefault(i64(r.inputs[1]), []).append(i64(r.inputs[2]))
    return ranks, dims


def _fmt_shape(ranks, dims, pick) -> str:
    """An access shape from shape facts: `pick` (min or max) chooses among the ranks and,
    per axis, among the dims; `?` where no dim fact exists."""
    n, s = pick(ranks)
    ds = [pick(dims[i]) if dims.get(i) else "?" for i in range(n)]

    def tup(xs):
        return "(" + ", ".join(map(str, xs)) + ("," if len(xs) == 1 else "") + ")"
    return f"({tup(ds[:s])}, {tup(ds[s:])})"
