"""Command line: `apsat optimize`, `apsat zoo`, `apsat extract`, `apsat rules`, `apsat explain`.

Every command prints a one-line error (never a traceback) for bad input. Exit statuses,
the same for every command (EXIT_* below):

    0  ok
    1  verification or simulation mismatch: the program, the systolic simulator or the
       GPU kernels disagree with onnxruntime; or a lower precision (--precision) refused:
       its error against the float32 original passes --max-error
    2  bad input: an unreadable model, an unknown ruleset, a malformed e-graph file, a bad
       option (argparse's own usage errors exit 2 too)
    3  backend failure: a generated kernel that nvcc or Triton's AOT compiler refused
    4  internal error, a bug in apsat (any other exception): one line "internal error in
       PHASE: TYPE: MESSAGE (traceback: PATH)", the traceback in that file
  130  interrupted (Ctrl-C);  141  stdout closed early (`apsat rules list | head`), quietly

When several models fail in different ways the status is the first that applies in the
order 4, 2, 1, 3.
"""
from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
import time
from pathlib import Path

from apsat.cli.explain import cmd_explain, explain_options
from apsat.cli.rules import cmd_rules, rules_options
from apsat.cli.summary import compile_failures, failed, summary_table
from apsat.cli.zoo import zoo_options
from apsat.errors import ApsatError, VerificationError, is_internal

__all__ = ["main", "build_parser", "optimize_keywords", "compile_failures", "failed"]

EXIT_OK, EXIT_VERIFY_FAILED, EXIT_BAD_INPUT, EXIT_BACKEND_FAILED, EXIT_INTERNAL_ERROR = 0, 1, 2, 3, 4
EXIT_INTERRUPTED, EXIT_BROKEN_PIPE = 130, 141
# optimize() keywords the limit flags set: passed only when given, so the defaults stay
# optimize()'s own.
LIMIT_KEYWORDS = ("iter_limit", "node_limit", "time_limit", "memory_limit", "check_rules")
PRECISION_KEYWORDS = ("precision", "max_error")


def _console():
    from rich.console import Console

    return Console(stderr=True)


_LOWERING_FLAGS = {"gather": ("im2col", "gather"), "fold": ("fold_copies", True),
                   "zips": ("fuse_zips", True)}


def _lowering(text: str) -> dict:
    """--lowering LIST as the systolic compile options (argparse type: ValueError names
    the bad item)."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    if names == ["all"]:
        names = list(_LOWERING_FLAGS)
    bad = [n for n in names if n not in _LOWERING_FLAGS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown lowering option(s) {', '.join(bad) or repr(text)} "
                                         f"(use {', '.join(_LOWERING_FLAGS)} or all)")
    return dict(_LOWERING_FLAGS[n] for n in names)


def _input_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """--input-shape NAME=D0,D1,... (argparse type), as onnxsim's --overwrite-input-shape."""
    name, sep, dims = text.rpartition("=")
    parts = dims.split(",")
    values = tuple(int(d) for d in parts) if all(d.strip().lstrip("+-").isdigit() for d in parts) else ()
    if not sep or not name or not values or any(d <= 0 for d in values):
        raise argparse.ArgumentTypeError(f"{text!r}: use NAME=D0,D1,... with positive dims, "
                                         f"e.g. input=1,3,224,224")
    return name, values


def _positive(kind):
    """An argparse type: a positive int or float (`kind`), else a one-line usage error."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not value > 0:
            raise argparse.ArgumentTypeError(f"{text!r} is not a positive {kind.__name__}")
        return value

    parse.__name__ = kind.__name__
    return parse


def _shapes_for(source, args, strict: bool) -> dict | None:
    """The --input-shape values for one model; `strict` False (zoo) keeps only those
    naming the model's inputs, so one flag can serve a zoo of different models."""
    shapes = dict(args.input_shape or [])
    if strict or not shapes:
        return shapes or None
    import onnx

    proto = source if isinstance(source, onnx.ModelProto) else onnx.load(str(source), load_external_data=False)
    names = {vi.name for vi in proto.graph.input}
    return {k: v for k, v in shapes.items() if k in names} or None


