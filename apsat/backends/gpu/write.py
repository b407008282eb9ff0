"""`write_kernels`: a program's GPU kernels on disk, compiled where the tools allow, and
the figures a report shows for each.

    DIR/runner.py               run(tensors, device=None) -> {output: torch.Tensor}
    DIR/kernels/<k>.py          Triton source, one kernel each
    DIR/kernels/<k>.cu          the same kernel in CUDA C++
    DIR/kernels/<k>.cubin       nvcc -arch=sm_90 -cubin (when nvcc is on PATH)
    DIR/kernels/<k>.triton.cubin  triton.compile for GPUTarget("cuda", 90, 32) (when triton
                                  is installed; no GPU needed)
    DIR/host_steps.json         the host steps' programs, as data (when there are any)
    DIR/kernels.json            what write_kernels returns

DIR is the caller's folder: apsat writes there but does not import from it. The Triton
compiler runs on the sources as generated, from a private temporary folder (aot.py), so a
file someone else changed in DIR is never run.

Compilation failures do not raise: they are recorded per kernel ("error"), so a report
can show them; tests assert on them.
"""
from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from apsat.backends.gpu.graph import KernelGraph
from apsat.backends.gpu.lower import lower
from apsat.backends.gpu.tuning import tuned_cache


def _triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__


