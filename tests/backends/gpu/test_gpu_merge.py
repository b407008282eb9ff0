"""Sibling products merged into one gemm, as the e-graph offers (apsat/rules/merge.egg),
extraction takes (apsat/extract/sharing.py) and the planner prices
(apsat/pipeline/plan.py): which products merge, which do not and why, and that the
merged kernels equal onnxruntime under the Triton interpreter (apsat.pipeline.verify's
tolerances: rtol 1e-4, atol 1e-5 x the output's scale)."""
from __future__ import annotations

import numpy as np
from gpu_cases import optimized_matches_onnxruntime
from models import make_model
from onnx import helper

import apsat
from apsat.backends.gpu.lower import lower


def _projections(bias=True, seed=0):
    """x (2, 5, 12) projected three ways (MatMul [+ Add bias]) to 7, 9 and 7 columns;
    y = q * k + v (the products are not outputs themselves)."""
    rng = np.random.default_rng(seed)
    w = {}
    nodes = []
    for name, n in (("q", 7), ("k", 9), ("v", 7)):
        w[f"w{name}"] = (rng.standard_normal((12, n)) * 0.3).astype(np.float32)
        out = f"{name}m" if bias else name
        nodes.append(helper.make_node("MatMul", ["x", f"w{name}"], [out]))
        if bias:
            w[f"b{name}"] = rng.standard_normal(n).astype(np.float32)
            nodes.append(helper.make_node("Add", [out, f"b{name}"], [name]))
    w["sel"] = np.arange(9, dtype=np.int64)[:7]
    nodes += [helper.make_node("Gather", ["k", "sel"], ["k7"], axis=2),
              helper.make_node("Mul", ["q", "k7"], ["qk"]),
              helper.make_node("Add", ["qk", "v"], ["y"])]
    return make_model(nodes, {"x": (2, 5, 12)}, ["y"], w)


def _gemms(graph):
    return [k for k in graph.kernels if k.kind == "gemm"]


def test_three_projections_of_one_input_are_one_gemm(triton_run):
    _, graph = optimized_matches_onnxruntime(_projections(bias=True), triton_run)
    (gemm,) = _gemms(graph)
    assert gemm.axes["n"] == (23,)                  # 7 + 9 + 7 columns
    assert {"wq", "wk", "wv", "bq", "bk", "bv"} <= set(gemm.reads)


def test_projections_without_bias_merge_too(triton_run):
    """MatMul alone is a dot-product over a cartesian product: merged the same way."""
    _, graph = optimized_matches_onnxruntime(_projections(bias=False), triton_run)
    (gemm,) = _gemms(graph)
    assert gemm.axes["n"] == (23,)


def test_products_of_per_inference_operands_do_not_merge():
    """x @ y1 and x @ y2 with y1, y2 graph inputs: the B side is not weights, so a
    product could depend on its sibling; nothing merges."""
    nodes = [helper.make_node("MatMul", ["x", "y1"], ["a"]),
             helper.make_node("MatMul", ["x", "y2"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["y"])]
    res = apsat.optimize(apsat.load_onnx(make_model(nodes, {"x": (4, 6), "y1": (6, 5), "y2": (6, 5)}, ["y"])),
                         target="gpu", verify=False)
    assert [v["label"] for v in res.report["extraction"]["variants"]] == ["as extracted"]
    assert len(_gemms(lower(res.program))) == 2


def test_program_outputs_are_merged_only_where_the_copies_pay():
    """Two projections that are both outputs: the merged product's slices each need a
    copy out, which the planner prices (3 kernels against 2) and declines."""
    rng = np.random.default_rng(3)
    w = {"w1": rng.standard_normal((6, 5)).astype(np.float32),
         "w2": rng.standard_normal((6, 5)).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["a"]),
             helper.make_node("MatMul", ["x", "w2"], ["b"])]
    res = apsat.optimize(apsat.load_onnx(make_model(nodes, {"x": (4, 6)}, ["a", "b"], w)),
                         target="gpu", verify=True)
    ext = res.report["extraction"]
    priced = {v["label"]: v for v in ext["variants"]}
    assert ext["chosen"] == "as extracted"
    assert priced["siblings merged"]["kernels"] > priced["as extracted"]["kernels"] == 2
    assert priced["siblings merged"]["cost"] > priced["as extracted"]["cost"]
    assert res.report["verification"]["ok"]


def test_gate_with_silu_and_up_merge_into_one_gemm(triton_run):
    """Llama's MLP: silu(x @ Wg) * (x @ Wu) @ Wd. The gate's SiLU (an activation in its
    atom) moves onto its slice of the merged product; the product of the two slices is
    the down projection's prologue: two gemms."""
    rng = np.random.default_rng(4)
    w = {"wg": (rng.standard_normal((12, 10)) * 0.3).astype(np.float32),
         "wu": (rng.standard_normal((12, 10)) * 0.3).astype(np.float32),
         "wd": (rng.standard_normal((10, 12)) * 0.3).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "wg"], ["g"]),
             helper.make_node("Sigmoid", ["g"], ["sg"]),
             helper.make_node("Mul", ["g", "sg"], ["silu"]),
             helper.make_node("MatMul", ["x", "wu"], ["u"]),
             helper.make_node("Mul", ["silu", "u"], ["h"]),
             helper.make_node("MatMul", ["h", "wd"], ["y"])]
    res, graph = optimized_matches_onnxruntime(make_model(nodes, {"x": (2, 5, 12)}, ["y"], w), triton_run)
    assert "silu" in {t.args[0].op for t in res.program.terms() if t.op in ("compute", "fused-dot-bias-act")}
    gate_up, down = _gemms(graph)
    assert gate_up.axes["n"] == (20,) and down.axes["k"] == (10,)


def test_siblings_in_different_regions_merge_when_saturating_by_regions():
    """q read twice is a region of its own, k and v lie in y's region: by regions each
    is saturated apart, and the merge phase runs once more over the whole e-graph
    (Phase.whole), so the three still become one gemm."""
    rng = np.random.default_rng(5)
    w = {f"w{n}": (rng.standard_normal((12, 8)) * 0.3).astype(np.float32) for n in "qkv"}
    nodes = [helper.make_node("MatMul", ["x", f"w{n}"], [n]) for n in "qkv"]
    nodes += [helper.make_node("Mul", ["q", "k"], ["qk"]), helper.make_node("Add", ["qk", "v"], ["s"]),
              helper.make_node("Add", ["s", "q"], ["y"])]
    res = apsat.optimize(apsat.load_onnx(make_model(nodes, {"x": (2, 5, 12)}, ["y"], w)),
                         target="gpu", regions=True, verify=True)
    sat = res.report["saturation"]
    assert sat["regions"]["used"] and [p for p in sat["phases"] if p.get("whole")][0]["phase"] == "merge"
    assert res.report["extraction"]["chosen"] == "siblings merged"
    assert len(_gemms(lower(res.program))) == 1 and res.report["verification"]["ok"]