def optimize_keywords(args, optimize) -> dict:
    """The keywords for `optimize` that the flags give (model, inputs and progress aside):
    --rules names and --rule-file paths (pathlib.Path: never read as names) as `rules`,
    and each limit only when its flag was given. ApsatError when this optimize() does not
    take a limit the user gave."""
    rules = list(args.rules or []) + [Path(p) for p in args.rule_file or []]
    kw = {"target": args.target, "rules": rules or None, "extractor": args.extractor,
          "verify": args.verify, "seed": args.seed, "regions": args.regions, "lowering": args.lowering,
          "representatives": {k: v[0] if len(v) == 1 else v for k, v in args.representative or []} or None}
    given = LIMIT_KEYWORDS + PRECISION_KEYWORDS
    kw.update({k: getattr(args, k) for k in given if getattr(args, k, None) is not None})
    takes = inspect.signature(optimize).parameters
    missing = [k for k in LIMIT_KEYWORDS if k in kw and k not in takes]
    if missing:
        flags = ", ".join("--no-check-rules" if k == "check_rules" else "--" + k.replace("_", "-") for k in missing)
        raise ApsatError(f"{flags}: this apsat's optimize() does not take {', '.join(missing)} yet")
    return kw


def _optimize_one(source, name: str, args, progress, task, randomize=False) -> dict:
    """Optimise one model, write its files, return the report as written (with the
    backend's compile figures; `error` instead on bad input, and `internal` too on an
    internal error: internal_failure's record, the traceback in the model's directory).
    `randomize`: replace the weights with seeded random ones first (the light zoo)."""
    from apsat.pipeline.internal import TRACEBACK_FILE, PhaseTracker, internal_failure
    from apsat.pipeline.optimize import optimize

    out_dir = Path(args.out) / name
    # "prepare" (as a zoo row's): reading and randomising the model, until optimize tells its own
    phases = PhaseTracker(lambda phase: progress.update(task, description=f"{name}: {phase}"), "prepare")
    try:
        kw = optimize_keywords(args, optimize)
        if randomize:  # loaded here, one model at a time: VGG-19's weights alone are 548 MiB
            import onnx

            from apsat.pipeline.zoo import randomize_weights

            source = randomize_weights(onnx.load(str(source)), seed=args.seed)
        res = optimize(source, input_shapes=_shapes_for(source, args, args.command == "optimize"),
                       inputs=getattr(args, "inputs", None), **kw, progress=phases)
        res.report["model"] = name
        for notice in res.report.get("notices", []):
            progress.console.print(f"apsat: {name}: note: {notice}", markup=False, highlight=False, soft_wrap=True)
        phases("write")
        try:
            path = res.write(out_dir, compile_kernels=args.compile_kernels,
                             onnx_out=getattr(args, "onnx_out", None) or False)
        except OSError as exc:
            raise ApsatError(f"cannot write {out_dir}: {exc.strerror or exc}") from None
        (out_dir / TRACEBACK_FILE).unlink(missing_ok=True)     # an earlier run's, now stale
        return json.loads(path.read_text())
    except VerificationError as exc:      # a lower precision past its bound: refused (exit 1)
        return {"model": name, "error": str(exc), "refused": True}
    except ApsatError as exc:
        return {"model": name, "error": str(exc)}
    except BaseException as exc:
        if not is_internal(exc):
            raise
        failure = internal_failure(exc, phases.phase, out_dir)
        return {"model": name, "error": failure.pop("error"), "internal": failure}


def _run_models(items: list[tuple[object, str]], args, randomize=False) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    reports = []
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=_console(), transient=False) as progress:
        task = progress.add_task("models", total=len(items))
        for source, name in items:
            reports.append(_optimize_one(source, name, args, progress, task, randomize))
            progress.advance(task)
    args.phase = "report"
    out = Console(width=None if sys.stdout.isatty() else 120)  # pipes get the full table
    out.print(summary_table(reports))
    for r in reports:  # plain, unwrapped: one line per failed model
        if "error" in r:        # an internal error's line names no model, as main's: optimize has one
            print(f"apsat: {r['error']}" if "internal" in r else f"apsat: {r['model']}: {r['error']}", file=sys.stderr)
        elif compile_failures(r):
            print(f"apsat: {r['model']}: backend: {compile_failures(r)}", file=sys.stderr)
    out.print(f"reports written under {args.out}/")
    if any("internal" in r for r in reports):
        return EXIT_INTERNAL_ERROR
    if any("error" in r and not r.get("refused") for r in reports):
        return EXIT_BAD_INPUT
    if any(failed(r) or r.get("refused") for r in reports):
        return EXIT_VERIFY_FAILED
    if any(compile_failures(r) for r in reports):
        return EXIT_BACKEND_FAILED
    return EXIT_OK


def cmd_optimize(args) -> int:
    """Optimise one model (`--inputs` verifies on the user's arrays)."""
    if args.inputs is not None and not args.verify:
        raise ApsatError("--inputs gives arrays to verify on: drop --no-verify")
    path = Path(args.model)
    return _run_models([(path, path.stem)], args)


