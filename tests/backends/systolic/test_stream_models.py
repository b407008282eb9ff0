"""Light zoo models end to end on the 32x32 preset: optimise (random weights), compile to an
instruction stream, simulate, compare with onnxruntime on the original model.

Tolerance: the project's verification tolerance (apsat.pipeline.verify: rtol 1e-4, atol 1e-5 times
the output's scale), for the reasons given there; the simulator also sums each GEMM in
k-chunks (and ws/is partial sums per row fold), a different order again. The logits before
a final Softmax are compared too (logits_output), since the Softmax hides errors.
"""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

import apsat
from apsat.pipeline.optimize import optimize
from apsat.backends import systolic as sab
from apsat.backends.systolic import Matmul
from apsat.explore.egraph import EGraph
from apsat.pipeline.verify import compare
from apsat.pipeline.zoo import light_model_paths, logits_output, ort_run, random_inputs, randomize_weights

LIGHT = {p.stem.replace("light_", ""): p for p in light_model_paths()}


def load(name: str, seed: int = 1):
    return apsat.load_onnx(logits_output(randomize_weights(onnx.load(str(LIGHT[name])), seed=seed)))


def resnet50_first_block():
    """conv1 + BatchNorm + ReLU + max pool and the first bottleneck block of light ResNet-50."""
    proto = onnx.shape_inference.infer_shapes(randomize_weights(onnx.load(str(LIGHT["resnet50"])), seed=1))
    sub = onnx.utils.Extractor(proto).extract_model(["gpu_0/data_0"], ["r15"])
    sub.ir_version = 8     # IR >= 4: initializers need not be graph inputs (the extract drops them)
    return apsat.load_onnx(sub)


class Shared:
    """What several tests here would each compute again, computed once per module (and
    worker): a loaded model (alexnet's random weights alone take a second), its fused
    program for a target (squeezenet's is read by both of its parametrizations, the
    ResNet-50 block's flex program by two), and onnxruntime's outputs on the seeded inputs.
    Nothing handed out is changed by a test: the models' weights are read-only arrays (the
    tests copy the dict before adding inputs), programs are immutable terms, and each
    reference is a new dict."""

    def __init__(self):
        self.memo = {}

    def _once(self, key, make):
        if key not in self.memo:
            self.memo[key] = make()
        return self.memo[key]

    def model(self, name: str):
        return self._once(("model", name), lambda: resnet50_first_block() if name == "resnet50-block" else load(name))

    def program(self, name: str, target="systolic:32x32"):
        return self._once(("program", name, target), lambda: fused_program(self.model(name), target))

    def reference(self, name: str, seed: int = 3) -> dict:
        model = self.model(name)
        return dict(self._once(("reference", name, seed), lambda: ort_run(model.onnx, random_inputs(model, seed))))


@pytest.fixture(scope="module")
def common():
    memo = Shared()
    yield memo
    memo.memo.clear()          # the models' weights are not kept for the rest of the session


def fused_program(model, target="systolic:32x32"):
    """The extracted program with fusion before im2col/systolic (bias and activation in
    fused-dot-bias-act atoms, BatchNorm folded into weights)."""
    eg = EGraph(target=target)
    handles = eg.add_outputs(model.program)
    eg.saturate()                      # the systolic target's default plan
    return apsat.extract(eg, handles)


def check_against_onnxruntime(model, stream, seed=3, want=None):
    """`want`: onnxruntime's outputs on these inputs where already computed (Shared.reference)."""
    inputs = random_inputs(model, seed)
    got = sab.simulate(stream, {**model.weights, **inputs})
    want = ort_run(model.onnx, inputs) if want is None else want
    v = compare({k: want[k] for k in got}, got)
    assert v.ok, v.to_dict()
    return v


