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

from apsat.pipeline.outcome import first_report
from apsat.pipeline.precision import bound, check_request, half_type, in_half, judged
from apsat.lang.program import Program
from apsat.errors import ApsatError, InternalError, is_internal
from apsat.pipeline.internal import PhaseTracker


@dataclass
class OptimizeResult:
    """What optimize produced: the extracted program, the loaded model, the report, and
    the target backend's lowered form (apsat.backends.base.Lowered) with, when it ran
    during verification, its outputs on the seeded inputs."""

    program: Program
    model: object
    report: dict = field(default_factory=dict)
    lowered: object = None
    backend: object = None
    backend_outputs: dict | None = None
    general: object = None             # apsat.pipeline.generalise.General: symbolic dims kept
    export_note: str | None = None     # set by to_onnx where the export fixes the symbolic dims
    export_data: str | None = None     # set by to_onnx: the external-data file it wrote, if any

    @property
    def stream(self):
        """Systolic targets: the compiled instruction Stream (else None)."""
        return self.lowered.artifact if self.backend is not None and self.backend.name == "systolic" else None

    @property
    def simulated(self) -> dict | None:
        """Systolic targets: the simulator's outputs on the seeded inputs (None when it did
        not run)."""
        return self.backend_outputs if self.stream is not None else None

    def run(self, inputs: dict) -> dict:
        """Evaluate the optimised program (reference interpreter) with the model's weights;
        returns output name -> array."""
        from apsat.lang.evaluate import evaluate

        out = evaluate(self.program, {**self.model.weights, **inputs})
        return out if isinstance(out, dict) else {next(iter(self.program.outputs)): out}

    def to_onnx(self, path=None):
        """The program as an ONNX model (apsat.backends.onnx.export_onnx) with the
        original's input and output names and types (and symbolic dims, where the program
        holds for every size: report["dynamic"]), its metadata naming the apsat version,
        target, rules and extractor; saved to `path` when given. Weights past protobuf's
        2 GB are written as external data beside `path` (which is then required).
        ExportError (an ApsatError, one line) for a program ONNX cannot express (a
        systolic-array atom). See apsat.pipeline.export."""
        from apsat.pipeline.export import export_result

        proto, self.export_note, self.export_data = export_result(self, path)
        return proto

    def write(self, out_dir, compile_kernels=True, onnx_out=False) -> Path:
        """Write report.json and program.txt (the program in DAG form, see
        syntax.to_dag_text; read back with syntax.parse_dag_text) into out_dir, and the
        backend's files: gpu kernels/ and runner.py (compiled when `compile_kernels` and
        the tools allow; what the tools said is added to the backend's figures in the
        written report.json), systolic instructions.txt and, when the simulator ran,
        simulated_outputs.npz. `onnx_out`: also the ONNX export (to_onnx), at that path,
        or as optimized.onnx in out_dir when True; the report's "onnx_out" says where and
        its node count. Returns the report path; self.report is left as it is."""
        from apsat.lang.syntax import to_dag_text

        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "program.txt").write_text(to_dag_text(self.program.outputs))
        report = dict(self.report)
        if onnx_out:
            path = out_dir / "optimized.onnx" if onnx_out is True else Path(onnx_out)
            proto = self.to_onnx(path)
            ops: dict[str, int] = {}
            for node in proto.graph.node:
                ops[node.op_type] = ops.get(node.op_type, 0) + 1
            report["onnx_out"] = {"path": str(path), "nodes": len(proto.graph.node), "ops": ops,
                                  **({"dynamic": self.export_note} if self.export_note else {}),
                                  **({"external_data": self.export_data} if self.export_data else {})}
        if self.backend is not None:
            written = self.backend.write(self.lowered, out_dir, compile=compile_kernels)
            report[self.backend.name] = {**report[self.backend.name], **written}
            if self.general is not None and self.backend.name == "gpu_kernels":
                from apsat.pipeline.dynamic import write_gpu_sources

                report["dynamic"] = {**report["dynamic"], "gpu_kernels": write_gpu_sources(self, out_dir)}
        if self.backend_outputs is not None:
            import numpy as np

            np.savez(out_dir / "simulated_outputs.npz" if self.stream is not None
                     else out_dir / "backend_outputs.npz", **self.backend_outputs)
        path = out_dir / "report.json"
        path.write_text(json.dumps(report, indent=2, default=str) + "\n")
        return path


# Past this many terms a program is saturated region by region unless told otherwise: the
# corpus's largest otherwise is 5,555 (DenseNet-121), its unrolled recurrences 17,200 and more.
REGIONS_PAST = 10_000
REUSE_AT_LEAST = 0.5        # HRM's and xLSTM's unrolled recurrences: 98 %; a plain chain: 0 %