def write_kernels(program, directory, *, tiles: dict | None = None, compile=True,
                  graph: KernelGraph | None = None, gpu: str | None = None) -> dict:
    """Write the kernels of `program` (an extracted Program for the gpu target) into
    `directory` (created if needed) and return their figures.

    compile: True compiles with every tool present (nvcc for the CUDA C, triton.compile
    for the Triton sources); False writes sources only; or a collection naming the
    tools to use, from {"cuda", "triton"}. tiles: tile overrides (see lower.lower).
    graph: an already lowered kernel graph of `program`, to skip lowering again.
    gpu: the GPU (its name as torch.cuda.get_device_name gives it) whose tuned tiles
    (tuning.TuningCache) the kernels take where the cache holds their shape; default the
    GPU torch sees here, none without one (the roofline's tiles).

    Returns a JSON-ready dict (also written to DIR/kernels.json):
      "directory", "runner" (path of runner.py)
      "kernels": one dict per kernel in launch order: "name", "kind" (gemm | reduce |
          attention | elementwise), "prepare" (weight-only: run once by runner.prepare, not per
          inference), "covers" (the ops fused into it), "reads" (buffers), "out",
          "out_shape", "flops", "bytes" (ideal traffic: each buffer read once plus the
          result), "modelled_us" (apsat/extract/cost_gpu.py's roofline of flops and bytes
          on an H100), "tiles" (incl. the tile search's own "modelled_us"), "grid",
          "triton": {"source", "cubin", "registers", "shared_bytes", "spills", "error"},
          "cuda": {"source", "cubin", "registers", "shared_bytes", "spill_stores",
                   "spill_loads", "grid", "block", "error"}
          (figures None where the tool is missing; "error" None when it compiled)
      "host_steps": "name", "op", "prepare", "runner" (onnxruntime | reference), "reason",
          "reads", "out", "bytes" (over PCIe), "modelled_us"
      "totals": "kernels", "host_steps", "prepare_steps", and per inference (prepare
          steps left out) "inference_kernels", "flops", "bytes", "modelled_us";
          "prepare_us" for the rest
      "tools": "nvcc" (path or None), "triton" (version or None), "notes" (why something
          was not compiled)
    """
    graph = graph or lower(program, tiles, tuned_cache(gpu))
    directory = Path(directory)
    (directory / "kernels").mkdir(parents=True, exist_ok=True)
    texts = _write_sources(graph, directory)
    tools = {"cuda", "triton"} if compile is True else set(compile or ())
    figures = kernel_figures(graph)
    notes = _compile_kernels(figures["kernels"], directory, tools, texts)
    report = {"directory": str(directory), "runner": str(directory / "runner.py"), **figures,
              "tools": {"nvcc": _nvcc(), "triton": _triton_version(), "notes": notes}}
    (directory / "kernels.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    return report


def _nvcc():
    from apsat.backends.gpu import cuda

    return cuda.nvcc_path()


def _write_sources(graph: KernelGraph, directory: Path) -> dict[str, str]:
    """The runner, the Triton sources and the CUDA C sources, as files under `directory`;
    returns relative path -> text of what was written."""
    from apsat.backends.gpu import cuda
    from apsat.backends.gpu.runner import sources

    texts = sources(graph)
    texts.update({f"kernels/{k.name}.cu": cuda.kernel_source(k)[0] for k in graph.kernels})
    for rel, text in texts.items():
        (directory / rel).write_text(text)
    return texts


def kernel_figures(graph: KernelGraph) -> dict:
    """What the kernel graph says of itself, no tool run: "kernels" and "host_steps" rows
    and "totals" (see write_kernels; the tools' fields are None here)."""
    from apsat.backends.gpu import cuda
    from apsat.backends.gpu.triton import launch_plan

    once = {s.name for s in graph.prepare_steps}
    rows = []
    for k in graph.kernels:
        launch = cuda.launch_plan(k)
        rows.append({
            "name": k.name, "kind": k.kind, "prepare": k.name in once, "covers": k.covers,
            "reads": k.reads, "out": k.out, "out_shape": list(graph.buffers[k.out].dims),
            "flops": k.flops, "bytes": k.bytes, "modelled_us": k.modelled_us, "tiles": k.tiles,
            "grid": list(launch_plan(k)["grid"]),
            "triton": {"source": f"kernels/{k.name}.py", "cubin": None, "registers": None,
                       "shared_bytes": None, "spills": None, "error": None},
            "cuda": {"source": f"kernels/{k.name}.cu", "cubin": None, "registers": None,
                     "shared_bytes": None, "spill_stores": None, "spill_loads": None,
                     "grid": list(launch["grid"]), "block": launch["block"], "error": None}})
    host = [{"name": h.name, "op": h.op, "prepare": h.name in once, "runner": h.runner, "reason": h.reason,
             "reads": h.reads, "out": h.out, "bytes": h.bytes, "modelled_us": h.modelled_us}
            for h in graph.host_steps]
    per_call = [r for r in rows + host if not r["prepare"]]
    totals = {"kernels": len(rows), "host_steps": len(host), "prepare_steps": len(once),
              "inference_kernels": sum(1 for r in rows if not r["prepare"]),
              "flops": sum(r.get("flops", 0.0) for r in per_call),
              "bytes": sum(r["bytes"] for r in per_call),
              "modelled_us": sum(r["modelled_us"] for r in per_call),
              "prepare_us": sum(r["modelled_us"] for r in rows + host if r["prepare"])}
    return {"kernels": rows, "host_steps": host, "totals": totals}


def _compile_kernels(rows: list[dict], directory: Path, tools: set, texts: dict) -> list[str]:
    """Compile the sources (`texts`, as written under `directory`) with the `tools`
    present, filling each row's "cuda" and "triton" figures; returns notes on what could
    not be compiled and why."""
    notes = []
    if "cuda" in tools:
        if _nvcc() is None:
            notes.append("nvcc not found: CUDA sources written, not compiled")
        else:
            _compile_cuda(rows, directory, texts)
    if "triton" in tools:
        if _triton_version() is None:
            notes.append("triton not installed: Triton sources written, not compiled ahead of time")
        else:
            _compile_triton(rows, directory, texts)
    return notes


def _compile_cuda(rows: list[dict], directory: Path, texts: dict) -> None:
    from apsat.backends.gpu import cuda

    jobs = {r["name"]: (texts[r["cuda"]["source"]], directory / r["cuda"]["source"]) for r in rows}
    # nvcc runs as a subprocess: compile in parallel, one job per core
    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        done = dict(zip(jobs, pool.map(lambda job: cuda.compile_cuda(*job), jobs.values())))
    for row in rows:
        res = done[row["name"]]
        row["cuda"].update({"cubin": f"kernels/{row['name']}.cubin" if res["cubin"] else None,
                            "registers": res["registers"], "shared_bytes": res["shared_bytes"],
                            "spill_stores": res["spill_stores"], "spill_loads": res["spill_loads"],
                            "error": None if res["ok"] else res["log"][-2000:]})


def _compile_triton(rows: list[dict], directory: Path, texts: dict) -> None:
    from apsat.backends.gpu.aot import aot_compile_source

    for row in rows:
        res = aot_compile_source(texts[row["triton"]["source"]], row["name"])
        if "error" in res:
            row["triton"]["error"] = res["error"]
            continue
        out = directory / "kernels" / f"{row['name']}.triton.cubin"
        out.write_bytes(res["cubin"])
        row["triton"].update({"cubin": f"kernels/{out.name}", "registers": res["registers"],
                              "shared_bytes": res["shared_bytes"], "spills": res["spills"]})
