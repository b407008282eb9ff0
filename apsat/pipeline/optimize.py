"""The top-level workflow: load, saturate, extract, verify, report.

`optimize(model, target=...)` is what `apsat optimize` and `apsat zoo` run for each model;
the OptimizeResult it returns holds the chosen program and the report written to
report.json (ops before and after, e-graph size, seconds per phase, verification).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from apsat.lang.program import Program
from apsat.errors import ApsatError


@dataclass
class OptimizeResult:
    """What optimize produced: the extracted program, the loaded model and the report."""

    program: Program
    model: object
    report: dict = field(default_factory=dict)
    stream: object = None     # systolic targets: the compiled Stream (apsat.backends.systolic)
    simulated: dict | None = None   # systolic targets: the simulator's outputs (name -> array)

    def run(self, inputs: dict) -> dict:
        """Evaluate the optimised program (reference interpreter) with the model's weights;
        returns output name -> array."""
        from apsat.lang.evaluate import evaluate

        out = evaluate(self.program, {**self.model.weights, **inputs})
        return out if isinstance(out, dict) else {next(iter(self.program.outputs)): out}

    def write(self, out_dir, compile_kernels=True) -> Path:
        """Write report.json and program.txt (the program in DAG form, see
        syntax.to_dag_text; read back with syntax.parse_dag_text) into out_dir;
        returns the report path. For a systolic target also instructions.txt (the
        compiled instruction stream, apsat.backends.systolic) and simulated_outputs.npz
        (the simulator's outputs on the seeded inputs); its cycle report and the
        simulator's comparison with onnxruntime are in report.json under "systolic"."""
        from apsat.lang.syntax import to_dag_text

        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "program.txt").write_text(to_dag_text(self.program.outputs))
        if self.report.get("target") == "gpu":
            self.report["gpu_kernels"] = _gpu_kernels(self.program, out_dir, compile_kernels)
        if self.stream is not None:
            import numpy as np

            from apsat.backends.systolic import to_text

            (out_dir / "instructions.txt").write_text(to_text(self.stream))
            if self.simulated is not None:
                np.savez(out_dir / "simulated_outputs.npz", **self.simulated)
        path = out_dir / "report.json"
        path.write_text(json.dumps(self.report, indent=2, default=str) + "\n")
        return path


def optimize(model, target: str = "gpu", rules=None, extractor: str = "greedy-dag",
             verify: bool = True, seed: int = 0, iter_limit: int = 30,
             node_limit: int = 100_000, time_limit: float = 10.0, progress=None,
             regions: bool = False, lowering: dict | None = None) -> OptimizeResult:
    """Optimise an ONNX model (a path, a ModelProto or a loaded Model) for `target`.

    rules: ruleset names or rule-file paths to saturate with as one phase; None runs the
        target's default phase plan; False saturates nothing (import and extract only).
    verify: compare the extracted program with onnxruntime on seeded random inputs.
    progress: optional callable(phase_name) told when each phase starts.
    regions: saturate region by region, identical regions once (apsat.rules.regions).
    lowering: systolic targets: options of the instruction-stream lowering (im2col,
        fold_copies, fuse_zips; see apsat.backends.systolic.lower); None follows the cost
        model. ApsatError for another target or an unknown option.
    """
    from apsat.egraph.driver import EGraph
    from apsat.rules.saturate import saturate
    from apsat.frontend.importer import load_onnx
    from apsat.extract import extract

    _check_lowering(target, lowering)
    tell = progress or (lambda phase: None)
    seconds: dict[str, float] = {}
    t = time.perf_counter()
    tell("import")
    m = model if hasattr(model, "program") else load_onnx(model)
    seconds["import"] = time.perf_counter() - t

    t = time.perf_counter()
    tell("e-graph")
    eg = EGraph(target=target)
    handles = eg.add_outputs(m.program)
    nodes_loaded, classes_loaded = eg.size()
    # Before any rule runs every e-class holds one node, so this "extraction" is the
    # imported program itself, priced by the same cost model as the result.
    cost_before = extract(eg, handles).cost
    seconds["egraph"] = time.perf_counter() - t

    t = time.perf_counter()
    tell("saturate")
    saturation = saturate(eg, rules if rules else None, iter_limit=iter_limit, node_limit=node_limit,
                          time_limit=time_limit, regions=m.program if regions else None) \
        if rules is not False else {"phases": [], "skipped": []}
    nodes, classes = eg.size()
    seconds["saturate"] = time.perf_counter() - t

    t = time.perf_counter()
    tell("extract")
    program = extract(eg, handles, method=extractor)
    seconds["extract"] = time.perf_counter() - t

    report = {
        "model": str(getattr(m, "path", "") or ""),
        "target": target,
        "rules": list(rules or []),
        "ops_before": m.source_op_counts(),
        "ops_after": program.op_counts(),
        "egraph": {"nodes_loaded": nodes_loaded, "classes_loaded": classes_loaded,
                   "nodes": nodes, "classes": classes},
        "saturation": saturation,
        "extraction": {**(program.extraction or {}), "dag_cost": program.cost,
                       "dag_cost_before": cost_before,
                       "modelled_speedup": cost_before / program.cost if program.cost else None},
        "opaque_calls": sorted(program.opaque_nodes),
        "seconds": seconds,
    }
    if verify:
        from apsat.pipeline.verify import verify_program
        from apsat.pipeline.zoo import random_inputs

        t = time.perf_counter()
        tell("verify")
        report["verification"] = verify_program(m, program, random_inputs(m, seed)).to_dict()
        seconds["verify"] = time.perf_counter() - t
    stream, simulated = _systolic_backend(m, program, target, report, seconds, seed, tell, lowering or {})
    return OptimizeResult(program, m, report, stream, simulated)


