"""A flexible array's products of one row hand columns to the vector unit.

A product with one row (a fully connected layer at batch 1: a matrix-vector product)
keeps one row of the array busy: every weight enters the array once, through its top
edge, `cols` words a cycle, so the array does `cols` MACs a cycle however the product is
folded (os, ws, is alike), while the vector unit idles. The vector unit can take some of
the product's columns as row dot-products (targets.pair_dot's rate: VECTOR_OPS_PER_MAC
operations a MAC on `vector_lanes` lanes) at the same time as the array runs the rest:
the two parts share only the input row, which the array part loads once anyway.

`vector_share` finds the split (the array's columns in whole column folds) that minimises
the slower of the two parts, and offers it where that beats the whole product on the
array. Only on a flexible array: a fixed-dataflow array runs SCALE-Sim's mapping, every
product wholly on the array, as the benchmark's baseline assumes. The extractor's cost
model (product_cycles) and the backend (apsat/backends/systolic/shared.py) both call it,
so they split alike.

The shared columns' operands: the input row is the array part's (held whole in an ifmap
half: m * k must fit one); the columns of B, read as rows of B transposed, stream
through the other ifmap half in two slots of `vector_slot` words (double buffered,
`vector_rows` rows of at most `vector_slot` words a VEC; a row longer than a slot in
near-equal k-chunks, accumulated); the results, with their bias, are a column of the
ofmap. Figures: the VECs' cycles as the backend's cycle model counts them, the bias add
and the epilogue (one operation an output each for bias and per epilogue operation),
and the first slot's load, which nothing hides.
"""
from __future__ import annotations

from dataclasses import dataclass

from apsat.targets.pair_dot import VECTOR_OPS_PER_MAC
from apsat.targets.systolic import FLEX, Accelerator, GemmCost, dram_cycles, fused_gemm_cost, vector_cycles


@dataclass(frozen=True)
class VectorShare:
    """An (m x k) . (k x n) product split by columns: the first n - cols on the array
    (`array`, in the dataflow fused_gemm_cost picks for them; `array_cycles` with their
    epilogue), the last `cols` on the vector unit (`vector_cycles`: dot-products, bias,
    epilogue and the first operand load). The two run at the same time."""

    cols: int
    array: GemmCost
    array_cycles: int
    vector_cycles: int

    @property
    def total_cycles(self) -> int:
        """The slower part's cycles."""
        return max(self.array_cycles, self.vector_cycles)


def vector_slot(acc: Accelerator) -> int:
    """Words of each of the two slots the shared columns' B rows stream through (half of
    an ifmap half)."""
    return acc.ifmap_words // 4


def k_chunks(k: int, slot: int) -> list[tuple[int, int]]:
    """[k0, k1) chunks of a row of `k` words through slots of `slot` words: one where it
    fits, else as few near-equal chunks as fit."""
    parts = -(-k // slot)
    return [(k * i // parts, k * (i + 1) // parts) for i in range(parts)]


def vector_rows(acc: Accelerator, k: int, cols: int) -> int:
    """Rows of B transposed (output columns) one VEC reads: as many whole rows as fit a
    slot, at least 1 (a longer row goes in k-chunks)."""
    return max(1, min(cols, vector_slot(acc) // k))


def shared_vector_cycles(acc: Accelerator, m: int, k: int, cols: int, epilogue_ops: float) -> int:
    """Vector-unit cycles of `cols` shared columns of a product with m rows and depth k:
    its VECs (rows of vector_rows per VEC, each k-chunk one VEC), the bias add and the
    epilogue over the m * cols outputs, plus the first slot's load."""
    rows = vector_rows(acc, k, cols)
    full, rest = divmod(cols, rows)
    chunks = k_chunks(k, vector_slot(acc))
    dots = 0
    for k0, k1 in chunks:
        per = m * (k1 - k0)
        dots += full * vector_cycles(acc, rows * per, VECTOR_OPS_PER_MAC)
        dots += vector_cycles(acc, rest * per, VECTOR_OPS_PER_MAC) if rest else 0
    first = dram_cycles(acc, rows * chunks[0][1])
    epilogue = vector_cycles(acc, m * cols, 1) + (vector_cycles(acc, m * cols, epilogue_ops) if epilogue_ops > 0 else 0)
    return first + dots + epilogue


def _split(acc: Accelerator, m: int, k: int, n: int, epilogue_ops: float, folds: int) -> VectorShare:
    """The split with `folds` column folds on the array."""
    na = folds * acc.cols
    cost, total = fused_gemm_cost(acc, m, k, na, epilogue_ops)
    return VectorShare(n - na, cost, total, shared_vector_cycles(acc, m, k, n - na, epilogue_ops))


def vector_share(acc: Accelerator, m: int, k: int, n: int, epilogue_ops: float) -> VectorShare | None:
    """The best split of an (m x k) . (k x n) product between the array and the vector
    unit, or None where none is faster than the whole product on the array or none is
    offered: only on a flexible array, for one row (m = 1) held whole in an ifmap half,
    with more than one column fold."""
    folds = -(-n // acc.cols)
    if acc.dataflow != FLEX or m != 1 or m * k > acc.ifmap_words // 2 or folds < 2:
        return None
    # The array part grows with its folds, the vector part shrinks: find where they cross.
    lo, hi = 1, folds - 1
    while lo < hi:
        mid = (lo + hi) // 2
        s = _split(acc, m, k, n, epilogue_ops, mid)
        if s.array_cycles >= s.vector_cycles:
            hi = mid
        else:
            lo = mid + 1
    options = [_split(acc, m, k, n, epilogue_ops, f) for f in {max(1, lo - 1), lo}]
    best = min(options, key=lambda s: (s.total_cycles, s.cols))
    whole = fused_gemm_cost(acc, m, k, n, epilogue_ops)[1]
    return best if best.total_cycles < whole else None


def product_cycles(acc: Accelerator, m: int, k: int, n: int, epilogue_ops: float) -> int:
    """Cycles of an (m x k) . (k x n) product with an epilogue of `epilogue_ops`
    operations an output: fused_gemm_cost's, or a vector share's where one is faster."""
    share = vector_share(acc, m, k, n, epilogue_ops)
    return share.total_cycles if share is not None else fused_gemm_cost(acc, m, k, n, epilogue_ops)[1]
