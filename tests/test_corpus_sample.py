"""The corpus CI sample (tests/data/corpus: about ten small models of the public corpus, one
per kind of architecture, made by `python benchmarks/corpus.py sample`) imports, optimises
and verifies on gpu and systolic:32x32: the reference interpreter and, on systolic, the
simulator equal onnxruntime on apsat's seeded inputs, as `apsat zoo` checks them, with no
opaque call and no host step on either target (embedding lookups, relative-position biases
and routers are the language's gathers). The files stay small (under 1 MB each) and the
manifest lists every one of them."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from backend_cases import assert_verified_without_host_steps

import apsat

SAMPLE = Path(__file__).resolve().parent / "data" / "corpus"
MANIFEST = json.loads((SAMPLE / "manifest.json").read_text())
MODELS = sorted(MANIFEST["models"])


def test_sample_files_are_small_and_listed():
    files = sorted(p.stem for p in SAMPLE.glob("*.onnx"))
    assert files == MODELS
    assert all((SAMPLE / f"{name}.onnx").stat().st_size < 1 << 20 for name in MODELS)
    assert {"README.md", "manifest.json"} <= {p.name for p in SAMPLE.iterdir()}


@pytest.mark.slow
@pytest.mark.parametrize("target", ["gpu", "systolic:32x32"])
@pytest.mark.parametrize("name", MODELS)
def test_sample_model_verifies(name, target):
    res = apsat.optimize(SAMPLE / f"{name}.onnx", target=target)
    assert_verified_without_host_steps(res.report, target)
