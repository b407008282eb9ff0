"""Batch optimisation: one task per model, each in its own worker process, resumable.

`Task` says what to run (model file, target, rules, options, output directory);
`run_task` runs one in the current process (what a worker does: optimise, verify, write
the model's report directory atomically) and returns its summary row. `run_local` runs
tasks on a pool of worker processes: each model in a fresh process, with a time limit and a memory
limit watched from outside, so a crash, a hang or an out-of-memory becomes that model's
failure row (the signal, the limit, the last phase reached) and the others go on. Results
of finished models go to a ResultStore under their content key; a later run with the same
inputs reuses them. Ctrl-C stops the run and keeps every finished result.

Workers are fresh interpreters ("spawn"), so a script that calls `run_local` needs the
usual `if __name__ == "__main__":` guard.
"""
from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import queue as queue_mod
import shutil
import signal
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from apsat.frontend.external import data_files
from apsat.pipeline.outcome import compile_failures, failed
from apsat.pipeline.store import ResultStore, content_key, same_source, source_digest

DEFAULT_TIMEOUT_S = 600.0
DEFAULT_MAX_MEMORY_MIB = 8192
POLL_S = 0.05


@dataclass
class Task:
    """One model to optimise. `rules`: ruleset names (str) and rule files (pathlib.Path),
    as optimize() takes them; `options` are optimize()'s other keywords (verify, seed,
    extractor, input_shapes, limits ...); `randomize` gives the model seeded random
    weights first (the light zoo's are all 0.02)."""

    name: str
    path: str
    target: str = "gpu"
    rules: list = field(default_factory=list)
    options: dict = field(default_factory=dict)
    out: str = "apsat-out"
    randomize: bool = False
    compile_kernels: bool = False
    onnx_out: bool = False       # also write the program as optimized.onnx

    def key(self) -> str | None:
        """The content key of this task's result (see apsat.pipeline.store), None when the
        model file cannot be read: rule files
        (pathlib.Path entries, files or directories of .egg files) count by their text,
        ruleset names by name."""
        files = [p for r in self.rules if isinstance(r, Path)
                 for p in (sorted(r.glob("*.egg")) if r.is_dir() else [r])]
        texts = [p.read_text(errors="replace") if p.is_file() else f"<missing {p}>" for p in files]
        names = [str(r) for r in self.rules if not isinstance(r, Path)]
        options = {**self.options, "rules": names, "randomize": self.randomize,
                   "compile": self.compile_kernels, **({"onnx_out": True} if self.onnx_out else {})}
        try:
            data = Path(self.path).read_bytes()
        except OSError:
            return None            # no file to key: nothing stored, the worker says why
        return content_key(data + _data_digests(self.path), self.target, texts, options)


def _data_digests(path: str) -> bytes:
    """Each external-data file's name and SHA-256 (read in 16 MiB pieces: a 5 GB file is
    never in memory), so a result is keyed by the weights as well as the .onnx."""
    out = b""
    for file in data_files(path):
        h = hashlib.sha256()
        with open(file, "rb") as f:
            for piece in iter(lambda: f.read(1 << 24), b""):
                h.update(piece)
        out += file.name.encode() + h.digest()
    return out


def memory_limit_mib(task: Task, given: float | None) -> float:
    """A worker's resident-memory limit: `given`, else DEFAULT_MAX_MEMORY_MIB or, for a
    model whose files (the .onnx and its external data) are larger, 2 GiB plus three times
    their size (the 1.2B decoder of benchmarks/scale.py peaks at 1.81x its 4.9 GB)."""
    if given is not None:
        return given
    size = sum(_file_size(str(p)) for p in [Path(task.path), *data_files(task.path)])
    return max(DEFAULT_MAX_MEMORY_MIB, 2048 + 3 * size / 2**20)


