"""targets.gpu_calibration: fitted gpu roofline constants. The fit recovers the constants
that generated noisy synthetic timings; calibration files round-trip and a malformed one
is one line naming the file and the problem; without a calibration every figure is the
data sheet's, exactly, and with one (through APSAT_GPU_CALIBRATION) the cost model and the
GPU backend's kernel figures follow it; benchmarks/calibrate_gpu.py end to end."""
from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from attention_forms import forms

import apsat
from apsat.backends.gpu.graph import Kernel
from apsat.errors import ApsatError, CalibrationError
from apsat.explore.egraph import EGraph
from apsat.extract.cost_gpu import GpuRoofline, kernel_kind
from apsat.extract.decode import language_graph
from apsat.targets import gpu_calibration as gc
from apsat.targets.gpu import BYTES, HBM_BYTES_PER_US, LAUNCH_US, TFLOPS, Roofline

ROOT = Path(__file__).resolve().parents[2]
PEAK = TFLOPS["fp32"] * 1e6
TRUE = gc.Calibration("NVIDIA H100 80GB HBM3", 4.5,
                      {"gemm": 0.7, "reduce": 0.55, "elementwise": 0.85, "attention": 0.6},
                      {"gemm": 0.5, "reduce": 0.3, "elementwise": 0.25, "attention": 0.4})


@pytest.fixture(autouse=True)
def _fresh_cache(monkeypatch):
    """Each test reads the calibration afresh, and leaves none cached behind it."""
    monkeypatch.delenv(gc.ENV, raising=False)
    gc.clear_cache()
    yield
    gc.clear_cache()


def synthetic(cal, kinds=gc.KINDS, intensities=(0.25, 2, 20, 200, 2000), noise=0.05, seed=0):
    """Kernels of each kind from tiny (launch-bound) to large, memory- and compute-bound
    (FLOP per byte from 0.25 to 2000; the fp32 ridge is 20), timed by `cal` itself with
    seeded log-normal noise of `noise`."""
    rng = np.random.default_rng(seed)
    out = []
    for kind in kinds:
        for b in np.logspace(3, 9, 13):
            for intensity in intensities:
                t = cal.kernel_us(kind, b * intensity, b, PEAK, HBM_BYTES_PER_US) * rng.lognormal(0, noise)
                out.append({"model": "synthetic", "name": f"k{len(out)}", "kind": kind, "flops": b * intensity,
                            "bytes": float(b), "modelled_us": 0.0, "measured_us": float(t)})
    return out


# ---- fit -------------------------------------------------------------------------------------

def test_fit_recovers_the_constants_that_made_the_timings():
    cal, report = gc.fit(synthetic(TRUE), PEAK, HBM_BYTES_PER_US, LAUNCH_US, gpu=TRUE.gpu)
    assert cal.gpu == TRUE.gpu and cal.launch_us == pytest.approx(TRUE.launch_us, rel=0.1)
    for kind in gc.KINDS:
        assert cal.bandwidth[kind] == pytest.approx(TRUE.bandwidth[kind], rel=0.1), kind
        assert cal.compute[kind] == pytest.approx(TRUE.compute[kind], rel=0.1), kind
        assert report[kind]["n"] == 65
        assert report[kind]["after"]["median"] < report[kind]["before"]["median"]
    assert report["all"]["n"] == 260 and report["all"]["after"]["median"] < 0.05 < report["all"]["before"]["median"]
    assert cal.provenance == {"kernels": 260, "error_before": report["all"]["before"],
                              "error_after": report["all"]["after"]}


def test_what_the_data_do_not_pin_down_stays_at_the_data_sheet():
    # reductions that only ever move memory say nothing of their FLOP rate; no attention
    # kernel was measured at all
    data = synthetic(TRUE, kinds=("gemm", "reduce"), intensities=(0.25, 1.0), noise=0.0) \
        + synthetic(TRUE, kinds=("gemm",), intensities=(200, 2000), noise=0.0)
    data = [m for m in data if m["kind"] == "gemm" or m["flops"] < 2 * m["bytes"]]
    cal, report = gc.fit(data, PEAK, HBM_BYTES_PER_US, LAUNCH_US)
    assert cal.compute["reduce"] == pytest.approx(1.0, abs=1e-3)
    assert cal.bandwidth["reduce"] == pytest.approx(0.55, rel=0.01)
    assert cal.bandwidth["attention"] == cal.compute["attention"] == 1.0 and "attention" not in report
    assert report["all"]["after"]["worst"] < 0.01


