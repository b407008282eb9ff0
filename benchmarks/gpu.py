"""apsat's GPU kernels timed on an NVIDIA GPU, end to end and per kernel, against PyTorch
eager, torch.compile and onnxruntime's CUDA execution provider.

Models (benchmarks/gpu_models.py): the light zoo's CNNs, the real zoo's transformers, a
BERT-base-sized encoder and MLP3. Each runs in a process of its own (spawned), so a crash
or a broken CUDA context is that row's failure; its row is written to OUT/rows/<model>.json
as soon as it is done, so nothing measured is lost. gpu_bench.py says what each column is.

Per kernel, the measured time (triton.testing.do_bench's median) is set against the
roofline's; OUT/measurements.json collects them in the form benchmarks/calibrate_gpu.py
fits. With --tune, every kernel shape this GPU's tuning cache lacks is searched first
(apsat/backends/gpu/profile.py; at most --limit candidates each) and recorded there.

Half precision: NAME_fp16 is model NAME converted to float16 by onnxruntime's own tool
(gpu_models.half); --fp16 adds NAME_fp16 after every model named, and a last table sets each
fp16 row beside its fp32 one (apsat's Triton kernels, torch.compile, the modelled time).
--budget SECONDS starts no model after that much time, and stops a model (its row says so)
that would run past it.

Without a GPU (or with --cpu) the apsat columns run under the Triton interpreter: use the
test-sized models (--small); the times then say nothing about a GPU, and the tables say so.

Usage:
  python benchmarks/gpu.py [MODEL ...] [--small] [--fp16] [--budget S] [--tune] [--limit 8] [--iters 50]
         [--compile-mode max-autotune-no-cudagraphs|default|none] [--skip torch ort] [--out DIR]
  python benchmarks/gpu.py --table DIR      print the tables of an earlier run
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

COLUMNS = ["triton", "triton_graph", "cuda", "cuda_graph", "eager", "compile", "ort_cuda"]
TARGETS = {"resnet50": "compile", "bert_base": "compile", "mlp3": "eager"}   # model -> baseline
TARGET_RATIO = {"compile": 1.0, "eager": 2.0}


def _child(name: str, opts, queue):
    import gpu_bench

    try:
        row = gpu_bench.measure(name, opts)
    except Exception as e:  # noqa: BLE001 -- the model's failure is its row
        row = {"model": name, "error": f"{type(e).__name__}: {str(e).strip()[:300]}"}
    queue.put(json.dumps(row, default=float))


def run_model(name: str, opts, timeout: float | None = None) -> dict:
    """gpu_bench.measure(name) in a fresh process (stopped after `timeout` seconds), or
    its failure as a row."""
    if not opts.isolate:
        import gpu_bench

        return gpu_bench.measure(name, opts)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(name, opts, queue))
    proc.start()
    proc.join(timeout)
    if proc.is_alive():           # past the time budget: the row says so
        proc.terminate()
        proc.join()
        return {"model": name, "error": f"stopped: past the time budget ({timeout:.0f} s left for it)"}
    return json.loads(queue.get()) if not queue.empty() else {"model": name, "error": f"crashed (exit {proc.exitcode})"}


def _commit() -> str:
    res = subprocess.run(["git", "-C", str(HERE), "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True, check=False)
    return res.stdout.strip() or "unknown"


def measurements(rows: list[dict]) -> dict:
    """The per-kernel measurements of `rows` in calibrate_gpu.py's form."""
    kernels = [{"model": r["model"], **{k: kr[k] for k in ("name", "kind", "flops", "bytes", "modelled_us",
                                                          "measured_us", "prepare")}}
               for r in rows for kr in r.get("kernel_rows", [])]
    gpus = sorted({r["device"] for r in rows if "device" in r})
    return {"gpu": ", ".join(gpus), "commit": _commit(), "date": time.strftime("%Y-%m-%d"), "kernels": kernels}


