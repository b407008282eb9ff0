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


def test_symbolic_input_dim_stays_a_symbol_built_at_a_representative_value():
    """Never silently 1: batch is built at its role's prime (5: 3 is a fixed dim here)."""
    model = load_onnx(_dynamic_model())
    assert model.inputs == {"x": (5, 3)} and model.signature == {"x": ("batch", 3)}
    assert model.symbols["batch"].role == "batch" and model.symbols["batch"].checks == (5, 1, 4)
    (notice,) = model.notices
    assert "symbolic dim 'batch' kept symbolic" in notice and "--representative" in notice


def test_representative_value_is_the_users_and_unknown_names_are_refused():
    assert load_onnx(_dynamic_model(), representatives={"batch": 8}).inputs == {"x": (8, 3)}
    with pytest.raises(ModelError, match=r"representative values name \['seq'\]"):
        load_onnx(_dynamic_model(), representatives={"seq": 8})


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


# ---- found by benchmarks/fuzz.py: each was a traceback, an allocation or an onnxruntime
# failure after import; each is now a one-line ModelError at import ------------------------

BIG = [2 ** 20, 2 ** 20]      # 2**40 elements: refused from the dims, nothing allocated


def _huge_initializer():
    """An Add whose weight declares BIG dims and holds no data."""
    model = _graph_model([helper.make_node("Add", ["x", "w"], ["y"])], [_fvi("x", [1, 1])], [_fvi("y", None)])
    w = model.graph.initializer.add()
    w.name, w.data_type, w.raw_data = "w", TensorProto.FLOAT, b""
    w.dims.extend(BIG)
    return model


@pytest.mark.parametrize("op, x_dims, const", [
    ("Relu", BIG, None),
    ("Tile", [2, 3], np.array(BIG, np.int64)),
    ("Expand", [1, 1], np.array(BIG, np.int64)),
    ("ConstantOfShape", None, np.array(BIG, np.int64)),
    ("Pad", [2, 3], np.array([0, 0] + BIG, np.int64)),
], ids=["input", "tile", "expand", "constant-of-shape", "pad"])
def test_huge_tensors_are_refused_before_allocating(capfd, op, x_dims, const):
    inputs = ([_fvi("x", x_dims)] if x_dims else [])
    inits = [onnx.numpy_helper.from_array(const, "s")] if const is not None else []
    names = (["x"] if x_dims else []) + (["s"] if const is not None else [])
    model = _graph_model([helper.make_node(op, names, ["y"])], inputs, [_fvi("y", None)], inits)
    expect_error(capfd, model, "elements", "over apsat's limit of 2**30 per tensor")


def test_huge_initializer_without_data(capfd):
    expect_error(capfd, _huge_initializer(), "initializer 'w' has 1099511627776 elements")


def test_initializer_whose_data_does_not_fill_its_dims(capfd):
    model = _huge_initializer()
    del model.graph.initializer[0].dims[:]
    model.graph.initializer[0].dims.extend([2, 3])
    expect_error(capfd, model, "initializer 'w' of dims (2, 3): cannot reshape array of size 0")


@pytest.mark.parametrize("model, fragment", [
    (_graph_model([helper.make_node("ConstantOfShape", ["s"], ["y"])], [], [_fvi("y", None)],
                  [onnx.numpy_helper.from_array(np.array([0, 4], np.int64), "s")]), "value 'y' has no elements"),
    (_graph_model([helper.make_node("Slice", ["x", "a", "b"], ["s"]), helper.make_node("Relu", ["s"], ["y"])],
                  [_fvi("x", [4, 3])], [_fvi("y", None)],
                  [onnx.numpy_helper.from_array(np.array([2], np.int64), n) for n in "ab"]),
     "value 'y' has no elements"),
], ids=["constant-of-shape", "slice"])
def test_empty_tensors_are_refused(capfd, model, fragment):
    """A zero-element value reached the gpu backend's tiling (ZeroDivisionError). Inside
    the graph an empty value is a constant (a Concat drops it); as a graph output the
    program would have nothing to compute, so it is refused, naming the output."""
    expect_error(capfd, model, fragment, "non-empty")