@pytest.mark.parametrize("bad, words", [
    ([], "no kernel measurements"),
    ([{"kind": "gemm", "flops": 1.0, "bytes": 1.0}], "kernel 0: needs kind, flops, bytes and measured_us"),
    ([{"kind": "conv", "flops": 1.0, "bytes": 1.0, "measured_us": 5.0}], "unknown kind 'conv'"),
    ([{"kind": "gemm", "flops": 1.0, "bytes": 1.0, "measured_us": 0.0}], "measured_us finite and > 0"),
    ([{"kind": "gemm", "flops": -1.0, "bytes": 1.0, "measured_us": 5.0}], "finite and >= 0"),
    ([{"kind": "gemm", "flops": math.nan, "bytes": 1.0, "measured_us": 5.0}], "finite and >= 0"),
])
def test_fit_refuses_bad_measurements(bad, words):
    with pytest.raises(CalibrationError) as info:
        gc.fit(bad, PEAK, HBM_BYTES_PER_US, LAUNCH_US)
    assert words in str(info.value) and "\n" not in str(info.value)


# ---- files -----------------------------------------------------------------------------------

def test_dump_and_load_round_trip(tmp_path):
    cal = gc.Calibration(TRUE.gpu, TRUE.launch_us, TRUE.bandwidth, TRUE.compute,
                         {"commit": "abc123", "date": "2025-01-01", "kernels": 3,
                          "error_before": {"median": 0.3, "worst": 0.7}, "error_after": {"median": 0.03, "worst": 0.1}})
    gc.dump(cal, tmp_path / "cal.json")
    assert gc.load(tmp_path / "cal.json") == cal


def _file(tmp_path, edit) -> Path:
    data = TRUE.to_json()
    edit(data)
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("edit, words", [
    (lambda d: d.pop("compute"), "missing field 'compute'"),
    (lambda d: d.update(speed=2), "unknown field 'speed'"),
    (lambda d: d.update(gpu=""), "gpu must be the GPU's name"),
    (lambda d: d["bandwidth"].update(conv=0.5), "unknown kind 'conv' in bandwidth"),
    (lambda d: d["compute"].pop("reduce"), "compute has no 'reduce'"),
    (lambda d: d["compute"].update(gemm=0.0), "compute['gemm'] must be a positive finite number"),
    (lambda d: d["bandwidth"].update(reduce=-0.5), "bandwidth['reduce'] must be a positive finite number"),
    (lambda d: d["bandwidth"].update(gemm=math.inf), "bandwidth['gemm'] must be a positive finite number"),
    (lambda d: d["compute"].update(attention=math.nan), "compute['attention'] must be a positive finite number"),
    (lambda d: d["compute"].update(gemm="0.5"), "compute['gemm'] must be a positive finite number"),
    (lambda d: d["compute"].update(gemm=True), "compute['gemm'] must be a positive finite number"),
    (lambda d: d["bandwidth"].update(gemm=1.6), "over 1.5 of peak"),
    (lambda d: d.update(bandwidth=[0.5]), "bandwidth must be an object"),
    (lambda d: d.update(launch_us=-1.0), "launch_us must be a finite number"),
    (lambda d: d.update(launch_us=math.nan), "launch_us must be a finite number"),
    (lambda d: d.update(provenance="abc"), "provenance must be an object"),
])
def test_a_malformed_file_is_one_line_naming_it_and_the_problem(tmp_path, edit, words):
    path = _file(tmp_path, edit)
    with pytest.raises(CalibrationError) as info:
        gc.load(path)
    message = str(info.value)
    assert isinstance(info.value, ApsatError) and "\n" not in message
    assert message.startswith(f"{path}: ") and words in message, message


@pytest.mark.parametrize("text, words", [("{not json", "not JSON (line 1)"), ("[1, 2]", "not a JSON object"),
                                         (None, "cannot read calibration")])
def test_a_file_that_is_no_calibration_at_all(tmp_path, text, words):
    path = tmp_path / "cal.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(CalibrationError) as info:
        gc.load(path)
    assert str(info.value).startswith(f"{path}: ") and words in str(info.value) and "\n" not in str(info.value)


# ---- which calibration applies, and what it changes ------------------------------------------

