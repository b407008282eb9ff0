"""Calibrate apsat's analytical systolic model (apsat/targets/systolic.py) against SCALE-Sim.

SCALE-Sim 3.0 (`pip install scalesim`) needs numpy<2.4, so it lives in its own virtual
environment, never in apsat's:

    python -m venv /tmp/scalesim-env && /tmp/scalesim-env/bin/pip install scalesim "numpy<2.4"

Commands:

    python benchmarks/calibrate_systolic.py run [--python PY] [--out CSV] [--jobs N] [NAME ...]
        run the calibration set (or the named runs) through SCALE-Sim, one subprocess per
        run under PY (default $SCALESIM_PYTHON or /tmp/scalesim-env/bin/python), write the
        CSV (default tests/targets/data/scalesim_calibration.csv) and print the model's
        error per run
    python benchmarks/calibrate_systolic.py check [CSV]
        the model's error on a CSV written by `run` (no SCALE-Sim needed)
    python benchmarks/calibrate_systolic.py shared [CSV]
        the model's error on the shared 32x32 runs (../shared/bench/systolic/scalesim_32x32.csv
        beside the repository), if that file is there

Each run is a conv layer (a GEMM m x k x n is SCALE-Sim's own GEMM form: ifmap m x k,
filter 1 x k, 1 channel, n filters) on an array of the given shape, dataflow and SRAM
sizes; bandwidth 0 is SCALE-Sim's CALC mode (it sizes the bandwidth itself: no stalls),
a positive bandwidth its USER mode with that many words per cycle on every DRAM interface
(ifmap, filter and ofmap; SCALE-Sim reads the ifmap/filter rate from its SRAM-bank
fields, which this script sets to the same figure with one bank).

The USER runs with stalls are output-write-bound (os writes every output, ws drains
partial sums after every row fold): there SCALE-Sim's write buffer behaves like a
streaming double buffer and the model follows it within a few percent. The USER runs
without stalls (the presets' own bandwidths; weights streamed at 64 words/cycle through a
100 kB filter scratchpad, whose SCALE-Sim bookkeeping sets then hold one 1024-word tile
each) check that the model predicts none. Read stalls are not calibrated: SCALE-Sim 3.0's
read buffer (read_buffer.py) replaces its whole active window on a miss, so a demand
just behind the window rotates the entire prefetch ring; it fetches a whole prefetch
half even when fewer words are left; and it adds every read stall twice
(scalesim-project/SCALE-Sim issues #130, #82, #27). Its read traffic and stalls there
come out several times the streamed data. `ARTIFACT` holds three such runs, left out of
the calibration set: run them by name to see it.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CSV = ROOT / "tests" / "targets" / "data" / "scalesim_calibration.csv"
SHARED_CSV = ROOT / ".." / "shared" / "bench" / "systolic" / "scalesim_32x32.csv"
DEFAULT_PY = os.environ.get("SCALESIM_PYTHON", "/tmp/scalesim-env/bin/python")

SPEC_FIELDS = ["name", "source", "H", "W", "R", "S", "C", "K", "stride", "rows", "cols",
               "dataflow", "ifmap_kb", "filter_kb", "ofmap_kb", "bandwidth"]
RESULT_FIELDS = ["m", "k", "n", "total_cycles", "stall_cycles", "overall_cycles_incl_prefetch",
                 "ifmap_dram_reads", "filter_dram_reads", "ofmap_dram_writes", "sim_s",
                 "scalesim_version"]


def gemm(name, source, m, k, n, rows=32, cols=32, df="os", sram=(64, 64, 64), bw=0):
    """A GEMM run in SCALE-Sim's GEMM form."""
    return dict(name=name, source=source, H=m, W=k, R=1, S=k, C=1, K=n, stride=1,
                rows=rows, cols=cols, dataflow=df, ifmap_kb=sram[0], filter_kb=sram[1],
                ofmap_kb=sram[2], bandwidth=bw)


