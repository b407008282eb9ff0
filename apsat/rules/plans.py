"""The saturation plans: each target's phases, in order, with their limits.

Which rulesets a phase runs is declared with the rules, not here: a rule file's
`(ruleset NAME :phase PHASE)` joins NAME to PHASE in every plan that has that phase
(apsat/rules/loader.py checks the name), and a built-in ruleset that declares no phase is a
loader error. `joined(phase, phase_of)` fills a phase from those declarations.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

# A phase's safety-net time limit: well above the slowest phase of the light zoo (layout on
# DenseNet-121 for systolic, 8.7 s here), so that a busy or slow machine does not change
# where a plan stops. The iteration limits below are what stops the long phases.
DEFAULT_TIME_LIMIT = 120.0


@dataclass(frozen=True)
class Phase:
    """One step of a plan: `rulesets` run together under these limits (memory_limit: MiB
    of resident memory, None for none)."""

    name: str
    rulesets: tuple[str, ...] = ()
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
# The precision rules join no plan: they run where a precision is asked, on the e-graph of
# the float32 program the plan chose (apsat/pipeline/precision.py says why).
# The phases of each target's plan, in order, with their limits; the rulesets of a phase
# are those whose rule file declares `(ruleset NAME :phase PHASE)` (apsat/rules/loader.py),
# in the order the files load (built-ins by file name, then the user's).
PLANS: dict[str, tuple[Phase, ...]] = {
    "gpu": (Phase("affine"), Phase("layout", iter_limit=12), Phase("algebra", iter_limit=8), Phase("fusion"),
            Phase("relayout"), Phase("merge", iter_limit=9, whole=True)),
    "systolic": (Phase("affine"), Phase("layout", iter_limit=16), Phase("fusion"), Phase("relayout"),
                 Phase("im2col", iter_limit=16), Phase("systolic")),
}
# A ruleset that joins no plan on purpose (tiling: exploration that grows without bound)
# declares `:phase on-request`, and runs only when named (`rules=`, `--rules`).
ON_REQUEST = "on-request"
PHASE_NAMES = tuple(dict.fromkeys(p.name for plan in PLANS.values() for p in plan))


def joined(phase: Phase, phase_of: dict[str, str]) -> Phase:
    """`phase` with the rulesets that declare it (`phase_of`: ruleset -> phase, in load order)."""
    return dataclasses.replace(phase, rulesets=tuple(r for r, p in phase_of.items() if p == phase.name))

