"""The saturation driver: named phases with per-phase limits, a default plan per target.

A phase runs some rulesets under its own limits (iterations, e-nodes, seconds) through
`EGraph.run`, which works in short bursts with a back-off scheduler and checks the limits
between bursts (egglog cannot interrupt an iteration). `saturate(eg)` without `rules=` runs
the target's default plan; with `rules=` it runs those rulesets as one phase.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from apsat.rules.library import RuleLibrary


@dataclass(frozen=True)
class Phase:
    """One step of a plan: `rulesets` run together under these limits."""

    name: str
    rulesets: tuple[str, ...]
    iter_limit: int = 30
    node_limit: int = 100_000
    time_limit: float = 10.0


# Why this order: "affine" first merges chains of per-channel scales and shifts (BatchNorm
# then a Caffe Scale layer) on the imported graph, where each chain exists once; layout and
# algebra then simplify what the importer wrote, so fusion
# and the hardware mappings then match the cleaned-up forms; layout runs again after
# fusion ("relayout", the layout-join ruleset): fusion builds its atoms under the
# importer's NCHW transposes, and layout/transpose-injective then joins them to the NHWC
# classes the first layout phase built, so convolutions read fused results without a
# transpose. Layout stops at 12 iterations for gpu: on DenseNet-121 it otherwise keeps
# composing transposes through the dense blocks' concatenations for 20+ iterations, at
# 0.5-0.9 s each. The systolic plan gives it 16 (DenseNet-121: 8.7 s here, hence its own
# 30 s time limit, so that the iteration count, not the machine's speed, stops it): its
# backend builds NHWC concatenations in place, and iterations 13-16 turn DenseNet's
# later dense-block concatenations NHWC (32x32: 5.17M -> 5.09M cycles, 180M -> 170M DRAM
# words); im2col must run before
# systolic, whose pattern it produces. Fusion runs for systolic targets too: the backend
# maps a fused atom to the array plus a vector epilogue, saving the bias/activation DRAM
# round trips (benchmarks/systolic.py: squeezenet 1.80x less DRAM traffic on 32x32).
PLANS: dict[str, tuple[Phase, ...]] = {
    "gpu": (Phase("affine", ("affine",)), Phase("layout", ("layout",), iter_limit=12), Phase("algebra", ("algebra",), iter_limit=8),
            Phase("fusion", ("fusion",)), Phase("relayout", ("layout-join",))),
    "systolic": (Phase("affine", ("affine",)), Phase("layout", ("layout",), iter_limit=16, time_limit=30.0),
                 Phase("fusion", ("fusion",)),
                 Phase("relayout", ("layout-join",)), Phase("im2col", ("im2col",), iter_limit=16),
                 Phase("systolic", ("systolic",))),
}


def default_plan(target) -> tuple[Phase, ...]:
    """The default phases for a Target (or target kind)."""
    kind = getattr(target, "kind", target)
    return PLANS[kind]


def saturate(eg, rules=None, library: RuleLibrary | None = None, iter_limit: int = 30,
             node_limit: int = 100_000, time_limit: float = 10.0, progress=None,
             regions=None) -> dict:
    """Saturate `eg` (an apsat EGraph) and return the report.

    rules: ruleset names or rule-file paths run as one phase under the given limits;
    None runs the target's default plan (phases whose ruleset no file defines are
    listed as skipped, with the reason). progress: optional callable(phase name).
    Report: {"phases": [{"phase", "rulesets", "iterations", "stop_reason", "nodes",
    "classes", "seconds", "rule_matches", "node_limit", "overshoot", "last_burst"} ...],
    "skipped": [...], "seconds", "nodes", "classes", "overshoot"}. A phase's "overshoot"
    is how many e-nodes it ended over its node limit (0 when under; EGraph.run keeps it 0
    unless a burst far from the limit grew more than twice its prediction) and
    "last_burst" the {"iterations", "nodes_added", "match_limit"} of its last burst; the
    report's "overshoot" is the largest of the phases'.
    regions: a Program already added to `eg`: saturate it region by region, each distinct
    region once (apsat.rules.regions); the report then has "regions" (counts, reuse rate)
    and "phases" summed over the distinct regions."""
    library = library or getattr(eg, "library", None) or RuleLibrary()
    eg.library = library
    if regions is not None:
        return _saturate_by_regions(eg, regions, rules, library, iter_limit, node_limit, time_limit, progress)
    if rules is None:
        plan = default_plan(eg.target)
    else:
        plan = (Phase("rules", tuple(library.resolve(rules)), iter_limit, node_limit, time_limit),)
    start = time.perf_counter()
    phases, skipped = [], []
    for phase in plan:
        missing = [r for r in phase.rulesets if r not in library.rulesets]
        if missing:
            skipped.append({"phase": phase.name, "reason": f"no rule file defines {', '.join(missing)}"})
            continue
        if progress:
            progress(phase.name)
        library.load_into(eg, phase.rulesets)
        run = eg.run(list(phase.rulesets), iter_limit=phase.iter_limit,
                     node_limit=phase.node_limit, time_limit=phase.time_limit)
        nodes, classes = eg.size()
        phases.append({"phase": phase.name, "rulesets": list(phase.rulesets),
                       "iterations": run["iterations"], "stop_reason": run["stop_reason"],
                       "nodes": nodes, "classes": classes, "seconds": run["seconds"],
                       "rule_matches": run["rule_matches"], "node_limit": phase.node_limit,
                       "overshoot": run["overshoot"], "last_burst": run["last_burst"]})
    nodes, classes = eg.size()
    return {"phases": phases, "skipped": skipped, "seconds": round(time.perf_counter() - start, 4),
            "nodes": nodes, "classes": classes, "overshoot": max((p["overshoot"] for p in phases), default=0)}


def _saturate_by_regions(eg, program, rules, library, iter_limit, node_limit, time_limit, progress) -> dict:
    from apsat.rules.regions import saturate_regions

    start = time.perf_counter()
    if progress:
        progress("regions")
    stats = saturate_regions(eg, program, lambda teg: saturate(
        teg, rules, library, iter_limit, node_limit, time_limit))
    rep = stats.pop("template_report")
    nodes, classes = eg.size()
    return {"phases": rep["phases"], "skipped": rep["skipped"], "regions": stats,
            "seconds": round(time.perf_counter() - start, 4), "nodes": nodes, "classes": classes,
            "overshoot": rep.get("overshoot", 0)}