def cmd_zoo(args) -> int:
    """Optimise a set of models as a batch (apsat.cli.zoo); the light zoo's weights are all
    0.02, so it gets seeded random weights first (else verification compares constants)."""
    from apsat.cli.zoo import report_zoo, run_zoo, zoo_tasks

    tasks = zoo_tasks(args, optimize_keywords, _shapes_for)
    console, start = _console(), time.perf_counter()
    args.phase = "batch"       # a model's own internal error is its row; this names the rest
    rows = run_zoo(args, tasks, console)
    args.phase = "report"
    return report_zoo(rows, args, console, time.perf_counter() - start)


def cmd_extract(args) -> int:
    """Extract from an extraction-gym e-graph file; prints one line, or one JSON object."""
    from apsat.extract import run_extractor
    from apsat.extract.check import check_extraction, check_roots, dag_cost
    from apsat.extract.graph import ExtractionGraph

    path = Path(args.egraph)
    if not path.is_file():
        raise ApsatError(f"{path}: no such file")
    args.phase = "import"     # phase names as optimize's, for an internal error's line
    try:
        graph = ExtractionGraph.from_json(json.loads(path.read_text()))
    except (ValueError, KeyError, TypeError) as exc:
        why = str(exc) if isinstance(exc, ApsatError) else f"{exc.__class__.__name__}: {exc}"
        raise ApsatError(f"{path}: not an extraction-gym e-graph ({why})") from None
    if not graph.roots:
        raise ApsatError(f'{path}: no root e-class ("root_eclasses" is missing or empty): nothing to extract')
    start, args.phase = time.perf_counter(), "extract"
    choice = run_extractor(args.method, graph, graph.roots, None, args.time_limit)
    seconds, args.phase = time.perf_counter() - start, "verify"
    try:
        check_roots(graph, choice, graph.roots)
        check_extraction(graph, choice, graph.roots)
    except ApsatError as exc:
        raise ApsatError(f"{path}: {exc}") from None
    # optimal/gap come from extractors that prove them (ilp); the others claim nothing.
    result = {"method": args.method, "dag_cost": dag_cost(graph, choice, graph.roots),
              "seconds": seconds, "optimal": bool(getattr(choice, "optimal", False)),
              "gap": getattr(choice, "gap", None)}
    extra, args.phase = "", "report"
    if hasattr(choice, "optimal"):
        extra = ", proven optimal" if result["optimal"] else (
            f", gap {result['gap']:.2%}" if result["gap"] is not None else ", no bound")
    print(json.dumps(result) if args.json else
          f"{args.method}: DAG cost {result['dag_cost']:.6g} in {seconds:.3f} s{extra}")
    return EXIT_OK


def common_options(p) -> None:
    """The options `optimize` and `zoo` share, spelt the same on both."""
    from apsat.extract import EXTRACTORS

    p.add_argument("--target", default="gpu", help="gpu | systolic | systolic:RxC | ACCELERATOR.toml (default gpu)")
    p.add_argument("--out", default="apsat-out", help="output directory (default apsat-out/)")
    p.add_argument("--rules", nargs="*", default=[], metavar="NAME",
                   help="built-in or --rule-file ruleset names, as one phase (default: the target's plan); "
                        "an entry starting ./ or / or ending .egg is read as a rule file")
    p.add_argument("--rule-file", action="append", default=[], metavar="PATH",
                   help="a rule file or directory of .egg files whose rulesets run (repeatable)")
    p.add_argument("--extractor", default="greedy-dag", choices=sorted(EXTRACTORS))
    p.add_argument("--seed", type=int, default=0, help="seed for random inputs/weights")
    p.add_argument("--lowering", type=_lowering, default=None, metavar="LIST",
                   help="systolic targets: comma-separated lowering options: gather (im2col "
                        "windows gathered by the DMA), fold (transposes and pads as address "
                        "patterns, concatenations built in place), zips (an element-wise op over a fused GEMM in its epilogue), "
                        "or all; default: follow the cost model")
    p.add_argument("--regions", action=argparse.BooleanOptionalAction, default=None,
                   help="saturate region by region, identical regions once (default: for "
                        "programs of more than 10,000 terms whose regions mostly repeat)")
    p.add_argument("--input-shape", type=_input_shape, action="append", metavar="NAME=D0,D1,...",
                   help="fix an input's dims (repeatable), as onnxsim's --overwrite-input-shape")
    p.add_argument("--representative", type=_input_shape, action="append", metavar="SYMBOL=V",
                   help="build a symbolic dim at V (repeatable); the export keeps it symbolic")
    p.add_argument("--no-verify", dest="verify", action="store_false",
                   help="skip the comparison with onnxruntime (default: verify; exit 1 on a mismatch)")
    p.add_argument("--compile", dest="compile_kernels", action=argparse.BooleanOptionalAction, default=False,
                   help="gpu: compile every kernel with nvcc and Triton AOT (default off: about a "
                        "second a kernel, and needs nvcc; exit 3 when one fails)")
    p.add_argument("--iter-limit", type=_positive(int), metavar="N", help="saturation: iterations per phase")
    p.add_argument("--node-limit", type=_positive(int), metavar="N", help="saturation: e-nodes per phase")
    p.add_argument("--time-limit", type=_positive(float), metavar="SECONDS", help="saturation: seconds per phase")
    p.add_argument("--memory-limit", type=_positive(int), metavar="MIB",
                   help="saturation: cap on the process's resident memory, MiB")
    p.add_argument("--no-check-rules", dest="check_rules", action="store_const", const=False, default=None,
                   help="skip checking the --rule-file rules on the model after saturating")
    p.add_argument("--precision", choices=("fp32", "fp16", "bf16", "mixed"), default=None,
                   help="let the rules compute a float32 model in a half type (gpu target; default fp32)")
    p.add_argument("--max-error", type=_positive(float), metavar="E",
                   help="with --precision: refuse (exit 1) a result whose error against the float32 "
                        "original passes E of the output's scale (default: 8 ulps of the type)")