def conv(name, source, H, W, R, S, C, K, stride=1, rows=32, cols=32, df="os",
         sram=(64, 64, 64), bw=0):
    """A conv run (H, W: the padded input)."""
    return dict(name=name, source=source, H=H, W=W, R=R, S=S, C=C, K=K, stride=stride,
                rows=rows, cols=cols, dataflow=df, ifmap_kb=sram[0], filter_kb=sram[1],
                ofmap_kb=sram[2], bandwidth=bw)


G256 = (6144, 6144, 2048)          # google.cfg's scratchpads
CALIBRATION = [
    # GEMMs from the zoo's fully-connected layers (batch and widths scaled down) and
    # transformer-sized matmuls (BERT-base: 12 heads of 64, hidden 768, FFN 3072).
    gemm("fc_resnet50_os", "light_resnet50 fc 2048->1000, batch 8, widths /4", 8, 512, 250),
    gemm("fc_resnet50_ws", "light_resnet50 fc 2048->1000, batch 8, widths /4", 8, 512, 250, df="ws"),
    gemm("fc_alexnet_ws", "light_bvlc_alexnet fc7 4096->4096, batch 4, widths /8", 4, 512, 512, df="ws"),
    gemm("bert_qkt_os", "BERT-base Q.K^T per head, seq 128", 128, 64, 128),
    gemm("bert_av_ws", "BERT-base A.V per head, seq 128", 128, 128, 64, df="ws"),
    gemm("bert_proj_os", "BERT-base attention output 768x768, seq 64, widths /4", 64, 192, 192),
    gemm("bert_ffn_ws", "BERT-base FFN 768->3072, seq 64, widths /4", 64, 192, 768, df="ws"),
    # Conv layers the shared 32x32 runs do not have.
    conv("conv_alexnet1_os", "light_bvlc_alexnet conv1 11x11/4 3->96, input 227 cut to 63", 63, 63, 11, 11, 3, 96, 4),
    conv("conv_vgg_ws", "light_vgg19 conv3x3 64->64, input 224 cut to 18 (padded)", 18, 18, 3, 3, 64, 64, df="ws"),
    conv("conv_incep_1x1_os", "light_inception_v1 3a 1x1 192->64 on 28x28 cut to 14x14", 14, 14, 1, 1, 192, 64),
    # Non-square arrays (fill = rows + cols - 2 for os, 2 rows + cols - 2 for ws/is).
    gemm("gemm_16x8_os", "BERT-base Q.K^T per head, seq 64", 64, 64, 64, rows=16, cols=8),
    gemm("gemm_16x8_ws", "BERT-base Q.K^T per head, seq 64", 64, 64, 64, rows=16, cols=8, df="ws"),
    gemm("gemm_8x16_ws", "BERT-base Q.K^T per head, seq 64", 64, 64, 64, rows=8, cols=16, df="ws"),
    gemm("gemm_8x16_is", "BERT-base Q.K^T per head, seq 64", 64, 64, 64, rows=8, cols=16, df="is"),
    conv("conv_sq_16x8_os", "light_squeezenet fire2 expand1x1 16->64 on 55x55 cut to 27x27", 27, 27, 1, 1, 16, 64, rows=16, cols=8),
    conv("conv_sq_8x16_ws", "light_squeezenet fire2 expand3x3 16->64 on 55x55 cut to 15x15 (padded)", 15, 15, 3, 3, 16, 64, rows=8, cols=16, df="ws"),
    gemm("gemm_64x16_ws", "BERT-base attention output, seq 32, widths /4", 32, 192, 192, rows=64, cols=16, df="ws"),
    # The 256x256 preset (google.cfg).
    gemm("fc_resnet50_256_ws", "light_resnet50 fc 2048->1000, batch 8, widths /4", 8, 512, 250, rows=256, cols=256, df="ws", sram=G256),
    conv("conv_resnet_256_ws", "light_resnet50 res3 3x3 128->128 on 28x28 cut to 10x10 (padded)", 10, 10, 3, 3, 128, 128, rows=256, cols=256, df="ws", sram=G256),
    # Limited DRAM bandwidth (USER mode): output-write-bound layers (os writes every
    # output, ws drains partial sums after every row fold) with non-zero stalls ...
    gemm("wr_os_bw8", "output-heavy GEMM (k=16)", 2048, 16, 64, bw=8),
    gemm("wr_os_bw4", "output-heavy GEMM (k=16)", 2048, 16, 64, bw=4),
    gemm("wr_os_bw2", "output-heavy GEMM (k=16)", 2048, 16, 64, bw=2),
    gemm("wr_ws_bw8", "ws partial sums, 8 row folds", 128, 256, 256, df="ws", sram=(64, 100, 64), bw=8),
    gemm("wr_ws_bw4", "ws partial sums, 8 row folds", 128, 256, 256, df="ws", sram=(64, 100, 64), bw=4),
    gemm("wr_16x8_ws_bw4", "ws partial sums on 16x8, 8 kB ofmap", 128, 64, 64, rows=16, cols=8, df="ws", sram=(64, 64, 8), bw=4),
    gemm("wr_16x8_ws_bw2", "ws partial sums on 16x8, 8 kB ofmap", 128, 64, 64, rows=16, cols=8, df="ws", sram=(64, 64, 8), bw=2),
    gemm("wr_8x16_os_bw2", "output-heavy GEMM (k=8) on 8x16, 8 kB ofmap", 1024, 8, 64, rows=8, cols=16, sram=(64, 64, 8), bw=2),
    conv("wr_conv_os_bw8", "light_squeezenet conv1 3x3/2 3->64, input cut to 55x55, 8 kB ofmap", 55, 55, 3, 3, 3, 64, 2, sram=(64, 64, 8), bw=8),
    # ... and enough bandwidth: no stalls, as the model says (the presets' own bandwidths).
    gemm("user_32x32_bw64", "BERT-base attention output, seq 64, widths /4; 32x32 preset", 64, 192, 192, bw=64),
    gemm("user_256x256_bw10", "light_resnet50 fc, batch 8, widths /4; 256x256 preset", 8, 512, 250, rows=256, cols=256, df="ws", sram=G256, bw=10),
    gemm("user_ws_stream_bw64", "light_bvlc_alexnet fc7, batch 32, widths /16: weights streamed", 32, 256, 256, df="ws", sram=(64, 100, 64), bw=64),
]

