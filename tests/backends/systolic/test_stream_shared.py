"""One-row products split between the array and the vector unit (targets.vector_share,
backends/systolic/shared.py): the stream against the reference interpreter, against the
model's cycles, and what it reads. Tolerances: sa_helpers (float32, sums re-ordered)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from sa_helpers import run_both, small_acc

import apsat
from apsat.backends import systolic as sab
from apsat.backends.systolic.isa import Vec
from apsat.targets.accelerator import PRESETS
from apsat.targets.vector_share import vector_share

FLEX32 = dataclasses.replace(PRESETS["32x32"], dataflow="flex")
PLAIN = ("(fused-dot-bias (access (access-tensor a) 1) (access (access-tensor w) 1) "
         "(access (access-tensor bias) 1))")
RELU = PLAIN.replace("(fused-dot-bias ", "(fused-dot-bias-act relu ")


def _shapes(k, n):
    return {"a": (1, k), "w": (n, k), "bias": (n,)}


def _dots(stream):
    return [i for i in stream.main if isinstance(i, Vec) and i.mode in ("dot", "dotacc")]


@pytest.mark.parametrize("k", [120, 300], ids=["one-chunk", "two-k-chunks"])
@pytest.mark.parametrize("text", [PLAIN, RELU], ids=["bias", "relu"])
def test_a_shared_product_matches_the_reference(k, text):
    # an 8x8 array with 1 kB scratchpads: slots of 256 words, so a 300-word row goes in
    # two k-chunks (VEC dot, then dotacc)
    acc = small_acc("flex")
    n = 64
    share = vector_share(acc, 1, k, n, 1 if text == RELU else 0)
    assert share is not None and 0 < share.cols < n
    stream, got, want = run_both(text, _shapes(k, n), acc)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    dots = _dots(stream)
    assert sum(d.srcs[1].region.size for d in dots) == k * share.cols
    assert ("dotacc" in {d.mode for d in dots}) == (k > 256)
    (g,) = [g for g in stream.groups.values() if g.kind == "gemm"]
    assert f"vector unit: {share.cols} of {n} columns" in g.label
    assert sab.parse(sab.to_text(stream)).main == stream.main


@pytest.mark.parametrize("dataflow", ["os", "ws", "is"])
def test_a_fixed_array_runs_the_whole_product(dataflow):
    stream, got, want = run_both(RELU, _shapes(120, 64), small_acc(dataflow))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    assert _dots(stream) == []


@pytest.mark.parametrize("k,n", [(4096, 1000), (9216, 4096)])
def test_the_stream_takes_the_model_s_cycles(k, n):
    # the two parts run at once: the stream's total within 1% of the slower part's model
    prog = apsat.parse(RELU, _shapes(k, n))
    rep = sab.cycles(sab.compile(prog, FLEX32, weights=["w", "bias"]))
    share = vector_share(FLEX32, 1, k, n, 1)
    assert share.total_cycles <= rep["total_cycles"] <= 1.01 * share.total_cycles
    assert rep["vector_macs"] == k * share.cols and rep["macs"] == k * (n - share.cols)
    assert rep["busy"]["vector"] <= share.vector_cycles
    # the weights, the bias and the input row once (the vector part reads the array part's)
    assert rep["dram"]["reads"] == k * n + n + k


def test_the_report_and_the_text_name_the_shared_columns():
    k, n = 4096, 1000
    stream = sab.compile(apsat.parse(RELU, _shapes(k, n)), FLEX32, weights=["w", "bias"])
    share = vector_share(FLEX32, 1, k, n, 1)
    (g,) = [g for g in sab.cycles(stream)["groups"] if g["kind"] == "gemm"]
    # the report's model figures are the array part's: its span matches them
    assert g["vector_cols"] == share.cols and g["gemm_cost_total"] == share.array.total_cycles
    assert abs(g["array_span"] - g["gemm_cost_total"]) <= 0.01 * g["gemm_cost_total"]
    again = sab.parse(sab.to_text(stream))
    assert [x.vector_cols for x in again.groups.values()] == [x.vector_cols for x in stream.groups.values()]