def build_parser() -> argparse.ArgumentParser:
    """The `apsat` argument parser: one sub-parser a command, `func` set to run it."""
    from apsat.extract import EXTRACTORS

    parser = argparse.ArgumentParser(prog="apsat", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("optimize", help="optimise one ONNX model and verify it")
    p.add_argument("model")
    common_options(p)
    p.add_argument("--inputs", metavar="FILE.npz",
                   help="verify on these inputs (one array per model input) instead of seeded random ones")
    p.add_argument("--onnx-out", metavar="PATH",
                   help="also write the optimised program as an ONNX model (onnxruntime runs its com.microsoft ops)")
    p.set_defaults(func=cmd_optimize)
    p = sub.add_parser("zoo", help="optimise a set of models (default: the onnx light zoo) and verify each")
    p.add_argument("models", nargs="*", help="models or directories (default: the light zoo in onnx)")
    common_options(p)
    zoo_options(p)
    p.set_defaults(func=cmd_zoo)
    p = sub.add_parser("extract", help="extract from an extraction-gym JSON e-graph")
    p.add_argument("egraph")
    p.add_argument("--method", default="greedy-dag", choices=sorted(EXTRACTORS))
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--time-limit", type=_positive(float), default=10.0, metavar="S",
                   help="seconds for extractors that search (ilp; default 10)")
    p.set_defaults(func=cmd_extract)
    p = sub.add_parser("rules", help="list rulesets and rules, check rule files, or ask why a rule (did not) fire")
    rules_options(p)
    p.set_defaults(func=cmd_rules)
    p = sub.add_parser("explain", help="print the rules that built each fused atom of an optimised model")
    explain_options(p)
    p.set_defaults(func=cmd_explain)
    parser.set_defaults(phase="setup")   # commands move it on; main names it on an internal error
    return parser


def _quiet_stdout() -> None:
    """Point stdout at /dev/null: the reader has gone, and the interpreter's last flush
    must not fail again (Python's documented answer to SIGPIPE)."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    except (OSError, ValueError):  # no real descriptor (captured in tests)
        pass


def main(argv=None) -> int:
    """Run `apsat ARGV`; returns the exit status (module doc). Never a traceback on the
    terminal, an internal error's included (it goes to a file: `_internal_error`)."""
    args = build_parser().parse_args(argv)
    try:
        status = args.func(args)
        sys.stdout.flush()  # a reader that closed the pipe is found here, not at exit
        return status
    except ApsatError as exc:
        print(f"apsat: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        print("apsat: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BaseException as exc:
        if not is_internal(exc):
            raise
        return _internal_error(args, exc)


def _internal_error(args, exc: BaseException) -> int:
    """An internal error outside a model's own work: one line naming args.phase, the
    traceback in --out (optimize, zoo) or the user log directory (apsat.pipeline.internal)."""
    from apsat.pipeline.internal import internal_failure

    failure = internal_failure(exc, args.phase, getattr(args, "out", None))
    print(f"apsat: {failure['error']}", file=sys.stderr)
    return EXIT_INTERNAL_ERROR
