"""Exports past protobuf's 2 GB limit: weights written as external data beside the .onnx.

A model whose weights pass EXTERNAL_PAST bytes cannot be one serialised protobuf. Its
export (apsat.backends.onnx.export_onnx with `arrays`) writes each large constant as a
stub, an initializer marked external with no bytes, and keeps the array itself (a
memory-mapped original weight, or the one array folding made) in `arrays`: no weight is
copied into the protobuf. `save_external` then streams the arrays into one data file
beside the model (`MODEL.onnx.data`, each tensor 4096-byte aligned, as onnx's
`save_model(..., save_as_external_data=True, all_tensors_to_one_file=True)` lays it out),
points each stub at its bytes, saves the model and checks it by path with onnx.checker.

While the export's passes run, `reading(arrays)` lets them read a stub's value
(apsat.backends.onnx.peep.const).
"""
from __future__ import annotations

import contextlib
import contextvars
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

EXTERNAL_BYTES = 1 << 16          # a constant past this is a stub (with `arrays`)
EXTERNAL_PAST = 3 * 2**29         # 1.5 GiB of weights: the export writes external data
ALIGN = 4096
_ARRAYS: contextvars.ContextVar[dict] = contextvars.ContextVar("apsat_export_arrays", default={})


def external_stub(name: str, a: np.ndarray) -> TensorProto:
    """An initializer for `a` that holds no bytes: its data lies outside the model."""
    t = TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(a.dtype), dims=list(a.shape),
                    data_location=TensorProto.EXTERNAL)
    t.external_data.add(key="location", value="")
    return t


@contextlib.contextmanager
def reading(arrays: dict):
    """Stubs' arrays visible to `stub_value` within the block."""
    token = _ARRAYS.set(arrays)
    try:
        yield
    finally:
        _ARRAYS.reset(token)


def stub_value(t: TensorProto) -> np.ndarray | None:
    """The array behind a stub made in the current `reading` block, else None."""
    if t.data_location != TensorProto.EXTERNAL:
        return None
    return _ARRAYS.get().get(t.name)


def weight_bytes(weights: dict) -> int:
    """The bytes of a model's weights (name -> array)."""
    return sum(int(np.asarray(a).nbytes) for a in weights.values())


def save_external(proto: onnx.ModelProto, path: Path, arrays: dict) -> None:
    """Write every stub's array into `path`.data, point the stubs at their bytes, save
    `proto` at `path` and check it there (onnx.checker by path, shapes inferred)."""
    path = Path(path)
    data = path.with_name(path.name + ".data")
    with open(data, "wb") as f:
        for t in proto.graph.initializer:
            if t.data_location != TensorProto.EXTERNAL:
                continue
            a = np.ascontiguousarray(arrays[t.name])
            offset = f.tell() + (-f.tell() % ALIGN)
            f.seek(offset)
            f.write(memoryview(a.reshape(-1)).cast("B"))
            del t.external_data[:]
            for key, value in (("location", data.name), ("offset", str(offset)), ("length", str(a.nbytes))):
                t.external_data.add(key=key, value=value)
    onnx.save(proto, str(path))
    onnx.checker.check_model(str(path), full_check=True)
