"""Fuzz the CLI with malformed ONNX models and rule files; every run must end cleanly.

Usage: python benchmarks/fuzz.py [--models N] [--rules N] [--jobs J] [--seed S]
                                 [--sample K] [--only FAMILY] [--keep DIR] [--list]

Generates N malformed models (benchmarks/fuzz_models.py, default 500) and N malformed rule
files (benchmarks/fuzz_rules.py, default 200), families taken in turn, case k with seed
S + k. Each model runs as `python -m apsat.cli optimize MODEL --out TMP --target gpu`
(plus `--no-compile`, and `--verify` where verification is not already the default: the
flags are read from `optimize --help`); each rule file as `rules check FILE`, and a
seeded quarter of them (all of the rhs-shape family) also as `optimize SMALL --rule-file
FILE` (`--rules ./FILE` where there is no --rule-file). Every run gets a 60 s wall limit
and a 4 GiB address-space limit (RLIMIT_AS, set in preexec_fn) and is classified:

    refused    exit 2, exactly one line of error on stderr, starting `apsat:`
    accepted   exit 0 (the case was valid after all), or 1 (a verification mismatch) with
               at most one `apsat:` line
    crashed    a traceback, a signal, egglog panic text, any other exit status, more than
               one line of error (or any stray line on stderr, a warning included)
    hung       past the wall limit (the process group is killed)
    memory     an allocation failed (MemoryError, Rust's or C++'s allocation failure), or
               a signal with the peak resident memory past 3 GiB

The progress bar's last line and `apsat: MODEL: note:` lines on stderr are not errors.
Prints a table of cases per family and outcome (a case's outcome is its worst run's), then
every case that did not end cleanly with its seed and first line of error. `--seed N
--only FAMILY` reproduces one: with --only every case is of that family, case k with
seed N + k, and --models/--rules default to 1. --list prints every case's runs.
"""
from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fuzz_models import MODEL_FAMILIES, base_model, model_case  # noqa: E402
from fuzz_rules import RHS_FAMILIES, RULE_FAMILIES, rule_case  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUTCOMES = ("refused", "accepted", "crashed", "hung", "memory")
CLEAN = ("refused", "accepted")
WALL_S, MEMORY_BYTES = 60.0, 4 << 30
OPTIMIZE_SHARE = 0.25                   # rule files also run through optimize
_PROGRESS = re.compile(r"[━╸╺╾╼─]+ *\d+/\d+ +\d+:\d\d:\d\d\s*$")
_NOTE = re.compile(r"^apsat: [^:]+: note: ")
_MEMORY = ("MemoryError", "Unable to allocate", "memory allocation of", "bad_alloc",
           "Cannot allocate memory", "out of memory")
_PANIC = ("panicked at", "thread 'main'", "RUST_BACKTRACE", "Fatal Python error", "Segmentation fault")


@dataclass(frozen=True)
class Case:
    """One generated input: `kind` "model" or "rules", its generator `family`, its `seed`."""

    kind: str
    family: str
    seed: int

    def data(self) -> bytes:
        """The case's file contents (generated afresh: a few KB, or up to 50 MB)."""
        return (model_case if self.kind == "model" else rule_case)(self.family, self.seed)

    def runs_optimize(self) -> bool:
        """Rule files: whether this one also runs through optimize (seeded)."""
        return self.family in RHS_FAMILIES or \
            random.Random(f"optimize:{self.family}:{self.seed}").random() < OPTIMIZE_SHARE


@dataclass
class Result:
    """The runs of one case: `outcome` (the worst), and per run (command, outcome, first line)."""

    case: Case
    outcome: str = "refused"
    runs: list = field(default_factory=list)
    seconds: float = 0.0


def make_cases(models: int, rules: int, seed: int, only: str | None = None) -> list[Case]:
    """`models` model cases and `rules` rule-file cases, families in turn, case k with
    seed `seed` + k; with `only`, every case of that family."""
    out = []
    for kind, count, families in (("model", models, MODEL_FAMILIES), ("rules", rules, RULE_FAMILIES)):
        names = [only] if only else sorted(families)
        if only and only not in families:
            continue
        out += [Case(kind, names[k % len(names)], seed + k) for k in range(count)]
    return out


def sample_cases(cases: list[Case], k: int, seed: int) -> list[Case]:
    """A seeded sample of `k` cases, in their original order."""
    if k >= len(cases):
        return list(cases)
    keep = set(random.Random(f"sample:{seed}").sample(range(len(cases)), k))
    return [c for i, c in enumerate(cases) if i in keep]


# ---- one run ------------------------------------------------------------------------------

