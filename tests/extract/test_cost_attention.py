"""How the systolic cost model prices the attention atom (apsat/extract/cost_systolic.py,
targets.systolic.attention_plan / attention_cycles): on chip when its scores fit, below
its unfused chain and close to the stream the backend runs for it; when they do not
fit, exactly what the model prices the chain at, which is then what the backend runs.
(The streams' own figures: tests/backends/systolic/test_stream_attention.py.)"""
from __future__ import annotations

import pytest
from attention_forms import forms

import apsat
from apsat.backends import systolic as sab
from apsat.explore.egraph import EGraph
from apsat.extract import extract
from apsat.extract.cost_systolic import SystolicCycles
from apsat.lang.syntax import parse_term
from apsat.targets.accelerator import PRESETS, Accelerator
from apsat.targets.systolic import attention_heads, attention_plan

SMALL = Accelerator(8, 8, "os", 1, 1, 1, 16.0, 8, "test-os")      # 512-word scratchpad halves


def masked(heads, m, n, d, e, safe):
    """(atom, unfused chain, shapes): `heads` heads of q (1, heads, m, d), k (1, heads,
    n, d), vt (1, heads, e, n) and a mask (1, 1, m, n), as the importer writes the chain."""
    return forms((1, heads), (1, heads), m, n, d, e, safe, bias=True)


def priced(text, shapes, acc) -> tuple[float, int]:
    """(the extracted program's systolic cost, its stream's cycles) on `acc`."""
    eg = EGraph()
    program = extract(eg, eg.add(parse_term(text), shapes), cost=SystolicCycles(acc))
    return program.cost, sab.cycles(sab.compile(apsat.parse(text, shapes), acc))["total_cycles"]


def test_the_fit_rule():
    acc = PRESETS["32x32"]                     # 32768-word halves
    plan = attention_plan(acc, 128, 64, 128, 64, False)
    assert (plan.rows, plan.width, plan.resident) == (128, 1, True)
    # SAFE: a row is 3 x 128 score words and 64 outputs: 73 rows fit, cut to whole row folds
    assert attention_plan(acc, 128, 64, 128, 64, True).rows == 64
    # a row of 900 SAFE words cannot fit a 512-word half: the scores spill
    assert attention_plan(SMALL, 6, 5, 300, 4, True).rows == 0
    # 3 blocks re-reading K and V (2 x 70 x 29 words more) would move more than the
    # scores' round trip (4 x 5 x 70)
    plan = attention_plan(SMALL, 5, 17, 70, 12, True)
    assert plan.rows == 0 and "re-read" in plan.reason
    assert attention_plan(SMALL, 5, 17, 70, 12, False).rows == 5


def test_grouped_query_heads_are_one_heads_rows():
    # (1, 2 kv heads, 3 query groups, m, n): K and V vary along the kv heads only
    assert attention_heads((1, 2, 3, 13, 11), (1, 2, 1, 1, 11), (1, 2, 1, 1, 5)) == (2, 39, (2,))
    assert attention_heads((1, 4, 13, 11), (1, 4, 1, 11), (1, 4, 1, 5)) == (4, 13, ())


@pytest.mark.parametrize("safe", (0, 1))
def test_the_atom_is_priced_below_its_chain_and_near_its_stream(safe):
    atom, chain, shapes = masked(4, 128, 128, 64, 64, safe)
    acc = PRESETS["32x32"]
    (atom_cost, atom_cycles), (chain_cost, chain_cycles) = priced(atom, shapes, acc), priced(chain, shapes, acc)
    assert atom_cost < chain_cost / 1.5
    # both within 10% of what the backend runs (the chain's batched products on the array,
    # as grouped.py runs them)
    assert abs(atom_cost - atom_cycles) <= 0.1 * atom_cycles
    assert abs(chain_cost - chain_cycles) <= 0.1 * chain_cycles


@pytest.mark.parametrize("safe", (0, 1))
def test_spilled_scores_cost_what_the_chain_costs(safe):
    atom, chain, shapes = masked(2, 6, 300, 5, 4, safe)
    (atom_cost, atom_cycles), (chain_cost, chain_cycles) = priced(atom, shapes, SMALL), priced(chain, shapes, SMALL)
    assert atom_cost == chain_cost and atom_cycles == chain_cycles
