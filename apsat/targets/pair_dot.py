"""Where independent small products run on a systolic accelerator, and what they cost:
the groups of a grouped or depthwise convolution (apsat/targets/pair_product.py reads them
out of a dot-product over an access-pair) go one after another on the array, several
depthwise filters at a time on the array, or on the vector unit. The extractor's systolic
cost model and the backend (apsat/backends/systolic/grouped.py) both call pair_dot_cost,
so they choose alike; the per-product figures are targets.systolic's."""
from __future__ import annotations

from dataclasses import dataclass

from apsat.targets.systolic import Accelerator, gemm_cost, vector_cycles

VECTOR_OPS_PER_MAC = 3     # a dot-product on the vector unit: read, multiply, add


@dataclass(frozen=True)
class PairDotCost:
    """Where `groups` independent (m x k) . (k x n) products run (a grouped or depthwise
    convolution, see apsat/targets/pair_product.py) and what they cost: on the array one
    product after the other (`array_cycles`, stalls included); on the array `batch`
    products at a time (`batched_cycles`; only for n = 1, a depthwise convolution: the
    batch's weights as a block-diagonal (batch x batch*k) matrix times its windows as a
    (batch*k x m) one, so `batch` filters fill the array's rows instead of one; 0 when
    not possible); or on the vector unit as row dot-products (`vector_cycles`: a multiply
    and an add per MAC plus the operand read, 3 operations; DRAM not included). `unit`
    ("array", "batched" or "vector") is the cheapest; the cost model and the backend both
    call this, so they choose alike."""

    unit: str
    array_cycles: int
    vector_cycles: int
    batched_cycles: int = 0
    batch: int = 1

    @property
    def cycles(self) -> int:
        """The chosen unit's cycles."""
        return {"array": self.array_cycles, "batched": self.batched_cycles}.get(self.unit, self.vector_cycles)


def batched_pair_cycles(acc: Accelerator, groups: int, m: int, k: int, batch: int) -> int:
    """Cycles of `groups` (m x k) . (k x 1) products run `batch` at a time as
    (batch x batch*k) . (batch*k x m) products (the last batch may be smaller)."""
    full, rest = divmod(groups, batch)
    cycles = full * gemm_cost(acc, batch, batch * k, m).total_cycles
    return cycles + (gemm_cost(acc, rest, rest * k, m).total_cycles if rest else 0)


def pair_dot_cost(acc: Accelerator, groups: int, m: int, k: int, n: int) -> PairDotCost:
    """Array, batched array or vector unit for `groups` products of (m x k) . (k x n)
    (see PairDotCost; ties go to the earlier of array, batched, vector)."""
    array = groups * gemm_cost(acc, m, k, n).total_cycles
    macs = groups * m * k * n
    vector = vector_cycles(acc, macs, VECTOR_OPS_PER_MAC)
    batch = min(groups, acc.rows)
    batched = batched_pair_cycles(acc, groups, m, k, batch) if n == 1 and batch > 1 else 0
    options = [("array", array)] + ([("batched", batched)] if batched else []) + [("vector", vector)]
    unit = min(options, key=lambda o: o[1])[0]
    return PairDotCost(unit, array, vector, batched, batch if batched else 1)
