"""The summaries `apsat optimize` and `apsat zoo` print: a table of reports (optimize) or
of batch rows (zoo). How a report counts is apsat.pipeline.outcome's."""
from __future__ import annotations

from apsat.pipeline.outcome import compile_failures, failed  # noqa: F401  (re-exported)


def _speedup(report: dict) -> str:
    """The modelled speed-up (cost before / after, on the target's cost model), as text."""
    value = report["extraction"].get("modelled_speedup")
    return "" if value is None else f"{value:.2f}x"


def error_ratio(v: dict | None) -> str:
    """A verification's float64-rule ratio (apsat's error / onnxruntime's, both against the
    float64 run) as text: "" without verification, "f32" where the oracle fell back to the
    fixed tolerance, "-" where onnxruntime's error is 0."""
    if not v:
        return ""
    if not str(v.get("oracle", "")).startswith("float64"):
        return "f32"
    return "-" if v.get("ratio") is None else f"{v['ratio']:.2f}"


def summary_table(reports: list[dict]):
    """A rich Table: one row a model (an `error` report gets an error row, an `internal`
    one an internal-error row). `err ÷ ort` is the float64 rule's ratio (`error_ratio`);
    report.json keeps both errors and the largest difference from float32 onnxruntime
    (`max_abs_err`)."""
    from rich.table import Table

    table = Table(title="apsat summary")
    for col in ("model", "onnx ops", "program nodes", "e-graph nodes", "modelled speed-up", "seconds",
                "verify", "err ÷ ort"):
        table.add_column(col, justify="left" if col == "model" else "right")
    for r in reports:
        if "error" in r:
            label = "[red]internal error[/red]" if "internal" in r else "[red]error[/red]"
            table.add_row(r["model"], "", "", "", "", "", label, "")
            continue
        v = r.get("verification")
        status = "-" if v is None and "systolic" not in r else (
            "[red]FAIL[/red]" if failed(r) else "[green]ok[/green]")
        table.add_row(r["model"], str(sum(r["ops_before"].values())), str(sum(r["ops_after"].values())),
                      str(r["egraph"]["nodes"]), _speedup(r), f"{sum(r['seconds'].values()):.1f}", status,
                      error_ratio(v))
    return table


STATUS_STYLE = {"ok": "[green]ok[/green]", "reused": "[cyan]reused[/cyan]", "mismatch": "[red]FAIL[/red]",
                "error": "[red]error[/red]", "failed": "[red]failed[/red]", "interrupted": "[yellow]stopped[/yellow]",
                "internal error": "[red]internal error[/red]"}


def rows_table(rows: list[dict]):
    """A rich Table of batch rows (apsat.pipeline.batch): one line a model. An `err ÷ ort`
    column (the float64 rule's ratio) where some row carries one (`err_ratio`)."""
    from rich.table import Table

    ratios = any(r.get("err_ratio") is not None for r in rows)
    table = Table(title="apsat zoo")
    for col in ("model", "status", "onnx ops", "e-graph nodes", "kernels / cycles", "modelled speed-up",
                "seconds", "max err") + (("err ÷ ort",) if ratios else ()):
        table.add_column(col, justify="left" if col in ("model", "status") else "right")
    for r in rows:
        status = r.get("stored_status", r["status"])
        label = STATUS_STYLE.get(r["status"] if r["status"] != "reused" or status == "ok" else status, status)
        work = r.get("kernels") if r.get("kernels") is not None else r.get("cycles")
        speedup, err = r.get("speedup"), r.get("max_abs_err")
        cells = [r["model"], label, _text(r.get("onnx_nodes")), _text(r.get("egraph_nodes")), _text(work),
                 "" if speedup is None else f"{speedup:.2f}x", "" if r.get("seconds") is None
                 else f"{r['seconds']:.1f}", "" if err is None else f"{err:.1e}"]
        table.add_row(*cells, *([_fmt(r.get("err_ratio"), ".2f")] if ratios else []))
    return table


def _fmt(value, spec: str) -> str:
    return "" if value is None else format(value, spec)


def _text(value) -> str:
    return "" if value is None else str(value)
