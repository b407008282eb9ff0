"""The committed real-zoo (tests/data/real_zoo, made by benchmarks/export_zoo.py) is whole
and self-consistent, without torch: the manifest lists at least 14 models of both families,
each ONNX file exists with its weights embedded, passes onnx.checker at opset 17 and declares
the inputs and outputs the manifest says, the stored inputs are sane (token ids below the
vocabulary, 0/1 attention masks starting with ones), and onnxruntime on the stored inputs
reproduces the stored outputs."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

ZOO = Path(__file__).resolve().parent / "data" / "real_zoo"
MANIFEST = json.loads((ZOO / "manifest.json").read_text())
MODELS = MANIFEST["models"]


def _declared(values) -> dict:
    """name -> (numpy dtype name, shape with dim_param names for symbolic dims)."""
    out = {}
    for v in values:
        t = v.type.tensor_type
        shape = [d.dim_param if d.dim_param else d.dim_value for d in t.shape.dim]
        out[v.name] = (str(onnx.helper.tensor_dtype_to_np_dtype(t.elem_type)), shape)
    return out


def test_manifest_lists_the_zoo():
    """At least 14 models, CNNs and transformers both, one with symbolic dims, all files there."""
    assert len(MODELS) >= 14 and MANIFEST["opset"] == 17
    assert {m["family"] for m in MODELS.values()} == {"cnn", "transformer"}
    assert any("dim_params" in i for m in MODELS.values() for i in m["inputs"])
    for name, m in MODELS.items():
        assert (ZOO / m["file"]).is_file() and (ZOO / f"{name}.npz").is_file(), name
        assert m["bytes"] == (ZOO / m["file"]).stat().st_size < 1 << 20, name
    assert sum(m["bytes"] for m in MODELS.values()) < 8 << 20


@pytest.mark.parametrize("name", list(MODELS))
def test_model_is_valid_and_reproduces_its_outputs(name):
    """The model checks, matches its manifest entry, and onnxruntime on the stored inputs gives
    the stored outputs (rtol 1e-4, atol 1e-5)."""
    entry = MODELS[name]
    model = onnx.load(ZOO / entry["file"], load_external_data=False)
    onnx.checker.check_model(model)
    assert len(model.graph.node) == entry["nodes"]
    assert all(i.data_location != onnx.TensorProto.EXTERNAL for i in model.graph.initializer)
    assert {o.domain: o.version for o in model.opset_import}.get("", 17) == 17
    assert _declared(model.graph.input) == {i["name"]: (i["dtype"], i["shape"]) for i in entry["inputs"]}
    assert _declared(model.graph.output) == {o["name"]: (o["dtype"], o["shape"]) for o in entry["outputs"]}
    stored = np.load(ZOO / f"{name}.npz")
    inputs = {k: stored[k] for k in stored.files if not k.startswith("output:")}
    expected = {k.removeprefix("output:"): stored[k] for k in stored.files if k.startswith("output:")}
    assert set(inputs) == {i["name"] for i in entry["inputs"]}
    assert set(expected) == {o["name"] for o in entry["outputs"]}
    for i in entry["inputs"]:
        assert str(inputs[i["name"]].dtype) == i["dtype"]
        assert list(inputs[i["name"]].shape) == i.get("npz_shape", i["shape"])
    _check_token_inputs(inputs, entry["config"])
    got = dict(zip(expected, _session(model).run(list(expected), inputs)))
    for key, want in expected.items():
        assert np.isfinite(want).all() and np.abs(want).max() > 0, key
        np.testing.assert_allclose(got[key], want, rtol=1e-4, atol=1e-5, err_msg=f"{name}:{key}")


def _session(model) -> ort.InferenceSession:
    """A one-thread CPU onnxruntime session on model with graph optimisations off."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("name", [n for n, m in MODELS.items()
                                  if any("dim_params" in i for i in m["inputs"])])
def test_symbolic_model_runs_at_another_shape(name):
    """A text model with symbolic batch_size/sequence_length, run on a batch of two copies of
    its stored tokens cut to the attended prefix, gives the stored outputs on that prefix
    (the padded positions were masked out as keys)."""
    stored = np.load(ZOO / f"{name}.npz")
    keep = int(stored["attention_mask"].sum())
    feeds = {k: np.repeat(stored[k][:, :keep], 2, axis=0) for k in ("input_ids", "attention_mask")}
    (out,) = [o["name"] for o in MODELS[name]["outputs"]]
    got = _session(onnx.load(ZOO / MODELS[name]["file"])).run([out], feeds)[0]
    assert got.shape[:2] == (2, keep)
    for row in got:
        np.testing.assert_allclose(row, stored[f"output:{out}"][0, :keep], rtol=1e-4, atol=1e-5)


def _check_token_inputs(inputs: dict, config: dict) -> None:
    """Token ids lie in [0, vocab_size); attention masks are 0/1 with the first positions 1."""
    if "input_ids" in inputs:
        ids = inputs["input_ids"]
        assert ids.min() >= 0 and ids.max() < config["vocab_size"]
    if "attention_mask" in inputs:
        mask = inputs["attention_mask"]
        assert set(np.unique(mask)) <= {0, 1} and (mask[:, :2] == 1).all()
