"""Reading a corpus run back (benchmarks/corpus.py run): one row per model and target from
what `apsat zoo` leaves, the failures grouped by class, the table and its markdown.

Where each figure lives:
  - verified / mismatch: OUT/MODEL/report.json (apsat.pipeline.outcome.failed), written only
    for a model that finished; a model that did not finish has no report, and its reason is
    the `apsat: MODEL: REASON` line the zoo prints on stderr (kept in OUT/zoo-stderr.txt);
  - host steps: report.json's gpu_kernels.totals.host_steps (gpu) or systolic.host_steps
    (systolic, a list); opaque ops by type: report.json's opaque_ops;
  - seconds and peak MiB: the zoo's result record, OUT/results/KEY.json ("row": seconds is
    the worker's own time for the model, peak_mib its resident memory sampled by the
    parent). The zoo stores records only for finished models computed by the caller's own
    apsat source, so a failed model's time and memory are recorded nowhere but its reason
    (a time or memory limit names it), and where apsat's source changed during the run
    (the zoo's "not stored" note) the seconds fall back to the sum of report.json's phase
    seconds (the optimise call alone) and the peak memory is not recorded;
  - onnxruntime latency ratio: measured here (`latency_ratio`), original / optimized.onnx.
"""
from __future__ import annotations

import json
import re
import statistics
import sys
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

LINE = re.compile(r"^apsat: (?P<model>[^:]+): (?P<msg>.*)$")


def failures_from_stderr(text: str) -> dict:
    """model -> reason, from the zoo's stderr (`apsat: MODEL: REASON`; notes and backend
    lines are not failures)."""
    out = {}
    for line in text.splitlines():
        m = LINE.match(line.strip())
        if m and not m["msg"].startswith(("note:", "backend:")):
            out[m["model"]] = m["msg"]
    return out


