"""Numerical verification of an optimised program against the original model.

Both apsat (the extracted program under the reference interpreter) and onnxruntime (the
ONNX model as given, graph optimisations off) compute in float32, and float32 sums of
thousands of products in different orders differ: by ~1e-5 of the output's scale after a
deep CNN, ~1e-7 after a shallow one. No fixed tolerance fits both, so the yardstick is a
float64 run of the original model (apsat.pipeline.oracle), and apsat's float32 error must
be of the order of onnxruntime's own on the same inputs:

    err(x) = max |x - ref64| / scale,  scale = max |ref64| over the output (1 if all zero)
    ok     when err(apsat) <= K * err(onnxruntime float32) + FLOOR, for every output

(both over the elements where apsat, onnxruntime and ref64 are finite; elsewhere apsat
must give what onnxruntime gives: NaN where it has NaN, the same infinities). Where no
float64 copy of the model runs in onnxruntime, the comparison falls back to the fixed
tolerances RTOL/ATOL against float32 onnxruntime (`compare`), and the report says so.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

# The fixed-tolerance rule (the fallback, and `compare`'s default for its other callers):
# relative error 1e-4 covers large values; the absolute part is 1e-5 times the output's
# scale (max |value|, at least 1), because a value near zero that is the difference of
# large sums carries the rounding of those sums (ShuffleNet's random-weight logits reach
# ~140, its near-zero logits differ by ~5e-5 between two correct float32 evaluations).
RTOL, ATOL = 1e-4, 1e-5
# The float64 rule (docs/verification.md has the measurements): honest programs of the
# light and real zoo and Inception-v3 at 299x299 reach at most 4.2x onnxruntime's error
# (K = 8 leaves a margin of ~2), planted sign flips and dropped biases 10^3x and more.
# FLOOR (4 float32 ulps of the scale) is what an output that onnxruntime gets exactly
# right (a Relu, a max-pool) may still be off by.
K = 8.0
FLOOR = 4 * 2.0 ** -23
# A program that computes in a half type (its output's element type, apsat/lang/dtypes.py)
# rounds every node's result to that type, so each rule's absolute parts are HALF_ULPS ulps
# of the type (16 unit roundoffs: 7.8e-3 of the scale in f16, 6.3e-2 in bf16) instead: honest
# half programs of both zoos reach at most 4.0 ulps of f16 and 1.2 of bf16 (AlexNet, BERT;
# docs/verification.md), planted sign flips hundreds. onnxruntime's own error in the type is
# no bar there: its CPU computes products and most ops in float32 between half tensors.
HALF_ULPS = 8


@dataclass
class Verification:
    """Outcome of one comparison. `ok`: every output passes the rule of `oracle`.
    `max_abs_err`/`max_rel_err`: apsat against float32 onnxruntime (all outputs);
    `rtol`/`atol`: the fixed-tolerance rule's constants (the rule itself where `oracle`
    starts with "float32"). Under the float64 rule, `err_apsat` and `err_ort` are the
    scaled errors of apsat and of onnxruntime against the float64 run and `ratio` their
    quotient (None when onnxruntime's is 0), all three of the output nearest to failing;
    `k` and `floor` the rule's constants; `oracle_notes` what the float64 copy ran
    differently (ops rewritten into double-kernel ops, or run in float32)."""

    ok: bool
    max_abs_err: float
    max_rel_err: float
    rtol: float
    atol: float
    outputs: list[str]
    oracle: str = "float32 (fixed tolerance)"
    err_apsat: float | None = None
    err_ort: float | None = None
    ratio: float | None = None
    k: float | None = None
    floor: float | None = None
    oracle_notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Oracle:
    """What a candidate is judged against: onnxruntime's float32 outputs, the float64
    copy's (None where none runs), and how they were obtained (`label`, `notes`)."""

    float32: dict
    float64: dict | None
    label: str
    notes: list[str] = field(default_factory=list)


def run_oracle(model_proto, inputs: dict, external: dict | None = None) -> Oracle:
    """onnxruntime on the original model in float32 and, where it runs, on its float64
    copy (apsat.pipeline.oracle.float64_run); `external`: the model's external-data
    weights (apsat.frontend.external), fed where they lie. A half-precision model's
    float32 copy (oracle.float32_copy: its values widened exactly) stands in for its own
    run where onnxruntime has no kernel for its type (bfloat16 on the CPU), and is the
    fixed-tolerance reference where no float64 copy runs (float32 tolerances do not fit
    its half-precision outputs). ModelError when no run of the model works."""
    from apsat.errors import ModelError
    from apsat.frontend.reading import half_float_types, widened
    from apsat.pipeline.oracle import NoFloat64, float32_copy, float64_run
    from apsat.pipeline.zoo import ort_run

    half = half_float_types(model_proto)
    wide = {k: widened(v) for k, v in inputs.items()}
    stand_in = ""
    try:
        expected = ort_run(model_proto, inputs, external)
    except ModelError as e:
        if not half:
            raise
        expected = ort_run(float32_copy(model_proto), wide, external)
        stand_in = f"; its float32 copy stands in for its own run ({str(e).rsplit(': ', 1)[-1][:120]})"
    try:
        reference, notes = float64_run(model_proto, inputs, external)
    except NoFloat64 as e:
        if half:    # the fixed tolerances are float32's: a float32 copy's run
            expected = expected if stand_in else ort_run(float32_copy(model_proto), wide, external)
            return Oracle(expected, None, f"float32 copy of the half-precision model (no float64 copy runs: {e})")
        return Oracle(expected, None, f"float32 (no float64 copy runs: {e})")
    return Oracle(expected, reference, "float64 (onnxruntime)" + stand_in, notes)


def _nonfinite_agree(got: np.ndarray, want: np.ndarray) -> bool:
    """NaN exactly where `want` has NaN, the same infinities where it has infinities."""
    same = (got == want) | (np.isnan(got) & np.isnan(want))
    finite = np.isfinite(got) & np.isfinite(want)
    return bool(np.all(finite | same)) and bool(np.array_equal(np.isfinite(got), np.isfinite(want)))


def compare(expected: dict, actual: dict, rtol: float = RTOL, atol: float = ATOL) -> Verification:
    """The fixed-tolerance rule. Compare output dicts by name: |got - want| <= atol * scale
    + rtol * |want| per element, scale = max(1, max |want|) of that output; NaN and
    infinities must agree as `_nonfinite_agree` says."""
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
        ok &= bool(np.all(same | (err <= atol * scale + rtol * np.abs(want)))) and _nonfinite_agree(got, want)
    return Verification(ok, max_abs, max_rel, rtol, atol, list(expected))


def scaled_errors(got, want32, ref64) -> tuple[float, float]:
    """(err(got), err(want32)) against ref64, per the module doc, over the elements where
    all three are finite."""
    ref = np.asarray(ref64, dtype=np.float64)
    got = np.asarray(got, dtype=np.float64).reshape(ref.shape)
    want = np.asarray(want32, dtype=np.float64).reshape(ref.shape)
    finite = np.isfinite(got) & np.isfinite(want) & np.isfinite(ref)
    if not finite.any():
        return 0.0, 0.0
    scale = float(np.abs(ref[finite]).max()) or 1.0
    return (float(np.abs(got[finite] - ref[finite]).max()) / scale,
            float(np.abs(want[finite] - ref[finite]).max()) / scale)


def half_tolerance(dtype: str | None) -> float | None:
    """HALF_ULPS ulps of a half element type (relative to the output's scale); None for
    f32 and exact outputs, which keep the float32 constants."""
    from apsat.lang.dtypes import UNIT_ROUNDOFF

    return HALF_ULPS * 2 * UNIT_ROUNDOFF[dtype] if dtype in ("f16", "bf16") else None


def output_types(program) -> dict:
    """Output name -> the element type its term computes in (Program.dtype_of)."""
    return {name: program.dtype_of(t) for name, t in program.outputs.items()}


def judge(oracle: Oracle, actual: dict, rtol: float = RTOL, atol: float = ATOL,
          k: float = K, floor: float = FLOOR, types: dict | None = None) -> Verification:
    """Judge `actual` (output name -> array; `oracle.float32`'s names are the outputs
    compared) by the float64 rule, or by the fixed-tolerance rule where the oracle has
    no float64 run (see the module doc). `types` (output name -> element type) loosens
    both rules' absolute parts for outputs computed in a half type (`half_tolerance`)."""
    names = [n for n in oracle.float32 if n in actual]
    half = max((half_tolerance((types or {}).get(n)) or 0.0 for n in names), default=0.0)
    if half:
        rtol, atol, floor = max(rtol, half), max(atol, half), max(floor, half)
    fixed = compare({n: oracle.float32[n] for n in names}, actual, rtol, atol)
    fixed.oracle, fixed.oracle_notes = oracle.label, list(oracle.notes)
    if oracle.float64 is None:
        return fixed
    ok, worst = True, (-1.0, 0.0, 0.0)
    for name in names:
        want = np.asarray(oracle.float32[name], dtype=np.float64)
        got = np.asarray(actual[name], dtype=np.float64).reshape(want.shape)
        ok &= _nonfinite_agree(got, want)
        mine, theirs = scaled_errors(got, want, oracle.float64[name])
        margin = mine / (k * theirs + floor)
        ok &= margin <= 1.0
        worst = max(worst, (margin, mine, theirs))
    _, mine, theirs = worst
    fixed.ok, fixed.err_apsat, fixed.err_ort, fixed.k, fixed.floor = ok, mine, theirs, k, floor
    fixed.ratio = mine / theirs if theirs > 0 else None
    return fixed


def verify_program(model, program, inputs: dict, rtol: float = RTOL, atol: float = ATOL,
                   k: float = K, floor: float = FLOOR, oracle: Oracle | None = None) -> Verification:
    """Run `program` (reference interpreter, with the model's weights) on `inputs` and
    judge every program output against the original ONNX model (`run_oracle`, or the
    `oracle` given, computed on the same inputs)."""
    from apsat.lang.evaluate import evaluate

    oracle = oracle or run_oracle(model.onnx, inputs, getattr(model, "external", None))
    got = evaluate(program, {**model.weights, **inputs})
    if not isinstance(got, dict):
        got = {next(iter(program.outputs)): got}
    return judge(Oracle({n: oracle.float32[n] for n in program.outputs}, oracle.float64,
                        oracle.label, oracle.notes), got, rtol, atol, k, floor, output_types(program))