def run_task(task: Task, tell=None) -> dict:
    """Optimise one model here; write its report directory (into a temporary directory
    renamed into place, so it is whole or absent); return its summary row: "status" ok,
    mismatch or error, with "error" and the report's figures, and "source_digest": the
    apsat source that computed it (the caller stores only results of its own: same_source).
    `tell(phase)` hears each phase as it starts. The row's "phase_seconds" are optimize's
    (report["seconds"]) with "prepare" (the source digest, imports, reading the model and
    randomising its weights) before and "write" (the report directory) after, so that they
    add up to its "seconds". An internal error (a bug in apsat: apsat.pipeline.internal) is
    status "internal error", "error" its one line and "internal" its phase, type, message
    and traceback path (traceback.txt in the model's directory)."""
    start = time.perf_counter()
    row = {"model": task.name, "path": task.path, "target": task.target, "source_digest": source_digest()}
    from apsat.errors import ApsatError, is_internal  # after the digest: these imports read the source it names
    from apsat.pipeline.internal import PhaseTracker, internal_failure
    from apsat.pipeline.optimize import optimize

    tell = PhaseTracker(tell, start="prepare")     # remembers the phase, for an internal error's row
    try:
        tell("prepare")
        source = task.path
        if task.randomize:
            import onnx

            from apsat.pipeline.zoo import randomize_weights

            source = randomize_weights(onnx.load(task.path), seed=task.options.get("seed", 0))
        prepared = time.perf_counter()
        res = optimize(source, target=task.target, rules=task.rules or None, progress=tell, **task.options)
        res.report["model"] = task.name
        tell("write")
        written = time.perf_counter()
        report = _write_whole(res, Path(task.out) / task.name, task.compile_kernels, task.onnx_out)
    except ApsatError as e:
        return {**row, "status": "error", "error": str(e), "seconds": time.perf_counter() - start}
    except BaseException as e:
        if not is_internal(e):
            raise
        # caught here rather than left to kill the worker: the row names the phase and the
        # exception, and the traceback goes to a file, not to the terminal
        failure = internal_failure(e, tell.phase, Path(task.out) / task.name)
        return {**row, "status": "internal error", "error": failure.pop("error"), "internal": failure,
                "seconds": time.perf_counter() - start}
    end = time.perf_counter()
    phases = {"prepare": prepared - start, **report.get("seconds", {}), "write": end - written}
    return {**row, **summary(report), "phase_seconds": phases, "seconds": end - start}


def _write_whole(res, final: Path, compile_kernels: bool, onnx_out: bool = False) -> dict:
    """res.write into a sibling temporary directory, then swap it in for `final`; returns
    the report as written (with the backend's compile figures). ApsatError when the
    directory cannot be written."""
    from apsat.errors import ApsatError

    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        for stale in final.parent.glob(f".{final.name}-*"):   # left by a killed run
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}-"))
    except OSError as e:
        raise ApsatError(f"cannot write {final}: {e.strerror or e}") from None
    try:
        report = json.loads(res.write(tmp, compile_kernels=compile_kernels, onnx_out=onnx_out).read_text())
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        return report
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def summary(report: dict) -> dict:
    """The figures a batch table shows, from a model's report as written."""
    v = report.get("verification") or {}
    gpu = report.get("gpu_kernels") or {}
    systolic = report.get("systolic") or {}
    return {"status": "mismatch" if failed(report) else "ok", "backend_error": compile_failures(report),
            "speedup": (report.get("extraction") or {}).get("modelled_speedup"),
            "kernels": (gpu.get("totals") or {}).get("kernels"),
            "cycles": (systolic.get("cycles") or {}).get("total_cycles"),
            "onnx_nodes": sum((report.get("ops_before") or {}).values()),
            "egraph_nodes": (report.get("egraph") or {}).get("nodes"),
            "phases": [{"phase": p.get("phase"), "nodes": p.get("nodes"), "seconds": p.get("seconds")}
                       for p in (report.get("saturation") or {}).get("phases", [])],
            "phase_seconds": report.get("seconds", {}),
            "max_abs_err": v.get("max_abs_err"), "err_ratio": v.get("ratio"),
            "opaque_ops": report.get("opaque_ops", {}),
            "notices": report.get("notices", [])}


# ---- the local pool ---------------------------------------------------------------------------

def _worker(task: Task, results, events, spawned: float):
    """A worker process: one task, its phases told to the parent as they start. `spawned`
    is the parent's time.time() as it started the process: what passed until run_task
    began (a fresh interpreter, its imports, unpickling the task; 0.2 to 0.7 s) is the
    row's "startup" phase and part of its seconds, as it is of the batch's wall time."""
    startup = max(0.0, time.time() - spawned)
    row = run_task(task, tell=lambda phase: events.put((task.name, phase)))
    if row.get("phase_seconds") is not None:
        row["phase_seconds"] = {"startup": startup, **row["phase_seconds"]}
    row["seconds"] = startup + (row.get("seconds") or 0.0)
    results.put(row)


@dataclass
class _Running:
    task: Task
    proc: object
    results: object
    started: float
    phase: str = "starting"
    peak_mib: float = 0.0
    memory_limit_mib: float = DEFAULT_MAX_MEMORY_MIB


def _context():
    """Fresh interpreter processes ("spawn"). Forking from a server with apsat imported
    would save the imports (~2 s a model) but deadlocks: numpy's BLAS thread pool does not
    survive a fork, and the GPU lowering hung in the child."""
    return mp.get_context("spawn")


