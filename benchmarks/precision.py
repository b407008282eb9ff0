"""Half-precision models through apsat: the light zoo and the real-zoo set in float16 and in
bfloat16, optimised for gpu and verified against the float64 yardstick
(apsat/pipeline/oracle.py; docs/verification.md, "Half-precision models").

float16: onnxruntime's own tool (onnxruntime.transformers.float16, keep_io_types off), as
deployments convert. bfloat16: every float32 weight, value, cast and constant made
bfloat16 (apsat.pipeline.oracle.retyped_copy); onnxruntime's CPU runs no bfloat16 Add, so
those models are judged with their float32 copy standing in for their own run. A
conversion that onnx's checker refuses (Conv, Cos or Log take no bfloat16 before opset
22) is no model a user could bring: its row says "invalid" and it is not counted.
Light models have seeded random weights (seed 0) and `apsat zoo`'s seeded inputs; the real
zoo its stored inputs, float inputs rounded to the type. Per row: whether it verified, the
oracle, err(apsat) and err(onnxruntime in the type, or the float32 copy) against float64
(scaled by the output's largest value), seconds. A model that fails is its row's status.

Usage: python benchmarks/precision.py [NAME_SUBSTRING ...] [--zoo light|real|all] [--types float16,bfloat16]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from real_zoo import ZOO, stored_inputs, zoo_models  # noqa: E402

TYPES = ("float16", "bfloat16")


def models(filters=(), zoo: str = "all") -> list[tuple[str, str, object]]:
    """(name, zoo, path) per model, light zoo first, kept where a filter is in its name."""
    from apsat.pipeline.zoo import light_model_paths

    out = []
    if zoo in ("light", "all"):
        out += [(p.stem.replace("light_", ""), "light", p) for p in light_model_paths()]
    if zoo in ("real", "all"):
        out += [(m["name"], "real", ZOO / m["file"]) for m in zoo_models()]
    return [m for m in out if not filters or any(f in m[0] for f in filters)]


def narrowed(proto, elem_name: str):
    """The model in `elem_name`, converted as the module doc says."""
    from onnx import TensorProto

    if elem_name == "float16":
        from onnxruntime.transformers.float16 import convert_float_to_float16

        return convert_float_to_float16(proto, keep_io_types=False)
    from apsat.pipeline.oracle import retyped_copy

    return retyped_copy(proto, TensorProto.BFLOAT16)


def row(name: str, zoo: str, path, elem_name: str) -> dict:
    """One model in one type: optimise (gpu, verified) and the verification's figures."""
    import numpy as np
    import onnx
    from onnx import helper

    from apsat.pipeline.optimize import optimize
    from apsat.pipeline.zoo import randomize_weights

    start = time.perf_counter()
    base = onnx.load(str(path))
    proto = narrowed(randomize_weights(base, seed=0) if zoo == "light" else base, elem_name)
    kw = {}
    if zoo == "real":
        types = {i.name: helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type) for i in proto.graph.input}
        inputs = {k: v.astype(types[k]) if v.dtype.kind == "f" and k in types else v
                  for k, v in stored_inputs(name).items()}
        kw = dict(inputs=inputs, input_shapes={k: v.shape for k, v in inputs.items()})
    try:    # an op whose schema at the model's opset takes no such type: no model to run
        onnx.checker.check_model(proto, full_check=True)
    except Exception as e:
        return {"model": name, "type": elem_name, "status": "invalid", "seconds": time.perf_counter() - start,
                "why": str(e).splitlines()[0][:90]}
    try:
        result = optimize(proto, target="gpu", **kw)
        v = result.report["verification"]
        exported = export_check(proto, result, kw.get("inputs"))
    except Exception as e:       # the row says what failed
        return {"model": name, "type": elem_name, "status": f"{type(e).__name__}: {str(e).splitlines()[0][:90]}",
                "seconds": time.perf_counter() - start}
    oracle = ("float64, f32 copy stands in" if "stands in" in v["oracle"] else
              "float64" if v["oracle"].startswith("float64") else "fixed (" + v["oracle"].split(" (")[0] + ")")
    ok = v["ok"] and exported["f32_left"] == 0 and exported.get("ok", True)
    return {"model": name, "type": elem_name, "status": "ok" if ok else "FAILED", "oracle": oracle,
            "err_apsat": v.get("err_apsat"), "err_ort": v.get("err_ort"), "seconds": time.perf_counter() - start,
            "max_rel": float(np.float64(v["max_rel_err"])), **exported}


def export_check(proto, result, inputs) -> dict:
    """The export of `result`: how many float32 weights, inputs and outputs it holds, and
    (where onnxruntime runs the type) its largest difference from the original model in
    onnxruntime on the same inputs, scaled by the output's largest value, judged by the
    half-type tolerance (apsat.pipeline.verify.half_tolerance)."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto

    from apsat.pipeline.export import export_result
    from apsat.pipeline.verify import half_tolerance
    from apsat.pipeline.zoo import random_inputs

    out, _, _ = export_result(result)
    ios = list(out.graph.input) + list(out.graph.output)
    f32 = sum(t.data_type == TensorProto.FLOAT for t in out.graph.initializer) + \
        sum(v.type.tensor_type.elem_type == TensorProto.FLOAT for v in ios)
    row = {"f32_left": f32, "export_nodes": len(out.graph.node)}
    feeds = inputs if inputs is not None else random_inputs(result.model, 0)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    try:
        runs = [ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
                for m in (proto, out)]
        want, got = (s.run(None, {i.name: feeds[i.name] for i in s.get_inputs()}) for s in runs)
    except Exception as e:  # noqa: BLE001 - onnxruntime's CPU has no kernel for the type
        row["export_diff"] = f"not run: {str(e).splitlines()[0][:60]}"
        return row
    diff = max(float(np.abs(np.float64(a) - np.float64(b)).max() / max(1.0, float(np.abs(np.float64(a)).max())))
               for a, b in zip(want, got))
    row["export_diff"], row["ok"] = diff, diff <= half_tolerance(result.program.float_type())
    return row


def _e(x) -> str:
    return "-" if x is None else f"{x:.2e}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("filters", nargs="*")
    ap.add_argument("--zoo", choices=("light", "real", "all"), default="all")
    ap.add_argument("--types", default=",".join(TYPES))
    args = ap.parse_args(argv)
    rows = []
    print(f"{'model':20} {'type':9} {'status':8} {'oracle':28} {'err apsat':>10} {'err ort':>10} "
          f"{'f32 left':>8} {'export diff':>11} {'s':>6}")
    for name, zoo, path in models(args.filters, args.zoo):
        for elem_name in args.types.split(","):
            r = row(name, zoo, path, elem_name)
            rows.append(r)
            diff = r.get("export_diff")
            diff = _e(diff) if not isinstance(diff, str) else "not run"
            print(f"{name:20} {elem_name:9} {r['status'][:60]:8} {r.get('oracle', ''):28} "
                  f"{_e(r.get('err_apsat')):>10} {_e(r.get('err_ort')):>10} {r.get('f32_left', '-'):>8} "
                  f"{diff:>11} {r['seconds']:6.1f}", flush=True)
    ok = sum(r["status"] == "ok" for r in rows)
    valid = [r for r in rows if r["status"] != "invalid"]
    print(f"verified: {ok} of {len(valid)} valid models ({len(rows) - len(valid)} conversions are no valid "
          "ONNX model: an op's schema at the model's opset takes no such type)")
    return 0 if ok == len(valid) else 1


if __name__ == "__main__":
    sys.exit(main())