def test_output_without_element_type(capfd):
    """onnxruntime refuses such a model ("Invalid tensor data type 0") when verifying."""
    model = _graph_model([helper.make_node("Relu", ["x"], ["y"])], [_fvi("x", [2])],
                         [helper.make_tensor_value_info("y", 0, [2])])
    expect_error(capfd, model, "graph output 'y' has element type 0 (undefined)")


def test_input_of_no_onnx_element_type(capfd):
    """The enum's name lookup raised a bare ValueError."""
    model = _graph_model([helper.make_node("Relu", ["x"], ["y"])], [_fvi("x", [2])], [_fvi("y", [2])])
    model.graph.input[0].type.tensor_type.elem_type = 12345
    expect_error(capfd, model, "graph input 'x' has element type 12345 (not an ONNX type)")


def test_input_of_a_type_the_op_does_not_take(capfd):
    """A float HannWindow size: onnx's checker passed it, onnxruntime refused the model."""
    model = _graph_model([helper.make_node("HannWindow", ["x"], ["y"])], [_fvi("x", [])], [_fvi("y", None)])
    expect_error(capfd, model, "HannWindow", "input 'x' is tensor(float)", "does not allow", "tensor(int64)")


@pytest.mark.parametrize("opsets, fragment", [
    ((("", 17), ("", 99)), "imported twice (17 and 99)"),
    ((("", 999),), "opset 999 of the default domain"),
    ((("", 5),), "opset 5 of the default domain: apsat takes 7"),
    ((("", 17), ("com.example", 0)), "opset 0 of domain 'com.example'"),
])
def test_bad_opset_imports(capfd, opsets, fragment):
    model = _graph_model([helper.make_node("Relu", ["x"], ["y"])], [_fvi("x", [2])], [_fvi("y", [2])],
                         opsets=opsets)
    expect_error(capfd, model, fragment)


def test_reshape_shape_must_be_1d(capfd):
    """onnxruntime refuses a 2-D shape tensor at run time; the fold read it flattened."""
    model = _single_unchecked("Reshape", [(2, 6), np.array([[3], [4]], np.int64)], {})
    expect_error(capfd, model, "Reshape node 0", "input 'x1' must be 1-D, has dims (2, 1)")


def test_nan_weights_are_refused(capfd):
    w = np.ones((4, 3, 3, 3), np.float32)
    w[1, 2, 0, 0] = np.nan
    model = _single_unchecked("Conv", [(1, 3, 8, 8), w], {})
    expect_error(capfd, model, "initializer 'x1' holds 1 NaN value(s) among its 108 elements")


def test_inf_weights_still_import():
    """-inf is how attention masks are written: only NaN is refused."""
    mask = np.array([0.0, -np.inf], np.float32)
    model = _single_unchecked("Add", [(2, 2), mask], {})
    assert load_onnx(model).weights


@pytest.mark.parametrize("name, fragment", [
    (b"graph_nm", "'name' of a GraphProto"), (b"node_in", "'input' of a NodeProto"),
    (b"weight_w", "'name' of a TensorProto")])
def test_strings_that_are_not_utf8(capfd, tmp_path, name, fragment):
    """A bit flip in a name: protobuf parsed it as bytes, and the skeleton's copy raised
    UnicodeDecodeError."""
    model = _graph_model([helper.make_node("Add", ["node_in", "weight_w"], ["y"])], [_fvi("node_in", [2])],
                         [_fvi("y", [2])], [onnx.numpy_helper.from_array(np.ones(2, np.float32), "weight_w")])
    model.graph.name = "graph_nm"
    data = model.SerializeToString()
    at = data.find(name) if name != b"weight_w" else data.rfind(name)
    path = tmp_path / "bad.onnx"
    path.write_bytes(data[:at + 2] + b"\xac" + data[at + 3:])
    expect_error(capfd, path, "bad.onnx: corrupt ONNX file", fragment, "is not UTF-8 text")


def test_a_tensor_where_the_op_takes_a_sequence(capfd):
    """SequenceErase of a tensor: onnxruntime refused the model while verifying."""
    model = _graph_model([helper.make_node("SequenceErase", ["x"], ["y"])], [_fvi("x", [2])], [_fvi("y", None)])
    expect_error(capfd, model, "SequenceErase", "input 'x' is tensor(float)", "does not allow", "seq(tensor(float))")
