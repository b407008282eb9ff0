"""ONNX Einsum with one or two operands, as the language's products and reductions.

Every label is either kept (it is in the output) or summed. Each operand is transposed to
the order (kept labels in output order, then summed labels), given size-1 axes for the
labels it lacks, and broadcast to the full extent: ((kept dims), (summed dims)). One
operand is then a `reduce-sum` over the summed dims (or just the transpose when nothing is
summed); two are an `access-pair` and a `dot-product`, which multiplies the pair and sums
the item: a batched matrix product, as MatMul's batched lowering writes it, so the
matrix-product rules and kernels see it. A label summed away in one operand alone is
summed after the product, which equals summing it first. An ellipsis stands for the
broadcast leading dims, as numpy's. A label repeated inside one operand (a diagonal or a
trace) and three or more operands are Unlowerable (an opaque call).
"""
from __future__ import annotations

from apsat.frontend.lowering_tensor import Unlowerable


def _labels(spec: str, rank: int, ellipsis: str) -> list[str]:
    """The operand's labels, its '...' replaced by the last `rank - len(named)` ellipsis
    labels (numpy aligns an ellipsis's dims to the right)."""
    if "..." not in spec:
        return list(spec)
    head, tail = spec.split("...")
    n = rank - len(head) - len(tail)
    if n < 0 or n > len(ellipsis):
        raise Unlowerable(f"Einsum operand {spec!r} does not fit rank {rank}")
    return list(head) + list(ellipsis[len(ellipsis) - n:]) + list(tail)


def lower_einsum(ctx):
    """out = einsum(equation, *inputs) for one or two inputs (module doc)."""
    equation = str(ctx.attr("equation", "")).replace(" ", "")
    lhs, arrow, rhs = equation.partition("->")
    specs = lhs.split(",")
    if len(specs) != ctx.n_inputs or not 1 <= len(specs) <= 2:
        raise Unlowerable(f"Einsum over {len(specs)} operands")
    dims = [ctx.dims(i) for i in range(len(specs))]
    named = {c for s in specs for c in s.replace("...", "")}
    spare = [chr(c) for c in range(ord("A"), ord("Z") + 1) if chr(c) not in named]
    ell_rank = max((len(d) - len(s.replace("...", "")) for s, d in zip(specs, dims) if "..." in s), default=0)
    ellipsis = "".join(spare[:ell_rank])
    labels = [_labels(s, len(d), ellipsis) for s, d in zip(specs, dims)]
    if any(len(ls) != len(d) or len(set(ls)) != len(ls) for ls, d in zip(labels, dims)):
        raise Unlowerable(f"Einsum {equation!r}: a repeated label or a rank mismatch")
    size: dict[str, int] = {}
    for ls, d in zip(labels, dims):
        for label, n in zip(ls, d):
            if size.get(label, 1) not in (1, n) and n != 1:
                ctx.fail(f"Einsum {equation!r}: label {label!r} has sizes {size[label]} and {n}")
            size[label] = max(size.get(label, 1), n)
    if arrow:
        kept = _labels(rhs, len(rhs.replace("...", "")) + len(ellipsis), ellipsis)
    else:                       # numpy's implicit output: the ellipsis, then labels seen once
        once = sorted(c for c in named if sum(s.count(c) for s in specs) == 1)
        kept = list(ellipsis) + once
    if any(label not in size for label in kept):
        ctx.fail(f"Einsum {equation!r}: an output label no operand has")
    summed = [label for ls in labels for label in ls if label not in kept]
    summed = list(dict.fromkeys(summed))
    order = kept + summed
    full = tuple(size[label] for label in order)
    b = ctx.b
    operands = []
    for i, ls in enumerate(labels):
        t = ctx.term(i)
        present = [label for label in order if label in ls]
        perm = [ls.index(label) for label in present]
        if perm != list(range(len(perm))):
            t = b.transpose(t, perm)
        with_ones = tuple(size[label] if label in ls and dims[i][ls.index(label)] != 1 else 1 for label in order)
        t = b.reshape(t, with_ones)
        operands.append(b.broadcast(t, full, len(kept)))
    if len(operands) == 1:
        return [b.compute("reduce-sum", operands[0]) if summed else b.at(operands[0], len(kept))]
    if not summed:              # an outer or element-wise product: an item of one to sum
        operands = [b.reshape(o, full + (1,), len(kept)) for o in operands]
    return [b.compute("dot-product", b.make("access-pair", *operands))]