def _limits():                   # runs in the child, before exec
    resource = __import__("resource")
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def run_limited(argv: list[str], cwd: Path, wall_s: float = WALL_S) -> tuple[int | None, str, int]:
    """Run `argv` in `cwd` in its own session under the wall and memory limits: (exit
    status, negative for a signal, or None when it ran past `wall_s` and was killed; its
    stderr; its peak resident memory in bytes)."""
    env = dict(os.environ, COLUMNS="200", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    deadline = time.monotonic() + wall_s
    with open(cwd / "stdout.txt", "wb") as out, open(cwd / "stderr.txt", "wb") as err:
        proc = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                env=env, preexec_fn=_limits, start_new_session=True)
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        while pid == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        timed_out = pid == 0
        if timed_out:
            os.killpg(proc.pid, signal.SIGKILL)
            pid, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)       # reaped here, not by Popen
    rc = None if timed_out else proc.returncode
    return rc, (cwd / "stderr.txt").read_text(errors="replace"), usage.ru_maxrss * 1024


def _error_lines(stderr: str) -> list[str]:
    """stderr without the progress bar's lines and notices."""
    return [ln for ln in stderr.splitlines()
            if ln.strip() and not _PROGRESS.search(ln) and not _NOTE.match(ln)]


def _exception_line(stderr: str) -> str:
    """The exception's own line of a traceback (the last `Name: message` line)."""
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.match(r"^[\w.]+(Error|Exception|Exit|Interrupt)\b", ln):
            return ln
    return lines[-1] if lines else ""


def _signal_name(rc: int) -> str:
    try:
        return f"signal {signal.Signals(-rc).name}" if rc < 0 else f"exit status {rc}"
    except ValueError:
        return f"signal {-rc}"


def classify(rc: int | None, stderr: str, peak: int = 0) -> tuple[str, str]:
    """(outcome, first line of its error) for one run: see the module doc. `peak`: its
    peak resident memory; a signal near the memory limit is an allocation failure."""
    lines = _error_lines(stderr)
    first = lines[0] if lines else ""
    if rc is None:
        return "hung", f"killed after {WALL_S:.0f} s"
    near_limit = rc < 0 and peak > 0.75 * MEMORY_BYTES
    if any(m in stderr for m in _MEMORY) or rc == -signal.SIGKILL or near_limit:
        hit = next((ln for ln in lines if any(m in ln for m in _MEMORY)), first)
        return "memory", hit or f"{_signal_name(rc)} at {peak / 2 ** 30:.1f} GiB resident"
    if "Traceback" in stderr:
        return "crashed", _exception_line(stderr)
    panic = next((ln for ln in lines if any(p in ln for p in _PANIC)), None)
    if panic:
        return "crashed", panic
    if rc < 0:
        return "crashed", _signal_name(rc) + (f": {first}" if first else "")
    if rc == 0 and not lines:
        return "accepted", ""
    if rc == 1 and len(lines) <= 1 and all(ln.startswith("apsat:") for ln in lines):
        return "accepted", first
    if rc == 2 and len(lines) == 1 and first.startswith("apsat:"):
        return "refused", first
    if rc in (0, 1, 2):
        why = f"{len(lines)} lines of error" if len(lines) > 1 else "not an `apsat:` line"
        return "crashed", f"exit {rc}, {why}: {first}"
    return "crashed", f"exit status {rc}: {first}"


def optimize_flags() -> dict[str, list[str]]:
    """The optimize flags, read from `optimize --help`: "model" (besides --out: the gpu
    target, no compiling, and verification, asked for only where it is not the default)
    and "rules" (how a rule file FILE in the working directory is passed)."""
    text = subprocess.run([sys.executable, "-m", "apsat.cli", "optimize", "--help"], cwd=ROOT,
                          capture_output=True, text=True).stdout
    flags = ["--target", "gpu"]
    flags += ["--no-compile"] if "--no-compile" in text else []
    flags += ["--verify"] if "--verify" in text and "--no-verify" not in text else []
    rules = ["--rule-file", "FILE"] if "--rule-file" in text else ["--rules", "./FILE"]
    return {"model": flags, "rules": rules}


def run_case(case: Case, flags: dict, wall_s: float = WALL_S, keep: Path | None = None) -> Result:
    """Generate `case` in a scratch directory, run its command(s) there, classify each."""
    order = {o: i for i, o in enumerate(("refused", "accepted", "hung", "memory", "crashed"))}
    result = Result(case)
    start = time.monotonic()
    cli = [sys.executable, "-m", "apsat.cli"]
    with tempfile.TemporaryDirectory(prefix=f"fuzz-{case.family}-") as tmp:
        work = Path(tmp)
        name = "case.onnx" if case.kind == "model" else "case.egg"
        (work / name).write_bytes(case.data())
        if case.kind == "model":
            commands = [("optimize", cli + ["optimize", name, "--out", "out"] + flags["model"])]
        else:
            commands = [("rules check", cli + ["rules", "check", name])]
            if case.runs_optimize():
                (work / "small.onnx").write_bytes(base_model(random.Random(0), "conv-relu").SerializeToString())
                rule_args = [a.replace("FILE", name) for a in flags["rules"]]
                commands.append(("optimize " + rule_args[0],
                                 cli + ["optimize", "small.onnx", "--out", "out"] + flags["model"] + rule_args))
        for label, argv in commands:
            rc, stderr, peak = run_limited(argv, work, wall_s)
            outcome, line = classify(rc, stderr, peak)
            result.runs.append((label, outcome, line))
            if order[outcome] > order[result.outcome] or len(result.runs) == 1:
                result.outcome = outcome
        if keep is not None and result.outcome not in CLEAN:
            keep.mkdir(parents=True, exist_ok=True)
            shutil.copy(work / name, keep / f"{case.family}-{case.seed}{Path(name).suffix}")
    result.seconds = time.monotonic() - start
    return result


