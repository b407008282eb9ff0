"""Element width on the systolic array: apsat's model against SCALE-Sim at 8 and 16 bits.

SCALE-Sim 3.0 sizes its scratchpads in bytes and holds `word_size` bytes an element, but
fixes word_size = 1 in single_layer_sim.py ("this can be incorporated in the config
file"); its DRAM bandwidth and its DRAM counts are in elements. `run` sets word_size by
patching the scratchpad's set_params in the worker process, so a 2-byte run holds half
the elements in the same 64 kB scratchpads; nothing else in SCALE-Sim changes.

Commands:

    python benchmarks/systolic_width.py run [--python PY] [--out CSV] [--cap S] [--models sq,rn]
        every distinct conv configuration of light SqueezeNet (sq) and light ResNet-50 (rn)
        (from ../shared/bench/systolic/scalesim_32x32.csv beside the repository), in the
        32x32 preset's dataflow (os), through SCALE-Sim at 1- and 2-byte words on a 32x32
        array, 64 kB scratchpads, CALC bandwidth; one subprocess a run, capped at S seconds
        (a capped run is a `timeout` row). PY defaults as in calibrate_systolic.py.
    python benchmarks/systolic_width.py compare [CSV] [--streams] [--cache DIR]
        per model, SCALE-Sim's cycles and DRAM words/bytes (count-weighted sums over the
        conv layers) at 8 and 16 bits against apsat's model (gemm_cost, os, the 32x32
        preset with unlimited bandwidth, operand_bytes 1 and 2) on the same layers. A
        capped run's cycles are the closed form (exact for all finished CALC runs) and its
        DRAM words apsat's model, marked "*" with the count. --streams adds the whole
        light models' compiled streams on the 32x32 preset (its 64 bytes a cycle) at 8
        and 16 bits: the baseline program (every conv its own im2col GEMM, as SCALE-Sim
        assumes) in os, and apsat's program on the flexible array, each extracted for
        its width (benchmarks/systolic.py's plans; programs cached in DIR).

The default CSV is benchmarks/data/scalesim_width_32x32.csv (benchmarks/data/README.md).
"""
from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import calibrate_systolic as cal  # noqa: E402

DEFAULT_CSV = ROOT / "benchmarks" / "data" / "scalesim_width_32x32.csv"
WIDTHS = (1, 2)
MODELS = {"sq": "SqueezeNet", "rn": "ResNet-50"}
FIELDS = ["model", "cid", "count", "word_bytes", "H", "W", "R", "S", "C", "K", "stride",
          "dataflow", "m", "k", "n", "status", "total_cycles", "stall_cycles",
          "ifmap_dram_reads", "filter_dram_reads", "ofmap_dram_writes", "sim_s"]


# Light ResNet-50's conv configurations the shared CSV lacks (its runs hit a time cap), by
# the same grouping of its Conv nodes: (cid, padded H, W, R, S, C, K, stride, count).
MISSING = {"rn": [("rn00", 229, 229, 7, 7, 3, 64, 2, 1), ("rn18", 15, 15, 3, 3, 512, 512, 2, 1),
                  ("rn20", 13, 13, 1, 1, 1024, 2048, 2, 1), ("rn22", 9, 9, 3, 3, 512, 512, 1, 2)]}


def configs(path: Path, models: list[str], dataflow: str = "os") -> list[dict]:
    """The shared CSV's distinct conv configurations of `models` in `dataflow` and those
    it lacks (MISSING), as calibrate_systolic specs (32x32, 64 kB, CALC) with model, cid
    and count."""
    rows = [(r["model"], r["cid"], *(int(r[f]) for f in ("Hp", "Wp", "R", "S", "C", "K", "stride", "count")))
            for r in cal.read_csv(path) if r["model"] in models and r["dataflow"] == dataflow]
    rows += [(m, *c) for m in models for c in MISSING.get(m, ())]
    out = []
    for model, cid, hp, wp, r, s, c, k, stride, count in rows:
        spec = cal.conv(f"{cid}_{dataflow}", model, hp, wp, r, s, c, k, stride, df=dataflow)
        out.append({**spec, "model": model, "cid": cid, "count": count})
    return out