def optimize(model, target: str = "gpu", rules=None, extractor: str = "greedy-dag",
             verify: bool = True, seed: int = 0, iter_limit: int | None = None,
             node_limit: int | None = None, time_limit: float | None = None, progress=None,
             regions: bool | None = None, lowering: dict | None = None,
             verify_backend: bool | None = None, input_shapes: dict | None = None,
             inputs=None, memory_limit: float | None = None, check_rules: bool = True,
             representatives: dict | None = None, precision: str | None = None,
             max_error: float | None = None) -> OptimizeResult:
    """Optimise an ONNX model (a path, a ModelProto or a loaded Model) for `target`:
    import, saturate, extract, lower with the target's backend, verify.

    rules: ruleset names or rule-file paths to saturate with as one phase; None runs the
        target's default phase plan; False saturates nothing (import and extract only).
    verify: judge the extracted program (reference interpreter) against the original
        model on seeded random inputs (apsat.pipeline.verify: apsat's float32 error and
        onnxruntime's against a float64 run), and the backend's run of its lowered form
        too (see verify_backend).
    verify_backend: with verify, run the lowered program on the backend: None where the
        backend runs here at a sensible cost (the systolic simulator always; GPU kernels
        only on a GPU: the report says why it was skipped), True always, False never.
    iter_limit, node_limit, time_limit, memory_limit (MiB of resident memory): cap every
        saturation phase (apsat.rules.saturate: the smaller of the phase's own and this;
        time replaces the plan's 120 s safety net; None: the plan's own, for `rules=`
        30 iterations, 100,000 e-nodes, 10 s); the report says what stopped each phase.
    check_rules: after saturating with the user's own rule files (paths in `rules=`),
        check them on this model (apsat.pipeline.soundness.check_user_rules): a wrong
        one raises UnsoundRuleError naming it; report["rule_check"] says what was checked.
    progress: optional callable(phase_name) told when each phase starts.
    regions: saturate region by region, identical regions once (apsat.rules.regions); None
        (the default) does so past REGIONS_PAST terms whose regions mostly repeat (an
        unrolled recurrence: 252 s whole, 5 s by regions); report["saturation"]["regions"].
    lowering: the backend's options; systolic targets: im2col, fold_copies, fuse_zips
        (see apsat.backends.systolic.lower); None follows the cost model. ApsatError for
        another target or an unknown option.
    input_shapes: name -> dims for the model's inputs, as apsat.load_onnx takes them;
        symbolic dims not fixed so stay symbolic: the program is built at representative
        values (`representatives`, symbol name -> value, else each role's default), then
        generalised and checked at other sizes (report["dynamic"], apsat.pipeline.dynamic)
        so that to_onnx keeps the symbolic dims.
    inputs: what verification runs on instead of seeded random inputs: name -> array, or
        the path of an .npz with one array per input (apsat.pipeline.inputs.load_inputs).
    precision, max_error: "fp16", "bf16" or "mixed" computes a float32 model partly in a half
        type, refused (PrecisionError) past max_error (apsat.pipeline.precision).

    Bad input raises an ApsatError. Any other exception (a bug in apsat: RecursionError,
    KeyError, AssertionError, MemoryError ...) raises apsat.errors.InternalError, which is
    not an ApsatError: its message names the phase that was running ("internal error in
    lower: RecursionError: ...") and its __cause__ is the original exception.
    """
    phases = PhaseTracker(progress)
    limits = {"iter_limit": iter_limit, "node_limit": node_limit, "time_limit": time_limit,
              "memory_limit": memory_limit}
    try:
        return _optimize(model, target, rules, extractor, verify, seed, phases, regions, lowering,
                         verify_backend, (input_shapes, representatives), inputs, check_rules, limits,
                         (precision, max_error))
    except BaseException as exc:
        if isinstance(exc, InternalError) or not is_internal(exc):
            raise
        raise InternalError.of(phases.phase, exc) from exc


