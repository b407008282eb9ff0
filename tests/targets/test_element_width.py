"""Element widths on the systolic accelerator (operand_bytes, accumulator_bytes): parsed
and validated, no figure changed at the default one byte, and at two bytes the
scratchpads hold half the words, so reuse shrinks and DRAM words and bytes grow."""
import dataclasses
import math

import numpy as np
import pytest

from apsat.errors import ApsatError
from apsat.targets.accelerator import PRESETS, Accelerator, load_accelerator
from apsat.targets.systolic import dram_cycles, gemm_cost

DATAFLOWS = ("os", "ws", "is")


def _products(seed=7, count=40):
    """Seeded (m, k, n) products from one row up to several folds and scratchpads."""
    rng = np.random.default_rng(seed)
    return [tuple(int(x) for x in rng.integers(1, hi)) for hi in ((4000, 3000, 600),) * count]


def _wide(acc, operand=2, accumulator=None):
    return dataclasses.replace(acc, operand_bytes=operand, accumulator_bytes=accumulator)


def test_defaults_are_one_byte_words():
    for acc in PRESETS.values():
        assert (acc.operand_bytes, acc.accumulator_width) == (1, 1)
    a = Accelerator(4, 4)
    assert (a.operand_bytes, a.accumulator_bytes, a.accumulator_width) == (1, None, 1)
    # None follows the operand width, also through dataclasses.replace
    wide = dataclasses.replace(PRESETS["32x32"], operand_bytes=2)
    assert (wide.accumulator_width, wide.ofmap_words) == (2, 32768)
    assert PRESETS["32x32"].ifmap_words == 65536


@pytest.mark.parametrize("kw, message", [
    (dict(operand_bytes=3), r"operand_bytes must be one of 1, 2, 4, 8 \(bytes an element\), got 3"),
    (dict(operand_bytes=0), "operand_bytes must be one of"),
    (dict(operand_bytes=True), "operand_bytes must be one of"),
    (dict(operand_bytes=2.0), "operand_bytes must be one of"),
    (dict(accumulator_bytes=16), "accumulator_bytes must be one of"),
    (dict(operand_bytes=4, accumulator_bytes=2), r"accumulator_bytes \(2\) must be at least operand_bytes \(4\)"),
    (dict(rows=32, cols=32, ifmap_kb=1, operand_bytes=2),
     r"the ifmap scratchpad \(1 kB = 512 words\) cannot hold one 32x32 tile"),
    (dict(rows=32, cols=32, ofmap_kb=1, accumulator_bytes=4),
     r"the ofmap scratchpad \(1 kB = 256 words\) cannot hold one 32x32 tile"),
])
def test_widths_are_validated(kw, message):
    kw = {"rows": 4, "cols": 4, **kw}
    with pytest.raises(ApsatError, match=message) as e:
        Accelerator(**kw)
    assert "\n" not in str(e.value)


def test_toml_widths(tmp_path):
    p = tmp_path / "half.toml"
    p.write_text("rows = 32\ncols = 32\noperand_bytes = 2\n")
    acc = load_accelerator(p)
    assert (acc.operand_bytes, acc.accumulator_width, acc.ifmap_words, acc.ofmap_words) == (2, 2, 32768, 32768)
    p.write_text("rows = 32\ncols = 32\naccumulator_bytes = 4\n")
    acc = load_accelerator(p)
    assert (acc.operand_bytes, acc.accumulator_width, acc.ifmap_words, acc.ofmap_words) == (1, 4, 65536, 16384)
    p.write_text('rows = 32\ncols = 32\noperand_bytes = "2"\n')
    with pytest.raises(ApsatError, match=r"half.toml: .*operand_bytes must be one of"):
        load_accelerator(p)


@pytest.mark.parametrize("df", DATAFLOWS)
def test_one_byte_bytes_are_words(df):
    acc = dataclasses.replace(PRESETS["32x32"], dataflow=df)
    for m, k, n in _products():
        c = gemm_cost(acc, m, k, n)
        assert c.dram_bytes == c.dram_words


@pytest.mark.parametrize("df", DATAFLOWS)
@pytest.mark.parametrize("bw", [math.inf, 64.0, 8.0])
def test_two_bytes_move_more_and_never_run_faster(df, bw):
    one = dataclasses.replace(PRESETS["32x32"], dataflow=df, dram_bandwidth=bw)
    two = _wide(one)
    grew = 0
    for m, k, n in _products():
        c1, c2 = gemm_cost(one, m, k, n), gemm_cost(two, m, k, n)
        assert c2.compute_cycles == c1.compute_cycles            # the array does not see widths
        assert c2.dram_words >= c1.dram_words and c2.dram_bytes == 2 * c2.dram_words
        assert c2.total_cycles >= c1.total_cycles
        grew += c2.dram_words > c1.dram_words
    assert grew > 0                                               # reuse shrank somewhere


def test_a_column_block_that_no_longer_fits_is_re_read_per_row_fold():
    # os: B's 700 x 32 column block fits a filter half of 32768 one-byte words, not of 16384
    one, m, k, n = PRESETS["32x32"], 2000, 700, 64
    c1, c2 = gemm_cost(one, m, k, n, "os"), gemm_cost(_wide(one), m, k, n, "os")
    assert c1.filter_reads == k * n
    assert c2.filter_reads == k * n * math.ceil(m / 32)
    assert (c2.ifmap_reads, c2.ofmap_writes) == (c1.ifmap_reads, c1.ofmap_writes)


def test_partial_sums_drain_at_accumulator_width():
    acc = _wide(dataclasses.replace(PRESETS["32x32"], dram_bandwidth=math.inf), 1, 4)
    m, k, n = 300, 200, 100                                       # 7 row folds under ws and is
    for df in ("ws", "is"):
        c = gemm_cost(acc, m, k, n, df)
        assert c.row_folds == 7 and c.ofmap_writes == m * n * 7
        assert c.dram_bytes == c.ifmap_reads + c.filter_reads + 4 * c.ofmap_writes
    c = gemm_cost(acc, m, k, n, "os")                             # os writes finished outputs
    assert c.dram_bytes == c.dram_words
    one_fold = gemm_cost(acc, m, 32, n, "ws")
    assert one_fold.row_folds == 1 and one_fold.dram_bytes == one_fold.dram_words


def test_bandwidth_is_bytes_per_cycle():
    acc = Accelerator(4, 4, dram_bandwidth=64.0, operand_bytes=2, accumulator_bytes=4)
    assert dram_cycles(acc, 100) == math.ceil(200 / 64)
    assert dram_cycles(acc, 100, 4) == math.ceil(400 / 64)
    assert dram_cycles(PRESETS["32x32"], 100) == math.ceil(100 / 64)

