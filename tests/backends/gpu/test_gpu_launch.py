"""The generated runner's GPU-only paths, checked where they can be without a GPU: the
CUDA C launch table, the refusals (CUDA C kernels and CUDA graphs on the CPU, an unknown
kernel set), and the driver-call checks of cuda_launch.py."""
from __future__ import annotations

import pytest
from gpu_cases import KERNELS

import apsat
from apsat.backends.gpu import cuda, runner
from apsat.backends.gpu.lower import lower


@pytest.fixture(scope="module")
def loaded():
    pytest.importorskip("torch", reason="the runner needs torch (pip install apsat[gpu])")
    text, shapes, _ = KERNELS["layernorm-gemm"]
    graph = lower(apsat.parse(text, shapes))
    import numpy as np

    rng = np.random.default_rng(0)
    tensors = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    return graph, runner.load_runner(runner.write_sources(graph)), tensors


def test_the_runner_launches_cuda_kernels_as_cuda_py_planned(loaded):
    graph, mod, _ = loaded
    assert set(mod.CUDA_LAUNCH) == {k.name for k in graph.kernels}
    for k in graph.kernels:
        plan = cuda.kernel_source(k)[1]          # what the CUDA source was written for
        assert mod.CUDA_LAUNCH[k.name] == (tuple(plan["grid"]), plan["block"])


def test_gpu_only_paths_refuse_the_cpu_in_one_line(loaded):
    _, mod, tensors = loaded
    with pytest.raises(RuntimeError, match="CUDA C kernels run on a GPU only"):
        mod.run(tensors, device="cpu", kernels="cuda")
    with pytest.raises(RuntimeError, match="a CUDA graph needs a GPU"):
        mod.capture(tensors, device="cpu")
    with pytest.raises(ValueError, match="kernels must be 'triton' or 'cuda'"):
        mod.run(tensors, device="cpu", kernels="ptx")
    out = mod.run(tensors, device="cpu")             # the default still runs (interpreter)
    assert set(out) == set(loaded[0].outputs)


def test_driver_failures_name_the_call_and_the_error():
    pytest.importorskip("cuda.bindings", reason="cuda-bindings is part of apsat[gpu]")
    from cuda.bindings import driver

    from apsat.backends.gpu.cuda_launch import CudaDriverError, check, kernel_params

    assert check((driver.CUresult.CUDA_SUCCESS, 7), "cuCall") == 7
    with pytest.raises(CudaDriverError, match="^cuModuleLoadData: CUDA_ERROR_INVALID_IMAGE$"):
        check((driver.CUresult.CUDA_ERROR_INVALID_IMAGE, None), "cuModuleLoadData")

    class Fake:
        def __init__(self, p):
            self.p = p

        def data_ptr(self):
            return self.p
    ptrs, types = kernel_params([Fake(4096), Fake(8192)])
    assert ptrs == (4096, 8192) and len(types) == 2
