"""The public e-graph: the egglog driver (apsat.egraph.driver) with the target's phase
plans and the Jupyter views attached.

`apsat.EGraph` is this class. The driver below it knows egglog and limits only; plans
live in apsat.rules.saturate and drawings in apsat.explore, so the methods that reach them
are defined here, at the top layer, and the driver never imports upward.
"""
from __future__ import annotations

from apsat.egraph import driver
from apsat.rules.saturate import saturate as _saturate


class EGraph(driver.EGraph):
    """An e-graph over the access-pattern language (see apsat.egraph.driver.EGraph), which
    also saturates with the target's default plan and draws itself in Jupyter."""

    def saturate(self, rules=None, iter_limit: int | None = None, node_limit: int | None = None,
                 time_limit: float | None = None, progress=None, regions=None,
                 memory_limit: float | None = None) -> dict:
        """Saturate with `rules` (ruleset names or rule-file paths, one phase) or, without
        rules, the target's default phase plan; given limits cap every phase (None: each
        phase's own, see apsat.rules.saturate). Returns the saturation report. `regions`:
        a Program added earlier, to saturate region by region with reuse
        (apsat.rules.regions)."""
        return _saturate(self, rules, iter_limit=iter_limit, node_limit=node_limit,
                         time_limit=time_limit, progress=progress, regions=regions,
                         memory_limit=memory_limit)

    def view(self, root=None, depth: int | None = 2, max_classes: int = 150):
        """An EGraphView of the e-classes within `depth` child steps of `root` (a handle;
        None: every output), at most `max_classes`; shows itself as SVG in Jupyter."""
        from apsat.explore.view import view

        return view(self, root, depth, max_classes)

    def step(self, name: str, **limits):
        """Run one phase of the target's default plan (by phase name) or one ruleset and
        return a StepReport (sizes before/after, matches per rule, stop reason)."""
        from apsat.explore.view import step

        return step(self, name, **limits)

    def eclass(self, handle, cost=None):
        """EClassInfo: the members of `handle`'s e-class with shapes and own costs."""
        from apsat.explore.view import eclass

        return eclass(self, handle, cost)

    @property
    def added_terms(self) -> list:
        """Every term added so far (the programs' sub-terms), as the import wrote them."""
        return list(self._ids)

    def _repr_html_(self) -> str:
        # Small e-graphs draw whole; larger ones draw their outputs' neighbourhood.
        return self.view(None, depth=None if self.size()[0] <= 60 else 2)._repr_html_()
