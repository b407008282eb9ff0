"""Saturation on the ONNX light zoo: per model and phase, seconds, e-nodes, e-classes, stop
reason and overshoot (e-nodes over the phase's node limit). Each model runs in its own
process.

Usage: python benchmarks/saturate.py [--target gpu|systolic:32x32] [--regions]
       [--rules RULESET ...] [--node-limit N] [--time-limit S] [--iter-limit N] [MODEL_SUBSTRING ...]
--regions: saturate region by region and print the region reuse rate. --rules: run those
rulesets as one phase (e.g. `--rules tiling --node-limit 200000 resnet50`, the explosive
family) instead of the target's default plan; the limits apply to that phase only.
"""
from __future__ import annotations

import multiprocessing as mp
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # run from a checkout


def measure(path: str, target: str, regions: bool = False, rules=None, limits=None) -> dict:
    import onnx

    from apsat.explore.egraph import EGraph
    from apsat.frontend.importer import load_onnx
    from apsat.pipeline.zoo import randomize_weights

    model = load_onnx(randomize_weights(onnx.load(path), seed=0))
    eg = EGraph(target=target)
    eg.add_outputs(model.program)
    loaded = eg.size()
    t = time.perf_counter()
    report = eg.saturate(rules=rules, regions=model.program if regions else None, **(limits or {}))
    report["total_s"] = time.perf_counter() - t
    report["loaded"] = loaded
    return report


def _child(path, target, regions, rules, limits, queue):
    try:
        queue.put(measure(path, target, regions, rules, limits))
    except Exception as exc:  # shown in the table, not hidden
        queue.put({"error": f"{type(exc).__name__}: {exc}"})


def _option(argv, flag, convert, multi=False):
    """Take `flag VALUE` (or, with multi, `flag V1 V2 ..` up to the next flag) out of argv."""
    if flag not in argv:
        return None, argv
    i = argv.index(flag)
    j = i + 2
    if multi:
        while j < len(argv) and not argv[j].startswith("--"):
            j += 1
        return [convert(v) for v in argv[i + 1:j]], argv[:i] + argv[j:]
    return convert(argv[i + 1]), argv[:i] + argv[j:]


def main(argv):
    from apsat.pipeline.zoo import light_model_paths

    target, argv = _option(argv, "--target", str)
    target = target or "gpu"
    rules, argv = _option(argv, "--rules", str, multi=True)
    limits = {}
    for flag, key, convert in [("--node-limit", "node_limit", int), ("--time-limit", "time_limit", float),
                               ("--iter-limit", "iter_limit", int)]:
        value, argv = _option(argv, flag, convert)
        if value is not None:
            limits[key] = value
    regions = "--regions" in argv
    argv = [a for a in argv if a != "--regions"]
    paths = [p for p in light_model_paths() if not argv or any(a in p.stem for a in argv)]
    ctx = mp.get_context("spawn")
    print(f"target {target}" + (f", rules {' '.join(rules)}" if rules else "") +
          "".join(f", {k} {v}" for k, v in limits.items()))
    print("model | phase | seconds | e-nodes | e-classes | stop reason | over limit")
    print("--- | --- | --- | --- | --- | --- | ---")
    total, worst = 0.0, (0, "")
    for p in paths:
        q = ctx.Queue()
        proc = ctx.Process(target=_child, args=(str(p), target, regions, rules, limits, q))
        proc.start()
        r = q.get()
        proc.join()
        name = Path(p).stem.replace("light_", "")
        if "error" in r:
            print(f"{name} | error | {r['error']}")
            continue
        print(f"{name} | (loaded) | - | {r['loaded'][0]} | {r['loaded'][1]} | - | -")
        for ph in r["phases"]:
            print(f"{name} | {ph['phase']} | {ph['seconds']:.2f} | {ph['nodes']} | {ph['classes']} | "
                  f"{ph['stop_reason']} | {ph['overshoot']}")
            worst = max(worst, (ph["overshoot"], f"{name} {ph['phase']}"))
        for sk in r["skipped"]:
            print(f"{name} | {sk['phase']} | - | - | - | skipped: {sk['reason']} | -")
        reuse = ""
        if "regions" in r:
            st = r["regions"]
            reuse = f"regions {st['regions']}, distinct {st['distinct']}, reuse rate {st['reuse_rate']:.0%}"
        print(f"{name} | total | {r['total_s']:.2f} | {r['nodes']} | {r['classes']} | {reuse or '-'} | "
              f"{r.get('overshoot', 0)}", flush=True)
        total += r["total_s"]
    print(f"\nzoo total saturation seconds: {total:.1f}")
    print(f"largest overshoot over a node limit: {worst[0]} e-nodes" + (f" ({worst[1]})" if worst[0] else ""))


if __name__ == "__main__":
    main(sys.argv[1:])
