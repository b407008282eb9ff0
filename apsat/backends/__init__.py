"""Backends: the reference interpreter, GPU kernels (Triton, CUDA C) and the systolic
array's instruction stream, behind one interface (apsat.backends.base.Backend).

`backend_for(target)` is the backend a Target lowers to.
"""
from __future__ import annotations


def backend_for(target):
    """The Backend of a Target (apsat.targets.Target): gpu -> GpuBackend, systolic ->
    SystolicBackend."""
    if target.kind == "systolic":
        from apsat.backends.systolic.backend import SystolicBackend

        return SystolicBackend()
    from apsat.backends.gpu.backend import GpuBackend

    return GpuBackend()
