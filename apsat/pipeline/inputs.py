"""Inputs to run a model on: seeded random ones that follow each input's declared element
type and use, or the user's own from an .npz file.

`random_inputs(model, seed)` gives float inputs N(0, 1); an integer input that indexes a
table (a Gather's indices, through casts and reshapes: token ids, position and segment
ids) values below that table's extent; an input named like a mask (`attention_mask`,
`mask`) ones with the last quarter of each row zero, as padding; booleans a fair coin;
any other integer input values in [0, 4). `load_inputs(path, model)` reads an .npz whose
keys are the model's inputs and checks names, shapes and types.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from apsat.errors import ApsatError

# Ops that pass an index tensor on unchanged in value: an input reaching a Gather's
# indices through them still indexes the gathered table.
_PASS_THROUGH = {"Cast", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Identity", "Expand"}
_INDEXING = {"Gather": 1, "GatherElements": 1, "GatherND": 1}
OTHER_INT_RANGE = 4


def random_inputs(model, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs for a Model (its `.inputs`, `.input_types`, `.onnx`) or a ModelProto
    with static input dims (see the module doc for the values)."""
    proto = model.onnx if hasattr(model, "onnx") else model
    shapes = model.inputs if hasattr(model, "inputs") else _declared_shapes(proto)
    types = {vi.name: vi.type.tensor_type.elem_type for vi in proto.graph.input}
    bounds = index_bounds(proto)
    rng = np.random.default_rng(seed)
    out = {}
    for name, dims in shapes.items():
        dtype = helper.tensor_dtype_to_np_dtype(types.get(name) or onnx.TensorProto.FLOAT)
        out[name] = _one_input(name, tuple(dims), np.dtype(dtype), bounds.get(name), rng)
    return out


def _one_input(name: str, dims: tuple, dtype: np.dtype, bound: int | None, rng) -> np.ndarray:
    """One input's values (see the module doc)."""
    if "mask" in name.lower():
        return padding_mask(dims).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, dims).astype(bool)
    if dtype.kind in "iu":
        return rng.integers(0, bound or OTHER_INT_RANGE, dims).astype(dtype)
    return rng.standard_normal(dims, dtype=np.float32).astype(dtype, copy=False)


def padding_mask(dims: tuple) -> np.ndarray:
    """Ones, with the last quarter of the last axis zero (at least one position kept)."""
    mask = np.ones(dims, dtype=np.int64)
    if dims:
        keep = max(1, dims[-1] - dims[-1] // 4)
        mask[..., keep:] = 0
    return mask


def index_bounds(proto) -> dict[str, int]:
    """Graph input -> the smallest extent of a table it indexes (a Gather's indices,
    reached through _PASS_THROUGH ops), for inputs that index a constant table."""
    g = proto.graph
    dims = {i.name: tuple(i.dims) for i in g.initializer}
    for node in g.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            dims[node.output[0]] = tuple(node.attribute[0].t.dims)
    origin = {vi.name: vi.name for vi in g.input if vi.name not in dims}
    bounds: dict[str, int] = {}
    for node in g.node:
        if node.op_type in _PASS_THROUGH and node.input and node.input[0] in origin:
            for o in node.output:
                origin[o] = origin[node.input[0]]
        pos = _INDEXING.get(node.op_type)
        if pos is not None and len(node.input) > pos and node.input[pos] in origin:
            table = dims.get(node.input[0])
            if table:
                axis = next((a.i for a in node.attribute if a.name == "axis"), 0) % len(table)
                src = origin[node.input[pos]]
                bounds[src] = min(bounds.get(src, table[axis]), table[axis])
    return bounds


def _declared_shapes(proto) -> dict[str, tuple]:
    inits = {i.name for i in proto.graph.initializer}
    return {vi.name: tuple(d.dim_value for d in vi.type.tensor_type.shape.dim)
            for vi in proto.graph.input if vi.name not in inits}


def load_inputs(path, model) -> dict[str, np.ndarray]:
    """The arrays of an .npz file for `model`'s inputs: every input present, no other key,
    each of the input's shape, cast to its declared element type. ApsatError otherwise."""
    path = Path(path)
    if not path.is_file():
        raise ApsatError(f"{path}: no such file")
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except Exception as e:            # not a zip, a pickled object array, a bad member
        raise ApsatError(f"{path}: not a readable .npz of arrays ({type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''})") from None
    return check_inputs(arrays, model, str(path))


def check_inputs(arrays: dict, model, where: str) -> dict[str, np.ndarray]:
    """`arrays` for `model`'s inputs: every input present, no other key, each of the
    input's shape, cast to its declared element type (same kind of number only);
    ApsatError naming `where` otherwise."""
    missing, extra = sorted(set(model.inputs) - set(arrays)), sorted(set(arrays) - set(model.inputs))
    if missing or extra:
        raise ApsatError(f"{where}: inputs missing {missing}, unknown keys {extra}; "
                         f"the model takes {sorted(model.inputs)}")
    types = getattr(model, "input_types", {})
    out = {}
    for name, dims in model.inputs.items():
        arr = np.asarray(arrays[name])
        if arr.shape != tuple(dims):
            raise ApsatError(f"{where}: input {name!r} has shape {arr.shape}, the model takes {tuple(dims)}")
        want = np.dtype(helper.tensor_dtype_to_np_dtype(types.get(name) or onnx.TensorProto.FLOAT))
        if arr.dtype != want and not np.can_cast(arr.dtype, want, casting="same_kind"):
            raise ApsatError(f"{where}: input {name!r} is {arr.dtype}, the model takes {want}")
        out[name] = arr.astype(want, copy=False)
    return out


def given_shapes(inputs, model) -> dict | None:
    """The dims of the user's inputs (arrays or an .npz) that are the model's graph inputs:
    they fix the symbolic dims, as an example input does for torch.compile; None when none
    are given."""
    if inputs is None or hasattr(model, "program"):
        return None
    proto = model if isinstance(model, onnx.ModelProto) else onnx.load(str(model), load_external_data=False)
    names = {vi.name for vi in proto.graph.input} - {i.name for i in proto.graph.initializer}
    return {k: v for k, v in (_array_shapes(inputs) or {}).items() if k in names} or None


def _array_shapes(inputs) -> dict | None:
    """Name -> dims of the arrays given (a dict or an .npz path); None for a file that
    does not read."""
    if isinstance(inputs, (str, Path)):
        try:
            with np.load(inputs, allow_pickle=False) as data:
                return {k: data[k].shape for k in data.files}
        except (OSError, ValueError):
            return None                # load_inputs says what is wrong with the file
    return {k: np.shape(v) for k, v in dict(inputs).items()}
