"""targets.vector_share: a flexible array's one-row products hand columns to the vector
unit. Where it is offered, the split it picks against every other split, and its figures
against the per-unit figures they are built from."""
from __future__ import annotations

import dataclasses
import math

import pytest

from apsat.targets.pair_dot import VECTOR_OPS_PER_MAC
from apsat.targets.accelerator import PRESETS
from apsat.targets.systolic import fused_gemm_cost
from apsat.targets.vector_share import _split, k_chunks, product_cycles, shared_vector_cycles, vector_share

FLEX32 = dataclasses.replace(PRESETS["32x32"], dataflow="flex")


@pytest.mark.parametrize("acc,m,k,n,why", [
    (PRESETS["32x32"], 1, 4096, 4096, "a fixed dataflow: SCALE-Sim's mapping"),
    (FLEX32, 2, 4096, 4096, "two rows"),
    (FLEX32, 1, 40000, 4096, "the row does not fit an ifmap half"),
    (FLEX32, 1, 4096, 32, "one column fold"),
])
def test_not_offered(acc, m, k, n, why):
    assert vector_share(acc, m, k, n, 1) is None, why
    assert product_cycles(acc, m, k, n, 1) == fused_gemm_cost(acc, m, k, n, 1)[1]


def test_vgg_fc6_gives_a_quarter_of_its_columns_to_the_vector_unit():
    # 25088 x 4096 at batch 1: the array does 32 MACs a cycle, the vector unit 32 / 3
    k, n = 25088, 4096
    s = vector_share(FLEX32, 1, k, n, 1)
    whole = fused_gemm_cost(FLEX32, 1, k, n, 1)[1]
    assert s.cols == 1024 and s.array.n == n - 1024 and s.array.dataflow == "os"
    assert s.array_cycles == fused_gemm_cost(FLEX32, 1, k, n - 1024, 1)[1]
    # two k-chunks of 12544 words a VEC, one column each; bias and relu over 1024 outputs;
    # the first chunk's load at 64 words a cycle
    dots = 2 * 1024 * math.ceil(12544 * VECTOR_OPS_PER_MAC / 32)
    assert s.vector_cycles == dots + 2 * math.ceil(1024 / 32) + 12544 // 64
    assert s.total_cycles == max(s.array_cycles, s.vector_cycles)
    assert whole / s.total_cycles == pytest.approx(4 / 3, rel=0.01)
    assert product_cycles(FLEX32, 1, k, n, 1) == s.total_cycles


@pytest.mark.parametrize("k,n", [(4096, 1000), (9216, 4096), (1024, 1000), (544, 1000)])
def test_the_split_is_the_best_of_all_splits(k, n):
    s = vector_share(FLEX32, 1, k, n, 1)
    every = [_split(FLEX32, 1, k, n, 1, f) for f in range(1, -(-n // 32))]
    assert s.total_cycles == min(x.total_cycles for x in every)


def test_k_chunks_are_near_equal_and_cover_the_row():
    assert k_chunks(100, 100) == [(0, 100)]
    chunks = k_chunks(25088, 16384)
    assert chunks == [(0, 12544), (12544, 25088)]
    # ten rows of 100 words fit one slot: one VEC, its load (1000 words) first, the bias
    assert shared_vector_cycles(FLEX32, 1, 100, 10, 0) == (
        math.ceil(1000 / 64) + math.ceil(1000 * VECTOR_OPS_PER_MAC / 32) + 1)


@pytest.mark.parametrize("acc", [FLEX32, PRESETS["32x32"]], ids=["flex", "os"])
def test_the_extractor_prices_a_one_row_product_as_the_backend_splits_it(acc):
    import apsat
    from apsat.explore.egraph import EGraph
    from apsat.extract import extract

    text = ("(fused-dot-bias-act relu (access (access-tensor a) 1) (access (access-tensor w) 1) "
            "(access (access-tensor bias) 1))")
    prog = apsat.parse(text, {"a": (1, 4096), "w": (1000, 4096), "bias": (1000,)})
    eg = EGraph(target=acc)
    handles = eg.add_outputs(prog)
    best = extract(eg, handles)
    assert best.cost == product_cycles(acc, 1, 4096, 1000, 1)
    assert (best.cost < fused_gemm_cost(acc, 1, 4096, 1000, 1)[1]) == (acc is FLEX32)
