"""The public model corpus: one small model per architecture family of timm, torchvision and
transformers, exported to ONNX with seeded random weights, and run through `apsat zoo`.

  list     the architectures (exported, skipped with the reason, or not yet tried) and the
           families left out of the catalogue, with why
  export   export every architecture not yet in the cache ([--only PATTERN] [--retry]);
           a failure is recorded as a skip with its reason, never an abort
  run      `apsat zoo MODEL... --target T --onnx-out --out DIR` per target over the exported
           models, then the table: verified / failed, failures by class, host steps, opaque
           ops, seconds and peak memory, onnxruntime latency of optimized.onnx against the
           original ([--markdown docs/corpus.md] writes it with the architecture list)
  merge    one table from several runs (RUN/rows.json; a later run's row replaces an earlier
           one: the models a fix touched, rerun) [--markdown FILE]
  sample   write the CI sample (tests/data/corpus/, corpus_sample.SAMPLE) from the catalogue

Nothing is downloaded: timm `pretrained=False`, torchvision `weights=None`, transformers
models from a tiny config (corpus_hf). Models and runs live in the cache directory
(platformdirs' user cache dir, apsat/corpus; `--cache` or $APSAT_CORPUS_DIR), out of git.
Needs the corpus extra: pip install -e '.[corpus]' (torch stays 2.13.0 CPU).

Usage: python benchmarks/corpus.py list|export|run|merge|sample [options]
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))   # the corpus_* helpers, also in workers
sys.path.insert(0, str(ROOT))

import corpus_export as cx  # noqa: E402


def _select(names, only: list | None) -> list:
    """The names that --only picks, in their order: a pattern that is a name picks that
    name alone; one with glob characters what it matches; any other the names holding it."""
    if not only:
        return list(names)
    names, picked = list(names), set()
    for p in only:
        if p in names:
            picked.add(p)
        elif any(c in p for c in "*?["):
            picked.update(fnmatch.filter(names, p))
        else:
            picked.update(n for n in names if p in n)
    return [n for n in names if n in picked]


def cmd_list(args) -> int:
    """Print every architecture with its state, then the families left out and why."""
    import corpus_models as cm

    archs, static = cm.catalogue(cm.import_libraries())
    manifest = cx.load_manifest(args.cache)
    counts = {"exported": 0, "skipped": 0, "not yet exported": 0}
    for a in archs:
        if a.name in manifest["models"]:
            e, state = manifest["models"][a.name], "exported"
            what = f"{e['variant']}, {e['nodes']} nodes, {e['bytes'] / 2**20:.2f} MB"
        elif a.name in manifest["skipped"]:
            state, what = "skipped", manifest["skipped"][a.name]
        else:
            state, what = "not yet exported", ", ".join(a.candidates[:3])
        counts[state] += 1
        print(f"{a.name:40s} {a.library:12s} {state:17s} {what}")
    print(f"\nleft out of the catalogue ({len(static)}):")
    for name, why in static.items():
        print(f"{name:40s} {why}")
    print(f"\n{len(archs)} architectures: {counts['exported']} exported, {counts['skipped']} skipped, "
          f"{counts['not yet exported']} not yet exported; {len(static)} families left out; cache {args.cache}")
    return 0


def cmd_export(args) -> int:
    """Export the architectures not yet in the cache (and, with --retry, those skipped)."""
    import corpus_models as cm

    libs = cm.import_libraries()
    archs, _ = cm.catalogue(libs)
    manifest = cx.load_manifest(args.cache)
    manifest["versions"] = {"torch": libs[0].__version__, "torchvision": libs[1].__version__,
                            "transformers": libs[2].__version__, "timm": libs[3].__version__}
    done = {n for n, e in manifest["models"].items() if (args.cache / e["file"]).exists()}
    pending = [a.name for a in archs if a.name not in done and (args.retry or a.name not in manifest["skipped"])]
    pending = _select(pending, args.only)
    print(f"exporting {len(pending)} of {len(archs)} architectures into {args.cache}", flush=True)
    start = time.perf_counter()
    manifest = cx.export_all(pending, args.cache, manifest, timeout=args.timeout,
                             log=lambda line: print(line, flush=True))
    print(f"{len(manifest['models'])} exported, {len(manifest['skipped'])} skipped in the cache; "
          f"this run {time.perf_counter() - start:.0f} s")
    return 0


def zoo_command(paths: list, target: str, out: Path, args) -> list:
    """The `apsat zoo` command line for one target."""
    cmd = [sys.executable, "-m", "apsat.cli", "zoo", *map(str, paths), "--target", target,
           "--out", str(out), "--jobs", str(args.jobs), "--model-timeout", str(args.model_timeout),
           "--max-memory", str(args.max_memory)]
    # the export writes the gpu target's program (docs/onnx-export.md): a systolic program's
    # accelerator atoms have no ONNX form, so a systolic run is not asked for one
    return cmd + (["--onnx-out"] if args.onnx_out and not target.startswith("systolic") else [])


def run_zoo(cmd: list, out: Path) -> str:
    """Run one zoo command, its stderr shown as it comes and returned (and kept in
    OUT/zoo-stderr.txt), its stdout (the zoo's own table) in OUT/zoo-stdout.txt."""
    out.mkdir(parents=True, exist_ok=True)
    models = [c for c in cmd if c.endswith(".onnx")]
    shown = [c for c in cmd[1:] if not c.endswith(".onnx")]
    shown.insert(3, f"<{len(models)} models: {' '.join(Path(m).stem for m in models[:4])}"
                    f"{' ...' if len(models) > 4 else ''}>")
    print("$ python " + shlex.join(shown), flush=True)
    with open(out / "zoo-stdout.txt", "w") as stdout:
        proc = subprocess.Popen(cmd, stdout=stdout, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        lines = []
        for line in proc.stderr:
            lines.append(line)
            print("  " + line.rstrip(), file=sys.stderr, flush=True)
        proc.wait()
    text = "".join(lines)
    (out / "zoo-stderr.txt").write_text(text)
    return text


def cmd_run(args) -> int:
    """Run the zoo per target on the selected exported models; print (and write) the table."""
    import corpus_results as cr

    manifest = cx.load_manifest(args.cache)
    names = [n for n, e in manifest["models"].items() if (args.cache / e["file"]).exists()]
    names = _select(names, args.only)[: args.limit or None]
    if not names:
        print("no exported model matches; run `python benchmarks/corpus.py export` first", file=sys.stderr)
        return 2
    paths = [args.cache / manifest["models"][n]["file"] for n in names]
    rows = []
    for target in args.targets:
        out = args.out / target.replace(":", "_")
        stderr = run_zoo(zoo_command(paths, target, out, args), out)
        target_rows = cr.collect(out, names, stderr, target)
        for r in target_rows:
            if r.get("optimized") and args.latency:
                _time_export(r, manifest, args)
        rows += target_rows
    (args.out / "rows.json").write_text(json.dumps(rows, indent=1, default=str) + "\n")
    return _report(rows, manifest, args)


def _time_export(row: dict, manifest: dict, args) -> None:
    """The row's onnxruntime latency ratio of optimized.onnx against the original, and why
    none (corpus_results.latency_ratio)."""
    import corpus_results as cr

    original = args.cache / manifest["models"][row["model"]]["file"]
    row["ort_ratio"], row["ort_note"] = cr.latency_ratio(original, Path(row["optimized"]))


def _report(rows: list, manifest: dict, args) -> int:
    """Print the table of `rows` (and write it with the lists to --markdown); 0 when every
    row verified, else 1."""
    import corpus_results as cr

    print("\n".join(cr.summary_lines(rows)))
    if args.markdown:
        import corpus_models as cm

        _, static = cm.catalogue(cm.import_libraries())
        command = "python benchmarks/corpus.py " + shlex.join(sys.argv[1:])
        args.markdown.write_text(cr.markdown(rows, manifest, static, command))
        print(f"wrote {args.markdown}")
    return 0 if all(r["status"] == "verified" for r in rows) else 1


def cmd_merge(args) -> int:
    """Merge the rows of several runs (each RUN/rows.json; a later run's row for a model and
    target replaces an earlier one: a rerun of the models a fix touched) and print (and
    write) the table, naming each run."""
    import corpus_results as cr

    merged: dict = {}
    for run in args.runs:
        for r in json.loads((run / "rows.json").read_text()):
            merged[(r["model"], r["target"])] = r
    rows = list(merged.values())
    manifest = cx.load_manifest(args.cache)
    for r in rows:      # classified and judged by older rules: again by today's
        if r.get("reason"):
            r["class"] = cr.classify(r["status"], r["reason"])
        if r.get("ort_note") == "export differs from the original" and r.get("optimized"):
            _time_export(r, manifest, args)
    return _report(rows, manifest, args)


def cmd_sample(args) -> int:
    """Write the CI sample into tests/data/corpus (corpus_sample)."""
    import corpus_sample

    return corpus_sample.write_sample(args.dest)


def parser() -> argparse.ArgumentParser:
    """The command line (see the module doc)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cache", type=Path, default=None, help="the corpus directory (default: user cache dir)")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="architectures and skipped families")
    e = sub.add_parser("export", help="export what is not cached yet")
    e.add_argument("--only", nargs="+", metavar="PATTERN", help="names matching a glob or holding a substring")
    e.add_argument("--retry", action="store_true", help="also retry the architectures skipped before")
    e.add_argument("--timeout", type=float, default=cx.TIMEOUT_S, help="seconds per export (default %(default)s)")
    r = sub.add_parser("run", help="run apsat zoo over the exported models and print the table")
    r.add_argument("--targets", nargs="+", default=["gpu", "systolic:32x32"])
    r.add_argument("--jobs", type=int, default=1)
    r.add_argument("--limit", type=int, default=0, help="the first N matching models only")
    r.add_argument("--only", nargs="+", metavar="PATTERN")
    r.add_argument("--out", type=Path, default=None, help="zoo output root (default CACHE/runs)")
    r.add_argument("--model-timeout", type=float, default=60.0, help="seconds per model (default 60)")
    r.add_argument("--max-memory", type=float, default=8192, help="MiB per model (default 8192)")
    r.add_argument("--no-onnx-out", dest="onnx_out", action="store_false",
                   help="leave out --onnx-out (and so the latency ratio)")
    r.add_argument("--no-latency", dest="latency", action="store_false", help="skip the onnxruntime timing")
    r.add_argument("--markdown", type=Path, help="also write the table and the lists here (docs/corpus.md)")
    m = sub.add_parser("merge", help="one table from several runs' rows (later runs replace rows)")
    m.add_argument("runs", nargs="+", type=Path, help="run directories (--out of `run`), oldest first")
    m.add_argument("--markdown", type=Path, help="also write the table and the lists here")
    s = sub.add_parser("sample", help="write the CI sample (tests/data/corpus)")
    s.add_argument("--dest", type=Path, default=ROOT / "tests" / "data" / "corpus")
    return p


def main(argv=None) -> int:
    """Dispatch the subcommand."""
    args = parser().parse_args(argv)
    args.cache = args.cache or cx.default_cache()
    if getattr(args, "out", None) is None and args.command == "run":
        args.out = args.cache / "runs"
    return {"list": cmd_list, "export": cmd_export, "run": cmd_run, "merge": cmd_merge,
            "sample": cmd_sample}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
