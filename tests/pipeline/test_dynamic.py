"""Symbolic dims end to end: a model exported with dynamic batch and sequence optimises at
representative sizes, its program holds at other sizes (checked against onnxruntime), and
its ONNX export keeps the original's symbolic dims and equals the original at sizes it was
never built at, batch 3 and sequence lengths 5 and 40 among them.

Models: tests/data/dynamic (benchmarks/export_dynamic.py: BERT, DistilBERT and GPT-2 (causal) with
64 positions, a ResNet-18 shape at 1/8 width), seeded random weights. Tolerance: the
export against onnxruntime on the original, max |difference| <= 1e-4 * (1 + max |value|).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from apsat.pipeline.optimize import optimize

DATA = Path(__file__).resolve().parent.parent / "data" / "dynamic"
TEXT_SIZES = [(3, 5), (3, 40), (1, 31), (2, 64)]


def _run(path, feeds):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(str(path) if not isinstance(path, bytes) else path, so,
                                providers=["CPUExecutionProvider"]).run(None, feeds)


def _feeds(batch, seq, rng):
    return {"input_ids": rng.integers(0, 64, (batch, seq)).astype(np.int64),
            "attention_mask": (rng.random((batch, seq)) < 0.8).astype(np.int64)}


def _dims(vi):
    return [d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim]


@pytest.mark.parametrize("name", ["bert", "distilbert", "gpt2"])
def test_encoder_export_keeps_batch_and_sequence_symbolic(name, tmp_path):
    res = optimize(DATA / f"{name}.onnx", target="gpu", representatives={"sequence_length": 31})
    dyn = res.report["dynamic"]
    assert dyn["general"] and res.report["verification"]["ok"]
    checked = {tuple(c["sizes"].values()) for c in dyn["checks"] if c.get("ok")}
    assert {(1, 31), (4, 31), (5, 5), (5, 40)} <= checked     # batch 5 and seq 31 are built
    proto = res.to_onnx(tmp_path / "out.onnx")
    assert [_dims(i) for i in proto.graph.input] == [["batch_size", "sequence_length"]] * 2
    assert _dims(proto.graph.output[0]) == ["batch_size", "sequence_length", 32]
    assert "Attention" in {n.op_type for n in proto.graph.node}       # fused, and still general
    rng = np.random.default_rng(0)
    for batch, seq in TEXT_SIZES:
        feeds = _feeds(batch, seq, rng)
        (want,), (got,) = _run(DATA / f"{name}.onnx", feeds), _run(tmp_path / "out.onnx", feeds)
        assert got.shape == (batch, seq, 32)
        assert np.max(np.abs(got - want)) <= 1e-4 * (1 + np.max(np.abs(want))), (batch, seq)


def test_resnet_export_keeps_a_symbolic_batch(tmp_path):
    res = optimize(DATA / "resnet.onnx", target="gpu")
    assert res.report["dynamic"]["general"] and res.model.inputs["pixel_values"] == (5, 3, 32, 32)
    proto = res.to_onnx(tmp_path / "out.onnx")
    assert _dims(proto.graph.input[0]) == ["batch_size", 3, 32, 32]
    assert _dims(proto.graph.output[0]) == ["batch_size", 10]
    rng = np.random.default_rng(1)
    for batch in (1, 3, 4, 7):
        x = {"pixel_values": rng.standard_normal((batch, 3, 32, 32)).astype(np.float32)}
        (want,), (got,) = _run(DATA / "resnet.onnx", x), _run(tmp_path / "out.onnx", x)
        assert np.max(np.abs(got - want)) <= 1e-4 * (1 + np.max(np.abs(want))), batch


def test_a_size_the_original_does_not_run_at_is_skipped_with_the_reason():
    res = optimize(DATA / "distilbert.onnx", target="gpu", representatives={"sequence_length": 31})
    res2 = optimize(DATA / "distilbert.onnx", target="gpu", representatives={"sequence_length": 61})
    assert res.report["dynamic"]["general"] and res2.report["dynamic"]["general"]
    # 64 positions: the program sliced to the sequence holds at 40 but not past 64
    from apsat.pipeline.dynamic import model_at
    from apsat.errors import ShapeError

    with pytest.raises(ShapeError, match="access-slice"):
        model_at(res.model, res.general, {"batch_size": 2, "sequence_length": 65})


def test_input_shape_still_fixes_a_symbolic_dim():
    res = optimize(DATA / "resnet.onnx", target="gpu", input_shapes={"pixel_values": (2, 3, 32, 32)},
                   verify=False)
    assert "dynamic" not in res.report and res.model.inputs["pixel_values"] == (2, 3, 32, 32)
    assert _dims(res.to_onnx().graph.input[0]) == [2, 3, 32, 32]


def test_a_default_past_the_models_range_is_lowered_and_a_given_one_refused():
    """64 positions: the default sequence 127 does not import; 61 does, and says why."""
    from apsat.errors import ModelError
    from apsat.frontend.importer import load_onnx

    m = load_onnx(DATA / "distilbert.onnx")
    assert m.inputs["input_ids"] == (5, 61) and "does not import" in m.notices[-1]
    with pytest.raises(ModelError, match=r"built at batch_size=5, sequence_length=127; --representative"):
        load_onnx(DATA / "distilbert.onnx", representatives={"sequence_length": 127})


def test_real_zoo_dynamic_model_optimises_with_no_input_shape():
    """distilbert_dynamic has 32 positions: built at 29; sequence 40 is past the original."""
    res = optimize(DATA.parent / "real_zoo" / "distilbert_dynamic.onnx", target="gpu")
    dyn = res.report["dynamic"]
    assert dyn["general"] and res.report["verification"]["ok"]
    assert res.model.inputs["input_ids"] == (5, 29)
    by_size = {tuple(c["sizes"].values()): c for c in dyn["checks"]}
    assert by_size[(5, 5)]["ok"] and by_size[(1, 29)]["ok"] and by_size[(4, 29)]["ok"]
    assert "does not hold" in by_size[(5, 40)]["skipped"] or "does not run" in by_size[(5, 40)]["skipped"]
    proto = res.to_onnx()
    rng = np.random.default_rng(3)
    for batch, seq in [(1, 5), (3, 17), (2, 32)]:
        feeds = {"input_ids": rng.integers(0, 128, (batch, seq)).astype(np.int64),
                 "attention_mask": (rng.random((batch, seq)) < 0.8).astype(np.int64)}
        (want,), (got,) = _run(DATA.parent / "real_zoo" / "distilbert_dynamic.onnx", feeds), \
            _run(proto.SerializeToString(), feeds)
        assert np.max(np.abs(got - want)) <= 1e-4 * (1 + np.max(np.abs(want))), (batch, seq)


def test_decoder_with_a_kv_cache_keeps_the_past_length_symbolic(tmp_path):
    """GPT-2 with past keys and values as inputs, the mask over `past + sequence`: general,
    one attention kernel a layer, checked at two past lengths, the export equal to the
    original at past lengths 0, 1, 20 and 62 (positions up to 63 of 64)."""
    import collections

    res = optimize(DATA / "gpt2_kv.onnx", target="gpu")
    dyn = res.report["dynamic"]
    assert dyn["general"] and res.report["verification"]["ok"]
    pasts = {c["sizes"]["past_sequence_length"] for c in dyn["checks"] if c.get("ok")}
    assert {1, 9} <= pasts
    kinds = collections.Counter(k["kind"] for k in res.report["gpu_kernels"]["kernels"])
    assert kinds["attention"] == 2
    proto = res.to_onnx(tmp_path / "out.onnx")
    assert _dims(proto.graph.input[1]) == ["batch_size", "past_sequence_length + sequence_length"]
    assert _dims(proto.graph.output[1]) == ["batch_size", 2, "past_sequence_length + sequence_length", 16]
    rng = np.random.default_rng(2)
    for batch, seq, past in [(1, 1, 9), (3, 5, 1), (3, 40, 20), (2, 1, 62), (1, 7, 0)]:
        feeds = _feeds(batch, seq, rng)
        feeds["attention_mask"] = (rng.random((batch, past + seq)) < 0.9).astype(np.int64)
        for n in ("past_key_0", "past_value_0", "past_key_1", "past_value_1"):
            feeds[n] = rng.standard_normal((batch, 2, past, 16)).astype(np.float32)
        want, got = _run(DATA / "gpt2_kv.onnx", feeds), _run(tmp_path / "out.onnx", feeds)
        for w, g in zip(want, got):
            assert g.shape == w.shape and np.max(np.abs(g - w)) <= 1e-4 * (1 + np.max(np.abs(w))), (batch, seq, past)


@pytest.mark.parametrize("dim, kept, built", [("batch size", "batch size", 5), ("N-1", "N-1", 31),
                                              ("2*N", 10, 10)])
def test_dim_params_as_exporters_spell_them(dim, kept, built, tmp_path):
    """A name with a space or a dash is one symbol; an expression of a symbol that no input
    declares alone builds, and its export fixes the size, saying so (report onnx_out)."""
    import json

    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [dim, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [dim, 3])
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    res = optimize(model, target="gpu")
    assert res.model.inputs == {"x": (built, 3)} and res.report["verification"]["ok"]
    report = json.loads(res.write(tmp_path, compile_kernels=False, onnx_out=True).read_text())
    assert _dims(onnx.load(str(tmp_path / "optimized.onnx")).graph.input[0]) == [kept, 3]
    assert ("dynamic" in report["onnx_out"]) == (kept != dim)
