"""Saturation with the default phase plan on the ONNX light zoo: per model and phase,
seconds, e-nodes, e-classes and stop reason. Each model runs in its own process.

Usage: python benchmarks/saturate.py [--target gpu|systolic:32x32] [--regions] [MODEL_SUBSTRING ...]
(--regions: saturate region by region and print the region reuse rate)
"""
from __future__ import annotations

import multiprocessing as mp
import sys
import time


def measure(path: str, target: str, regions: bool = False) -> dict:
    import onnx

    from apsat.egraph.egraph import EGraph
    from apsat.egraph.importer import load_onnx
    from apsat.zoo import randomize_weights

    model = load_onnx(randomize_weights(onnx.load(path), seed=0))
    eg = EGraph(target=target)
    eg.add_outputs(model.program)
    loaded = eg.size()
    t = time.perf_counter()
    report = eg.saturate(regions=model.program if regions else None)
    report["total_s"] = time.perf_counter() - t
    report["loaded"] = loaded
    return report


def _child(path, target, regions, queue):
    try:
        queue.put(measure(path, target, regions))
    except Exception as exc:  # shown in the table, not hidden
        queue.put({"error": f"{type(exc).__name__}: {exc}"})


def main(argv):
    from pathlib import Path

    from apsat.zoo import light_model_paths

    target = "gpu"
    if "--target" in argv:
        i = argv.index("--target")
        target = argv[i + 1]
        argv = argv[:i] + argv[i + 2:]
    regions = "--regions" in argv
    argv = [a for a in argv if a != "--regions"]
    paths = [p for p in light_model_paths() if not argv or any(a in p.stem for a in argv)]
    ctx = mp.get_context("spawn")
    print(f"target {target}")
    print("model | phase | seconds | e-nodes | e-classes | stop reason")
    print("--- | --- | --- | --- | --- | ---")
    total = 0.0
    for p in paths:
        q = ctx.Queue()
        proc = ctx.Process(target=_child, args=(str(p), target, regions, q))
        proc.start()
        r = q.get()
        proc.join()
        name = Path(p).stem.replace("light_", "")
        if "error" in r:
            print(f"{name} | error | {r['error']}")
            continue
        print(f"{name} | (loaded) | - | {r['loaded'][0]} | {r['loaded'][1]} | -")
        for ph in r["phases"]:
            print(f"{name} | {ph['phase']} | {ph['seconds']:.2f} | {ph['nodes']} | {ph['classes']} | {ph['stop_reason']}")
        for sk in r["skipped"]:
            print(f"{name} | {sk['phase']} | - | - | - | skipped: {sk['reason']}")
        reuse = ""
        if "regions" in r:
            st = r["regions"]
            reuse = f"regions {st['regions']}, distinct {st['distinct']}, reuse rate {st['reuse_rate']:.0%}"
        print(f"{name} | total | {r['total_s']:.2f} | {r['nodes']} | {r['classes']} | {reuse or '-'}", flush=True)
        total += r["total_s"]
    print(f"\nzoo total saturation seconds: {total:.1f}")


if __name__ == "__main__":
    main(sys.argv[1:])
