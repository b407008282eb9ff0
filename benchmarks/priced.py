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

    python benchmarks/priced.py [--extractors greedy-dag,ilp,tree] [--zoo light|real]
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


def row(path) -> list[str]:
    """The table's row for one light model."""
    report = optimize(randomize_weights(onnx.load(str(path)), seed=0), target="gpu", verify=True, seed=0).report
    e = report["extraction"]
    return [path.stem.replace("light_", ""), f"{e['dag_cost']:.1f}", f"{e['dag_cost_before']:.1f}",
            f"{e['modelled_speedup']:.2f}x", str(e["kernels"]), str(e["kernels_before"]),
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


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--extractors", help="comma-separated extractors for the second table")
    ap.add_argument("--zoo", choices=("light", "real"), default="light", help="the second table's models")
    args = ap.parse_args()
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS))
    for path in sorted(light_model_paths()):
        print("| " + " | ".join(row(path)) + " |", flush=True)
    if args.extractors:
        extractors = args.extractors.split(",")
        print("\nemitted µs (e-node cost) of each extractor's choice")
        print("| model | " + " | ".join(extractors) + " |")
        print("|" + "---|" * (1 + len(extractors)))
        for name, model, kwargs in zoo_models(args.zoo):
            print("| " + " | ".join(by_extractor(name, model, kwargs, extractors)) + " |", flush=True)


if __name__ == "__main__":
    main()
