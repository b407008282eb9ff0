"""The fp16-against-fp32 benchmarks without a GPU: benchmarks/gpu.py --fp16 on the test-sized
MLP under the Triton interpreter (the fp16 row's apsat and eager columns checked against
onnxruntime's float16 run and recorded, the fp32/fp16 table printed), and
benchmarks/gpu_precision.py's modelled figures (fp16 faster than fp32, priced as
emitted, verified). Times here mean nothing; what is checked is the harness."""
from __future__ import annotations

import json

import pytest

from bench_scripts import load_benchmark as _load


def test_gpu_harness_times_the_fp16_model_beside_fp32(tmp_path, capsys, monkeypatch):
    pytest.importorskip("torch", reason="the GPU benchmark needs torch (pip install apsat[gpu])")
    pytest.importorskip("triton", reason="the GPU benchmark needs triton (pip install apsat[gpu])")
    pytest.importorskip("onnxruntime.transformers.float16")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    code = _load("gpu").main(["mlp3_small", "--fp16", "--cpu", "--no-isolate", "--iters", "1", "--warmup", "0",
                              "--compile-mode", "none", "--budget", "600", "--out", str(tmp_path)])
    assert code == 0
    row = json.loads((tmp_path / "rows" / "mlp3_small_fp16.json").read_text())
    assert not row["notes"], row["notes"]
    assert set(row["ms"]) == {"triton", "eager"} and row["kernels"] == 3
    fp32 = json.loads((tmp_path / "rows" / "mlp3_small.json").read_text())
    # the same kernels moving half the bytes
    assert [k["bytes"] * 2 for k in row["kernel_rows"]] == [k["bytes"] for k in fp32["kernel_rows"]]
    text = capsys.readouterr().out
    assert "triton fp16" in text and "mlp3_small " in text


def test_modelled_precision_table(capsys):
    pytest.importorskip("onnxruntime.transformers.float16")
    bench = _load("gpu_precision")
    pair = (bench.figures("mlp3_small"), bench.figures("mlp3_small_fp16"))
    a, b = pair
    assert a["ok"] and b["ok"] and b["err_apsat"] is not None
    assert a["kernels"] == b["kernels"] == 3 and b["us"] < a["us"]
    assert bench._priced(a) == bench._priced(b) == "same"
    bench.print_table([pair])
    out = capsys.readouterr().out
    assert "mlp3_small" in out and f"{a['us'] / b['us']:7.2f}x" in out
