"""Each kernel of a kernel graph timed on the buffers it reads in the model; tile tuning.

    profile(graph, tensors, timer, *, cache=None, tune=False, limit=16, device=None) -> [row]
    cuda_timer(warmup_ms, rep_ms) / wall_timer(runs) -> timer(fn) -> microseconds

The steps run in order on `tensors` (the model's inputs and weights by tensor name), as
the generated runner runs them, so each kernel is timed on the data it meets in the model:
token ids index in range, masks stay masks. Host steps run and are timed too.

With `tune`, a kernel whose shape (tuning.kernel_key) the cache lacks is timed under each
of tuning.candidates. The first candidate is the kernel's own tiles; a candidate whose
output differs from it (rtol 1e-4, atol 1e-5 x the output's largest magnitude; for f16/bf16
outputs 4 unit roundoffs of the type for both; outputs are
poisoned with NaN first, so an element left unwritten differs) is rejected, and one that
does not compile (too much shared memory, say) is skipped. The fastest of the rest is
recorded in the cache; a kernel whose shape the cache holds is not searched again.

A row: "name", "kind" (a kernel kind, or "host"), "prepare" (weight-only: run once per
model load), "covers", "flops", "bytes", "modelled_us" (the roofline's), "measured_us" (the
timer's, for the tiles kept), "tiles", "key", and "tuning": {"searched", "tried",
"rejected", "failed", "default_us"}.

On a GPU the timer is cuda_timer: triton.testing.do_bench's median, CUDA events around
each run. Without one the kernels run under the Triton interpreter and wall_timer times
them: the figures say nothing about a GPU, but the search runs the same code.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
import time

from apsat.backends.gpu.graph import HostStep, Kernel, KernelGraph
from apsat.backends.gpu.tuning import candidates, kernel_key, plain_tiles
from apsat.lang.dtypes import UNIT_ROUNDOFF

RTOL, ATOL = 1e-4, 1e-5


def cuda_timer(warmup_ms: float = 25, rep_ms: float = 100):
    """A timer for GPU work: the median microseconds of fn over about rep_ms of runs after
    warmup_ms of warm-up (triton.testing.do_bench: CUDA events, L2 flushed between runs)."""
    from triton.testing import do_bench

    def time_us(fn) -> float:
        return 1000.0 * float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))
    return time_us


def wall_timer(runs: int = 3):
    """A timer for CPU work (the Triton interpreter): median wall-clock microseconds of
    `runs` calls after one warm-up call."""
    def time_us(fn) -> float:
        fn()
        times = []
        for _ in range(runs):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return 1e6 * statistics.median(times)
    return time_us


def _launcher(mod, runner, dev):
    """mod.launch; on the CPU under the Triton interpreter, rebound as the generated
    runner rebinds its own kernels (runner._interpreted), numpy's warnings about masked-off
    lanes' arithmetic (0 / 0) silenced."""
    if dev.type != "cpu":
        return mod.launch
    import numpy as np

    mod = runner._interpreted(mod)

    def launch(*args):
        with np.errstate(all="ignore"):
            mod.launch(*args)
    return launch


def _close(got, want) -> bool:
    import torch

    # half outputs: two tilings sum in other orders in float32, and the store's one rounding
    # may then land an ulp apart; 4 unit roundoffs of the type allow that, not a wrong value
    half = {torch.float16: UNIT_ROUNDOFF["f16"], torch.bfloat16: UNIT_ROUNDOFF["bf16"]}.get(want.dtype)
    rtol, atol = (RTOL, ATOL) if half is None else (4 * half, 4 * half)
    got, want = got.float(), want.float()
    scale = float(torch.nan_to_num(want.abs(), nan=0.0, posinf=0.0).max()) if want.numel() else 0.0
    return bool(torch.allclose(got, want, rtol=rtol, atol=atol * max(scale, 1.0), equal_nan=True))


