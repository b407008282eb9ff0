"""Nothing the gpu backend executes comes from a shared place, and its caches are bounded.

The runner folder run_kernels imports from lives in the per-user cache (XDG_CACHE_HOME
here), mode 0700; one that someone else owns or can write is refused. Host steps are data
(program text, ONNX node bytes, .npy constants), never pickles, and round-trip to the
same numbers. Running kernels under the Triton interpreter leaves os.environ alone, and
so does importing apsat. The onnxruntime session cache, the parsed host-step files, the
imported runners and the cache folders are bounded."""
from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import models
import numpy as np
import pytest
from gpu_cases import KERNELS
from onnx import TensorProto, helper

import apsat
from apsat.backends.gpu import files, host, runner
from apsat.backends.gpu.lower import lower
from apsat.errors import ApsatError
from apsat.lang.program import OpaqueNode, Program
from apsat.lang.syntax import parse_term, to_dag_text

APSAT = Path(apsat.__file__).resolve().parent


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh XDG_CACHE_HOME: platformdirs' user cache root on Linux."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "apsat"


def _graph(case="gemm-relu", tiles=None):
    text, shapes, _ = KERNELS[case]
    return lower(apsat.parse(text, shapes), tiles)


def _atan_result():
    """MatMul, Atan (no lowering: an opaque host step run by onnxruntime), Relu."""
    w = (np.random.default_rng(0).standard_normal((19, 23)) * 0.3).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"]), helper.make_node("Atan", ["m"], ["c"]),
             helper.make_node("Relu", ["c"], ["y"])]
    return apsat.optimize(models.make_model(nodes, {"x": (5, 19)}, ["y"], {"W": w}), target="gpu",
                          verify=False)


# ---- the runner's folder ---------------------------------------------------------------------

def test_runner_folder_is_private_under_the_user_cache(cache):
    d = runner.write_sources(_graph())
    assert d.parent == cache / "gpu" and (d / "runner.py").exists()
    for folder in (cache, cache / "gpu", d, d / "kernels"):
        assert stat.S_IMODE(folder.stat().st_mode) & 0o077 == 0, folder
    assert runner.write_sources(_graph()) == d           # same content: same folder, reused


@pytest.mark.parametrize("level", ["apsat", "apsat/gpu"])
def test_world_writable_cache_folder_is_refused(cache, level):
    folder = cache.parent / level
    folder.mkdir(parents=True)
    folder.chmod(0o777)
    with pytest.raises(files.UnsafeDirectoryError, match="writable by group or others") as e:
        runner.write_sources(_graph())
    assert "\n" not in str(e.value) and isinstance(e.value, ApsatError)
    assert not list(folder.rglob("runner.py"))


def test_cache_folder_owned_by_another_user_is_refused(cache, monkeypatch):
    cache.mkdir(parents=True, mode=0o700)
    monkeypatch.setattr(files, "_uid", lambda: os.getuid() + 4242)   # as seen by someone else
    with pytest.raises(files.UnsafeDirectoryError, match="owned by uid .* not by you"):
        runner.write_sources(_graph())


def test_symbolic_link_to_a_shared_folder_is_refused(cache, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    cache.mkdir(parents=True)
    (cache / "gpu").symlink_to(shared)
    with pytest.raises(files.UnsafeDirectoryError, match="writable by group or others"):
        runner.write_sources(_graph())


def test_cache_folders_are_pruned_to_the_most_recent(cache, monkeypatch):
    monkeypatch.setattr(runner, "MAX_CACHED", 2)
    made = [runner.write_sources(_graph(tiles={"gemm": {"BM": 16, "BN": 16, "BK": b}}))
            for b in (16, 32, 64)]
    assert len(set(made)) == 3
    assert sorted((cache / "gpu").iterdir()) == sorted(made[1:])


# ---- host steps as data ----------------------------------------------------------------------

def test_host_steps_are_data_and_compute_the_same(tmp_path):
    res = _atan_result()
    graph = lower(res.program)
    (step,) = graph.host_steps
    text = host.host_steps_text({step.name: step.program})
    assert json.loads(text)["format"] == host.FORMAT
    (back,) = host.parse_host_steps(text).values()
    assert to_dag_text(back.outputs) == to_dag_text(step.program.outputs)
    assert back.tensor_shapes == step.program.tensor_shapes and back.opaque_nodes == step.program.opaque_nodes
    x = np.random.default_rng(1).standard_normal(next(iter(back.tensor_shapes.values()))).astype(np.float32)
    (name,) = back.tensor_shapes
    np.testing.assert_array_equal(host.evaluate_step(back, {name: x}),
                                  host.evaluate_step(step.program, {name: x}))
    runner.write_sources(graph, tmp_path)
    assert (tmp_path / "host_steps.json").read_text() == text
    assert not list(tmp_path.rglob("*.pkl"))


def test_opaque_constants_round_trip():
    """TopK's k is a constant input: stored as .npy (allow_pickle=False), read back equal."""
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1)
    term = parse_term("(opaque op (args (access-tensor x)) (shape 3 2))")
    spec = OpaqueNode(node.SerializeToString(), (0,), {1: np.array([2], np.int64)},
                      (TensorProto.FLOAT, TensorProto.INT64), 1, TensorProto.INT64, (("", 21),))
    prog = Program({"out": term}, {"x": (3, 6)}, {"op": spec})
    (back,) = host.parse_host_steps(host.host_steps_text({"h": prog})).values()
    (node_back,) = back.opaque_nodes.values()
    assert node_back.node == spec.node and node_back.constants[1].dtype == np.int64
    x = np.random.default_rng(2).standard_normal((3, 6)).astype(np.float32)
    np.testing.assert_array_equal(apsat.evaluate(back, {"x": x}), apsat.evaluate(prog, {"x": x}))


