"""The real-zoo set (tests/data/real_zoo, made by benchmarks/export_zoo.py) through apsat:
per model and target, import / optimise / verify status, the largest error against
onnxruntime (the reference interpreter's and, on systolic targets, the simulator's),
seconds, peak memory, kernels per inference on gpu against onnxruntime's node count after
ORT_ENABLE_EXTENDED, host steps and opaque ops.

Each model and target runs in its own process, so peak memory (max RSS) is per run and a
crash is that row's failure. Inputs are the set's stored ones (token ids, masks).
Usage: python benchmarks/real_zoo.py [NAME_SUBSTRING ...] [--targets gpu,systolic:32x32]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
ZOO = ROOT / "tests" / "data" / "real_zoo"
TARGETS = ("gpu", "systolic:32x32")


def zoo_models(filters=()) -> list[dict]:
    """The manifest's entries (name, file, inputs, ...) whose name contains a filter."""
    models = json.loads((ZOO / "manifest.json").read_text())["models"]
    return [{"name": name, **entry} for name, entry in models.items()
            if not filters or any(f in name for f in filters)]


def stored_inputs(name: str) -> dict:
    """The set's stored inputs for a model (its .npz minus the `output:` arrays)."""
    import numpy as np

    with np.load(ZOO / f"{name}.npz") as data:
        return {k: data[k] for k in data.files if not k.startswith("output:")}


def ort_extended_nodes(path: Path) -> int:
    """Nodes of onnxruntime's own optimised graph (ORT_ENABLE_EXTENDED, CPU)."""
    import tempfile

    import onnx
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        opts.optimized_model_filepath = str(Path(tmp) / "opt.onnx")
        opts.log_severity_level = 3
        ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        return len(onnx.load(opts.optimized_model_filepath).graph.node)


def measure(name: str, target: str) -> dict:
    """One model on one target: the benchmark's row."""
    from apsat.pipeline.optimize import optimize

    row = {"model": name, "target": target}
    t = time.perf_counter()
    try:
        inputs = stored_inputs(name)       # their shapes fix the symbolic model's dims
        res = optimize(ZOO / f"{name}.onnx", target=target, inputs=inputs,
                       input_shapes={k: v.shape for k, v in inputs.items()})
    except Exception as e:     # an ApsatError is the expected refusal; anything else a bug
        row.update(status=f"error: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        return row
    r = res.report
    v = r["verification"]
    run = (r.get("systolic") or {}).get("simulation") or {}
    errs = [v["max_abs_err"]] + ([run["max_abs_err"]] if "max_abs_err" in run else [])
    ok = v["ok"] and run.get("ok", True)
    section = r.get("gpu_kernels") or r.get("systolic") or {}
    host = section.get("totals", {}).get("host_steps") if "totals" in section else section.get("host_steps")
    row.update(status="ok" if ok else "MISMATCH", max_err=max(errs), seconds=time.perf_counter() - t,
               host_steps=host if isinstance(host, int) else len(host or []),
               opaque=r["opaque_ops"], egraph_nodes=r["egraph"]["nodes"],
               phases={k: round(s, 2) for k, s in r["seconds"].items()})
    if target == "gpu":
        row["kernels"] = section["totals"]["kernels"]
        row["ort_nodes"] = ort_extended_nodes(ZOO / f"{name}.onnx")
    return row


def _child(name: str, target: str, queue):
    row = measure(name, target)
    row["peak_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    queue.put(row)


def run_isolated(name: str, target: str) -> dict:
    """measure() in a fresh process (spawned: nothing inherited), its peak RSS with it."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(name, target, queue))
    proc.start()
    proc.join()
    if queue.empty():
        return {"model": name, "target": target, "status": f"crashed (exit {proc.exitcode})"}
    return queue.get()


def print_table(rows: list[dict]):
    head = (f"{'model':<20} {'target':<15} {'status':<9} {'max err':>8} {'s':>6} {'MiB':>6} "
            f"{'e-nodes':>8} {'kernels':>7} {'ort ext':>7} {'host':>4}  opaque")
    print(head)
    print("-" * len(head))
    for r in rows:
        if "max_err" not in r:
            print(f"{r['model']:<20} {r['target']:<15} {r['status']}")
            continue
        opaque = ", ".join(f"{k}x{n}" for k, n in sorted(r["opaque"].items())) or "-"
        print(f"{r['model']:<20} {r['target']:<15} {r['status']:<9} {r['max_err']:>8.1e} "
              f"{r['seconds']:>6.1f} {r.get('peak_mib', 0):>6.0f} {r['egraph_nodes']:>8} "
              f"{r.get('kernels', ''):>7} {r.get('ort_nodes', ''):>7} {r['host_steps']:>4}  {opaque}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("filters", nargs="*", help="model name substrings (default: all)")
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args(argv)
    rows = []
    for m in zoo_models(args.filters):
        for target in args.targets.split(","):
            rows.append(run_isolated(m["name"], target))
            print(f"  {m['name']} {target}: {rows[-1]['status']} "
                  f"({rows[-1].get('seconds', 0):.1f} s)", file=sys.stderr, flush=True)
    print_table(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    bad = [r for r in rows if r["status"] != "ok"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