def _ms(x) -> str:
    return f"{x:9.3f}" if isinstance(x, (int, float)) else f"{'-':>9}"


def print_models(rows: list[dict]) -> None:
    head = f"{'model':20} {'kern':>4} {'host':>4} {'model ms':>9} " + " ".join(f"{c:>12}" for c in COLUMNS)
    print(head + f" {'apsat/compile':>13} {'apsat/eager':>11}")
    for r in rows:
        if "error" in r:
            print(f"{r['model']:20} error: {r['error']}")
            continue
        ms = r["ms"]
        best = min((ms[c] for c in COLUMNS[:4] if c in ms), default=None)
        ratio = {b: f"{ms[b] / best:.2f}" if best and b in ms else "-" for b in ("compile", "eager")}
        print(f"{r['model']:20} {r.get('kernels', 0):4d} {r.get('host_steps', 0):4d} {_ms(r.get('modelled_ms'))} "
              + " ".join(f"{_ms(ms.get(c)):>12}" for c in COLUMNS)
              + f" {ratio['compile']:>13} {ratio['eager']:>11}")
    print("ms: median per inference; apsat/X: X's time over apsat's best column (> 1: apsat faster)")
    for r in rows:
        for note in r.get("notes", []):
            print(f"  {r['model']}: {note}")


def _errors(ks: list[dict]) -> list[float]:
    return [abs(k["modelled_us"] - k["measured_us"]) / k["measured_us"] for k in ks if k["measured_us"] > 0]


def print_kernels(rows: list[dict]) -> None:
    """The roofline's error per kernel against measurement, by model and by kind."""
    ks = [{**k, "model": r["model"]} for r in rows for k in r.get("kernel_rows", []) if k["kind"] != "host"]
    if not ks:
        return
    print(f"\n{'group':20} {'kernels':>7} {'measured ms':>11} {'modelled ms':>11} {'median err':>10} {'worst err':>9}")
    groups = [(r["model"], [k for k in ks if k["model"] == r["model"]]) for r in rows]
    groups += [(f"kind {kind}", [k for k in ks if k["kind"] == kind]) for kind in sorted({k["kind"] for k in ks})]
    for label, g in groups + [("all", ks)]:
        errs = _errors(g)
        if errs:
            print(f"{label:20} {len(g):7d} {sum(k['measured_us'] for k in g) / 1e3:11.3f} "
                  f"{sum(k['modelled_us'] for k in g) / 1e3:11.3f} {statistics.median(errs):10.1%} {max(errs):9.1%}")
    print("err: |modelled - measured| / measured per kernel (the data-sheet roofline unless a calibration is active)")


def print_targets(rows: list[dict]) -> None:
    by = {r["model"]: r for r in rows if "ms" in r}
    for model, base in TARGETS.items():
        r = by.get(model)
        if r is None:
            continue
        best = min((r["ms"][c] for c in COLUMNS[:4] if c in r["ms"]), default=None)
        if best and base in r["ms"]:
            ratio = r["ms"][base] / best
            verdict = "met" if ratio >= TARGET_RATIO[base] else "missed"
            print(f"target {model}: {base} / apsat = {ratio:.2f} (target >= {TARGET_RATIO[base]:.1f}): {verdict}")


