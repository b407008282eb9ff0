"""Interactive exploration of e-graphs (Jupyter): drawing, stepping, comparing.

See apsat.explore.view for the objects and apsat.explore.render for the drawing.
"""
from apsat.explore.view import (Comparison, EClassInfo, EGraphView, StepReport, compare, eclass, step,
                                view)

__all__ = ["view", "step", "eclass", "compare", "EGraphView", "StepReport", "EClassInfo", "Comparison"]
