"""benchmarks/kernels.py on the small real-zoo ViT (a few seconds): its layer attribution
puts the two encoder layers' kernels in two layers of equal size, outside plus the layers
add up to the kernel count, the tables print; and the ViT-B/16 attention traffic table's
unfused program moves more than the scores it stores."""
from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _load():
    spec = importlib.util.spec_from_file_location("bench_kernels", ROOT / "benchmarks" / "kernels.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_before_is_the_default_plan_without_the_fusion_rulesets():
    """"before" leaves out exactly the fusion rulesets and keeps every other phase."""
    from apsat.rules.saturate import default_plan

    bench = _load()
    assert set(bench.switched_off()) == set(bench.FUSION_RULESETS)
    before = {p.name: p.rulesets for p in bench.before_plan()}
    for phase in default_plan("gpu"):
        kept = tuple(r for r in phase.rulesets if r not in bench.FUSION_RULESETS)
        assert before.get(phase.name, ()) == kept and kept, phase.name


def test_vit_kernels_per_layer(capsys):
    bench = _load()
    (entry,) = [m for m in bench.models(["vit"], "real") if m["name"] == "vit"]
    assert entry["layers"] == 2
    row = bench.measure(entry)
    assert row["status"] == "ok", row["status"]
    for which in ("after", "before"):
        fig = row[which]
        per = fig["per_layer"]
        counts = list(per["layers"].values())
        assert len(counts) == 2 and counts[0] == counts[1] > 0, (which, per["names"])
        assert per["outside"] + sum(counts) == fig["kernels"], (which, per["names"])
    assert row["after"]["kernels"] < row["before"]["kernels"] and row["ort_nodes"] > 0   # attention fuses
    assert bench._priced_cell(row["after"]) == "same"          # priced as emitted
    bench.print_models([row])
    out = capsys.readouterr().out
    assert bench.footer([row]) and "vit" in out and " same  ok" in out


def test_vit_b16_attention_traffic():
    bench = _load()
    rows = {r["variant"]: r for r in bench.attention_traffic()}
    unfused = rows["unfused"]
    assert "error" not in unfused, unfused
    scores = 12 * 197 * 197
    assert unfused["read"] + unfused["written"] > scores and unfused["kernels"] >= 2
    fused = rows["fused"]
    if "error" not in fused:   # the gpu attention kernel, where the backend has it
        assert fused["read"] + fused["written"] < unfused["read"] + unfused["written"]
