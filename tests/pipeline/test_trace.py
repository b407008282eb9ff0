"""The why-trace: report["why"] names, for each fused atom of the chosen program, the rules
that built it in the order they applied, and `apsat explain OUT_DIR` prints it as trees
(a ResNet-50, a BERT, GPT-2's tanh-GELU products); bad directories are one-line errors."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from models import make_model
from onnx import helper

import apsat
from apsat.cli import EXIT_BAD_INPUT, EXIT_OK, main
from apsat.pipeline import zoo

REAL = Path(__file__).resolve().parents[1] / "data" / "real_zoo"


def _atoms_with(report: dict, head: str) -> list[dict]:
    return [a for a in report["why"]["atoms"] if a["atom"].startswith(head)]


def test_a_product_with_bias_and_activation_names_both_rules_in_order():
    rng = np.random.default_rng(0)
    weights = {"w": rng.standard_normal((16, 8)).astype(np.float32), "b": rng.standard_normal(8).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["y"])]
    res = apsat.optimize(make_model(nodes, {"x": (4, 16)}, ["y"], weights), target="gpu")
    [atom] = _atoms_with(res.report, "(fused-dot-bias-act (relu)")
    assert atom["rules"] == ["fusion/bias", "fusion/activation"]
    assert atom["tree"]["rule"] == "fusion/activation"
    assert [t["rule"] for t in atom["tree"]["from"]] == ["fusion/bias"]
    assert res.report["why"]["left_out"] == 0
    assert getattr(res.program, "graph", None) is None          # the e-graph's copy is let go


def test_gpt2_gelu_tanh_products_show_the_spelling_rule_before_the_fusion():
    res = apsat.optimize(REAL / "gpt2.onnx", target="gpu", verify=False)
    atoms = _atoms_with(res.report, "(fused-dot-bias-act (gelu-tanh)")
    assert len(atoms) == 2                                     # one MLP a layer, two layers
    for atom in atoms:
        rules = atom["rules"]
        assert rules.index("fusion/gelu-tanh") < rules.index("fusion/activation")
        assert rules[-1] == "fusion/activation" and "fusion/bias" in rules


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """`apsat optimize --out` for a ResNet-50 (the light zoo's) and a BERT (the real zoo's)."""
    out = tmp_path_factory.mktemp("explain")
    resnet = next(p for p in zoo.light_model_paths() if "resnet50" in p.stem)
    for path in (resnet, REAL / "bert.onnx"):
        assert main(["optimize", str(path), "--out", str(out), "--no-verify"]) == EXIT_OK
    return out


def test_explain_prints_the_trees_of_a_resnet50_and_a_bert(written, capsys):
    assert main(["explain", str(written), "--limit", "0"]) == EXIT_OK
    text = capsys.readouterr().out
    resnet = next(d for d in written.iterdir() if "resnet50" in d.name)
    for model in (resnet.name, "bert"):
        report = json.loads((written / model / "report.json").read_text())
        atoms = report["why"]["atoms"]
        assert atoms and all(a["rules"] for a in atoms if a["tree"]["rule"])
        assert f"{model}: {len(atoms)} atom(s) built by rewrites" in text
        for atom in atoms[:5]:
            assert f"{atom['tree']['node']}  <- {atom['tree']['rule']}" in text
    # ResNet-50's convolutions fuse their batch norm shift and relu; BERT merges Q, K and V
    assert "fusion/activation" in text and "merge/pair" in text


def test_explain_filters_by_rule(written, capsys):
    assert main(["explain", str(written / "bert"), "--rule", "merge/pair"]) == EXIT_OK
    text = capsys.readouterr().out
    assert "with merge/pair" in text and "<- merge/pair" in text


def test_explain_refuses_a_directory_without_a_report_in_one_line(tmp_path, capsys):
    assert main(["explain", str(tmp_path)]) == EXIT_BAD_INPUT
    assert capsys.readouterr().err.strip() == f"apsat: {tmp_path}: no report.json here or in a model directory under it"
    (tmp_path / "report.json").write_text(json.dumps({"ops_before": {}}))
    assert main(["explain", str(tmp_path)]) == EXIT_BAD_INPUT
    assert "has no why-trace" in capsys.readouterr().err
