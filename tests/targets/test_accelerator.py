"""The systolic accelerator description: presets, target names, TOML files and every
refusal (one-line ApsatError naming the problem)."""
import math
from pathlib import Path

import pytest

from apsat.errors import ApsatError
from apsat.targets import Target, parse_target
from apsat.targets.accelerator import PRESETS, Accelerator, load_accelerator


def test_presets_follow_scalesims_own_configs():
    a = PRESETS["32x32"]                                   # scale.cfg
    assert (a.rows, a.cols, a.dataflow) == (32, 32, "os")
    assert (a.ifmap_kb, a.filter_kb, a.ofmap_kb, a.dram_bandwidth) == (64, 64, 64, 64)
    assert a.ifmap_words == a.filter_words == a.ofmap_words == 65536
    b = PRESETS["256x256"]                                 # google.cfg
    assert (b.rows, b.cols, b.dataflow) == (256, 256, "ws")
    assert (b.ifmap_kb, b.filter_kb, b.ofmap_kb, b.dram_bandwidth) == (6144, 6144, 2048, 10)
    assert (a.vector_lanes, b.vector_lanes) == (32, 256)


@pytest.mark.parametrize("name, rows, cols, dataflow, tname", [
    ("systolic", 32, 32, "os", "systolic:32x32"),
    ("systolic:32x32", 32, 32, "os", "systolic:32x32"),
    ("systolic:256x256", 256, 256, "ws", "systolic:256x256"),
    ("systolic:16x8", 16, 8, "os", "systolic:16x8"),
])
def test_parse_target_names(name, rows, cols, dataflow, tname):
    t = parse_target(name)
    assert (t.kind, t.rows, t.cols, t.accel.dataflow, t.name) == ("systolic", rows, cols, dataflow, tname)
    assert t.facts() == f"(set (target-rows) {rows})\n(set (target-cols) {cols})"


def test_gpu_has_no_accelerator_and_no_facts():
    t = parse_target("gpu")
    assert (t.kind, t.rows, t.cols, t.accel, t.name, t.facts()) == ("gpu", None, None, None, "gpu", "")


def test_other_sizes_are_scale_cfg_like_and_grow_their_sram_to_one_tile():
    t = parse_target("systolic:16x8").accel
    assert (t.ifmap_kb, t.filter_kb, t.ofmap_kb, t.dram_bandwidth, t.dataflow) == (64, 64, 64, 64, "os")
    big = parse_target("systolic:512x512").accel          # one tile = 256 kB of words
    assert big.filter_words >= 512 * 512 and big.ifmap_kb == big.ofmap_kb == 256


def test_target_constructed_directly_keeps_working():
    t = Target("systolic", 32, 32)
    assert t == parse_target("systolic") and t.accel is PRESETS["32x32"]
    assert Target("systolic", 256, 256).accel is PRESETS["256x256"]
    assert Target("systolic", accel=PRESETS["256x256"]).rows == 256
    assert parse_target(t) is t
    assert parse_target(PRESETS["256x256"]).name == "systolic:256x256"
    with pytest.raises(ApsatError, match="does not match its accelerator"):
        Target("systolic", 16, 16, accel=PRESETS["32x32"])
    with pytest.raises(ApsatError, match="needs rows and cols"):
        Target("systolic")