def stored_rows(out: Path) -> dict:
    """model -> (the newest stored result row under OUT/results, its file's mtime)."""
    rows: dict = {}
    for path in sorted((out / "results").glob("*.json"), key=lambda p: p.stat().st_mtime):
        try:
            row = json.loads(path.read_text())["row"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        rows[row.get("model")] = (row, path.stat().st_mtime)
    return rows


def classify(status: str, reason: str) -> str:
    """The class of a failure, for grouping: mismatch, timeout, memory, crash, an internal
    error's exception type, an op that has no lowering or no ONNX form, or the reason's
    first words with names and numbers dropped."""
    if status == "mismatch":
        return "mismatch"
    patterns = [(r"time limit", "timeout"), (r"memory limit", "memory"),
                (r"worker died \((killed by signal \w+|exit status -?\d+)", r"crash (\1)"),
                (r"RecursionError", "RecursionError"),
                (r"internal error in [^:]+: (\w+)", r"internal \1"),
                (r"(?:compute )?([\w-]+) has no ONNX form", r"no ONNX form: \1"),
                (r"unknown op '([\w.]+)'", r"unsupported op \1"), (r"op '?(\w+)'? is not supported", r"unsupported op \1"),
                (r"no lowering for '?(\w+)'?", r"unsupported op \1"),
                (r"onnxruntime cannot run", "onnxruntime refuses the model"),
                (r"cannot fold at import", "fold at import"),
                (r"depends on (the )?(input )?values", "data-dependent shape"),
                (r"(\w+) node \d+ [^:]*: no lowering, and the shape of its output .* cannot be determined",
                 r"import: \1 of unknown shape"),
                (r"(\w+) node \d+ [^:]*: .*has no elements", r"import: \1 gives an empty tensor")]
    for pattern, label in patterns:
        m = re.search(pattern, reason)
        if m:
            return m.expand(label)
    reason = re.sub(r"^\S+\.onnx: ", "", reason)            # the file: named by the row already
    words = re.sub(r"'[^']*'|\"[^\"]*\"|\d[\d.,x]*|\([^)]*\)", "", reason).split()
    return " ".join(words[:6]) or "error"


def host_steps(report: dict) -> int | None:
    """Host (opaque) steps of the program: the gpu lowering's count, or the systolic
    stream's list."""
    gpu = (report.get("gpu_kernels") or {}).get("totals") or {}
    if "host_steps" in gpu:
        return int(gpu["host_steps"])
    steps = (report.get("systolic") or {}).get("host_steps")
    return len(steps) if isinstance(steps, list) else steps


def collect(out: Path, names: list, stderr: str, target: str) -> list[dict]:
    """One row per model of a zoo run on one target (see the module doc)."""
    from apsat.pipeline.outcome import failed

    fails, stored = failures_from_stderr(stderr), stored_rows(out)
    rows = []
    for name in names:
        row = {"model": name, "target": target}
        report_path = out / name / "report.json"
        if name in fails or not report_path.exists():
            reason = fails.get(name, "no report written and no reason printed")
            rows.append({**row, "status": "failed", "reason": reason, "class": classify("failed", reason)})
            continue
        report = json.loads(report_path.read_text())
        status = "mismatch" if failed(report) else "verified"
        rec, when = stored.get(name, ({}, 0.0))
        if abs(when - report_path.stat().st_mtime) > 60:
            rec = {}        # a record of another computation of this model, not of this report
        seconds = rec.get("seconds") or sum((report.get("seconds") or {}).values()) or None
        rows.append({**row, "status": status, "class": classify(status, "") if status != "verified" else "",
                     "seconds": seconds, "peak_mib": rec.get("peak_mib"), "stored": bool(rec),
                     "host_steps": host_steps(report), "opaque_ops": report.get("opaque_ops") or {},
                     "onnx_nodes": sum((report.get("ops_before") or {}).values()),
                     "optimized": str(out / name / "optimized.onnx")
                     if (out / name / "optimized.onnx").exists() else None})
    return rows


def latency_ratio(original: Path, optimized: Path, runs: int = 10) -> tuple[float | None, str]:
    """(median latency of the original / of optimized.onnx, note) with onnxruntime on the
    CPU (ORT_ENABLE_ALL, 2 threads, interleaved runs: benchmarks/onnx_out.py's timing) on
    inputs seeded as `apsat zoo` seeds them; None and why when it cannot be measured or the
    export's outputs (at ORT_DISABLE_ALL) fail verification's rule against a float64 run of
    the original (apsat.pipeline.verify.judge: within 8x onnxruntime's own float32 error)."""
    import onnx

    import onnx_out
    from apsat.pipeline.inputs import random_inputs
    from apsat.pipeline.verify import judge, run_oracle

    try:
        proto, export = onnx.load(original), onnx.load(optimized)
        names = {i.name for i in export.graph.input}
        inputs = {k: v for k, v in random_inputs(proto, 0).items() if k in names}
        sessions = {"orig": onnx_out.session(proto, "all"), "export": onnx_out.session(export, "all")}
        # the export's own numbers, without onnxruntime's graph rewrites (at ORT_ENABLE_ALL those
        # reorder float sums: ShuffleNet's logits move by 3e-5 there, the original's alike),
        # judged as verification judges apsat's program: against a float64 run of the original
        got = onnx_out.outputs(onnx_out.session(export, "disable"), inputs)
        if not judge(run_oracle(proto, inputs), got).ok:
            return None, "export differs from the original"
        times = onnx_out.latency(sessions, inputs, runs=runs, warmup=3, min_seconds=1.0)
    except Exception as e:  # noqa: BLE001 - the ratio is left out, with the reason
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''}"
    return times["orig"] / times["export"], ""


# ---- the table ---------------------------------------------------------------------------------

def summary_lines(rows: list[dict]) -> list[str]:
    """Per target: verified / failed counts, failures by class (with the models), opaque
    ops by type (summed), and one line per model."""
    lines = []
    for target in dict.fromkeys(r["target"] for r in rows):
        rs = [r for r in rows if r["target"] == target]
        ok = [r for r in rs if r["status"] == "verified"]
        lines += [f"target {target}: {len(rs)} models, {len(ok)} verified, {len(rs) - len(ok)} failed", ""]
        classes = defaultdict(list)
        for r in rs:
            if r["status"] != "verified":
                classes[r["class"]].append(r["model"])
        if classes:
            lines.append("failures by class:")
            for cls, models in sorted(classes.items(), key=lambda kv: (-len(kv[1]), kv[0])):
                lines.append(f"  {len(models):3d}  {cls}: {', '.join(models)}")
            lines.append("")
        opaque = Counter()
        for r in rs:
            opaque.update(r.get("opaque_ops") or {})
        lines.append("opaque ops (host steps) by op type, all models: "
                     + (", ".join(f"{op} x{n}" for op, n in opaque.most_common()) or "none"))
        steps = [r["host_steps"] for r in ok if r.get("host_steps") is not None]
        lines.append(f"host steps per verified model: {sum(steps)} in all, "
                     f"median {statistics.median(steps) if steps else 0:g}, max {max(steps, default=0)}")
        unstored = [r for r in ok if not r.get("stored")]
        if unstored:
            lines.append(f"{len(unstored)} verified models without the zoo's stored record (apsat's source "
                         f"changed during the run): their seconds are report.json's phase total, "
                         f"their peak MiB is not recorded")
        lines += ["", *_model_table(rs), ""]
    return lines


