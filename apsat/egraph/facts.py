"""The facts the driver asserts about an added program's tensors and opaque calls.

Split out of driver.py (which keeps the e-graph itself): the egglog statements saying each new
tensor's dims, weight order and element type, and each new opaque call's element type, after
checking that a tensor added before keeps its dims and type.
"""
from __future__ import annotations

from apsat.lang.syntax import egg_ints, egg_string
from apsat.errors import ShapeError
from apsat.lang import dtypes
from apsat.lang.dtypes import TypeMismatch


def tensor_facts(eg, program) -> list[str]:
    """The egglog facts about `program`'s tensors that e-graph `eg` has not seen (shapes,
    weight order, element types) and its new opaque calls' types. ShapeError (TypeMismatch)
    for a tensor added before with other dims (another type)."""
    for name, dims in program.tensor_shapes.items():
        if eg.tensor_shapes.get(name, dims) != dims:
            raise ShapeError(f"tensor {name!r} was added with shape {eg.tensor_shapes[name]}, now {dims}")
    for name, dtype in program.tensor_types.items():
        if eg.tensor_types.get(name, dtype) != dtype:
            raise TypeMismatch(f"tensor {name!r} was added with type {eg.tensor_types[name]}, now {dtype}")
    new = [n for n in program.tensor_shapes if n not in eg.tensor_shapes]
    facts = [f"(tensor-shape {egg_string(n)} {egg_ints(program.tensor_shapes[n])})" for n in new]
    # the order weights were added in: the order merged siblings concatenate them in
    facts += [f"(weight-order {egg_string(n)} {len(eg.tensor_shapes) + i})"
              for i, n in enumerate(new) if n in program.weights]
    facts += [f"(tensor-type {egg_string(n)} {dtypes.CODES[program.tensor_types[n]]})"
              for n in new if n in program.tensor_types]
    facts += [f"(opaque-type {egg_string(k)} {node.output_type})" for k, node in program.opaque_nodes.items()
              if k not in eg.opaque_nodes and node.output_type in dtypes.NAMES]
    return facts
