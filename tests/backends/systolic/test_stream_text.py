"""The stream's text form: one instruction a line, written and parsed back to an equal
stream (opaque ONNX nodes and host terms included), refused with the line number when it
is not a stream, and written by `write` with the cycle report beside it."""
from __future__ import annotations

import json

import numpy as np
import pytest
from models import make_model
from onnx import helper
from sa_helpers import conv_text, small_acc

import apsat
from apsat.backends import systolic as sab


def equal_streams(a, b) -> bool:
    return (a.accel == b.accel and a.buffers == b.buffers and a.views == b.views and a.init == b.init
            and a.main == b.main and a.outputs == b.outputs and a.groups == b.groups
            and a.options == b.options and sorted(a.opaque) == sorted(b.opaque))


@pytest.mark.parametrize("df", ["os", "ws", "is"])
def test_a_compiled_conv_round_trips(df):
    prog = apsat.parse(conv_text(3, 3, 3, 10, stride=2, pad=1), {"x": (1, 3, 17, 17), "w": (10, 3, 3, 3)})
    for opts in ({}, {"im2col": "gather", "fold_copies": True}):
        s = sab.compile(prog, small_acc(df, kb=2), weights={"w"}, **opts)
        text = sab.to_text(s)
        assert equal_streams(sab.parse(text), s)
        assert sab.to_text(sab.parse(text)) == text
        # one instruction a line, every opcode readable
        body = text.split("\n.main\n")[1].splitlines()
        assert len(body) == len(s.main)
        assert {line.split()[0] for line in body} <= {"LOAD", "STORE", "COPY", "PRELOAD", "MATMUL", "VEC", "HOST"}


def test_host_steps_with_opaque_nodes_round_trip_and_still_run(tmp_path):
    # Atan has no lowering: an opaque call (onnxruntime) the stream runs as a HOST step
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Atan", ["r"], ["y"])]
    model = apsat.load_onnx(make_model(nodes, {"x": (3, 4)}, ["y"]))
    s = sab.compile(model.program, "systolic:32x32")
    (host,) = [i for i in s.main if isinstance(i, sab.Host)]
    assert "opaque ONNX node" in host.reason and s.opaque
    path = sab.write(s, tmp_path)
    again = sab.read(path)
    assert equal_streams(again, s)
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    out = sab.simulate(again, {"x": x})["y"]
    np.testing.assert_allclose(out, np.arctan(np.maximum(x, 0)), rtol=1e-6, atol=1e-7)
    report = json.loads((tmp_path / "cycles.json").read_text())
    assert report["host_steps"][0]["reason"] == host.reason


def test_tensor_names_with_spaces_survive():
    prog = apsat.parse('(compute relu (access-tensor "odd name/x:0"))', {"odd name/x:0": (2, 3)})
    s = sab.compile(prog, small_acc())
    again = sab.parse(sab.to_text(s))
    assert equal_streams(again, s)
    x = np.arange(-3, 3, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(sab.simulate(again, {"odd name/x:0": x})["out"], np.maximum(x, 0))


@pytest.mark.parametrize("text,where", [
    ("not a stream\n", "line 1"),
    ("; apsat systolic stream v1\n.buffer x0 input 2x2 \"x\"\n", "line 2"),
    ("; apsat systolic stream v1\n.accel rows=8 cols=8 dataflow=\"os\" ifmap_kb=1 filter_kb=1 ofmap_kb=1 "
     "dram_bandwidth=16.0 vector_lanes=8 name=\"t\"\n.main\nFROB x\n", "line 4"),
    ("; apsat systolic stream v1\n.accel rows=8 cols=8 dataflow=\"os\" ifmap_kb=1 filter_kb=1 ofmap_kb=1 "
     "dram_bandwidth=16.0 vector_lanes=8 name=\"t\"\n.main\nLOAD ifmap@0 <- v0 words=1\n", "line 4"),
])
def test_text_that_is_not_a_stream_is_refused_with_its_line(text, where):
    with pytest.raises(sab.StreamParseError) as e:
        sab.parse(text)
    assert str(e.value).startswith(where) and "\n" not in str(e.value)


def test_an_accelerator_the_target_module_refuses_is_refused_when_read():
    text = ("; apsat systolic stream v1\n.accel rows=0 cols=8 dataflow=\"os\" ifmap_kb=1 filter_kb=1 "
            "ofmap_kb=1 dram_bandwidth=16.0 vector_lanes=8 name=\"t\"\n")
    with pytest.raises(apsat.ApsatError, match="rows must be a positive integer"):
        sab.parse(text)


def test_view_steps_round_trip_and_footprints():
    from apsat.backends.systolic.views import apply, dims_after, footprint, parse_step, step_text

    steps = (("pad", 2, 1, 1, 0.0), ("windows", (3, 3, 3), (1, 2, 2), (1, 1, 1), 1),
             ("reshape", (1, 6, 5, 27)), ("slice", 1, 0, 4), ("transpose", (0, 2, 1, 3)),
             ("broadcast", (1, 5, 4, 27)), ("pad", 3, 0, 5, float("-inf")))
    assert tuple(parse_step(step_text(s)) for s in steps) == steps
    x = np.arange(3 * 12 * 12, dtype=np.float32).reshape(1, 3, 12, 12)
    assert apply(x, steps).shape == dims_after(x.shape, steps) == (1, 5, 4, 32)
    # windows that overlap read each input word once; pads and broadcasts read nothing more
    assert footprint(x.shape, steps[:3]) == x.size
    assert footprint((64,), (("reshape", (1, 64, 1, 1)), ("broadcast", (1, 64, 9, 9)))) == 64
    assert footprint((10, 10), (("slice", 0, 0, 2),)) == 20
