"""Interactive exploration of e-graphs (Jupyter): drawing, stepping, comparing.

See apsat.explore.view for the objects and apsat.explore.render for the drawing.
"""
from apsat.explore.view import (Comparison, EClassInfo, EGraphView, PlanReport, StepReport, compare, eclass,
                                saturate_plan, step, view)

__all__ = ["view", "step", "saturate_plan", "eclass", "compare", "EGraphView", "StepReport", "PlanReport",
           "EClassInfo", "Comparison"]
