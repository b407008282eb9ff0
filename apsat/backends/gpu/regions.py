"""The natural kernel of a matmul, reduction or attention term, before any epilogue chain.

`natural(program, t, buffers)` describes the kernel computing term t (a fused matmul
atom, `systolic-array`, or a reducing `compute`): its kind, loop axes, operand values, the
value at its own output index ("post", reading the accumulator ACC) and that index ("p"),
which the lowering may extend with an element-wise consumer chain (epilogue.invert_path).

Matrix products become gemm kernels when both sides have more than one row; a
matrix-vector product (or a dot-product whose operands vary along the same output axes)
is a row reduction of the products instead. A `compute dot-product` over a pair or a
cartesian product finds its matrix sides by which output axes each operand's index
actually depends on: axes only the first reads are M, only the second N, both batch, so
attention's batched head products and grouped convolutions need no special case.
The attention atom's kernel is described in attention.py.
"""
from __future__ import annotations

import math

from apsat.backends.gpu.emit import used_vars
from apsat.backends.gpu.expr import call, const, var
from apsat.backends.gpu.views import Values, unary
from apsat.lang.ops import ATOM_OPS, COMPUTE_OPS, LOCAL_OPS, chain_parts
from apsat.lang.term import Term

ACC = ("sym", "acc")
# Operators that need a kernel of their own: every one a kernel cannot compute inline
# (dot-products, reductions, normalisations over the item).
REDUCTIONS = frozenset(COMPUTE_OPS) - LOCAL_OPS
# Reductions that write every element of the row, normalised (softmax, the norms): the
# registry's whole-item operators that are not local. Their one parameter, if any, is eps.
ROW_NORMALISATIONS = frozenset(n for n, s in COMPUTE_OPS.items() if s.kind == "item") - LOCAL_OPS

def natural(program, t: Term, buffers) -> dict:
    """t's kernel before any epilogue chain: kind, axes, operand values, the value at
    its own output index `p` ("post", reading ACC) and the Values that built them."""
    p = program
    op = t.op
    if op == "attention":     # a kernel kind of its own (FlashAttention): attention.py
        from apsat.backends.gpu.attention import describe   # here: attention.py imports us

        return describe(p, t, buffers)
    if op in ("fused-dot-bias", "fused-dot-bias-act", "systolic-array"):
        first = {"fused-dot-bias": 0, "fused-dot-bias-act": 1, "systolic-array": 2}[op]
        a_t, b_t = t.args[first], t.args[first + 1]
        if op == "systolic-array":
            md, kd, nd = p.shape_of(a_t)[0], p.shape_of(a_t)[1], (t.args[1],)
        else:
            md, kd, nd = p.shape_of(a_t)[0], p.shape_of(a_t)[1], p.shape_of(b_t)[0]
        vals = Values(p, buffers)
        if math.prod(md) > 1 and math.prod(nd) > 1:
            m = tuple(var(f"m{i}", d) for i, d in enumerate(md))
            n = tuple(var(f"n{i}", d) for i, d in enumerate(nd))
            ka = tuple(var(f"ka{i}", d) for i, d in enumerate(kd))
            kb = tuple(var(f"kb{i}", d) for i, d in enumerate(kd))
            av = vals.value(a_t, m + ka)
            bv = vals.value(b_t, kb + n if op == "systolic-array" else n + kb)
            out = _epilogue(t, vals, n, ACC)
            return {"kind": "gemm", "axes": {"b": (), "m": tuple(md), "n": tuple(nd), "k": tuple(kd)},
                    "values": {"a": av, "b": bv}, "p": m + n, "post": out, "vals": vals,
                    "covers": covered_ops(p, t, buffers)}
        r = tuple(var(f"r{i}", d) for i, d in enumerate(tuple(md) + tuple(nd)))
        c = tuple(var(f"c{i}", d) for i, d in enumerate(kd))
        rm, rn = r[:len(md)], r[len(md):]
        av = vals.value(a_t, rm + c)
        bv = vals.value(b_t, c + rn if op == "systolic-array" else rn + c)
        elem = call("mul", av, bv)
        out = _epilogue(t, vals, rn, ACC)
        return {"kind": "reduce", "op": "sum", "axes": {"r": tuple(md) + tuple(nd), "c": tuple(kd)},
                "values": {"elem": elem}, "p": r, "post": out, "vals": vals,
                "covers": covered_ops(p, t, buffers)}
    name, params = t.args[0].op, t.args[0].args
    x_t = t.args[1]
    it, item = p.shape_of(x_t)
    if name == "dot-product":
        return _dot(p, t, x_t, tuple(it), tuple(item), buffers)
    vals = Values(p, buffers)
    r = tuple(var(f"r{i}", d) for i, d in enumerate(it))
    c = tuple(var(f"c{i}", d) for i, d in enumerate(item))
    elem = vals.value(x_t, r + c)
    op = name.replace("reduce-", "")
    per_elem = name in ROW_NORMALISATIONS
    return {"kind": "reduce", "op": op, "eps": float(params[0]) if per_elem and params else 0.0,
            "axes": {"r": tuple(it), "c": tuple(item)}, "values": {"elem": elem},
            "p": r + c if per_elem else r, "post": ACC, "vals": vals,
            "covers": covered_ops(p, t, buffers)}

