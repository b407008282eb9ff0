"""Models whose weights lie in external data (apsat/frontend/external.py) and exports past
protobuf's 2 GB (apsat/backends/onnx/external.py): weights are mapped, not copied; the
oracle feeds them to onnxruntime where they lie; bad external data is a one-line error;
the export streams large weights into MODEL.onnx.data, checked by path, and equals the
original in onnxruntime (rtol 1e-5, atol 1e-6: the same float32 products, reordered at
most by the merge of Q, K and V). The 2 GB limit itself is lowered here, so the
checks run on a small model; benchmarks/scale.py runs the real sizes."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from models import make_model
from onnx import helper

import apsat
from apsat.errors import ApsatError, ModelError
import apsat.backends.onnx.external as export_external
from apsat.pipeline.zoo import ort_run


def _projections():
    """x (2, 5, 64) projected three ways, y = q * k + v: weights of 128 KiB."""
    rng = np.random.default_rng(0)
    w = {f"w{n}": (rng.standard_normal((64, 512)) * 0.1).astype(np.float32) for n in "qkv"}
    w["b"] = rng.standard_normal(512).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", f"w{n}"], [n]) for n in "qkv"]
    nodes += [helper.make_node("Mul", ["q", "k"], ["qk"]), helper.make_node("Add", ["qk", "v"], ["s"]),
              helper.make_node("Add", ["s", "b"], ["y"])]
    return make_model(nodes, {"x": (2, 5, 64)}, ["y"], w)


def _saved(tmp_path, model=None):
    path = tmp_path / "m.onnx"
    onnx.save_model(model or _projections(), str(path), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="m.onnx.data", size_threshold=0)
    return path


def test_external_weights_are_mapped_not_copied(tmp_path):
    m = apsat.load_onnx(_saved(tmp_path))
    assert set(m.external) == {"wq", "wk", "wv"}                   # "b" (2 KiB) is read in
    assert all(isinstance(m.external[n], np.memmap) and not m.external[n].flags.writeable for n in m.external)
    assert all(np.shares_memory(m.weights[n], m.external[n]) for n in m.external)   # no copy: a view of the mapping
    assert all(not t.raw_data for t in m.onnx.graph.initializer if t.name in m.external)


def test_a_model_with_external_data_verifies_with_its_weights_fed_where_they_lie(tmp_path):
    res = apsat.optimize(_saved(tmp_path), target="gpu", verify=True)
    assert res.report["verification"]["ok"]
    x = {"x": np.random.default_rng(1).standard_normal((2, 5, 64)).astype(np.float32)}
    direct = ort.InferenceSession(str(tmp_path / "m.onnx")).run(None, x)[0]
    np.testing.assert_array_equal(ort_run(res.model.onnx, x, res.model.external)["y"], direct)


@pytest.mark.parametrize("damage,message", [
    (lambda d: d.unlink(), "external data file 'm.onnx.data' not found"),
    (lambda d: d.write_bytes(d.read_bytes()[:1000]), "fewer than the tensor's"),
])
def test_missing_or_short_external_data_is_one_line(tmp_path, damage, message):
    path = _saved(tmp_path)
    damage(tmp_path / "m.onnx.data")
    with pytest.raises(ModelError, match=message) as e:
        apsat.load_onnx(path)
    assert "\n" not in str(e.value) and "initializer 'w" in str(e.value)


def test_external_data_outside_the_model_directory_is_refused(tmp_path):
    model = _projections()
    (tmp_path / "sub").mkdir()
    path = _saved(tmp_path / "sub", model)
    proto = onnx.load(str(path), load_external_data=False)
    for t in proto.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = "../elsewhere.data"
    onnx.save(proto, str(path))
    with pytest.raises(ModelError, match="is not a file beside the model"):
        apsat.load_onnx(path)


def test_an_export_past_the_limit_writes_external_data_checked_by_path(tmp_path, monkeypatch):
    monkeypatch.setattr(export_external, "EXTERNAL_PAST", 1024)   # every model is "past 2 GB" here
    res = apsat.optimize(_saved(tmp_path), target="gpu", verify=False)
    with pytest.raises(ApsatError, match="needs a path"):
        res.to_onnx()
    out = tmp_path / "out" / "optimized.onnx"
    proto = res.to_onnx(out)
    assert (tmp_path / "out" / "optimized.onnx.data").stat().st_size >= 3 * 64 * 512 * 4
    assert out.stat().st_size < 64 * 1024 and res.export_data == str(out) + ".data"
    assert any(t.data_location == onnx.TensorProto.EXTERNAL for t in proto.graph.initializer)
    onnx.checker.check_model(str(out), full_check=True)
    x = {"x": np.random.default_rng(2).standard_normal((2, 5, 64)).astype(np.float32)}
    want = ort.InferenceSession(str(tmp_path / "m.onnx")).run(None, x)[0]
    got = ort.InferenceSession(str(out)).run(None, x)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_the_float64_oracle_is_skipped_past_its_memory_bound(tmp_path, monkeypatch):
    import apsat.pipeline.oracle as oracle

    monkeypatch.setattr(oracle, "FLOAT64_WEIGHT_BYTES", 1024)
    res = apsat.optimize(_saved(tmp_path), target="gpu", verify=True)
    v = res.report["verification"]
    assert v["ok"] and "weights in float64 would take" in str(v)


def test_a_stored_result_is_keyed_by_the_external_data_too(tmp_path):
    """The same .onnx with other weights in its data file is another result."""
    from apsat.pipeline.batch import Task

    path = _saved(tmp_path)
    task = Task(name="m", path=str(path))
    before, model_bytes = task.key(), path.read_bytes()
    data = tmp_path / "m.onnx.data"
    raw = bytearray(data.read_bytes())
    raw[100] ^= 0xFF
    data.write_bytes(bytes(raw))
    assert path.read_bytes() == model_bytes and task.key() != before


def test_a_batch_worker_memory_limit_grows_with_the_model(tmp_path):
    """Default 8192 MiB; for a model whose files pass that, 2 GiB plus three times their
    size (a sparse 5 GiB data file stands for a 1.2B-parameter decoder); a given limit is
    kept."""
    from apsat.pipeline.batch import DEFAULT_MAX_MEMORY_MIB, Task, memory_limit_mib

    small = Task(name="m", path=str(_saved(tmp_path)))
    assert memory_limit_mib(small, None) == DEFAULT_MAX_MEMORY_MIB
    (tmp_path / "big").mkdir()
    big = _saved(tmp_path / "big")
    with open(tmp_path / "big" / "m.onnx.data", "r+b") as f:
        f.truncate(5 * 2**30)
    task = Task(name="big", path=str(big))
    assert memory_limit_mib(task, None) == pytest.approx(2048 + 3 * (5 * 1024 + big.stat().st_size / 2**20))
    assert memory_limit_mib(task, 1000.0) == 1000.0
