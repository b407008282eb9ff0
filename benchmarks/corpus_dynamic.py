"""The public corpus with symbolic dims: a seeded sample of its architectures exported with a
dynamic batch (and sequence, for token inputs), optimised once with the dims kept.

For each sampled architecture of the corpus manifest (benchmarks/corpus.py export must have
run): build it as the corpus does (corpus_models.build: seeded random weights), export
it with torch's TorchScript exporter, traced at batch 2, with dynamic axes:
  - 2-D int64 inputs (token ids, masks): (batch_size, sequence_length);
  - every other input: batch_size on axis 0.
Run onnxruntime on the original at a second size, so that an exporter which baked a size
in counts as "not dynamic" rather than apsat's failure. Then `apsat.optimize(target="gpu")`
with nothing fixed, and record:
  - whether the program is general, or why not;
  - the size checks that pass;
  - the export's dims, and whether it equals the original in onnxruntime at two other
    sizes, by apsat's float64 rule (docs/verification.md): batch 1 x sequence 5, batch 3 x
    sequence 12 (images: batch 1 and 3).

Usage: python benchmarks/corpus_dynamic.py [--sample K] [--seed S] [--json PATH] [NAME ...]
The exported files go to CACHE/dynamic/ (the corpus cache; corpus_export.default_cache).
"""
from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TIMEOUT_S = 300
TEXT_SIZES, IMAGE_SIZES = [(1, 5), (3, 12)], [(1,), (3,)]


def sample(manifest: dict, k: int, seed: int, names: list) -> list[str]:
    """Names: those given, else a seeded sample of k, token-input models and others half and half."""
    if names:
        return names
    text = sorted(n for n, e in manifest["models"].items()
                  if all(len(v[0]) == 2 and v[1] == "int64" for v in e["inputs"].values()))
    other = sorted(n for n in manifest["models"] if n not in text)
    rng = random.Random(seed)
    return rng.sample(text, min(k // 2, len(text))) + rng.sample(other, min(k - k // 2, len(other)))


def export(name: str, entry: dict, libs, out: Path) -> Path:
    """The architecture exported with dynamic axes (traced at batch 2)."""
    import corpus_models as cm
    import export_zoo as ez

    arch = next(a for a in cm.catalogue(libs)[0] if a.name == name)
    spec = cm.build(arch, entry["variant"], libs)
    spec.inputs = {k: np.concatenate([v, v], axis=0) for k, v in spec.inputs.items()}
    axes = {k: ({0: "batch_size", 1: "sequence_length"} if v.ndim == 2 and v.dtype.kind == "i" else {0: "batch_size"})
            for k, v in spec.inputs.items()}
    spec.dynamic_axes = {**axes, **{o: {0: "batch_size"} for o in spec.outputs}}
    path = out / f"{name}.onnx"
    path.write_bytes(ez.export_onnx(libs[0], spec).SerializeToString())
    return path


def feeds(proto, sizes: tuple, rng) -> dict:
    """Inputs of the original at `sizes` (batch[, sequence]): ids below 2 (valid for every
    vocabulary), masks of ones, floats standard normal."""
    from onnx import helper

    out = {}
    for vi in proto.graph.input:
        dims = [d.dim_value if d.dim_value else (sizes[0] if d.dim_param == "batch_size" else sizes[-1])
                for d in vi.type.tensor_type.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
        out[vi.name] = (np.ones(dims, dtype) if dtype.kind in "iub" else
                        rng.standard_normal(dims).astype(dtype))
    return out


def measure(path: Path) -> dict:
    """One model's row (see the module doc)."""
    import onnx

    from apsat.pipeline.optimize import optimize
    from apsat.pipeline.verify import judge, run_oracle
    from apsat.pipeline.zoo import ort_run

    proto = onnx.load(str(path))
    text = any(d.dim_param == "sequence_length" for vi in proto.graph.input for d in vi.type.tensor_type.shape.dim)
    sizes = TEXT_SIZES if text else IMAGE_SIZES
    rng = np.random.default_rng(0)
    row = {"model": path.stem, "kind": "text" if text else "other"}
    try:
        wanted = [ort_run(proto, feeds(proto, s, rng)) for s in sizes[:1]]
    except Exception as e:  # noqa: BLE001
        return {**row, "status": f"original not dynamic: {str(e).splitlines()[0][:90]}"}
    del wanted
    t = time.perf_counter()
    res = optimize(proto, target="gpu")
    row["seconds"] = round(time.perf_counter() - t, 1)
    dyn = res.report["dynamic"]
    checks = dyn.get("checks", [])
    row.update(general=dyn["general"], why=dyn.get("why", "")[:100],
               checks=f"{sum(c.get('ok') is True for c in checks)}/{len(checks)}",
               verified=res.report["verification"]["ok"])
    export = res.to_onnx()
    if res.export_note:
        row["why"] = res.export_note[:160]
    row["export_dims"] = [[d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim] for vi in export.graph.input]
    equal = []
    for s in sizes:
        f = feeds(proto, s, rng)
        try:
            want = ort_run(proto, f)
        except Exception:  # noqa: BLE001 - a size the original does not take
            continue
        try:                       # apsat's float64 rule: the export's error against
            got = ort_run(export, f)   # onnxruntime's own (an ill-conditioned model's outputs
            equal.append(judge(run_oracle(proto, f), got).ok)    # reach 4e4 at random weights)
        except Exception:  # noqa: BLE001 - the export does not run there
            equal.append(False)
    row["export_equal"] = f"{sum(equal)}/{len(equal)}"
    row["status"] = "ok" if row["general"] and all(equal) and row["verified"] else "not ok"
    return row


def _alarm(signum, frame):
    raise TimeoutError(f"past {TIMEOUT_S} s")


def main(argv=None) -> int:
    import corpus_export as ce
    import corpus_models as cm

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="*")
    p.add_argument("--sample", type=int, default=40)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    cache = ce.default_cache()
    manifest = ce.load_manifest(cache)
    out = cache / "dynamic"
    out.mkdir(parents=True, exist_ok=True)
    libs = cm.import_libraries()
    rows = []
    signal.signal(signal.SIGALRM, _alarm)
    for name in sample(manifest, args.sample, args.seed, args.names):
        signal.alarm(TIMEOUT_S)
        try:
            path = out / f"{name}.onnx"
            if not path.exists():
                path = export(name, manifest["models"][name], libs, out)
            rows.append(measure(path))
        except Exception as e:  # noqa: BLE001 - the row says why
            rows.append({"model": name, "status": f"error: {type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''}"})
        finally:
            signal.alarm(0)
        print(f"  {name}: {rows[-1]['status']}", file=sys.stderr, flush=True)
    for r in rows:
        print(f"{r['model']:<28} {r.get('kind', ''):<6} general={str(r.get('general', '-')):<5} "
              f"checks={r.get('checks', '-'):<4} export={r.get('export_equal', '-'):<4} "
              f"{r.get('seconds', '-'):>6} s  {r['status']}  {r.get('why', '')}")
    ok = sum(r["status"] == "ok" for r in rows)
    print(f"{ok} of {len(rows)} ok: general, verified at every size checked, export equal at every size")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
