"""OptimizeResult.to_onnx: the chosen program written as an ONNX model.

Three cases: a program that holds at every size of the model's symbolic dims is exported
with those dims symbolic (apsat.pipeline.dynamic.export_general); one whose export does
not generalise is exported at the sizes it was built for, with a note; a model whose
weights pass protobuf's 2 GB limit (apsat.backends.onnx.external.EXTERNAL_PAST) is
exported at its built sizes with each large weight written as external data beside the
.onnx, streamed from where it lies, and checked by path; so is a model that came with its
weights in external data, when the export is saved (as onnx's tools keep the layout).
"""
from __future__ import annotations

import json
from pathlib import Path


def export_result(result, path=None):
    """(the ModelProto, a note on fixed symbolic dims or None, the external-data file
    written or None) for an OptimizeResult; saved to `path` when given (required past
    protobuf's limit). ExportError (one line) as export_onnx raises it."""
    from apsat.backends.onnx import export_onnx
    from apsat.backends.onnx.external import EXTERNAL_PAST, weight_bytes

    meta = metadata(result)
    if weight_bytes(result.model.weights) > EXTERNAL_PAST or (result.model.external and path is not None):
        return _external(result, path, meta)
    note = None
    if result.general is not None:
        from apsat.backends.onnx.views import ExportError
        from apsat.pipeline.dynamic import export_general

        try:
            proto = export_general(result.model, result.general, lambda p, m, v: export_onnx(p, m, meta, v))
        except ExportError as e:   # the program is general, its export is not: fixed sizes, said
            note = f"symbolic dims fixed at the representative sizes: {e}"
            proto = export_onnx(result.program, result.model, {**meta, "apsat_dynamic": note},
                                stored=planner_stored(result))
    else:
        proto = export_onnx(result.program, result.model, meta, stored=planner_stored(result))
    if path is not None:
        import onnx

        Path(path).parent.mkdir(parents=True, exist_ok=True)
        onnx.save(proto, str(path))
    return proto, note, None


def planner_stored(result) -> frozenset | None:
    """The gpu planner's stored terms for the result's program where the result was
    lowered for gpu (the export follows them; apsat.backends.onnx.peep.Planned), else
    None: the export lowers the program itself."""
    graph = getattr(result.lowered, "artifact", None)
    return graph.stored if result.backend is not None and result.backend.name == "gpu_kernels" \
        and getattr(result.lowered, "program", None) is result.program else None


def metadata(result) -> dict:
    """The export's metadata_props: apsat's version, the target, rules, extractor and the
    input dims the program was built for."""
    from apsat.pipeline.store import apsat_version

    r = result.report
    return {"apsat_version": apsat_version(), "apsat_target": r.get("target", ""),
            "apsat_rules": ",".join(map(str, r.get("rules") or [])) or "default plan",
            "apsat_extractor": (r.get("extraction") or {}).get("method", ""),
            "apsat_input_dims": json.dumps({n: list(d) for n, d in result.model.inputs.items()})}


def _external(result, path, meta: dict):
    """The export of a model past protobuf's limit (see the module doc)."""
    from apsat.backends.onnx import export_onnx
    from apsat.backends.onnx.external import save_external
    from apsat.backends.onnx.views import ExportError

    if path is None:
        raise ExportError("the model's weights pass protobuf's 2 GB limit: the export needs a path, "
                          "beside which they are written as external data")
    arrays: dict = {}
    proto = export_onnx(result.program, result.model, meta, arrays=arrays, stored=planner_stored(result))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    try:
        save_external(proto, Path(path), arrays)
    except Exception as e:     # the checker raises several kinds; each is an export bug
        raise ExportError(f"the exported model fails onnx.checker: {str(e).splitlines()[0]}") from None
    note = "symbolic dims fixed at the representative sizes (an export with external data)" \
        if result.general is not None else None
    return proto, note, str(Path(path).with_name(Path(path).name + ".data"))
