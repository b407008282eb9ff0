"""The attention atom on the systolic accelerator (apsat/backends/systolic/attention.py):
the simulated stream equals the reference interpreter on seeded random inputs, on every
dataflow, at sizes that are not multiples of the 8 x 8 test array: with and without a
bias, a causal -inf mask with one fully masked query row under SAFE 1, grouped-query
heads whose K and V are broadcast over the query groups, 2 and more heads, several
blocks of query rows with K and V streamed; the scores stay in the ofmap and move less
DRAM traffic than the unfused chain; where they do not fit, the atom lowers exactly as
its unfused chain does.

Tolerances: rtol 1e-5 / atol 1e-5 (sa_helpers): the products are summed fold by fold in
float32, in another order than the reference's one einsum, a few ulps apart; the
softmax and select are the reference's own semantics on those scores. A fully masked
row under SAFE is exactly 0, and no NaN is produced anywhere.
"""
from __future__ import annotations

import numpy as np
import pytest
from attention_forms import forms
from sa_helpers import DATAFLOWS, assert_close, small_acc

import apsat
from apsat.backends import systolic as sab
from apsat.backends.systolic import Host, Load, Matmul, Store, Vec
from apsat.lang.evaluate import evaluate
from apsat.targets.accelerator import PRESETS
from apsat.targets.systolic import attention_plan


def inputs(shapes: dict, causal: bool, seed: int = 0) -> dict:
    """Seeded normal q, k, vt; the mask causal (-inf above the diagonal, query row 0
    fully masked) or finite normal."""
    rng = np.random.default_rng(seed)
    out = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    if causal and "mask" in shapes:
        m, n = shapes["mask"][-2:]
        mask = np.where(np.arange(n)[None, :] > np.arange(m)[:, None], -np.inf, 0.0).astype(np.float32)
        mask[0] = -np.inf
        out["mask"] = mask.reshape(shapes["mask"])
    return out


def run(text, shapes, acc, causal=False):
    prog = apsat.parse(text, shapes)
    x = inputs(shapes, causal)
    stream = sab.compile(prog, acc)
    return stream, sab.simulate(stream, x)["out"], evaluate(prog, x)


# (lead, kv_lead, safe, bias, causal): 13 queries, 11 keys of width 6, values of width 5
CASES = {
    "plain": ((1, 2), (1, 2), 0, 0, False),
    "bias": ((1, 2), (1, 2), 0, 1, False),
    "causal-safe": ((1, 3), (1, 3), 1, 1, True),
    "safe-no-bias": ((2, 2), (2, 2), 1, 0, False),
    "grouped-query": ((1, 2, 3), (1, 2, 1), 1, 1, True),     # 2 K/V heads, 3 query heads each
}


@pytest.mark.parametrize("df", DATAFLOWS + ("flex",))
@pytest.mark.parametrize("case", sorted(CASES))
def test_on_chip_equals_the_reference(df, case):
    lead, kv_lead, safe, bias, causal = CASES[case]
    atom, _, shapes = forms(lead, kv_lead, 13, 11, 6, 5, safe, bias)
    stream, got, want = run(atom, shapes, small_acc(df), causal)
    assert [g.kind for g in stream.groups.values()] == ["attention"]
    assert not any(isinstance(i, Host) for i in stream.main)
    assert_close(got, want)
    if causal:                      # the fully masked query row: 0, not NaN
        assert not np.isnan(got).any() and not np.any(got[..., 0, :])


def test_grouped_query_heads_load_k_and_v_once_per_kv_head():
    atom, _, shapes = forms((1, 2, 3), (1, 2, 1), 13, 11, 6, 5, 0, 0)
    stream, got, want = run(atom, shapes, small_acc("os"))
    assert_close(got, want)
    (g,) = stream.groups.values()
    assert g.m == 3 * 13                 # the 3 query heads are one head's rows
    k, vt = (sab.cycles(stream)["dram"]["per_tensor"][stream_buffer(stream, name)]["reads"] for name in ("k", "vt"))
    assert (k, vt) == (2 * 11 * 6, 2 * 5 * 11)


def stream_buffer(stream, tensor: str) -> str:
    return next(b.name for b in stream.buffers.values() if b.tensor == tensor)


