"""Decide once (apsat/pipeline/plan.py): the extraction's candidates are lowered and
priced, the cheapest kept; the lowering decides nothing more; the report prices the
chosen program and the imported one by what the backend emits."""
from __future__ import annotations

import numpy as np
from models import make_model
from onnx import helper

import apsat
from apsat.backends.base import Backend, Lowered
from apsat.backends.gpu.lower import lower
from apsat.pipeline.plan import into_extraction, plan


class _Priced(Backend):
    """A backend that prices a candidate program given as a number at that number."""

    name = "priced"

    def lower(self, program, target, weights, options):
        return Lowered(program, None, {"cost": program})

    def price(self, lowered):
        return None if lowered.report["cost"] is None else {"cost": lowered.report["cost"], "unit": "us",
                                                            "kernels": 1}

    def run(self, lowered, tensors):
        raise NotImplementedError

    def write(self, lowered, directory, compile=False):
        raise NotImplementedError


def _candidates(costs):
    return [(f"v{i}", c) for i, c in enumerate(costs)]


def test_the_cheapest_candidate_is_kept_the_first_on_a_tie():
    chosen, _, figures = plan(_Priced(), _candidates([3.0, 1.0, 1.0, 2.0]), None, set(), {})
    assert chosen == 1.0 and figures["chosen"] == "v1"
    assert [v["cost"] for v in figures["variants"]] == [3.0, 1.0, 1.0, 2.0]


def test_a_backend_without_a_price_keeps_the_program_and_the_report():
    chosen, _, figures = plan(_Priced(), _candidates([None, 1.0]), None, set(), {})
    assert chosen is None and figures is None
    extraction = {"dag_cost": 5.0, "dag_cost_before": 10.0, "modelled_speedup": 2.0}
    into_extraction(extraction, figures, None)
    assert extraction == {"dag_cost": 5.0, "dag_cost_before": 10.0, "modelled_speedup": 2.0}


def _projections():
    """x (2, 5, 12) projected three ways to 8 columns each, y = q * k + v."""
    rng = np.random.default_rng(0)
    w = {f"w{n}": (rng.standard_normal((12, 8)) * 0.3).astype(np.float32) for n in "qkv"}
    nodes = [helper.make_node("MatMul", ["x", f"w{n}"], [n]) for n in "qkv"]
    nodes += [helper.make_node("Mul", ["q", "k"], ["qk"]), helper.make_node("Add", ["qk", "v"], ["y"])]
    return make_model(nodes, {"x": (2, 5, 12)}, ["y"], w)


def test_sibling_products_merge_where_the_price_says_and_only_there():
    """Q, K and V of one input: merged, one gemm reads x once, cheaper than three; the
    report prices that program and says so. lower() of the unmerged program keeps three."""
    res = apsat.optimize(apsat.load_onnx(_projections()), target="gpu", verify=True)
    ext = res.report["extraction"]
    assert ext["chosen"] == "siblings merged", ext["variants"]
    costs = {v["label"]: v["cost"] for v in ext["variants"]}
    assert costs["siblings merged"] < costs["as extracted"] and ext["dag_cost"] == costs["siblings merged"]
    assert any(t.op == "access-slice" and t.args[0].op.startswith("fused-dot-bias") for t in res.program.terms())
    assert [k.kind for k in lower(res.program).kernels].count("gemm") == 1
    assert res.report["verification"]["ok"]
    unmerged = apsat.optimize(apsat.load_onnx(_projections()), target="gpu", verify=False, rules=False)
    assert ext["dag_cost_before"] == unmerged.report["extraction"]["variants"][0]["cost"]
    assert [k.kind for k in lower(unmerged.model.program).kernels].count("gemm") == 3
