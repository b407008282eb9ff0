"""The light zoo priced as emitted (apsat/pipeline/plan.py): per model, the gpu kernels'
modelled time per inference and kernel count for the optimised and for the imported
program (both lowered by the gpu backend), their ratio (the modelled speed-up), the
extractor's e-node figure beside the emitted one, and which variant the pricing chose.
Seeded random weights (seed 0), verified against onnxruntime. The table is in
docs/cost-models.md#modelled-speed-up-and-the-zoo-runs.

With --extractors, a second table: the emitted µs of the program each extractor chooses
(greedy-dag, the default; ilp, exact on the e-node model within its time limit; tree),
so the gap between what the e-node model prefers and what is emitted shows per model.

--zoo real prices the extractors' choices on tests/data/real_zoo instead (its stored
input shapes; the first table is the light zoo's only).

--check DIR [--sample N] prices N models of DIR (the public corpus's exported models,
seeded choice) on gpu and prints, per model, the kernels and modelled µs the extraction
priced against the ones the backend emitted: equal kernels and µs within 5 % is `same`.

--target systolic:32x32 makes the first table the systolic one: cycles instead of µs
(the stream's cycle model; the simulator is functional and counts none of its own).

    python benchmarks/priced.py [--target T] [--extractors greedy-dag,ilp,tree] [--zoo light|real]
    python benchmarks/priced.py --check ~/.cache/apsat/corpus/onnx --sample 20
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx

from apsat.pipeline.optimize import optimize
from apsat.pipeline.zoo import light_model_paths, randomize_weights

COLUMNS = ("model", "emitted µs", "imported µs", "speed-up", "kernels", "imported kernels",
           "e-node µs", "e-node / emitted", "chosen", "verified")


def row(path, target: str = "gpu") -> list[str]:
    """The table's row for one light model. On a systolic target the figures are cycles
    (the stream's cycle model) and the kernel columns are "-"."""
    report = optimize(randomize_weights(onnx.load(str(path)), seed=0), target=target, verify=True, seed=0).report
    e = report["extraction"]
    return [path.stem.replace("light_", ""), f"{e['dag_cost']:.1f}", f"{e['dag_cost_before']:.1f}",
            f"{e['modelled_speedup']:.2f}x", str(e["kernels"] or "-"), str(e["kernels_before"] or "-"),
            f"{e['node_dag_cost']:.1f}", f"{e['node_dag_cost'] / e['dag_cost']:.2f}x", e["chosen"],
            str(report["verification"]["ok"])]


REAL_ZOO = Path(__file__).resolve().parent.parent / "tests" / "data" / "real_zoo"


def zoo_models(zoo: str) -> list[tuple[str, object, dict]]:
    """(name, model, optimize keywords) of the light zoo (seeded random weights) or the
    real zoo (its stored inputs' shapes)."""
    if zoo == "light":
        return [(p.stem.replace("light_", ""), randomize_weights(onnx.load(str(p)), seed=0), {})
                for p in sorted(light_model_paths())]
    out = []
    for name in sorted(json.loads((REAL_ZOO / "manifest.json").read_text())["models"]):
        with np.load(REAL_ZOO / f"{name}.npz") as data:
            shapes = {k: data[k].shape for k in data.files if not k.startswith("output:")}
        out.append((name, REAL_ZOO / f"{name}.onnx", {"input_shapes": shapes}))
    return out


def by_extractor(name, model, kwargs, extractors) -> list[str]:
    """The emitted µs (and e-node cost) of each extractor's choice for one model."""
    cells = [name]
    for method in extractors:
        e = optimize(model, target="gpu", extractor=method, verify=False, **kwargs).report["extraction"]
        cells.append(f"{e['dag_cost']:.1f} ({e['node_dag_cost']:.1f})")
    return cells


def check(directory, sample: int, seed: int = 0) -> None:
    """The --check table (module doc): a model that fails says why in its row."""
    import random

    paths = sorted(Path(directory).expanduser().glob("*.onnx"))
    paths = sorted(random.Random(seed).sample(paths, min(sample, len(paths))))
    print("| model | priced kernels | emitted kernels | priced µs | emitted µs | priced as emitted |")
    print("|---|---|---|---|---|---|")
    for path in paths:
        try:
            report = optimize(path, target="gpu", verify=False).report
        except Exception as e:                      # noqa: BLE001 - one row, the reason
            print(f"| {path.stem} | {type(e).__name__}: {str(e)[:80]} | | | | |", flush=True)
            continue
        e, totals = report["extraction"], report["gpu_kernels"]["totals"]
        same = e["kernels"] == totals["inference_kernels"] and \
            abs(e["dag_cost"] - totals["modelled_us"]) <= 0.05 * totals["modelled_us"]
        print(f"| {path.stem} | {e['kernels']} | {totals['inference_kernels']} | {e['dag_cost']:.1f} | "
              f"{totals['modelled_us']:.1f} | {'same' if same else 'DIFFERS'} |", flush=True)


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--extractors", help="comma-separated extractors for the second table")
    ap.add_argument("--zoo", choices=("light", "real"), default="light", help="the second table's models")
    ap.add_argument("--check", metavar="DIR", help="price a sample of DIR's models against what is emitted")
    ap.add_argument("--sample", type=int, default=20)
    ap.add_argument("--target", default="gpu", help="the first table's target (µs on gpu, cycles on systolic)")
    args = ap.parse_args()
    if args.check:
        check(args.check, args.sample)
        return
    unit = "µs" if args.target == "gpu" else "cycles"
    print("| " + " | ".join(c.replace("µs", unit) for c in COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS))
    for path in sorted(light_model_paths()):
        print("| " + " | ".join(row(path, args.target)) + " |", flush=True)
    if args.extractors:
        extractors = args.extractors.split(",")
        print("\nemitted µs (e-node cost) of each extractor's choice")
        print("| model | " + " | ".join(extractors) + " |")
        print("|" + "---|" * (1 + len(extractors)))
        for name, model, kwargs in zoo_models(args.zoo):
            print("| " + " | ".join(by_extractor(name, model, kwargs, extractors)) + " |", flush=True)


if __name__ == "__main__":
    main()
