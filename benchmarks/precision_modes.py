"""Lower precision as a rewrite (`--precision`): the light zoo and the real-zoo set optimised
for gpu at fp32 and at each asked precision, with the modelled speed-up and the error.

Per row: the modelled time of the chosen program's kernels (µs, the gpu roofline by element
type, as emitted), the speed-up over the same model at fp32, the kernels, how many of the
computing nodes compute in the half type, and the error against the float32 original (the
largest difference from a float64 run, scaled by the output's largest value, on seeded
inputs) with the bound it is judged by (default: 8 ulps of the type). A run past its bound
is refused by apsat (PrecisionError): its row says "refused" and what was measured. Light
models have seeded random weights (seed 0), the real zoo its own weights and stored inputs.

`--gpu-models NAME ...` adds benchmarks/gpu_models.py's models (bert_base: BERT-base at 128
tokens, drawn weights; mlp3_b512) after the zoos.

Usage: python benchmarks/precision_modes.py [NAME_SUBSTRING ...] [--zoo light|real|all|none]
                                            [--modes fp16,mixed] [--max-error E] [--gpu-models NAME ...]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from precision import models  # noqa: E402
from real_zoo import stored_inputs  # noqa: E402


def run(name: str, zoo: str, path, mode: str, max_error=None) -> dict:
    """One model at one precision ("fp32" is the baseline): optimise for gpu, verified."""
    import onnx

    from apsat.errors import VerificationError
    from apsat.pipeline.optimize import optimize
    from apsat.pipeline.zoo import randomize_weights

    start = time.perf_counter()
    kw = {}
    if zoo == "gpu_models":
        import gpu_models

        proto, inputs = gpu_models.load(name)
        kw = {"inputs": inputs}
    else:
        proto = onnx.load(str(path))
        proto = randomize_weights(proto, seed=0) if zoo == "light" else proto
    if zoo == "real":
        inputs = stored_inputs(name)
        kw = {"inputs": inputs, "input_shapes": {k: v.shape for k, v in inputs.items()}}
    kw.update({} if mode == "fp32" else {"precision": mode, "max_error": max_error})
    try:
        result = optimize(proto, target="gpu", **kw)
    except VerificationError as e:      # refused: past its bound
        return {"model": name, "mode": mode, "status": "refused", "why": str(e), "s": time.perf_counter() - start}
    totals = result.report["gpu_kernels"]["totals"]
    p = result.report.get("precision", {})
    v = result.report["verification"]
    return {"model": name, "mode": mode, "status": "ok" if v["ok"] else "FAILED",
            "us": totals["modelled_us"], "kernels": totals["inference_kernels"],
            "half": f"{p['half_nodes']}/{p['nodes']}" if p else "-", "error": p.get("error", v.get("err_apsat")),
            "bound": p.get("max_error"), "s": time.perf_counter() - start}


def _e(x) -> str:
    return "-" if x is None else f"{x:.2e}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("filters", nargs="*")
    ap.add_argument("--zoo", choices=("light", "real", "all", "none"), default="all")
    ap.add_argument("--gpu-models", nargs="*", default=[])
    ap.add_argument("--modes", default="fp16,mixed")
    ap.add_argument("--max-error", type=float, default=None)
    args = ap.parse_args(argv)
    print(f"{'model':20} {'mode':6} {'status':8} {'µs':>8} {'speed-up':>8} {'kernels':>7} {'half':>8} "
          f"{'error':>9} {'bound':>9} {'s':>6}")
    rows, silent = [], 0
    chosen = models(args.filters, args.zoo) if args.zoo != "none" else []
    for name, zoo, path in chosen + [(g, "gpu_models", None) for g in args.gpu_models]:
        base = None
        for mode in ["fp32"] + args.modes.split(","):
            r = run(name, zoo, path, mode, args.max_error)
            rows.append(r)
            base = r.get("us") if mode == "fp32" else base
            speed = f"{base / r['us']:.2f}x" if base and r.get("us") else "-"
            silent += r["status"] == "FAILED"
            if r["status"] == "refused":
                print(f"{name:20} {mode:6} refused  {r['why'][:90]}", flush=True)
                continue
            print(f"{name:20} {mode:6} {r['status']:8} {r.get('us', 0):8.1f} {speed:>8} {r.get('kernels', '-'):>7} "
                  f"{r['half']:>8} {_e(r['error']):>9} {_e(r['bound']):>9} {r['s']:6.1f}", flush=True)
    lowered = [r for r in rows if r["mode"] != "fp32"]
    print(f"{len(lowered)} lower-precision runs: {sum(r['status'] == 'ok' for r in lowered)} within their bound, "
          f"{sum(r['status'] == 'refused' for r in lowered)} refused, {silent} past it unrefused")
    return 1 if silent else 0


if __name__ == "__main__":
    sys.exit(main())
