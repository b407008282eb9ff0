"""What real exported models need from the importer: shapes onnx's inference gives up on
(an attention mask's Expand through Shape/Equal/Where/ConstantOfShape), integer inputs
(token ids, masks) carried as float32, inputs of every type, --input-shape and --inputs.
Every optimised program is compared with onnxruntime (rtol 1e-4, atol 1e-5 x scale:
apsat.pipeline.verify)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper
from onnx import numpy_helper as nh

import apsat
from apsat.errors import ApsatError, ModelError
from apsat.pipeline.inputs import index_bounds, load_inputs, random_inputs


def _const(name, value):
    return helper.make_node("Constant", [], [name], value=nh.from_array(np.asarray(value)))


def attention_mask_model(seq: int = 8):
    """BERT's extended mask as the TorchScript exporter writes it: the int64 mask
    unsqueezed, expanded to a shape computed through Shape/Equal/Where/ConstantOfShape
    (onnx's inference leaves the Expand's dims unknown), cast, (1 - m) * -1e4, added to
    the scores; the token ids index an embedding table (an opaque Gather)."""
    rng = np.random.default_rng(0)
    table = nh.from_array(rng.standard_normal((50, seq)).astype(np.float32), "table")
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["emb"]),              # (1, seq, seq)
        helper.make_node("Unsqueeze", ["emb", "one_axis"], ["scores"]),      # (1, 1, seq, seq)
        _const("one_axis", np.array([1], np.int64)), _const("axes", np.array([1, 2], np.int64)),
        helper.make_node("Unsqueeze", ["mask", "axes"], ["m4"]),
        helper.make_node("Shape", ["scores"], ["s"]),
        _const("neg1", np.array(-1, np.int64)), _const("four", np.array([4], np.int64)),
        helper.make_node("Equal", ["s", "neg1"], ["is_neg"]),
        helper.make_node("ConstantOfShape", ["four"], ["ones"], value=helper.make_tensor("v", T.INT64, [1], [1])),
        helper.make_node("Where", ["is_neg", "ones", "s"], ["target"]),
        helper.make_node("Expand", ["m4", "target"], ["mexp"]),
        helper.make_node("Cast", ["mexp"], ["mf"], to=T.FLOAT),
        _const("one", np.array(1.0, np.float32)), _const("big", np.array(-1e4, np.float32)),
        helper.make_node("Sub", ["one", "mf"], ["inv"]),
        helper.make_node("Mul", ["inv", "big"], ["bias"]),
        helper.make_node("Add", ["scores", "bias"], ["y"]),
    ]
    order = [2, 0, 1] + list(range(3, len(nodes)))     # constants before their readers
    graph = helper.make_graph([nodes[i] for i in order], "mask",
                              [helper.make_tensor_value_info("ids", T.INT64, ["batch", seq]),
                               helper.make_tensor_value_info("mask", T.INT64, ["batch", seq])],
                              [helper.make_tensor_value_info("y", T.FLOAT, None)], initializer=[table])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_onnx_inference_gives_up_on_the_mask_expand():
    """The case this importer must handle: onnx leaves the Expand's dims symbolic."""
    inferred = onnx.shape_inference.infer_shapes(attention_mask_model(), data_prop=True)
    (mexp,) = [v for v in inferred.graph.value_info if v.name == "mexp"]
    assert not all(d.HasField("dim_value") for d in mexp.type.tensor_type.shape.dim)


def test_mask_expand_is_lowered_not_refused():
    model = apsat.load_onnx(attention_mask_model())
    assert model.inputs == {"ids": (3, 8), "mask": (3, 8)} and len(model.notices) == 1   # batch at 3
    assert model.opaque_ops() == {}                        # the embedding lookup is a gather
    assert model.input_types == {"ids": T.INT64, "mask": T.INT64}


def test_random_inputs_follow_type_and_use():
    model = apsat.load_onnx(attention_mask_model())
    inputs = random_inputs(model, 3)
    assert inputs["ids"].dtype == np.int64 and inputs["mask"].dtype == np.int64
    assert index_bounds(model.onnx) == {"ids": 50}
    assert 0 <= inputs["ids"].min() and inputs["ids"].max() < 50
    np.testing.assert_array_equal(inputs["mask"], [[1, 1, 1, 1, 1, 1, 0, 0]] * 3)     # batch at 3