def worker(spec: dict) -> dict:
    """calibrate_systolic.worker with SCALE-Sim's word size set to spec["word_bytes"]."""
    from scalesim.memory.double_buffered_scratchpad_mem import double_buffered_scratchpad as dbs

    plain = dbs.set_params

    def sized(self, *args, **kw):
        kw["word_size"] = int(spec["word_bytes"])
        return plain(self, *args, **kw)

    dbs.set_params = sized
    return cal.worker(spec)


def run_one(spec: dict, python: str, cap: float) -> dict:
    """One spec at one width in a fresh subprocess; a `timeout` row past `cap` seconds."""
    m, k, n = cal.mnk(spec)
    row = {f: spec.get(f, "") for f in FIELDS} | {"m": m, "k": k, "n": n}
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([python, str(Path(__file__).resolve()), "_worker", json.dumps(spec)],
                              capture_output=True, text=True, timeout=cap, check=False)
    except subprocess.TimeoutExpired:
        return row | {"status": "timeout", "sim_s": round(time.perf_counter() - t0, 1)}
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return row | {"status": f"error: {tail[0]}"}
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    return row | {f: res[f] for f in FIELDS if f in res} | {"status": "ok"}


def model_figures(row: dict, word_bytes: int) -> tuple[int, int]:
    """(cycles, DRAM words) of apsat's model for one configuration: gemm_cost in os on
    the 32x32 preset, unlimited bandwidth (SCALE-Sim's CALC), operand_bytes = word_bytes."""
    import dataclasses
    import math

    from apsat.targets.accelerator import PRESETS
    from apsat.targets.systolic import gemm_cost

    acc = dataclasses.replace(PRESETS["32x32"], dram_bandwidth=math.inf, operand_bytes=word_bytes)
    c = gemm_cost(acc, int(row["m"]), int(row["k"]), int(row["n"]), row["dataflow"])
    return c.total_cycles, c.dram_words


def totals(rows: list[dict]) -> dict:
    """Per (model, word_bytes): count-weighted SCALE-Sim and model cycles and DRAM words,
    and how many configurations fell back to the closed form and the model."""
    out: dict = {}
    for r in rows:
        wb, cnt = int(r["word_bytes"]), int(r["count"])
        t = out.setdefault((r["model"], wb), dict(ss_cycles=0, ss_words=0, ap_cycles=0, ap_words=0,
                                                  runs=0, filled=0))
        cyc, words = model_figures(r, wb)
        t["ap_cycles"] += cnt * cyc
        t["ap_words"] += cnt * words
        t["runs"] += 1
        if r["status"] == "ok":
            t["ss_cycles"] += cnt * int(r["total_cycles"])
            t["ss_words"] += cnt * sum(int(r[f]) for f in ("ifmap_dram_reads", "filter_dram_reads",
                                                           "ofmap_dram_writes"))
        else:
            t["filled"] += 1
            t["ss_cycles"] += cnt * cyc
            t["ss_words"] += cnt * words
    return out


def table(rows: list[dict]) -> list[str]:
    """The comparison as markdown lines: per model and width, cycles, DRAM words and
    bytes for SCALE-Sim and apsat's model, and apsat / SCALE-Sim."""
    lines = ["| model | bits | SCALE-Sim cycles | apsat cycles | SCALE-Sim DRAM words (bytes) "
             "| apsat DRAM words (bytes) | apsat / SCALE-Sim words |",
             "|---|---|---|---|---|---|---|"]
    for (model, wb), t in sorted(totals(rows).items(), key=lambda kv: (list(MODELS).index(kv[0][0]), kv[0][1])):
        mark = f" *{t['filled']}" if t["filled"] else ""
        lines.append(f"| {MODELS.get(model, model)} | {8 * wb} | {t['ss_cycles']:,}{mark} | {t['ap_cycles']:,} "
                     f"| {t['ss_words']:,} ({wb * t['ss_words']:,}){mark} | {t['ap_words']:,} "
                     f"({wb * t['ap_words']:,}) | {t['ap_words'] / t['ss_words']:.3f} |")
    return lines


