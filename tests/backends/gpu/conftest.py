"""Fixtures of the GPU backend tests: kernels run under the Triton interpreter (on the
CPU) when no GPU is present; the reference interpreter (apsat.evaluate) and onnxruntime
are the oracles. Helpers and cases: gpu_cases.py. The runner folders these tests write go
to a per-session cache folder (XDG_CACHE_HOME), not the user's own cache."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def _private_cache(tmp_path_factory):
    """XDG_CACHE_HOME (platformdirs' cache root on Linux) set to a fresh folder for the
    session, restored afterwards."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
        yield


@pytest.fixture(scope="session")
def triton_run():
    """apsat.backends.triton.run, skipping when torch or triton is missing."""
    pytest.importorskip("torch", reason="the GPU backend needs torch (pip install apsat[gpu])")
    pytest.importorskip("triton", reason="the GPU backend needs triton (pip install apsat[gpu])")
    from apsat.backends.triton import run

    return run
