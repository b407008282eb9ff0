"""Command line: `apsat optimize`, `apsat zoo`, `apsat extract`, `apsat rules`.

Every command prints a one-line error (never a traceback) for bad input and exits non-zero;
optimize and zoo also exit non-zero when verification fails.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from apsat.errors import ApsatError

EXIT_BAD_INPUT, EXIT_VERIFY_FAILED = 2, 1


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
    try:
        values = tuple(int(d) for d in dims.split(","))
    except ValueError:
        values = ()
    if not sep or not name or not values or any(d <= 0 for d in values):
        raise argparse.ArgumentTypeError(f"{text!r}: use NAME=D0,D1,... with positive dims, "
                                         f"e.g. input=1,3,224,224")
    return name, values


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


def _optimize_one(source, name: str, args, progress, task, randomize=False) -> dict:
    """Optimise one model, write its report, return the report (with `error` on failure).
    `randomize`: replace the weights with seeded random ones first (the light zoo)."""
    from apsat.pipeline.optimize import optimize

    out_dir = Path(args.out) / name
    try:
        if randomize:  # loaded here, one model at a time: VGG-19's weights alone are 548 MiB
            import onnx

            from apsat.pipeline.zoo import randomize_weights

            source = randomize_weights(onnx.load(str(source)), seed=args.seed)
        res = optimize(source, target=args.target, rules=args.rules or None,
                       extractor=args.extractor, verify=args.verify, regions=args.regions,
                       lowering=args.lowering, input_shapes=_shapes_for(source, args, args.command == "optimize"),
                       inputs=getattr(args, "inputs", None),
                       progress=lambda phase: progress.update(task, description=f"{name}: {phase}"))
        res.report["model"] = name
        for notice in res.report.get("notices", []):
            progress.console.print(f"apsat: {name}: note: {notice}", markup=False, highlight=False, soft_wrap=True)
        res.write(out_dir, compile_kernels=args.compile_kernels)
        return res.report
    except ApsatError as exc:
        return {"model": name, "error": str(exc)}


def _failed(report: dict) -> bool:
    """Verification against onnxruntime failed: the reference interpreter's, or the target
    backend's run (the systolic simulator's "simulation", GPU kernels' "run")."""
    v = report.get("verification")
    runs = [section.get(key) for section in (report.get("systolic"), report.get("gpu_kernels"))
            if isinstance(section, dict) for key in ("simulation", "run")]
    return bool((v and not v["ok"]) or any(r and r.get("ok") is False for r in runs))


def _speedup(report: dict) -> str:
    """The modelled speed-up (cost before / after, on the target's cost model), as text."""
    value = report["extraction"].get("modelled_speedup")
    return "" if value is None else f"{value:.2f}x"


def _summary_table(reports: list[dict]):
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
            "[red]FAIL[/red]" if _failed(r) else "[green]ok[/green]")
        table.add_row(r["model"], str(sum(r["ops_before"].values())), str(sum(r["ops_after"].values())),
                      str(r["egraph"]["nodes"]), _speedup(r), f"{sum(r['seconds'].values()):.1f}", status,
                      "" if v is None else f"{v['max_abs_err']:.1e}")
    return table


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
    out = Console(width=None if sys.stdout.isatty() else 120)  # pipes get the full table
    out.print(_summary_table(reports))
    for r in reports:
        if "error" in r:  # plain, unwrapped: one line per failed model
            print(f"apsat: {r['model']}: {r['error']}", file=sys.stderr)
    out.print(f"reports written under {args.out}/")
    if any("error" in r for r in reports):
        return EXIT_BAD_INPUT
    if any(_failed(r) for r in reports):
        return EXIT_VERIFY_FAILED
    return 0


def cmd_optimize(args) -> int:
    path = Path(args.model)
    args.verify = args.verify or args.inputs is not None     # inputs given are to verify on
    return _run_models([(path, path.stem)], args)


def cmd_zoo(args) -> int:
    """Optimise models; the light zoo's weights are all 0.02, so they get seeded random
    weights first (otherwise verification would compare constants)."""
    from apsat.pipeline.zoo import light_model_paths

    paths: list[Path] = []
    for item in args.models or []:
        p = Path(item)
        paths.extend(sorted(p.glob("*.onnx")) if p.is_dir() else [p])
    light = not args.models
    if light:
        paths = light_model_paths()
    items = [(p, p.stem.replace("light_", "") if light else p.stem) for p in paths]
    return _run_models(items, args, randomize=light)