@pytest.mark.parametrize("target", ["gpu", "systolic:32x32"])
def test_integer_inputs_verify_on_both_targets(target):
    res = apsat.optimize(attention_mask_model(), target=target)
    assert res.report["verification"]["ok"], res.report["verification"]
    if target.startswith("systolic"):
        assert res.report["systolic"]["simulation"]["ok"]
    assert res.report["opaque_ops"] == {}


def test_input_shapes_bind_the_symbolic_batch():
    model = apsat.load_onnx(attention_mask_model(), input_shapes={"ids": (3, 8)})
    assert model.inputs == {"ids": (3, 8), "mask": (3, 8)} and not model.notices


BATCH_1 = {"ids": (1, 8), "mask": (1, 8)}    # the size the inputs below have


def test_user_inputs_from_npz(tmp_path):
    model = apsat.load_onnx(attention_mask_model(), input_shapes=BATCH_1)
    ids = np.array([[1, 2, 3, 4, 5, 6, 7, 49]])
    np.savez(tmp_path / "in.npz", ids=ids, mask=np.ones((1, 8), np.int32))
    got = load_inputs(tmp_path / "in.npz", model)
    assert got["mask"].dtype == np.int64 and got["ids"].tolist() == ids.tolist()
    res = apsat.optimize(model, inputs=tmp_path / "in.npz")
    assert res.report["verification"]["ok"]


@pytest.mark.parametrize("arrays, fragment", [
    ({"ids": np.zeros((1, 8), np.int64)}, "missing ['mask']"),
    ({"ids": np.zeros((1, 8), np.int64), "mask": np.zeros((1, 8), np.int64), "z": np.zeros(1)}, "unknown keys ['z']"),
    ({"ids": np.zeros((1, 9), np.int64), "mask": np.zeros((1, 8), np.int64)}, "has shape (1, 9)"),
    ({"ids": np.zeros((1, 8), np.float32), "mask": np.zeros((1, 8), np.int64)}, "is float32"),
])
def test_bad_npz_inputs_are_named(tmp_path, arrays, fragment):
    np.savez(tmp_path / "in.npz", **arrays)
    with pytest.raises(ApsatError, match=None) as info:
        load_inputs(tmp_path / "in.npz", apsat.load_onnx(attention_mask_model(), input_shapes=BATCH_1))
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_npz_that_is_not_one(tmp_path):
    (tmp_path / "in.npz").write_bytes(b"not a zip")
    with pytest.raises(ApsatError, match="not a readable .npz"):
        load_inputs(tmp_path / "in.npz", apsat.load_onnx(attention_mask_model(), input_shapes=BATCH_1))


def test_value_dependent_shape_is_refused_in_one_line():
    """NonZero's output shape depends on the data: no static program, a named refusal."""
    x = helper.make_tensor_value_info("x", T.FLOAT, [4])
    graph = helper.make_graph([helper.make_node("NonZero", ["x"], ["nz"]),
                               helper.make_node("Cast", ["nz"], ["y"], to=T.FLOAT)], "g", [x],
                              [helper.make_tensor_value_info("y", T.FLOAT, None)])
    with pytest.raises(ModelError) as info:
        apsat.load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert "NonZero node 0" in str(info.value) and "depends on the input values" in str(info.value)


def test_cli_input_shape_and_inputs(tmp_path, capsys):
    """--input-shape fixes the batch (no notice), --inputs verifies on the user's arrays."""
    from apsat.cli import main

    path = tmp_path / "mask.onnx"
    onnx.save(attention_mask_model(), str(path))
    np.savez(tmp_path / "in.npz", ids=np.arange(16).reshape(2, 8), mask=np.ones((2, 8), np.int64))
    rc = main(["optimize", str(path), "--out", str(tmp_path / "out"), "--no-compile",
               "--input-shape", "ids=2,8", "--inputs", str(tmp_path / "in.npz")])
    err = capsys.readouterr().err
    assert rc == 0 and "symbolic dim" not in err
    import json

    report = json.loads((tmp_path / "out" / "mask" / "report.json").read_text())
    assert report["verification"]["ok"] and report["notices"] == []


