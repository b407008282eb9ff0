"""Numerical verification of an optimised program against onnxruntime on the original
model. The oracle runs the ONNX model as given (graph optimisations off), the candidate is
the extracted program under the reference interpreter; both get the same seeded inputs."""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

# float32 end to end: the interpreter and onnxruntime sum in different orders (im2col
# matmuls vs direct convolution), so sums of up to ~25k products differ by a few ulps each.
# Relative error 1e-4 covers large values; the absolute part is 1e-5 times the output's
# scale (max |value|, at least 1), because a value near zero that is the difference of
# large sums carries the rounding of those sums: ShuffleNet's random-weight logits reach
# ~140 and its near-zero logits differ by ~5e-5 between two correct float32 evaluations.
RTOL, ATOL = 1e-4, 1e-5


@dataclass
class Verification:
    """Outcome of one comparison; `ok` when every output is within rtol/atol."""

    ok: bool
    max_abs_err: float
    max_rel_err: float
    rtol: float
    atol: float
    outputs: list[str]

    def to_dict(self) -> dict:
        return asdict(self)


def compare(expected: dict, actual: dict, rtol: float = RTOL, atol: float = ATOL) -> Verification:
    """Compare output dicts by name: |got - want| <= atol * scale + rtol * |want| per
    element, scale = max(1, max |want|) of that output."""
    ok, max_abs, max_rel = True, 0.0, 0.0
    for name, want in expected.items():
        want = np.asarray(want, dtype=np.float64)
        got = np.asarray(actual[name], dtype=np.float64).reshape(want.shape)
        same = (got == want) | (np.isnan(got) & np.isnan(want))   # equal infinities, NaN where the oracle has NaN
        with np.errstate(invalid="ignore"):                        # inf - inf, inf / inf
            err = np.where(same, 0.0, np.abs(got - want))
            rel = err / np.maximum(np.abs(want), 1e-30)
        scale = max(1.0, float(np.abs(want[np.isfinite(want)]).max(initial=0.0)))
        max_abs = max(max_abs, float(err.max(initial=0.0)))
        max_rel = max(max_rel, float(rel.max(initial=0.0)))
        ok &= bool(np.all(same | (err <= atol * scale + rtol * np.abs(want)))) and bool(np.isfinite(got).all() == np.isfinite(want).all())
    return Verification(ok, max_abs, max_rel, rtol, atol, list(expected))


def verify_program(model, program, inputs: dict, rtol: float = RTOL, atol: float = ATOL) -> Verification:
    """Run `program` (reference interpreter, with the model's weights) and the original
    ONNX model (onnxruntime) on `inputs`; compare every model output."""
    from apsat.lang.evaluate import evaluate
    from apsat.pipeline.zoo import ort_run

    expected = ort_run(model.onnx, inputs)
    got = evaluate(program, {**model.weights, **inputs})
    if not isinstance(got, dict):
        got = {next(iter(program.outputs)): got}
    return compare({k: expected[k] for k in program.outputs}, got, rtol, atol)
