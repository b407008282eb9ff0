"""Models as large as people deploy: time per phase and peak memory against weight bytes.

Builds (seeded, nothing downloaded: benchmarks/scale_models.py) Llama-shaped decoders of
0.1B, 0.4B, 0.75B and 1.2B parameters and a ViT-L/16, each as an .onnx with its weights as
external data, and runs each in a process of its own: `apsat.optimize` (gpu target,
verified against onnxruntime on the original), the kernels written (not compiled, not
run) and the ONNX export. Per model it prints the wall time of each phase, the peak
resident memory of the whole run (the process's high-water mark), its ratio to the
weight bytes, the kernels per inference, the verification error (against onnxruntime on
the original; float32 past 0.27B parameters, see docs/verification.md), and, from a
process of its own, the export's largest difference from the original in onnxruntime.

    python benchmarks/scale.py [--models llama-0.1b,vit-l16] [--dir ~/.cache/apsat/scale]
                               [--no-verify] [--no-write]

The models are built once into --dir (3.0 GB for the 0.75B decoder, 4.9 GB for 1.2B) and
reused. The table is in docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import scale_models  # noqa: E402

MODELS = [*scale_models.LLAMA, *scale_models.VIT]
COLUMNS = ("model", "params", "weight GB", "import s", "saturate s", "extract s", "lower s", "verify s",
           "write s", "export s", "total s", "peak GB", "peak / weights", "kernels", "max abs err",
           "export err", "status")


def build(name: str, directory: Path) -> tuple[Path, int]:
    """The model's path under `directory` (built when absent) and its weight bytes."""
    path = directory / f"{name}.onnx"
    data = Path(str(path) + ".data")
    if not (path.exists() and data.exists()):
        directory.mkdir(parents=True, exist_ok=True)
        (scale_models.llama if name in scale_models.LLAMA else scale_models.vit)(path, name)
    return path, data.stat().st_size


def run_one(path: Path, verify: bool, write: bool) -> dict:
    """Optimise, write and export one model here; the figures as a dict."""
    import apsat

    out: dict = {}
    start = time.perf_counter()
    res = apsat.optimize(path, target="gpu", verify=verify, seed=0)
    seconds = res.report["seconds"]
    out.update(seconds={k: round(v, 2) for k, v in seconds.items()},
               kernels=res.report["extraction"].get("kernels"),
               err=(res.report.get("verification") or {}).get("max_abs_err"),
               ok=(res.report.get("verification") or {}).get("ok"))
    if write:
        t = time.perf_counter()
        res.write(path.parent / f"{path.stem}-out", compile_kernels=False)
        out["write"] = round(time.perf_counter() - t, 2)
        t = time.perf_counter()
        res.to_onnx(path.parent / f"{path.stem}-out" / "optimized.onnx")
        out["export"] = round(time.perf_counter() - t, 2)
    out["total"] = round(time.perf_counter() - start, 2)
    out["peak"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return out


def check_export(original: Path, exported: Path) -> dict:
    """onnxruntime on the original and on the export (each from its path, with its
    external data), on the same seeded inputs: the largest difference and whether it is
    within apsat's fixed tolerance (rtol 1e-4, atol 1e-5 x max |output|). Run in a
    process of its own, so its sessions do not count in the optimisation's peak."""
    import numpy as np
    import onnxruntime as ort

    from apsat.pipeline.verify import compare

    rng = np.random.default_rng(0)
    sess = ort.InferenceSession(str(original), providers=["CPUExecutionProvider"])
    feeds = {}
    for i in sess.get_inputs():
        dims = [int(d) for d in i.shape]
        feeds[i.name] = (rng.integers(0, 1000, dims) if "int64" in i.type
                         else rng.standard_normal(dims).astype(np.float32))
    want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    del sess
    got_sess = ort.InferenceSession(str(exported), providers=["CPUExecutionProvider"])
    got = dict(zip([o.name for o in got_sess.get_outputs()], got_sess.run(None, feeds)))
    v = compare(want, got)
    return {"export_err": f"{v.max_abs_err:.2g}", "export_ok": v.ok}


def row(name: str, weight_bytes: int, fig: dict) -> list[str]:
    s = fig.get("seconds", {})

    def secs(*keys):
        return f"{sum(s.get(k, 0.0) for k in keys):.1f}"

    if "error" in fig:
        return [name, f"{weight_bytes / 4e9:.2f}B", f"{weight_bytes / 1e9:.2f}"] + ["-"] * 9 + \
               [f"{fig['peak'] / 1e9:.1f}" if fig.get("peak") else "-", "-", "-", "-", "-", fig["error"][:60]]
    return [name, f"{weight_bytes / 4e9:.2f}B", f"{weight_bytes / 1e9:.2f}", secs("import", "egraph"),
            secs("saturate"), secs("extract"), secs("lower", "price before"),
            secs("oracle", "verify", "backend check"), str(fig.get("write", "-")), str(fig.get("export", "-")),
            f"{fig['total']:.1f}", f"{fig['peak'] / 1e9:.1f}", f"{fig['peak'] / weight_bytes:.2f}x",
            str(fig.get("kernels", "-")), f"{fig['err']:.2g}" if fig.get("err") is not None else "-",
            fig.get("export_err", "-"),
            "ok" if fig.get("ok") in (True, None) and fig.get("export_ok", True) else "MISMATCH"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--dir", default=str(Path.home() / ".cache" / "apsat" / "scale"))
    ap.add_argument("--no-verify", action="store_true")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--one", help=argparse.SUPPRESS)      # the child: run one model, print JSON
    ap.add_argument("--check-export", nargs=2, help=argparse.SUPPRESS)   # the child: original, export
    args = ap.parse_args()
    if args.check_export:
        print(json.dumps(check_export(*map(Path, args.check_export))))
        return
    if args.one:
        try:
            fig = run_one(Path(args.one), not args.no_verify, not args.no_write)
        except Exception as e:   # the table shows what failed
            fig = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
                   "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
        print(json.dumps(fig))
        return
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS))
    for name in args.models.split(","):
        path, weight_bytes = build(name, Path(args.dir).expanduser())
        cmd = [sys.executable, __file__, "--one", str(path)] + \
              (["--no-verify"] if args.no_verify else []) + (["--no-write"] if args.no_write else [])
        proc = subprocess.run(cmd, capture_output=True, text=True)
        lines = proc.stdout.strip().splitlines()
        fig = json.loads(lines[-1]) if proc.returncode == 0 and lines else \
            {"error": f"exit {proc.returncode}: {(proc.stderr.strip().splitlines() or ['killed'])[-1]}"}
        exported = path.parent / f"{path.stem}-out" / "optimized.onnx"
        if "error" not in fig and not args.no_write:
            check = subprocess.run([sys.executable, __file__, "--check-export", str(path), str(exported)],
                                   capture_output=True, text=True)
            out = check.stdout.strip().splitlines()
            fig.update(json.loads(out[-1]) if check.returncode == 0 and out else
                       {"export_err": "failed", "export_ok": False})
        print("| " + " | ".join(row(name, weight_bytes, fig)) + " |", flush=True)


if __name__ == "__main__":
    main()
