"""The ONNX graph under construction and the values the exporter passes between terms.

A `Val` is a term's value as the exporter holds it: an ONNX value (or, for work on weights
only, a numpy constant) plus a *lazy layout*. Logical axis i of the term is physical axis
`perm[i]` of the ONNX value, or, where `perm[i]` is None, a size-1 axis the value does not
have; a physical axis no entry names has size 1. A physical dim of 1 under a larger
logical dim is a broadcast still to happen. So transposes, squeezes, inserted axes and
broadcasts cost no node until a consumer needs the value in one exact layout, and an NHWC
chain whose every conv wants NCHW never transposes at all: each conv reads its operand
in the physical layout the previous one wrote.

`Builder` collects nodes and initializers, names values uniquely, and shares equal small
constants.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from apsat.backends.onnx.external import EXTERNAL_BYTES, external_stub


INTEGER_TYPES = {TensorProto.INT64, TensorProto.INT32, TensorProto.INT16, TensorProto.INT8,
                 TensorProto.UINT64, TensorProto.UINT32, TensorProto.UINT16, TensorProto.UINT8,
                 TensorProto.BOOL}


@dataclass(frozen=True, eq=False)
class Val:
    """A term's value: ONNX value `name` (None for a constant `array`) with physical dims
    `dims`, read through `perm` (logical axis -> physical axis or None) and broadcast to
    the logical dims `shape`."""

    name: str | None
    dims: tuple
    perm: tuple
    shape: tuple
    array: np.ndarray | None = None

    @property
    def is_const(self) -> bool:
        return self.array is not None

    def logical_array(self) -> np.ndarray:
        """A constant's value in logical layout, broadcast (a read-only view)."""
        return np.broadcast_to(self.aligned_array(), self.shape)

    def aligned_array(self) -> np.ndarray:
        """A constant's value in logical axis order, size-1 where broadcast."""
        present = [p for p in self.perm if p is not None]
        a = np.transpose(self.array, present + [i for i in range(self.array.ndim) if i not in present])
        a = a.reshape([self.array.shape[p] if p is not None else 1 for p in self.perm])
        return a

    @property
    def identity(self) -> bool:
        """The physical value is already in logical layout (perhaps with broadcast dims)."""
        return self.perm == tuple(range(len(self.dims)))

    @property
    def full(self) -> bool:
        """No broadcast pending: physical dims cover the logical ones."""
        return tuple(self.dims[p] if p is not None else 1 for p in self.perm) == self.shape


def tensor_val(name: str, dims: tuple) -> Val:
    """An ONNX value in logical layout."""
    dims = tuple(dims)
    return Val(name, dims, tuple(range(len(dims))), dims)


def const_val(array: np.ndarray, shape: tuple | None = None) -> Val:
    """A constant (float32 unless given otherwise) broadcast to `shape` (its own dims)."""
    a = np.asarray(array)
    return Val(None, a.shape, tuple(range(a.ndim)), tuple(shape if shape is not None else a.shape), a)


