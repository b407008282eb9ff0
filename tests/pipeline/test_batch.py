"""Batch runs (apsat.pipeline.batch, store): each model in its own process, failures as
rows with their reason, results reused under their content key, written atomically."""
from __future__ import annotations

import json
import os

import pytest

from apsat.pipeline.batch import Task, run_local, run_task
from apsat.pipeline.store import ResultStore, content_key
from apsat.pipeline.zoo import light_model_paths

ALEXNET = next(p for p in light_model_paths() if "alexnet" in p.name)


@pytest.fixture(scope="module")
def small_models(tmp_path_factory, light_alexnet_zfnet):
    """Two small models with random weights (alexnet and zfnet, seed 0), as files (made
    once a session: tests/conftest.py)."""
    return light_alexnet_zfnet(tmp_path_factory.mktemp("models"))


def _tasks(paths, out, **kw):
    return [Task(p.stem, str(p), out=str(out), **kw) for p in paths]


def test_content_key_changes_with_each_input():
    base = content_key(b"model", "gpu", ["(rule)"], {"seed": 0})
    assert base == content_key(b"model", "gpu", ["(rule)"], {"seed": 0})
    others = [content_key(b"model2", "gpu", ["(rule)"], {"seed": 0}),
              content_key(b"model", "systolic", ["(rule)"], {"seed": 0}),
              content_key(b"model", "gpu", ["(rule2)"], {"seed": 0}),
              content_key(b"model", "gpu", ["(rule)"], {"seed": 1})]
    assert base not in others and len(set(others)) == 4


def test_store_is_atomic_and_trusts_only_whole_records(tmp_path):
    store = ResultStore(tmp_path)
    assert store.load("k" * 64) is None
    store.save("k" * 64, {"row": {"status": "ok"}})
    assert store.load("k" * 64)["row"] == {"status": "ok"}
    assert not [p for p in store.root.iterdir() if p.suffix == ".tmp"]
    store.path("j" * 64).write_text('{"row": {"status": "ok"')       # half written: not trusted
    assert store.load("j" * 64) is None


def test_run_task_writes_a_whole_report(small_models, tmp_path):
    row = run_task(Task("alexnet", str(small_models[0]), out=str(tmp_path), options={"verify": True}))
    assert row["status"] == "ok" and row["kernels"] > 0 and row["max_abs_err"] is not None
    report = json.loads((tmp_path / "alexnet" / "report.json").read_text())
    assert report["model"] == "alexnet"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]      # no temporary left


def test_bad_model_is_an_error_row(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not onnx")
    row = run_task(Task("bad", str(bad), out=str(tmp_path / "out")))
    assert row["status"] == "error" and "not an ONNX file" in row["error"]


@pytest.mark.slow
def test_pool_isolates_failures_and_reuses_results(small_models, tmp_path):
    """Two workers; a time limit and a memory limit each fail only their model, with the
    reason and the phase reached; a second run reuses the finished models."""
    store = ResultStore(tmp_path)
    rows = run_local(_tasks(small_models, tmp_path, options={"verify": True}), jobs=2, store=store)
    assert [r["status"] for r in rows] == ["ok", "ok"]
    again = run_local(_tasks(small_models, tmp_path, options={"verify": True}), jobs=2, store=store)
    assert [r["status"] for r in again] == ["reused", "reused"]
    assert [r["kernels"] for r in again] == [r["kernels"] for r in rows]
    slow = run_local(_tasks(small_models[:1], tmp_path), timeout=0.5, force=True)
    assert slow[0]["status"] == "failed" and "time limit 0.5 s" in slow[0]["error"]
    big = run_local(_tasks(small_models[:1], tmp_path), max_memory_mib=60, force=True)
    assert big[0]["status"] == "failed" and "memory limit 60 MiB" in big[0]["error"]
    assert "in phase" in big[0]["error"]


@pytest.mark.slow
def test_a_killed_worker_is_a_row(small_models, tmp_path):
    """A worker that dies (here: SIGKILL as it starts its first phase) fails its model
    alone, with the signal and the phase reached."""
    pids = {}

    def kill_on_import(kind, what, detail):
        if kind == "start":
            pids[what] = detail
        if kind == "phase" and detail == "import":
            os.kill(pids[what], 9)

    rows = run_local(_tasks(small_models, tmp_path), jobs=1, on_event=kill_on_import)
    assert all(r["status"] == "failed" for r in rows)
    assert "worker died (killed by signal SIGKILL) in phase import" in rows[0]["error"]


@pytest.mark.slow
def test_ctrl_c_keeps_every_finished_result(small_models, tmp_path):
    """KeyboardInterrupt (here raised when the first model finishes) stops the workers;
    the finished model's result is stored and its row kept, the others are "interrupted"."""
    store = ResultStore(tmp_path)

    def interrupt_after_first(kind, what, detail):
        if kind == "done":
            raise KeyboardInterrupt

    rows = run_local(_tasks(small_models, tmp_path), jobs=1, store=store, on_event=interrupt_after_first)
    assert sorted(r["status"] for r in rows) == ["interrupted", "ok"]
    assert len(list(store.root.glob("*.json"))) == 1


def test_progress_view_counts_and_estimates():
    from apsat.cli.progress import BatchProgress

    view = BatchProgress(total=4, jobs=2)
    view.on_event("start", "a", 101)
    view.on_event("phase", "a", "saturate")
    assert view.running["a"][0] == "saturate" and view.eta_seconds() is None
    view.on_event("done", {"model": "a", "status": "ok", "seconds": 10.0}, None)
    view.on_event("reused", {"model": "b", "status": "reused"}, None)
    assert view.counts == {"done": 1, "failed": 0, "reused": 1} and not view.running
    assert view.eta_seconds() == pytest.approx(10.0 * 2 / 2)       # two left, two workers
