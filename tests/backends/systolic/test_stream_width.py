"""Element widths in the stream: at two bytes the scratchpads hold half the words, the
lowering tiles to match, the report's DRAM bytes follow the widths, and the simulator's
results still equal the reference interpreter's (float32 at every width, RTOL/ATOL of
sa_helpers: a width is storage, not a number format)."""
import dataclasses
import math

import pytest
from sa_helpers import DATAFLOWS, assert_close, conv_text, run_both, small_acc, tensors_for

import apsat
from apsat.backends import systolic as sab
from apsat.lang.evaluate import evaluate
from apsat.targets.accelerator import PRESETS
from apsat.targets.systolic import gemm_cost


def _wide(acc, operand=2, accumulator=None):
    return dataclasses.replace(acc, operand_bytes=operand, accumulator_bytes=accumulator)


def _gemm(m, k, n):
    return apsat.parse(f"(systolic-array {k} {n} (access (access-tensor a) 1) (access-tensor b))",
                       {"a": (m, k), "b": (k, n)})


def _slot_ends(stream):
    ends = {}
    for ins in stream.main:
        if isinstance(ins, sab.Load):
            ends[ins.dst.sp] = max(ends.get(ins.dst.sp, 0), ins.dst.offset + ins.dst.words)
    return ends


@pytest.mark.parametrize("df", DATAFLOWS + ("flex",))
def test_two_byte_conv_equals_the_reference_and_moves_more(df):
    text, shapes = conv_text(6, 3, 3, 20, pad=1), {"x": (1, 6, 14, 14), "w": (20, 6, 3, 3)}
    one = small_acc(df, kb=2, bw=8.0)
    two = _wide(one)
    s1, got1, want = run_both(text, shapes, one, seed=3, weights={"w"})
    s2, got2, want2 = run_both(text, shapes, two, seed=3, weights={"w"})
    assert_close(got1, want)
    assert_close(got2, want2)
    r1, r2 = sab.cycles(s1), sab.cycles(s2)
    assert r1["dram"]["bytes"] == r1["dram"]["total"]
    assert r2["dram"]["bytes"] == 2 * r2["dram"]["total"]
    assert r2["dram"]["total"] >= r1["dram"]["total"] and r2["dram"]["bytes"] > r1["dram"]["bytes"]
    # every block fits the narrower scratchpads, which are half as many words
    assert all(end <= getattr(two, f"{sp}_words") for sp, end in _slot_ends(s2).items())
    assert two.ifmap_words == one.ifmap_words // 2


@pytest.mark.parametrize("df", DATAFLOWS)
def test_two_byte_gemm_moves_the_words_gemm_cost_counts(df):
    # as test_stream_cycles' one-byte check, on scratchpads of half the words
    acc = _wide(dataclasses.replace(PRESETS["32x32"], dataflow=df))
    m, k, n = 500, 300, 200
    stream = sab.compile(_gemm(m, k, n), acc, weights={"b"})
    rep, gc = sab.cycles(stream), gemm_cost(acc, m, k, n)
    assert rep["dram"]["writes"] == gc.ofmap_writes
    assert gc.ifmap_reads + gc.filter_reads >= rep["dram"]["reads"]
    assert rep["dram"]["bytes"] == 2 * rep["dram"]["total"]
    one = sab.cycles(sab.compile(_gemm(m, k, n), PRESETS["32x32"] if df == "os" else
                                 dataclasses.replace(PRESETS["32x32"], dataflow=df), weights={"b"}))
    assert rep["dram"]["total"] >= one["dram"]["total"]


def test_partial_sums_move_accumulators():
    # ws over k = 40 on an 8x8 array: 5 row folds, partial sums drained to DRAM at 4 bytes
    acc = dataclasses.replace(small_acc("ws", kb=4, bw=8.0), accumulator_bytes=4)
    m, k, n = 30, 40, 12
    prog = _gemm(m, k, n)
    t = tensors_for(prog, seed=5)
    stream = sab.compile(prog, acc, weights={"b"})
    assert_close(sab.simulate(stream, t)["out"], evaluate(prog, t))
    rep = sab.cycles(stream)
    assert rep["dram"]["writes"] == m * n * math.ceil(k / 8)
    assert rep["dram"]["bytes"] == rep["dram"]["reads"] + 4 * rep["dram"]["writes"]
    # and the stores take four times a one-byte store's DMA time
    plain = sab.cycles(sab.compile(prog, dataclasses.replace(acc, accumulator_bytes=1), weights={"b"}))
    assert plain["busy"]["dma.ofmap"] < rep["busy"]["dma.ofmap"]


def test_widths_survive_the_text_form():
    stream = sab.compile(_gemm(40, 30, 20), _wide(small_acc("os", kb=2), 2, 4), weights={"b"})
    back = sab.parse(sab.to_text(stream))
    assert (back.accel.operand_bytes, back.accel.accumulator_bytes) == (2, 4)
    old = sab.to_text(stream).replace(" operand_bytes=2 accumulator_bytes=4", "")
    assert (sab.parse(old).accel.operand_bytes, sab.parse(old).accel.accumulator_width) == (1, 1)
    plain = sab.compile(_gemm(40, 30, 20), _wide(small_acc("os", kb=2)), weights={"b"})
    assert sab.parse(sab.to_text(plain)).accel == plain.accel        # None stays None
