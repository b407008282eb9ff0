"""apsat.lang.dims and apsat.pipeline.generalise on hand-made programs: sizes read against
their operands, what cannot be general refused by name, rebuilt programs shaped again."""
from __future__ import annotations

import numpy as np
import pytest

from apsat.frontend.symbols import Symbol, choose, probe_values, role_of
from apsat.lang.dims import Dim, NotGeneral
from apsat.lang.program import parse
from apsat.pipeline.generalise import generalise


class _Model:
    def __init__(self, signature, symbols, weights=None):
        self.signature, self.symbols, self.weights, self.generated = signature, symbols, weights or {}, {}


def _sym(name, value, role="other"):
    return Symbol(name, role, value, False, (value, 5, 40))


def test_dims_are_polynomials_compared_symbolically_and_ordered_at_the_representative():
    b, s = Dim.symbol("b", 3), Dim.symbol("s", 127)
    assert b * s * 32 == 32 * s * b and (b * s * 32).rep == 3 * 127 * 32
    assert (s - 2) + 2 == s and s != 127 and (b * 64) // 32 == 2 * b
    assert s > 100 and repr(b * s * 32 - 1) == "32*b*s - 1"
    with pytest.raises(NotGeneral, match="not a polynomial"):
        (s - 3) // 2
    assert (b * s).at({"b": 2, "s": 5}) == 10


def test_reshape_and_slice_sizes_follow_the_symbols():
    model = _Model({"x": ("b", "s", 32)}, {"b": _sym("b", 3), "s": _sym("s", 127)})
    prog = parse("(access-slice (access-reshape (access-tensor x) (access-shape (shape 3 127 2 16) (shape))) 1 0 127)",
                 {"x": (3, 127, 32)})
    g = generalise(prog, model)
    at, _, inputs, _ = g.at({"b": 2, "s": 9}, {})
    assert inputs == {"x": (2, 9, 32)} and at.shape == ((2, 9, 2, 16), ())


def test_a_stride_over_a_symbolic_dim_is_not_general():
    model = _Model({"x": ("b", "s")}, {"b": _sym("b", 3), "s": _sym("s", 127)})
    prog = parse("(access-windows (access (access-tensor x) 1) (shape 3) (shape 2))", {"x": (3, 127)})
    with pytest.raises(NotGeneral, match="stride"):
        generalise(prog, model)


def test_a_folded_constant_of_symbolic_shape_must_be_one_value():
    model = _Model({"x": ("s",)}, {"s": _sym("s", 127)}, {"m": np.arange(127, dtype=np.float32)})
    prog = parse("(compute elementwise-add (access-pair (access (access-tensor x) 0) (access (access-tensor m) 0)))",
                 {"x": (127,), "m": (127,)})
    with pytest.raises(NotGeneral, match="constant 'm'"):
        generalise(prog, model)
    model.weights = {"m": np.full(127, 2.0, np.float32)}
    g = generalise(prog, model)
    _, weights, _, _ = g.at({"s": 4}, model.weights)
    assert weights["m"].shape == (4,) and np.all(weights["m"] == 2.0)


def test_roles_and_representatives_avoid_the_models_fixed_dims():
    assert [role_of(n) for n in ("N", "batch_size", "sequence_length", "past_sequence_length", "h")] == \
        ["batch", "batch", "sequence", "past", "other"]
    symbols = choose(["batch", "seq"], {3, 127, 131}, {}, "")
    assert symbols["batch"].value == 5 and symbols["seq"].value == 137
    probes = probe_values(symbols, {7})
    assert probes["batch"][0] == 5 and len({v for p in probes.values() for v in p}) == 6 and 7 not in probes["batch"]


def test_a_mismatch_at_another_size_fails_verification_and_a_narrow_program_is_a_notice():
    from apsat.pipeline.dynamic import fold_into

    report = {"verification": {"ok": True}, "notices": []}
    fold_into(report, {"general": True, "checks": [{"sizes": {"s": 5}, "ok": True},
                                                   {"sizes": {"s": 40}, "ok": False},
                                                   {"sizes": {"s": 9}, "skipped": "past the table"}]})
    assert report["verification"] == {"ok": False, "failed_at_sizes": [{"s": 40}]}
    fold_into(report, {"general": False, "why": "access-windows: a stride of (2,)"})
    assert "holds only at the representative sizes (access-windows" in report["notices"][-1]
