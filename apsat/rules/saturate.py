"""The saturation driver: named phases with per-phase limits, a default plan per target.

A phase runs some rulesets under its own limits (iterations, e-nodes, seconds, MiB of
resident memory) through `EGraph.run`, which works in short bursts with a back-off
scheduler and checks the limits between bursts (egglog cannot interrupt an iteration).
`saturate(eg)` without `rules=` runs the target's default plan, every phase under the
smaller of its own limit and the caller's; with `rules=` it runs those rulesets as one
phase under the caller's limits.

Determinism: the plans stop on iteration and node limits (and saturation), which give the
same e-graph on any machine; their time limits (DEFAULT_TIME_LIMIT per phase) are safety
nets meant never to bind on the light zoo, and memory has no default limit.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from apsat.rules.library import RuleLibrary

# A phase's safety-net time limit: well above the slowest phase of the light zoo (layout on
# DenseNet-121 for systolic, 8.7 s here), so that a busy or slow machine does not change
# where a plan stops. The iteration limits below are what stops the long phases.
DEFAULT_TIME_LIMIT = 120.0
# What `saturate(rules=[...])` runs its one phase under when the caller gives no limit
# (unchanged since before the plans existed; tests and notebooks rely on them).
RULES_DEFAULTS = {"iter_limit": 30, "node_limit": 100_000, "time_limit": 10.0}


@dataclass(frozen=True)
class Phase:
    """One step of a plan: `rulesets` run together under these limits (memory_limit: MiB
    of resident memory, None for none)."""

    name: str
    rulesets: tuple[str, ...]
    iter_limit: int = 30
    node_limit: int = 100_000
    time_limit: float = DEFAULT_TIME_LIMIT
    memory_limit: float | None = None
    # Saturating by regions (apsat.rules.regions), the phase also runs once over the whole
    # e-graph after the regions: its matches span region boundaries (sibling products read
    # one shared input, and a shared term is where regions are cut).
    whole: bool = False

    def limits(self) -> dict:
        """The phase's four limits by keyword (as EGraph.run takes them)."""
        return {"iter_limit": self.iter_limit, "node_limit": self.node_limit,
                "time_limit": self.time_limit, "memory_limit": self.memory_limit}

    def capped(self, **caller) -> "Phase":
        """This phase under the caller's limits where the caller gives one (None leaves
        the phase's own): iterations, e-nodes and memory lowered to the caller's; the
        time limit, a safety net and not a tuned figure, replaced by the caller's, so a
        caller may give a big model more than DEFAULT_TIME_LIMIT."""
        own = self.limits()
        return dataclasses.replace(self, **{k: v if own[k] is None or k == "time_limit" else min(own[k], v)
                                            for k, v in caller.items() if v is not None})


# Why this order: "affine" first merges chains of per-channel scales and shifts (BatchNorm
# then a Caffe Scale layer) on the imported graph, where each chain exists once; layout and
# algebra then simplify what the importer wrote, so fusion
# and the hardware mappings then match the cleaned-up forms; layout runs again after
# fusion ("relayout", the layout-join ruleset): fusion builds its atoms under the
# importer's NCHW transposes, and layout/transpose-injective then joins them to the NHWC
# classes the first layout phase built, so convolutions read fused results without a
# transpose. Layout stops at 12 iterations for gpu: on DenseNet-121 it otherwise keeps
# composing transposes through the dense blocks' concatenations for 20+ iterations, at
# 0.5-0.9 s each. The systolic plan gives it 16 (DenseNet-121: 8.7 s here; the iteration
# count, not the machine's speed, stops it, DEFAULT_TIME_LIMIT being far above): its
# backend builds NHWC concatenations in place, and iterations 13-16 turn DenseNet's
# later dense-block concatenations NHWC (32x32: 5.17M -> 5.09M cycles, 180M -> 170M DRAM
# words); im2col must run before
# systolic, whose pattern it produces. Fusion runs for systolic targets too: the backend
# maps a fused atom to the array plus a vector epilogue, saving the bias/activation DRAM
# round trips (benchmarks/systolic.py: squeezenet 1.80x less DRAM traffic on 32x32).
PLANS: dict[str, tuple[Phase, ...]] = {
    "gpu": (Phase("affine", ("affine",)), Phase("layout", ("layout",), iter_limit=12), Phase("algebra", ("algebra",), iter_limit=8),
            Phase("fusion", ("fusion", "attention-fusion", "norm-fusion")), Phase("relayout", ("layout-join",)),
            Phase("merge", ("merge",), iter_limit=8, whole=True)),
    "systolic": (Phase("affine", ("affine",)), Phase("layout", ("layout",), iter_limit=16),
                 Phase("fusion", ("fusion", "attention-fusion", "norm-fusion")),
                 Phase("relayout", ("layout-join",)), Phase("im2col", ("im2col",), iter_limit=16),
                 Phase("systolic", ("systolic",))),
}