def print_precision(rows: list[dict]) -> None:
    """Each NAME_fp16 row beside NAME's: ms of apsat's Triton kernels and of torch.compile,
    and the modelled time, in fp32 and fp16, with fp32 / fp16 (the speed-up)."""
    import gpu_models

    by = {r["model"]: r for r in rows if "ms" in r}
    pairs = [(n.removesuffix(gpu_models.HALF_SUFFIX), n) for n in by if n.endswith(gpu_models.HALF_SUFFIX)]
    pairs = [(a, b) for a, b in pairs if a in by]
    if not pairs:
        return
    cols = [("triton", lambda r: r["ms"].get("triton")), ("compile", lambda r: r["ms"].get("compile")),
            ("modelled", lambda r: r.get("modelled_ms"))]
    print(f"\n{'model':20} " + " ".join(f"{c + ' fp32':>14} {c + ' fp16':>14} {'x':>6}" for c, _ in cols))
    for a, b in pairs:
        cells = []
        for _, get in cols:
            x, y = get(by[a]), get(by[b])
            cells.append(f"{_ms(x):>14} {_ms(y):>14} " + (f"{x / y:6.2f}" if x and y else f"{'-':>6}"))
        print(f"{a:20} " + " ".join(cells))
    print("fp16: the model converted by onnxruntime's float16 tool; x: fp32 / fp16 (> 1: fp16 faster)")


def print_tables(rows: list[dict]) -> None:
    devices = sorted({r["device"] for r in rows if "device" in r})
    print(f"device: {', '.join(devices) or 'none'}")
    print_models(rows)
    print_kernels(rows)
    print_targets(rows)
    print_precision(rows)
    if not any(d.startswith("NVIDIA") for d in devices):
        print("No NVIDIA GPU: the kernels ran under the Triton interpreter on the CPU; these times say "
              "nothing about a GPU.")


def main(argv=None) -> int:
    import gpu_models

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*")
    ap.add_argument("--small", action="store_true", help="the test-sized models (for the interpreter)")
    ap.add_argument("--fp16", action="store_true", help="also each model in float16 (NAME_fp16)")
    ap.add_argument("--budget", type=float, default=None, help="seconds: no model starts, or runs, past it")
    ap.add_argument("--cpu", action="store_true", help="the interpreter even where a GPU is present")
    ap.add_argument("--tune", action="store_true", help="search the tiles of shapes the tuning cache lacks")
    ap.add_argument("--limit", type=int, default=8, help="candidates per searched kernel shape")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--compile-mode", default="max-autotune-no-cudagraphs")
    ap.add_argument("--skip", nargs="*", default=[], choices=["torch", "ort"])
    ap.add_argument("--out", type=Path, default=Path("gpu-bench"))
    ap.add_argument("--no-isolate", dest="isolate", action="store_false", help="all models in this process")
    ap.add_argument("--table", type=Path, help="print the tables of an earlier run's folder")
    opts = ap.parse_args(argv)
    if opts.table:
        print_tables([json.loads(p.read_text()) for p in sorted((opts.table / "rows").glob("*.json"))])
        return 0
    names = opts.models or (gpu_models.SMALL if opts.small else gpu_models.all_names())
    if opts.fp16:
        names = [v for n in names for v in (n, n + gpu_models.HALF_SUFFIX) if not n.endswith(gpu_models.HALF_SUFFIX)]
    unknown = [n for n in names if not gpu_models.known(n)]
    if unknown:
        print(f"gpu.py: unknown model(s) {', '.join(unknown)}; known: {', '.join(gpu_models.all_names())}")
        return 2
    (opts.out / "rows").mkdir(parents=True, exist_ok=True)
    rows, start = [], time.perf_counter()
    for i, name in enumerate(names, 1):
        t = time.perf_counter()
        left = None if opts.budget is None else opts.budget - (t - start)
        if left is not None and left <= 0:
            print(f"[{i}/{len(names)}] {name}: not started, the time budget is spent", flush=True)
            continue
        print(f"[{i}/{len(names)}] {name} ...", flush=True)
        row = run_model(name, opts, left)
        (opts.out / "rows" / f"{name}.json").write_text(json.dumps(row, indent=1, default=float))
        rows.append(row)
        print(f"[{i}/{len(names)}] {name}: {row.get('error', 'done')} ({time.perf_counter() - t:.0f} s)", flush=True)
    (opts.out / "measurements.json").write_text(json.dumps(measurements(rows), indent=1))
    print_tables(rows)
    return 0 if not any("error" in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
