"""benchmarks/gpu.py without a GPU: the harness's own code path on a test-sized MLP under
the Triton interpreter (apsat's Triton column, the per-kernel profile, PyTorch eager from
the ONNX graph), its files (rows and the measurements file), the measurements fed to
benchmarks/calibrate_gpu.py, the tables printed again from the files, and a one-line
refusal of an unknown model. The times mean nothing here; what is checked is that every
column that runs is checked against onnxruntime and recorded."""
from __future__ import annotations

import json

import pytest

from bench_scripts import load_benchmark as _load


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    pytest.importorskip("torch", reason="the GPU benchmark needs torch (pip install apsat[gpu])")
    pytest.importorskip("triton", reason="the GPU benchmark needs triton (pip install apsat[gpu])")
    out = tmp_path_factory.mktemp("gpu-bench")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(out / "xdg"))
        code = _load("gpu").main(["mlp3_small", "--cpu", "--no-isolate", "--iters", "2", "--warmup", "1",
                                  "--compile-mode", "none", "--out", str(out)])
    return code, out


def test_the_harness_checks_and_records_every_column_it_runs(run, capsys):
    code, out = run
    assert code == 0
    row = json.loads((out / "rows" / "mlp3_small.json").read_text())
    assert not row["notes"], row["notes"]
    assert set(row["ms"]) == {"triton", "eager"} and all(t > 0 for t in row["ms"].values())
    assert max(row["err"].values()) < 1e-4          # within verify's tolerances of onnxruntime
    assert row["kernels"] == 3 and len(row["kernel_rows"]) == 3
    for k in row["kernel_rows"]:
        assert k["kind"] == "gemm" and k["measured_us"] > 0 and k["modelled_us"] > 0 and k["key"]
    _load("gpu").main(["--table", str(out)])
    text = capsys.readouterr().out
    assert "mlp3_small" in text and "say nothing about a GPU" in text


def test_its_measurements_are_what_the_calibration_fits(run, capsys):
    _, out = run
    data = json.loads((out / "measurements.json").read_text())
    assert data["gpu"] == "cpu (Triton interpreter)" and len(data["kernels"]) == 3
    assert {"model", "name", "kind", "flops", "bytes", "modelled_us", "measured_us"} <= set(data["kernels"][0])
    assert _load("calibrate_gpu").main([str(out / "measurements.json")]) == 0
    assert "gemm" in capsys.readouterr().out


def test_an_unknown_model_is_one_line_and_exit_2(capsys):
    assert _load("gpu").main(["no_such_model", "--cpu"]) == 2
    assert capsys.readouterr().out.count("\n") == 1