def test_squeezenet_through_optimize_writes_stream_cycles_and_simulation(tmp_path):
    model = load("squeezenet")
    res = optimize(model, target="systolic:32x32", verify=True, seed=2)
    sysrep = res.report["systolic"]
    assert sysrep["simulation"]["ok"], sysrep["simulation"]
    assert len(sysrep["simulation"]["outputs"]) == 2          # probabilities and logits
    assert res.report["verification"]["ok"]
    cyc = sysrep["cycles"]
    assert cyc["total_cycles"] > cyc["compute_bound_cycles"] > 0 and 0 < cyc["utilization"] < 1
    assert cyc["host_steps"] == [] and sysrep["instructions"]["MATMUL"] > 0
    res.write(tmp_path)
    written = json.loads((tmp_path / "report.json").read_text())
    assert {"ops_before", "ops_after", "extraction", "verification", "systolic"} <= set(written)
    again = sab.read(tmp_path / "instructions.txt")
    assert sab.to_text(again) == sab.to_text(res.stream)
    saved = np.load(tmp_path / "simulated_outputs.npz")
    assert set(saved.files) == set(res.simulated)


@pytest.mark.parametrize("opts", [{}, {"im2col": "gather", "fold_copies": True}], ids=["model", "gather-fold"])
def test_squeezenet_fused_matches_onnxruntime(opts, common):
    model = common.model("squeezenet")
    prog = common.program("squeezenet")
    assert prog.op_counts().get("fused-dot-bias-act", 0) == 26
    stream = sab.compile(prog, "systolic:32x32", weights=model.weights, **opts)
    check_against_onnxruntime(model, stream, want=common.reference("squeezenet"))
    rep = sab.cycles(stream)
    # the convolutions read NHWC data: their weights are permuted once, in init (or read
    # through a transposed address pattern when copies are folded)
    assert rep["host_steps"] == [] and (rep["init_cycles"] > 0) != bool(opts.get("fold_copies"))
    assert {g["label"] for g in rep["groups"] if g["section"] == "init"} <= {"access-transpose"}
    # the fire modules' two expand convolutions store into their concatenation's columns
    # when copies are folded (inplace.py); else each part is a COPY
    concat = {t for t, g in stream.groups.items() if g.label == "access-concatenate"}
    copies = [i for i in stream.main if isinstance(i, sab.Copy) and i.tag in concat]
    assert len(copies) == (0 if opts.get("fold_copies") else 16)


def test_alexnet_matches_onnxruntime_with_its_grouped_convolutions_on_the_array(common):
    model = common.model("bvlc_alexnet")
    prog = common.program("bvlc_alexnet")
    stream = sab.compile(prog, "systolic:32x32", weights=model.weights)
    check_against_onnxruntime(model, stream, want=common.reference("bvlc_alexnet"))
    rep = sab.cycles(stream)
    # the three 2-group convolutions run as two GEMMs each; nothing is left to the host
    grouped = [g for g in rep["groups"] if g["kind"] == "grouped"]
    assert len(grouped) == 3 and all(g["macs"] > 0 for g in grouped)
    assert rep["host_steps"] == [] and rep["host_macs"] == 0
    # LRN runs on the vector unit, across channels
    assert any(isinstance(i, sab.Vec) and i.mode == "axis0" for i in stream.main)


def test_alexnet_on_a_flexible_array_shares_its_fully_connected_layers_with_the_vector_unit(common):
    import dataclasses

    from apsat.targets.accelerator import PRESETS

    flex = dataclasses.replace(PRESETS["32x32"], dataflow="flex")
    model = common.model("bvlc_alexnet")
    stream = sab.compile(common.program("bvlc_alexnet", flex), flex, weights=model.weights)
    check_against_onnxruntime(model, stream, want=common.reference("bvlc_alexnet"))
    # fc6, fc7 and fc8 at batch 1: about a quarter of each one's columns on the vector unit
    shared = [g for g in sab.cycles(stream)["groups"] if g.get("vector_cols")]
    assert [(g["k"], g["n"], g["vector_cols"]) for g in shared] == [(9216, 4096, 1024), (4096, 4096, 1024),
                                                                   (4096, 1000, 232)]


