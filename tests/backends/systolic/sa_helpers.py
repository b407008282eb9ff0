"""Shared helpers for the systolic backend tests: small accelerators, programs, tensors.

Tolerances (float32 throughout): the simulator adds a GEMM's k-chunks and, under ws/is,
its per-row-fold partial sums in a different order than the reference interpreter's one
matmul, so products of a few hundred terms differ by a few ulps: rtol 1e-5 / atol 1e-5
for the small programs here (values of order 1..30). Against onnxruntime on whole models
the project's verification tolerance applies (apsat.pipeline.verify: rtol 1e-4, atol 1e-5 times
the output's scale), for the reasons given there.
"""
from __future__ import annotations

import numpy as np

import apsat
from apsat.backends import systolic as sab
from apsat.lang.evaluate import evaluate
from apsat.targets.accelerator import Accelerator

RTOL, ATOL = 1e-5, 1e-5
DATAFLOWS = ("os", "ws", "is")


def small_acc(dataflow="os", rows=8, cols=8, kb=1, bw=16.0, lanes=8, **kw) -> Accelerator:
    """A small array with tiny scratchpads, so even small programs are tiled, chunked and
    double buffered."""
    return Accelerator(rows, cols, dataflow, kw.get("ifmap_kb", kb), kw.get("filter_kb", kb),
                       kw.get("ofmap_kb", kb), bw, lanes, f"test-{dataflow}")


def tensors_for(prog, seed=0) -> dict:
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(d).astype(np.float32) for n, d in prog.tensor_shapes.items()}


def run_both(text: str, shapes: dict, acc: Accelerator, seed=0, weights=(), **opts):
    """Parse, compile, simulate; returns (stream, simulated, reference) for output "out"."""
    prog = apsat.parse(text, shapes=shapes)
    t = tensors_for(prog, seed)
    stream = sab.compile(prog, acc, weights=weights, **opts)
    got = sab.simulate(stream, t)["out"]
    return stream, got, evaluate(prog, t)


def assert_close(got, want):
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


def conv_text(c, r, s, k_out, stride=1, pad=0):
    """Glenside's im2col + systolic form of a conv over x (1, c, h, w) with w (k_out, c, r,
    s), as the rules produce it (`systolic-array` over flattened windows)."""
    x = "(access-tensor x)"
    if pad:
        x = f"(access-pad (access-pad {x} zero-padding 2 {pad} {pad}) zero-padding 3 {pad} {pad})"
    return (f"(systolic-array {c * r * s} {k_out} (access-flatten (access-squeeze (access-windows "
            f"(access {x} 1) (shape {c} {r} {s}) (shape 1 {stride} {stride})) 1)) "
            f"(access (access-transpose (access-flatten (access (access-tensor w) 1)) (list 1 0)) 0))")
