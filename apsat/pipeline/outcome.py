"""How a model's report is made (`first_report`) and counts: a verification or simulation
mismatch (`failed`) or kernels a backend's compiler refused (`compile_failures`). The CLI's
exit statuses and the batch runner's rows both read these."""
from __future__ import annotations


def failed(report: dict) -> bool:
    """Verification against onnxruntime failed: the reference interpreter's, or the target
    backend's run (the systolic simulator's "simulation", GPU kernels' "run")."""
    v = report.get("verification")
    runs = [section.get(key) for section in (report.get("systolic"), report.get("gpu_kernels"))
            if isinstance(section, dict) for key in ("simulation", "run")]
    return bool((v and not v["ok"]) or any(r and r.get("ok") is False for r in runs))


def compile_failures(report: dict) -> str:
    """"" when every kernel the report lists compiled (or none was compiled), else one
    line naming the kernels nvcc or Triton's AOT compiler refused and the first error."""
    section = report.get("gpu_kernels")
    kernels = section.get("kernels", []) if isinstance(section, dict) else []
    bad = [(k.get("name"), tool, (k.get(tool) or {}).get("error")) for k in kernels
           for tool in ("cuda", "triton") if isinstance(k, dict) and (k.get(tool) or {}).get("error")]
    if not bad:
        return ""
    name, tool, error = bad[0]
    lines = [li.strip() for li in str(error).splitlines() if li.strip()]
    first = next((li for li in lines if "error" in li.lower()), lines[0] if lines else "")
    names = ", ".join(f"{n} ({t})" for n, t, _ in bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
    return (f"{len(bad)} kernel compile(s) failed: {names}; {name} ({tool}): {first[:200]} "
            f"(full logs in kernels.json)")


def first_report(m, target, rules, program, eg, loaded, saturation, seconds) -> dict:
    """optimize's report as extraction leaves it: the model, target and rules, the op counts
    before and after, the e-graph's size, saturation and extraction, notices, seconds."""
    nodes_loaded, classes_loaded, cost_before = loaded
    nodes, classes = eg.size()
    return {
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
        "opaque_ops": m.opaque_ops(),
        "notices": list(getattr(m, "notices", [])),
        "seconds": seconds,
    }
