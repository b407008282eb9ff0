"""Saturation by regions: regions found at shared values, identical blocks saturated once,
and the instantiated result equals onnxruntime (the same tolerance as every model check)."""
import onnx
import pytest

import apsat
from apsat.explore.egraph import EGraph
from apsat.extract import extract
from apsat.rules.regions import find_regions
from apsat.pipeline.verify import verify_program
from apsat.pipeline.zoo import light_model_paths, random_inputs, randomize_weights

RESNET = next(p for p in light_model_paths() if "resnet50" in p.name)


def test_regions_cut_at_shared_values_and_share_keys():
    # y = relu(x) used twice: two identical residual blocks over different weights
    text = "(compute relu (access (access-tensor x) 1))"
    prog = apsat.parse(text, {"x": (4, 8)})
    x = prog.root
    from apsat.lang.term import Term

    def block(inp, w):
        prod = Term("compute", (Term("dot-product", ()), Term("access-cartesian-product", (
            inp, Term("access", (Term("access-tensor", (w,)), 1))))))
        prod = Term("access", (prod, 1))  # ((4, 8), ()) -> ((4), (8)), the input's layout
        return Term("compute", (Term("elementwise-add", ()), Term("access-pair", (prod, inp))))

    y = block(block(x, "w1"), "w2")
    program = apsat.Program({"y": y}, {"x": (4, 8), "w1": (8, 8), "w2": (8, 8)})
    regions = find_regions(program)
    roots = [r.root for r in regions]
    assert x in roots and y in roots and len(regions) == 3
    blocks = [r for r in regions if r.root is not x]
    assert blocks[0].key == blocks[1].key  # same structure and shapes, other weights


@pytest.mark.slow
@pytest.mark.parametrize("target", ["gpu", "systolic:32x32"])
def test_resnet50_by_regions_reuses_blocks_and_verifies(target):
    model = apsat.load_onnx(randomize_weights(onnx.load(str(RESNET)), seed=4))
    eg = EGraph(target)
    handles = eg.add_outputs(model.program)
    report = eg.saturate(regions=model.program)
    stats = report["regions"]
    assert stats["regions"] == 77 and stats["distinct"] == 26 and stats["reuse_rate"] > 0.6
    # every phase saturates but layout, which the default plans stop after 12 iterations
    # (apsat/rules/saturate.py says why)
    assert all(ph["stop_reason"] == "saturated" or (ph["phase"], ph["stop_reason"]) == ("layout", "iter_limit")
               for ph in report["phases"])
    assert report["nodes"] > len(model.program.terms())
    v = verify_program(model, extract(eg, handles), random_inputs(model, 0))
    assert v.ok, v