LOWERING_OPTIONS = ("im2col", "fold_copies", "fuse_zips")


def _check_lowering(target, lowering) -> None:
    """Refuse lowering options for a non-systolic target or with unknown names (one line)."""
    from apsat.targets import parse_target

    if not lowering:
        return
    if parse_target(target).kind != "systolic":
        raise ApsatError(f"lowering options apply to systolic targets, not {target!r}")
    unknown = sorted(set(lowering) - set(LOWERING_OPTIONS))
    if unknown:
        raise ApsatError(f"unknown lowering option(s) {', '.join(unknown)} "
                         f"(known: {', '.join(LOWERING_OPTIONS)})")


def _gpu_kernels(program, out_dir: Path, compile_kernels) -> dict:
    """Write DIR/kernels/ (Triton and CUDA C sources, cubins when `compile_kernels` and the
    tools are present) and DIR/runner.py; returns the report's per-kernel summary (the
    full figures, sources included, are in DIR/kernels.json)."""
    from apsat.backends.gpu.write import write_kernels

    figures = write_kernels(program, out_dir, compile=compile_kernels)
    keep = ("name", "kind", "covers", "flops", "bytes", "modelled_us")
    kernels = []
    for k in figures["kernels"]:
        row = {key: k.get(key) for key in keep}
        for tool in ("cuda", "triton"):
            t = k.get(tool) or {}
            row[tool] = {"registers": t.get("registers"), "shared_bytes": t.get("shared_bytes"),
                         "error": t.get("error")}
        kernels.append(row)
    return {"totals": figures["totals"], "tools": figures["tools"], "kernels": kernels,
            "host_steps": figures["host_steps"]}


def _systolic_backend(m, program, target, report, seconds, seed, tell, lowering):
    """For a systolic target: compile the program to an instruction stream, run it in the
    functional simulator on the seeded inputs (the ones verification uses) and compare
    with onnxruntime; the cycle report and that comparison go to report["systolic"].
    Returns (stream, simulated outputs), (None, None) for other targets."""
    from apsat.targets import parse_target

    tgt = parse_target(target)
    if tgt.kind != "systolic":
        return None, None
    from apsat.backends import systolic
    from apsat.pipeline.verify import compare
    from apsat.pipeline.zoo import ort_run, random_inputs

    t = time.perf_counter()
    tell("systolic backend")
    stream = systolic.compile(program, tgt.accel, weights=m.weights, **lowering)
    cyc = systolic.cycles(stream)
    seconds["systolic"] = time.perf_counter() - t
    t = time.perf_counter()
    tell("simulate")
    inputs = random_inputs(m, seed)
    got = systolic.simulate(stream, {**m.weights, **inputs})
    expected = ort_run(m.onnx, inputs)
    seconds["simulate"] = time.perf_counter() - t
    report["systolic"] = {
        "accelerator": {"name": tgt.accel.name, "rows": tgt.accel.rows, "cols": tgt.accel.cols,
                        "dataflow": tgt.accel.dataflow},
        "lowering": dict(stream.options),
        "instructions": stream.counts(), "host_steps": cyc["host_steps"],
        "simulation": compare({k: expected[k] for k in got}, got).to_dict(),
        "cycles": cyc}
    return stream, got