def _optimize(model, target, rules, extractor, verify, seed, tell, regions, lowering,
              verify_backend, input_shapes, inputs, check_rules, limits, precision) -> OptimizeResult:
    """optimize's pipeline, each phase told to `tell` (a PhaseTracker) as it starts."""
    # "setup" (parsing the target, choosing its backend and the imports both pull in) is
    # timed like the phases, so that report["seconds"] adds up to the whole call
    start = time.perf_counter()
    from apsat.backends import backend_for
    from apsat.targets import parse_target

    tgt = parse_target(target)
    backend = backend_for(tgt)
    if lowering and not backend.options:
        raise ApsatError(f"lowering options apply to systolic targets, not {target!r}")
    backend.check_options(lowering or {})
    seconds: dict[str, float] = {"setup": time.perf_counter() - start}
    from apsat.pipeline.inputs import given_shapes
    from apsat.pipeline.plan import into_extraction, plan, price_of

    shapes, representatives = input_shapes
    lower = half_type(precision[0]) is not None
    m, eg, handles, loaded = _load(model, target, tell, seconds, shapes or given_shapes(inputs, model),
                                   representatives, seed if verify and inputs is None else None, not rules)
    if lower or precision[1] is not None:
        check_request(*precision, target, m.program)
    given = _given_inputs(inputs, m)
    saturation = _saturate(eg, m, rules, regions, tell, seconds, **limits)
    rule_check = _check_rules(eg, m, check_rules, given, seed, tell, seconds) if rules else None
    candidates = _timed("extract", tell, seconds, _extract, eg, handles, extractor)
    source = m.program          # what the e-graph was built from (the why-trace starts there)
    if lower:
        source, eg, candidates = in_half(eg, candidates, saturation, (backend, tgt, m.weights, lowering or {}),
                                         precision[0], extractor, lambda *a: _timed(a[0], tell, seconds, *a[1:]))
    extracted = candidates[0][1]
    program, lowered, planned = _timed("lower", tell, seconds, plan, backend, candidates, tgt, m.weights,
                                       lowering or {})
    before = _timed("price before", tell, seconds, price_of, backend, m.program, tgt, m.weights,
                    lowering or {}, extracted, planned) if planned else None
    report = first_report(m, target, rules, program, eg, loaded, saturation, seconds)
    held, eg = [eg], None       # its last reference: the e-graph is let go inside the why phase
    report["why"] = _timed("why", tell, seconds, _why, held, source, program, candidates)
    into_extraction(report["extraction"], planned, before)
    report.update({"limits": limits}, **({"rule_check": rule_check} if rule_check else {}))
    report[backend.name] = lowered.report
    outputs = None
    if verify or lower:     # a lower precision is always measured against its bound
        outputs = _verify(m, program, backend, lowered, report, given, seed, tell, seconds,
                          verify_backend if verify else False, bound(*precision) if lower else None)
        if lower:
            report["precision"] = judged(*precision, report["verification"], program)
    general = None
    if m.symbols:
        from apsat.pipeline.dynamic import dynamic_report, fold_into

        general, report["dynamic"] = _timed("sizes", tell, seconds, dynamic_report, m, program, seed,
                                            verify and given is None)
        fold_into(report, report["dynamic"])
    return OptimizeResult(program, m, report, lowered, backend, outputs, general)


def _why(held: list, source, program, candidates) -> dict:
    """The why-trace of the chosen program (apsat.pipeline.trace). The e-graph (`held`, its
    only reference: released to the pool, or dropped) and the copy extraction left on each
    candidate are let go here, inside the timed phase: freed on return they were seconds
    no phase owned (0.03 s of a small model's 1.7 s, measured)."""
    from apsat.pipeline.trace import why_trace
    from apsat.rules.library import RuleLibrary

    from apsat.pipeline.egraph_pool import release

    eg = held.pop()
    library = getattr(eg, "library", None) or RuleLibrary()
    try:
        return why_trace(eg, source, program, library)
    finally:
        for _, candidate in candidates:
            candidate.graph = None
        release(eg)        # a pooled e-graph pops back to its loaded state; any other goes


def _timed(phase: str, tell, seconds: dict, fn, *args):
    """Run fn(*args) as pipeline phase `phase`: told to `tell`, timed into seconds."""
    tell(phase)
    t = time.perf_counter()
    out = fn(*args)
    seconds[phase] = time.perf_counter() - t
    return out


def _given_inputs(inputs, m) -> dict | None:
    """The user's inputs checked against the model (None when not given)."""
    from apsat.pipeline.inputs import check_inputs, load_inputs

    if inputs is None:
        return None
    if isinstance(inputs, (str, Path)):
        return load_inputs(inputs, m)
    return check_inputs(dict(inputs), m, "inputs")


