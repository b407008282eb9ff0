"""Class shapes reach extraction with the serialised e-graph (apsat/extract/shapes.py).

An e-graph serialised by the driver carries egglog's shapes in class_data and extraction
prices and decodes with them; the same JSON written to disk and read back extracts alike;
a bare extraction-gym file has no shapes and still extracts under its own node costs;
malformed input is refused in one line.
"""
import json

import pytest

import apsat
from apsat.cli import main
from apsat.egraph.driver import EGraph
from apsat.extract import extract, run_extractor
from apsat.extract.check import dag_cost
from apsat.extract.cost import cost_model
from apsat.extract.decode import decode, expr_child_classes, language_graph
from apsat.extract.graph import ExtractionGraph
from apsat.extract.shapes import read_shapes
from apsat.lang.program import infer_shapes

CONV = ("(compute relu (compute dot-product (access-cartesian-product (access (access-tensor w) 1) "
        "(access-squeeze (access-windows (access (access-tensor t) 0) (shape 3 3 3) (shape 1 1 1)) 0))))")
SHAPES = {"t": (3, 10, 10), "w": (8, 3, 3, 3)}


def _egraph(target="systolic:8x8"):
    eg = EGraph(target)
    root = eg.add(apsat.parse(CONV, SHAPES))
    return eg, root


def test_extraction_reads_the_shapes_from_the_serialised_egraph():
    eg, root = _egraph()
    graph = language_graph(eg.serialize())
    assert graph.shapes[eg.class_of(root)] == ((8, 8, 8), ()) == eg.shape_of(root)
    program = extract(eg, root)
    assert program.shape == ((8, 8, 8), ()) and program.cost > 0


def test_decoded_terms_have_the_shapes_of_their_classes():
    # The cross-check a decoded program's own shape inference makes: Python's rules on
    # the chosen terms give what egglog exported for their classes.
    eg, root = _egraph()
    graph = language_graph(eg.serialize())
    cls = eg.class_of(root)
    choice = run_extractor("greedy-dag", graph, [cls], cost_model(None, eg.target).node_cost(graph))
    reached = [cls]
    for c in reached:
        reached += [k for k in expr_child_classes(graph, choice[c], choice) if k not in reached]
    terms = decode(graph, choice, reached)
    assert {terms[c]: graph.shapes[c] for c in reached} == infer_shapes([terms[cls]], eg.tensor_shapes)


def test_a_saved_egraph_extracts_like_the_live_one(tmp_path):
    eg, root = _egraph()
    live = extract(eg, root)
    path = tmp_path / "egraph.json"
    path.write_text(json.dumps(eg.serialize()))
    graph = language_graph(json.loads(path.read_text()))
    graph.weights = frozenset(eg.weights)
    cls = eg.class_of(root)
    node_cost = cost_model(None, eg.target).node_cost(graph)
    choice = run_extractor("greedy-dag", graph, [cls], node_cost)
    assert dag_cost(graph, choice, [cls], node_cost) == live.cost


def test_a_bare_extraction_gym_file_has_no_shapes():
    bare = {"nodes": {"a": {"op": "relu", "children": [], "eclass": "c", "cost": 2.0}},
            "root_eclasses": ["c"], "class_data": {"c": {"type": "Expr"}}}
    graph = ExtractionGraph.from_json(bare)
    assert graph.shapes is None and read_shapes(bare["class_data"]) is None
    assert dag_cost(graph, run_extractor("tree", graph, graph.roots), graph.roots) == 2.0
    for name in ("gpu", "systolic"):                # the models that price by size say why
        with pytest.raises(ValueError, match="needs e-class shapes"):
            cost_model(name).node_cost(graph)
    assert cost_model("nodes").node_cost(graph)     # one that does not, works


@pytest.mark.parametrize("shape", [[[3], [4], [5]], [[3], "4"], [[3], [-1]], [[3.0], [4]], 7, [[True], []]])
def test_a_malformed_shape_is_a_one_line_error(shape, tmp_path, capsys):
    data = {"nodes": {"a": {"op": "relu", "children": [], "eclass": "c"}}, "root_eclasses": ["c"],
            "class_data": {"c": {"type": "Expr", "shape": shape}}}
    with pytest.raises(ValueError, match="class c: shape must be"):
        ExtractionGraph.from_json(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    assert main(["extract", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("apsat: ") and "shape must be" in err and err.count("\n") == 1


@pytest.mark.parametrize("data", [{"nodes": []}, {"nodes": {"a": 1}}, [], {"nodes": {}, "class_data": []},
                                  {"nodes": {"a": {"op": "x", "eclass": "c"}}},
                                  {"nodes": {}, "class_data": {"c": 3}}, {"nodes": {}, "root_eclasses": "c"}])
def test_a_file_not_laid_out_like_extraction_gym_json_is_a_one_line_error(data, tmp_path, capsys):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    assert main(["extract", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("apsat: ") and "not an extraction-gym e-graph" in err and err.count("\n") == 1


def test_the_chosen_program_takes_its_shapes_from_the_egraph(monkeypatch):
    # the fourth computation of shapes is gone: decoding hands the classes' shapes to the
    # Program, which then does not run the Python shape rules again
    from apsat.lang import program as program_module
    from apsat.rules.saturate import saturate

    eg, root = _egraph()
    saturate(eg, ["im2col", "systolic"])
    want = infer_shapes([extract(eg, root).root], {k: v for k, v in SHAPES.items()})

    def refuse(*args, **kwargs):
        raise AssertionError("extract() shaped its program in Python again")

    monkeypatch.setattr(program_module, "infer_shapes", refuse)
    chosen = extract(eg, root)
    assert {t: chosen.shape_of(t) for t in chosen.terms()} == want
