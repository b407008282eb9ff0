"""apsat's ONNX export against the original model in onnxruntime: node counts and CPU latency.

For every model of the light zoo (the onnx package's nine CNNs, seeded random weights and
inputs exactly as `apsat zoo` gives them) and the real-zoo set (tests/data/real_zoo, its
stored inputs, their shapes fixing the symbolic dims as benchmarks/real_zoo.py does), one
process, one model after another. The dynamic set (tests/data/dynamic and the real zoo's
distilbert_dynamic; `--zoo dynamic`) is optimised with its symbolic dims kept and its one
export timed at three sizes, a row each (`bert@1x5`: batch 1, sequence 5):
  - optimise with apsat for target gpu (verify=False) and export (`export_model`: the one
    place the exporter, OptimizeResult.to_onnx, is called);
  - node counts: the original, onnxruntime's own optimised graph of it at
    ORT_ENABLE_EXTENDED and at ORT_ENABLE_ALL (CPU, saved with optimized_model_filepath),
    and the export;
  - status: onnx.checker.check_model(export, full_check=True), then the export's outputs
    (onnxruntime at ORT_DISABLE_ALL and at ORT_ENABLE_ALL) against the original's at
    ORT_DISABLE_ALL with apsat.pipeline.verify.compare's default tolerances;
  - latency (onnxruntime CPU, 2 intra-op threads, 1 inter-op): the original at
    ORT_DISABLE_ALL and at ORT_ENABLE_ALL and the export at ORT_ENABLE_ALL, interleaved
    run by run (round-robin, each round in the next of the six orders) so that the noise
    of a shared machine falls on all three alike; medians of at least --runs timed runs after --warmup
    ones, more where they would take a session under --min-seconds (the "runs" column).
    Sessions do not spin between runs (onnxruntime's default would steal the next
    session's cores on a small machine).
ratio = median(original, ENABLE_ALL) / median(export, ENABLE_ALL): above 1 the export is
faster. A model that fails is its row's status; the exit status is 1 when any row is not ok.

Usage: python benchmarks/onnx_out.py [NAME_SUBSTRING ...] [--zoo light|real|all]
           [--runs N] [--warmup N] [--min-seconds S] [--json PATH]
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from real_zoo import ZOO, stored_inputs, zoo_models  # noqa: E402

DYNAMIC = ROOT / "tests" / "data" / "dynamic"    # models with symbolic dims (export_dynamic.py)
SEED = 0            # `apsat zoo`'s default --seed: the light zoo's weights and inputs
WIN = 1.05          # a ratio above this counts as a win (below it: within the noise)
MAX_RUNS = 10_000   # the most timed runs --min-seconds asks of a session


def export_model(res):
    """The export of an OptimizeResult as an onnx.ModelProto: the one call of the
    exporter, so that a test (or a stand-in while it is written) replaces only this."""
    return res.to_onnx()


def models(filters=(), zoo: str = "all") -> list[dict]:
    """The entries to measure: {"name", "zoo", "path"}, light zoo first (its names without
    the `light_` prefix), each kept when its name contains a filter (or none is given)."""
    from apsat.pipeline.zoo import light_model_paths

    out = []
    if zoo in ("light", "all"):
        for p in light_model_paths():
            out.append({"name": p.stem.replace("light_", ""), "zoo": "light", "path": str(p)})
    if zoo in ("real", "all"):
        out += [{"name": m["name"], "zoo": "real", "path": str(ZOO / m["file"])} for m in zoo_models()]
    if zoo in ("dynamic", "all"):
        out += [{"name": p.stem, "zoo": "dyn", "path": str(p)} for p in sorted(DYNAMIC.glob("*.onnx"))]
        out.append({"name": "distilbert_dynamic", "zoo": "dyn", "path": str(ZOO / "distilbert_dynamic.onnx")})
    return [e for e in out if not filters or any(f in e["name"] for f in filters)]


def optimise(entry: dict):
    """(original ModelProto, OptimizeResult, inputs) for one entry, as `apsat zoo` (light)
    or benchmarks/real_zoo.py (real) would optimise it for gpu; no verification here."""
    import onnx

    from apsat.pipeline.optimize import optimize
    from apsat.pipeline.zoo import random_inputs, randomize_weights

    if entry["zoo"] == "real":
        proto = onnx.load(entry["path"])
        inputs = stored_inputs(entry["name"])
        res = optimize(proto, target="gpu", verify=False, inputs=inputs,
                       input_shapes={k: v.shape for k, v in inputs.items()})
        return proto, res, inputs
    proto = randomize_weights(onnx.load(entry["path"]), seed=SEED)
    res = optimize(proto, target="gpu", verify=False)
    # the loaded Model's inputs: what `apsat zoo` verifies on with its default seed
    return proto, res, random_inputs(res.model, SEED)


def session(proto, level: str, save_to: str | None = None):
    """An onnxruntime CPU session of `proto` at optimisation `level` ("disable",
    "extended", "all"), 2 intra-op threads and 1 inter-op (the timing setting); with
    `save_to`, onnxruntime writes its optimised graph there."""
    import onnxruntime as ort

    levels = {"disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
              "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
              "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}
    opts = ort.SessionOptions()
    opts.graph_optimization_level = levels[level]
    opts.intra_op_num_threads = 2
    opts.inter_op_num_threads = 1
    # Interleaved sessions: a session's idle workers spin after each run by default and
    # steal the 2 cores from the next session's run (3x the latency of squeezenet here).
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.log_severity_level = 3
    if save_to:
        opts.optimized_model_filepath = save_to
    return ort.InferenceSession(proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def ort_nodes(proto, level: str) -> int:
    """Nodes of onnxruntime's own optimised graph of `proto` at `level`."""
    import onnx

    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "opt.onnx")
        session(proto, level, save_to=path)
        return len(onnx.load(path).graph.node)


