"""Checks shared by the op tests: an optimised program against onnxruntime's output."""
from __future__ import annotations

import numpy as np

from apsat.lang.evaluate import evaluate


def assert_program_equals(res, tensors: dict, want: np.ndarray, target: str, output: str = "y", **tol):
    """`res` (an OptimizeResult for `target`) equals `want` within `tol` (assert_allclose's
    rtol/atol) under the reference interpreter and, on a systolic target, in its compiled
    instruction stream on the simulator, which must run no host step."""
    np.testing.assert_allclose(evaluate(res.program, tensors), want, **tol)
    if target.startswith("systolic"):
        from apsat.backends import systolic

        stream = systolic.compile(res.program, target, weights=res.model.weights)
        assert not systolic.cycles(stream)["host_steps"]
        np.testing.assert_allclose(systolic.simulate(stream, tensors)[output], want, **tol)
