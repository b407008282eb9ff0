"""Bad models give one-line ModelErrors that name the problem, and print nothing (no
onnxruntime or egglog noise on stdout/stderr)."""
from __future__ import annotations


import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper


from models import make_model  # noqa: E402

from apsat.pipeline import zoo  # noqa: E402
from apsat.frontend.importer import load_onnx  # noqa: E402
from apsat.errors import ModelError  # noqa: E402

RESNET = next(p for p in zoo.light_model_paths() if "resnet50" in p.name)


def expect_error(capfd, source, *fragments, **kwargs) -> str:
    """load_onnx(source) raises a one-line ModelError containing every fragment, and
    nothing reaches stdout or stderr."""
    with pytest.raises(ModelError) as info:
        load_onnx(source, **kwargs)
    msg = str(info.value)
    assert "\n" not in msg, msg
    for frag in fragments:
        assert frag in msg, f"{frag!r} not in {msg!r}"
    out, err = capfd.readouterr()
    assert out == "" and err == "", (out, err)
    return msg


def _graph_model(nodes, inputs, outputs, inits=(), opsets=(("", 17),)):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    model.ir_version = 8
    return model


def _fvi(name, dims):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, dims)


# ---- files ----------------------------------------------------------------------------------

def test_missing_file(capfd, tmp_path):
    expect_error(capfd, tmp_path / "nope.onnx", "nope.onnx", "no such file")


def test_directory(capfd, tmp_path):
    expect_error(capfd, tmp_path, "not a file")


def test_empty_file(capfd, tmp_path):
    p = tmp_path / "empty.onnx"
    p.write_bytes(b"")
    expect_error(capfd, p, "empty file")


@pytest.mark.parametrize("fraction", [0.02, 0.5, 0.999])
def test_truncated_file(capfd, tmp_path, fraction):
    data = RESNET.read_bytes()
    p = tmp_path / "cut.onnx"
    p.write_bytes(data[: int(len(data) * fraction)])
    expect_error(capfd, p, "cut.onnx", "truncated")


@pytest.mark.parametrize("data", [b"hello, this is not a model\n", bytes(range(256)) * 4, b"\x00" * 64])
def test_non_onnx_bytes(capfd, tmp_path, data):
    p = tmp_path / "junk.onnx"
    p.write_bytes(data)
    expect_error(capfd, p, "junk.onnx", "not an ONNX")


# ---- graph structure ------------------------------------------------------------------------

def test_checker_failure(capfd):
    """Relu with two inputs passes the structural checks; onnx.checker rejects it."""
    model = _graph_model([helper.make_node("Relu", ["x", "x"], ["y"])], [_fvi("x", [2])], [_fvi("y", [2])])
    expect_error(capfd, model, "onnx.checker")


def test_dangling_input(capfd):
    model = _graph_model([helper.make_node("Add", ["x", "ghost"], ["y"], name="add1")],
                         [_fvi("x", [2])], [_fvi("y", [2])])
    expect_error(capfd, model, "Add node 0 'add1'", "'ghost'", "produced by no node")


def test_nodes_out_of_order(capfd):
    model = _graph_model([helper.make_node("Relu", ["a"], ["y"]), helper.make_node("Relu", ["x"], ["a"])],
                         [_fvi("x", [2])], [_fvi("y", [2])])
    expect_error(capfd, model, "Relu node 0", "'a'", "topological order")


def test_unknown_default_domain_op(capfd):
    model = _graph_model([helper.make_node("Frobnicate", ["x"], ["y"])], [_fvi("x", [2])], [_fvi("y", [2])])
    expect_error(capfd, model, "Frobnicate node 0", "unknown op")


def test_unknown_custom_op_without_inferable_shape(capfd):
    model = _graph_model(
        [helper.make_node("Frob", ["x"], ["t"], domain="com.example"), helper.make_node("Relu", ["t"], ["y"])],
        [_fvi("x", [2, 3])], [_fvi("y", [2, 3])], opsets=(("", 17), ("com.example", 1)))
    expect_error(capfd, model, "Frob node 0", "unknown op", "shape of its output 't'", "cannot be determined")


def test_unknown_custom_op_with_declared_shape_is_opaque():
    """The output shape is declared, so the node imports as an opaque call."""
    model = _graph_model([helper.make_node("Frob", ["x"], ["y"], domain="com.example")],
                         [_fvi("x", [2, 3])], [_fvi("y", [2, 3])], opsets=(("", 17), ("com.example", 1)))
    assert len(load_onnx(model).program.opaque_nodes) == 1


# ---- attributes and dims --------------------------------------------------------------------

W = np.ones((4, 3, 3, 3), np.float32)


