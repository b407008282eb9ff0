"""Weight-only work (apsat/extract/constants.py): found from the weights, priced at 0 per
inference by the target cost models, and what that changes in extraction."""
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from apsat.explore.egraph import EGraph
from apsat.frontend.importer import load_onnx
from apsat.lang.syntax import parse_term
from apsat.extract import extract
from apsat.extract.constants import weight_only_nodes
from apsat.extract.cost import cost_model
from apsat.extract.decode import language_graph
from apsat.pipeline.verify import verify_program
from apsat.pipeline.zoo import random_inputs


def _graph(eg):
    g = language_graph(eg.serialize())      # shapes come with the serialised e-graph
    g.weights = frozenset(eg.weights)
    return g


def _ops(graph, nodes):
    return sorted(graph.nodes[n]["op"] for n in nodes)


def test_weight_only_nodes_follow_the_weights():
    eg = EGraph("gpu")
    # relu(w) + x: relu(w) reads a weight only; the add reads the input x
    term = parse_term("(compute elementwise-add (access-pair (compute relu (access (access-tensor w) 1)) "
                      "(access (access-tensor x) 1)))")
    eg.add(term, {"w": (4, 5), "x": (4, 5)})
    eg.weights = frozenset({"w"})
    g = _graph(eg)
    once = weight_only_nodes(g, g.weights)
    assert _ops(g, once) == ["access", "access-tensor", "compute"]
    assert weight_only_nodes(g, set()) == set()          # nothing is known: nothing is free
    assert set(_ops(g, weight_only_nodes(g, {"w", "x"}))) >= {"access-pair", "compute"}


def _bn_conv_model():
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
             for n, s in [("w", (8, 4, 3, 3)), ("scale", (8,)), ("bias", (8,)), ("mean", (8,))]]
    inits.append(numpy_helper.from_array(np.abs(rng.standard_normal(8)).astype(np.float32) + 0.5, "var"))
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["y"])]
    graph = helper.make_graph(nodes, "bn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_folded_batchnorm_costs_nothing_per_inference():
    model = load_onnx(onnx.shape_inference.infer_shapes(_bn_conv_model()))
    assert model.program.weights == frozenset(model.weights)
    eg = EGraph("gpu")
    handles = eg.add_outputs(model.program)
    assert eg.weights == model.program.weights
    eg.saturate(["fusion"])
    best = extract(eg, handles)
    assert best.weights == model.program.weights
    assert best.op_counts().get("fused-dot-bias", 0) == 1
    # the folding arithmetic (div, sqrt, mul, sub on the BatchNorm parameters) is weight-only
    g = _graph(eg)
    node_cost = cost_model("gpu", "gpu").node_cost(g)
    once = weight_only_nodes(g, g.weights)
    assert {g.nodes[n]["op"] for n in once} >= {"compute"}
    assert all(node_cost(n) == 0.0 for n in once)
    # so the program costs just its fused kernel: one launch and its traffic
    eg.weights = frozenset()
    charged = extract(eg, handles)
    assert best.cost < charged.cost
    assert verify_program(model, best, random_inputs(model, 0)).ok