# SCALE-Sim's read-buffer artifact (see the module docstring): not in the calibration set.
ARTIFACT = [
    gemm("artifact_read_stall_doubled", "weights streamed at 4 words/cycle: each read stall counted twice", 32, 256, 256, df="ws", sram=(64, 100, 64), bw=4),
    gemm("artifact_os_stream", "A streams through a 16 kB ifmap buffer", 512, 128, 32, sram=(16, 16, 16), bw=8),
    gemm("artifact_ws_stream", "A streams through a 16 kB ifmap buffer", 512, 128, 32, df="ws", sram=(16, 16, 16), bw=8),
]


def mnk(spec) -> tuple[int, int, int]:
    """(m, k, n) of a run as SCALE-Sim maps it: m = output pixels, k = R*S*C, n = K."""
    s = int(spec["stride"])
    oh = -(-(int(spec["H"]) - int(spec["R"]) + s) // s)
    ow = -(-(int(spec["W"]) - int(spec["S"]) + s) // s)
    return oh * ow, int(spec["R"]) * int(spec["S"]) * int(spec["C"]), int(spec["K"])


# ---------------------------------------------------------------- SCALE-Sim side (worker)

def worker(spec: dict) -> dict:
    """Run one spec in SCALE-Sim (this process must have scalesim); returns its figures."""
    import contextlib
    import io
    import tempfile
    from importlib.metadata import version

    from scalesim.scale_config import scale_config
    from scalesim.simulator import simulator
    from scalesim.topology_utils import topologies

    bw = int(spec["bandwidth"])
    cfg = scale_config()
    cfg.update_from_list(["calib", spec["rows"], spec["cols"], spec["ifmap_kb"], spec["filter_kb"],
                          spec["ofmap_kb"], 0, 10000000, 20000000, spec["dataflow"],
                          "USER" if bw else "CALC", [max(bw, 1)]])
    if bw:
        cfg.ifmap_sram_bank_bandwidth = cfg.filter_sram_bank_bandwidth = bw
        cfg.ifmap_sram_bank_num = cfg.filter_sram_bank_num = 1
    topo = topologies()
    st = int(spec["stride"])
    topo.load_layer_params_from_list(spec["name"], [spec["name"], spec["H"], spec["W"], spec["R"],
                                                    spec["S"], spec["C"], spec["K"], st, st, 1, 1])
    topo.topo_calc_hyperparams()
    sim = simulator()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d, contextlib.redirect_stdout(io.StringIO()):
        sim.set_params(config_obj=cfg, topo_obj=topo, top_path=d, verbosity=False, save_trace=False)
        sim.run()
    layer = sim.single_layer_sim_object_list[0]
    comp = layer.get_compute_report_items()
    det = layer.get_detail_report_items()
    return {"total_cycles": int(comp[1]), "stall_cycles": int(comp[2]),
            "overall_cycles_incl_prefetch": int(comp[0]), "ifmap_dram_reads": int(det[11]),
            "filter_dram_reads": int(det[14]), "ofmap_dram_writes": int(det[17]),
            "sim_s": round(time.perf_counter() - t0, 2), "scalesim_version": version("scalesim")}


def run_spec(spec: dict, python: str) -> dict:
    """One spec through SCALE-Sim in a fresh subprocess; the spec plus its results."""
    proc = subprocess.run([python, str(Path(__file__).resolve()), "_worker", json.dumps(spec)], check=False,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise SystemExit(f"SCALE-Sim run {spec['name']} failed: {tail[0]}")
    m, k, n = mnk(spec)
    return {**spec, "m": m, "k": k, "n": n, **json.loads(proc.stdout.strip().splitlines()[-1])}


# ---------------------------------------------------------------- model side

def model_cycles(row) -> tuple[int, int]:
    """(model total cycles, closed-form compute cycles) for a CSV/spec row."""
    import math

    from apsat.targets.accelerator import Accelerator
    from apsat.targets.systolic import gemm_cost

    bw = float(row["bandwidth"])
    acc = Accelerator(int(row["rows"]), int(row["cols"]), row["dataflow"], int(row["ifmap_kb"]),
                      int(row["filter_kb"]), int(row["ofmap_kb"]), bw if bw > 0 else math.inf,
                      name=row["name"])
    m, k, n = mnk(row)
    c = gemm_cost(acc, m, k, n)
    return c.total_cycles, c.compute_cycles


def report(rows: list[dict], title: str) -> float:
    """Print per-run SCALE-Sim vs model cycles; returns the max relative error."""
    print(f"{title}\n{'run':28} {'df':3} {'array':>8} {'bw':>4} {'m,k,n':>16} "
          f"{'scalesim':>9} {'stalls':>7} {'model':>9} {'error':>7}")
    worst = 0.0
    for r in rows:
        model, _ = model_cycles(r)
        sim = int(r["total_cycles"])
        err = (model - sim) / sim
        worst = max(worst, abs(err))
        m, k, n = mnk(r)
        bw = int(float(r["bandwidth"])) or "calc"
        arr, mkn = f"{r['rows']}x{r['cols']}", f"{m},{k},{n}"
        print(f"{r['name']:28} {r['dataflow']:3} {arr:>8} {bw!s:>4} {mkn:>16} "
              f"{sim:9d} {int(r['stall_cycles']):7d} {model:9d} {err:+7.2%}")
    print(f"max |error| {worst:.2%} over {len(rows)} runs")
    return worst


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def shared_rows(path: Path) -> list[dict]:
    """The finished runs of the shared 32x32 CSV as calibration rows (64 kB SRAM, CALC)."""
    out = []
    for r in read_csv(path):
        if r.get("status") != "ok":
            continue
        out.append(dict(name=f"{r['cid']}_{r['dataflow']}", source=r["model"], H=r["Hp"], W=r["Wp"],
                        R=r["R"], S=r["S"], C=r["C"], K=r["K"], stride=r["stride"], rows="32",
                        cols="32", dataflow=r["dataflow"], ifmap_kb="64", filter_kb="64",
                        ofmap_kb="64", bandwidth="0", total_cycles=r["total_cycles"],
                        stall_cycles=r["stall_cycles"]))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p_run = sub.add_parser("run", help="run the calibration set through SCALE-Sim")
    p_run.add_argument("names", nargs="*", help="run only these (calibration or ARTIFACT names)")
    p_run.add_argument("--python", default=DEFAULT_PY, help="a Python with scalesim installed")
    p_run.add_argument("--out", type=Path, default=None, help=f"CSV to write (default {DEFAULT_CSV})")
    p_run.add_argument("--jobs", type=int, default=2)
    p_check = sub.add_parser("check", help="model error on a calibration CSV")
    p_check.add_argument("csv", nargs="?", type=Path, default=DEFAULT_CSV)
    p_shared = sub.add_parser("shared", help="model error on the shared 32x32 runs")
    p_shared.add_argument("csv", nargs="?", type=Path, default=SHARED_CSV)
    w = sub.add_parser("_worker")
    w.add_argument("spec")
    args = ap.parse_args(argv)

    if args.cmd == "_worker":
        print(json.dumps(worker(json.loads(args.spec))))
        return 0
    sys.path.insert(0, str(ROOT))
    if args.cmd == "run":
        specs = CALIBRATION
        if args.names:
            pool = {s["name"]: s for s in CALIBRATION + ARTIFACT}
            unknown = [n for n in args.names if n not in pool]
            if unknown:
                raise SystemExit(f"unknown run(s): {', '.join(unknown)}")
            specs = [pool[n] for n in args.names]
        if not Path(args.python).exists():
            raise SystemExit(f"no Python at {args.python}: install SCALE-Sim in a venv (see --help)")
        t0 = time.perf_counter()
        with ThreadPoolExecutor(max(1, args.jobs)) as ex:
            rows = list(ex.map(lambda s: run_spec(s, args.python), specs))
        print(f"{len(rows)} SCALE-Sim runs in {time.perf_counter() - t0:.1f} s "
              f"(sum of simulation times {sum(r['sim_s'] for r in rows):.1f} s)")
        out = args.out or (DEFAULT_CSV if not args.names else None)
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            with open(out, "w", newline="") as f:
                wr = csv.DictWriter(f, fieldnames=SPEC_FIELDS + RESULT_FIELDS)
                wr.writeheader()
                wr.writerows(rows)
            print(f"wrote {out}")
        report(rows, "SCALE-Sim vs model")
        return 0
    if args.cmd == "check":
        report(read_csv(args.csv), f"{args.csv}: SCALE-Sim vs model")
        return 0
    if not args.csv.exists():
        print(f"{args.csv} is not there (the shared runs sit beside the repository); nothing to compare")
        return 0
    rows = shared_rows(args.csv)
    report(rows, f"{args.csv}: SCALE-Sim vs model ({len(rows)} finished runs)")
    exact = sum(model_cycles(r)[1] == int(r["total_cycles"]) for r in rows)
    print(f"closed form exact on {exact}/{len(rows)} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
