"""Symbolic dims of a model's inputs: which they are, and the representative value of each.

A dim declared by name (`batch_size`, `sequence_length`) that the user does not fix with
`input_shapes=` / `--input-shape` stays a symbol: the program is built, saturated and
priced at one representative value per symbol, and apsat.pipeline.generalise then finds
what every size in the chosen program is as a polynomial in the symbols, so that the
export keeps the model's signature.

The representative of a symbol is, unless the user names one (`--representative seq=64`),
a prime near a default for its role (batch 3, sequence 127, a past length 61, any other
31), moved on to the next prime while it equals a fixed dim of the model or another
symbol's value. Why primes that the model never uses: a rule that needs a size to divide
by a tile can then never fire on a symbolic dim (so what is extracted holds for every
value), and each size in the chosen program shows which symbols it came from.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from apsat.errors import ModelError
from apsat.lang.dims import is_prime

ROLE_DEFAULTS = {"batch": 3, "sequence": 127, "past": 61, "other": 31}
# the sizes optimize verifies at besides the representative: one is never a multiple of a tile
ROLE_CHECKS = {"batch": (1, 4), "sequence": (5, 40), "past": (1, 9), "other": (5, 40)}
_ROLE_WORDS = (("past", ("past", "cache", "total", "kv_len")),
               ("batch", ("batch", "bs")),
               ("sequence", ("seq", "length", "len", "token", "time", "frame", "step", "sentence")))


@dataclass(frozen=True)
class Symbol:
    """One symbolic dim: its name, role, the value the program is built at, whether the
    user chose it, and the other sizes verification checks."""

    name: str
    role: str
    value: int
    chosen: bool
    checks: tuple[int, ...]

    def describe(self) -> str:
        how = "given" if self.chosen else f"default for a {self.role} dim"
        return f"{self.name}={self.value} ({how})"


def role_of(name: str) -> str:
    """A symbol's role from its name: `N`, `B`, `batch_size` -> batch; `seq_len` ->
    sequence; `past_sequence_length` -> past; else other."""
    low = name.lower()
    if low in ("n", "b"):
        return "batch"
    for role, words in _ROLE_WORDS:
        if any(w in low for w in words):
            return role
    return "other"


def _next_prime(n: int) -> int:
    while not is_prime(n):
        n += 1
    return n


def choose(names: list[str], fixed_dims: set[int], given: dict[str, int], label: str) -> dict[str, Symbol]:
    """Name -> Symbol for the symbolic dims `names` (in order of first use), avoiding the
    model's `fixed_dims`; `given` is the user's representative values (name -> value)."""
    unknown = set(given) - set(names)
    if unknown:
        raise ModelError(f"{label}representative values name {sorted(unknown)}, which are not symbolic "
                         f"dims of the inputs (symbolic dims: {sorted(names) or 'none'})")
    out: dict[str, Symbol] = {}
    used = set(fixed_dims)
    for name in names:
        role = role_of(name)
        if name in given:
            value = given[name]
            if not isinstance(value, int) or value <= 0:
                raise ModelError(f"{label}representative value for {name!r} must be positive, not {value}")
        else:
            value = _next_prime(ROLE_DEFAULTS[role])
            while value in used:
                value = _next_prime(value + 1)
        used.add(value)
        checks = tuple(c for c in ROLE_CHECKS[role] if c != value)
        out[name] = Symbol(name, role, value, name in given, (value,) + checks)
    return out


def fixed_dims(proto) -> set[int]:
    """Every fixed size the model declares: its initializers', inputs', outputs' and value
    infos' static dims, and the values of small int64 tensors (Reshape targets, Slice
    bounds), size 0 and 1 aside."""
    g = proto.graph
    dims = {int(d) for init in g.initializer for d in init.dims}
    for vi in list(g.input) + list(g.output) + list(g.value_info):
        t = vi.type.tensor_type
        if t.HasField("shape"):
            dims.update(int(d.dim_value) for d in t.shape.dim if d.HasField("dim_value"))
    small = [init for init in g.initializer          # shape-like: Reshape targets, Slice ends
             if init.data_type == onnx.TensorProto.INT64 and 0 < _elements(init) <= 16]
    small += [a.t for node in g.node if node.op_type == "Constant" for a in node.attribute
              if a.name == "value" and 0 < _elements(a.t) <= 16]    # and scales such as 8.0
    for t in small:
        dims.update(_whole_numbers(t))
    return dims - {0, 1}


def _whole_numbers(t) -> set[int]:
    """The whole numbers a small tensor holds; none where its data is external or does not
    match its dims (the importer names that problem later)."""
    if t.data_location == onnx.TensorProto.EXTERNAL:
        return set()
    try:
        values = numpy_helper.to_array(t).ravel()
    except (ValueError, TypeError):
        return set()
    if values.dtype.kind not in "iuf":
        return set()
    return {abs(int(v)) for v in values if np.isfinite(v) and float(v).is_integer()}


def _elements(t) -> int:
    n = 1
    for d in t.dims:
        n *= d
    return n


def smaller(symbols: dict[str, Symbol], fixed: set[int], keep: set[str]) -> dict[str, int]:
    """Lower representatives to try when the model does not import at these (a sequence
    past its position table): each symbol not in `keep` (the user's) whose value is over
    3 goes to the largest prime at most half of it that no fixed dim or other symbol
    takes, else the largest such number, else the largest prime another symbol does not
    take. A batch stays: what limits a model is its tables of positions, not its batch.
    {} when none can go lower."""
    taken = set(fixed) | {s.value for s in symbols.values()}
    out = {}
    for name, s in symbols.items():
        if name in keep or s.value <= 3 or s.role == "batch":
            continue
        free = [v for v in range(s.value // 2, 1, -1) if v not in taken]
        others = {o.value for o in symbols.values()} | set(out.values())
        last = [v for v in range(s.value // 2, 1, -1) if is_prime(v) and v not in others]
        # a prime no fixed dim takes, else any free number, else a prime a fixed dim also is
        # (a model whose every small size is taken: generalise may then say it cannot tell)
        v = next((v for v in free if is_prime(v)), free[0] if free else (last[0] if last else None))
        if v is not None:
            out[name] = v
            taken.add(v)
    return out


def probe_values(symbols: dict[str, Symbol], fixed: set[int]) -> dict[str, tuple[int, int, int]]:
    """Name -> (representative, second, third value): the sizes an export is made at to
    find how its sizes follow the symbols; primes distinct from each other and from the
    model's fixed dims, as the representatives are, below the representative where there
    are such (a sequence may not go past the model's position table), else above it."""
    used = set(fixed) | {s.value for s in symbols.values()}
    out = {}
    for name, s in symbols.items():
        below = [v for v in range(s.value - 1, 1, -1) if is_prime(v) and v not in used][:2]
        picked, value = below, s.value
        while len(picked) < 2:
            value = _next_prime(value + 1)
            if value not in used:
                picked.append(value)
        used.update(picked)
        out[name] = (s.value, picked[0], picked[1])
    return out