@pytest.mark.parametrize("op,inputs,attrs,fragments", [
    ("Conv", [(1, 3, 8, 8), W], {"strides": [0, 1]}, ("Conv node 0", "'strides'")),
    ("Conv", [(1, 3, 8, 8), W], {"pads": [1, 1]}, ("Conv node 0", "'pads'")),
    ("Conv", [(1, 3, 8, 8), W], {"kernel_shape": [5, 5]}, ("Conv node 0", "'kernel_shape'")),
    ("Conv", [(1, 3, 8, 8), W], {"auto_pad": "SIDEWAYS"}, ("Conv node 0", "'auto_pad'")),
    ("MaxPool", [(1, 3, 8, 8)], {"kernel_shape": [2]}, ("MaxPool node 0", "'kernel_shape'")),
    ("Transpose", [(2, 3)], {"perm": [0, 0]}, ("Transpose node 0", "'perm'")),
    ("Softmax", [(2, 3)], {"axis": 5}, ("Softmax node 0", "'axis'")),
    ("LRN", [(1, 3, 4, 4)], {"size": 0}, ("LRN node 0", "'size'")),
], ids=["conv-strides", "conv-pads", "conv-kernel", "conv-autopad", "pool-kernel", "perm", "axis", "lrn"])
def test_malformed_attribute(capfd, op, inputs, attrs, fragments):
    model = _single_unchecked(op, inputs, attrs)
    msg = expect_error(capfd, model, *fragments, "attribute")
    assert "node 0" in msg


def _single_unchecked(op, inputs, attrs):
    """single_op without shape inference (it would refuse the bad attribute first)."""
    names, vis, inits = [], [], []
    for i, spec in enumerate(inputs):
        name = f"x{i}"
        names.append(name)
        if isinstance(spec, np.ndarray):
            inits.append(onnx.numpy_helper.from_array(spec, name))
        else:
            vis.append(_fvi(name, list(spec)))
    node = helper.make_node(op, names, ["y"], **attrs)
    return _graph_model([node], vis, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)


def test_node_named_by_name(capfd):
    model = _single_unchecked("Conv", [(1, 3, 8, 8), W], {"strides": [0, 1]})
    model.graph.node[0].name = "stem_conv"
    expect_error(capfd, model, "Conv node 0 'stem_conv'", "'strides'")


def test_conv_channel_mismatch(capfd):
    model = _single_unchecked("Conv", [(1, 5, 8, 8), W], {})
    model.graph.node[0].name = "conv1"
    expect_error(capfd, model, "Conv node 0 'conv1'", "5 channels", "'x1'")


def test_conv_group_mismatch(capfd):
    model = _single_unchecked("Conv", [(1, 6, 8, 8), np.ones((4, 2, 3, 3), np.float32)], {"group": 2})
    expect_error(capfd, model, "Conv node 0", "6 channels", "group 2")


def test_incompatible_broadcast(capfd):
    model = _single_unchecked("Add", [(2, 3), (4, 5)], {})
    expect_error(capfd, model, "Add node 0")


def test_reshape_that_does_not_fit(capfd):
    model = _single_unchecked("Reshape", [(2, 3), np.array([4, -1], np.int64)], {})
    expect_error(capfd, model, "Reshape node 0", "does not fit")


# ---- inputs ---------------------------------------------------------------------------------

def _dynamic_model():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])
    return _graph_model([helper.make_node("Relu", ["x"], ["y"])], [x],
                        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])])


def test_symbolic_input_dim_becomes_1_with_a_notice():
    model = load_onnx(_dynamic_model())
    assert model.inputs == {"x": (1, 3)}
    (notice,) = model.notices
    assert "input 'x'" in notice and "symbolic dim 'batch'" in notice and "--input-shape" in notice


def test_symbolic_dim_shared_by_inputs_takes_the_given_value():
    """A dim name given a value through one input's override binds it on every input."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])
    model = load_onnx(_graph_model([helper.make_node("Add", ["x", "z"], ["y"])], [x, z], [y]),
                      input_shapes={"x": (5, 3)})
    assert model.inputs == {"x": (5, 3), "z": (5, 3)} and not model.notices


def test_conflicting_values_for_one_symbolic_dim(capfd):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])
    model = _graph_model([helper.make_node("Add", ["x", "z"], ["y"])], [x, z], [y])
    expect_error(capfd, model, "'batch'", "2 and 3", input_shapes={"x": (2, 3), "z": (3, 3)})


def test_override_with_the_wrong_rank(capfd):
    expect_error(capfd, _dynamic_model(), "'x'", "3 dims", "has 2", input_shapes={"x": (1, 3, 1)})


def test_symbolic_input_dim_override():
    model = load_onnx(_dynamic_model(), input_shapes={"x": (4, 3)})
    assert model.inputs == {"x": (4, 3)}
    out = model.run({"x": -np.ones((4, 3), np.float32)})
    assert out["y"].shape == (4, 3) and not out["y"].any()


def test_override_of_unknown_input(capfd):
    expect_error(capfd, _dynamic_model(), "'z'", "not graph inputs", input_shapes={"x": (1, 3), "z": (1,)})


def test_run_checks_inputs():
    model = load_onnx(make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": (2, 3)}, ["y"]))
    with pytest.raises(ModelError, match="missing inputs"):
        model.run({})
    with pytest.raises(ModelError, match="shape"):
        model.run({"x": np.zeros((3, 2), np.float32)})


def test_mismatched_input_types_are_refused(capfd):
    # A float64 weight on a float32 Conv: onnx's checker lets it through, onnxruntime refuses it.
    w = onnx.numpy_helper.from_array(np.zeros((4, 3, 3, 3)), "w")
    model = _graph_model([helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3])],
                         [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                         [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    expect_error(capfd, model, "Conv", "'w' is double but 'x' is float", "type T must agree")