def test_cli_symbolic_dims_get_a_notice(tmp_path, capsys):
    from apsat.cli import main

    path = tmp_path / "mask.onnx"
    onnx.save(attention_mask_model(), str(path))
    assert main(["optimize", str(path), "--out", str(tmp_path / "out"), "--no-compile",
                 "--representative", "batch=7", "--onnx-out", str(tmp_path / "o.onnx")]) == 0
    err = capsys.readouterr().err
    assert "symbolic dim 'batch' kept symbolic; the program is built at 7" in err
    assert onnx.load(str(tmp_path / "o.onnx")).graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"


@pytest.mark.parametrize("flag", ["ids", "ids=", "ids=1,x", "ids=0,8", "=1,8"])
def test_cli_bad_input_shape(flag, capsys):
    from apsat.cli import main

    with pytest.raises(SystemExit) as info:
        main(["optimize", "m.onnx", "--input-shape", flag])
    assert info.value.code == 2 and "NAME=D0,D1" in capsys.readouterr().err


@pytest.mark.parametrize("starts, ends, steps", [([0], [99], [2]), ([1], [7], [3]), ([1, 0], [5, 9], [2, 4])])
def test_strided_slice_is_lowered(starts, ends, steps):
    """Swin's patch merging, x[:, 0::2, 1::2]: a step > 1 is a reshape and a slice."""
    import models

    from apsat.pipeline.zoo import ort_run

    axes = np.arange(1, len(starts) + 1, dtype=np.int64)
    w = {"s": np.array(starts, np.int64), "e": np.array(ends, np.int64), "a": axes,
         "st": np.array(steps, np.int64)}
    m = models.make_model([helper.make_node("Slice", ["x", "s", "e", "a", "st"], ["y"])], {"x": (2, 7, 9)}, ["y"], w)
    model = apsat.load_onnx(m)
    assert not model.opaque_ops()
    x = np.random.default_rng(0).standard_normal((2, 7, 9)).astype(np.float32)
    np.testing.assert_array_equal(model.run({"x": x})["y"], ort_run(m, {"x": x})["y"])


def test_op_without_lowering_on_weight_derived_terms_folds():
    """Swin builds its shifted-window mask with ScatterND over a float tensor computed in
    the language from constants only: evaluated at import, not a host step."""
    from apsat.pipeline.zoo import ort_run

    zeros = nh.from_array(np.zeros((4, 4), np.float32), "zeros")
    idx = nh.from_array(np.array([[1], [3]], np.int64), "idx")
    upd = nh.from_array(np.arange(8, dtype=np.float32).reshape(2, 4), "upd")
    nodes = [helper.make_node("Add", ["upd", "upd"], ["upd2"]),            # lowered: a term
             helper.make_node("ScatterND", ["zeros", "idx", "upd2"], ["mask"]),
             helper.make_node("Add", ["x", "mask"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [4, 4])],
                              [helper.make_tensor_value_info("y", T.FLOAT, [4, 4])], initializer=[zeros, idx, upd])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model = apsat.load_onnx(m)
    assert not model.opaque_ops()
    x = np.ones((4, 4), np.float32)
    np.testing.assert_array_equal(model.run({"x": x})["y"], ort_run(m, {"x": x})["y"])


# The ONNX ops real zoos use that the language expresses: each must have a lowering (an
# element-wise kernel or a composition), never an opaque host call.
EXPRESSIBLE = ["HardSwish", "HardSigmoid", "LeakyRelu", "Elu", "Selu", "Softplus", "Mish", "PRelu",
               "Neg", "Abs", "Log", "Reciprocal", "Min", "Max", "Mod", "Equal", "Less", "Greater",
               "LessOrEqual", "GreaterOrEqual", "Not", "And", "Or", "Where", "Cos", "Sin", "ReduceMax",
               "ReduceMin", "ReduceSum", "ReduceProd", "ReduceL2", "ArgMax", "InstanceNormalization",
               "GroupNormalization", "ConvTranspose", "Resize", "IsNaN", "Cast"]


def test_every_expressible_op_has_a_lowering():
    from apsat.frontend.lowering import LOWERINGS

    assert not [op for op in EXPRESSIBLE if op not in LOWERINGS]
