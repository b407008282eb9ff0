"""Pipeline timings on the ONNX light zoo: import, e-graph load, saturation (no rules),
extraction and evaluation seconds, e-graph sizes and peak memory per model.

Each model runs in its own process so peak memory (max RSS) is per model.
Usage: python benchmarks/pipeline.py [MODEL_NAME_SUBSTRING ...] [--no-eval]
"""
from __future__ import annotations

import json
import multiprocessing as mp
import resource
import sys
import time


def measure(path: str, evaluate: bool) -> dict:
    import onnx

    from apsat.egraph.egraph import EGraph
    from apsat.egraph.importer import load_onnx
    from apsat.extract import extract
    from apsat.zoo import random_inputs, randomize_weights

    proto = randomize_weights(onnx.load(path), seed=0)
    row = {"onnx_nodes": len(proto.graph.node)}
    t = time.perf_counter()
    model = load_onnx(proto)
    row["import_s"] = time.perf_counter() - t
    t = time.perf_counter()
    eg = EGraph()
    handles = eg.add_outputs(model.program)
    row["egraph_s"] = time.perf_counter() - t
    row["nodes"], row["classes"] = eg.size()
    t = time.perf_counter()
    row["saturate_s"] = 0.0  # no rules enabled: the foundation pipeline
    program = extract(eg, handles, method="tree")
    row["extract_s"] = time.perf_counter() - t
    row["program_nodes"] = len(program.terms())
    if evaluate:
        t = time.perf_counter()
        out = program and model.run(random_inputs(model, 0))
        row["eval_s"] = time.perf_counter() - t
        del out
    row["peak_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return row


def _child(path, evaluate, queue):
    try:
        queue.put(measure(path, evaluate))
    except Exception as exc:  # report, don't hide: the table shows the failure
        queue.put({"error": f"{type(exc).__name__}: {exc}"})


def main(argv):
    from pathlib import Path

    from apsat.zoo import light_model_paths

    evaluate = "--no-eval" not in argv
    wanted = [a for a in argv if not a.startswith("--")]
    paths = [p for p in light_model_paths() if not wanted or any(w in p.stem for w in wanted)]
    ctx = mp.get_context("spawn")
    cols = ["model", "onnx_nodes", "nodes", "classes", "import_s", "egraph_s", "saturate_s",
            "extract_s", "import+extract_s", "eval_s", "peak_mib"]
    print(" | ".join(cols))
    print(" | ".join("---" for _ in cols))
    rows = []
    for p in paths:
        q = ctx.Queue()
        proc = ctx.Process(target=_child, args=(str(p), evaluate, q))
        proc.start()
        row = q.get()
        proc.join()
        row["model"] = Path(p).stem.replace("light_", "")
        if "error" in row:
            print(f"{row['model']} | error: {row['error']}")
            continue
        row["import+extract_s"] = row["import_s"] + row["egraph_s"] + row["extract_s"]
        rows.append(row)
        print(" | ".join(f"{row[c]:.2f}" if isinstance(row.get(c), float) else str(row.get(c, "-")) for c in cols),
              flush=True)
    if len(rows) > 1:
        # memory per e-graph node, to check growth is linear in model size
        per = [(r["peak_mib"], r["nodes"]) for r in rows]
        print("\npeak MiB per 1k e-graph nodes:", ", ".join(f"{m / n * 1000:.1f}" for m, n in per))
    json.dump(rows, sys.stderr) if "--json" in argv else None


if __name__ == "__main__":
    main(sys.argv[1:])