# ---- the whole run ------------------------------------------------------------------------

def run_all(cases: list[Case], jobs: int = 2, wall_s: float = WALL_S, keep: Path | None = None,
            progress=None) -> list[Result]:
    """Every case, `jobs` at a time; results in the cases' order."""
    flags = optimize_flags()
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(run_case, c, flags, wall_s, keep) for c in cases]
        results = []
        try:
            for i, f in enumerate(futures):
                results.append(f.result())
                if progress:
                    progress(i + 1, len(cases), results[-1])
        except BaseException:          # a generator's own bug, or ^C: stop, do not run the rest
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    return results


def table(results: list[Result]) -> str:
    """Cases per family (models, then rule files) and outcome, with totals."""
    rows = {}
    for r in results:
        key = (r.case.kind, r.case.family)
        rows.setdefault(key, {o: 0 for o in OUTCOMES})[r.outcome] += 1
    head = f"{'kind':<6} {'family':<14} {'cases':>6}" + "".join(f" {o:>9}" for o in OUTCOMES)
    lines = [head, "-" * len(head)]
    for (kind, family), counts in sorted(rows.items()):
        cells = "".join(f" {counts[o]:>9}" for o in OUTCOMES)
        lines.append(f"{kind:<6} {family:<14} {sum(counts.values()):>6}{cells}")
    total = {o: sum(c[o] for c in rows.values()) for o in OUTCOMES}
    lines += ["-" * len(head),
              f"{'all':<6} {'':<14} {len(results):>6}" + "".join(f" {total[o]:>9}" for o in OUTCOMES)]
    return "\n".join(lines)


def failures(results: list[Result]) -> list[str]:
    """One line per case that did not end cleanly: how to reproduce it, and its error."""
    out = []
    for r in results:
        if r.outcome in CLEAN:
            continue
        label, outcome, line = next(run for run in r.runs if run[1] == r.outcome)
        flag = "--models" if r.case.kind == "model" else "--rules"
        out.append(f"{outcome:<8} --seed {r.case.seed} --only {r.case.family} {flag} 1  [{label}] {line[:200]}")
    return out


def main(argv=None) -> int:
    """The command line (see the module doc); exit status 1 when a case did not end cleanly."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", type=int, default=None, help="malformed models (default 500; 1 with --only)")
    p.add_argument("--rules", type=int, default=None, help="malformed rule files (default 200; 1 with --only)")
    p.add_argument("--jobs", type=int, default=2, help="runs at a time (default 2)")
    p.add_argument("--seed", type=int, default=0, help="seed of the first case (case k: seed + k)")
    p.add_argument("--sample", type=int, default=None, metavar="K", help="run a seeded sample of K cases")
    p.add_argument("--only", choices=sorted(MODEL_FAMILIES) + sorted(RULE_FAMILIES), help="one family")
    p.add_argument("--list", action="store_true", help="print every case's outcome and first line")
    p.add_argument("--keep", type=Path, default=None, metavar="DIR", help="copy non-clean cases' files here")
    args = p.parse_args(argv)
    default = 1 if args.only else None
    models = args.models if args.models is not None else (default or 500)
    rules = args.rules if args.rules is not None else (default or 200)
    cases = make_cases(models, rules, args.seed, args.only)
    if args.sample is not None:
        cases = sample_cases(cases, args.sample, args.seed)
    start = time.monotonic()

    def progress(done, total, r):
        if r.outcome not in CLEAN or done % 50 == 0 or done == total:
            print(f"[{done}/{total}] {time.monotonic() - start:.0f} s  {r.case.kind} {r.case.family} "
                  f"seed {r.case.seed}: {r.outcome}", file=sys.stderr, flush=True)

    results = run_all(cases, args.jobs, keep=args.keep, progress=progress)
    runs = sum(len(r.runs) for r in results)
    print(table(results))
    print(f"{len(results)} cases, {runs} runs, {time.monotonic() - start:.0f} s wall, {args.jobs} jobs")
    if args.list:
        for r in results:
            runs = " | ".join(f"[{c}] {o}: {ln[:160]}" for c, o, ln in r.runs)
            print(f"  {r.case.kind} {r.case.family} {r.case.seed}: {runs}")
    bad = failures(results)
    print("\nnot clean:" if bad else "\nevery case ended cleanly")
    for line in bad:
        print("  " + line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
