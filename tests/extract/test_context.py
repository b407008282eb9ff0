"""Context-aware extraction: the shared-branch trap, and what the target cost models charge
for fusion, materialisation and layout changes."""
import pytest
from models import shared_branch_convnet

from apsat.explore.egraph import EGraph
from apsat.frontend.importer import load_onnx
from apsat.lang.syntax import parse_term
from apsat.extract import extract
from apsat.pipeline.verify import verify_program
from apsat.pipeline.zoo import random_inputs

MATMUL_KERNELS = ("compute dot-product", "fused-dot-bias", "fused-dot-bias-act", "systolic-array")


def _matmuls(program) -> int:
    counts = program.op_counts()
    return sum(counts.get(k, 0) for k in MATMUL_KERNELS)


@pytest.fixture(scope="module")
def shared_branch():
    """y = conv1(x); out = y + conv2(relu6(y)), saturated with the fusion rules."""
    model = load_onnx(shared_branch_convnet(channels=32, size=16))
    eg = EGraph("gpu")
    handles = eg.add_outputs(model.program)
    eg.saturate(["fusion"])
    return model, eg, handles


def test_tree_extraction_computes_the_shared_convolution_twice(shared_branch):
    model, eg, handles = shared_branch
    tree = extract(eg, handles, method="tree", cost="gpu")
    # conv1 for y, conv1 again inside the fused conv1+relu6, conv2: three matrix kernels.
    assert _matmuls(tree) == 3
    assert tree.op_counts().get("fused-dot-bias-act", 0) == 1
    assert verify_program(model, tree, random_inputs(model, 0)).ok


@pytest.mark.parametrize("method", ["greedy-dag", "ilp"])
def test_dag_extractors_compute_it_once_and_cost_less(shared_branch, method):
    model, eg, handles = shared_branch
    tree = extract(eg, handles, method="tree", cost="gpu")
    best = extract(eg, handles, method=method, cost="gpu", time_limit=20)
    assert _matmuls(best) == 2
    assert best.cost < tree.cost
    assert verify_program(model, best, random_inputs(model, 0)).ok


def _cost_of(text, shapes, model="gpu", target="gpu"):
    eg = EGraph(target)
    h = eg.add(parse_term(text), shapes)
    return extract(eg, h, cost=model).cost


MATMUL = "(compute dot-product (access-cartesian-product (access (access-tensor a) 1) (access (access-tensor b) 1)))"


def test_fused_atom_costs_less_than_the_chain_it_replaces():
    shapes = {"a": (256, 512), "b": (256, 512), "c": (256,)}
    bias = "(access-broadcast (access (access-reshape (access-tensor c) (access-shape (shape) (shape 1 256))) 1) (access-shape (shape 256) (shape 256)))"
    chain = f"(compute relu (compute elementwise-add (access-pair (access {MATMUL} 1) {bias})))"
    fused = ("(fused-dot-bias-act relu (access (access-tensor a) 1) (access (access-tensor b) 1) "
             "(access (access-tensor c) 1))")
    for model, target in [("gpu", "gpu"), ("systolic", "systolic")]:
        assert _cost_of(fused, shapes, model, target) < _cost_of(chain, shapes, model, target)


def test_windows_are_read_once_and_transposes_cost_a_copy():
    from apsat.extract.decode import language_graph
    from apsat.extract.workload import footprints, traffic

    shapes = {"t": (64, 32, 32), "w": (64, 64, 3, 3)}
    conv = ("(compute dot-product (access-cartesian-product (access (access-tensor w) 1) "
            "(access-squeeze (access-windows (access (access-tensor t) 0) (shape 64 3 3) (shape 1 1 1)) 0)))")
    eg = EGraph("gpu")
    h = eg.add(parse_term(conv), shapes)
    graph = language_graph(eg.serialize())      # carries egglog's class shapes
    root = graph.classes[eg.class_of(h)][0]
    # The convolution reads t and w once each, not the 64*9*30*30 im2col matrix.
    assert traffic(graph, root, graph.shapes, footprints(graph, graph.shapes)) == (64 * 32 * 32 + 64 * 64 * 9, 64 * 30 * 30)
    transposed = _cost_of(f"(access-transpose (access {MATMUL} 1) (list 1 0))", {"a": (64, 32), "b": (64, 32)})
    assert transposed > _cost_of(MATMUL, {"a": (64, 32), "b": (64, 32)}) + 3.0   # one more launch at least


def test_systolic_model_prefers_the_array_to_the_host():
    shapes = {"x": (64, 27), "w": (8, 27)}
    eg = EGraph("systolic")
    h = eg.add(parse_term(MATMUL.replace("(access-tensor a)", "(access-tensor x)")
                          .replace("(access-tensor b)", "(access-tensor w)")), shapes)
    eg.saturate(["systolic"])
    best = extract(eg, h)
    assert best.extraction["cost_model"] == "systolic"
    assert "systolic-array" in best.op_counts()


def test_systolic_model_on_a_flexible_array_prices_each_product_in_its_best_dataflow():
    import dataclasses

    from apsat.targets.accelerator import PRESETS
    from apsat.targets.systolic import gemm_cost

    # 3136 x 64 x 64 (a ResNet-50 1x1 convolution): weight stationary is the fastest on
    # 32x32, output stationary (the preset's own) more than twice as slow
    shapes = {"x": (3136, 64), "w": (64, 64)}
    term = parse_term(MATMUL.replace("(access-tensor a)", "(access-tensor x)").replace("(access-tensor b)", "(access-tensor w)"))
    costs = {}
    for df in ("os", "flex"):
        acc = dataclasses.replace(PRESETS["32x32"], dataflow=df, name=df)
        eg = EGraph(acc)
        h = eg.add(term, shapes)
        eg.saturate(["systolic"])
        best = extract(eg, h)
        assert best.op_counts().get("systolic-array") == 1
        costs[df] = best.cost
    flex = dataclasses.replace(PRESETS["32x32"], dataflow="flex")
    assert gemm_cost(flex, 3136, 64, 64).dataflow == "ws"
    # the programs are alike (the product and w's transpose): they differ by the product
    product = {df: gemm_cost(flex, 3136, 64, 64, df).total_cycles for df in ("os", "ws")}
    assert costs["os"] - costs["flex"] == product["os"] - product["ws"]
    assert costs["os"] > 1.5 * costs["flex"]


def test_shapes_are_required_by_size_based_models():
    from apsat.extract.cost import cost_model
    from apsat.extract.graph import ExtractionGraph

    g = ExtractionGraph.from_json({"nodes": {"n": {"op": "relu", "children": [], "eclass": "c"}}})
    with pytest.raises(ValueError, match="needs e-class shapes"):
        cost_model("gpu").node_cost(g)


def test_unknown_cost_model_and_precision_are_refused():
    from apsat.extract.cost import cost_model
    from apsat.extract.cost_gpu import GpuRoofline

    with pytest.raises(ValueError, match="unknown cost model 'tpu'"):
        cost_model("tpu")
    with pytest.raises(ValueError, match="unknown precision"):
        GpuRoofline("fp8")
    # Tensor cores make a matrix product cheaper in bf16 than in fp32; element-wise work not.
    assert GpuRoofline("bf16").kernel_us(1e12, 0, True) < GpuRoofline("fp32").kernel_us(1e12, 0, True)
    assert GpuRoofline("bf16").kernel_us(1e12, 0, False) == GpuRoofline("fp32").kernel_us(1e12, 0, False)