def _toml(tmp_path, text, name="edge.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_toml_file_gives_an_accelerator(tmp_path):
    p = _toml(tmp_path, 'rows = 16\ncols = 8\ndataflow = "ws"\nifmap_kb = 8\nfilter_kb = 4\n'
                        'ofmap_kb = 2\ndram_bandwidth = 4.5\nvector_lanes = 16\n')
    acc = load_accelerator(p)
    assert acc == Accelerator(16, 8, "ws", 8, 4, 2, 4.5, 16, "edge")
    for form in (str(p), f"systolic:{p}", p):
        t = parse_target(form)
        assert (t.kind, t.rows, t.cols, t.accel, t.name) == ("systolic", 16, 8, acc, "systolic:edge")


def test_toml_defaults_and_unlimited_bandwidth(tmp_path):
    acc = load_accelerator(_toml(tmp_path, 'rows = 8\ncols = 4\nname = "tiny"\ndram_bandwidth = inf\n'))
    assert (acc.name, acc.dataflow, acc.ifmap_kb, acc.vector_lanes) == ("tiny", "os", 64, 4)
    assert math.isinf(acc.dram_bandwidth)


@pytest.mark.parametrize("text, message", [
    ("rows = 0\ncols = 4\n", "rows must be a positive integer, got 0"),
    ("rows = 4\ncols = -2\n", "cols must be a positive integer, got -2"),
    ('rows = "32"\ncols = 4\n', "rows must be a positive integer, got '32'"),
    ('rows = 4\ncols = 4\ndataflow = "rs"\n', "unknown dataflow 'rs' (use os, ws, is or flex)"),
    ("rows = 64\ncols = 64\nfilter_kb = 2\n",
     "the filter scratchpad (2 kB = 2048 words) cannot hold one 64x64 tile (4096 words)"),
    ("rows = 4\ncols = 4\ndram_bandwidth = 0\n", "dram_bandwidth must be a positive number"),
    ("rows = 4\ncols = 4\ndram_bandwidth = -1.5\n", "dram_bandwidth must be a positive number"),
    ("rows = 4\ncols = 4\nifmap_kb = 0\n", "ifmap_kb must be a positive integer (kB), got 0"),
    ("rows = 4\ncols = 4\nsram_kb = 64\n", "unknown key(s) sram_kb"),
    ("rows = 4\n", "missing key(s) cols"),
    ("rows = 4\ncols = \n", "not valid TOML"),
])
def test_toml_refusals_name_the_problem_on_one_line(tmp_path, text, message):
    p = _toml(tmp_path, text, "bad.toml")
    with pytest.raises(ApsatError) as e:
        parse_target(str(p))
    msg = str(e.value)
    assert message in msg and msg.startswith(str(p)) and "\n" not in msg


def test_unreadable_toml_file(tmp_path):
    with pytest.raises(ApsatError, match="cannot read accelerator file"):
        parse_target(f"systolic:{tmp_path / 'absent.toml'}")
    (tmp_path / "dir.toml").mkdir()
    with pytest.raises(ApsatError, match="cannot read accelerator file"):
        load_accelerator(tmp_path / "dir.toml")


@pytest.mark.parametrize("name, message", [
    ("systolic:0x4", "at least one row and one column"),
    ("systolic:4x0", "at least one row and one column"),
    ("systolic:big", "unknown target"),
    ("tpu", "unknown target"),
    (42, "unknown target"),
])
def test_bad_target_names(name, message):
    with pytest.raises(ApsatError, match=message):
        parse_target(name)


@pytest.mark.parametrize("kw, message", [
    (dict(rows=0, cols=4), "rows must be a positive integer"),
    (dict(rows=4, cols=4, dataflow="is-not"), "unknown dataflow"),
    (dict(rows=32, cols=32, ifmap_kb=1, filter_kb=1, ofmap_kb=1), None),     # exactly one tile
    (dict(rows=33, cols=32, ifmap_kb=1, filter_kb=1, ofmap_kb=1), "cannot hold one 33x32 tile"),
    (dict(rows=4, cols=4, vector_lanes=0), "vector_lanes must be a positive integer"),
    (dict(rows=4, cols=4, dram_bandwidth=math.nan), "dram_bandwidth must be a positive number"),
    (dict(rows=4, cols=4, flex_slack=-0.1), "flex_slack must be a number from 0 to 1"),
    (dict(rows=4, cols=4, flex_slack="0.1"), "flex_slack must be a number from 0 to 1"),
])
def test_accelerator_validation(kw, message):
    if message is None:
        Accelerator(**kw)
        return
    with pytest.raises(ApsatError, match=message):
        Accelerator(**kw)


def test_egraph_reads_the_accelerator_size_from_a_toml_target(tmp_path):
    from apsat.explore.egraph import EGraph

    p = _toml(tmp_path, "rows = 16\ncols = 8\n")
    eg = EGraph(target=f"systolic:{p}")
    assert (eg.target.rows, eg.target.cols, eg.target.name) == (16, 8, "systolic:edge")
