"""Pipeline timings on the ONNX light zoo: import, e-graph load, saturation (no rules),
extraction and evaluation seconds, e-graph sizes and peak memory per model.

Each model runs in its own process so peak memory (max RSS) is per model.
Usage: python benchmarks/pipeline.py [MODEL_NAME_SUBSTRING ...] [--no-eval]
"""
from __future__ import annotations

import multiprocessing as mp
import resource
import sys
import time


def _rss_mib() -> float:
    """Current resident set size of this process, MiB (Linux /proc)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def measure(path: str, evaluate: bool) -> dict:
    import onnx

    from apsat.explore.egraph import EGraph
    from apsat.frontend.importer import load_onnx
    from apsat.extract import extract
    from apsat.pipeline.zoo import random_inputs, randomize_weights

    proto = randomize_weights(onnx.load(path), seed=0)
    row = {"onnx_nodes": len(proto.graph.node)}  # after weights became initializers
    t = time.perf_counter()
    model = load_onnx(proto)
    row["import_s"] = time.perf_counter() - t
    t = time.perf_counter()
    eg = EGraph()  # fixed cost: egglog and the language (~150 MiB RSS, measured apart)
    rss = _rss_mib()
    handles = eg.add_outputs(model.program)
    row["egraph_s"] = time.perf_counter() - t
    row["egraph_mib"] = _rss_mib() - rss  # what the model's nodes add
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


def measure_chain(n: int) -> dict:
    """A synthetic n-node program (relu / residual-add chain) through e-graph load and
    extraction: the scaling check for time and memory."""
    from apsat.explore.egraph import EGraph
    from apsat.lang.program import Program
    from apsat.lang.term import Term
    from apsat.extract import extract

    x = Term("access", (Term("access-tensor", ("x",)), 1))
    cur, relu, add = x, Term("relu", ()), Term("elementwise-add", ())
    for _ in range(n // 3):  # three new nodes per step
        nxt = Term("compute", (relu, cur))
        cur = Term("compute", (add, Term("access-pair", (nxt, cur))))
    prog = Program({"y": cur}, {"x": (4, 8)})
    eg = EGraph()
    rss = _rss_mib()
    t = time.perf_counter()
    handles = eg.add_outputs(prog)
    load = time.perf_counter() - t
    mib = _rss_mib() - rss
    t = time.perf_counter()
    extract(eg, handles)
    return {"nodes": eg.size()[0], "load_s": load, "extract_s": time.perf_counter() - t, "mib": mib}


def _child(path, evaluate, queue):
    try:
        queue.put(measure(path, evaluate))
    except Exception as exc:  # report, don't hide: the table shows the failure
        queue.put({"error": f"{type(exc).__name__}: {exc}"})


def _chain_child(n, queue):
    queue.put(measure_chain(n))


def main(argv):
    from pathlib import Path

    from apsat.pipeline.zoo import light_model_paths

    evaluate = "--no-eval" not in argv
    wanted = [a for a in argv if not a.startswith("--")]
    paths = [p for p in light_model_paths() if not wanted or any(w in p.stem for w in wanted)]
    ctx = mp.get_context("spawn")
    cols = ["model", "onnx_nodes", "nodes", "classes", "import_s", "egraph_s", "saturate_s",
            "extract_s", "import+extract_s", "eval_s", "egraph_mib", "peak_mib"]
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
        # e-graph memory per node, to check it grows linearly with model size (peak RSS
        # is dominated by the weights: VGG-19's are 548 MiB of float32)
        per = ", ".join(f"{r['model']} {r['egraph_mib'] / r['nodes'] * 1000:.1f}" for r in rows)
        print("\ne-graph MiB per 1k nodes:", per)
    print("\nscaling (synthetic relu/residual-add chain): nodes | load_s | extract_s | e-graph MiB | MiB per 1k nodes")
    for n in (5_000, 10_000, 20_000, 40_000):
        q = ctx.Queue()
        proc = ctx.Process(target=_chain_child, args=(n, q))
        proc.start()
        r = q.get()
        proc.join()
        print(f"{r['nodes']} | {r['load_s']:.2f} | {r['extract_s']:.2f} | {r['mib']:.1f} | "
              f"{r['mib'] / r['nodes'] * 1000:.2f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