class Builder:
    """Nodes, initializers and names of the graph being written."""

    def __init__(self, arrays: dict | None = None):
        self.nodes: list = []
        self.initializers: dict[str, TensorProto] = {}
        # With `arrays`, a constant past EXTERNAL_BYTES is an external-data stub whose array
        # goes here (the export of a model past protobuf's 2 GB: apsat.backends.onnx.external).
        self.arrays = arrays
        self.domains: set[str] = set()
        # the element type values are written in: float32, or the program's half type,
        # which apsat/backends/onnx/retype.py gives the graph once it is written
        self.float_type = TensorProto.FLOAT
        self._count = 0
        self._shared: dict[bytes, str] = {}
        self._reshaped: dict[str, tuple] = {}     # Reshape output -> (its input, input dims)
        self._cast_from: dict[str, tuple] = {}    # Cast output -> (its input, input type)

    def fresh(self, hint: str) -> str:
        """A value name not used before (`hint` says what it is)."""
        self._count += 1
        return f"apsat_{self._count}_{hint}"

    def op(self, op_type: str, inputs: list, domain: str = "", outputs: int = 1, hint: str = "", **attrs):
        """Append a node; returns its output name (a list when `outputs` > 1). None in
        `inputs` is an omitted optional input."""
        names = [self.fresh(hint or op_type.lower()) for _ in range(outputs)]
        node = helper.make_node(op_type, ["" if i is None else i for i in inputs], names,
                                name=names[0], domain=domain or None,
                                **{k: v for k, v in attrs.items() if v is not None})
        self.nodes.append(node)
        if domain:
            self.domains.add(domain)
        return names if outputs > 1 else names[0]

    def const(self, array, hint: str = "const", dtype=np.float32) -> str:
        """An initializer holding `array`; equal constants are written once."""
        a = np.asarray(array, dtype=dtype)
        stub = self.arrays is not None and a.nbytes > EXTERNAL_BYTES
        if stub:     # kept as it lies (a view, a memmap): written out one at a time on save
            key = ("view", a.__array_interface__["data"][0], a.shape, a.strides, a.dtype.str)
        else:
            a = np.ascontiguousarray(a)
            key = hashlib.sha1(a.dtype.str.encode() + repr(a.shape).encode() + a.tobytes()).digest()
        if key not in self._shared:
            name = self.fresh(hint)
            if stub:
                self.initializers[name] = external_stub(name, a)
                self.arrays[name] = a        # holds the buffer, so its address stays this key's
            else:
                self.initializers[name] = numpy_helper.from_array(a, name)
            self._shared[key] = name
        return self._shared[key]

    def value_of(self, name: str) -> np.ndarray | None:
        """The array of an initializer written here, None for any other value."""
        if self.arrays is not None and name in self.arrays:
            return self.arrays[name]
        t = self.initializers.get(name)
        return None if t is None else numpy_helper.to_array(t)

    def cast(self, name: str, to: int, elem: int | None = None) -> str:
        """`name` (of element type `elem`, where known) cast to element type `to`. A
        constant is cast here, not by a node; a value cast to float and back is the
        value; an integer cast to float and then to bool is cast to bool once (nonzero
        either way)."""
        a = self.value_of(name)
        if a is not None:
            dtype = helper.tensor_dtype_to_np_dtype(to)
            return self.const(a.astype(dtype), "const", dtype)
        src, src_elem = self._cast_from.get(name, (None, None))
        if src_elem == to:
            return src                     # a boolean (or integer) cast to float and back
        if to == TensorProto.BOOL and src_elem in INTEGER_TYPES:
            name = src
        out = self.op("Cast", [name], to=to)
        if elem is not None:
            self._cast_from[out] = (name, elem)
        return out

    def ints(self, values) -> str:
        """An int64 1-D constant (shapes, axes, pads)."""
        return self.const(np.asarray(list(values), dtype=np.int64), "ints", np.int64)

    def reshape(self, name: str, dims, src_dims=None) -> str:
        """`name` reshaped to `dims` (static, no -1 when `src_dims` is given). With the
        dims of `name` known (`src_dims`), a reshape back to a value's own dims reads that
        value, so a split and its merge around a node cost nothing (the first Reshape is
        dropped when nothing else reads it)."""
        dims = tuple(int(d) for d in dims)
        if name in self._reshaped:             # a Reshape of a Reshape reads the first's input
            name, src_dims = self._reshaped[name]
        if src_dims is not None and tuple(src_dims) == dims:
            return name
        out = self.op("Reshape", [name, self.ints(dims)])
        if src_dims is not None and -1 not in dims:
            self._reshaped[out] = (name, tuple(src_dims))
        return out

    def cast_from(self, name: str) -> tuple:
        """(input, input element type) when `name` is a Cast written with its input's type
        known, else (None, None)."""
        return self._cast_from.get(name, (None, None))

    def reshaped_from(self, name: str):
        """(input, input dims) when `name` is a Reshape written with its input's dims
        known, else None."""
        return self._reshaped.get(name)

    def transpose(self, name: str, perm) -> str:
        return self.op("Transpose", [name], perm=list(perm))


# ---- bringing a value into one layout ---------------------------------------------------------

def in_layout(b: Builder, v: Val, order: tuple) -> Val:
    """`v` with physical axes in logical order `order` (a permutation of v's logical axes)
    and rank equal to the logical rank; broadcast dims stay size 1. No node when it is
    so already."""
    order = tuple(order)
    if v.is_const:
        a = np.transpose(v.aligned_array(), order)
        return Val(None, a.shape, _inverse(order), v.shape, a)
    present = [v.perm[i] for i in order if v.perm[i] is not None]
    rest = [p for p in range(len(v.dims)) if p not in present]
    name, dims = v.name, v.dims
    if needs_transpose(v, order):       # size-1 axes move by the Reshape below, not a Transpose
        name = b.transpose(name, present + rest)
        dims = tuple(dims[p] for p in present + rest)
    want = tuple(v.dims[v.perm[i]] if v.perm[i] is not None else 1 for i in order)
    if dims != want:
        name = b.reshape(name, want, dims)
    return Val(name, want, _inverse(order), v.shape)


def needs_transpose(v: Val, order: tuple) -> bool:
    """Bringing `v` into logical order `order` moves data (not only size-1 axes)."""
    present = [v.perm[i] for i in order if v.perm[i] is not None]
    rest = [p for p in range(len(v.dims)) if p not in present]
    moved = [p for p in present + rest if v.dims[p] != 1]
    return moved != sorted(moved)


def aligned(b: Builder, v: Val) -> str:
    """An ONNX value of `v` in logical layout, broadcast dims left size 1 (ONNX's
    numpy broadcasting completes them)."""
    v = in_layout(b, v, tuple(range(len(v.shape))))
    return v.name if not v.is_const else b.const(v.array)


def dense(b: Builder, v: Val) -> str:
    """An ONNX value of `v` exactly: logical layout and every dim."""
    if v.is_const:
        return b.const(v.logical_array())
    name = aligned(b, v)
    if not v.full:
        name = b.op("Expand", [name, b.ints(v.shape)])
    return name


def physical(b: Builder, v: Val) -> str:
    """The ONNX value behind `v` as it is (a constant written as an initializer)."""
    return b.const(v.array) if v.is_const else v.name


def _inverse(order: tuple) -> tuple:
    """perm such that logical axis i is physical axis perm[i], for physical order `order`."""
    inv = [0] * len(order)
    for phys, logical in enumerate(order):
        inv[logical] = phys
    return tuple(inv)

