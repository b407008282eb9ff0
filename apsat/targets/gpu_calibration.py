"""Fitted gpu roofline constants: what measured kernels turn the data-sheet figures into.

A calibration holds the launch time and, per kernel kind ("gemm", "reduce",
"elementwise", "attention"), the fraction of peak HBM bandwidth (`bandwidth[kind]`) and
of peak FLOP/s (`compute[kind]`) that kind of kernel achieves. A kernel then costs

    launch_us + max(flop / (peak * compute[kind]), bytes / (hbm * bandwidth[kind]))

with peak and hbm the data sheet's (apsat/targets/gpu.py). `fit` derives the constants
from measured kernels (benchmarks/calibrate_gpu.py runs it on the timings
benchmarks/gpu.py writes); `load` and `dump` read and write them as JSON.

Which calibration applies (`active()`, read once and cached): the file named by the
environment variable APSAT_GPU_CALIBRATION, or none at all when it says "none"; otherwise
the committed apsat/targets/gpu_calibration.json when it exists, else none: the
data-sheet figures. No measured calibration is committed yet.
"""
from __future__ import annotations

import functools
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from apsat.errors import CalibrationError

KINDS = ("gemm", "reduce", "elementwise", "attention")
ENV = "APSAT_GPU_CALIBRATION"
COMMITTED = Path(__file__).with_name("gpu_calibration.json")
MAX_FRACTION = 1.5         # above the data sheet (caches, clocks), but not by much
MAX_LAUNCH_US = 50.0
MIN_FRACTION = 0.01
PRIOR_WEIGHT = 0.1         # the pull of each fraction toward 1.0, in log-error units
FIELDS = ("gpu", "launch_us", "bandwidth", "compute", "provenance")


@dataclass(frozen=True)
class Calibration:
    """Fitted constants for one GPU (`gpu` as torch names it). `bandwidth` and `compute`
    map each kind in KINDS to an achieved fraction of peak; `provenance` says where they
    came from (commit, date, kernels, error_before/error_after medians and worst)."""

    gpu: str
    launch_us: float
    bandwidth: dict
    compute: dict
    provenance: dict = field(default_factory=dict)

    def kernel_us(self, kind: str, flop: float, bytes_moved: float,
                  peak_flops_per_us: float, hbm_bytes_per_us: float) -> float:
        """One kernel of `kind`: launch plus the larger of its calibrated compute and
        memory times."""
        return self.launch_us + max(flop / (peak_flops_per_us * self.compute[kind]),
                                    bytes_moved / (hbm_bytes_per_us * self.bandwidth[kind]))

    def to_json(self) -> dict:
        return {"gpu": self.gpu, "launch_us": self.launch_us,
                "bandwidth": {k: self.bandwidth[k] for k in KINDS},
                "compute": {k: self.compute[k] for k in KINDS}, "provenance": dict(self.provenance)}


def datasheet(launch_us: float) -> Calibration:
    """The data sheet as a calibration: every fraction 1.0."""
    ones = {k: 1.0 for k in KINDS}
    return Calibration("data sheet", launch_us, ones, dict(ones))


# ---- files -----------------------------------------------------------------------------------

def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _fractions(data: dict, name: str) -> str | None:
    """The problem with `data[name]` as a kind -> fraction table, or None."""
    table = data[name]
    if not isinstance(table, dict):
        return f"{name} must be an object of kind -> fraction"
    for kind, value in table.items():
        if kind not in KINDS:
            return f"unknown kind {kind!r} in {name} (known: {', '.join(KINDS)})"
        if not _number(value) or value <= 0:
            return f"{name}[{kind!r}] must be a positive finite number, not {value!r}"
        if value > MAX_FRACTION:
            return f"{name}[{kind!r}] = {value!r} is over {MAX_FRACTION} of peak"
    missing = [k for k in KINDS if k not in table]
    return f"{name} has no {missing[0]!r}" if missing else None


def _problem(data) -> str | None:
    """What is wrong with a parsed calibration file, or None."""
    if not isinstance(data, dict):
        return "not a JSON object"
    missing = [f for f in FIELDS if f not in data]
    if missing:
        return f"missing field {missing[0]!r}"
    unknown = sorted(set(data) - set(FIELDS))
    if unknown:
        return f"unknown field {unknown[0]!r} (fields: {', '.join(FIELDS)})"
    if not isinstance(data["gpu"], str) or not data["gpu"].strip():
        return "gpu must be the GPU's name"
    launch = data["launch_us"]
    if not _number(launch) or not 0 <= launch <= MAX_LAUNCH_US:
        return f"launch_us must be a finite number in [0, {MAX_LAUNCH_US:g}], not {launch!r}"
    if not isinstance(data["provenance"], dict):
        return "provenance must be an object"
    return _fractions(data, "bandwidth") or _fractions(data, "compute")