def test_shufflenet_grouped_on_the_array_depthwise_batched():
    model = load("shufflenet")
    stream = sab.compile(fused_program(model), "systolic:32x32", weights=model.weights)
    check_against_onnxruntime(model, stream)
    rep = sab.cycles(stream)
    kinds = {(g["kind"], g["label"]) for g in rep["groups"]}
    # grouped 1x1 convs one product a group; depthwise 3x3 convs 32 filters a pass
    assert ("grouped", "dot-product 4 groups") in kinds
    assert ("grouped", "dot-product 112 groups, 32 a pass") in kinds
    assert rep["host_steps"] == [] and rep["vector_macs"] == 0
    # the batched passes' zeros are not counted: the bound is the model's useful MACs
    passes = [i for i in stream.main if isinstance(i, Matmul)]
    assert rep["macs"] == sum(i.m * i.k * i.n // i.blocks for i in passes) < sum(i.m * i.k * i.n for i in passes)
    assert rep["compute_bound_cycles"] == rep["macs"] / 1024


BEST = {"im2col": "gather", "fold_copies": True, "fuse_zips": True}


@pytest.mark.parametrize("df,opts", [("os", {}), ("ws", {}), ("is", {}), ("flex", {}), ("flex", BEST)],
                         ids=["os", "ws", "is", "flex", "flex-gather-fold-zips"])
def test_resnet50_first_bottleneck_block(df, opts, common):
    """conv1 + BatchNorm + ReLU + max pool and the first bottleneck block (three convs, the
    projection shortcut, the residual Sum and ReLU) of light ResNet-50; on a flexible
    array too, and with every lowering option on (the residual add and ReLU in the last
    convolution's epilogue)."""
    model = common.model("resnet50-block")
    import dataclasses

    from apsat.targets.accelerator import PRESETS

    acc = dataclasses.replace(PRESETS["32x32"], dataflow=df)
    prog = common.program("resnet50-block", acc)       # flex: one program for both option sets
    # five convolutions, each a fused atom; the ReLUs after conv1 and the first two branch
    # convolutions in their epilogues (on the flexible array conv1's may stay a vector
    # pass: with a two-op epilogue its product would take os, within FLEX_CYCLE_SLACK of
    # ws but more cycles than ws plus the pass)
    counts = prog.op_counts()
    assert counts.get("fused-dot-bias", 0) + counts.get("fused-dot-bias-act", 0) == 5
    assert counts.get("fused-dot-bias-act", 0) >= (2 if df == "flex" else 3)
    stream = sab.compile(prog, acc, weights=model.weights, **opts)
    check_against_onnxruntime(model, stream, want=common.reference("resnet50-block"))
    rep = sab.cycles(stream)
    # BatchNorm folded into the weights is weight-only work: done once, in init
    assert stream.init and rep["init_cycles"] > 0
    assert rep["macs"] > 0 and rep["host_steps"] == []
    labels = [g["label"] for g in rep["groups"] if g["section"] == "main"]
    assert any(label.endswith("+ (chain elementwise-add relu)") for label in labels) == bool(opts)
    # the residual add starts the last convolution's accumulators: the vector unit is
    # left the ReLU, no zip (without fuse_zips the Sum is a zip pass of its own)
    assert any(isinstance(i, sab.Vec) and i.mode == "zip" for i in stream.main) == (not opts)
    if df == "flex":
        assert {g["dataflow"] for g in rep["groups"] if g["kind"] == "gemm"} <= {"os", "ws", "is"}


def test_elementwise_run_is_one_chain_vec_matching_onnxruntime():
    """Add -> Relu -> Sigmoid optimised for the systolic target: fusion/chain leaves one
    chain, lowered to VEC zip instructions whose op text is the chain's surface syntax;
    the simulator equals onnxruntime."""
    import models

    from apsat.backends.systolic import Vec

    model = apsat.load_onnx(models.elementwise_chain(("Add", "Relu", "Sigmoid"), shape=(7, 45)))
    res = optimize(model, target="systolic:32x32", verify=False)
    stream = sab.compile(res.program, "systolic:32x32", weights=model.weights)
    vecs = [i for i in stream.main if isinstance(i, Vec)]
    assert vecs and {(v.mode, v.op) for v in vecs} == {("zip", "(chain (chain elementwise-add relu) sigmoid)")}
    check_against_onnxruntime(model, stream)
