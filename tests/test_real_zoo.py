"""The real-zoo set (tests/data/real_zoo: modern CNNs and transformers exported from
torchvision and transformers, see benchmarks/export_zoo.py) imports, optimises and
verifies on both targets: the reference interpreter, and on systolic:32x32 the simulator,
equal onnxruntime on the set's stored inputs (rtol 1e-4, atol 1e-5 x scale:
apsat.pipeline.verify). No model keeps an opaque call or a host step: embedding lookups,
relative-position biases and position ids are gathers of the language. The symbolic model runs
with its dims fixed to 1 (the default, with notices) and to another shape."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from backend_cases import assert_verified_without_host_steps

import apsat
from apsat.pipeline.verify import compare
from apsat.pipeline.zoo import ort_run

ZOO = Path(__file__).resolve().parent / "data" / "real_zoo"
MODELS = sorted(json.loads((ZOO / "manifest.json").read_text())["models"])


def stored(name: str) -> tuple[dict, dict]:
    """(inputs, onnxruntime's outputs) stored with the model."""
    with np.load(ZOO / f"{name}.npz") as data:
        ins = {k: data[k] for k in data.files if not k.startswith("output:")}
        outs = {k[len("output:"):]: data[k] for k in data.files if k.startswith("output:")}
    return ins, outs


@pytest.mark.slow
@pytest.mark.parametrize("target", ["gpu", "systolic:32x32"])
@pytest.mark.parametrize("name", MODELS)
def test_real_zoo_model_verifies(name, target):
    inputs, _ = stored(name)
    res = apsat.optimize(ZOO / f"{name}.onnx", target=target, inputs=inputs,
                         input_shapes={k: v.shape for k, v in inputs.items()})
    assert_verified_without_host_steps(res.report, target)


def test_symbolic_model_keeps_its_symbols_and_takes_other_shapes():
    """distilbert_dynamic carries batch_size and sequence_length: they stay symbolic, built
    at batch 5 and, its position table having 32 rows, sequence 29 (127 and 61 do not
    import: a notice says so), or at what --input-shape says; both runs equal onnxruntime."""
    path = ZOO / "distilbert_dynamic.onnx"
    model = apsat.load_onnx(path)
    assert set(model.inputs.values()) == {(5, 29)} and set(model.symbols) == {"batch_size", "sequence_length"}
    assert "does not import with its symbolic dims at batch_size=5, sequence_length=127" in model.notices[-1]
    model = apsat.load_onnx(path, input_shapes={"input_ids": (2, 5)})
    assert model.inputs == {"input_ids": (2, 5), "attention_mask": (2, 5)}
    rng = np.random.default_rng(0)
    inputs = {"input_ids": rng.integers(0, 128, (2, 5)), "attention_mask": np.ones((2, 5), np.int64)}
    want = ort_run(model.onnx, inputs)
    assert compare(want, model.run(inputs)).ok


def test_stored_outputs_match_the_imported_program():
    """A fast cross-check without optimising: the imported program of a transformer with
    masks and of a modern CNN on the stored inputs equals the stored outputs."""
    for name in ("bert", "mobilenet_v3"):
        inputs, outputs = stored(name)
        model = apsat.load_onnx(ZOO / f"{name}.onnx")
        assert compare(outputs, model.run(inputs)).ok, name