def _load(model, target, tell, seconds, input_shapes=None, representatives=None, probe_seed=None,
          pooled=False):
    """Import the model and load it into an e-graph, fresh or (`pooled`: the default plan
    runs) a loaded one from apsat.pipeline.egraph_pool; returns (model, e-graph, output
    handles, (nodes, classes, cost of the imported program)). With `probe_seed`, a model
    with symbolic dims is built at sizes onnxruntime runs the original at (dynamic.runnable)."""
    # "import" starts before these imports (egglog's bindings, the frontend: ~0.2 s in a
    # fresh process), which would otherwise be time that no phase owns
    tell("import")
    t = time.perf_counter()
    from apsat.egraph.driver import EGraph
    from apsat.extract import imported_cost
    from apsat.frontend.importer import load_onnx

    m = model if hasattr(model, "program") else load_onnx(model, input_shapes, representatives)
    if m.symbols and probe_seed is not None and not hasattr(model, "program"):
        from apsat.pipeline.dynamic import runnable

        m = runnable(m, model, input_shapes, representatives, probe_seed)
    seconds["import"] = time.perf_counter() - t
    tell("e-graph")
    t = time.perf_counter()
    if pooled:
        from apsat.pipeline.egraph_pool import acquire

        eg = acquire(target)
    else:
        eg = EGraph(target=target)
    handles = eg.add_outputs(m.program)
    nodes, classes = eg.size()
    # Before any rule runs every e-class holds one node, so this "extraction" is the
    # imported program itself, priced by the same cost model as the result.
    cost_before = imported_cost(eg, handles)
    seconds["egraph"] = time.perf_counter() - t
    return m, eg, handles, (nodes, classes, cost_before)


def _saturate(eg, m, rules, regions, tell, seconds, **limits) -> dict:
    """The saturation report: the rules as one phase, the target's plan (rules None) or
    nothing (rules False); by regions as `regions` says (None: past REGIONS_PAST terms)."""
    from apsat.rules.saturate import saturate

    if rules is False:
        return {"phases": [], "skipped": []}
    by_regions, why = (bool(regions), "asked") if regions is not None else _regions_pay(m.program)
    report = _timed("saturate", tell, seconds, lambda: saturate(
        eg, rules if rules else None, regions=m.program if by_regions else None, **limits))
    report["regions"] = {"used": by_regions, "why": why}
    return report


def _regions_pay(program) -> tuple[bool, str]:
    """(saturate by regions?, why): for a program past REGIONS_PAST terms whose regions
    repeat (at least REUSE_AT_LEAST of them copies of another), where one template stands
    for many; a long chain with nothing repeated saturates whole (by regions it took 4x)."""
    from apsat.rules.regions import find_regions

    terms = len(program.terms())
    if terms <= REGIONS_PAST:
        return False, f"{terms:,} terms <= {REGIONS_PAST:,}"
    found = find_regions(program)
    reuse = 1 - len({r.key for r in found}) / max(1, len(found))
    return reuse >= REUSE_AT_LEAST, f"{terms:,} terms > {REGIONS_PAST:,}, {reuse:.0%} of its regions repeated"


def _check_rules(eg, m, check_rules, given, seed, tell, seconds) -> dict | None:
    """Check the user's own rules (rule files named in `rules=`) on this model
    (apsat.pipeline.soundness.check_user_rules; UnsoundRuleError when one is wrong).
    None when only built-in rulesets ran; {"skipped": ...} with check_rules False."""
    from apsat.pipeline.soundness import check_user_rules, user_rules

    mine = user_rules(eg)
    if not mine:
        return None
    if not check_rules:
        return {"skipped": "check_rules=False"}
    return _timed("rule check", tell, seconds, check_user_rules, eg, m, mine, seed, 20, 3, given)


def _extract(eg, handles, extractor):
    from apsat.extract import extract_candidates

    return extract_candidates(eg, handles, method=extractor)


def _verify(m, program, backend, lowered, report, given, seed, tell, seconds, verify_backend, limit=None):
    """Judge the program (reference interpreter) and, where it runs, the backend's lowered
    form against the original model on the same seeded inputs (apsat.pipeline.verify: one
    oracle run, float32 and float64, for both); the first goes to report["verification"],
    the second to report[backend.name][backend.run_key]. Returns the backend's outputs
    (None when it did not run). `limit`: a lower precision's error bound, the absolute part
    of both rules."""
    from apsat.pipeline.verify import judge, output_types, run_oracle, verify_program
    from apsat.pipeline.zoo import random_inputs

    inputs = given if given is not None else random_inputs(m, seed)
    oracle = _timed("oracle", tell, seconds, run_oracle, m.onnx, inputs, m.external)
    tol = {} if limit is None else {"rtol": limit, "atol": limit, "floor": limit}
    report["verification"] = _timed("verify", tell, seconds,
                                    lambda: verify_program(m, program, inputs, oracle=oracle, **tol).to_dict())
    # run_skipped may import torch to look for a GPU (~0.8 s): a phase of its own
    skipped = None if verify_backend else (_timed("backend check", tell, seconds, backend.run_skipped)
                                           if verify_backend is None else "not asked")
    if skipped is not None:
        report[backend.name][backend.run_key] = {"skipped": skipped}
        return None
    got = _timed(f"{backend.name} run", tell, seconds, backend.run, lowered, {**m.weights, **inputs})
    report[backend.name][backend.run_key] = judge(oracle, got, types=output_types(program), **tol).to_dict()
    return got
