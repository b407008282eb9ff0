"""The gpu target's backend: Triton and CUDA C kernels (see apsat.backends.base)."""
from __future__ import annotations

from pathlib import Path

from apsat.backends.base import Backend, Lowered, as_outputs

# A CUDA GPU shows one of these device files (Linux's NVIDIA driver; WSL2's GPU bridge).
# Without any, torch (1.2 s to import) is not asked.
GPU_DEVICE_FILES = ("/dev/nvidiactl", "/dev/dxg")


class GpuBackend(Backend):
    """Lowering builds the kernel graph and its figures (report key "gpu_kernels");
    running launches the Triton kernels (on a GPU, or under the Triton interpreter);
    writing puts the sources, the runner and, where asked, the compiled kernels on disk."""

    name = "gpu_kernels"

    def lower(self, program, target, weights, options: dict) -> Lowered:
        from apsat.backends.gpu.lower import lower
        from apsat.backends.gpu.write import kernel_figures

        graph = lower(program)
        return Lowered(program, graph, kernel_summary(kernel_figures(graph)))

    def price(self, lowered: Lowered) -> dict:
        """The kernels' and host steps' modelled time per inference and the kernels launched
        per inference (weight preparation, run once at load, left out), as the report's
        totals say."""
        totals = lowered.report["totals"]
        return {"cost": totals["modelled_us"], "unit": "us", "kernels": totals["inference_kernels"]}

    def run_skipped(self) -> str | None:
        # Without a GPU the kernels run under Triton's CPU interpreter: correct, but light
        # SqueezeNet took about 11 minutes there (2 cores), too slow for every verification.
        if not any(Path(d).exists() for d in GPU_DEVICE_FILES):
            return "no GPU here: the Triton interpreter is too slow to run every model's kernels"
        try:
            import torch
        except ImportError:
            return "torch is not installed (the gpu extra)"
        if not torch.cuda.is_available():
            return "no GPU here: the Triton interpreter is too slow to run every model's kernels"
        return None

    def run(self, lowered: Lowered, tensors: dict) -> dict:
        from apsat.backends.gpu.runner import run_kernels

        return as_outputs(lowered.program, run_kernels(lowered.program, tensors))

    def write(self, lowered: Lowered, directory, compile=False) -> dict:
        from apsat.backends.gpu.write import write_kernels

        return kernel_summary(write_kernels(lowered.program, directory, compile=compile,
                                           graph=lowered.artifact))


def kernel_summary(figures: dict) -> dict:
    """The report's kernel figures from write_kernels' or kernel_figures' (sources, tiles
    and logs left out; write_kernels puts them in DIR/kernels.json)."""
    keep = ("name", "kind", "covers", "flops", "bytes", "modelled_us")
    kernels = []
    for k in figures["kernels"]:
        row = {key: k.get(key) for key in keep}
        for tool in ("cuda", "triton"):
            t = k.get(tool) or {}
            row[tool] = {"registers": t.get("registers"), "shared_bytes": t.get("shared_bytes"),
                         "error": t.get("error")}
        kernels.append(row)
    return {"totals": figures["totals"], "tools": figures.get("tools"), "kernels": kernels,
            "host_steps": figures["host_steps"]}
