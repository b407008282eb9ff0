"""Attention as the importer writes it and as the `attention` atom says it, for the
backend and cost-model tests of the atom (the forms the attention-fusion rules read; see
tests/rules/test_attention_fusion.py)."""
from __future__ import annotations


def _shape(*dims) -> str:
    return "(shape " + " ".join(str(d) for d in dims) + ")"


def forms(lead, kv_lead, m, n, d, e, safe, bias):
    """(atom text, unfused chain text, tensor shapes) of attention over heads `lead` (the
    leading iterated dims; `kv_lead` K's and V's, 1 where they are broadcast), as the
    importer writes the chain and the attention-fusion rules read it (see
    tests/rules/test_attention_fusion.py): q (lead, m, d), k (kv_lead, n, d), vt
    (kv_lead, e, n), mask (1.., m, n) broadcast over the heads."""
    r = len(lead) + 2
    full = _shape(*lead, m, n)
    qk = (f"(access-pair (access-broadcast (access-reshape (access-tensor q) (access-shape {_shape(*lead, m, 1, d)} "
          f"(shape))) (access-shape {full} {_shape(d)})) (access-broadcast (access-reshape (access-tensor k) "
          f"(access-shape {_shape(*kv_lead, 1, n, d)} (shape))) (access-shape {full} {_shape(d)})))")
    v = (f"(access-broadcast (access-reshape (access-tensor vt) (access-shape {_shape(*kv_lead, 1, e, n)} (shape))) "
         f"(access-shape {_shape(*lead, m, e)} {_shape(n)}))")
    b = (f"(access-broadcast (access (access-tensor mask) {r}) (access-shape {full} (shape)))" if bias
         else "(access-literal 0.0)")
    s = f"(compute dot-product {qk})"
    if bias:
        s = f"(compute elementwise-add (access-pair {s} {b}))"
    p = f"(compute softmax (access {s} {r - 1}))"
    if safe:
        zero = (f"(access-broadcast (access-reshape (access-literal 0.0) (access-shape {_shape(*[1] * r)} (shape))) "
                f"(access-shape {full} (shape)))")

        def part(x):
            return f"(access (access-insert-axis {x} {r}) {r})"
        p = (f"(compute select (access-concatenate (access-concatenate {part(f'(access (compute is-nan {p}) {r})')} "
             f"{part(zero)} {r}) {part(f'(access {p} {r})')} {r}))")
    chain = (f"(compute dot-product (access-pair (access-broadcast (access-reshape {p} (access-shape "
             f"{_shape(*lead, m, 1, n)} (shape))) (access-shape {_shape(*lead, m, e)} {_shape(n)})) {v}))")
    shapes = {"q": (*lead, m, d), "k": (*kv_lead, n, d), "vt": (*kv_lead, e, n)}
    if bias:
        shapes["mask"] = (*[1] * len(lead), m, n)
    return f"(attention {int(safe)} {qk} {b} {v})", chain, shapes
