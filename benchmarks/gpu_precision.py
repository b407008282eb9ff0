"""Modelled gpu time of fp32 and fp16 models: the H100 roofline's speed-up of half precision.

Per model (benchmarks/gpu_models.py's names; default resnet50, the light zoo's ResNet-50
with drawn weights at 224x224, and bert_base, BertModel(BertConfig()) at 128 tokens), the
fp32 model and its float16 conversion by onnxruntime's own tool
(onnxruntime.transformers.float16, keep_io_types off; gpu_models.half) are optimised for
the gpu target (default plan, greedy-DAG) and verified against onnxruntime (the fp16 model
against its own float16 run by apsat.pipeline.verify's float64 rule). Columns: the emitted
kernels' modelled µs per inference (report gpu_kernels.totals.modelled_us: the roofline of
apsat/targets/gpu.py, products of half operands at the tensor-core peak, 989 against 67
TFLOP/s, bytes at each buffer's width) and kernels per inference, in fp32 and fp16, the
speed-up fp32 / fp16, "priced" (the extraction priced the emitted kernels: same count,
time within 5 %, as benchmarks/kernels.py's column), and the verification. Each model and
type runs in a process of its own; a failure is its row's status.

Usage: python benchmarks/gpu_precision.py [MODEL ...] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

DEFAULT = ["resnet50", "bert_base"]


def figures(name: str) -> dict:
    """One model in one type (NAME or NAME_fp16): optimised, verified, its kernels priced."""
    import gpu_models

    import apsat

    t = time.perf_counter()
    model, inputs = gpu_models.load(name)
    res = apsat.optimize(model, target="gpu", inputs=inputs, input_shapes={k: v.shape for k, v in inputs.items()})
    r = res.report
    totals, v = r["gpu_kernels"]["totals"], r["verification"]
    return {"model": name, "us": totals["modelled_us"], "kernels": totals["inference_kernels"],
            "priced_us": r["extraction"].get("dag_cost"), "priced_kernels": r["extraction"].get("kernels"),
            "ok": bool(v["ok"]), "err_apsat": v.get("err_apsat"), "err_ort": v.get("err_ort"),
            "seconds": time.perf_counter() - t}


def _child(name, queue):
    try:
        queue.put(figures(name))
    except Exception as e:  # noqa: BLE001 -- the failure is the row's status
        queue.put({"model": name, "error": f"{type(e).__name__}: {str(e).strip().splitlines()[0][:120]}"})


def isolated(name: str) -> dict:
    """figures(name) in a spawned process (one model's memory is freed with it)."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(name, queue))
    proc.start()
    row = queue.get()
    proc.join()
    return row


def _priced(r: dict) -> str:
    if r.get("priced_kernels") != r["kernels"]:
        return f"k:{r.get('priced_kernels')}"
    return "same" if abs((r.get("priced_us") or 0.0) - r["us"]) <= 0.05 * r["us"] else f"us:{r['priced_us']:.0f}"


def _verified(r: dict) -> str:
    if not r["ok"]:
        return "FAILED"
    if r.get("err_apsat") is None:
        return "ok"
    return f"ok ({r['err_apsat']:.1e} vs ort {r['err_ort']:.1e})"


def print_table(pairs: list[tuple[dict, dict]]) -> None:
    print(f"{'model':12} {'fp32 us':>9} {'kernels':>7} {'fp16 us':>9} {'kernels':>7} {'speed-up':>8} "
          f"{'priced':>11}  verified fp32 / fp16")
    for a, b in pairs:
        bad = [r for r in (a, b) if "error" in r]
        if bad:
            print(f"{a['model']:12} " + "; ".join(f"{r['model']}: {r['error']}" for r in bad))
            continue
        print(f"{a['model']:12} {a['us']:9.1f} {a['kernels']:7d} {b['us']:9.1f} {b['kernels']:7d} "
              f"{a['us'] / b['us']:7.2f}x {_priced(a) + '/' + _priced(b):>11}  {_verified(a)} / {_verified(b)}")
    print("us: modelled H100 SXM µs per inference of the emitted kernels (roofline; fp16 products at "
          "989 TFLOP/s on tensor cores, fp32 at 67; bytes at each buffer's width); speed-up: fp32 / fp16; "
          "priced: the extraction's figure is the emitted one (fp32/fp16); verified: err(apsat) against "
          "float64, with onnxruntime's own in brackets")


def main(argv=None) -> int:
    import gpu_models

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=DEFAULT)
    ap.add_argument("--json", type=Path, help="also write the rows to this file")
    opts = ap.parse_args(argv)
    unknown = [n for n in opts.models if not gpu_models.known(n)]
    if unknown:
        print(f"gpu_precision.py: unknown model(s) {', '.join(unknown)}; known: {', '.join(gpu_models.all_names())}")
        return 2
    pairs = []
    for name in opts.models:
        pair = tuple(isolated(n) for n in (name, name + gpu_models.HALF_SUFFIX))
        print(f"  {name}: {'; '.join(r.get('error', 'ok') for r in pair)}", flush=True)
        pairs.append(pair)
    print_table(pairs)
    if opts.json:
        opts.json.write_text(json.dumps([r for p in pairs for r in p], indent=1, default=float))
    return 0 if all("error" not in r and r["ok"] for p in pairs for r in p) else 1


if __name__ == "__main__":
    sys.exit(main())
