"""Whole models through `optimize(...).to_onnx()`: a sample of the light and real zoos
(the benchmark, benchmarks/onnx_out.py, runs all 23). Each export passes onnx.checker's
full check (inside export_onnx), keeps the original's input and output names, element
types and (fixed) dims, and equals the original in onnxruntime on the same inputs at
apsat.verify's tolerances (rtol 1e-4, atol 1e-5 x the output's scale). The op types say
the fusion survived: convs with their activations are FusedConv, each attention is one
Attention node, and no sliding window was gathered element by element."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from apsat.pipeline.optimize import optimize
from apsat.pipeline.verify import compare
from apsat.pipeline.zoo import light_model_paths, ort_run, random_inputs, randomize_weights

REAL = Path(__file__).resolve().parents[2] / "data" / "real_zoo"


def _load(name: str):
    """(original ModelProto, OptimizeResult, inputs) for a light or real-zoo model."""
    light = [p for p in light_model_paths() if p.stem == f"light_{name}"]
    if light:
        proto = randomize_weights(onnx.load(str(light[0])), seed=0)
        res = optimize(proto, target="gpu", verify=False)
        return proto, res, random_inputs(res.model, 0)
    with np.load(REAL / f"{name}.npz") as data:
        inputs = {k: data[k] for k in data.files if not k.startswith("output:")}
    res = optimize(REAL / f"{name}.onnx", target="gpu", verify=False,
                   input_shapes={k: v.shape for k, v in inputs.items()})
    return onnx.load(str(REAL / f"{name}.onnx")), res, inputs


def _signature(values) -> list:
    return [(v.name, v.type.tensor_type.elem_type) for v in values]


@pytest.mark.parametrize("name", ["squeezenet", "resnet", "mobilenet_v3", "bert"])
def test_export_keeps_the_interface_and_equals_the_original(name):
    original, res, inputs = _load(name)
    exported = res.to_onnx()
    assert _signature(exported.graph.input) == [s for s in _signature(original.graph.input)
                                                if s[0] in dict(_signature(exported.graph.input))]
    assert _signature(exported.graph.output) == _signature(original.graph.output)
    for v in exported.graph.input:
        assert tuple(d.dim_value for d in v.type.tensor_type.shape.dim) == inputs[v.name].shape
    sess = ort.InferenceSession(exported.SerializeToString(), providers=["CPUExecutionProvider"])
    got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, inputs)))
    want = ort_run(original, inputs)
    result = compare({k: want[k] for k in got}, got)
    assert result.ok, result
    meta = {p.key: p.value for p in exported.metadata_props}
    assert meta["apsat_target"] == "gpu" and json.loads(meta["apsat_input_dims"])
    assert not any("window_index" in i.name for i in exported.graph.initializer)
    assert len(exported.graph.node) < len(original.graph.node)


def test_conv_activations_and_attention_keep_their_fused_forms():
    _, res, _ = _load("squeezenet")
    ops = Counter(n.op_type for n in res.to_onnx().graph.node)
    assert ops["FusedConv"] == 26 and ops["Conv"] == 0 and ops["Relu"] == 0, ops
    _, res, _ = _load("bert")
    ops = Counter(n.op_type for n in res.to_onnx().graph.node)
    assert ops["Attention"] == 2 and ops["Softmax"] == 0, ops     # two layers, one node each
    # q, k, v as the projections wrote them (3-D Attention), the 1/sqrt(d) in its scale
    assert ops["Transpose"] == 0 and ops["Reshape"] <= 1 and ops["Mul"] == 0, ops


def test_depthwise_convs_read_their_pads_and_residuals_fuse():
    # MobileNet v3: each depthwise conv takes its padding as pads (no Pad node, no
    # Reshape to and from (N, G, C/G, H, W)); its bias and hard-swish ride along
    _, res, _ = _load("mobilenet_v3")
    ops = Counter(n.op_type for n in res.to_onnx().graph.node)
    assert ops["Pad"] == 0 and ops["Reshape"] <= 1 and ops["Add"] == 0, ops
    # ResNet: conv + bias + residual add + relu is one FusedConv with the residual as Z
    _, res, _ = _load("resnet")
    nodes = res.to_onnx().graph.node
    assert not any(n.op_type in ("Add", "Relu") for n in nodes)
    assert any(n.op_type == "FusedConv" and len(n.input) == 4 for n in nodes)


def test_cli_writes_the_onnx_file_and_reports_it(tmp_path, capsys):
    from apsat.cli import main

    model = next(p for p in light_model_paths() if "squeezenet" in p.name)
    out = tmp_path / "sq.onnx"
    assert main(["optimize", str(model), "--out", str(tmp_path / "o"), "--onnx-out", str(out)]) == 0
    onnx.checker.check_model(onnx.load(str(out)), full_check=True)
    report = json.loads((tmp_path / "o" / model.stem / "report.json").read_text())
    assert report["onnx_out"]["path"] == str(out) and report["onnx_out"]["nodes"] == len(onnx.load(str(out)).graph.node)


def test_zoo_task_writes_optimized_onnx(tmp_path):
    from apsat.pipeline.batch import Task, run_task

    model = next(p for p in light_model_paths() if "squeezenet" in p.name)
    row = run_task(Task("squeezenet", str(model), out=str(tmp_path), randomize=True, onnx_out=True,
                        options={"verify": False}))
    assert row["status"] == "ok", row
    onnx.checker.check_model(onnx.load(str(tmp_path / "squeezenet" / "optimized.onnx")), full_check=True)
