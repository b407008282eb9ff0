"""The light zoo priced as emitted (apsat/pipeline/plan.py): per model, the gpu kernels'
modelled time per inference and kernel count for the optimised and for the imported
program (both lowered by the gpu backend), their ratio (the modelled speed-up), the
extractor's e-node figure beside the emitted one, and which variant the pricing chose.
Seeded random weights (seed 0), verified against onnxruntime. The table is in
docs/cost-models.md#modelled-speed-up-and-the-zoo-runs.

    python benchmarks/priced.py
"""
from __future__ import annotations

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


def main() -> None:
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS))
    for path in sorted(light_model_paths()):
        print("| " + " | ".join(row(path)) + " |", flush=True)


if __name__ == "__main__":
    main()
