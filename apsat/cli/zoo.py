"""`apsat zoo`: optimise a set of models as a batch, each in its own worker process.

Models run on `--jobs` local worker processes (or a Dask cluster, `--executor dask`), each
under `--model-timeout` and `--max-memory`; a crash, hang or out-of-memory is that model's
failure row and the others go on. A Dask scheduler is reached over tls:// with
`--security FILE` (or Dask's TLS settings); a plain tcp:// one off this machine only with
`--insecure`. Results are stored under a content key in the output directory (inputs,
options and apsat's own source) and reused by a later run with the same inputs (`--force`
redoes them). A live
view shows the workers; the summary table, one line per failure and `index.html` (the
report a person reads) follow.
"""
from __future__ import annotations

import sys
from pathlib import Path

from apsat.errors import ApsatError

EXIT_OK, EXIT_VERIFY_FAILED, EXIT_BAD_INPUT, EXIT_BACKEND_FAILED, EXIT_INTERNAL_ERROR = 0, 1, 2, 3, 4
EXIT_INTERRUPTED = 130


def zoo_options(p) -> None:
    """The options only `zoo` has: how the batch runs."""
    from apsat.pipeline.batch import DEFAULT_MAX_MEMORY_MIB, DEFAULT_TIMEOUT_S

    p.add_argument("--jobs", type=int, default=1, metavar="N", help="models run at once (default 1)")
    p.add_argument("--model-timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                   help=f"a model still running after this fails with that reason (default {DEFAULT_TIMEOUT_S:g})")
    p.add_argument("--max-memory", type=float, default=None, metavar="MIB",
                   help=f"a model's worker above this resident memory fails with that reason "
                        f"(default {DEFAULT_MAX_MEMORY_MIB:g}, or for a larger model 2048 plus three "
                        f"times its files' MiB, external data included)")
    p.add_argument("--force", action="store_true", help="redo models whose stored result is still valid")
    p.add_argument("--onnx-out", action="store_true",
                   help="also write each optimised program as ONNX, OUT/MODEL/optimized.onnx")
    p.add_argument("--executor", choices=("local", "dask"), default="local",
                   help="local worker processes (default) or a Dask distributed cluster")
    p.add_argument("--scheduler", metavar="tls://HOST:PORT",
                   help="with --executor dask: the scheduler's address (default: a local cluster of --jobs workers); "
                        "tcp:// only on this machine unless --insecure")
    p.add_argument("--security", metavar="FILE",
                   help="with --executor dask: YAML or JSON naming the TLS files ca_file, cert and key for a "
                        "tls:// scheduler (default: Dask's distributed.comm.tls settings)")
    p.add_argument("--insecure", action="store_true",
                   help="with --executor dask: allow a plain tcp:// scheduler off this machine (anyone who "
                        "reaches its port can run code on the cluster)")


def zoo_tasks(args, optimize_keywords, shapes_for) -> list:
    """One Task per model of the command line (the light zoo when none is given)."""
    from apsat.pipeline.batch import Task
    from apsat.pipeline.optimize import optimize
    from apsat.pipeline.zoo import light_model_paths

    paths: list[Path] = []
    for item in args.models or []:
        p = Path(item)
        paths.extend(sorted(p.glob("*.onnx")) if p.is_dir() else [p])
    light = not args.models
    if light:
        paths = light_model_paths()
    kw = optimize_keywords(args, optimize)
    target, rules = kw.pop("target"), kw.pop("rules") or []
    tasks = []
    for p in paths:
        name = p.stem.replace("light_", "") if light else p.stem
        try:
            shapes = shapes_for(p, args, False)
        except Exception:          # an unreadable model: its worker says why, in one line
            shapes = None
        tasks.append(Task(name, str(p), target, list(rules), {**kw, "input_shapes": shapes},
                          args.out, randomize=light, compile_kernels=args.compile_kernels,
                          onnx_out=args.onnx_out))
    if len({t.name for t in tasks}) != len(tasks):
        raise ApsatError("two models share a file name; their reports would overwrite each other")
    return tasks


def run_zoo(args, tasks, console) -> list[dict]:
    """The tasks' rows, run as the flags say, with the live view on `console`."""
    from rich.live import Live

    from apsat.cli.progress import BatchProgress
    from apsat.pipeline.store import ResultStore

    if args.jobs < 1:
        raise ApsatError("--jobs must be at least 1")
    dask = _dask_access(args) if args.executor == "dask" else {}
    store = ResultStore(args.out)
    view = BatchProgress(len(tasks), args.jobs)
    limits = {"timeout": args.model_timeout, "store": store, "force": args.force, "on_event": view.on_event}
    with Live(view, console=console, refresh_per_second=4, transient=True):
        if args.executor == "dask":      # no --scheduler: a local cluster of --jobs workers
            from apsat.pipeline.batch_dask import run_dask

            return run_dask(tasks, args.scheduler, jobs=args.jobs, max_memory_mib=args.max_memory,
                            **dask, **limits)
        from apsat.pipeline.batch import run_local

        return run_local(tasks, jobs=args.jobs, max_memory_mib=args.max_memory, **limits)


def _dask_access(args) -> dict:
    """run_dask's `security` and `insecure` from --security and --insecure, the scheduler
    address checked before the live view starts (apsat.pipeline.batch_dask.check_scheduler);
    ApsatError, one line, for a bad security file or a refused address."""
    from apsat.pipeline.batch_dask import check_scheduler, load_security

    security = load_security(args.security) if args.security else None
    if args.scheduler:
        check_scheduler(args.scheduler, security, args.insecure)
    return {"security": security, "insecure": args.insecure}


def report_zoo(rows: list[dict], args, console, wall_seconds: float = 0.0) -> int:
    """Print the summary and the failures, write index.html; the exit status."""
    from rich.console import Console

    from apsat.cli.summary import rows_table

    out = Console(width=None if sys.stdout.isatty() else 120)
    out.print(rows_table(rows))
    for r in rows:
        for notice in r.get("notices") or []:
            print(f"apsat: {r['model']}: note: {notice}", file=sys.stderr)
        if r["status"] in ("error", "failed", "interrupted", "internal error"):
            print(f"apsat: {r['model']}: {r.get('error', r['status'])}", file=sys.stderr)
        elif r.get("backend_error"):
            print(f"apsat: {r['model']}: backend: {r['backend_error']}", file=sys.stderr)
    _write_html(rows, args, console, wall_seconds)
    out.print(f"reports written under {args.out}/")
    statuses = [r.get("stored_status", r["status"]) for r in rows]
    if "interrupted" in statuses:
        return EXIT_INTERRUPTED
    if "internal error" in statuses:        # a bug in apsat outranks what the models did
        return EXIT_INTERNAL_ERROR
    if "error" in statuses or "failed" in statuses:
        return EXIT_BAD_INPUT
    if "mismatch" in statuses:
        return EXIT_VERIFY_FAILED
    return EXIT_BACKEND_FAILED if any(r.get("backend_error") for r in rows) else EXIT_OK


def _write_html(rows, args, console, wall_seconds: float):
    """index.html beside the reports (apsat.pipeline.report_html); a note, not a failure,
    when it cannot be written (the results are stored either way)."""
    from apsat.pipeline.report_html import write_report

    try:
        path = write_report(rows, args.out, title="apsat zoo",
                            meta={"target": args.target, "wall_seconds": wall_seconds})
    except (ApsatError, OSError) as e:
        print(f"apsat: note: no HTML report: {e}", file=sys.stderr)
        return
    console.print(f"report: {path}")
