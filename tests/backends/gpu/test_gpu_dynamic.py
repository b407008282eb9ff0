"""One kernel set for every size (apsat.backends.gpu.dynamic): GPT-2 with symbolic batch and
sequence (tests/data/dynamic/gpt2.onnx, causal attention, positions from a Range) is
optimised once; its kernels and runner, written once, run under the Triton interpreter at
sequence lengths 5 and 40 (past the representative 31 and past the 32-wide tiles) and at
batch 1, and equal onnxruntime on the original by apsat's float64 rule
(docs/verification.md)."""
from __future__ import annotations

import io
import tokenize
from pathlib import Path

import pytest

from apsat.lang.dims import NotGeneral

DATA = Path(__file__).resolve().parents[2] / "data" / "dynamic"


def test_one_kernel_set_runs_at_two_sequence_lengths(tmp_path):
    from apsat.backends.gpu.runner import load_runner
    from apsat.pipeline.dynamic import model_at
    from apsat.pipeline.optimize import optimize
    from apsat.pipeline.verify import judge, run_oracle
    from apsat.pipeline.zoo import random_inputs

    res = optimize(DATA / "gpt2.onnx", target="gpu", verify=False, representatives={"sequence_length": 31})
    res.write(tmp_path, compile_kernels=False)
    report = (tmp_path / "report.json").read_text()
    assert "one kernel set for every size" in report
    runner = load_runner(tmp_path)
    kernels = sorted(p.name for p in (tmp_path / "kernels").glob("*.py"))
    for sizes in ({"batch_size": 2, "sequence_length": 5}, {"batch_size": 1, "sequence_length": 40}):
        model, _, _ = model_at(res.model, res.general, sizes)
        inputs = random_inputs(model, 0)
        weights = {k: v for k, v in model.weights.items() if res.general.fills.get(k, ("",))[0] != "range"}
        got = {k: v.detach().cpu().numpy() for k, v in runner.run({**weights, **inputs}).items()}
        verdict = judge(run_oracle(model.onnx, inputs), got)
        assert verdict.ok, (sizes, verdict.to_dict())
        assert got["last_hidden_state"].shape == (sizes["batch_size"], sizes["sequence_length"], 32)
    assert sorted(p.name for p in (tmp_path / "kernels").glob("*.py")) == kernels     # nothing new written


def _tokens(text):
    return list(tokenize.generate_tokens(io.StringIO(text).readline))


def test_sources_that_differ_in_more_than_numbers_are_not_general():
    from apsat.backends.gpu.dynamic import _differing
    from apsat.lang.fit import corners

    symbols = {"s": (31, 29, 23)}
    points = corners(symbols)
    same = ["x = a * 31\n", "x = a * 29\n", "x = a * 23\n"]
    (spot,) = _differing("k.py", same, points, {"s": 23}).values()
    assert spot[1] == {frozenset({"s"}): 1}
    with pytest.raises(NotGeneral, match="changes with the symbolic dims"):
        _differing("k.py", ["x = a * 31\n", "x = b * 29\n", "x = a * 23\n"], points, {"s": 23})
    with pytest.raises(NotGeneral, match="not the same code"):
        _differing("k.py", ["x = a * 31\n", "x = a * 29 + 1\n", "x = a * 23\n"], points, {"s": 23})
