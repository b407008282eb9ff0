"""osk, the flexible array's fourth loop order (targets.systolic.os_blocking): os with B
read once per column fold (its column block in the whole filter scratchpad) or once per
output block (chunk by chunk, the block's row folds accumulating in the ofmap), where os
re-reads B for every row fold. The cost model's figures, the flexible array's choice, the
stream against the reference interpreter and against the model. Tolerances: sa_helpers
(float32, sums re-ordered)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from sa_helpers import assert_close, conv_text, run_both, small_acc

import apsat
from apsat.backends import systolic as sab
from apsat.errors import ApsatError
from apsat.targets.accelerator import PRESETS
from apsat.targets.systolic import fused_gemm_cost, gemm_cost, os_blocking

FLEX32 = dataclasses.replace(PRESETS["32x32"], dataflow="flex")
PLAIN = ("(fused-dot-bias (access (access-tensor a) 1) (access (access-tensor w) 1) "
         "(access (access-tensor bias) 1))")
RELU = PLAIN.replace("(fused-dot-bias ", "(fused-dot-bias-act relu ")
ADD_RELU = f"(compute (chain elementwise-add relu) (access-pair {PLAIN} (access (access-tensor r) 2)))"


def test_osk_is_offered_only_where_os_rereads_b():
    # 576 x 32 fits a 32 K-word filter half: os reads B once, osk would be os
    assert os_blocking(FLEX32, 3136, 576, 64) is None
    with pytest.raises(ApsatError, match="osk needs B's column block"):
        gemm_cost(FLEX32, 3136, 576, 64, "osk")
    assert fused_gemm_cost(FLEX32, 3136, 576, 64, 1)[0].dataflow != "osk"


def test_a_column_block_in_the_whole_filter_scratchpad():
    # VGG-19's conv2_2: B's 1152 x 32 column block fits the 64 K-word filter scratchpad,
    # not a half: os re-reads B for each of 392 row folds, osk once per column fold,
    # with os's passes, waiting for each column block but the first (576 cycles)
    os_, osk = (gemm_cost(FLEX32, 12544, 1152, 128, df) for df in ("os", "osk"))
    assert os_blocking(FLEX32, 12544, 1152, 128) == 1152
    assert osk.compute_cycles == os_.compute_cycles
    assert osk.filter_reads == 1152 * 128 and os_.filter_reads == 1152 * 128 * 392
    assert osk.total_cycles == os_.total_cycles + 3 * 576
    assert osk.ifmap_reads == os_.ifmap_reads and osk.ofmap_writes == os_.ofmap_writes


def test_chunks_of_b_reused_across_an_output_block():
    # VGG-19's conv3_x: 2304 x 32 fits neither; three chunks of at most 1024 rows (a
    # filter half / 32) pass through the 32 row folds of a 1024-row block, each chunk's
    # pass paying the fill
    m, k, n = 3136, 2304, 256
    os_, osk = (gemm_cost(FLEX32, m, k, n, df) for df in ("os", "osk"))
    assert os_blocking(FLEX32, m, k, n) == 1024
    assert osk.compute_cycles == 98 * 8 * (k + 3 * 62) - 1
    assert osk.filter_reads == k * n * 4 and os_.filter_reads == k * n * 98
    assert osk.dram_words < 0.55 * os_.dram_words
    # 5 % more cycles than os, within FLEX_CYCLE_SLACK of the fastest: the fewer words win
    assert fused_gemm_cost(FLEX32, m, k, n, 1)[0].dataflow == "osk"


@pytest.mark.parametrize("m,k,n", [(12544, 1152, 128), (3136, 2304, 256), (196, 4608, 512)])
def test_an_osk_stream_takes_the_model_s_cycles_and_words(m, k, n):
    prog = apsat.parse(ADD_RELU, {"a": (m, k), "w": (n, k), "bias": (n,), "r": (m, n)})
    rep = sab.cycles(sab.compile(prog, FLEX32, weights=["w", "bias"], fuse_zips=True))
    (g,) = [g for g in rep["groups"] if g["kind"] == "gemm"]
    model = gemm_cost(FLEX32, m, k, n, "osk")
    assert g["dataflow"] == "osk"
    # the array never waits (whole-scratchpad column blocks: it waits for the next block
    # as the model does, the stream less: each loads behind the last pass reading its words)
    assert model.compute_cycles < g["array_span"] <= model.total_cycles + 1
    # the model's words and the residual's m x n read into the output blocks (the
    # stream's blocks hold a bias row, so a few more blocks may re-read B's chunks)
    words = g["dram_reads"] + g["dram_writes"]
    assert model.dram_words + m * n <= words <= 1.02 * (model.dram_words + m * n)


@pytest.mark.parametrize("kb,m,k,n", [(1, 300, 100, 12), (2, 600, 300, 24)],
                         ids=["whole-column-block", "chunks"])
@pytest.mark.parametrize("text", [PLAIN, RELU, ADD_RELU], ids=["bias", "relu", "residual"])
def test_osk_streams_match_the_reference(kb, m, k, n, text):
    shapes = {"a": (m, k), "w": (n, k), "bias": (n,), "r": (m, n)}
    acc = small_acc("flex", kb=kb)
    stream, got, want = run_both(text, shapes, acc, fuse_zips=True)
    # sums of up to 300 products of N(0, 1) values (magnitudes to 40), added in chunks:
    # float32 re-ordering reaches 1.2e-5 absolute, above sa_helpers' 1e-5
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    assert {g.dataflow for g in stream.groups.values() if g.kind == "gemm"} == {"osk"}
    assert sab.parse(sab.to_text(stream)).main == stream.main


def test_an_osk_convolution_gathers_its_windows():
    # a 3x3 convolution over 16 channels: k = 144 on an 8x8 array with 2 kB scratchpads
    text = conv_text(16, 3, 3, 24)
    stream, got, want = run_both(text, {"x": (1, 16, 30, 30), "w": (24, 16, 3, 3)},
                                 small_acc("flex", kb=2), im2col="gather")
    assert_close(got, want)
    assert {g.dataflow for g in stream.groups.values() if g.kind == "gemm"} == {"osk"}
