"""The Triton backend: `run(program, inputs)` launches a program's generated kernels.

A thin entry point; the code generator and runner live in apsat/backends/gpu/ (see
apsat.backends.gpu.triton). torch and triton are imported only when `run` is called.
"""
from __future__ import annotations


def run(program, inputs: dict, **kwargs):
    """Run `program` with its Triton kernels (GPU, or the Triton interpreter on the CPU);
    same contract as apsat.lang.evaluate.evaluate. Keywords: tiles, device,
    directory (see apsat.backends.gpu.runner.run_kernels)."""
    from apsat.backends.gpu.runner import run_kernels

    return run_kernels(program, inputs, **kwargs)


__all__ = ["run"]
