"""Host steps: the parts of a program no generated kernel computes.

A host step is a small Program (apsat/backends/gpu/lower.py, `HostStep.program`) whose
tensors are the buffers it reads. The reference interpreter evaluates it; an opaque ONNX
node inside runs in onnxruntime, as everywhere else in apsat. Generated runners keep their
host steps beside them as data, `host_steps.json`, and call `run_host_step`:

    {"format": "apsat-host-steps/1",
     "steps": {name: {"program": program text (apsat.lang.syntax.to_dag_text),
                      "tensor_shapes": {tensor: [dims]}, "weights": [tensor, ...],
                      "opaque_nodes": {call: {"node": NodeProto bytes, base64,
                          "constants": {input position: .npy bytes, base64}, ...}}}}}

Loading parses program text and arrays (np.load with allow_pickle=False): a host-step
file never runs code, unlike the pickle it replaces.
"""
from __future__ import annotations

import base64
import functools
import io
import json
import os
from pathlib import Path

import numpy as np

from apsat.errors import ApsatError
from apsat.lang.program import OpaqueNode, Program

FORMAT = "apsat-host-steps/1"
MAX_LOADED = 16         # host-step files kept parsed in memory (least recently used dropped)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _npy(arr) -> str:
    """An array as base64 .npy; refuses object arrays (np.save with allow_pickle=False)."""
    buf = io.BytesIO()
    np.save(buf, np.asarray(arr), allow_pickle=False)
    return _b64(buf.getvalue())


def _opaque_data(node: OpaqueNode) -> dict:
    return {"node": _b64(node.node), "arg_inputs": list(node.arg_inputs),
            "constants": {str(k): _npy(v) for k, v in node.constants.items()},
            "input_types": list(node.input_types), "output_index": node.output_index,
            "output_type": node.output_type, "opsets": [[d, v] for d, v in node.opsets]}


def _opaque_node(d: dict) -> OpaqueNode:
    consts = {int(k): np.load(io.BytesIO(base64.b64decode(v)), allow_pickle=False)
              for k, v in d["constants"].items()}
    return OpaqueNode(base64.b64decode(d["node"]), tuple(d["arg_inputs"]), consts,
                      tuple(d["input_types"]), int(d["output_index"]), int(d["output_type"]),
                      tuple((str(dom), int(v)) for dom, v in d["opsets"]))


def program_data(program: Program) -> dict:
    """A Program as JSON-ready data: its text, tensor shapes, weights and opaque nodes."""
    from apsat.lang.syntax import to_dag_text

    return {"program": to_dag_text(program.outputs),
            "tensor_shapes": {k: list(v) for k, v in program.tensor_shapes.items()},
            "weights": sorted(program.weights),
            "opaque_nodes": {k: _opaque_data(n) for k, n in program.opaque_nodes.items()}}


def program_from_data(d: dict) -> Program:
    """The Program that program_data describes (shapes checked as for any Program)."""
    from apsat.lang.syntax import parse_dag_text

    return Program(parse_dag_text(d["program"]), {k: tuple(v) for k, v in d["tensor_shapes"].items()},
                   {k: _opaque_node(n) for k, n in d["opaque_nodes"].items()}, frozenset(d["weights"]))


def host_steps_text(programs: dict) -> str:
    """The host-step file (see the module doc) of `programs` (step name -> Program)."""
    steps = {name: program_data(p) for name, p in programs.items()}
    return json.dumps({"format": FORMAT, "steps": steps}, indent=1, sort_keys=True) + "\n"


def parse_host_steps(text: str) -> dict:
    """Step name -> Program of a host-step file's text; ApsatError (one line) when it is
    not one this module wrote."""
    try:
        data = json.loads(text)
        if data.get("format") != FORMAT:
            raise ValueError(f"format {data.get('format')!r}, expected {FORMAT!r}")
        return {name: program_from_data(d) for name, d in data["steps"].items()}
    except ApsatError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ApsatError(f"not a host-step file: {type(e).__name__}: {e}") from None


@functools.lru_cache(maxsize=MAX_LOADED)
def _parsed(path: str, mtime_ns: int, size: int) -> dict:
    """The parsed file at `path` as of (mtime_ns, size): a rewritten file is read again."""
    return parse_host_steps(Path(path).read_text())


def load_host_steps(path) -> dict:
    """Step name -> Program of the host-step file at `path` (parsed once per content
    version; at most MAX_LOADED files are kept in memory)."""
    path = Path(path).resolve()
    st = os.stat(path)
    return _parsed(str(path), st.st_mtime_ns, st.st_size)


def _numpy(x):
    """A numpy array of x (a torch tensor, on any device, or anything numpy takes)."""
    if hasattr(x, "detach"):       # float() first: numpy has no bfloat16; host steps compute in float32
        x = x.detach()
        return (x.float() if x.is_floating_point() else x).cpu().numpy()
    return np.asarray(x)


def evaluate_step(program, tensors: dict) -> np.ndarray:
    """The host step's result (float32 numpy) from its tensors (buffer name -> array)."""
    from apsat.lang.evaluate import evaluate

    return evaluate(program, {name: _numpy(x) for name, x in tensors.items()})


def run_host_step(path, name: str, tensors: dict, device):
    """Run host step `name` of the host-step file at `path` on `tensors` (buffer name ->
    torch tensor or array) and return its result as a float32 torch tensor on `device`."""
    import torch

    out = evaluate_step(load_host_steps(path)[name], tensors)
    return torch.from_numpy(np.asarray(out, dtype=np.float32, order="C").copy()).to(device)