def default_plan(target) -> tuple[Phase, ...]:
    """The default phases for a Target (or target kind)."""
    kind = getattr(target, "kind", target)
    return PLANS[kind]


def saturate(eg, rules=None, library: RuleLibrary | None = None, iter_limit: int | None = None,
             node_limit: int | None = None, time_limit: float | None = None, progress=None,
             regions=None, memory_limit: float | None = None) -> dict:
    """Saturate `eg` (an apsat EGraph) and return the report.

    rules: ruleset names or rule-file paths run as one phase under the given limits
    (None: RULES_DEFAULTS, no memory limit); None runs the target's default plan, each
    phase under min(its own limit, the caller's) for each limit the caller gives, save
    the time limit, where the caller's replaces the phase's safety net (Phase.capped;
    phases whose ruleset no file defines are listed as skipped, with the reason).
    Limits: iterations, e-nodes in the whole e-graph, seconds and MiB of the process's
    resident memory, per phase; progress: optional callable(phase name).
    Report: {"phases": [{"phase", "rulesets", "iterations", "stop_reason", "limits",
    "nodes", "classes", "seconds", "rule_matches", "node_limit", "overshoot",
    "last_burst", "rss_mib"} ...], "skipped": [...], "seconds", "nodes", "classes",
    "overshoot"}. "stop_reason" is what ended the phase: "saturated", "iter_limit",
    "node_limit", "time_limit" or "memory_limit"; "limits" the limits it ran under
    ({"iter_limit", "node_limit", "time_limit", "memory_limit"}). A phase's "overshoot"
    is how many e-nodes it ended over its node limit (0 when under; EGraph.run keeps it 0
    unless a burst far from the limit grew more than twice its prediction) and
    "last_burst" the {"iterations", "nodes_added", "match_limit"} of its last burst; the
    report's "overshoot" is the largest of the phases'.
    regions: a Program already added to `eg`: saturate it region by region, each distinct
    region once (apsat.rules.regions); the report then has "regions" (counts, reuse rate)
    and "phases" summed over the distinct regions."""
    library = library or getattr(eg, "library", None) or RuleLibrary()
    eg.library = library
    caller = {"iter_limit": iter_limit, "node_limit": node_limit, "time_limit": time_limit,
              "memory_limit": memory_limit}
    if regions is not None:
        return _saturate_by_regions(eg, regions, rules, library, caller, progress)
    if rules is None:
        plan = tuple(phase.capped(**caller) for phase in default_plan(eg.target))
    else:
        given = {k: RULES_DEFAULTS[k] if v is None and k in RULES_DEFAULTS else v for k, v in caller.items()}
        plan = (Phase("rules", tuple(library.resolve(rules)), **given),)
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
        phases.append(_run_phase(eg, phase))
    nodes, classes = eg.size()
    return {"phases": phases, "skipped": skipped, "seconds": round(time.perf_counter() - start, 4),
            "nodes": nodes, "classes": classes, "overshoot": max((p["overshoot"] for p in phases), default=0)}


def _run_phase(eg, phase: Phase) -> dict:
    """Run one phase on `eg` (its rulesets loaded) and return its report entry."""
    run = eg.run(list(phase.rulesets), **phase.limits())
    nodes, classes = eg.size()
    return {"phase": phase.name, "rulesets": list(phase.rulesets),
            "iterations": run["iterations"], "stop_reason": run["stop_reason"], "limits": phase.limits(),
            "nodes": nodes, "classes": classes, "seconds": run["seconds"],
            "rule_matches": run["rule_matches"], "node_limit": phase.node_limit,
            "overshoot": run["overshoot"], "last_burst": run["last_burst"], "rss_mib": run["rss_mib"]}


def _saturate_by_regions(eg, program, rules, library, caller: dict, progress) -> dict:
    from apsat.rules.regions import saturate_regions

    start = time.perf_counter()
    if progress:
        progress("regions")
    stats = saturate_regions(eg, program, lambda teg: saturate(teg, rules, library, **caller))
    rep = stats.pop("template_report")
    phases = list(rep["phases"])
    for phase in default_plan(eg.target) if rules is None else ():
        if phase.whole and all(r in library.rulesets for r in phase.rulesets):
            if progress:
                progress(phase.name)
            library.load_into(eg, phase.rulesets)
            phases.append(dict(_run_phase(eg, phase.capped(**caller)), whole=True))
    nodes, classes = eg.size()
    return {"phases": phases, "skipped": rep["skipped"], "regions": stats,
            "seconds": round(time.perf_counter() - start, 4), "nodes": nodes, "classes": classes,
            "overshoot": rep.get("overshoot", 0)}