def cmd_extract(args) -> int:
    from apsat.extract import run_extractor
    from apsat.extract.check import check_extraction, dag_cost
    from apsat.extract.graph import ExtractionGraph

    path = Path(args.egraph)
    if not path.exists():
        raise ApsatError(f"{path}: no such file")
    try:
        graph = ExtractionGraph.from_json(json.loads(path.read_text()))
    except (ValueError, KeyError, TypeError) as exc:
        raise ApsatError(f"{path}: not an extraction-gym e-graph ({exc.__class__.__name__}: {exc})") from None
    start = time.perf_counter()
    choice = run_extractor(args.method, graph, graph.roots, None, args.time_limit)
    seconds = time.perf_counter() - start
    check_extraction(graph, choice, graph.roots)
    # optimal/gap come from extractors that prove them (ilp); the others claim nothing.
    result = {"method": args.method, "dag_cost": dag_cost(graph, choice, graph.roots),
              "seconds": seconds, "optimal": bool(getattr(choice, "optimal", False)),
              "gap": getattr(choice, "gap", None)}
    extra = ""
    if hasattr(choice, "optimal"):
        extra = ", proven optimal" if result["optimal"] else (
            f", gap {result['gap']:.2%}" if result["gap"] is not None else ", no bound")
    print(json.dumps(result) if args.json else
          f"{args.method}: DAG cost {result['dag_cost']:.6g} in {seconds:.3f} s{extra}")
    return 0


def cmd_rules(args) -> int:
    """`rules list`: every ruleset and rule with its file and line; `rules check PATH`:
    validate rule files without running a model."""
    from apsat.rules.library import RuleLibrary

    if args.action == "check":
        if not args.paths:
            raise ApsatError("rules check: give one or more rule files or directories")
        lib = RuleLibrary(args.paths)
        names = lib.resolve(args.paths)
        checked = set(_rule_paths(args.paths))
        count = sum(len(rf.rules) for rf in lib.files if rf.path in checked)
        print(f"ok: {count} rules in ruleset(s) {', '.join(names) or '-'}")
        return 0
    lib = RuleLibrary(args.paths)
    for name in sorted(lib.rulesets):
        where = lib.defined_in.get(name, "")
        print(f"{name}  ({where})")
        for rule in lib.rulesets[name]:
            print(f"  {rule.name}  {rule.path}:{rule.line}")
    return 0


def _rule_paths(items) -> list[Path]:
    out = []
    for item in items:
        p = Path(item).resolve()
        out.extend(sorted(p.glob("*.egg")) if p.is_dir() else [p])
    return out


def build_parser() -> argparse.ArgumentParser:
    from apsat.extract import EXTRACTORS

    parser = argparse.ArgumentParser(prog="apsat", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p):
        p.add_argument("--target", default="gpu", help="gpu | systolic | systolic:RxC | ACCELERATOR.toml (default gpu)")
        p.add_argument("--out", default="apsat-out", help="output directory (default apsat-out/)")
        p.add_argument("--rules", nargs="*", default=[], help="ruleset names or rule files/directories")
        p.add_argument("--extractor", default="greedy-dag", choices=sorted(EXTRACTORS))
        p.add_argument("--seed", type=int, default=0, help="seed for random inputs/weights")
        p.add_argument("--lowering", type=_lowering, default=None, metavar="LIST",
                       help="systolic targets: comma-separated lowering options: gather (im2col "
                            "windows gathered by the DMA), fold (transposes and pads as address "
                            "patterns, concatenations built in place), zips (an element-wise op over a fused GEMM in its epilogue), "
                            "or all; default: follow the cost model")
        p.add_argument("--regions", action="store_true",
                       help="saturate region by region, identical regions once")
        p.add_argument("--input-shape", type=_input_shape, action="append", metavar="NAME=D0,D1,...",
                       help="fix an input's dims (repeatable), as onnxsim's --overwrite-input-shape; "
                            "symbolic dims not fixed become 1, with a notice")

    p = sub.add_parser("optimize", help="optimise one ONNX model")
    p.add_argument("model")
    common(p)
    p.add_argument("--verify", action="store_true", help="compare with onnxruntime (exit 1 on mismatch)")
    p.add_argument("--inputs", metavar="FILE.npz",
                   help="with --verify: run on these inputs (one array per model input) instead of "
                        "seeded random ones")
    p.add_argument("--no-compile", dest="compile_kernels", action="store_false",
                   help="gpu: write kernel sources without compiling them (nvcc, triton AOT)")
    p.set_defaults(func=cmd_optimize, compile_kernels=True)

    p = sub.add_parser("zoo", help="optimise a set of models (default: the onnx light zoo) and verify each")
    p.add_argument("models", nargs="*", help="models or directories (default: the light zoo in onnx)")
    common(p)
    p.add_argument("--no-verify", dest="verify", action="store_false")
    p.add_argument("--compile", dest="compile_kernels", action="store_true",
                   help="gpu: also compile every kernel (about a second each with nvcc)")
    p.set_defaults(func=cmd_zoo, verify=True, compile_kernels=False)

    p = sub.add_parser("extract", help="extract from an extraction-gym JSON e-graph")
    p.add_argument("egraph")
    p.add_argument("--method", default="greedy-dag", choices=sorted(EXTRACTORS))
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--time-limit", type=float, default=10.0, metavar="S",
                   help="seconds for extractors that search (ilp; default 10)")
    p.set_defaults(func=cmd_extract)
    p = sub.add_parser("rules", help="list rulesets and rules, or check rule files")
    p.add_argument("action", choices=["list", "check"])
    p.add_argument("paths", nargs="*", help="rule files or directories (check: required; list: extra files)")
    p.set_defaults(func=cmd_rules)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ApsatError as exc:
        print(f"apsat: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("apsat: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
