"""Weights stored as external data: memory-mapped where they lie, never copied.

A model past protobuf's 2 GB limit keeps its weights in files beside the .onnx (onnx's
`save_model(..., save_as_external_data=True)`, torch's exporter). `onnx.load` would read
each into the ModelProto (one copy) and the importer would copy it again into an array;
here the file is read with `load_external_data=False` and each large external tensor
becomes a read-only `np.memmap` of its bytes (`open_external`), which the importer uses
as the weight itself, the verification feeds to onnxruntime as a graph input (no copy
either: apsat.pipeline.zoo), and the export reads. The ModelProto keeps the tensor's
external reference and no bytes.

A small external tensor (at most SMALL_BYTES: a shape, an axis list) is read into the
ModelProto as onnx.load would, so shape inference and folding see its value.
"""
from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from apsat.errors import ModelError

SMALL_BYTES = 1 << 16
EXTERNAL = onnx.TensorProto.EXTERNAL


def open_external(proto: onnx.ModelProto, base: Path, label: str) -> dict[str, np.ndarray]:
    """name -> read-only memmap of each large external initializer of `proto` (loaded
    with load_external_data=False from a file in `base`); small ones are read into the
    proto. ModelError (one line, naming the tensor) for a file that is missing, lies
    outside `base`, or is shorter than the tensor's bytes."""
    arrays = {}
    for t in proto.graph.initializer:
        if t.data_location != EXTERNAL:
            continue
        path, offset, dtype, shape = _where(t, base, label)
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes <= SMALL_BYTES:
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read(nbytes)
            t.ClearField("external_data")
            t.data_location = onnx.TensorProto.DEFAULT
            t.raw_data = data
        else:
            arrays[t.name] = np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape)
    return arrays


def _location(t: onnx.TensorProto) -> str:
    """The file an external tensor's bytes lie in, relative to the model ("" when unsaid)."""
    return next((e.value for e in t.external_data if e.key == "location"), "")


def _where(t: onnx.TensorProto, base: Path, label: str):
    """(file, offset, little-endian dtype, shape) of an external tensor, checked."""
    info = {e.key: e.value for e in t.external_data}
    prefix = f"{label}: " if label else ""
    location = _location(t)
    path = (base / location).resolve()
    if not location or base.resolve() not in path.parents:
        raise ModelError(f"{prefix}initializer {t.name!r}: external data location {location!r} "
                         "is not a file beside the model")
    if not path.is_file():
        raise ModelError(f"{prefix}initializer {t.name!r}: external data file {location!r} not found "
                         f"(expected at {path})")
    try:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).newbyteorder("<")
        offset = int(info.get("offset", 0))
    except (KeyError, TypeError, ValueError):
        raise ModelError(f"{prefix}initializer {t.name!r}: unreadable external data "
                         f"(type {t.data_type}, offset {info.get('offset')!r})") from None
    shape = tuple(int(d) for d in t.dims)
    need = math.prod(shape) * dtype.itemsize
    if offset < 0 or offset + need > path.stat().st_size or int(info.get("length", need)) < need:
        raise ModelError(f"{prefix}initializer {t.name!r}: external data file {location!r} holds "
                         f"{path.stat().st_size} bytes, fewer than the tensor's {need} at offset {offset}")
    return path, offset, dtype, shape


def data_files(path) -> list[Path]:
    """The external-data files a model file's initializers name (each once, in order;
    those that exist), read without loading them: what a result's content key hashes and
    a batch's memory limit counts beside the .onnx. The file is parsed once while it stays
    the same (size and modification time)."""
    path = Path(path)
    try:
        st = path.stat()
    except OSError:          # no model: its worker says why
        return []
    return list(_data_files(str(path), st.st_size, st.st_mtime_ns))


@functools.lru_cache(maxsize=64)
def _data_files(path: str, size: int, mtime_ns: int) -> tuple[Path, ...]:
    path = Path(path)
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception:        # not a model: its worker says why
        return ()
    out = []
    for t in proto.graph.initializer:
        if t.data_location == EXTERNAL:
            file = path.parent / _location(t)
            if _location(t) and file.is_file() and file not in out:
                out.append(file)
    return tuple(out)
