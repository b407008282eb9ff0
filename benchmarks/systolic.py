"""The systolic backend on the ONNX light zoo: cycles, utilisation and DRAM traffic of the
compiled instruction stream (apsat.backends.systolic) for two programs per model and array.

  baseline  what SCALE-Sim assumes: every convolution and GEMM its own im2col GEMM layer on
            the array (rulesets im2col + systolic only), no fusion: bias, activation and
            BatchNorm run as separate vector passes through DRAM.
  apsat     apsat's extracted program: the systolic target's default plan (layout ->
            fusion -> relayout -> im2col -> systolic), so bias and activation become the
            GEMM's vector epilogue, BatchNorm folds into weights, and convolutions chain in
            NHWC without transposes between them; extracted for the preset array made
            flexible (dataflow "flex": each product in its own dataflow or osk loop
            order, the fewest DRAM words within flex_slack of its fewest cycles).

Both are extracted by the systolic cost model and lowered by the same backend
(weight-only work, such as weight transposes and BatchNorm folding, goes to the stream's
init section and is not counted per inference). The baseline is run on the preset array
with each fixed dataflow (os, ws, is) and the best total is kept: "the best single fixed
dataflow for that model". apsat is run the same way and on the flexible array twice
(its default flex_slack, and 0: "flex-fastest", each product its fastest), the fewest
cycles of the five kept (column "df"); the "fixed" column is apsat's best fixed dataflow
alone, what per-product dataflow choice adds shows between the two. The summary also
takes each model's run by the flexible array's own rule over the five (the fewest DRAM
words within FLEX_CYCLE_SLACK of the fewest cycles): the other end of the trade.

Each is lowered twice: with the backend's defaults, which follow the extractor's cost
model (im2col matrices whose input does not fit the ifmap scratchpad are materialised in
DRAM; transposes and pads are DMA copies), and with im2col="gather", fold_copies=True,
fuse_zips=True (windows gathered from DRAM by the DMA, transposes and pads as address
patterns, concatenations built in place from GEMM results, an element-wise op over a fused GEMM's result in that GEMM's epilogue): one
table each.

Columns: total cycles per inference, utilisation against the compute bound
(MACs / (rows * cols) over total cycles), DRAM words read + written, the ratios baseline /
apsat, apsat's utilisation ceiling (the compute bound over the array's own busy cycles:
what pipeline fills and folds narrower than the array allow even with all DMA, vector
and host work hidden; host MACs count as not on the array), host MACs (dot-products no
rule maps to the array, e.g. grouped convolutions, run on the host at one MAC a cycle),
"layer" (_layer_best: the utilisation apsat's GEMMs would reach each in its best
dataflow, or on the flexible array split with the vector unit where that is faster,
with nothing else taking time: the most per-layer mapping choice can give; n/a with
grouped convolutions),
the DRAM floor (dram_floor: words any program must move, its weights read once) and
"max x", baseline / floor: the most any program could cut the baseline's traffic.

Element widths (8- and 16-bit operands against SCALE-Sim at both word sizes):
benchmarks/systolic_width.py.

Usage: python benchmarks/systolic.py [MODEL_SUBSTRING ...] [--arrays 32x32,256x256]
       [--cache DIR]   (extracted programs are cached there; default /tmp/apsat-systolic-bench)
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from pathlib import Path

DATAFLOWS = ("os", "ws", "is")
FLEX = "flex"
# The flexible array a second time with flex_slack 0: each product takes its fastest
# dataflow (the default slack trades up to 10% of a product's cycles for fewer words).
FLEX_FASTEST = "flex-fastest"
BASELINE_PLAN = ((("im2col",), 16), (("systolic",), 30))
APSAT_PLAN = None                      # the target's default plan (apsat.rules.saturate.default_plan)


def _program(model, array: str, plan, cache: Path, key: str, dataflow: str | None = None):
    """The program extracted from `model` saturated under `plan`, by the systolic cost
    model of the preset `array` (its own dataflow, or `dataflow`; the extraction is not
    repeated per fixed dataflow: on DenseNet-121 one extraction takes minutes). Cached as
    DAG text."""
    from apsat.targets.accelerator import PRESETS

    acc = PRESETS[array]
    acc = dataclasses.replace(acc, dataflow=dataflow) if dataflow else acc
    return extracted(model, acc, plan, cache / f"{key}-{array}{'-' + dataflow if dataflow else ''}.txt")


def extracted(model, acc, plan, file: Path):
    """`model`'s program saturated under `plan` (None: the target's default plan) and
    extracted by accelerator `acc`'s cost model; cached as DAG text in `file` (a model
    with opaque calls is not cached: their nodes are not in the text)."""
    from apsat.explore.egraph import EGraph
    from apsat.extract import extract
    from apsat.lang.program import Program
    from apsat.lang.syntax import parse_dag_text, to_dag_text

    if file.exists() and not model.program.opaque_nodes:
        return Program(parse_dag_text(file.read_text()), dict(model.program.tensor_shapes))
    eg = EGraph(target=acc)
    handles = eg.add_outputs(model.program)
    if plan is None:
        eg.saturate()
    for rulesets, iters in plan or ():
        eg.saturate(rules=list(rulesets), iter_limit=iters)
    prog = extract(eg, handles)
    if not model.program.opaque_nodes:
        file.write_text(to_dag_text(prog.outputs))
    return prog


BACKENDS = {"cost-model": {}, "gather+fold+zips": {"im2col": "gather", "fold_copies": True, "fuse_zips": True}}


def _layer_best(rep: dict, acc) -> float | None:
    """The utilisation of the stream's GEMMs (main section) if each ran in its best
    dataflow with unlimited bandwidth and nothing else took time: their MACs over
    rows * cols * the sum of each product's fewest compute cycles (gemm_cost). What
    choosing the dataflow per layer can reach at most, SCALE-Sim's model being the
    array's; only a different folding of the products themselves goes beyond it. On a
    flexible array a one-row product's split with the vector unit counts where it is
    faster (targets.vector_share). None for a stream with grouped or depthwise products
    (their groups are not one GEMM)."""
    from apsat.targets.systolic import gemm_cost
    from apsat.targets.vector_share import vector_share

    main = [g for g in rep["groups"] if g["section"] == "main"]
    if any(g["kind"] == "grouped" for g in main):
        return None
    gemms = [g for g in main if g["kind"] == "gemm"]

    def fewest(m, k, n):
        array = min(gemm_cost(acc, m, k, n, df).compute_cycles for df in DATAFLOWS)
        share = vector_share(acc, m, k, n, 0)
        return min(array, share.total_cycles) if share else array

    best = sum(fewest(g["m"], g["k"], g["n"]) for g in gemms)
    return sum(g["macs"] for g in gemms) / (acc.rows * acc.cols * best) if best else 0.0


def _best(prog, array: str, weights, opts: dict, dataflows=DATAFLOWS) -> dict:
    """The dataflow whose stream has the fewest total cycles, with its figures, and
    "fixed": the fewest total cycles of a fixed dataflow."""
    from apsat.backends import systolic
    from apsat.targets.accelerator import PRESETS

    best = None
    fixed = math.inf
    rows = []
    for df in dataflows:
        acc = (dataclasses.replace(PRESETS[array], dataflow=FLEX, flex_slack=0.0) if df == FLEX_FASTEST
               else dataclasses.replace(PRESETS[array], dataflow=df))
        rep = systolic.cycles(systolic.compile(prog, acc, weights=weights, **opts))
        row = {"dataflow": df, "cycles": rep["total_cycles"], "utilization": rep["utilization"],
               "layer_best": _layer_best(rep, acc),
               "ceiling": rep["array_efficiency"] * rep["macs"] / max(rep["macs"] + rep["host_macs"], 1),
               "dram": rep["dram"]["total"], "host_macs": rep["host_macs"], "macs": rep["macs"],
               "host_steps": len(rep["host_steps"])}
        rows.append(row)
        if df not in (FLEX, FLEX_FASTEST):
            fixed = min(fixed, row["cycles"])
        if best is None or row["cycles"] < best["cycles"]:
            best = row
    best["fixed"] = fixed
    best["by_rule"] = _by_flex_rule(rows)
    return best


def _by_flex_rule(rows: list[dict]) -> dict:
    """{dataflow, cycles, dram} of the run a flexible array's own rule would take over
    the whole model: the fewest DRAM words among the runs within FLEX_CYCLE_SLACK of the
    fewest cycles (the rule fused_gemm_cost applies per product)."""
    from apsat.targets.accelerator import FLEX_CYCLE_SLACK

    fastest = min(r["cycles"] for r in rows)
    near = [r for r in rows if r["cycles"] <= fastest * (1 + FLEX_CYCLE_SLACK)]
    pick = min(near, key=lambda r: (r["dram"], r["cycles"]))
    return {k: pick[k] for k in ("dataflow", "cycles", "dram")}


WEIGHTED_OPS = {"Conv": 1, "Gemm": 1, "MatMul": 1}      # op type -> index of its weight input


def dram_floor(proto) -> int:
    """DRAM words every program of the model must move per inference when, like both
    programs here, it keeps nothing on chip from one inference to the next: each
    convolution and matrix-product weight read once (BatchNorm folding keeps its size),
    the graph inputs read once, the outputs written once. A lower bound: it charges
    nothing for intermediate tensors, which the scratchpads mostly cannot hold."""
    g = proto.graph
    sizes = {t.name: math.prod(t.dims) for t in g.initializer}
    weights = {n.input[WEIGHTED_OPS[n.op_type]] for n in g.node
               if n.op_type in WEIGHTED_OPS and n.input[WEIGHTED_OPS[n.op_type]] in sizes}

    def words(v) -> int:
        return math.prod(d.dim_value for d in v.type.tensor_type.shape.dim)

    io = sum(words(v) for v in g.input if v.name not in sizes) + sum(words(v) for v in g.output)
    return sum(sizes[w] for w in weights) + io


def run(names, arrays, cache: Path) -> list[dict]:
    import onnx

    from apsat.frontend.importer import load_onnx
    from apsat.pipeline.zoo import light_model_paths, randomize_weights

    cache.mkdir(parents=True, exist_ok=True)
    rows = []
    for path in light_model_paths():
        name = path.stem.replace("light_", "")
        if names and not any(n in name for n in names):
            continue
        proto = randomize_weights(onnx.load(str(path)), seed=0)
        model = load_onnx(proto)
        floor = dram_floor(proto)
        for array in arrays:
            t = time.perf_counter()
            progs = (_program(model, array, BASELINE_PLAN, cache, f"{name}-baseline"),
                     _program(model, array, APSAT_PLAN, cache, f"{name}-apsat", FLEX))
            for backend, opts in BACKENDS.items():
                base = _best(progs[0], array, model.weights, opts)
                mine = _best(progs[1], array, model.weights, opts, DATAFLOWS + (FLEX, FLEX_FASTEST))
                rows.append({"model": name, "array": array, "backend": backend, "baseline": base,
                             "apsat": mine, "dram_floor": floor, "seconds": time.perf_counter() - t})
                print(_line(rows[-1]), flush=True)
        del model, proto
    return rows


HEADER = (f"{'backend':16s} {'model':12s} {'array':8s} | {'baseline df':>3s} {'cycles':>12s} {'util':>6s} {'DRAM words':>13s} "
          f"| {'apsat df':>3s} {'cycles':>12s} {'util':>6s} {'DRAM words':>13s} | {'cyc x':>6s} {'DRAM x':>6s} "
          f"| {'fixed':>12s} {'cyc x':>6s} | {'ceiling':>7s} {'layer':>6s} {'host MACs':>11s} "
          f"| {'DRAM floor':>13s} {'max x':>6s}")


def _percent(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def _line(r: dict) -> str:
    b, a = r["baseline"], r["apsat"]
    return (f"{r['backend']:16s} {r['model']:12s} {r['array']:8s} | {b['dataflow']:>11s} {b['cycles']:12,d} {b['utilization']:6.1%} "
            f"{b['dram']:13,d} | {a['dataflow']:>8s} {a['cycles']:12,d} {a['utilization']:6.1%} {a['dram']:13,d} "
            f"| {b['cycles'] / a['cycles']:6.2f} {b['dram'] / a['dram']:6.2f} "
            f"| {a['fixed']:12,d} {b['cycles'] / a['fixed']:6.2f} | {a['ceiling']:7.1%} {_percent(a['layer_best']):>6s} {a['host_macs']:11,d} "
            f"| {r['dram_floor']:13,d} {b['dram'] / r['dram_floor']:6.2f}")


def summary(rows: list[dict]) -> list[str]:
    """Per array: geometric means of the ratios and ratios of the zoo totals, with apsat's
    fewest-cycles run per model (the tables') and with the run the flexible array's own
    trade-off rule takes (_by_flex_rule)."""
    from apsat.targets.accelerator import FLEX_CYCLE_SLACK

    out = []
    for backend, array in sorted({(r["backend"], r["array"]) for r in rows}):
        rs = [r for r in rows if r["array"] == array and r["backend"] == backend]
        gm = lambda xs: math.exp(sum(math.log(x) for x in xs) / len(xs))  # noqa: E731
        cyc = gm([r["baseline"]["cycles"] / r["apsat"]["cycles"] for r in rs])
        dram = gm([r["baseline"]["dram"] / r["apsat"]["dram"] for r in rs])
        tot_c = sum(r["baseline"]["cycles"] for r in rs) / sum(r["apsat"]["cycles"] for r in rs)
        tot_d = sum(r["baseline"]["dram"] for r in rs) / sum(r["apsat"]["dram"] for r in rs)
        fixed = gm([r["baseline"]["cycles"] / r["apsat"]["fixed"] for r in rs])
        most = gm([r["baseline"]["dram"] / r["dram_floor"] for r in rs])
        most_tot = sum(r["baseline"]["dram"] for r in rs) / sum(r["dram_floor"] for r in rs)
        out.append(f"{backend} {array}: {len(rs)} models; fewer cycles {cyc:.2f}x (geomean), {tot_c:.2f}x (zoo total); "
                   f"less DRAM traffic {dram:.2f}x (geomean), {tot_d:.2f}x (zoo total), at most "
                   f"{most:.2f}x (geomean), {most_tot:.2f}x (zoo total) by the DRAM floor; "
                   f"apsat on a fixed dataflow {fixed:.2f}x fewer cycles (geomean)")
        rule = [r["apsat"]["by_rule"] for r in rs]
        picks = ", ".join(f"{r['model']} {x['dataflow']}" for r, x in zip(rs, rule))
        r_cyc = gm([r["baseline"]["cycles"] / x["cycles"] for r, x in zip(rs, rule)])
        r_dram = gm([r["baseline"]["dram"] / x["dram"] for r, x in zip(rs, rule)])
        r_tot_c = sum(r["baseline"]["cycles"] for r in rs) / sum(x["cycles"] for x in rule)
        r_tot_d = sum(r["baseline"]["dram"] for r in rs) / sum(x["dram"] for x in rule)
        out.append(f"  the same, each model's run taken by the flexible array's rule (fewest DRAM words "
                   f"within {FLEX_CYCLE_SLACK:.0%} of the fewest cycles: {picks}): fewer cycles "
                   f"{r_cyc:.2f}x (geomean), {r_tot_c:.2f}x (zoo total); less DRAM traffic "
                   f"{r_dram:.2f}x (geomean), {r_tot_d:.2f}x (zoo total)")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*")
    ap.add_argument("--arrays", default="32x32,256x256")
    ap.add_argument("--cache", default="/tmp/apsat-systolic-bench")
    ap.add_argument("--json", help="also write the rows to this file")
    args = ap.parse_args(argv)
    print(HEADER)
    rows = run(args.models, args.arrays.split(","), Path(args.cache))
    print()
    for backend in BACKENDS:
        print(f"backend {backend}:")
        print(HEADER)
        for r in rows:
            if r["backend"] == backend:
                print(_line(r))
        print()
    for line in summary(rows):
        print(line)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