def _use(monkeypatch, tmp_path, cal) -> Path:
    path = tmp_path / "in-force.json"
    gc.dump(cal, path)
    monkeypatch.setenv(gc.ENV, str(path))
    gc.clear_cache()
    return path


def test_what_applies(monkeypatch, tmp_path):
    assert not gc.COMMITTED.exists(), "a measured calibration is committed: update the docs and this test"
    assert gc.active() is None and Roofline().calibration is None
    committed = tmp_path / "committed.json"
    gc.dump(TRUE, committed)
    monkeypatch.setattr(gc, "COMMITTED", committed)
    gc.clear_cache()
    assert gc.active() == TRUE and gc.active() is gc.active()       # read once
    monkeypatch.setenv(gc.ENV, "none")
    assert gc.active() is None and GpuRoofline().calibration is None
    monkeypatch.setenv(gc.ENV, str(tmp_path / "missing.json"))
    with pytest.raises(CalibrationError, match="missing.json: cannot read"):
        Roofline()


@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16"])
def test_without_a_calibration_the_figures_are_the_data_sheet_s_exactly(monkeypatch, precision):
    monkeypatch.setenv(gc.ENV, "none")
    r = Roofline(precision)
    for flop, elements, matrix in [(0.0, 1e3, False), (1e12, 1e6, True), (1e9, 1e9, False), (3e10, 2e7, True)]:
        peak = TFLOPS[precision] if matrix else TFLOPS["fp32"]
        want = LAUNCH_US + max(flop / (peak * 1e6), elements * BYTES[precision] / HBM_BYTES_PER_US)
        assert r.kernel_us(flop, elements, matrix) == want
        assert all(r.kernel_us(flop, elements, matrix, kind) == want for kind in gc.KINDS)
    assert r.host_us(1e6) == 2 * LAUNCH_US + 1e6 * 4 / 64e3


def _gemm(flops: float, elements: float) -> Kernel:
    return Kernel("k0", "gemm", "out", [], {}, {}, None, [], flops=flops,
                  elements_read=elements, elements_written=0.0)


def test_a_calibration_through_the_environment_changes_kernel_figures(monkeypatch, tmp_path):
    compute_bound = _gemm(2 * 4096.0 ** 3, 3 * 4096.0 ** 2)       # 2051 us of compute, 60 us of memory
    body = compute_bound.flops / PEAK
    assert compute_bound.modelled_us == LAUNCH_US + body
    cal = gc.Calibration("test", 5.0, {k: 1.0 for k in gc.KINDS}, {k: 1.0 for k in gc.KINDS} | {"gemm": 0.5})
    _use(monkeypatch, tmp_path, cal)
    assert compute_bound.modelled_us == pytest.approx(5.0 + 2 * body)
    memory_bound = _gemm(1e6, 1e8)
    assert memory_bound.modelled_us == pytest.approx(5.0 + 4e8 / HBM_BYTES_PER_US)
    assert Roofline().host_us(1e6) == pytest.approx(10.0 + 1e6 * 4 / 64e3)


def _matmul_cost() -> float:
    shapes = {"a": (4096, 4096), "b": (4096, 4096)}
    text = "(compute dot-product (access-cartesian-product (access (access-tensor a) 1) (access (access-tensor b) 1)))"
    eg = EGraph()
    return apsat.extract(eg, eg.add(apsat.parse(text, shapes)), cost="gpu").cost


def test_a_calibration_through_the_environment_changes_the_cost_model(monkeypatch, tmp_path):
    before = _matmul_cost()
    body = 2 * 4096.0 ** 3 / PEAK
    assert before == pytest.approx(LAUNCH_US + body)
    cal = gc.Calibration("test", 5.0, {k: 1.0 for k in gc.KINDS}, {k: 1.0 for k in gc.KINDS} | {"gemm": 0.5})
    _use(monkeypatch, tmp_path, cal)
    assert _matmul_cost() == pytest.approx(5.0 + 2 * body, rel=1e-6)
    monkeypatch.setenv(gc.ENV, "none")
    assert _matmul_cost() == before


def test_a_stored_gpu_result_is_not_reused_under_another_calibration(monkeypatch, tmp_path):
    from apsat.pipeline.store import content_key

    def key(target):
        return content_key(b"model", target, [], {"verify": True})
    before = {t: key(t) for t in ("gpu", "systolic:32x32")}
    _use(monkeypatch, tmp_path, TRUE)
    assert key("gpu") != before["gpu"]                          # priced under other figures
    assert key("systolic:32x32") == before["systolic:32x32"]    # no gpu figures read
    monkeypatch.setenv(gc.ENV, "none")
    assert key("gpu") == before["gpu"]


