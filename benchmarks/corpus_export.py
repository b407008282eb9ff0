"""Exporting the public corpus (benchmarks/corpus.py export): each architecture of the
catalogue (corpus_models) to CACHE/onnx/NAME.onnx, with its record in CACHE/manifest.json.

Models are exported by one worker process at a time that imports the libraries once and
takes the architectures in turn; the parent watches it, so an export that hangs (past
--timeout) or crashes the interpreter becomes that architecture's skip, with its reason,
and a fresh worker goes on with the rest. Every outcome is written to the manifest as soon
as it is known (atomically), so an interrupted export resumes where it stopped.

Each export: build the candidate (corpus_models.build), refuse it when its weights are
over MAX_WEIGHT_MB, export with torch's TorchScript exporter at opset 17 (export_zoo's
exporter: constant folding, onnx.checker full check), run onnxruntime on the seeded inputs,
pin the output dims, and record the largest difference from torch.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import queue as queue_mod
import re
import tempfile
import time
import warnings
from pathlib import Path

MAX_WEIGHT_MB = 30
TIMEOUT_S = 300.0
MAX_MEMORY_MIB = 6144       # a config the generic shrink missed can build a model of gigabytes


def default_cache() -> Path:
    """$APSAT_CORPUS_DIR, else the user cache dir's apsat/corpus (platformdirs)."""
    import platformdirs

    return Path(os.environ.get("APSAT_CORPUS_DIR") or Path(platformdirs.user_cache_dir("apsat")) / "corpus")


def load_manifest(cache: Path) -> dict:
    """The manifest ({"models": name -> entry, "skipped": name -> reason}), empty if none."""
    try:
        data = json.loads((cache / "manifest.json").read_text())
    except (OSError, ValueError):
        data = {}
    return {"models": data.get("models", {}), "skipped": data.get("skipped", {}),
            "versions": data.get("versions", {})}


def save_manifest(cache: Path, manifest: dict) -> None:
    """Write the manifest atomically (a temporary file renamed over it)."""
    cache.mkdir(parents=True, exist_ok=True)
    data = {**manifest, "models": dict(sorted(manifest["models"].items())),
            "skipped": dict(sorted(manifest["skipped"].items()))}
    fd, tmp = tempfile.mkstemp(dir=cache, prefix=".manifest-", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(data, indent=1, default=str) + "\n")
    os.replace(tmp, cache / "manifest.json")


class ExportFailure(Exception):
    """An architecture that cannot be exported; the message is its skip reason."""


def reason(stage: str, exc: BaseException) -> str:
    """One line saying why a stage failed, in the classes the listing groups by: a missing
    package, a download, an operator the exporter lacks, or the exception and its message."""
    text = " ".join(str(exc).split())
    if isinstance(exc, ExportFailure):
        return text
    lib = re.search(r"requires the (\S+) library", text)
    if isinstance(exc, ImportError) or lib:
        return f"needs a package: {(lib and lib.group(1)) or getattr(exc, 'name', None) or text[:120]}"
    if re.search(r"offline|huggingface\.co|hf_hub|LocalEntryNotFound|trust_remote_code", text, re.I):
        return f"needs a download: {text[:160]}"
    if "Couldn't load custom C++ ops" in text:
        return (f"{stage}: needs torchvision's C++ ops (nms, roi_align ...), which do not load beside "
                f"CPU torch (torchvision 0.28's wheel is a CUDA build)")
    op = re.search(r"Exporting the operator '([^']+)'", text)
    if op:
        return f"export: operator {op.group(1)} has no ONNX form (TorchScript exporter, opset 17)"
    return f"{stage}: {type(exc).__name__}: {text[:200]}"


def export_candidate(arch, candidate: str, libs, out_dir: Path, extra: dict | None = None) -> dict:
    """Export one candidate of an architecture to out_dir/NAME.onnx; its manifest entry.
    ExportFailure (the reason) when a stage fails. `extra`: corpus_models.build's."""
    import numpy as np

    import corpus_models as cm
    import export_zoo as ez

    torch = libs[0]
    stage, start = "build", time.perf_counter()
    try:
        spec = cm.build(arch, candidate, libs, extra)
        size = cm.weight_bytes(spec.module)
        if size > MAX_WEIGHT_MB * 2**20:
            raise ExportFailure(f"too big: {size / 2**20:.0f} MB of weights at the smallest size built "
                                f"(limit {MAX_WEIGHT_MB} MB)")
        stage = "forward"
        with torch.no_grad():
            ref = spec.module(*(torch.from_numpy(v) for v in spec.inputs.values()))
        stage = "export"
        model = ez.export_onnx(torch, spec)
        stage = "onnxruntime"
        outputs = ez.run_ort(model.SerializeToString(), spec.inputs)
    except Exception as exc:  # noqa: BLE001 - any failure is the skip's reason
        raise ExportFailure(reason(stage, exc)) from None
    for value in model.graph.output:        # pin dims the exporter's shape inference left symbolic
        for dim, n in zip(value.type.tensor_type.shape.dim, outputs[value.name].shape):
            dim.dim_value = n
    data = model.SerializeToString()
    (out_dir / f"{arch.name}.onnx").write_bytes(data)
    got = outputs[spec.outputs[0]]
    err = float(np.max(np.abs(ref.numpy().astype(np.float64) - got))) if got.size else 0.0
    ops: dict = {}
    for node in model.graph.node:
        ops[node.op_type] = ops.get(node.op_type, 0) + 1
    return {"file": f"onnx/{arch.name}.onnx", "library": arch.library, "family": arch.family,
            "variant": candidate, "source": spec.source, "config": spec.config,
            "inputs": {k: [list(v.shape), str(v.dtype)] for k, v in spec.inputs.items()},
            "nodes": len(model.graph.node), "ops": dict(sorted(ops.items())), "bytes": len(data),
            "weight_bytes": size, "max_abs_error_vs_torch": float(f"{err:.3g}"),
            "export_seconds": round(time.perf_counter() - start, 2)}