def streams(names=("squeezenet", "resnet50"), cache: Path = Path("/tmp/apsat-systolic-width")) -> list[dict]:
    """Per light model, program (baseline in os, apsat on the flexible array) and width
    (1, 2 bytes): the compiled stream's total cycles, DRAM words and bytes on the 32x32
    preset, the cost-model lowering."""
    import dataclasses

    import onnx

    import systolic as bench
    from apsat.backends import systolic
    from apsat.frontend.importer import load_onnx
    from apsat.pipeline.zoo import light_model_paths, randomize_weights
    from apsat.targets.accelerator import FLEX, PRESETS

    cache.mkdir(parents=True, exist_ok=True)
    out = []
    paths = {p.stem.replace("light_", ""): p for p in light_model_paths()}
    for name in names:
        path = paths[name]
        model = load_onnx(randomize_weights(onnx.load(str(path)), seed=0))
        for program, plan, df in (("baseline", bench.BASELINE_PLAN, "os"), ("apsat", bench.APSAT_PLAN, FLEX)):
            for wb in WIDTHS:
                acc = dataclasses.replace(PRESETS["32x32"], dataflow=df, operand_bytes=wb)
                prog = bench.extracted(model, acc, plan, cache / f"{name}-{program}-{df}-{wb}.txt")
                rep = systolic.cycles(systolic.compile(prog, acc, weights=model.weights))
                out.append({"model": name, "program": program, "dataflow": df, "word_bytes": wb,
                            "cycles": rep["total_cycles"], "dram_words": rep["dram"]["total"],
                            "dram_bytes": rep["dram"]["bytes"]})
                print(f"  {name} {program} {8 * wb}-bit: {out[-1]['cycles']:,} cycles", flush=True)
    return out


def stream_table(rows: list[dict]) -> list[str]:
    """The streams' figures as markdown lines, 16-bit over 8-bit beside them."""
    lines = ["| model | program | bits | cycles | DRAM words | DRAM bytes | cycles / 8-bit | bytes / 8-bit |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        base = next(x for x in rows if (x["model"], x["program"], x["word_bytes"]) == (r["model"], r["program"], 1))
        lines.append(f"| {r['model']} | {r['program']} ({r['dataflow']}) | {8 * r['word_bytes']} | {r['cycles']:,} "
                     f"| {r['dram_words']:,} | {r['dram_bytes']:,} | {r['cycles'] / base['cycles']:.3f} "
                     f"| {r['dram_bytes'] / base['dram_bytes']:.3f} |")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p_run = sub.add_parser("run", help="run the conv configurations through SCALE-Sim at 1 and 2 bytes")
    p_run.add_argument("--python", default=cal.DEFAULT_PY)
    p_run.add_argument("--out", type=Path, default=DEFAULT_CSV)
    p_run.add_argument("--cap", type=float, default=120.0, help="seconds a run may take")
    p_run.add_argument("--models", default="sq,rn")
    p_run.add_argument("--shared", type=Path, default=cal.SHARED_CSV)
    p_run.add_argument("--cids", default="", help="run only these configurations, appending to the CSV")
    p_cmp = sub.add_parser("compare", help="SCALE-Sim vs apsat's model at 8 and 16 bits")
    p_cmp.add_argument("csv", nargs="?", type=Path, default=DEFAULT_CSV)
    p_cmp.add_argument("--streams", action="store_true", help="also the light models' compiled streams")
    p_cmp.add_argument("--cache", type=Path, default=Path("/tmp/apsat-systolic-width"))
    w = sub.add_parser("_worker")
    w.add_argument("spec")
    args = ap.parse_args(argv)

    if args.cmd == "_worker":
        print(json.dumps(worker(json.loads(args.spec))))
        return 0
    sys.path.insert(0, str(ROOT))
    if args.cmd == "compare":
        for line in table(cal.read_csv(args.csv)):
            print(line)
        if args.streams:
            rows = streams(cache=args.cache)
            print()
            for line in stream_table(rows):
                print(line)
        return 0
    specs = configs(args.shared, args.models.split(","))
    if args.cids:
        specs = [s for s in specs if s["cid"] in args.cids.split(",")]
    rows = []
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "a" if args.cids else "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=FIELDS)
        if not args.cids:
            wr.writeheader()
        for spec in specs:
            for wb in WIDTHS:
                row = run_one({**spec, "word_bytes": wb}, args.python, args.cap)
                rows.append(row)
                wr.writerow(row)
                f.flush()
                print(f"{row['cid']} {8 * wb}-bit {row['status']} {row.get('sim_s', '')}", flush=True)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