def test_each_node_is_priced_as_the_kernel_kind_the_backend_gives_it():
    atom, chain, shapes = forms((1, 2), (1, 2), 16, 16, 8, 8, 0, bias=True)
    pair = "(access-pair (access (access-tensor x) 2) (access (access-tensor y) 2))"
    rows = f"(access (access-transpose (compute (chain elementwise-add relu) {pair}) (list 1 0)) 1)"
    shapes = shapes | {"x": (16, 16), "y": (16, 16)}
    eg = EGraph()
    for text in (atom, chain, f"(compute reduce-sum {rows})", f"(compute (layer-norm 1e-05) {rows})"):
        eg.add(apsat.parse(text, shapes))
    graph = language_graph(eg.serialize())
    ops = {(n["op"], graph.nodes[graph.classes[graph.node_classes[nid][0]][0]]["op"] if n["op"] == "compute" else ""):
           kernel_kind(graph, nid) for nid, n in graph.nodes.items()
           if n["op"] in ("compute", "attention", "access-transpose")}
    assert ops == {("attention", ""): "attention", ("access-transpose", ""): "elementwise",
                   ("compute", "dot-product"): "gemm", ("compute", "elementwise-add"): "elementwise",
                   ("compute", "chain"): "elementwise", ("compute", "softmax"): "reduce",
                   ("compute", "reduce-sum"): "reduce", ("compute", "layer-norm"): "reduce"}


# ---- benchmarks/calibrate_gpu.py -------------------------------------------------------------

def _script():
    spec = importlib.util.spec_from_file_location("bench_calibrate_gpu", ROOT / "benchmarks" / "calibrate_gpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_script_fits_prints_and_writes(tmp_path, capsys):
    measured = tmp_path / "measured.json"
    host = {"model": "synthetic", "name": "host0", "kind": "host", "flops": 0.0, "bytes": 4e6,
            "modelled_us": 68.5, "measured_us": 900.0}         # over PCIe: not fitted
    measured.write_text(json.dumps({"gpu": TRUE.gpu, "commit": "abc123", "date": "2025-01-01",
                                    "kernels": synthetic(TRUE, kinds=("gemm", "reduce", "elementwise")) + [host]}))
    out = tmp_path / "gpu_calibration.json"
    assert _script().main([str(measured), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    lines = printed.splitlines()
    assert lines[0] == f"{TRUE.gpu} at abc123 (2025-01-01): 195 kernels (1 host step left out)"
    assert [line.split()[:2] for line in lines[2:6]] == [["gemm", "65"], ["reduce", "65"], ["elementwise", "65"],
                                                       ["all", "195"]]
    assert "attention    bandwidth 1.000  compute 1.000  (no kernels: data sheet)" in lines
    cal = gc.load(out)
    assert cal.gpu == TRUE.gpu and cal.launch_us == pytest.approx(4.5, rel=0.1)
    assert cal.compute["gemm"] == pytest.approx(0.5, rel=0.1) and cal.compute["attention"] == 1.0
    assert cal.provenance["commit"] == "abc123" and cal.provenance["date"] == "2025-01-01"
    assert cal.provenance["kernels"] == 195 and cal.provenance["error_after"]["median"] < 0.05
    assert _script().main([str(measured)]) == 0 and "wrote" not in capsys.readouterr().out


@pytest.mark.parametrize("text, words", [
    ("{", "not JSON"),
    (json.dumps({"gpu": "x", "commit": "abc", "date": "d", "kernels": []}), "'kernels' must be a non-empty list"),
    (json.dumps({"gpu": "x", "date": "d", "kernels": [{}]}), "'commit' must be a non-empty string"),
    (json.dumps({"gpu": "x", "commit": "abc", "date": "d",
                 "kernels": [{"kind": "conv", "flops": 1, "bytes": 1, "measured_us": 5}]}), "kernel 0: unknown kind"),
])
def test_the_script_on_a_malformed_file_says_one_line_and_exits_2(tmp_path, text, words):
    path = tmp_path / "measured.json"
    path.write_text(text)
    out = tmp_path / "cal.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "calibrate_gpu.py"), str(path), "--out", str(out)],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2 and proc.stdout == "" and not out.exists()
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(f"calibrate_gpu: {path}: ") and words in proc.stderr
