"""The command line: reports written, one-line errors, exit codes."""
import json

import onnx
import pytest

from apsat.cli import main
from apsat.pipeline.zoo import light_model_paths, randomize_weights

SQUEEZENET = next(p for p in light_model_paths() if "squeezenet" in p.name)


def test_optimize_writes_report_and_program(tmp_path, capsys):
    model = tmp_path / "squeezenet.onnx"
    onnx.save(randomize_weights(onnx.load(str(SQUEEZENET)), seed=3), str(model))
    rc = main(["optimize", str(model), "--out", str(tmp_path / "out"), "--no-compile"])
    assert rc == 0
    report = json.loads((tmp_path / "out" / "squeezenet" / "report.json").read_text())
    kernels = report["gpu_kernels"]["kernels"]
    assert kernels and report["gpu_kernels"]["totals"]["kernels"] == len(kernels)
    for k in kernels:       # sources written, nothing compiled (--no-compile)
        assert (tmp_path / "out" / "squeezenet" / "kernels" / f"{k['name']}.cu").exists()
        assert (tmp_path / "out" / "squeezenet" / "kernels" / f"{k['name']}.py").exists()
        assert k["cuda"]["registers"] is None
    assert report["verification"]["ok"] and report["ops_before"]["Conv"] == 26
    assert report["egraph"]["nodes"] > 0 and set(report["seconds"]) >= {"import", "egraph", "extract", "verify"}
    from apsat.lang.syntax import parse_dag_text

    text = (tmp_path / "out" / "squeezenet" / "program.txt").read_text()
    assert list(parse_dag_text(text)) == ["softmaxout_1"]
    assert "apsat summary" in capsys.readouterr().out


@pytest.mark.parametrize("content, message", [
    (b"", "empty"),
    (b"this is not a protobuf at all \xff\xfe", "not an onnx file"),
])
def test_optimize_bad_file_is_one_line_error(tmp_path, capsys, content, message):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(content)
    rc = main(["optimize", str(bad), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2
    lines = [li for li in err.splitlines() if li.startswith("apsat: bad:")]
    assert len(lines) == 1 and message in lines[0].lower()


def test_zoo_on_a_directory_and_missing_model(tmp_path, capsys):
    rc = main(["zoo", str(tmp_path / "nope.onnx"), "--out", str(tmp_path / "out")])
    assert rc == 2
    err = capsys.readouterr().err
    assert "apsat: nope:" in err and "nope.onnx" in err


def test_extract_command_prints_json(tmp_path, capsys):
    g = {"nodes": {"a": {"op": "x", "children": [], "eclass": "c", "cost": 2.5}},
         "root_eclasses": ["c"], "class_data": {}}
    path = tmp_path / "g.json"
    path.write_text(json.dumps(g))
    assert main(["extract", str(path), "--method", "tree", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["method"] == "tree" and result["dag_cost"] == 2.5


def test_extract_command_refuses_non_egraph(tmp_path, capsys):
    path = tmp_path / "g.json"
    path.write_text("[1, 2]")
    assert main(["extract", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("apsat: ") and "not an extraction-gym e-graph" in err and err.count("\n") == 1


def test_rules_check_and_list(tmp_path, capsys):
    good = tmp_path / "mine.egg"
    good.write_text("; mine\n(ruleset mine)\n; relu(relu x) -> relu x\n"
                    "(rewrite (compute (relu) (compute (relu) x)) (compute (relu) x) :ruleset mine :name \"mine/idem\")\n")
    assert main(["rules", "check", str(good)]) == 0
    assert "ok: 1 rules in ruleset(s) mine" in capsys.readouterr().out
    assert main(["rules", "list", str(good)]) == 0
    out = capsys.readouterr().out
    assert "mine" in out and f"mine/idem  {good.resolve()}:4" in out
    bad = tmp_path / "bad.egg"
    bad.write_text("(ruleset b)\n(run b 10)\n")
    assert main(["rules", "check", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.strip().endswith("`run` is not allowed in a rule file: only ruleset, rewrite, birewrite, rule, "
                                "pattern, relation and function declarations") and f"{bad}:2:" in err


def test_optimize_gpu_compiles_kernels_for_sm90(tmp_path):
    import shutil

    from models import single_op

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not installed: kernels are written as sources only")
    model = tmp_path / "relu.onnx"
    onnx.save(single_op("Relu", [(4, 37)]), str(model))
    assert main(["optimize", str(model), "--out", str(tmp_path / "out"), "--compile"]) == 0
    report = json.loads((tmp_path / "out" / "relu" / "report.json").read_text())
    (kernel,) = report["gpu_kernels"]["kernels"]
    assert kernel["cuda"]["error"] is None and kernel["cuda"]["registers"] > 0
    assert (tmp_path / "out" / "relu" / "kernels" / f"{kernel['name']}.cubin").exists()


def test_a_simulator_mismatch_fails_the_run_like_a_verification_mismatch():
    from apsat.cli import failed as _failed

    ok = {"ok": True}
    assert not _failed({"verification": ok, "systolic": {"simulation": ok}})
    assert _failed({"verification": ok, "systolic": {"simulation": {"ok": False}}})
    assert _failed({"verification": {"ok": False}})
    assert not _failed({})


def test_optimize_with_systolic_lowering_options(tmp_path):
    # Conv -> BatchNorm -> ReLU lowered with every option: the report records them and
    # the simulator still equals onnxruntime
    rc = main(["optimize", _small_model(tmp_path), "--target", "systolic:32x32", "--lowering", "gather,fold,zips",
               "--out", str(tmp_path / "out")])
    assert rc == 0
    report = json.loads((tmp_path / "out" / "cbr" / "report.json").read_text())
    assert report["systolic"]["lowering"] == {"im2col": "gather", "fold_copies": True, "fuse_zips": True}
    assert report["systolic"]["simulation"]["ok"]


def _small_model(tmp_path):
    import models

    model = tmp_path / "cbr.onnx"
    onnx.save(models.conv_batchnorm(), str(model))
    return str(model)


def test_an_unknown_lowering_option_is_refused_on_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["optimize", _small_model(tmp_path), "--target", "systolic:32x32", "--lowering", "gather,warp"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert [li for li in err.splitlines() if "unknown lowering option(s) warp" in li], err


def test_lowering_options_for_a_gpu_target_are_a_one_line_error(tmp_path, capsys):
    rc = main(["optimize", _small_model(tmp_path), "--lowering", "all", "--out", str(tmp_path / "out")])
    assert rc == 2
    lines = [li for li in capsys.readouterr().err.splitlines() if li.startswith("apsat: cbr:")]
    assert len(lines) == 1 and "lowering options apply to systolic targets" in lines[0]


def test_a_failed_gpu_kernel_run_fails_the_run_and_a_skipped_one_does_not():
    from apsat.cli import failed as _failed

    ok = {"ok": True}
    assert _failed({"verification": ok, "gpu_kernels": {"run": {"ok": False}}})
    assert not _failed({"verification": ok, "gpu_kernels": {"run": {"skipped": "no GPU here"}}})