def export_arch(arch, libs, out_dir: Path) -> dict:
    """Export the first candidate of an architecture that exports; its manifest entry
    (with the reasons the earlier candidates failed). ExportFailure with the first
    candidate's reason when none does."""
    tried = []
    for candidate in arch.candidates:
        try:
            entry = export_candidate(arch, candidate, libs, out_dir)
        except ExportFailure as exc:
            tried.append(f"{candidate}: {exc}")
            continue
        return {**entry, **({"fallbacks": tried} if tried else {})}
    more = f" (and {len(tried) - 1} other candidates failed)" if len(tried) > 1 else ""
    raise ExportFailure(tried[0].split(": ", 1)[1] + more if tried else "no candidate")


def _worker(names: list, cache: str, events) -> None:
    """A worker process: import the libraries, export the named architectures in turn and
    report ("start", name), ("done", name, entry) or ("skip", name, reason) for each."""
    import corpus_models as cm

    warnings.filterwarnings("ignore")
    # the TorchScript exporter prints whole graphs on failure: to a log, not the terminal
    Path(cache).mkdir(parents=True, exist_ok=True)
    log = os.open(Path(cache) / "export-worker.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    libs = cm.import_libraries()
    libs[0].set_num_threads(1)
    archs = {a.name: a for a in cm.catalogue(libs)[0]}
    out = Path(cache) / "onnx"
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        events.put(("start", name))
        try:
            events.put(("done", name, export_arch(archs[name], libs, out)))
        except ExportFailure as exc:
            events.put(("skip", name, str(exc)))
        except BaseException as exc:  # noqa: BLE001 - a bug here is that model's skip, not the run's end
            events.put(("skip", name, reason("export", exc)))


def export_all(names: list, cache: Path, manifest: dict, timeout: float = TIMEOUT_S, log=print) -> dict:
    """Export the named architectures (in order) in a watched worker process, recording each
    outcome in the manifest as it comes; returns the manifest. A worker that dies or exceeds
    `timeout` on one model is replaced, that model skipped with the reason."""
    ctx, pending = mp.get_context("spawn"), list(names)
    total, done, starts = len(pending), 0, 0
    while pending:
        events = ctx.Queue()
        proc = ctx.Process(target=_worker, args=(pending, str(cache), events), daemon=True)
        proc.start()
        current, since = None, time.monotonic()
        while True:
            try:
                msg = events.get(timeout=1.0)
            except queue_mod.Empty:
                msg = None
            if msg and msg[0] == "start":
                current, since = msg[1], time.monotonic()
                continue
            if msg:
                done += 1
                pending.remove(msg[1])
                _record(manifest, msg)
                save_manifest(cache, manifest)
                log(_progress_line(done, total, msg))
                current = None
                if not pending:
                    break
                continue
            why = None
            if not proc.is_alive() and current is None:   # died before its first model: not that model's fault
                starts += 1
                if starts > 2:
                    raise SystemExit(f"corpus: the export worker dies at start (exit status {proc.exitcode}); "
                                     f"see {cache / 'export-worker.log'}")
                break
            if not proc.is_alive():
                why = f"the exporter's process died (exit status {proc.exitcode})"
            elif current and time.monotonic() - since > timeout:
                why = f"export timed out after {timeout:g} s"
            elif current and _rss_mib(proc.pid) > MAX_MEMORY_MIB:
                why = f"export took over {MAX_MEMORY_MIB} MiB of memory (a model far over the size limit)"
            if why:
                proc.kill()
                done += 1
                pending.remove(current)
                _record(manifest, ("skip", current, why))
                save_manifest(cache, manifest)
                log(_progress_line(done, total, ("skip", current, why)))
                break
        proc.join(timeout=5)
    return manifest


def _rss_mib(pid: int) -> float:
    """Resident memory of a process in MiB (Linux /proc; 0 when unreadable)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return 0.0


def _record(manifest: dict, msg: tuple) -> None:
    """Put one outcome in the manifest (an export replaces an old skip, and vice versa)."""
    kind, name, value = msg
    manifest["models"].pop(name, None)
    manifest["skipped"].pop(name, None)
    if kind == "done":
        manifest["models"][name] = value
    else:
        manifest["skipped"][name] = value


def _progress_line(done: int, total: int, msg: tuple) -> str:
    """One progress line: count, name, and the entry's size or the skip's reason."""
    kind, name, value = msg
    what = (f"ok  {value['nodes']:5d} nodes {value['bytes'] / 2**20:6.2f} MB  {value['variant']}"
            if kind == "done" else f"skip  {value}")
    return f"[{done}/{total}] {name:40s} {what}"