@pytest.mark.parametrize("text", ["not json", '{"format": "other", "steps": {}}',
                                  '{"format": "apsat-host-steps/1", "steps": {"h": {}}}'])
def test_a_file_that_is_not_host_steps_is_refused(text):
    with pytest.raises(ApsatError, match="not a host-step file"):
        host.parse_host_steps(text)


def test_no_pickle_in_apsat():
    imports = re.compile(r"^\s*(?:import|from)\s+(?:c?[pP]ickle|dill|shelve)\b", re.M)
    assert not [p for p in APSAT.rglob("*.py") if imports.search(p.read_text())]


# ---- the environment -------------------------------------------------------------------------

def test_importing_apsat_sets_no_environment_variable():
    code = ("import os; before = dict(os.environ); import apsat, apsat.backends.gpu.runner, "
            "apsat.backends.gpu.aot, apsat.backends.triton; print(dict(os.environ) == before)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"


@pytest.mark.parametrize("preset", [None, "1"])
def test_interpreted_run_leaves_the_environment_alone(preset, cache, monkeypatch, triton_run):
    """A host step and kernels run under the interpreter; TRITON_INTERPRET stays as it was."""
    if preset is None:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    else:
        monkeypatch.setenv("TRITON_INTERPRET", preset)
    before = dict(os.environ)
    res = _atan_result()
    x = np.random.default_rng(3).standard_normal((5, 19)).astype(np.float32)
    tensors = {**res.model.weights, "x": x}
    np.testing.assert_allclose(triton_run(res.program, tensors, device="cpu"),
                               apsat.evaluate(res.program, tensors), rtol=1e-5, atol=1e-6)
    assert dict(os.environ) == before
    assert not list(cache.rglob("*.pkl")) and list(cache.rglob("host_steps.json"))


# ---- bounded caches --------------------------------------------------------------------------

def test_onnxruntime_session_cache_is_bounded(monkeypatch):
    from apsat.lang import opaque_eval as reference

    monkeypatch.setattr(reference, "MAX_SESSIONS", 3)
    x = np.random.default_rng(4).standard_normal((2, 3)).astype(np.float32)
    for alpha in (0.1, 0.2, 0.3, 0.4, 0.5):
        node = helper.make_node("HardSigmoid", ["x"], ["y"], alpha=alpha, beta=0.5)
        spec = OpaqueNode(node.SerializeToString(), (0,), {}, (TensorProto.FLOAT,), 0, TensorProto.FLOAT,
                          (("", 21),))
        prog = Program({"out": parse_term("(opaque op (args (access-tensor x)) (shape 2 3))")},
                       {"x": (2, 3)}, {"op": spec})
        np.testing.assert_allclose(apsat.evaluate(prog, {"x": x}), np.clip(alpha * x + 0.5, 0, 1), rtol=1e-6)
        assert len(reference._SESSIONS) <= 3
    assert reference._opaque_key(spec) in reference._SESSIONS      # the last used is kept


def test_host_step_files_and_runner_modules_are_bounded(tmp_path):
    assert host._parsed.cache_info().maxsize == host.MAX_LOADED
    assert runner._import_runner.cache_info().maxsize == runner.MAX_RUNNERS
    prog = Program({"out": parse_term("(compute relu (access (access-tensor x) 1))")}, {"x": (2, 3)})
    for i in range(host.MAX_LOADED + 3):
        path = tmp_path / f"h{i}.json"
        path.write_text(host.host_steps_text({f"h{i}": prog}))
        assert list(host.load_host_steps(path)) == [f"h{i}"]
    assert host._parsed.cache_info().currsize == host.MAX_LOADED
    graph = _graph()
    for i in range(runner.MAX_RUNNERS + 2):
        runner.load_runner(runner.write_sources(graph, tmp_path / f"r{i}"))
    assert runner._import_runner.cache_info().currsize == runner.MAX_RUNNERS


def test_aot_compile_leaves_the_environment_alone(monkeypatch):
    """Under TRITON_INTERPRET=1 the kernel still compiles (its functions are rebound as
    JITFunctions, the variable untouched); the source runs from a private temp folder."""
    pytest.importorskip("triton", reason="AOT compilation needs triton (pip install apsat[gpu])")
    from apsat.backends.gpu.aot import aot_compile_source
    from apsat.backends.gpu.triton import kernel_source

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    (k,) = _graph("gemv-sigmoid").kernels
    res = aot_compile_source(kernel_source(k), k.name)
    assert "error" not in res, res.get("error")
    assert res["cubin"][:4] == b"\x7fELF" and os.environ["TRITON_INTERPRET"] == "1"


def test_unusable_cache_falls_back_to_a_private_temp_folder(tmp_path, monkeypatch):
    """A cache root that cannot be created (here: under a file) gives one private
    temporary folder for the process, not a shared one."""
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file" / "xdg"))
    monkeypatch.setattr(files, "_FALLBACK", [])
    d = runner.write_sources(_graph())
    root = files._FALLBACK[0]
    assert d.parent == root / "gpu" and stat.S_IMODE(root.stat().st_mode) == 0o700
    assert files.cache_dir() == root