def _model_table(rows: list[dict]) -> list[str]:
    """One line per model: status, class, seconds, peak MiB, nodes, host steps, opaque ops,
    onnxruntime latency ratio."""
    head = (f"{'model':36s} {'status':9s} {'s':>6s} {'MiB':>6s} {'nodes':>6s} {'host':>4s} "
            f"{'ort ratio':>9s}  opaque / failure")
    out = [head, "-" * len(head)]
    for r in sorted(rows, key=lambda r: (r["status"] != "verified", r["model"])):
        ratio = r.get("ort_ratio")
        cells = [f"{r['model']:36s}", f"{r['status']:9s}", _num(r.get("seconds"), 6, ".1f"),
                 _num(r.get("peak_mib"), 6, ".0f"), _num(r.get("onnx_nodes"), 6, "d"),
                 _num(r.get("host_steps"), 4, "d"), f"{ratio:9.2f}" if ratio else f"{'-':>9s}"]
        tail = (", ".join(f"{k}x{n}" for k, n in sorted((r.get("opaque_ops") or {}).items())) or "-"
                if r["status"] == "verified" else f"[{r['class']}] {r.get('reason', '')}"[:160])
        if r.get("ort_note"):
            tail += f"  (ort ratio: {r['ort_note']})"
        out.append(" ".join(cells) + "  " + tail)
    return out


def _num(value, width: int, spec: str) -> str:
    return f"{'-':>{width}s}" if value is None else f"{value:{width}{spec}}"


def markdown(rows: list[dict], manifest: dict, skipped_static: dict, command: str) -> str:
    """docs/corpus.md: how the corpus is made and run, the run's table, the architecture
    list (exported, with variant and size) and every skipped family with its reason."""
    models, skipped = manifest["models"], {**skipped_static, **manifest["skipped"]}
    libs = Counter(e["library"] for e in models.values())
    text = ["# The public model corpus", "",
            "`benchmarks/corpus.py` exports one small model per architecture family of timm (its model "
            "modules, and the distinct architectures that share one), torchvision (`list_models()`, by "
            "family) and transformers (its model modules: encoders, decoders, encoder-decoders, vision, "
            "audio and multimodal towers), and runs them through `apsat zoo`. Weights are seeded random "
            "ones and nothing is downloaded (timm `pretrained=False`, torchvision `weights=None`, "
            "transformers from a tiny config: 2 layers, hidden 32, 2 heads, vocabulary 128, 16 tokens); "
            "images are 64x64 unless a family needs more; batch 1, static shapes, TorchScript exporter, "
            "opset 17; a family whose smallest build has over 30 MB of weights is skipped.", "",
            "```sh", "pip install -e '.[corpus]'     # timm, transformers, torchvision (torch 2.13.0 CPU)",
            "python benchmarks/corpus.py list      # architectures, their state, families left out",
            "python benchmarks/corpus.py export    # into the user cache dir (apsat/corpus), resumable",
            "python benchmarks/corpus.py run --targets gpu systolic:32x32 [--jobs N] [--limit N] [--only PATTERN]",
            "python benchmarks/corpus.py sample    # the CI sample, tests/data/corpus", "```", "",
            f"Exported: {len(models)} architectures ({', '.join(f'{n} {k}' for k, n in libs.most_common())}); "
            f"skipped: {len(skipped)} (lists below). Where the run's figures come from: "
            "`benchmarks/corpus_results.py`'s docstring.", "",
            f"Run: `{command}`", "", "```", *summary_lines(rows), "```", "",
            f"## Exported architectures ({len(models)})", "",
            "| name | library | variant | nodes | MB | export error vs torch |", "|---|---|---|---|---|---|"]
    for name, e in models.items():
        text.append(f"| {name} | {e['library']} | `{e['variant']}` | {e['nodes']} | "
                    f"{e['bytes'] / 2**20:.2f} | {e['max_abs_error_vs_torch']:.1e} |")
    text += ["", f"## Skipped families ({len(skipped)})", "", "| name | reason |", "|---|---|"]
    text += [f"| {name} | {why.replace('|', '/')} |" for name, why in sorted(skipped.items())]
    return "\n".join(text) + "\n"
