"""Sibling merges taken together (apsat/extract/sharing.py): every used class that can read
a slice of one merged product takes it, directly or under its own activation; a merge
that would close a cycle or has one member is left alone; and on a real e-graph the
merged candidate is a valid program one gemm computes."""
from __future__ import annotations

from models import make_model
import numpy as np
from onnx import helper

import apsat
from apsat.extract import extract_candidates
from apsat.extract.check import check_extraction
from apsat.extract.graph import ExtractionGraph
from apsat.extract.sharing import merge_siblings
from apsat.rules.saturate import saturate


def _graph(product_reads_a=False, act_on_b=False, bounds=False):
    """root = pair(a, b); a and b products of x, each also a slice of product m (b, with
    act_on_b, through relu(d), d a slice of m); m reads a itself with product_reads_a; with
    bounds, a's slice also reads a bound class (as egglog's i64 classes are)."""
    def node(op, cls, *kids):
        return {"op": op, "eclass": cls, "children": list(kids), "cost": 1.0}

    nodes = {n: node("access-tensor", n) for n in ("x", "wa", "wb", "w", "lo")}
    nodes.update(r0=node("access-pair", "r", "a0", "b0"),
                 a0=node("fused-dot-bias", "a", "x", "wa", "wa"), a1=node("access-slice", "a", "m0", *(["lo"] if bounds else [])),
                 m0=node("fused-dot-bias", "m", "x", "a0" if product_reads_a else "w", "w"))
    if act_on_b:
        nodes.update(b0=node("fused-dot-bias-act", "b", "x", "wb", "wb"), b1=node("compute", "b", "x", "d0"),
                     d0=node("access-slice", "d", "m0"), d1=node("fused-dot-bias", "d", "x", "wb", "wb"))
    else:
        nodes.update(b0=node("fused-dot-bias", "b", "x", "wb", "wb"), b1=node("access-slice", "b", "m0"))
    graph = ExtractionGraph.from_json({"nodes": nodes, "root_eclasses": ["r"]})
    choice = {c: ns[0] for c, ns in graph.classes.items()}
    return graph, choice


def test_siblings_take_their_slices_of_one_product():
    graph, choice = _graph()
    merged = merge_siblings(graph, choice, ["r"])
    assert merged["a"] == "a1" and merged["b"] == "b1" and merged["m"] == "m0"
    assert "wa" not in merged and "wb" not in merged       # exactly the classes used
    assert sorted(check_extraction(graph, merged, ["r"])) == ["a", "b", "m", "r", "w", "x"]


def test_a_member_under_its_own_activation_reads_its_slice_through_it():
    graph, choice = _graph(act_on_b=True)
    merged = merge_siblings(graph, choice, ["r"])
    assert (merged["a"], merged["b"], merged["d"]) == ("a1", "b1", "d0")


def test_classes_the_slices_newly_read_come_from_fill():
    """An extractor's choice covering only the classes it uses (the ILP's): the merged
    product and a slice's bound class are taken from `fill`."""
    graph, full = _graph(bounds=True)
    used = {c: full[c] for c in ("r", "a", "b", "x", "wa", "wb")}
    merged = merge_siblings(graph, used, ["r"], fill=full)
    assert merged["lo"] == "lo" and merged["m"] == "m0"
    assert merge_siblings(graph, used, ["r"], fill=used) is None     # nothing to complete from


def test_a_merge_that_closes_a_cycle_is_left_alone():
    graph, choice = _graph(product_reads_a=True)
    assert merge_siblings(graph, choice, ["r"]) is None


def test_one_member_is_no_merge():
    graph, choice = _graph()
    graph.classes["b"] = ["b0"]                            # b cannot read a slice of m
    assert merge_siblings(graph, choice, ["r"]) is None


def test_the_merged_candidate_of_a_real_egraph_is_one_gemm():
    """Q, K and V of one input after the default gpu plan: the extractor keeps three
    products (greedy-DAG prices each slice as the whole); the merged candidate has one
    product over the three weights, and both evaluate alike."""
    rng = np.random.default_rng(0)
    w = {f"w{n}": (rng.standard_normal((12, 8)) * 0.3).astype(np.float32) for n in "qkv"}
    nodes = [helper.make_node("MatMul", ["x", f"w{n}"], [n]) for n in "qkv"]
    nodes += [helper.make_node("Mul", ["q", "k"], ["qk"]), helper.make_node("Add", ["qk", "v"], ["y"])]
    m = apsat.load_onnx(make_model(nodes, {"x": (2, 5, 12)}, ["y"], w))
    eg = apsat.EGraph(target="gpu")
    handles = eg.add_outputs(m.program)
    saturate(eg)
    for method in ("greedy-dag", "ilp"):
        (label0, extracted), (label1, merged) = extract_candidates(eg, handles, method=method)
        assert (label0, label1) == ("as extracted", "siblings merged")
        products = [t for t in merged.terms() if t.op.startswith("fused-dot-bias")]
        assert len(products) == 1 and merged.shape_of(products[0])[0][-1] == 24
        tensors = {"x": rng.standard_normal((2, 5, 12)).astype(np.float32), **w}
        np.testing.assert_allclose(apsat.evaluate(merged, tensors), apsat.evaluate(extracted, tensors),
                                   rtol=1e-5, atol=1e-6)
