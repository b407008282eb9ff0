"""Fit the gpu roofline's constants (apsat/targets/gpu_calibration.py) to measured kernels.

Usage: python benchmarks/calibrate_gpu.py MEASUREMENTS.json [--out apsat/targets/gpu_calibration.json]

MEASUREMENTS.json is what benchmarks/gpu.py writes on a machine with a GPU:
    {"gpu": NAME, "commit": SHA, "date": DATE,
     "kernels": [{"model", "name", "kind", "flops", "bytes", "modelled_us", "measured_us"}, ...]}
The kernels compute in fp32, so the peaks fitted against are the data sheet's fp32 FLOP/s
and HBM bandwidth. Rows of kind "host" (host steps, as apsat.backends.gpu.profile writes
them) cross PCIe, not HBM, and are left out of the fit. Prints, per kernel kind, the count and the median and worst relative
error of the data-sheet model and of the fit, then the fitted constants; with --out,
writes the calibration (with its provenance) there. A malformed file: one line, exit 2.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from apsat.errors import ApsatError, CalibrationError
from apsat.targets import gpu_calibration
from apsat.targets.gpu import HBM_BYTES_PER_US, LAUNCH_US, TFLOPS

EXIT_BAD_INPUT = 2


def read(path: str) -> dict:
    """The measurements file, checked at the top level (fit checks each kernel)."""
    try:
        with open(path) as f:
            data = json.load(f)
    except OSError as exc:
        raise CalibrationError(f"cannot read ({exc.strerror or exc.__class__.__name__})") from None
    except ValueError:
        raise CalibrationError("not JSON") from None
    if not isinstance(data, dict):
        raise CalibrationError("not a JSON object")
    for key in ("gpu", "commit", "date"):
        if not isinstance(data.get(key), str) or not data[key]:
            raise CalibrationError(f"{key!r} must be a non-empty string")
    if not isinstance(data.get("kernels"), list) or not data["kernels"]:
        raise CalibrationError("'kernels' must be a non-empty list")
    return data


def table(report: dict, cal) -> list[str]:
    """The error table and the fitted constants, as lines."""
    pct = "{:7.1%}".format
    lines = [f"{'kind':<12}{'n':>5}  {'before: median':>14} {'worst':>7}  {'after: median':>13} {'worst':>7}"]
    for kind, r in report.items():
        b, a = r["before"], r["after"]
        lines.append(f"{kind:<12}{r['n']:>5}  {pct(b['median']):>14} {pct(b['worst'])}  "
                     f"{pct(a['median']):>13} {pct(a['worst'])}")
    lines.append(f"launch {cal.launch_us:.3g} us")
    for kind in gpu_calibration.KINDS:
        lines.append(f"{kind:<12} bandwidth {cal.bandwidth[kind]:.3f}  compute {cal.compute[kind]:.3f}"
                     + ("" if kind in report else "  (no kernels: data sheet)"))
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("measurements")
    parser.add_argument("--out", help="write the calibration JSON here")
    args = parser.parse_args(argv)
    try:
        data = read(args.measurements)
        kernels = [k for k in data["kernels"] if not (isinstance(k, dict) and k.get("kind") == "host")]
        cal, report = gpu_calibration.fit(kernels, TFLOPS["fp32"] * 1e6, HBM_BYTES_PER_US, LAUNCH_US,
                                              gpu=data["gpu"])
    except ApsatError as exc:
        print(f"calibrate_gpu: {args.measurements}: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    host = len(data["kernels"]) - len(kernels)
    print(f"{data['gpu']} at {data['commit']} ({data['date']}): {len(kernels)} kernels"
          + (f" ({host} host step{'s' * (host > 1)} left out)" if host else ""))
    print("\n".join(table(report, cal)))
    if args.out:
        provenance = {"commit": data["commit"], "date": data["date"], **cal.provenance}
        gpu_calibration.dump(dataclasses.replace(cal, provenance=provenance), args.out)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
