"""Host steps: the parts of a program no generated kernel computes.

A host step is a small Program (apsat/backends/gpu/lower.py, `HostStep.program`) whose
tensors are the buffers it reads. The reference interpreter evaluates it; an opaque ONNX
node inside runs in onnxruntime, as everywhere else in apsat. Generated runners keep their
host steps pickled beside them (host_steps.pkl) and call `run_host_step`.
"""
from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

_LOADED: dict[str, dict] = {}


def load_host_steps(path) -> dict:
    """name -> Program of a pickled host-step file (read once per process)."""
    key = str(Path(path).resolve())
    if key not in _LOADED:
        with open(key, "rb") as f:
            _LOADED[key] = pickle.load(f)
    return _LOADED[key]


def _numpy(x):
    """A numpy array of x (a torch tensor, on any device, or anything numpy takes)."""
    if hasattr(x, "detach"):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def evaluate_step(program, tensors: dict) -> np.ndarray:
    """The host step's result (float32 numpy) from its tensors (buffer name -> array)."""
    from apsat.lang.evaluate import evaluate

    return evaluate(program, {name: _numpy(x) for name, x in tensors.items()})


def run_host_step(path, name: str, tensors: dict, device):
    """Run host step `name` of the pickled file at `path` on `tensors` (buffer name ->
    torch tensor or array) and return its result as a float32 torch tensor on `device`."""
    import torch

    out = evaluate_step(load_host_steps(path)[name], tensors)
    return torch.from_numpy(np.asarray(out, dtype=np.float32, order="C").copy()).to(device)
