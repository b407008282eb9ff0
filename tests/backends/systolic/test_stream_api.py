"""`apsat optimize MODEL --target systolic:... --out DIR` writes the instruction stream, the
simulator's results and the cycle report; other targets write what they always did."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from models import small_convnet

from apsat.pipeline.optimize import optimize
from apsat.backends import systolic as sab
from apsat.cli import main


@pytest.fixture(scope="module")
def convnet(tmp_path_factory):
    path = tmp_path_factory.mktemp("m") / "convnet.onnx"
    onnx.save(small_convnet(), str(path))
    return path


@pytest.mark.parametrize("target", ["systolic:32x32", "systolic:256x256", "toml"])
def test_cli_optimize_writes_stream_simulation_and_cycles(convnet, tmp_path, target):
    if target == "toml":
        toml = tmp_path / "edge.toml"
        toml.write_text('rows = 16\ncols = 8\ndataflow = "ws"\nifmap_kb = 8\nfilter_kb = 8\nofmap_kb = 4\n'
                        'dram_bandwidth = 8.0\n')
        target = str(toml)
    out = tmp_path / "out"
    # the simulator runs as part of verification, beside the reference interpreter
    assert main(["optimize", str(convnet), "--target", target, "--out", str(out)]) == 0
    d = out / "convnet"
    report = json.loads((d / "report.json").read_text())
    assert {"model", "target", "ops_before", "ops_after", "egraph", "saturation", "extraction",
            "opaque_calls", "seconds"} <= set(report)
    s = report["systolic"]
    assert s["simulation"]["ok"], s["simulation"]
    assert s["cycles"]["total_cycles"] > 0 and s["cycles"]["dram"]["total"] > 0
    assert s["accelerator"]["rows"] == {"systolic:32x32": 32, "systolic:256x256": 256}.get(target, 16)
    stream = sab.read(d / "instructions.txt")
    assert stream.accel.name == s["accelerator"]["name"]
    assert set(np.load(d / "simulated_outputs.npz").files) == set(s["simulation"]["outputs"])


def test_gpu_target_writes_no_stream(convnet, tmp_path):
    res = optimize(str(convnet), target="gpu", verify=False)
    assert res.stream is None and "systolic" not in res.report
    res.write(tmp_path)
    assert not (tmp_path / "instructions.txt").exists()


def test_compile_takes_target_names_and_files(convnet, tmp_path):
    res = optimize(str(convnet), target="systolic:16x8", verify=False)
    assert res.stream.accel.rows == 16 and res.stream.accel.cols == 8
    toml = tmp_path / "a.toml"
    toml.write_text("rows = 8\ncols = 8\n")
    s = sab.compile(res.program, str(toml))
    assert s.accel.name == "a" and s.accel.rows == 8


def test_without_verification_nothing_is_simulated(convnet):
    # lowering (the stream and its cycle model) always happens; running it is verification
    res = optimize(str(convnet), target="systolic:32x32", verify=False)
    assert res.stream is not None and res.report["systolic"]["cycles"]["total_cycles"] > 0
    assert res.simulated is None and "simulation" not in res.report["systolic"]
