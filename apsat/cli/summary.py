"""The summary `apsat optimize` and `apsat zoo` print, and how a model's report counts:
a verification or simulation mismatch (`failed`, exit 1) or kernels a backend's compiler
refused (`compile_failures`, exit 3)."""
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


def _speedup(report: dict) -> str:
    """The modelled speed-up (cost before / after, on the target's cost model), as text."""
    value = report["extraction"].get("modelled_speedup")
    return "" if value is None else f"{value:.2f}x"


def summary_table(reports: list[dict]):
    """A rich Table: one row a model (an `error` report gets an error row)."""
    from rich.table import Table

    table = Table(title="apsat summary")
    for col in ("model", "onnx ops", "program nodes", "e-graph nodes", "modelled speed-up", "seconds",
                "verify", "max err"):
        table.add_column(col, justify="left" if col == "model" else "right")
    for r in reports:
        if "error" in r:
            table.add_row(r["model"], "", "", "", "", "", "[red]error[/red]", "")
            continue
        v = r.get("verification")
        status = "-" if v is None and "systolic" not in r else (
            "[red]FAIL[/red]" if failed(r) else "[green]ok[/green]")
        table.add_row(r["model"], str(sum(r["ops_before"].values())), str(sum(r["ops_after"].values())),
                      str(r["egraph"]["nodes"]), _speedup(r), f"{sum(r['seconds'].values()):.1f}", status,
                      "" if v is None else f"{v['max_abs_err']:.1e}")
    return table