def load(path) -> Calibration:
    """The calibration in JSON file `path`; CalibrationError (one line naming the file
    and the problem) when it cannot be read or is malformed."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise CalibrationError(f"{path}: cannot read calibration ({exc.strerror or exc.__class__.__name__})") from None
    except ValueError as exc:
        where = f" (line {exc.lineno})" if hasattr(exc, "lineno") else ""
        raise CalibrationError(f"{path}: not JSON{where}") from None
    problem = _problem(data)
    if problem:
        raise CalibrationError(f"{path}: {problem}")
    return Calibration(data["gpu"], float(data["launch_us"]), {k: float(data["bandwidth"][k]) for k in KINDS},
                       {k: float(data["compute"][k]) for k in KINDS}, dict(data["provenance"]))


def dump(cal: Calibration, path) -> None:
    """Write `cal` to `path` as JSON (what `load` reads back)."""
    Path(path).write_text(json.dumps(cal.to_json(), indent=2) + "\n")


@functools.lru_cache(maxsize=None)
def _for_setting(setting: str) -> Calibration | None:
    if setting.strip().lower() == "none":
        return None
    if setting:
        return load(setting)
    return load(COMMITTED) if COMMITTED.exists() else None


def active() -> Calibration | None:
    """The calibration in force: $APSAT_GPU_CALIBRATION's file ("none": no calibration),
    else the committed gpu_calibration.json if there is one, else None (data-sheet
    figures). Loaded once per setting; `clear_cache()` forgets it."""
    return _for_setting(os.environ.get(ENV, ""))


def clear_cache() -> None:
    _for_setting.cache_clear()


# ---- fitting ---------------------------------------------------------------------------------

def _checked(measurements: list) -> list[tuple[str, float, float, float]]:
    """(kind, flops, bytes, measured_us) per measurement; CalibrationError for a bad one."""
    if not measurements:
        raise CalibrationError("no kernel measurements to fit")
    out = []
    for i, m in enumerate(measurements):
        if not isinstance(m, dict) or any(k not in m for k in ("kind", "flops", "bytes", "measured_us")):
            raise CalibrationError(f"kernel {i}: needs kind, flops, bytes and measured_us")
        if m["kind"] not in KINDS:
            raise CalibrationError(f"kernel {i}: unknown kind {m['kind']!r} (known: {', '.join(KINDS)})")
        if not all(_number(m[k]) and m[k] >= 0 for k in ("flops", "bytes")) \
                or not _number(m["measured_us"]) or m["measured_us"] <= 0:
            raise CalibrationError(f"kernel {i}: flops and bytes must be finite and >= 0, "
                                   "measured_us finite and > 0")
        out.append((m["kind"], float(m["flops"]), float(m["bytes"]), float(m["measured_us"])))
    return out


def _errors(cal: Calibration, rows, peak: float, hbm: float) -> dict:
    """Relative errors |model - measured| / measured: per kind and overall, n, median
    and worst."""
    import numpy as np

    err = {k: [] for k in KINDS}
    for kind, f, b, t in rows:
        err[kind].append(abs(cal.kernel_us(kind, f, b, peak, hbm) - t) / t)
    err["all"] = [e for k in KINDS for e in err[k]]
    return {k: {"n": len(v), "median": float(np.median(v)), "worst": float(max(v))}
            for k, v in err.items() if v}


def _start(rows, kinds, peak: float, hbm: float, launch: float):
    """A starting point off the upper envelope: each kernel's time less launch bounds
    its kind's fractions from below (flop / (peak * body), bytes / (hbm * body)), and
    the kernels bound by one resource attain the bound."""
    import numpy as np

    launch = min(launch, 0.5 * min(t for *_, t in rows))
    x = [launch]
    for kind in kinds:
        body = [(f, b, max(t - launch, 0.1 * t)) for k, f, b, t in rows if k == kind]
        x.append(max(b / (hbm * d) for f, b, d in body))
        x.append(max(f / (peak * d) for f, b, d in body))
    return np.clip(np.array(x), [0.0] + [MIN_FRACTION] * 2 * len(kinds),
                   [MAX_LAUNCH_US] + [MAX_FRACTION] * 2 * len(kinds))


def _problem_functions(rows, kinds, peak: float, hbm: float):
    """Residuals and their Jacobian over x = [launch, bw_k0, comp_k0, bw_k1, ...]: log of
    modelled over measured time per kernel, then PRIOR_WEIGHT * log(fraction) each."""
    import numpy as np

    col = {k: 1 + 2 * i for i, k in enumerate(kinds)}
    idx = np.array([col[k] for k, *_ in rows])
    compute_t = np.array([f / peak for _, f, _, _ in rows])
    memory_t = np.array([b / hbm for _, _, b, _ in rows])
    log_t = np.log([t for *_, t in rows])
    n, p = len(rows), 1 + 2 * len(kinds)

    def parts(x):
        mem, comp = memory_t / x[idx], compute_t / x[idx + 1]
        return mem, comp, x[0] + np.maximum(mem, comp)

    def residuals(x):
        return np.concatenate([np.log(parts(x)[2]) - log_t, PRIOR_WEIGHT * np.log(x[1:])])

    def jacobian(x):
        mem, comp, model = parts(x)
        jac = np.zeros((n + p - 1, p))
        jac[:n, 0] = 1.0 / model
        which = np.where(comp >= mem, idx + 1, idx)     # the fraction of the term max() takes
        jac[np.arange(n), which] = -np.maximum(mem, comp) / (x[which] * model)
        jac[n + np.arange(p - 1), 1 + np.arange(p - 1)] = PRIOR_WEIGHT / x[1:]
        return jac
    return residuals, jacobian


def fit(measurements: list, peak_flops_per_us: float, hbm_bytes_per_us: float, launch_us: float,
        gpu: str = "unknown") -> tuple[Calibration, dict]:
    """Fit launch and the per-kind fractions to measured kernels: `measurements` are
    dicts with kind, flops, bytes and measured_us (others ignored); the peaks are the
    data sheet's (FLOP/us and bytes/us), launch_us its launch time (the fit's starting
    point and the "before" model). Returns the calibration (provenance: kernels,
    error_before, error_after) and a report {kind and "all": {"n", "before": {"median",
    "worst"}, "after": {...}}} of relative errors under the data sheet and the fit.

    Least squares on log(modelled / measured), so every kernel's relative error counts
    alike, with launch in [0, 50] us and fractions in [0.01, 1.5]. A fraction the data
    do not pin down (the compute fraction of a kind whose kernels are all memory-bound
    at any fraction above some floor, or the bandwidth fraction of one that only
    computes) is flat in the residuals: a weak prior, PRIOR_WEIGHT * log(fraction) per
    fraction, takes it to 1.0 (the data sheet) or to the floor the data set, whichever
    is higher, and moves a well-measured fraction by well under 1%. Kinds with no
    measurement keep 1.0. Two starts (the upper envelope of the data, and the data
    sheet) guard against the max()'s kink; the lower cost wins."""
    import numpy as np
    from scipy.optimize import least_squares

    rows = _checked(measurements)
    kinds = [k for k in KINDS if any(r[0] == k for r in rows)]
    residuals, jacobian = _problem_functions(rows, kinds, peak_flops_per_us, hbm_bytes_per_us)
    lo = [0.0] + [MIN_FRACTION] * 2 * len(kinds)
    hi = [MAX_LAUNCH_US] + [MAX_FRACTION] * 2 * len(kinds)
    starts = [_start(rows, kinds, peak_flops_per_us, hbm_bytes_per_us, launch_us),
              np.clip([launch_us] + [1.0] * 2 * len(kinds), lo, hi)]
    best = min((least_squares(residuals, x0, jac=jacobian, bounds=(lo, hi), method="trf")
                for x0 in starts), key=lambda r: r.cost)
    x = best.x
    bandwidth = {k: 1.0 for k in KINDS} | {k: float(x[1 + 2 * i]) for i, k in enumerate(kinds)}
    compute = {k: 1.0 for k in KINDS} | {k: float(x[2 + 2 * i]) for i, k in enumerate(kinds)}
    cal = Calibration(gpu, float(x[0]), bandwidth, compute)
    before = _errors(datasheet(launch_us), rows, peak_flops_per_us, hbm_bytes_per_us)
    after = _errors(cal, rows, peak_flops_per_us, hbm_bytes_per_us)
    report = {k: {"n": before[k]["n"], "before": {e: before[k][e] for e in ("median", "worst")},
                  "after": {e: after[k][e] for e in ("median", "worst")}} for k in before}
    provenance = {"kernels": len(rows), "error_before": report["all"]["before"],
                  "error_after": report["all"]["after"]}
    return Calibration(gpu, cal.launch_us, bandwidth, compute, provenance), report
