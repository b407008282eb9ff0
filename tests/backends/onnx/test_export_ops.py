"""Every element-wise operator of the registry through the ONNX exporter: the exported
one-op model, run by onnxruntime, equals the reference interpreter on seeded inputs
(apsat.verify's tolerances: rtol 1e-4, atol 1e-5 x scale). Also the layout bookkeeping:
a transpose chain costs at most one node, and a program with a systolic-array atom is
refused in one line."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import apsat
from apsat.backends.onnx import ExportError, export_onnx
from apsat.lang.ops import COMPUTE_OPS
from apsat.pipeline.verify import compare

PARAMS = {"cast": "10", "clip": "-0.5 0.5", "leaky-relu": "0.1", "hard-sigmoid": "0.2 0.5", "elu": "1.0",
          "selu": "1.67 1.05"}
SHAPES = {"a": (4, 5), "b": (4, 5), "c": (4, 5)}


def _fake_model(shapes: dict) -> SimpleNamespace:
    """What export_onnx reads of a loaded model: the ONNX inputs' types, no weights."""
    graph = helper.make_graph([], "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, d)
                                        for n, d in shapes.items()], [])
    return SimpleNamespace(onnx=helper.make_model(graph), weights={})


def _exported_matches(text: str, shapes: dict, inputs: dict) -> tuple:
    program = apsat.parse(text, shapes)
    proto = export_onnx(program, _fake_model(shapes))
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    feed = {i.name: inputs[i.name] for i in sess.get_inputs()}
    got = sess.run(None, feed)[0]
    want = apsat.evaluate(program, inputs)
    return compare({"out": want}, {"out": got}), proto


def _operator_text(name: str) -> str:
    spec = COMPUTE_OPS[name]
    op = f"({name} {PARAMS[name]})" if name in PARAMS else name
    a, b, c = ("(access (access-tensor a) 1)", "(access (access-tensor b) 1)", "(access (access-tensor c) 1)")
    if spec.kind == "map":
        return f"(compute {op} {a})"
    if spec.arity == 3:
        return f"(compute {op} (access-concatenate (access-pair {a} {b}) (access (access-insert-axis {c} 1) 1) 1))"
    return f"(compute {op} (access-pair {a} {b}))"


