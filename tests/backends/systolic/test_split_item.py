"""The systolic lowering's expansions (split_item.py). Whole-item operators whose item does
not fit a scratchpad half (PoolFormer's GroupNorm(1) over C x H x W) run in two levels on the vector unit (split_item.py): no HOST step, and the
simulator equals the reference interpreter (rtol 1e-5, atol 1e-5: the blocked sums add in
another order). A small accelerator (1024-word scratchpads, 512 words a half) makes an item
of a few thousand values too big, and one of 600 x 600 values needs a split of the split."""
from __future__ import annotations

import numpy as np
import pytest
from sa_helpers import ATOL, RTOL, run_both, small_acc

from apsat.backends import systolic as sab
from apsat.backends.systolic.split_item import SPLITTABLE, chunk

OPS = {"reduce-sum": "reduce-sum", "reduce-max": "reduce-max", "reduce-mean": "reduce-mean",
       "softmax": "softmax", "layer-norm": "(layer-norm 1e-05)", "rms-norm": "(rms-norm 1e-06)"}


def test_every_splittable_operator_has_a_case():
    assert set(OPS) == SPLITTABLE


@pytest.mark.parametrize("dims", [(3, 40, 50), (1, 600, 600)])
@pytest.mark.parametrize("op", sorted(OPS))
def test_an_item_past_the_scratchpad_runs_in_two_levels(op, dims):
    acc = small_acc(kb=1)
    text = f"(compute {OPS[op]} (access (access-tensor x) 1))"
    stream, got, want = run_both(text, {"x": dims}, acc)
    assert not sab.cycles(stream)["host_steps"]
    assert any("split into chunks" in g.label for g in stream.groups.values())
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


def test_chunk_picks_the_largest_divisor_that_fits():
    assert chunk(100352, 8192) == 7168 and chunk(12, 4) == 4 and chunk(360000, 512) == 500
    assert chunk(131, 100) == 0          # a prime past the cap: no split helps (a HOST step)


def test_an_item_of_prime_size_stays_a_named_host_step():
    stream, got, want = run_both("(compute reduce-sum (access (access-tensor x) 1))", {"x": (2, 521)},
                                 small_acc(kb=1))
    reasons = [h["reason"] for h in sab.cycles(stream)["host_steps"]]
    assert reasons and "does not fit half of a scratchpad" in reasons[0]
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


def test_a_dot_product_left_off_the_array_is_mapped_onto_it():
    """A matrix product extraction did not map (Swin-V2's position-bias MLP over a (1, 15,
    15, 2) table: three iterated dims) runs as a systolic-array product, not a HOST step."""
    text = ("(compute dot-product (access-cartesian-product (access (access-tensor x) 3) "
            "(access (access-tensor w) 1)))")
    stream, got, want = run_both(text, {"x": (1, 15, 15, 2), "w": (40, 2)}, small_acc())
    assert not sab.cycles(stream)["host_steps"]
    assert any("mapped onto the array here" in g.label for g in stream.groups.values())
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