def run_local(tasks: list[Task], jobs: int = 1, timeout: float = DEFAULT_TIMEOUT_S,
              max_memory_mib: float | None = None, store: ResultStore | None = None,
              force: bool = False, on_event=None) -> list[dict]:
    """Run `tasks` on `jobs` worker processes; one summary row per task, in task order.
    Tasks whose key `store` has are reused (status "reused") unless `force`; a finished
    result is stored only when computed by this process's apsat source (same_source). A
    model over `timeout` seconds or its memory limit (`max_memory_mib`, default
    `memory_limit_mib`'s for the model) of resident memory is killed and fails with that
    reason; so does a worker that dies. `on_event(kind, row_or_name, detail)` hears
    "start" (name, the worker's pid), "phase" (name, phase), "done" (row) and "reused"
    (row) events, for a progress view. KeyboardInterrupt
    stops the workers and returns the rows finished so far (others "interrupted")."""
    rows: dict[str, dict] = {}
    pending = []
    # each model file hashed once: to look its result up and to store it
    keys = {t.name: t.key() for t in tasks} if store is not None else {}
    for task in tasks:
        record = None if force or keys.get(task.name) is None else store.load(keys[task.name])
        if record is not None:
            rows[task.name] = {**record["row"], "status": "reused", "stored_status": record["row"]["status"]}
            _emit(on_event, "reused", rows[task.name], None)
        else:
            pending.append(task)
    # largest model files first: a big model started last would run alone at the end
    pending.sort(key=lambda t: -_file_size(t.path))
    ctx, running = _context(), {}
    events = ctx.Queue()
    try:
        while pending or running:
            while pending and len(running) < max(1, jobs):
                task = pending.pop(0)
                results = ctx.Queue()
                proc = ctx.Process(target=_worker, args=(task, results, events, time.time()),
                                   daemon=True)
                proc.start()
                running[task.name] = _Running(task, proc, results, time.monotonic(),
                                              memory_limit_mib=memory_limit_mib(task, max_memory_mib))
                _emit(on_event, "start", task.name, proc.pid)
            _drain_events(events, running, on_event)
            for name, run in list(running.items()):
                row = _finished(run, timeout, run.memory_limit_mib)
                if row is not None:
                    del running[name]
                    rows[name] = row
                    key = keys.get(name) if row["status"] in ("ok", "mismatch") else None
                    if key is not None and same_source(row):
                        store.save(key, {"row": row, "task": _jsonable(asdict(run.task))})
                    _emit(on_event, "done", row, None)
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        for run in running.values():
            run.proc.kill()
        for task in [r.task for r in running.values()] + pending:
            rows.setdefault(task.name, {"model": task.name, "path": task.path, "target": task.target,
                                        "status": "interrupted", "error": "stopped by Ctrl-C"})
    return [rows[t.name] for t in tasks if t.name in rows]


def _jsonable(task: dict) -> dict:
    """A task as plain JSON values (rule files as their path text)."""
    return {**task, "rules": [str(r) for r in task["rules"]]}


def _emit(on_event, kind, what, detail):
    if on_event is not None:
        on_event(kind, what, detail)


def _drain_events(events, running, on_event):
    while True:
        try:
            name, phase = events.get_nowait()
        except (queue_mod.Empty, OSError, EOFError):
            return
        if name in running:
            running[name].phase = phase
        _emit(on_event, "phase", name, phase)


def _finished(run: _Running, timeout: float, max_memory_mib: float) -> dict | None:
    """The task's row when its worker is done or must be stopped, else None. Rows carry
    the worker's peak resident memory as sampled here (`peak_mib`)."""
    rss = _rss_mib(run.proc.pid)
    run.peak_mib = max(run.peak_mib, rss or 0.0)
    try:
        return {**run.results.get_nowait(), "peak_mib": round(run.peak_mib)}
    except (queue_mod.Empty, OSError, EOFError):
        pass
    base = {"model": run.task.name, "path": run.task.path, "target": run.task.target,
            "status": "failed", "seconds": time.monotonic() - run.started, "last_phase": run.phase,
            "peak_mib": round(run.peak_mib)}
    if not run.proc.is_alive():
        try:                      # the row may arrive just after the process exits
            return {**run.results.get(timeout=1.0), "peak_mib": round(run.peak_mib)}
        except (queue_mod.Empty, OSError, EOFError):
            code = run.proc.exitcode
            why = f"killed by signal {signal.Signals(-code).name}" if code and code < 0 else f"exit status {code}"
            return {**base, "error": f"worker died ({why}) in phase {run.phase}"}
    if time.monotonic() - run.started > timeout:
        run.proc.kill()
        return {**base, "error": f"time limit {timeout:g} s hit in phase {run.phase}"}
    if rss is not None and rss > max_memory_mib:
        run.proc.kill()
        return {**base, "error": f"memory limit {max_memory_mib:g} MiB exceeded ({rss:.0f} MiB) "
                                 f"in phase {run.phase}"}
    return None


def _file_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _rss_mib(pid: int) -> float | None:
    """Resident memory of a process, MiB (Linux /proc); None when unreadable."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return None
