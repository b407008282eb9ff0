"""Suite-wide settings: the order tests are handed to workers, and one thread per worker.

The suite runs on every core (`-n auto`, pytest-xdist; pyproject's addopts). Two things
keep the cores busy to the end rather than waiting on one long test:

* tests marked `slow` (whole models, tens of seconds) are collected first, so the workers
  share them out at the start and the short tests fill the gaps after;
* each worker's numerical libraries (OpenBLAS, onnxruntime's thread pools through
  OMP_NUM_THREADS) use one thread, so two workers on two cores do not each start a pool
  the size of the machine and fight over it. A run without workers keeps the defaults.

APSAT_TEST_TIMELINE=FILE appends each test's start and end (time, worker, test id) to FILE:
how the work spread over the workers, and where one waited.
"""
from __future__ import annotations

import os
import shutil
import time

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):
    # Before numpy or onnxruntime is imported by any test module: they read these at load.
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")


def pytest_collection_modifyitems(config, items):
    """Slow tests first (a stable sort: each group keeps its collection order)."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_runtest_logstart(nodeid, location):
    _timeline("start", nodeid)


def pytest_runtest_logfinish(nodeid, location):
    _timeline("end", nodeid)


def _timeline(event: str, nodeid: str) -> None:
    """One line of APSAT_TEST_TIMELINE (the module doc), when it is set."""
    path = os.environ.get("APSAT_TEST_TIMELINE")
    if path:
        with open(path, "a") as f:
            f.write(f"{time.time():.2f} {os.environ.get('PYTEST_XDIST_WORKER', 'main')} {event} {nodeid}\n")


@pytest.fixture(scope="session")
def light_alexnet_zfnet(tmp_path_factory):
    """Light alexnet and zfnet512 with random weights (seed 0), randomised and saved once
    for the session: tests/pipeline/test_batch.py and test_zoo_cli.py both batch these two,
    each ~300 MB of weights (~2 s to randomise and write), and a module fixture is set up
    again when its module's slow tests run apart from its fast ones. Returns
    `into(folder)`: the two files hard-linked (copied where links fail) into `folder`,
    their paths in name order; nothing writes to the shared files."""
    import onnx

    from apsat.pipeline.zoo import light_model_paths, randomize_weights

    root = tmp_path_factory.mktemp("light_seed0")
    files = []
    for p in light_model_paths():
        if "alexnet" in p.name or "zfnet" in p.name:
            files.append(root / p.name.replace("light_", ""))
            onnx.save(randomize_weights(onnx.load(str(p)), seed=0), str(files[-1]))

    def into(folder):
        for src in files:
            try:
                os.link(src, folder / src.name)
            except OSError:
                shutil.copyfile(src, folder / src.name)
        return [folder / src.name for src in files]
    return into