def checker_status(export) -> list[str]:
    """[] when onnx.checker.check_model(full_check=True) accepts the export, else one
    line saying why."""
    import onnx

    try:
        onnx.checker.check_model(export, full_check=True)
    except Exception as e:     # ValidationError, or shape inference's InferenceError
        return [f"checker: {one_line(e)}"]
    return []


def outputs(sess, inputs: dict) -> dict:
    """Every output of a session on `inputs`, by name."""
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, inputs)))


def mismatches(want: dict, export_sessions: dict, inputs: dict) -> list[str]:
    """[] when every export session's outputs (sessions by level name) match `want` (the
    original's at ORT_DISABLE_ALL) within compare's default tolerances, else one line
    naming the outputs the export lacks or the levels that differ and by how much."""
    from apsat.pipeline.verify import compare

    differ = []
    for level, sess in export_sessions.items():
        got = outputs(sess, inputs)
        missing = sorted(set(want) - set(got))
        if missing:
            return [f"MISMATCH: the export lacks outputs {missing}"]
        v = compare(want, got)
        if not v.ok:
            differ.append(f"at {level} max abs err {v.max_abs_err:.2e}, max rel err {v.max_rel_err:.2e}")
    return [f"MISMATCH: the export {'; '.join(differ)}"] if differ else []


def latency(sessions: dict, inputs: dict, runs: int, warmup: int, min_seconds: float) -> dict:
    """Median milliseconds per run of each session (by key) and the timed runs each made:
    at least `runs`, more where the warm-up says `runs` would take a session less than
    `min_seconds` (sub-millisecond models: 20 medians of a shared machine are noise). The
    sessions take turns run by run, each round in the next of all their orders (a rotation
    alone would keep who follows whom), so a slow spell of the machine and the caches a
    predecessor leaves fall on all of them alike."""
    orders = list(itertools.permutations(sessions))
    spent = [sum(one_round(sessions, orders[i % len(orders)], inputs).values()) for i in range(warmup)]
    if spent:
        per_run = statistics.median(spent) / len(sessions)
        runs = max(runs, min(MAX_RUNS, math.ceil(min_seconds / max(per_run, 1e-9))))
    times: dict[str, list[float]] = {k: [] for k in sessions}
    for i in range(runs):
        for k, seconds in one_round(sessions, orders[(warmup + i) % len(orders)], inputs).items():
            times[k].append(seconds)
    return {**{k: 1000 * statistics.median(v) for k, v in times.items()}, "runs": runs}


def one_round(sessions: dict, order: tuple, inputs: dict) -> dict:
    """Seconds of one run of each session, run in `order`."""
    out = {}
    for k in order:
        t = time.perf_counter()
        sessions[k].run(None, inputs)
        out[k] = time.perf_counter() - t
    return out


def dynamic_sizes(symbols: dict) -> list[dict]:
    """Three sizes for a model with symbolic dims: every symbol at its first other check
    (batch 1, sequence 5), at its second (batch 4, sequence 40), at its representative."""
    return [{n: s.checks[1] for n, s in symbols.items()}, {n: s.checks[2] for n, s in symbols.items()},
            {n: s.value for n, s in symbols.items()}]


