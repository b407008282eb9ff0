"""benchmarks/torch_onnx.py, the PyTorch eager baseline of the GPU benchmarks: the module it
builds computes what onnxruntime computes (every real-zoo model on its stored inputs, three
light-zoo models, and one-node models for the ops' edge semantics), its forward holds only
tensor work (shape arithmetic folded at construction) and traces as one torch.compile
graph, and what it cannot run is refused at construction with a message naming it."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from apsat.pipeline.zoo import light_model_paths, ort_run, randomize_weights

from bench_scripts import load_benchmark as _load

ROOT = Path(__file__).resolve().parent.parent
REAL_ZOO = sorted(p.stem for p in (ROOT / "tests" / "data" / "real_zoo").glob("*.onnx"))
SHAPE_OPS = {"Shape", "ConstantOfShape", "Range", "Constant", "Equal", "Concat", "Unsqueeze", "Slice"}


torch_onnx, real_zoo = _load("torch_onnx"), _load("real_zoo")


def _real(name: str):
    inputs = real_zoo.stored_inputs(name)
    model = onnx.load(ROOT / "tests" / "data" / "real_zoo" / f"{name}.onnx")
    return model, inputs, torch_onnx.to_torch(model, input_shapes={k: v.shape for k, v in inputs.items()})


def _run(module, inputs: dict) -> tuple:
    with torch.no_grad():
        return module(*[torch.from_numpy(inputs[name]) for name in module.input_names])


def _check(model, inputs: dict, module=None) -> float:
    """Every output equals onnxruntime's (rtol 1e-4, atol 1e-5 times the output's largest
    magnitude; exactly for integer and bool outputs). Returns the largest error."""
    module = module or torch_onnx.to_torch(model, input_shapes={k: v.shape for k, v in inputs.items()})
    want, worst = ort_run(model, inputs), 0.0
    for name, got in zip(module.output_names, _run(module, inputs), strict=True):
        got, ref = got.numpy(), want[name]
        assert got.shape == ref.shape and got.dtype == ref.dtype, name
        if ref.dtype.kind in "biu":
            np.testing.assert_array_equal(got, ref)
            continue
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5 * float(np.abs(ref).max()), err_msg=name)
        worst = max(worst, float(np.abs(got - ref).max()))
    return worst


@pytest.mark.parametrize("name", REAL_ZOO)
def test_real_zoo_model_matches_onnxruntime(name):
    model, inputs, module = _real(name)
    _check(model, inputs, module)
    # forward is tensor work only: no shape op, and no step whose inputs are all constants
    consts = {name for name, _ in module._consts}
    assert not {op for op, *_ in module.steps} & {"Shape", "ConstantOfShape", "Range", "Constant"}
    assert all(any(i and i not in consts for i in ins) for _, _, _, ins, _ in module.steps)
    # initializers are buffers: floats in the module's dtype, integers keep theirs
    assert all(b.dtype in (torch.float32, torch.int64, torch.bool) for b in module.buffers())


def test_bert_forward_holds_no_shape_arithmetic():
    model, _, module = _real("bert")
    assert {n.op_type for n in model.graph.node} >= {"Shape", "ConstantOfShape", "Equal", "Concat", "Where"}
    assert not {op for op, *_ in module.steps} & SHAPE_OPS
    # the two gathers left read data: the word embeddings by token id and the mask's values
    gathers = [ins for op, _, _, ins, _ in module.steps if op == "Gather"]
    assert [ins[1] for ins in gathers][:1] == ["input_ids"] and len(gathers) == 2
    assert len(module.steps) <= len(model.graph.node) // 2


@pytest.mark.parametrize("stem", ["light_squeezenet", "light_shufflenet", "light_inception_v1"])
def test_light_zoo_model_matches_onnxruntime(stem):
    """squeezenet (Dropout's unread mask), shufflenet (BatchNorm, channel shuffle), inception_v1
    (LRN, an AveragePool with uneven pads and count_include_pad=0)."""
    model = randomize_weights(onnx.load(next(p for p in light_model_paths() if p.stem == stem)), seed=0)
    inits = {i.name for i in model.graph.initializer}
    rng = np.random.default_rng(0)
    inputs = {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim], dtype=np.float32)
              for i in model.graph.input if i.name not in inits}
    _check(model, inputs)


def test_forward_traces_as_one_graph():
    """dynamo traces bert's forward whole (fullgraph: a graph break is an error), with the
    eager module's outputs."""
    _, inputs, module = _real("bert")
    args = [torch.from_numpy(inputs[name]) for name in module.input_names]
    torch._dynamo.reset()
    try:
        explained = torch._dynamo.explain(module)(*args)
        assert (explained.graph_count, explained.graph_break_count) == (1, 0)
        compiled = torch.compile(module, backend="eager", fullgraph=True)
        with torch.no_grad():
            for got, want in zip(compiled(*args), _run(module, inputs), strict=True):
                assert torch.equal(got, want)
    finally:
        torch._dynamo.reset()


def test_dtype_and_device_of_buffers_and_outputs():
    model, inputs, _ = _real("bert")
    module = torch_onnx.to_torch(model, dtype=torch.bfloat16)
    assert {b.dtype for b in module.buffers()} <= {torch.bfloat16, torch.int64, torch.bool}
    assert {b.device.type for b in module.buffers()} == {"cpu"}
    (out,) = _run(module, inputs)        # int64 ids and mask in, bfloat16 out
    ref = ort_run(model, inputs)["last_hidden_state"]
    assert out.dtype == torch.bfloat16 and np.abs(out.float().numpy() - ref).max() < 0.1 * np.abs(ref).max()


# ---- refusals ----------------------------------------------------------------------------

def _model(nodes, inputs: dict, outputs, consts=None, opset=17):
    """A model of `nodes` over float or int64 graph inputs {name: array} and initializers."""
    def info(name, array):
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(array.dtype), array.shape)
    graph = helper.make_graph(nodes, "g", [info(k, v) for k, v in inputs.items()],
                              [onnx.ValueInfoProto(name=o) for o in outputs],
                              [onnx.numpy_helper.from_array(v, k) for k, v in (consts or {}).items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_an_unsupported_op_is_refused_at_construction():
    x = np.zeros((2, 3), np.float32)
    model = _model([helper.make_node("Hardmax", ["x"], ["y"], name="my_hardmax")], {"x": x}, ["y"])
    with pytest.raises(NotImplementedError, match=r"torch_onnx: op Hardmax \(my_hardmax\) is not supported"):
        torch_onnx.to_torch(model)


def test_refusals_name_the_input_output_or_attribute():
    x = np.zeros((2, 6), np.float32)
    # an output no builder gives, read by the graph (an unread one is fine: the light zoo's masks)
    dropout = _model([helper.make_node("Dropout", ["x"], ["y", "mask"], name="d")], {"x": x}, ["y", "mask"])
    with pytest.raises(NotImplementedError, match=r"output 1 of op Dropout \(d\)"):
        torch_onnx.to_torch(dropout)
    read = _model([helper.make_node("Dropout", ["x"], ["y", "mask"], name="d"),
                   helper.make_node("Not", ["mask"], ["z"])], {"x": x}, ["y", "z"])
    with pytest.raises(NotImplementedError, match=r"output 1 of op Dropout \(d\)"):
        torch_onnx.to_torch(read)
    # a shape computed from data, not from shapes
    shape = _model([helper.make_node("Reshape", ["x", "s"], ["y"], name="r")],
                   {"x": x, "s": np.array([3, 4], np.int64)}, ["y"])
    with pytest.raises(NotImplementedError, match=r"non-constant input 1 of op Reshape \(r\)"):
        torch_onnx.to_torch(shape)
    pad = _model([helper.make_node("Pad", ["x", "p"], ["y"], name="p", mode="reflect")], {"x": x}, ["y"],
                 {"p": np.array([0, 1, 0, 1], np.int64)})
    with pytest.raises(NotImplementedError, match=r"mode reflect of op Pad \(p\)"):
        torch_onnx.to_torch(pad)


def test_a_symbolic_dim_needs_a_given_shape():
    model = onnx.load(ROOT / "tests" / "data" / "real_zoo" / "distilbert_dynamic.onnx")
    with pytest.raises(ValueError, match=r"input 'input_ids' has a symbolic shape \['batch_size', 'sequence_length'\]"):
        torch_onnx.to_torch(model)
    with pytest.raises(ValueError, match="names no graph input"):
        torch_onnx.to_torch(model, input_shapes={"input_ids": (1, 4), "attention_mask": (1, 4), "ids": (1,)})


# ---- one-node models: the ops' edge semantics against onnxruntime ------------------------

_R = np.random.default_rng(0)
_X = _R.standard_normal((2, 4, 7, 7), dtype=np.float32)
_I = np.array


def _case(op, inputs, consts=None, opset=17, outputs=1, **attrs):
    names = list(inputs) + list(consts or {})
    node = helper.make_node(op, names, [f"y{k}" for k in range(outputs)], **attrs)
    return pytest.param(_model([node], inputs, node.output, consts, opset), inputs,
                        id=f"{op}-{'-'.join(f'{k}={v}' for k, v in attrs.items())[:40]}-{opset}")


EDGE_CASES = [
    _case("Slice", {"x": _X[0, 0]}, {"s": _I([-1, 10**12]), "e": _I([-10**12, 1]), "a": _I([0, 1]),
                                     "t": _I([-1, -2])}),
    _case("Slice", {"x": _X}, {"s": _I([1]), "e": _I([2**63 - 1]), "a": _I([-1]), "t": _I([2])}),
    _case("Pad", {"x": _X}, {"p": _I([0, 1, -1, 2, 0, 0, 1, -2]), "v": np.float32(0.5)}),
    _case("Split", {"x": _X}, opset=18, outputs=3, axis=2, num_outputs=3),
    _case("Split", {"x": _X}, {"s": _I([1, 3])}, outputs=2, axis=1),
    _case("Softmax", {"x": _X}, opset=11, axis=1),
    _case("Softmax", {"x": _X}, axis=1),
    _case("AveragePool", {"x": _X}, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=1),
    _case("AveragePool", {"x": _X}, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
    _case("AveragePool", {"x": _X}, kernel_shape=[3, 2], pads=[0, 0, 2, 1]),
    _case("AveragePool", {"x": _X}, kernel_shape=[3, 2], pads=[0, 0, 2, 1], count_include_pad=1),
    _case("AveragePool", {"x": _X}, opset=10, kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
    _case("MaxPool", {"x": _X}, kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER"),
    _case("MaxPool", {"x": _X}, kernel_shape=[2, 2], strides=[2, 2], pads=[0, 1, 1, 0]),
    _case("MaxPool", {"x": _X}, kernel_shape=[3, 3], strides=[2, 2], dilations=[2, 1], ceil_mode=1),
    _case("Conv", {"x": _X}, {"w": _R.standard_normal((6, 2, 3, 2), dtype=np.float32)}, group=2,
          strides=[2, 1], auto_pad="SAME_LOWER"),
    _case("Conv", {"x": _X}, {"w": _R.standard_normal((4, 4, 2, 3), dtype=np.float32)}, dilations=[2, 1],
          strides=[1, 2], pads=[2, 1, 2, 1], group=1),
    _case("Conv", {"x": _X}, {"w": _R.standard_normal((3, 4, 3, 3), dtype=np.float32),
                              "b": _R.standard_normal(3, dtype=np.float32)}, pads=[0, 1, 2, 1]),
    _case("Conv", {"x": _X[:, :, 0]}, {"w": _R.standard_normal((5, 4, 3), dtype=np.float32)}, auto_pad="VALID"),
    _case("Gemm", {"a": _X[0, 0, :3], "b": _X[0, 1, :3, :5]}, {"c": _X[1, 0, :1, :5]}, transA=1, alpha=0.5, beta=2.0),
    _case("Gemm", {"a": _X[0, 0], "b": _X[0, 1, :5]}, {"c": _X[1, 0, 0, :5]}, transB=1),
    _case("ReduceMean", {"x": _X}, {"a": _I([1, -1])}, opset=18, keepdims=0),
    _case("ReduceMean", {"x": _X}, opset=13, axes=[-2]),
    _case("ReduceMean", {"x": _X}, opset=18, noop_with_empty_axes=1),
    _case("ReduceMean", {"x": _X}, opset=18),
    _case("Squeeze", {"x": _X[:1, :, :1]}),
    _case("Unsqueeze", {"x": _X[0]}, {"a": _I([-1, 0])}),
    _case("Unsqueeze", {"x": _X[0]}, opset=11, axes=[1]),
    _case("Flatten", {"x": _X}, axis=-1),
    _case("Flatten", {"x": _X}, axis=0),
    _case("Mod", {"a": _I([-7, 7, -7, 7, 0]), "b": _I([3, -3, -3, 3, 5])}),
    _case("Mod", {"a": _X[0, 0], "b": np.full((7, 7), 0.7, np.float32)}, fmod=1),
    _case("Div", {"a": _I([-7, 7, -7, 7]), "b": _I([2, -2, -2, 2])}),
    _case("Gather", {"x": _X[0]}, {"i": _I([[0, -1], [2, 1]])}, axis=1),
    _case("Gather", {"x": _X[0, 0], "i": _I([3, -2, 0])}),
    _case("Gather", {"x": _X[0, 0]}, {"i": _I(-2)}, axis=1),
    _case("GatherElements", {"x": _X[0, 0]}, {"i": _I([[0, -1, 2], [6, 5, -7]])}, axis=1),
    _case("ScatterND", {"x": _X[0]}, {"i": _I([[1, 2], [-1, 0]]), "u": _X[1, 0, :2]}),
    _case("LayerNormalization", {"x": _X}, {"w": _X[1, 0], "b": _X[1, 1]}, axis=-2, epsilon=1e-3),
    _case("LayerNormalization", {"x": _X}, {"w": _X[1, 0, 0]}, axis=2),
    _case("BatchNormalization", {"x": _X}, {k: np.abs(_R.standard_normal(4, dtype=np.float32)) + 0.1
                                            for k in "sbmv"}, opset=15, epsilon=1e-3),
    _case("LRN", {"x": _X}, size=3, alpha=0.01, beta=0.5, bias=2.0),
    _case("HardSigmoid", {"x": _X}),
    _case("HardSigmoid", {"x": _X}, alpha=1 / 6),
    _case("HardSwish", {"x": _X}),
    _case("Clip", {"x": _X}, {"lo": np.float32(-0.5)}, opset=11),
    _case("Clip", {"x": _X}, opset=6, min=-0.2, max=0.3),
    _case("Transpose", {"x": _X}),
    _case("Expand", {"x": _X[0, 0, :, :1]}, {"s": _I([2, 1, 4])}),
    _case("Where", {"c": _X[0, 0] > 0, "a": _X[0, 1]}, {"b": np.float32(-1.0)}),
    _case("Range", {}, {"a": np.float32(0.5), "b": np.float32(2.0), "c": np.float32(0.25)}),
    _case("ConstantOfShape", {}, {"s": _I([2, 3])}, value=onnx.numpy_helper.from_array(_I([7]))),
    _case("Cast", {"x": _X}, to=TensorProto.INT64),
    _case("Cast", {"x": _X}, to=TensorProto.BOOL),
    _case("Pow", {"x": _X}, {"e": np.float32(3.0)}),
    _case("Sum", {"a": _X[0], "b": _X[1], "c": _X[0, 0]}),
    _case("Min", {"a": _I([1, 5, -3]), "b": _I([2, 2, 2])}),
]


@pytest.mark.parametrize("model, inputs", EDGE_CASES)
def test_op_edge_semantics_match_onnxruntime(model, inputs):
    _check(model, inputs)
