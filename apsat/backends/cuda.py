"""The CUDA C backend: kernel sources for sm_90 and their compilation with nvcc.

A thin entry point re-exporting apsat/backends/gpu/cuda.py: `kernel_source(kernel)`,
`compile_cuda(source, path)`, `nvcc_path()`; `write_kernels(program, directory)` writes
and compiles every kernel of a program (apsat.backends.gpu.write).
"""
from __future__ import annotations

from apsat.backends.gpu.cuda import compile_cuda, kernel_source, nvcc_path
from apsat.backends.gpu.write import write_kernels

__all__ = ["compile_cuda", "kernel_source", "nvcc_path", "write_kernels"]