@pytest.mark.parametrize("safe", (0, 1))
def test_blocks_of_query_rows_with_k_and_v_streamed(safe):
    # 21 queries over 40 keys: a block is 8 (SAFE: 4) rows, K^T and V (640 words) do not
    # fit a filter half together, so they stream per block
    atom, _, shapes = forms((1, 2), (1, 2), 21, 40, 9, 7, safe, 1)
    acc = small_acc("os")
    plan = attention_plan(acc, 21, 9, 40, 7, bool(safe))
    assert (plan.rows, plan.resident) == ((4, False) if safe else (8, False))
    stream, got, want = run(atom, shapes, acc, causal=bool(safe))
    assert [g.kind for g in stream.groups.values()] == ["attention"]
    assert_close(got, want)
    softmaxes = [i for i in stream.main if isinstance(i, Vec) and i.op == "softmax"]
    assert len(softmaxes) == 2 * -(-21 // plan.rows)


def test_scores_stay_in_the_ofmap_and_move_less_dram_than_the_unfused_chain():
    # 4 heads of 128 x 128 scores, d = e = 64, a causal mask, SAFE, on the 32x32 preset:
    # fused 196,608 DRAM words (q, k, vt and the outputs once, the mask once a head),
    # the unfused chain 1,523,713 (the scores written and read back by each of the bias
    # add, softmax, is-nan, both concatenations, select and P.V)
    atom, chain, shapes = forms((1, 4), (1, 4), 128, 128, 64, 64, 1, 1)
    acc = PRESETS["32x32"]
    fused, unfused = (sab.cycles(sab.compile(apsat.parse(t, shapes), acc)) for t in (atom, chain))
    stream = sab.compile(apsat.parse(atom, shapes), acc)
    words = {name: int(np.prod(s)) for name, s in shapes.items()}
    assert fused["dram"]["reads"] == words["q"] + words["k"] + words["vt"] + 4 * words["mask"]
    assert fused["dram"]["writes"] == 4 * 128 * 64
    assert {i.dst for i in stream.main if isinstance(i, Store)} == {stream.views[stream.outputs["out"]].base}
    assert fused["dram"]["total"] == 196_608 and unfused["dram"]["total"] == 1_523_713
    assert fused["total_cycles"] < unfused["total_cycles"]
    # P is read by the array from the ofmap, where the softmax left it
    assert any(isinstance(i, Matmul) and i.a != "array" and i.a.slot.sp == "ofmap" for i in stream.main)


@pytest.mark.parametrize("safe", (0, 1))
def test_scores_that_do_not_fit_spill_like_the_unfused_chain(safe):
    # a row of 300 scores (900 words with SAFE's columns) exceeds half the 1 kB ofmap
    atom, chain, shapes = forms((1, 2), (1, 2), 6, 300, 5, 4, safe, 1)
    acc = small_acc("os")
    assert attention_plan(acc, 6, 5, 300, 4, bool(safe)).rows == 0
    stream, got, want = run(atom, shapes, acc, causal=bool(safe))
    assert_close(got, want)
    assert "attention" not in {g.kind for g in stream.groups.values()}
    assert all("attention spilled" in g.label for g in stream.groups.values())
    reference = sab.compile(apsat.parse(chain, shapes), acc)
    assert stream.counts() == reference.counts()
    mine, theirs = sab.cycles(stream), sab.cycles(reference)
    assert (mine["dram"]["reads"], mine["dram"]["writes"]) == (theirs["dram"]["reads"], theirs["dram"]["writes"])
    assert mine["total_cycles"] == theirs["total_cycles"]


def test_a_pair_that_is_not_a_product_per_head_falls_back_correctly():
    # both pair operands vary along the keys: not q . k^T, so the unfused expansion runs
    # (its scores as independent row dot-products)
    qk = ("(access-pair (access (access-tensor a) 2) (access (access-tensor b) 2))")
    v = ("(access-broadcast (access-reshape (access-tensor vt) (access-shape (shape 1 5 7) (shape))) "
         "(access-shape (shape 4 5) (shape 7)))")
    shapes = {"a": (4, 7, 3), "b": (4, 7, 3), "vt": (5, 7)}
    stream, got, want = run(f"(attention 0 {qk} (access-literal 0.5) {v})", shapes, small_acc("os"))
    assert_close(got, want)
    assert "attention" not in {g.kind for g in stream.groups.values()}


def test_the_stream_round_trips_through_text():
    atom, _, shapes = forms((1, 2, 3), (1, 2, 1), 13, 11, 6, 5, 1, 1)
    stream = sab.compile(apsat.parse(atom, shapes), small_acc("ws"))
    text = sab.to_text(stream)
    assert sab.to_text(sab.parse(text)) == text
    x = inputs(shapes, True)
    np.testing.assert_array_equal(sab.simulate(sab.parse(text), x)["out"], sab.simulate(stream, x)["out"])
    assert any(isinstance(i, Load) and i.dst.sp == "ofmap" for i in stream.main)     # the bias rows