def _trial(k: Kernel, tiles: dict, reads: list, dims, runner, dev, timer, want):
    """(output, microseconds) of kernel k under `tiles`; output None when it differs from
    `want` (the first trial's output, when given)."""
    import torch

    from apsat.backends.gpu.files import source_module
    from apsat.backends.gpu.triton import kernel_source

    text = kernel_source(dataclasses.replace(k, tiles=dict(tiles)))
    with source_module(text, k.name) as mod:     # compiled and timed inside: the file goes after
        launch = _launcher(mod, runner, dev)
        out = torch.full(dims, math.nan, dtype=runner._dtype(k.out), device=dev)   # the buffer's type
        launch(out, *reads)
        if want is not None and not _close(out, want):
            return None, math.inf
        return out, timer(lambda: launch(out, *reads))


def _kernel_step(k: Kernel, bufs: dict, dims, runner, dev, timer, cache, tune: bool, limit: int):
    """(output, row) of one kernel: timed under its tiles, or searched (see the module doc)."""
    key = kernel_key(k)
    search = tune and (cache is None or key not in cache)
    trials = candidates(k, limit) if search else [plain_tiles(k.tiles)]
    reads = [bufs[r] for r in k.reads]
    want, best, stats = None, None, {"searched": search, "tried": 0, "rejected": 0, "failed": 0}
    for i, tiles in enumerate(trials):
        try:
            out, us = _trial(k, tiles, reads, dims, runner, dev, timer, want)
        except Exception:  # noqa: BLE001 -- a candidate the compiler refuses is skipped
            if i == 0:
                raise       # the kernel's own tiles must compile
            stats["failed"] += 1
            continue
        stats["tried"] += 1
        if out is None:
            stats["rejected"] += 1
            continue
        if i == 0:
            want, stats["default_us"] = out, us
        if best is None or us < best[0]:
            best = (us, tiles, out)
    if search and cache is not None:
        cache.put(key, k.kind, best[1], best[0], default_us=stats["default_us"], tried=stats["tried"],
                  rejected=stats["rejected"], failed=stats["failed"])
    row = {"name": k.name, "kind": k.kind, "covers": k.covers, "flops": k.flops, "bytes": k.bytes,
           "modelled_us": k.modelled_us, "measured_us": best[0], "tiles": best[1], "key": key,
           "tuning": stats}
    return best[2], row


def profile(graph: KernelGraph, tensors: dict, timer, *, cache=None, tune: bool = False,
            limit: int = 16, device=None, progress=None) -> list[dict]:
    """Run and time every step of `graph` on `tensors` (see the module doc); returns one
    row per step in order. cache: a tuning.TuningCache (read, and written when tuning);
    limit: candidates per searched kernel; progress(i, n, name) is called before each step."""
    from apsat.backends.gpu.host import run_host_step
    from apsat.backends.gpu.runner import load_runner, write_sources

    folder = write_sources(graph)            # the private cache, as run_kernels writes it
    runner = load_runner(folder)             # its device choice, input staging, interpreter
    dev = runner._device(device)
    bufs = {n: runner._input(x, runner.INPUTS[n][1], dev, n)
            for n, x in runner._raw(tensors, list(runner.INPUTS)).items()}
    once = {s.name for s in graph.prepare_steps}
    rows = []
    for i, step in enumerate(graph.steps):
        if progress is not None:
            progress(i, len(graph.steps), step.name)
        if isinstance(step, HostStep):
            def host(step=step):
                return run_host_step(folder / "host_steps.json", step.name,
                                     {r: bufs[r] for r in step.reads}, dev).to(runner._dtype(step.out))
            bufs[step.out] = host()
            row = {"name": step.name, "kind": "host", "covers": [step.op], "flops": 0.0,
                   "bytes": step.bytes, "modelled_us": step.modelled_us, "measured_us": timer(host),
                   "tiles": {}, "key": None, "tuning": {}}
        else:
            dims = tuple(graph.buffers[step.out].dims)
            bufs[step.out], row = _kernel_step(step, bufs, dims, runner, dev, timer, cache, tune, limit)
        rows.append({**row, "prepare": step.name in once})
    return rows

