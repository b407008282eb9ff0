"""Adding an op touches its declaration with shape rule, the interpreter, each cost model and
the importer. This test walks the op registry and fails on any part that is missing."""
from pathlib import Path

import pytest

import apsat.egraph
from apsat.egraph.ops import COMPUTE_OPS, EGG_NAMES, OPS, PAD_TYPES
from apsat.egraph.syntax import _read_sexprs

LANGUAGE = Path(apsat.egraph.__file__).with_name("language.egg")


def _forms():
    """Top-level forms of language.egg as (head, set of atoms anywhere inside)."""
    out = []
    for form in _read_sexprs(LANGUAGE.read_text()):
        if not isinstance(form, list) or not form:
            continue
        atoms, stack = set(), [form]
        while stack:
            node = stack.pop()
            if isinstance(node, list):
                stack.extend(node)
            else:
                atoms.add(node[0])
        out.append((form[0][0] if not isinstance(form[0], list) else "", atoms))
    return out


DECLARING = {"datatype", "datatype*", "constructor", "sort"}


@pytest.mark.parametrize("name", sorted(set(OPS) | set(COMPUTE_OPS) | set(PAD_TYPES)))
def test_declared_in_language_egg(name):
    name = EGG_NAMES.get(name, name)
    assert any(head in DECLARING and name in atoms for head, atoms in _forms()), \
        f"{name} has no egglog declaration in {LANGUAGE.name}"


@pytest.mark.parametrize("name", sorted(OPS))
def test_every_op_has_an_egglog_shape_rule(name):
    assert any(head == "rule" and name in atoms for head, atoms in _forms()), \
        f"{name} has no shape rule in {LANGUAGE.name}"


@pytest.mark.parametrize("name", sorted(COMPUTE_OPS))
def test_every_compute_operator_has_an_egglog_shape_rule(name):
    name = EGG_NAMES.get(name, name)
    assert any(head == "rule" and name in atoms for head, atoms in _forms()), \
        f"compute operator {name} has no shape rule in {LANGUAGE.name}"


def test_reference_semantics_cover_the_registry():
    from apsat.backends.reference import COMPUTE_EVALUATORS, EVALUATORS

    assert set(EVALUATORS) == set(OPS)
    assert set(COMPUTE_EVALUATORS) == set(COMPUTE_OPS)


def test_importer_entries_exist():
    from apsat.egraph.lowering import LOWERINGS

    for spec in list(OPS.values()) + list(COMPUTE_OPS.values()):
        if isinstance(spec.onnx, str):
            assert spec.onnx.strip(), f"{spec.name}: no importer entry and no reason why"
            continue
        for onnx_op in spec.onnx:
            if not onnx_op.startswith("<"):
                assert onnx_op in LOWERINGS, f"{spec.name} names ONNX {onnx_op}, which has no lowering"


def test_every_cost_model_prices_every_op():
    from apsat.extract.cost import COST_MODELS
    from apsat.extract.graph import ExtractionGraph

    nodes = {f"n{i}": {"op": op, "children": [], "eclass": f"c{i}", "cost": 1} for i, op in enumerate(OPS)}
    graph = ExtractionGraph.from_json({"nodes": nodes, "root_eclasses": [], "class_data": {}})
    for name, model in COST_MODELS.items():
        cost = model().node_cost(graph)
        for nid, node in nodes.items():
            value = cost(nid)
            assert value >= 0 and value == value, f"cost model {name} has no cost for {node['op']}"