def measure_dynamic(entry: dict, runs: int = 20, warmup: int = 5, min_seconds: float = 1.0) -> list[dict]:
    """A model with symbolic dims: optimised once with none fixed, its one export timed
    against the original at each of dynamic_sizes (a row each, `model@a x b`)."""
    import onnx

    from apsat.errors import ShapeError
    from apsat.pipeline.dynamic import model_at
    from apsat.pipeline.optimize import optimize
    from apsat.pipeline.zoo import random_inputs

    try:
        proto = onnx.load(entry["path"])
        res = optimize(proto, target="gpu")     # verified: built at sizes the original runs at
        if res.general is None:
            raise RuntimeError(f"not general: {res.report['dynamic'].get('why')}")
        export = export_model(res)
    except Exception as e:  # noqa: BLE001 - the model's one row says why
        return [{"model": entry["name"], "zoo": entry["zoo"], "status": f"error: {one_line(e)}"}]
    rows = []
    nodes = {"nodes_orig": len(proto.graph.node), "nodes_ort_ext": ort_nodes(proto, "extended"),
             "nodes_ort_all": ort_nodes(proto, "all"), "nodes_export": len(export.graph.node)}
    for values in dynamic_sizes(res.model.symbols):
        row = {"model": f"{entry['name']}@{'x'.join(map(str, values.values()))}", "zoo": entry["zoo"], **nodes}
        status = checker_status(export)
        try:
            at = model_at(res.model, res.general, values)[0]
        except ShapeError as e:      # past the model's range (its position table): not a size to time
            rows.append({**row, "status": f"skipped: the model does not take these sizes ({one_line(e)})"})
            continue
        try:
            inputs = random_inputs(at, SEED)
            timed = {"ms_orig_disable": session(proto, "disable"), "ms_orig_all": session(proto, "all"),
                     "ms_export": session(export, "all")}
            status += mismatches(outputs(timed["ms_orig_disable"], inputs),
                                 {"ORT_ENABLE_ALL": timed["ms_export"]}, inputs)
            row.update(latency(timed, inputs, runs, warmup, min_seconds))
            row["ratio"] = row["ms_orig_all"] / row["ms_export"]
        except Exception as e:  # noqa: BLE001
            status.append(f"error: {one_line(e)}")
        row["status"] = "; ".join(status) or "ok"
        rows.append(row)
    return rows


def measure(entry: dict, runs: int = 20, warmup: int = 5, min_seconds: float = 1.0) -> dict:
    """One model's row: node counts, latency medians, ratio and status (any exception is
    the status, in one line)."""
    row = {"model": entry["name"], "zoo": entry["zoo"]}
    status: list[str] = []
    try:
        proto, res, inputs = optimise(entry)
        export = export_model(res)
        row.update(nodes_orig=len(proto.graph.node), nodes_ort_ext=ort_nodes(proto, "extended"),
                   nodes_ort_all=ort_nodes(proto, "all"), nodes_export=len(export.graph.node))
        status += checker_status(export)
        timed = {"ms_orig_disable": session(proto, "disable"), "ms_orig_all": session(proto, "all"),
                 "ms_export": session(export, "all")}
        want = outputs(timed["ms_orig_disable"], inputs)
        status += mismatches(want, {"ORT_DISABLE_ALL": session(export, "disable"),
                                    "ORT_ENABLE_ALL": timed["ms_export"]}, inputs)
        row.update(latency(timed, inputs, runs, warmup, min_seconds))
        row["ratio"] = row["ms_orig_all"] / row["ms_export"]
    except Exception as e:    # ApsatError (a refusal) or a bug: this row's status either way
        status.append(f"error: {one_line(e)}")
    row["status"] = "; ".join(status) or "ok"
    return row


def one_line(e: Exception) -> str:
    """An exception as `Type: first line of its message`."""
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


# (row key, heading, format): node counts, then median milliseconds per run
COLUMNS = (("model", "model", "<20"), ("zoo", "zoo", "<5"), ("nodes_orig", "n.orig", ">6"),
           ("nodes_ort_ext", "n.ort-ext", ">9"), ("nodes_ort_all", "n.ort-all", ">9"),
           ("nodes_export", "n.export", ">8"), ("ms_orig_disable", "ms.orig-dis", ">11"),
           ("ms_orig_all", "ms.orig-all", ">11"), ("ms_export", "ms.export", ">9"),
           ("runs", "runs", ">5"), ("ratio", "ratio", ">6"), ("status", "status", ""))


