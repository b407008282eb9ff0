"""Batch runs on a Dask cluster (apsat.pipeline.batch_dask): the same rows as a local run,
results reused from the store, a bad model a failure row while the others go on, each
model in its own process inside a (non-daemonic) worker."""
from __future__ import annotations

import pytest

distributed = pytest.importorskip("distributed", reason="the dask executor needs distributed (apsat[dask])")

import dask  # noqa: E402

from apsat.pipeline.batch import Task, run_local  # noqa: E402
from apsat.pipeline.batch_dask import DAEMON_HELP, local_cluster, run_dask  # noqa: E402
from apsat.pipeline.store import ResultStore  # noqa: E402
from apsat.pipeline.zoo import light_model_paths  # noqa: E402

FIGURES = ("status", "kernels", "egraph_nodes", "speedup", "onnx_nodes", "cycles")


@pytest.fixture(scope="module")
def cluster():
    """Two single-thread worker processes on loopback, started non-daemonic (as the docs
    say to start `dask worker`), so that each can start a process per model."""
    with local_cluster(2) as c:
        yield c


def _light_tasks(out):
    paths = [p for p in light_model_paths() if "alexnet" in p.name or "zfnet" in p.name]
    return [Task(p.stem.replace("light_", ""), str(p), out=str(out), randomize=True) for p in paths]


@pytest.mark.slow
def test_dask_rows_match_a_local_run_and_are_reused(cluster, tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not onnx")
    tasks = _light_tasks(tmp_path / "dask")
    events = []
    store = ResultStore(tmp_path / "dask")
    rows = run_dask(tasks + [Task("bad", str(bad), out=str(tmp_path / "dask"))], cluster.scheduler_address,
                    store=store, timeout=120, on_event=lambda *e: events.append(e))
    assert [r["model"] for r in rows] == [t.name for t in tasks] + ["bad"]
    assert rows[2]["status"] == "error" and "not an ONNX file" in rows[2]["error"]
    assert (tmp_path / "dask" / tasks[0].name / "report.json").is_file()
    starts = {e[1]: e[2] for e in events if e[0] == "start"}
    assert set(starts) <= {t.name for t in tasks} | {"bad"} and all(" pid " in w for w in starts.values())
    assert sorted(e[1]["model"] for e in events if e[0] == "done") == sorted(r["model"] for r in rows)

    local = run_local(_light_tasks(tmp_path / "local"), jobs=2)
    assert [[r[k] for k in FIGURES] for r in rows[:2]] == [[r[k] for k in FIGURES] for r in local]
    assert rows[0]["status"] == "ok" and rows[0]["kernels"] > 0

    again = run_dask(tasks, cluster.scheduler_address, store=store)
    assert [r["status"] for r in again] == ["reused", "reused"]
    assert [r["kernels"] for r in again] == [r["kernels"] for r in rows[:2]]


def test_a_daemonic_worker_gives_a_row_saying_how_to_start_it(tmp_path):
    """Dask's default (daemonic workers) cannot start the model's process: the row says so."""
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not onnx")
    with dask.config.set({"distributed.worker.daemon": True}), \
            distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                     host="127.0.0.1", dashboard_address=None,
                                     scheduler_kwargs={"dashboard_address": "127.0.0.1:0"}) as c, \
            distributed.Client(c) as client:
        rows = run_dask([Task("bad", str(bad), out=str(tmp_path))], client=client)
    assert rows[0]["status"] == "failed" and DAEMON_HELP in rows[0]["error"]
    assert rows[0]["error"].startswith("RuntimeError: ")


def test_without_a_scheduler_a_local_cluster_runs_the_tasks(tmp_path):
    """scheduler None: a cluster on this machine, whose workers can start model processes."""
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not onnx")
    rows = run_dask([Task("bad", str(bad), out=str(tmp_path))], None, jobs=1)
    assert rows[0]["status"] == "error" and "not an ONNX file" in rows[0]["error"]
