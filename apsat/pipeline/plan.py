"""Decide once: the extraction's candidates, priced by what the target's backend emits.

The extractor chooses a program by its e-node cost model (apsat/extract/cost_*.py: one
roofline or cycle figure per e-node, shared classes paid once). What runs is what the
backend makes of that program: on the gpu target element-wise chains ride on the kernels
that produce or consume them, so the e-node figure overstates the emitted kernels' time
(light ResNet-50: 490 µs against 293). The planner is the backend's lowering and price:

* each candidate of the extraction (apsat.extract.extract_candidates: the extractor's
  program and, where the e-graph offers sibling merges, the program with every merge
  taken) is lowered and priced by `backend.price`, and the cheapest is kept (the first on
  a tie); `lower` itself decides nothing more, so the kernels the report prices are the
  kernels that are emitted;
* the imported program is lowered and priced the same way, so the modelled speed-up
  compares like with like (plan's price is reused where the extracted program is the
  imported one: no rule ran, or none changed it).

`extraction.dag_cost` is then the emitted program's price (µs or cycles), `kernels` its
kernel count, and the extractor's own e-node figures stay beside them as
`node_dag_cost` / `node_dag_cost_before`.
"""
from __future__ import annotations


def plan(backend, candidates, target, weights, options: dict):
    """(program, lowered, figures): the cheapest of `candidates` ([(label, Program)], the
    extractor's own first), lowered. figures: {"unit", "cost", "kernels", "chosen",
    "variants": [{"label", "cost", "kernels"}]}, or None for a backend without a price
    (the first candidate)."""
    best = None
    rows = []
    for label, candidate in candidates:
        lowered = backend.lower(candidate, target, weights, options)
        price = backend.price(lowered)
        if price is None:
            return candidate, lowered, None
        rows.append({"label": label, "cost": price["cost"], "kernels": price["kernels"]})
        if best is None or price["cost"] < best[2]["cost"]:
            best = (candidate, lowered, price, label)
    chosen, lowered, price, label = best
    return chosen, lowered, {"unit": price["unit"], "cost": price["cost"], "kernels": price["kernels"],
                             "chosen": label, "variants": rows}


def price_of(backend, program, target, weights, options: dict, extracted=None, figures=None) -> dict | None:
    """The backend's price of `program` as it is (the imported program, before any rule):
    {"cost", "kernels"}, or None for a backend without a price. Where it is the
    `extracted` program that `plan` priced (`figures`: no rule changed it, or none ran),
    plan's price of it is taken rather than lowering it again."""
    if figures is not None and extracted is not None and program.outputs == extracted.outputs:
        first = figures["variants"][0]
        return {"cost": first["cost"], "kernels": first["kernels"]}
    return backend.price(backend.lower(program, target, weights, options))


def into_extraction(extraction: dict, figures: dict | None, before: dict | None) -> None:
    """Put the planned figures into the report's `extraction`: dag_cost and
    dag_cost_before become the backend's prices (the e-node model's figures move to
    node_dag_cost and node_dag_cost_before), with the kernel counts and the variants
    weighed. Nothing changes where the backend has no price."""
    if figures is None or before is None:
        return
    extraction["node_dag_cost"] = extraction.get("dag_cost")
    extraction["node_dag_cost_before"] = extraction.get("dag_cost_before")
    extraction.update(
        dag_cost=figures["cost"], dag_cost_before=before["cost"], unit=figures["unit"],
        kernels=figures["kernels"], kernels_before=before["kernels"],
        modelled_speedup=before["cost"] / figures["cost"] if figures["cost"] else None,
        variants=figures["variants"], chosen=figures["chosen"])
