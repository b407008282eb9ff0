"""Adding an op touches its declaration with shape rule, the interpreter, each cost model and
the importer. This test walks the op registry and fails on any part that is missing."""

import pytest

from apsat.lang.ops import COMPUTE_OPS, EGG_NAMES, OPS, PAD_TYPES
from apsat.egraph.egglog_io import language_text
from apsat.lang.syntax import _read_sexprs

LANGUAGE = "language.egg / shape_rules.egg"


def _forms():
    """Top-level forms of the language's egglog files as (head, set of atoms anywhere inside)."""
    out = []
    for form in _read_sexprs(language_text()):
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
        f"{name} has no egglog declaration in {LANGUAGE}"


@pytest.mark.parametrize("name", sorted(OPS))
def test_every_op_has_an_egglog_shape_rule(name):
    assert any(head == "rule" and name in atoms for head, atoms in _forms()), \
        f"{name} has no shape rule in {LANGUAGE}"


@pytest.mark.parametrize("name", sorted(COMPUTE_OPS))
def test_every_compute_operator_has_an_egglog_shape_rule(name):
    name = EGG_NAMES.get(name, name)
    assert any(head == "rule" and name in atoms for head, atoms in _forms()), \
        f"compute operator {name} has no shape rule in {LANGUAGE}"


def test_reference_semantics_cover_the_registry():
    from apsat.lang.evaluate import COMPUTE_EVALUATORS, EVALUATORS

    assert set(EVALUATORS) == set(OPS)
    assert set(COMPUTE_EVALUATORS) == set(COMPUTE_OPS)


def test_importer_entries_exist():
    from apsat.frontend.lowering import LOWERINGS

    for spec in list(OPS.values()) + list(COMPUTE_OPS.values()):
        if isinstance(spec.onnx, str):
            assert spec.onnx.strip(), f"{spec.name}: no importer entry and no reason why"
            continue
        for onnx_op in spec.onnx:
            if not onnx_op.startswith("<"):
                assert onnx_op in LOWERINGS, f"{spec.name} names ONNX {onnx_op}, which has no lowering"


def _priced_examples():
    """An e-graph holding one program per op and per compute operator, serialised with its
    class shapes, as cost models see it."""
    from test_syntax import EXAMPLES, SHAPES, operator_head

    from apsat.explore.egraph import EGraph
    from apsat.lang.syntax import parse_term
    from apsat.extract.decode import language_graph
    from apsat.extract.shapes import class_shapes

    eg = EGraph()
    for text in EXAMPLES:
        eg.add(parse_term(text), SHAPES)
    for op in COMPUTE_OPS:
        head = operator_head(op)
        n = {"elementwise-sub": 2, "elementwise-div": 2, "elementwise-pow": 2, "select": 3}.get(op, 2)
        eg.add(parse_term(f"(compute {head} (access (access-tensor a{n}) 1))"), {f"a{n}": (5, n, 4)})
    graph = language_graph(eg.serialize())
    graph.shapes = class_shapes(graph, eg.tensor_shapes)
    return graph


def test_every_op_has_one_workload_class_and_every_operator_an_arithmetic_figure():
    from apsat.extract.workload import check_classified

    check_classified()


@pytest.mark.parametrize("model", ["nodes", "gpu", "systolic"])
def test_every_cost_model_prices_every_op(model):
    from apsat.extract.cost import COST_MODELS, cost_model

    assert model in COST_MODELS
    graph = _priced_examples()
    cost = cost_model(model).node_cost(graph)
    seen_ops, seen_operators = set(), set()
    for nid, node in graph.nodes.items():
        value = cost(nid)
        assert 0 <= value < float("inf"), f"cost model {model} prices {node['op']} at {value}"
        seen_ops.add(node["op"])
        if node["op"] == "compute":
            seen_operators.add(graph.nodes[graph.classes[graph.node_classes[nid][0]][0]]["op"])
    assert set(OPS) <= seen_ops
    assert {EGG_NAMES.get(c, c) for c in COMPUTE_OPS} <= {EGG_NAMES.get(c, c) for c in seen_operators}


def test_operator_parameter_kinds_are_known():
    """ComputeSpec.params are literal kinds or operators (chain's F and G); syntax,
    egglog text and decode handle exactly these."""
    for spec in COMPUTE_OPS.values():
        assert set(spec.params) <= {"int", "float", "compute-op"}, spec.name
    assert COMPUTE_OPS["chain"].params == ("compute-op", "compute-op")


def test_element_wise_operator_sets_agree_with_language_egg():
    """ops.UNARY_MAPS are exactly the operators language.egg marks `unary-map`, and every
    n-ary operator is `item-nary` there (what `elementwise-op`, and so the chain rule, uses)."""
    from apsat.lang.ops import NARY_OPS, UNARY_MAPS

    names = {EGG_NAMES.get(c, c) for c in COMPUTE_OPS} - {"chain"}

    def classified(relation):     # the one-operator classification rules asserting `relation`
        return {name for head, atoms in _forms() if head == "rule" and relation in atoms
                and len(atoms & names) == 1 for name in atoms & names}

    assert classified("unary-map") == {EGG_NAMES.get(c, c) for c in UNARY_MAPS}
    assert classified("item-nary") == set(NARY_OPS)


def test_chain_arithmetic_is_the_sum_of_its_parts():
    from apsat.lang.syntax import parse_compute_op
    from apsat.extract.workload import FLOPS_PER_INPUT, FLOPS_PER_OUTPUT, operator_flops

    op = parse_compute_op("(chain (chain elementwise-add relu) sigmoid)")
    n = 100
    want = FLOPS_PER_INPUT["elementwise-add"] * 2 * n + (FLOPS_PER_OUTPUT["relu"] + FLOPS_PER_OUTPUT["sigmoid"]) * n
    assert operator_flops(op, 2 * n, n) == want
