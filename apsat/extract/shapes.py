"""Access shapes of the e-classes of a serialised e-graph, for cost models and decoding.

One source of shapes: egglog derives the access shape of every e-class during saturation
(language.egg, shape_rules.egg; a class with two shapes is refused there), and
EGraph.serialize exports them with the classes, `class_data[c]["shape"]` =
[[iterated dims], [item dims]]. This module reads and checks that field;
ExtractionGraph.from_json calls it, so `graph.shapes` is filled when the graph is read.
Why no Python pass over the e-classes any more: it repeated egglog's work with the
registry's Python rules, in twice the time (ResNet-50 saturated for systolic:32x32, 40k
classes: 0.79 s against 0.27 s to export and 0.06 s to read here). Tests cross-check the
two rule sets on saturated e-graphs (tests/egraph/test_serialize.py).

A bare extraction-gym file carries no shapes: `graph.shapes` stays None and the cost
models that price nodes by their sizes refuse it in one line (workload.needs_shapes).
"""
from __future__ import annotations

from apsat.errors import ExtractionError

SHAPE_KEY = "shape"


def read_shapes(class_data: dict) -> dict | None:
    """Class id -> ((iterated dims), (item dims)) for every class whose class_data entry
    has a "shape"; None when none has (a file written by another tool). ExtractionError, one
    line, for a shape that is not two lists of non-negative ints."""
    shapes = {}
    for cls, data in class_data.items():
        value = data.get(SHAPE_KEY) if isinstance(data, dict) else None
        if value is not None:
            shapes[cls] = _shape(cls, value)
    return shapes or None


def _shape(cls: str, value) -> tuple[tuple[int, ...], tuple[int, ...]]:
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(
            isinstance(part, (list, tuple)) and all(type(d) is int and d >= 0 for d in part)
            for part in value):
        return tuple(value[0]), tuple(value[1])
    text = repr(value)
    raise ExtractionError(f"class {cls}: shape must be [[iterated dims], [item dims]] of "
                     f"non-negative ints, not {text if len(text) <= 60 else text[:57] + '...'}")

