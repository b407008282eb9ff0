"""Launching a generated CUDA C kernel's cubin from Python, on torch's tensors and stream.

    CubinKernel(path, name, grid, block)(out, *inputs)

The generated runner's `run(..., kernels="cuda")` launches each kernel's nvcc build
(write_kernels' kernels/<name>.cubin) through this. The cubin is loaded with the CUDA
driver API (the cuda-bindings package, NVIDIA's Python bindings of it) into the current
context, which is torch's primary context once torch has used the GPU; each launch goes on
torch's current stream, so CUDA graph capture and torch's ordering hold as for Triton
kernels. Every driver call's status is checked: a failure raises CudaDriverError naming
the call and the driver's error name. A launch error that the GPU reports later (an
illegal address) surfaces at the next synchronising call, as with any CUDA kernel.

The kernels take float pointers only, output first (cuda.py's signature), at the grid and
threads per block that cuda.kernel_source chose; their shared memory is static (48 KiB
at most), so no dynamic shared memory is passed.
"""
from __future__ import annotations

import ctypes
from pathlib import Path


class CudaDriverError(RuntimeError):
    """A CUDA driver call that failed: the call and the driver's error name."""


def _driver():
    try:
        from cuda.bindings import driver
    except ImportError as e:
        raise ImportError("the CUDA C kernels are launched through cuda-bindings "
                          "(pip install 'apsat[gpu]' installs it)") from e
    return driver


def check(result, call: str):
    """The values a cuda-bindings call returned after its status, when the status is
    CUDA_SUCCESS; else CudaDriverError("<call>: <error name>")."""
    driver = _driver()
    status, values = result[0], result[1:]
    if status != driver.CUresult.CUDA_SUCCESS:
        # the enum's member name is the driver's error name (CUDA_ERROR_INVALID_VALUE ...)
        raise CudaDriverError(f"{call}: {getattr(status, 'name', status)}")
    return values[0] if len(values) == 1 else values


def kernel_params(tensors) -> tuple:
    """The kernelParams of a launch on `tensors` (contiguous device tensors): each one's
    device address as a pointer-sized value."""
    ptrs = tuple(int(t.data_ptr()) for t in tensors)
    return ptrs, (ctypes.c_void_p,) * len(ptrs)


class CubinKernel:
    """The kernel `name` of the cubin at `path`, launched on `grid` blocks of `block`
    threads. Loading needs a GPU (torch initialises the context first)."""

    def __init__(self, path, name: str, grid, block: int):
        import torch

        driver = _driver()
        torch.cuda.synchronize()        # torch's primary context exists and is current
        self.module = check(driver.cuModuleLoadData(Path(path).read_bytes()), "cuModuleLoadData")
        self.function = check(driver.cuModuleGetFunction(self.module, name.encode()), "cuModuleGetFunction")
        self.grid = tuple(int(g) for g in grid) + (1,) * (3 - len(grid))
        self.block = int(block)

    def __call__(self, *tensors) -> None:
        import torch

        driver = _driver()
        stream = driver.CUstream(torch.cuda.current_stream().cuda_stream)
        check(driver.cuLaunchKernel(self.function, *self.grid, self.block, 1, 1, 0, stream,
                                    kernel_params(tensors), 0), "cuLaunchKernel")
