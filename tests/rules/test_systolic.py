"""The systolic family (apsat/rules/systolic.egg): soundness, reach and refusal of every
rule; blocking for the target's array; and the acceptance example, a conv2d that im2col and
systolic together turn into `(access-reshape (systolic-array 27 900 ..) ..)`.

Soundness (harness.check_sound) compares the original matmul with up to 20 extractable
members of the root e-class under the reference interpreter on seeded random inputs, at
rtol 1e-4 / atol 1e-5: a systolic array, a split into row blocks or a zero-padded matmul
sum the same float32 products in another order (partial sums per block, a transposed
operand), which moves results by a few ulps per term; padding adds exact zeros.

Blocking rules read the target facts (target-rows)/(target-cols); the small tests use a
4x4 array so the blocked programs stay small, and every blocking rule is shown not to fire
for the gpu target, where the facts are unset.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest

import apsat
from apsat.pipeline.optimize import optimize
from apsat.lang.evaluate import evaluate
from apsat.explore.egraph import EGraph
from apsat.pipeline.verify import verify_program
from apsat.pipeline.zoo import light_model_paths, logits_output, random_inputs, randomize_weights
from harness import ATOL, RTOL, check_reaches, check_refuses, check_sound, library, random_tensors

SYS = "systolic:4x4"


def mm(rows: int, cols: int, batch: int = 3) -> tuple[str, dict]:
    """a ((batch), (rows)) times b ((cols), (rows)) as a dot-product of a cartesian product."""
    text = ("(compute dot-product (access-cartesian-product (access (access-tensor a) 1) "
            "(access (access-tensor b) 1)))")
    return text, {"a": (batch, rows), "b": (cols, rows)}


# ---- dot-product of a cartesian product -> systolic-array ------------------------------------

BASE = "systolic/dot-product-to-systolic-array"


@pytest.mark.parametrize("target", ["gpu", SYS])
def test_systolic_array_sound(target):
    text, shapes = mm(16, 8)
    assert check_sound(BASE, text, shapes, target=target) >= 2


def test_systolic_array_sound_with_several_batch_axes():
    # a0 ((2, 3), (16)): the result ((2, 3), (8)) is re-accessed at split(a0) + 1 = 3
    text = ("(compute dot-product (access-cartesian-product (access (access-tensor a) 2) "
            "(access (access-tensor b) 1)))")
    assert check_sound(BASE, text, {"a": (2, 3, 16), "b": (8, 16)}) >= 2


def test_systolic_array_reaches():
    text, shapes = mm(16, 8)
    check_reaches(BASE, text, shapes,
                  "(access (systolic-array 16 8 (access (access-tensor a) 1) "
                  "(access (access-transpose (access (access-tensor b) 1) (list 1 0)) 0)) 2)")
    text = ("(compute dot-product (access-cartesian-product (access (access-tensor a) 2) "
            "(access (access-tensor b) 1)))")
    check_reaches(BASE, text, {"a": (2, 3, 16), "b": (8, 16)}, "(access (systolic-array 16 8 ?a ?b) 3)")


@pytest.mark.parametrize("text, shapes", [
    # left item is a matrix (a conv before im2col): ((4), (2, 3, 3))
    ("(compute dot-product (access-cartesian-product (access (access-tensor w) 1) "
     "(access-squeeze (access-windows (access (access-tensor x) 0) (shape 2 3 3) (shape 1 1 1)) 0)))",
     {"w": (4, 2, 3, 3), "x": (2, 6, 6)}),
    # right operand iterates over two axes: ((2, 4), (16))
    ("(compute dot-product (access-cartesian-product (access (access-tensor a) 1) "
     "(access (access-tensor b) 2)))", {"a": (3, 16), "b": (2, 4, 16)}),
])
def test_systolic_array_refuses_non_matrix_operands(text, shapes):
    check_refuses(BASE, text, shapes)


# ---- blocking: columns -------------------------------------------------------------------------

def test_block_cols_sound():
    text, shapes = mm(4, 16)          # 16 cols = 4 blocks of 4: 16 -> 8 + 8 -> 4 + 4
    assert check_sound("systolic/block-cols", text, shapes, target=SYS) >= 2


def test_block_cols_reaches():
    text, shapes = mm(4, 16)
    check_reaches("systolic/block-cols", text, shapes,
                  "(access-concatenate "
                  "(compute dot-product (access-cartesian-product ?a (access-slice ?b 0 0 8))) "
                  "(compute dot-product (access-cartesian-product ?a (access-slice ?b 0 8 16))) 1)",
                  target=SYS)


@pytest.mark.parametrize("rows, cols, target", [
    (4, 16, "gpu"),      # no target facts
    (4, 10, SYS),        # not a multiple of 4 (pad-cols handles it)
    (4, 4, SYS),         # fits the array
    (4, 260, SYS),       # 65 blocks: past the bound of 64
])
def test_block_cols_refuses(rows, cols, target):
    text, shapes = mm(rows, cols)
    check_refuses("systolic/block-cols", text, shapes, target=target)


# ---- blocking: rows ------------------------------------------------------------------------------

def test_block_rows_sound():
    text, shapes = mm(16, 4)          # 16 rows = 4 blocks of 4
    assert check_sound("systolic/block-rows", text, shapes, target=SYS) >= 2


def test_block_rows_reaches():
    text, shapes = mm(16, 4)
    check_reaches("systolic/block-rows", text, shapes,
                  "(compute elementwise-add (access-pair "
                  "(compute dot-product (access-cartesian-product (access-slice ?a 1 0 8) (access-slice ?b 1 0 8))) "
                  "(compute dot-product (access-cartesian-product (access-slice ?a 1 8 16) (access-slice ?b 1 8 16)))))",
                  target=SYS)


@pytest.mark.parametrize("rows, cols, target", [
    (16, 4, "gpu"),      # no target facts
    (16, 8, SYS),        # columns do not fit yet: split columns first
    (10, 4, SYS),        # not a multiple of 4 (pad-rows handles it)
    (4, 4, SYS),         # fits the array
    (260, 4, SYS),       # 65 blocks
])
def test_block_rows_refuses(rows, cols, target):
    text, shapes = mm(rows, cols)
    check_refuses("systolic/block-rows", text, shapes, target=target)


# ---- padding ---------------------------------------------------------------------------------

def test_pad_rows_sound():
    text, shapes = mm(10, 4)          # 10 rows -> 12
    assert check_sound("systolic/pad-rows", text, shapes, target=SYS) >= 2


def test_pad_rows_reaches():
    text, shapes = mm(10, 4)
    check_reaches("systolic/pad-rows", text, shapes,
                  "(compute dot-product (access-cartesian-product (access-pad ?a zero-padding 1 0 2) "
                  "(access-pad ?b zero-padding 1 0 2)))", target=SYS)


@pytest.mark.parametrize("rows, cols, target", [
    (10, 4, "gpu"), (12, 4, SYS), (3, 4, SYS), (257, 4, SYS)])
def test_pad_rows_refuses(rows, cols, target):
    text, shapes = mm(rows, cols)
    check_refuses("systolic/pad-rows", text, shapes, target=target)


def test_pad_cols_sound():
    text, shapes = mm(4, 10)          # 10 cols -> 12, sliced back to 10
    assert check_sound("systolic/pad-cols", text, shapes, target=SYS) >= 2


def test_pad_cols_reaches():
    text, shapes = mm(4, 10)
    check_reaches("systolic/pad-cols", text, shapes,
                  "(access-slice (compute dot-product (access-cartesian-product ?a "
                  "(access-pad ?b zero-padding 0 0 2))) 1 0 10)", target=SYS)


@pytest.mark.parametrize("rows, cols, target", [
    (4, 10, "gpu"), (4, 12, SYS), (4, 3, SYS), (4, 257, SYS)])
def test_pad_cols_refuses(rows, cols, target):
    text, shapes = mm(rows, cols)
    check_refuses("systolic/pad-cols", text, shapes, target=target)


@pytest.mark.parametrize("seed", range(4))
def test_blocking_sound_on_random_shapes(seed):
    # seeded random problem sizes, each rule where its condition holds
    rng = np.random.default_rng(seed)
    k = int(rng.integers(2, 5))
    cases = [("systolic/block-cols", 4 * int(rng.integers(1, 3)), 4 * k),
             ("systolic/block-rows", 4 * k, int(rng.integers(1, 5))),
             ("systolic/pad-rows", 4 * k + int(rng.integers(1, 4)), int(rng.integers(1, 5))),
             ("systolic/pad-cols", int(rng.integers(1, 5)), 4 * k + int(rng.integers(1, 4)))]
    for rule, rows, cols in cases:
        text, shapes = mm(rows, cols, batch=int(rng.integers(1, 6)))
        assert check_sound(rule, text, shapes, target=SYS, seed=seed) >= 2


# ---- the family: a matmul fully blocked for the array ------------------------------------------

class BlockedCost:
    """Systolic arrays that fit a rows x cols array cost 1, larger ones and dot-products
    1000, everything else 0.1."""

    name = "test-blocked"

    def __init__(self, rows, cols):
        self.rows, self.cols = rows, cols

    def node_cost(self, graph):
        def cost(nid):
            node = graph.nodes[nid]
            kids = [graph.nodes[c]["op"] for c in node["children"]]
            if node["op"] == "compute" and kids[0] == "dot-product":
                return 1000.0
            if node["op"] == "systolic-array":
                fits = int(kids[0]) <= self.rows and int(kids[1]) <= self.cols
                return 1.0 if fits else 1000.0
            return 0.1
        return cost


def test_family_blocks_a_matmul_for_the_array():
    text, shapes = mm(24, 10, batch=5)   # rows 6 blocks; cols 10 -> padded to 12, 3 blocks
    eg = EGraph(target=SYS)
    root = eg.add(apsat.parse(text, shapes))
    library().load_into(eg, ["systolic"])
    report = eg.run(["systolic"], iter_limit=60)
    assert report["stop_reason"] == "saturated"
    best = apsat.extract(eg, root, cost=BlockedCost(4, 4))
    ops = best.op_counts()
    assert "compute dot-product" not in ops
    assert ops["systolic-array"] == 18          # 6 x 3 array-sized blocks
    tensors = random_tensors(shapes, seed=1)
    np.testing.assert_allclose(evaluate(best, tensors), evaluate(apsat.parse(text, shapes), tensors),
                               rtol=RTOL, atol=ATOL)


def test_family_blocking_does_not_fire_for_gpu():
    text, shapes = mm(24, 10, batch=5)
    eg = EGraph(target="gpu")
    eg.add(apsat.parse(text, shapes))
    library().load_into(eg, ["systolic"])
    report = eg.run(["systolic"])
    assert set(report["rule_matches"]) <= {BASE}


# ---- acceptance: conv2d -> im2col -> systolic array ------------------------------------------

CONV = ("(compute dot-product (access-cartesian-product (access (access-tensor w) 1) "
        "(access-squeeze (access-windows (access (access-tensor x) 0) (shape 3 3 3) (shape 1 1 1)) 0)))")
CONV_SHAPES = {"w": (8, 3, 3, 3), "x": (3, 32, 32)}


class SystolicCheap:
    """dot-product costs 1000, systolic-array 1, everything else 0.1."""

    name = "test-systolic-cheap"

    def node_cost(self, graph):
        def cost(nid):
            node = graph.nodes[nid]
            if node["op"] == "compute" and graph.nodes[node["children"][0]]["op"] == "dot-product":
                return 1000.0
            return 1.0 if node["op"] == "systolic-array" else 0.1
        return cost


@pytest.mark.parametrize("target", ["gpu", "systolic:32x32"])
def test_conv2d_becomes_a_systolic_array(target):
    eg = EGraph(target=target)
    root = eg.add(apsat.parse(CONV, CONV_SHAPES))
    library().load_into(eg, ["im2col", "systolic"])
    report = eg.run(["im2col", "systolic"])          # default limits
    assert report["nodes_after"] < 1_000
    # rows = 3*3*3, cols = 30*30 windows, in the root e-class under a reshape
    assert eg.matches("(access-reshape (systolic-array 27 900 ?a ?b) ?s)", root)
    assert eg.matches("(access-reshape (systolic-array 27 900 (access-flatten ?w) "
                      "(access (access-transpose (access-flatten ?x) (list 1 0)) 0)) "
                      "(access-shape (shape 8 30 30) (shape)))", root)
    # the systolic target's own cycle model picks the array; gpu has no reason to
    best = apsat.extract(eg, root, cost=None if target.startswith("systolic") else SystolicCheap())
    assert best.root.op == "access-reshape" and best.root.args[0].op == "systolic-array"
    assert best.root.args[0].args[:2] == (27, 900)
    assert "compute dot-product" not in best.op_counts()
    tensors = random_tensors(CONV_SHAPES, seed=0)
    np.testing.assert_allclose(evaluate(best, tensors), evaluate(apsat.parse(CONV, CONV_SHAPES), tensors),
                               rtol=RTOL, atol=ATOL)


# ---- light ResNet-50 with both families --------------------------------------------------------

@pytest.mark.slow
def test_resnet50_im2col_systolic_stays_bounded_and_verifies():
    path = next(p for p in light_model_paths() if "resnet50" in p.name)
    proto = logits_output(randomize_weights(onnx.load(str(path))))     # logits compared too
    model = apsat.load_onnx(proto)
    # the pipeline with default limits; extraction by the target's cycle model
    res = optimize(model, rules=["im2col", "systolic"], target="systolic:32x32")
    (phase,) = res.report["saturation"]["phases"]
    assert res.report["egraph"]["nodes"] <= 100_000
    assert phase["stop_reason"] != "node_limit"
    # every one of the 53 convolutions was turned into a matmul over flattened windows
    assert phase["rule_matches"].get("im2col/bubble-reshape-dot-product", 0) >= 53
    v = res.report["verification"]
    assert v["ok"] and len(v["outputs"]) == 2, v
    # and the program that uses the systolic arrays: 53 convolutions + the classifier's Gemm
    eg = EGraph(target="systolic:32x32")
    handles = eg.add_outputs(model.program)
    eg.saturate(["im2col", "systolic"])
    best = apsat.extract(eg, handles)      # the target's cycle model
    assert best.extraction["cost_model"] == "systolic"
    assert best.op_counts().get("systolic-array") == 54 and "compute dot-product" not in best.op_counts()
    v = verify_program(model, best, random_inputs(model, 0))
    assert v.ok, v.to_dict()
