"""A model with symbolic dims in optimize: the general program, checks at several sizes, the
export that keeps the signature.

optimize builds the program at representative values (apsat.frontend.symbols). Here:
`dynamic_report` generalises the chosen program (apsat.pipeline.generalise) and checks it
at the other sizes of each symbol (the role's checks, one symbol moved at a time), each
against onnxruntime on the original at that size, as the representative size is checked;
`export_general` writes the ONNX export with the original's symbolic dims
(apsat.backends.onnx.dynamic). A size the original itself does not run at (a sequence
longer than its position table) is listed as skipped, with onnxruntime's reason.
"""
from __future__ import annotations

import dataclasses

from apsat.errors import ApsatError, ShapeError
from apsat.lang.dims import Dim, NotGeneral


def runnable(model, source, input_shapes, representatives, seed: int):
    """`model`, or the model imported again at lower representatives while onnxruntime
    cannot run the original at its sizes (GPT-2's positions gathered past its table at a
    sequence of 127): the program is then built at sizes the model takes, with a notice."""
    from apsat.frontend.importer import load_onnx
    from apsat.frontend.symbols import fixed_dims, smaller
    from apsat.pipeline.verify import run_oracle
    from apsat.pipeline.zoo import random_inputs

    refused, user = [], set(representatives or {})
    for _ in range(3):
        try:
            run_oracle(model.onnx, random_inputs(model, seed), getattr(model, "external", None))
            break
        except ApsatError as e:
            lower = smaller(model.symbols, fixed_dims(model.onnx), user)
            if not lower:
                break                  # verification will say what onnxruntime said
            refused.append(", ".join(f"{s.name}={s.value}" for s in model.symbols.values())
                           + f" ({str(e).rsplit(': ', 1)[-1][:80]})")
            representatives = {**{n: s.value for n, s in model.symbols.items()}, **lower}
            model = load_onnx(source, input_shapes, representatives)
    if refused:
        model.notices.append(f"onnxruntime does not run the original at {'; at '.join(refused)}")
    return model


def sizes_to_check(symbols: dict) -> list[dict[str, int]]:
    """The representative values, then each symbol's other checks with the rest at theirs."""
    rep = {n: s.value for n, s in symbols.items()}
    out = [rep]
    for name, s in symbols.items():
        out.extend({**rep, name: v} for v in s.checks if v != s.value)
    return out


def model_at(model, general, values: dict):
    """(the model (a copy) with the general program, weights and inputs at `values`, the
    program, the terms whose shapes follow the symbols)."""
    program, weights, inputs, varying = general.at(values, model.weights)
    return dataclasses.replace(model, program=program, weights=weights, inputs=inputs), program, varying


def dynamic_report(model, program, seed: int, verify: bool):
    """(General or None, the report's "dynamic" entry)."""
    from apsat.pipeline.generalise import generalise

    report = {"symbols": {n: dataclasses.asdict(s) for n, s in model.symbols.items()},
              "systolic": "an instruction stream is static: compiled for the representative sizes",
              "gpu_kernels": "written for the representative sizes"}
    try:
        general = generalise(program, model)
    except NotGeneral as e:
        report.update(general=False, why=str(e))
        return None, report
    report["general"] = True
    if not verify:
        return general, report
    for attempt in (general, "unscaled"):
        if attempt == "unscaled":      # read no size as a multiple of a symbol, and check again
            try:
                attempt = generalise(program, model, scaled=False)
            except NotGeneral:
                break
        report["checks"] = [_check(model, attempt, values, seed) for values in sizes_to_check(model.symbols)[1:]]
        wrong = next((c for c in report["checks"] if "not_general" in c), None)
        if wrong is None:
            return attempt, report
    # the original runs at a size where the program does not hold
    report.update(general=False, why=f"at {wrong['sizes']}: {wrong.pop('not_general')}")
    return None, report


