"""`apsat zoo` as a batch: worker processes, one failure row per bad model with its
reason while the others verify, results reused by a second run, limits per model."""
from __future__ import annotations

import json

import pytest

from apsat.cli import main


@pytest.fixture(scope="module")
def zoo_dir(tmp_path_factory, light_alexnet_zfnet):
    """alexnet and zfnet with random weights (seed 0, made once a session: tests/conftest.py),
    and a malformed file."""
    root = tmp_path_factory.mktemp("zoo")
    light_alexnet_zfnet(root)
    (root / "broken.onnx").write_bytes(b"\x08\x07 truncated")
    return root


def _rows(capsys) -> tuple[str, str]:
    captured = capsys.readouterr()
    return captured.out, captured.err


@pytest.mark.slow
def test_bad_model_is_one_row_and_the_rest_verify_then_reuse(zoo_dir, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["zoo", str(zoo_dir), "--out", str(out), "--jobs", "2"]) == 2   # one bad input
    table, err = _rows(capsys)
    broken = [li for li in err.splitlines() if li.startswith("apsat: broken:")]
    assert len(broken) == 1 and "truncated or corrupt ONNX file" in broken[0] and "Traceback" not in err
    for name in ("bvlc_alexnet", "zfnet512"):
        report = json.loads((out / name / "report.json").read_text())
        assert report["verification"]["ok"]
    assert len(list((out / "results").glob("*.json"))) == 2       # the good ones, stored
    assert main(["zoo", str(zoo_dir), "--out", str(out), "--jobs", "2"]) == 2
    table, _ = _rows(capsys)
    assert table.count("reused") == 2
    assert main(["zoo", str(zoo_dir / "zfnet512.onnx"), "--out", str(out), "--force"]) == 0
    table, _ = _rows(capsys)
    assert "reused" not in table and "zfnet512" in table


@pytest.mark.slow
def test_limits_fail_their_model_with_the_reason(zoo_dir, tmp_path, capsys):
    model = str(zoo_dir / "zfnet512.onnx")
    assert main(["zoo", model, "--out", str(tmp_path), "--model-timeout", "0.5"]) == 2
    _, err = _rows(capsys)
    assert "apsat: zfnet512: time limit 0.5 s hit in phase" in err
    assert main(["zoo", model, "--out", str(tmp_path), "--max-memory", "40"]) == 2
    _, err = _rows(capsys)
    assert "apsat: zfnet512: memory limit 40 MiB exceeded" in err