def _epilogue(t, vals, n_idx, acc):
    """bias (+ activation) of a fused matmul atom at output columns n_idx."""
    if t.op == "systolic-array":
        return acc
    bias_t = t.args[-1]
    v = call("add", acc, vals.value(bias_t, n_idx))
    if t.op == "fused-dot-bias-act":
        v = unary(t.args[0].op, t.args[0].args, v)
    return v

def _dot(program, t, x_t, it, item, buffers) -> dict:
    """compute dot-product: a gemm when its two operands vary along different output
    axes (a matmul with batch axes), else a row reduction of the products."""
    p = program
    n_ops, rest = item[0], item[1:]
    covers = covered_ops(p, t, buffers)
    if n_ops == 2:
        probe = Values(p, buffers)
        o = tuple(var(f"o{i}", d) for i, d in enumerate(it))
        kr = tuple(var(f"k{i}", d) for i, d in enumerate(rest))
        deps_a = _deps(probe.value(x_t, o + (const(0),) + kr))
        deps_b = _deps(probe.value(x_t, o + (const(1),) + kr))
        groups = []
        for i, d in enumerate(it):
            v = f"o{i}"
            ina, inb = v in deps_a, v in deps_b
            groups.append("m" if ina and not inb else "n" if inb and not ina else "b")
        size = {g: math.prod(d for d, gg in zip(it, groups) if gg == g) for g in "bmn"}
        if size["m"] > 1 and size["n"] > 1:
            counters = {"b": 0, "m": 0, "n": 0}
            names = []
            for g, d in zip(groups, it):
                names.append(var(f"{g}{counters[g]}", d))
                counters[g] += 1
            pa = tuple(const(0) if g == "n" else v for g, v in zip(groups, names))
            pb = tuple(const(0) if g == "m" else v for g, v in zip(groups, names))
            ka = tuple(var(f"ka{i}", d) for i, d in enumerate(rest))
            kb = tuple(var(f"kb{i}", d) for i, d in enumerate(rest))
            vals = Values(p, buffers)
            av = vals.value(x_t, pa + (const(0),) + ka)
            bv = vals.value(x_t, pb + (const(1),) + kb)
            axes = {g: tuple(d for d, gg in zip(it, groups) if gg == g) for g in "bmn"}
            axes["k"] = tuple(rest)
            return {"kind": "gemm", "axes": axes, "values": {"a": av, "b": bv},
                    "p": tuple(names), "post": ACC, "vals": vals, "covers": covers}
    vals = Values(p, buffers)
    r = tuple(var(f"r{i}", d) for i, d in enumerate(it))
    c = tuple(var(f"c{i}", d) for i, d in enumerate(rest))
    elem = None
    for k in range(n_ops):
        v = vals.value(x_t, r + (const(k),) + c)
        elem = v if elem is None else call("mul", elem, v)
    return {"kind": "reduce", "op": "sum", "axes": {"r": it, "c": tuple(rest)},
            "values": {"elem": elem}, "p": r, "post": ACC, "vals": vals, "covers": covers}


def _deps(value) -> set:
    """Variable names a value expression's loads and conditions depend on."""
    return used_vars(value)


def covered_ops(program, t: Term, buffers, stop: Term | None = None) -> list[str]:
    """The ops a kernel rooted at t computes: t and every non-view term it inlines (the
    walk ends at buffers and at `stop`, an epilogue's producer, listed already)."""
    out, stack, seen = [], [t], set()
    while stack:
        u = stack.pop()
        if u in seen:
            continue
        seen.add(u)
        if u is not t and (u in buffers or u is stop):
            continue
        if u.op == "compute":
            out.extend(part.op for part in chain_parts(u.args[0]))
        elif u.op in ATOM_OPS:
            out.append(u.op if u.op != "fused-dot-bias-act" else f"fused-dot-bias-act {u.args[0].op}")
        stack.extend(reversed(list(u.children())))
    return out