def _inputs(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    x = {k: rng.standard_normal(d).astype(np.float32) for k, d in SHAPES.items()}
    x["a"][0, :2] = 0.0                       # zeros: the booleans' false, sign's 0
    x["b"][1] = np.round(x["b"][1])           # small integers: mod, pow, equal
    return x


ELEMENTWISE = sorted(n for n, s in COMPUTE_OPS.items() if s.kind in ("map", "nary"))


@pytest.mark.parametrize("name", ELEMENTWISE)
def test_every_elementwise_operator_exports_and_equals_the_reference(name):
    result, proto = _exported_matches(_operator_text(name), SHAPES, _inputs())
    assert result.ok, (name, result)
    ops = {n.op_type for n in proto.graph.node}
    spec = COMPUTE_OPS[name]
    if spec.onnx_out:                         # the declared op is what the export writes
        assert spec.onnx_out.split()[0].split(":")[-1] in ops, (name, ops)


def test_softmax_layer_norm_and_reductions_over_the_item():
    x = _inputs()
    for op in ("softmax", "(layer-norm 1e-05)", "(rms-norm 1e-06)", "reduce-sum", "reduce-max", "reduce-mean"):
        result, _ = _exported_matches(f"(compute {op} (access (access-tensor a) 1))", SHAPES, x)
        assert result.ok, (op, result)


def test_transposes_cost_one_node_at_most():
    """Two transposes and a relu: the layout is bookkeeping until the output needs it."""
    text = ("(compute relu (access-transpose (access-transpose (access (access-tensor a) 1) "
            "(list 1 0)) (list 1 0)))")
    result, proto = _exported_matches(text, SHAPES, _inputs())
    assert result.ok and [n.op_type for n in proto.graph.node] == ["Relu"]
    text = "(compute relu (access-transpose (access (access-tensor a) 1) (list 1 0)))"
    result, proto = _exported_matches(text, SHAPES, _inputs())
    assert result.ok and sorted(n.op_type for n in proto.graph.node) == ["Relu", "Transpose"]


def test_a_matmul_against_weights_is_one_gemm_with_its_bias():
    shapes = {"x": (3, 8), "w": (5, 8), "bias": (5,)}
    program = apsat.parse("(fused-dot-bias (access (access-tensor x) 1) (access (access-tensor w) 1) "
                          "(access (access-tensor bias) 1))", shapes)
    rng = np.random.default_rng(1)
    weights = {k: rng.standard_normal(shapes[k]).astype(np.float32) for k in ("w", "bias")}
    program.weights = frozenset(weights)
    model = _fake_model({"x": shapes["x"]})
    model.weights = weights
    proto = export_onnx(program, model)
    assert [n.op_type for n in proto.graph.node] == ["Gemm"]
    x = rng.standard_normal(shapes["x"]).astype(np.float32)
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    got = sess.run(None, {"x": x})[0]
    assert compare({"o": apsat.evaluate(program, {"x": x, **weights})}, {"o": got}).ok


def test_a_systolic_array_atom_is_refused_in_one_line():
    shapes = {"a": (4, 8), "w": (8, 3)}
    program = apsat.parse("(systolic-array 8 3 (access (access-tensor a) 1) (access (access-tensor w) 0))", shapes)
    with pytest.raises(ExportError) as err:
        export_onnx(program, _fake_model(shapes))
    assert "systolic-array" in str(err.value) and "\n" not in str(err.value)


def test_an_opaque_call_reading_a_concatenation_exports():
    """GridSample (an opaque call) whose grid is a Concat of two Unsqueezes (RAFT's): the
    argument is a lazy pair in the export, written out before the call reads it; and the
    node, written at opset 17 (mode "bilinear"), is upgraded to the export's opset, where
    that mode is called "linear"."""
    from backend_cases import checked_model

    from apsat.pipeline.zoo import ort_run

    f = TensorProto.FLOAT
    nodes = [helper.make_node("Unsqueeze", ["gx", "ax"], ["ux"]), helper.make_node("Unsqueeze", ["gy", "ax"], ["uy"]),
             helper.make_node("Concat", ["ux", "uy"], ["grid"], axis=-1),
             helper.make_node("GridSample", ["x", "grid"], ["y"], align_corners=1, mode="bilinear")]
    proto = checked_model(nodes, {"x": (f, [1, 2, 4, 4]), "gx": (f, [1, 3, 3]), "gy": (f, [1, 3, 3])},
                          {"y": (f, [1, 2, 3, 3])}, {"ax": np.array([3])}, opset=17)
    rng = np.random.default_rng(0)
    inputs = {"x": rng.standard_normal((1, 2, 4, 4)).astype(np.float32),
              "gx": rng.uniform(-1, 1, (1, 3, 3)).astype(np.float32),
              "gy": rng.uniform(-1, 1, (1, 3, 3)).astype(np.float32)}
    exported = apsat.optimize(proto, target="gpu", verify=False).to_onnx()
    np.testing.assert_array_equal(ort_run(exported, inputs)["y"], ort_run(proto, inputs)["y"])


def test_attention_over_constant_keys_broadcast_over_heads_exports():
    """An attention atom whose keys and values are weights shared by every head (a broadcast
    constant after folding, as Inkling's export has): the constant is written whole before
    the Attention node's reshape reads its head axes (it was written with those axes cut to
    1, and onnxruntime refused the Reshape)."""
    from attention_forms import forms

    from apsat.lang.program import Program

    atom, _, shapes = forms((1, 4), (1, 1), 3, 5, 8, 6, safe=False, bias=False)
    rng = np.random.default_rng(2)
    weights = {n: rng.standard_normal(shapes[n]).astype(np.float32) for n in ("k", "vt")}
    parsed = apsat.parse(atom, shapes)
    program = Program(parsed.outputs, parsed.tensor_shapes, weights=frozenset(weights))
    model = SimpleNamespace(onnx=helper.make_model(helper.make_graph(
        [], "g", [helper.make_tensor_value_info("q", TensorProto.FLOAT, shapes["q"])], [])), weights=weights)
    proto = export_onnx(program, model)
    q = rng.standard_normal(shapes["q"]).astype(np.float32)
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    got = sess.run(None, {"q": q})[0]
    assert compare({"out": apsat.evaluate(program, {"q": q, **weights})}, {"out": got}).ok


def test_attention_with_a_row_masked_whole_by_finfo_min_exports_as_the_program():
    """A padding mask written with finfo.min (transformers' masked_fill): a query row masked
    whole attends uniformly in the program and the original; onnxruntime's Attention reads
    -FLT_MAX as -inf and gives 0 there, so the export raises finite mask values to -1e30."""
    from attention_forms import forms

    atom, _, shapes = forms((1, 2), (1, 2), 4, 4, 8, 3, safe=False, bias=True)
    rng = np.random.default_rng(3)
    inputs = {n: rng.standard_normal(d).astype(np.float32) for n, d in shapes.items()}
    mask = np.zeros(shapes["mask"], np.float32)
    mask[..., 2, :] = np.finfo(np.float32).min            # query row 2 masked whole
    mask[..., 0, 3] = np.finfo(np.float32).min            # one key of row 0
    inputs["mask"] = mask
    verdict, _ = _exported_matches(atom, shapes, inputs)
    assert verdict.ok, verdict
