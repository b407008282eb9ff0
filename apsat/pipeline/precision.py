"""Lower precision as a choice the e-graph makes: `optimize(precision=...)`, `--precision`.

A float32 model optimised at precision "fp16", "bf16" or "mixed" is saturated with the
precision rules (apsat/rules/precision.egg) on top of its target's plan: products, fused
products and attention gain half-operand forms, and the widening casts move through the
operators the mode allows until they cancel. This module sets the facts those rules read
(the half type, the operators computed in it), and judges the result: its error against
the float32 original (scaled by the output's largest value, against a float64 run, on
seeded inputs) must be within the bound, `max_error`, or the run is refused with a
PrecisionError (a VerificationError: `apsat optimize` exits 1).

    fp16, bf16   every operator may compute in the type (products accumulate in float32)
    mixed        float16 where torch's autocast would: products and element-wise work;
                 softmax, norms, sums, means, exp, log, pow and division stay float32
                 (dtypes.MIXED_FLOAT32)

The default bound is the half type's verification tolerance (8 ulps of the type:
7.8e-3 for f16, 6.3e-2 for bf16; apsat.pipeline.verify.half_tolerance).
"""
from __future__ import annotations

from apsat.errors import UsageError, VerificationError
from apsat.lang.dtypes import CODES, EXACT, MIXED_FLOAT32
from apsat.lang.ops import COMPUTE_OPS

MODES = {"fp32": None, "fp16": "f16", "bf16": "bf16", "mixed": "f16"}


class PrecisionError(VerificationError):
    """A lower-precision result whose error against the float32 original passes the bound."""


def half_type(precision: str | None) -> str | None:
    """The half type a precision computes in (None: float32). UsageError for an unknown one."""
    if precision is None:
        return None
    if precision not in MODES:
        raise UsageError(f"precision {precision!r}: use one of {', '.join(MODES)}")
    return MODES[precision]


def check_request(precision: str | None, max_error, target: str, program) -> None:
    """UsageError where this precision cannot be asked: another target than gpu, a model
    that is not float32, or a bound that is not a positive number."""
    if max_error is not None and not (isinstance(max_error, (int, float)) and max_error > 0):
        raise UsageError(f"max_error {max_error!r}: a positive number (the error bound, scaled by the output)")
    if half_type(precision) is None:
        if max_error is not None and precision is None:
            raise UsageError("max_error bounds a lower precision: give precision= (fp16, bf16 or mixed) too")
        return
    if target != "gpu":
        raise UsageError(f"precision {precision}: lower precision is for the gpu target, not {target!r}")
    if program.float_type() != "f32":
        raise UsageError(f"precision {precision}: the model already computes in {program.float_type()}")


def facts(precision: str) -> str:
    """The egglog facts the precision rules read: the half type's code and one rule per
    operator the mode computes in it (chains: both parts)."""
    h = half_type(precision)
    if precision == "mixed":
        ops = [s for s in COMPUTE_OPS.values() if s.kind != "chain" and s.name not in MIXED_FLOAT32 | EXACT
               and s.name != "cast"]
    else:
        ops = [s for s in COMPUTE_OPS.values() if s.kind != "chain" and s.name not in EXACT and s.name != "cast"]
    lines = [f"(set (half-type) {CODES[h]})",
             "(rule ((= o (chain f g)) (half-ok f) (half-ok g)) ((half-ok o)) :ruleset shapes)"]
    for s in ops:
        pattern = " ".join([s.egg] + [f"p{i}" for i in range(len(s.params))])
        lines.append(f"(rule ((= o ({pattern}))) ((half-ok o)) :ruleset shapes)")
    return "\n".join(lines)


def bound(precision: str, max_error) -> float:
    """The error bound of a run: the one given, else the half type's tolerance."""
    from apsat.pipeline.verify import half_tolerance

    return float(max_error) if max_error is not None else half_tolerance(half_type(precision))


def judged(precision: str, max_error, verification: dict, program) -> dict:
    """report["precision"]: the mode, type, bound, the measured error and how many of the
    program's computing nodes compute in the half type. PrecisionError (one line) when the
    error passes the bound."""
    from apsat.lang.ops import OPS

    limit = bound(precision, max_error)
    h = half_type(precision)
    computing = [t for t in program.terms() if OPS[t.op].role in ("compute", "atom")
                 and not (t.op == "compute" and t.args[0].op == "cast")]
    err = verification.get("err_apsat")
    err = err if err is not None else verification["max_abs_err"]
    out = {"precision": precision, "type": h, "max_error": limit, "error": err,
           "half_nodes": sum(program.dtype_of(t) == h for t in computing), "nodes": len(computing)}
    if not err <= limit:
        raise PrecisionError(f"precision {precision}: the result's error against the float32 original, "
                             f"{err:.2e} of the output's scale, passes the bound {limit:.1e} (max_error)")
    return out
