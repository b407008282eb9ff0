"""EGraph.serialize exports egglog's access shapes with the e-classes (one source of shapes).

The shapes in class_data are what egglog derived (shape_of's figures) for every Expr class,
and they agree with the registry's Python shape rules applied class by class to the
saturated e-graph, rewritten nodes (fused atoms, systolic arrays, im2col views) included:
the cross-check that used to be a second Python pass in every extraction.
"""
import json

import pytest

import apsat
from apsat.egraph.driver import EGraph as DriverEGraph
from apsat.egraph.serialize import class_shapes as exported_shapes
from apsat.explore.egraph import EGraph
from apsat.extract.decode import expr_child_classes, language_graph, node_args
from apsat.frontend.importer import load_onnx
from apsat.lang.ops import OPS
from apsat.lang.program import apply_shape_rule
from apsat.errors import ShapeError

from models import attention_block, small_convnet
from test_egglog_shapes import PROGRAMS, _program   # programs covering the whole registry


def python_class_shapes(graph, tensor_shapes: dict) -> dict:
    """Class id -> shape by the registry's Python rules: a class takes the shape of the
    first member whose children are shaped, repeated until nothing changes (what
    apsat.extract.shapes computed before the shapes came from egglog)."""
    shapes: dict = {}
    members = [nid for nid, node in graph.nodes.items() if node["op"] in OPS]
    kids = {nid: expr_child_classes(graph, nid) for nid in members}
    changed = True
    while changed:
        changed = False
        for nid in members:
            cls = graph.nodes[nid]["eclass"]
            if cls in shapes or any(c not in shapes for c in kids[nid]):
                continue
            try:
                args = node_args(graph, nid, lambda c: c)
                shapes[cls] = apply_shape_rule(graph.nodes[nid]["op"], args, shapes.__getitem__, tensor_shapes)
            except (ShapeError, KeyError, ValueError):
                continue
            changed = True
    return shapes


def _expr_classes(data) -> set:
    return {c for c, d in data["class_data"].items() if d["type"] == "Expr"}


@pytest.fixture(scope="module")
def registry_egraph():
    """Every op and compute operator of the registry, shapes derived by egglog alone."""
    eg = DriverEGraph(seed_every=0)
    programs = [_program(text) for text, _ in PROGRAMS]
    for p in programs:
        eg.add(p)
    return eg, programs


def test_every_expr_class_carries_egglogs_shape(registry_egraph):
    eg, programs = registry_egraph
    data = eg.serialize()
    assert all("shape" in data["class_data"][c] for c in _expr_classes(data))
    assert not any("shape" in d for d in data["class_data"].values() if d["type"] != "Expr")
    for p in programs:
        for term in p.terms():
            handle = eg.handle_of(term)
            it, item = data["class_data"][eg.class_of(handle)]["shape"]
            assert (tuple(it), tuple(item)) == eg.shape_of(handle) == p.shape_of(term), repr(term)


def test_serialized_shapes_are_plain_json_and_read_back_as_tuples(registry_egraph):
    eg, _ = registry_egraph
    data = eg.serialize()
    again = json.loads(json.dumps(data))
    assert again == data
    graph = language_graph(again)
    assert graph.shapes == {c: (tuple(d["shape"][0]), tuple(d["shape"][1]))
                            for c, d in data["class_data"].items() if "shape" in d}
    assert all(isinstance(s, tuple) and all(isinstance(p, tuple) for p in s) for s in graph.shapes.values())


@pytest.mark.parametrize("target", ["gpu", "systolic:8x8"])
@pytest.mark.parametrize("build", [small_convnet, attention_block], ids=["convnet", "attention"])
def test_exported_shapes_agree_with_pythons_rules_on_saturated_egraphs(build, target):
    eg = EGraph(target)
    eg.add_outputs(load_onnx(build()).program)
    eg.saturate()
    graph = language_graph(eg.serialize())
    python = python_class_shapes(graph, eg.tensor_shapes)
    assert graph.shapes == python
    assert set(graph.shapes) == {n["eclass"] for n in graph.nodes.values() if n["op"] in OPS}
    if target.startswith("systolic"):   # the rewrites' own nodes were shaped too
        assert "systolic-array" in {n["op"] for n in graph.nodes.values()}


def test_a_cyclic_class_keeps_its_shape():
    # x = transpose(transpose(x)) after the union: Python's member-by-member pass could
    # not shape a class whose members all depend on it; egglog shaped it before the union.
    eg = DriverEGraph()
    x = eg.add(apsat.parse("(access (access-tensor x) 1)", {"x": (3, 4)}))
    tt = eg.add(apsat.parse("(access-transpose (access-transpose (access (access-tensor x) 1) (list 1 0)) (list 1 0))",
                            {"x": (3, 4)}))
    eg.load_text(f"(union {x} {tt})")
    data = eg.serialize()
    assert data["class_data"][eg.class_of(x)]["shape"] == [[3], [4]]


def test_the_export_skips_a_class_without_a_derived_shape():
    # An ndim row with no dim rows (a shape rule that stopped half way) gives no shape
    # rather than a guessed one.
    eg = DriverEGraph()
    eg.add(apsat.parse("(access (access-tensor x) 1)", {"x": (3, 4)}))
    eg.load_text("(let $e (access-tensor \"never-added\")) (set (ndim $e) 2) (set (split $e) 1)")
    frozen = eg._g.freeze().functions
    shapes = exported_shapes(eg._g, frozen)
    assert len(shapes) == 2 and [[3], [4]] in shapes.values()
