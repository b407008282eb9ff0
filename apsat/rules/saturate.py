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

import time

from apsat.rules.library import RuleLibrary, builtin_stamp
from apsat.rules.plans import DEFAULT_TIME_LIMIT, PLANS, Phase, joined

__all__ = ["saturate", "default_plan", "Phase", "DEFAULT_TIME_LIMIT", "RULES_DEFAULTS"]
# What `saturate(rules=[...])` runs its one phase under when the caller gives no limit
# (unchanged since before the plans existed; tests and notebooks rely on them).
RULES_DEFAULTS = {"iter_limit": 30, "node_limit": 100_000, "time_limit": 10.0}

def default_plan(target, library: RuleLibrary | None = None) -> tuple[Phase, ...]:
    """The default phases for a Target (or target kind), each with the rulesets of
    `library` (default: the built-in rules) that declare it; a phase none joins is kept
    with no rulesets (saturate lists it as skipped)."""
    kind = getattr(target, "kind", target)
    phase_of = (library or _builtin_library()).phase_of
    return tuple(joined(phase, phase_of) for phase in PLANS[kind])


_BUILTIN: dict = {}


def _builtin_library() -> RuleLibrary:
    """The built-in rules, read once per process and again when a file is edited."""
    stamp = builtin_stamp()
    if stamp not in _BUILTIN:
        _BUILTIN.clear()
        _BUILTIN[stamp] = RuleLibrary()
    return _BUILTIN[stamp]


def saturate(eg, rules=None, library: RuleLibrary | None = None, iter_limit: int | None = None,
             node_limit: int | None = None, time_limit: float | None = None, progress=None,
             regions=None, memory_limit: float | None = None) -> dict:
    """Saturate `eg` (an apsat EGraph) and return the report.

    rules: ruleset names or rule-file paths run as one phase under the given limits
    (None: RULES_DEFAULTS, no memory limit), unless they are all rule-file paths whose
    rulesets each declare a phase (`:phase`): those join the target's default plan and
    it runs (RuleLibrary.joins_plan); None runs the target's default plan, each
    phase under min(its own limit, the caller's) for each limit the caller gives, save
    the time limit, where the caller's replaces the phase's safety net (Phase.capped;
    phases no ruleset joins are listed as skipped, with the reason).
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
    if rules is None or library.joins_plan(rules):
        plan = tuple(phase.capped(**caller) for phase in default_plan(eg.target, library))
    else:
        given = {k: RULES_DEFAULTS[k] if v is None and k in RULES_DEFAULTS else v for k, v in caller.items()}
        plan = (Phase("rules", tuple(library.resolve(rules)), **given),)
    start = time.perf_counter()
    phases, skipped = [], []
    for phase in plan:
        if not phase.rulesets:
            skipped.append({"phase": phase.name, "reason": "no ruleset joins it"})
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
    for phase in default_plan(eg.target, library) if rules is None or library.joins_plan(rules) else ():
        if phase.whole and phase.rulesets:
            if progress:
                progress(phase.name)
            library.load_into(eg, phase.rulesets)
            phases.append(dict(_run_phase(eg, phase.capped(**caller)), whole=True))
    nodes, classes = eg.size()
    return {"phases": phases, "skipped": rep["skipped"], "regions": stats,
            "seconds": round(time.perf_counter() - start, 4), "nodes": nodes, "classes": classes,
            "overshoot": rep.get("overshoot", 0)}
