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

Where the rules run: on a second e-graph, that of the float32 program the target's plan
chose (`half_egraph`), not beside every alternative of the first. Mirroring the whole e-graph
in the half type costs what the layout phase built many times over (ResNet-50: 95 s for 24
iterations over 10,000 e-nodes there, under 2 s on the chosen program's e-graph); the
price is that a layout is chosen for float32 before the precision is.
"""
from __future__ import annotations

from apsat.errors import UsageError, VerificationError
from apsat.lang.dtypes import CODES, EXACT, MIXED_FLOAT32
from apsat.lang.egg_gen import operator_pattern
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
            raise UsageError("max_error bounds a lower precision: give a precision (fp16, bf16 or mixed) too")
        return
    if target != "gpu":
        raise UsageError(f"precision {precision}: lower precision is for the gpu target, not {target!r}")
    if program.float_type() != "f32":
        raise UsageError(f"precision {precision}: the model already computes in {program.float_type()}")


def facts(precision: str) -> str:
    """The egglog facts the precision rules read: the half type's code and one rule per
    operator the mode computes in it (chains: both parts)."""
    h = half_type(precision)
    never = EXACT | {"cast"} | (MIXED_FLOAT32 if precision == "mixed" else frozenset())
    ops = [s for s in COMPUTE_OPS.values() if s.kind != "chain" and s.name not in never]
    lines = [f"(set (half-type) {CODES[h]})",
             "(rule ((= o (chain f g)) (half-ok f) (half-ok g)) ((half-ok o)) :ruleset shapes)"]
    lines += [f"(rule ((= o ({operator_pattern(s)}))) ((half-ok o)) :ruleset shapes)" for s in ops]
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
    if not verification["ok"]:     # within the bound where finite: NaN or infinities differ
        raise PrecisionError(f"precision {precision}: the result's NaN or infinities differ from the float32 "
                             f"original's (a value past the range of {h}?)")
    return out


PRECISION_LIMITS = {"iter_limit": 40, "node_limit": 100_000, "time_limit": 60.0}


def half_egraph(program, target: str, precision: str, extractor: str):
    """The e-graph of `program` (the chosen float32 program) saturated with the precision
    rules under PRECISION_LIMITS: (e-graph, output handles, extraction candidates,
    the phase's report)."""
    from apsat.egraph.driver import EGraph
    from apsat.extract import extract_candidates
    from apsat.rules.saturate import saturate

    eg = EGraph(target=target)
    handles = eg.add_outputs(program)
    eg.load_text(facts(precision), what=f"setting the facts of precision {precision}")
    report = saturate(eg, ["precision"], **PRECISION_LIMITS)
    phase = dict(report["phases"][0], phase="precision")
    return eg, handles, extract_candidates(eg, handles, method=extractor), phase


def in_half(eg, candidates, saturation, lowering, precision: str, extractor: str, timed):
    """The precision rules on the e-graph of the float32 program the plan chooses among
    `candidates` (apsat.pipeline.precision.half_egraph says why there): (that program, the
    new e-graph, its candidates and the float32 choice, never worse than it). `eg` is let
    go; the phase joins saturation["phases"]. `lowering`: (backend, target, weights, options)
    as plan takes them; `timed(phase, fn, *args)` runs a timed pipeline phase."""
    from apsat.pipeline.egraph_pool import release
    from apsat.pipeline.plan import plan

    release(eg)
    source = timed("float32 plan", plan, lowering[0], candidates, *lowering[1:])[0]
    eg, _, half, phase = timed("precision", half_egraph, source, lowering[1].name, precision, extractor)
    saturation["phases"].append(phase)
    return source, eg, half + [("float32", source)]
