"""Weight-only work on the GPU target: BatchNorm folded into a convolution's weights runs
in the runner's `prepare` step, once, and the per-inference steps equal onnxruntime
(apsat.pipeline.verify's tolerances) with or without the prepared buffers passed in."""
from __future__ import annotations

import models
import pytest

import apsat
from apsat.backends.gpu.lower import lower
from apsat.backends.gpu.runner import load_runner, write_sources
from apsat.backends.gpu.write import write_kernels
from apsat.pipeline.verify import compare
from apsat.pipeline.zoo import ort_run, random_inputs


@pytest.fixture(scope="module")
def folded():
    res = apsat.optimize(apsat.load_onnx(models.conv_batchnorm()), target="gpu", verify=False)
    assert res.program.op_counts().get("fused-dot-bias-act", 0) == 1
    return res


def test_folding_kernels_are_prepare_steps(folded):
    graph = lower(folded.program)
    assert graph.weights == frozenset(folded.model.weights)
    prepare = {s.name for s in graph.prepare_steps}
    per_call = [s for s in graph.steps if s.name not in prepare]
    # the folding arithmetic (1 / sqrt(var + eps) * scale, times the weights) is prepared;
    # per call: the conv (its epilogue finishes the 8-element bias) and the output's copy
    assert len(prepare) == 2 and "sqrt" in str([s.covers for s in graph.prepare_steps])
    assert [s.kind for s in per_call] == ["gemm", "elementwise"]
    # every prepare step reads weights or other prepare steps' results only
    inputs = {b.name for b in graph.inputs}
    assert all(r not in inputs or graph.buffers[r].tensor in graph.weights
               for s in graph.prepare_steps for r in s.reads)


def test_report_counts_prepare_apart(folded, tmp_path):
    rep = write_kernels(folded.program, tmp_path, compile=False)
    once = [k for k in rep["kernels"] if k["prepare"]]
    assert once and rep["totals"]["prepare_steps"] == len(once)
    per_call = [k for k in rep["kernels"] if not k["prepare"]]
    assert rep["totals"]["modelled_us"] == pytest.approx(sum(k["modelled_us"] for k in per_call))
    assert rep["totals"]["prepare_us"] == pytest.approx(sum(k["modelled_us"] for k in once))


def test_prepared_run_matches_onnxruntime(folded, triton_run):
    pytest.importorskip("torch")
    runner = load_runner(write_sources(lower(folded.program)))
    inputs = random_inputs(folded.model, 0)
    want = ort_run(folded.model.onnx, inputs)
    prepared = runner.prepare(folded.model.weights)
    for feeds in ({**folded.model.weights, **inputs}, inputs):        # weights not needed again
        got = runner.run(feeds, prepared=prepared)
        v = compare(want, {k: t.cpu().numpy() for k, t in got.items()})
        assert v.ok, v
    got = runner.run({**folded.model.weights, **inputs})              # prepare called by run
    assert compare(want, {k: t.cpu().numpy() for k, t in got.items()}).ok
    with pytest.raises(KeyError, match="missing input tensors"):
        runner.run(folded.model.weights, prepared=prepared)


def test_batchnorm_and_a_second_affine_fold_into_prepared_weights(triton_run):
    """Conv -> BatchNorm -> per-channel Mul/Add -> ReLU (light Inception-v2's pattern): the
    two scales and shifts merge and fold (ruleset affine), the merging arithmetic runs in
    prepare, and one gemm kernel per call equals onnxruntime."""
    pytest.importorskip("torch")
    res = apsat.optimize(apsat.load_onnx(models.conv_batchnorm_scale()), target="gpu", verify=False)
    assert res.program.op_counts().get("fused-dot-bias-act", 0) == 1
    graph = lower(res.program)
    prepare = {s.name for s in graph.prepare_steps}
    assert [s.kind for s in graph.steps if s.name not in prepare][0] == "gemm"
    runner = load_runner(write_sources(graph))
    inputs = random_inputs(res.model, 0)
    got = runner.run({**res.model.weights, **inputs})
    assert compare(ort_run(res.model.onnx, inputs), {k: t.cpu().numpy() for k, t in got.items()}).ok