def print_table(rows: list[dict]):
    """One line per row: node counts (original, onnxruntime's at EXTENDED and ALL, the
    export), milliseconds (original DISABLE_ALL, original ALL, export ALL), ratio, status."""
    print(" ".join(f"{head:{fmt}}" for _, head, fmt in COLUMNS))
    for r in rows:
        cells = []
        for key, _, fmt in COLUMNS:
            value = r.get(key, "-")
            if isinstance(value, float):
                value = f"{value:.2f}" if key == "ratio" else f"{value:.3f}"
            cells.append(f"{value:{fmt}}")
        print(" ".join(cells))


def geomean(values: list[float]) -> float:
    """The geometric mean (nan for none)."""
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def summary(rows: list[dict]) -> list[str]:
    """The lines under the table: geomean ratio (all, per zoo), the smallest ratio, the
    wins (ratio > WIN), exports with more nodes than onnxruntime's smaller graph, and every
    status that is not ok. Ratios count only where the status is ok: a wrong export's
    speed is no win."""
    timed = [r for r in rows if "ratio" in r and r["status"] == "ok"]
    lines = [f"geomean ratio (original ORT_ENABLE_ALL / export ORT_ENABLE_ALL; > 1: export faster; "
             f"ok rows only): all {geomean([r['ratio'] for r in timed]):.3f} ({len(timed)} models)"]
    for zoo in ("light", "real", "dyn"):
        ratios = [r["ratio"] for r in timed if r["zoo"] == zoo]
        if ratios:
            lines.append(f"  {zoo} {geomean(ratios):.3f} ({len(ratios)} models)")
    if timed:
        low = min(timed, key=lambda r: r["ratio"])
        lines.append(f"smallest ratio: {low['ratio']:.3f} ({low['model']})")
    wins = [f"{r['model']} ({r['ratio']:.2f})" for r in timed if r["ratio"] > WIN]
    lines.append(f"apsat's export wins on (ratio > {WIN}): {', '.join(wins) or 'none'}")
    more = [f"{r['model']} ({r['nodes_export']} > {min(r['nodes_ort_ext'], r['nodes_ort_all'])})"
            for r in rows if "nodes_ort_ext" in r and "nodes_export" in r
            and r["nodes_export"] > min(r["nodes_ort_ext"], r["nodes_ort_all"])]
    lines.append(f"export has more nodes than onnxruntime's own: {', '.join(more) or 'none'}")
    bad = [f"  {r['model']}: {r['status']}" for r in rows if not _fine(r)]
    lines += [f"not ok: {len(bad)}"] + bad if bad else ["not ok: none"]
    return lines


def main(argv=None) -> int:
    """Measure the models the filters name, print the table and summary; 1 when any row
    is not ok."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("filters", nargs="*", help="model name substrings (default: all)")
    parser.add_argument("--zoo", choices=("light", "real", "dynamic", "full", "all"), default="all",
                        help="dynamic: models with symbolic dims, one export timed at three sizes; "
                             "full: ResNet-50, ViT-B/16, BERT-base at full size (onnx_out_full.py)")
    parser.add_argument("--runs", type=int, default=20, help="timed runs per session, at least (default 20)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed runs first (default 5)")
    parser.add_argument("--min-seconds", type=float, default=1.0, metavar="S",
                        help="more timed runs where --runs would take a session less than S "
                             "seconds, as the warm-up estimates (default 1; 0: exactly --runs)")
    parser.add_argument("--json", metavar="PATH", help="also write the rows to this file")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.warmup < 0:
        parser.error("--runs must be at least 1 and --warmup not negative")
    if args.zoo == "full":
        from onnx_out_full import main as full_size

        return full_size(list(args.filters) + ["--runs", str(args.runs)])
    entries = models(args.filters, args.zoo)
    if not entries:
        parser.error("no model matches the filters")
    rows = []
    for entry in entries:
        t = time.perf_counter()
        got = (measure_dynamic if entry["zoo"] == "dyn" else measure)(entry, args.runs, args.warmup, args.min_seconds)
        rows += got if isinstance(got, list) else [got]
        print(f"  {entry['name']}: {rows[-1]['status']} ({time.perf_counter() - t:.1f} s)",
              file=sys.stderr, flush=True)
    print_table(rows)
    print("\n".join(summary(rows)))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 1 if not all(_fine(r) for r in rows) else 0


def _fine(row: dict) -> bool:
    """ok, or a size the model itself does not take (skipped, with the reason)."""
    return row["status"] == "ok" or row["status"].startswith("skipped:")


if __name__ == "__main__":
    sys.exit(main())