def fold_into(report: dict, dynamic: dict) -> None:
    """The size checks' verdict joins the verification's (a mismatch at any size is one),
    and a program that holds only at the representative sizes is a notice."""
    bad = [c["sizes"] for c in dynamic.get("checks", []) if c.get("ok") is False]
    if bad and "verification" in report:
        report["verification"]["ok"] = False
        report["verification"]["failed_at_sizes"] = bad
    if not dynamic.get("general"):
        report.setdefault("notices", []).append(
            f"the program holds only at the representative sizes ({dynamic.get('why')}); "
            "the export fixes the symbolic dims there")


def _check(model, general, values: dict, seed: int) -> dict:
    """One size: the general program against onnxruntime on the original. `skipped` where
    the original does not run there; `not_general` where it does and the program does not
    hold there (a size read wrongly as a constant)."""
    from apsat.lang.dims import at
    from apsat.pipeline.verify import run_oracle, verify_program
    from apsat.pipeline.zoo import random_inputs

    entry = {"sizes": values}
    dims = {n: at(d, values) for n, d in general.tensor_dims.items() if n in model.signature}
    inputs = random_inputs(dataclasses.replace(model, inputs=dims), seed)
    try:
        oracle = run_oracle(model.onnx, inputs, getattr(model, "external", None))
    except ApsatError as e:
        entry["skipped"] = f"the original does not run at these sizes: {e}"
        return entry
    try:
        m, program, _ = model_at(model, general, values)
    except ShapeError as e:
        entry["not_general"] = f"the program does not hold at sizes the original takes: {e}"
        return entry
    try:
        entry.update(verify_program(m, program, inputs, oracle=oracle).to_dict())
    except ApsatError as e:            # the program at these sizes does not run
        entry["not_general"] = f"the program does not run at sizes the original takes: {e}"
    return entry


def export_general(model, general, export) -> object:
    """The ONNX export with the original's symbolic dims: `export(program, model, varying)`
    at the corners of the symbols' values (apsat.backends.onnx.dynamic)."""
    from apsat.backends.onnx.dynamic import dynamic_export
    from apsat.frontend.symbols import fixed_dims, probe_values

    values = probe_values(model.symbols, fixed_dims(model.onnx))

    def export_at(vals):
        from apsat.backends.onnx.views import ExportError

        try:
            m, program, varying = model_at(model, general, vals)
        except ShapeError as e:       # a probe size the program does not take
            raise ExportError(f"the program does not hold at {vals}: {e}") from None
        return export(program, m, varying)

    return dynamic_export(export_at, values, model.signature)


def write_gpu_sources(result, out_dir) -> str:
    """Replace the representative kernels and runner in `out_dir` by one set for every
    size (gpu_sources); what the report says of them. The kernel figures and any CUDA C
    builds stay those of the representative sizes."""
    from pathlib import Path

    try:
        files = gpu_sources(result.model, result.general)
    except NotGeneral as e:
        return f"written for the representative sizes only: {e}"
    for rel, text in files.items():
        (Path(out_dir) / rel).write_text(text)
    return ("one kernel set for every size: sizes are constexpr parameters computed from the "
            "inputs' shapes (Triton compiles once per size); CUDA C builds for the representative sizes")


def gpu_sources(model, general) -> dict[str, str]:
    """The gpu target's kernels and runner for every size (apsat.backends.gpu.dynamic):
    relative path -> text. NotGeneral where a kernel's code depends on the size."""
    from apsat.backends.gpu.dynamic import general_sources
    from apsat.backends.gpu.lower import lower
    from apsat.frontend.symbols import fixed_dims, probe_values

    def graph_at(values, tiles):
        return lower(model_at(model, general, values)[1], tiles)

    generated = {}
    for name, (kind, *how) in general.fills.items():
        if kind == "range":
            (length,) = general.tensor_dims[name]
            terms = Dim.of(length).terms
            generated[name] = (how[0], how[1], [(tuple(s for s, e in mono for _ in range(e)), c)
                                                for mono, c in terms.items()])
    return general_sources(graph_at, probe_values(model.symbols, fixed_dims(model.onnx)), model.signature,
                           generated)
