"""write_kernels: the files it writes, the figures it returns, and the generated runner."""
from __future__ import annotations

import json

import models
import numpy as np
import pytest
from onnx import helper

import apsat
from apsat.backends.gpu import cuda
from apsat.backends.gpu.write import write_kernels
from apsat.pipeline.zoo import ort_run, random_inputs


@pytest.fixture(scope="module")
def mlp():
    return apsat.optimize(models.mlp3(), target="gpu", verify=False)


def test_sources_and_figures(mlp, tmp_path):
    rep = write_kernels(mlp.program, tmp_path, compile=False)
    assert (tmp_path / "runner.py").exists() and json.loads((tmp_path / "kernels.json").read_text()) == \
        json.loads(json.dumps(rep, default=str))
    assert [k["name"] for k in rep["kernels"]] == ["k00_gemm_relu", "k01_gemm_relu", "k02_gemm_fused_dot_bias"]
    first = rep["kernels"][0]
    assert first["kind"] == "gemm" and first["covers"] == ["fused-dot-bias-act relu"]
    # 5 x 20 @ 20 x 37: 2 flops a multiply-add, plus bias and relu per output
    assert first["flops"] == 2 * 5 * 20 * 37 + 2 * 5 * 37
    assert first["bytes"] == 4 * (5 * 20 + 37 * 20 + 37 + 5 * 37)
    assert first["modelled_us"] >= 3.0        # the launch, at least
    assert {"BM", "BN", "BK"} <= set(first["tiles"])
    for k in rep["kernels"]:
        assert (tmp_path / k["triton"]["source"]).exists() and (tmp_path / k["cuda"]["source"]).exists()
        assert k["cuda"]["cubin"] is None and k["triton"]["cubin"] is None
    assert rep["totals"]["kernels"] == 3 and rep["totals"]["host_steps"] == 0
    assert rep["totals"]["modelled_us"] == pytest.approx(sum(k["modelled_us"] for k in rep["kernels"]))


@pytest.mark.skipif(cuda.nvcc_path() is None, reason="nvcc is not on PATH")
def test_compiled_figures(mlp, tmp_path):
    rep = write_kernels(mlp.program, tmp_path, compile={"cuda"})
    for k in rep["kernels"]:
        assert k["cuda"]["error"] is None and (tmp_path / k["cuda"]["cubin"]).exists()
        assert k["cuda"]["registers"] > 0 and k["cuda"]["shared_bytes"] > 0
        assert k["triton"]["cubin"] is None          # not asked for


def test_host_steps_are_reported(tmp_path):
    w = (np.random.default_rng(0).standard_normal((19, 23)) * 0.3).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"]), helper.make_node("Atan", ["m"], ["c"]),
             helper.make_node("Relu", ["c"], ["y"])]
    res = apsat.optimize(models.make_model(nodes, {"x": (5, 19)}, ["y"], {"W": w}), target="gpu", verify=False)
    rep = write_kernels(res.program, tmp_path, compile=False)
    (host,) = rep["host_steps"]
    assert host["name"] == "h01_opaque_atan" and host["op"] == "opaque Atan" and host["runner"] == "onnxruntime"
    assert host["reads"] == [rep["kernels"][0]["out"]] and host["modelled_us"] > 6.0
    assert (tmp_path / "host_steps.json").exists() and not list(tmp_path.rglob("*.pkl"))


def test_written_runner_runs(mlp, tmp_path, triton_run):
    """The runner module in DIR, imported on its own, equals onnxruntime."""
    from apsat.backends.gpu.runner import load_runner
    from apsat.pipeline.verify import compare

    write_kernels(mlp.program, tmp_path, compile=False)
    inputs = random_inputs(mlp.model, 0)
    got = load_runner(tmp_path).run({**mlp.model.weights, **inputs})
    assert compare(ort_run(mlp.model.onnx, inputs), {"y": got["y"].numpy()}).ok
    with pytest.raises(KeyError, match="missing input tensors: x"):
        load_runner(tmp_path).run(dict(mlp.model.weights))
