"""ONNX nodes the language does not cover, imported as opaque calls that onnxruntime runs
alone: the node kept whole (serialised), its constant inputs kept with it, its output
shapes those onnx inferred (a shape that depends on input values is refused by name)."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from apsat.errors import ModelError, ShapeError
from apsat.frontend.folding import Const
from apsat.frontend.limits import check_dims
from apsat.frontend.node_shapes import VALUE_DEPENDENT_SHAPES
from apsat.frontend.reading import first_line
from apsat.lang.program import OpaqueNode


def opaque_terms(imp, where: str, node, ins) -> None:
    """One `opaque` term per used output of `node` (its inputs `ins`: terms and
    constants), in the importer `imp`'s environment; onnxruntime runs the node alone.
    ModelError naming the node (`where`) when an output's shape is unknown."""
    args, arg_inputs, constants, types = [], [], {}, []
    for pos, (name, v) in enumerate(zip(node.input, ins)):
        if not name:
            types.append(0)
            continue
        if isinstance(v, Const):
            constants[pos] = np.asarray(v.value)
            types.append(helper.np_dtype_to_tensor_dtype(constants[pos].dtype))
        else:
            args.append(v)
            arg_inputs.append(pos)
            types.append(imp.info.get(name, (onnx.TensorProto.FLOAT, None))[0] or onnx.TensorProto.FLOAT)
    opsets = tuple(sorted(imp.opsets.items()))
    for k, name in enumerate(node.output):
        if not name or not imp.is_used(name):
            continue
        elem, dims = imp.info.get(name, (0, None))
        if dims is None:
            known = node.domain in ("", "ai.onnx") or onnx.defs.has(node.op_type, node.domain)
            what = "no lowering" if known else f"unknown op (domain {node.domain!r})"
            why = ("depends on the input values (apsat needs static shapes)"
                   if node.op_type in VALUE_DEPENDENT_SHAPES else
                   "cannot be determined (neither onnx's inference nor a run of the node says)")
            raise ModelError(f"{where}: {what}, and the shape of its output {name!r} {why}")
        check_dims(where, f"output {name!r}", dims)
        imp.opaque_nodes[name] = OpaqueNode(
            node=node.SerializeToString(), arg_inputs=tuple(arg_inputs), constants=constants,
            input_types=tuple(types), output_index=k,
            output_type=elem or onnx.TensorProto.FLOAT, opsets=opsets)
        try:
            imp.env[name] = imp.b.make("opaque", name, tuple(args), tuple(dims))
        except ShapeError as e:
            raise ModelError(f"{where}: {first_line(e)}") from None
