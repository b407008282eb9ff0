"""Fixtures of the GPU backend tests: kernels run under the Triton interpreter
(TRITON_INTERPRET=1, on the CPU) when no GPU is present; the reference interpreter
(apsat.evaluate) and onnxruntime are the oracles. Helpers and cases: gpu_cases.py."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def triton_run():
    """apsat.backends.triton.run, skipping when torch or triton is missing."""
    pytest.importorskip("torch", reason="the GPU backend needs torch (pip install apsat[gpu])")
    pytest.importorskip("triton", reason="the GPU backend needs triton (pip install apsat[gpu])")
    from apsat.backends.triton import run

    return run
