"""End to end on real models: import -> e-graph -> extract -> reference interpreter, compared
with onnxruntime on the original model.

Tolerance rtol 1e-4 / atol 1e-5 (apsat.pipeline.verify): both sides compute in float32 but sum in
different orders (tensordot over im2col windows vs onnxruntime's direct convolution), so
sums of up to ~25k products differ by a few ulps each; the logits before the final Softmax
are compared too, since a Softmax over 1000 classes can hide errors in its input.
"""
import onnx
import pytest

from apsat.pipeline.optimize import optimize
from apsat.pipeline.zoo import light_model_paths, logits_output, randomize_weights, softmax_logits

LIGHT = {p.stem.replace("light_", ""): p for p in light_model_paths()}


def test_light_zoo_is_found():
    assert len(LIGHT) == 9


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(LIGHT))
def test_light_model_extracted_program_matches_onnxruntime(name):
    original = randomize_weights(onnx.load(str(LIGHT[name])), seed=1)
    proto = logits_output(original)
    res = optimize(proto, rules=False, verify=True, seed=2)  # the foundation: no rewriting
    v = res.report["verification"]
    # every model output, plus the logits before a final Softmax where there is one
    assert set(v["outputs"]) == {o.name for o in original.graph.output} | set(softmax_logits(original))
    assert v["ok"], f"{name}: max abs err {v['max_abs_err']:.3g}, max rel err {v['max_rel_err']:.3g}"
    # the extracted program is the imported one: no rule ran, so nothing merged either
    assert res.report["opaque_calls"] == []
    assert res.report["extraction"]["chosen"] == "as extracted"
    assert sum(res.report["ops_after"].values()) == len(res.model.program.terms())


@pytest.mark.slow
def test_region_mode_is_chosen_by_program_size_and_reuse(monkeypatch):
    """regions=None (the default) saturates by regions only past REGIONS_PAST terms, and
    there only when most regions repeat; the report says which and why; by regions the
    result verifies."""
    from apsat.pipeline import optimize as opt

    path = next(p for p in light_model_paths() if p.stem == "light_shufflenet")   # 75 % of its regions repeat
    res = optimize(path, target="gpu")
    assert res.report["saturation"]["regions"]["used"] is False
    assert "<= 10,000" in res.report["saturation"]["regions"]["why"]
    monkeypatch.setattr(opt, "REGIONS_PAST", 100)
    res = optimize(path, target="gpu")
    assert res.report["saturation"]["regions"] == {"used": True, "why": "1,949 terms > 100, 75% of its regions repeated"}
    assert res.report["verification"]["ok"]
    monkeypatch.setattr(opt, "REUSE_AT_LEAST", 0.9)
    assert optimize(path, target="gpu").report["saturation"]["regions"]["used"] is False
    assert optimize(path, target="gpu", regions=False).report["saturation"]["regions"] == \
        {"used": False, "why": "asked"}
