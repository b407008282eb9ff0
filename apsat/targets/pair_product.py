"""A dot-product over an access-pair of broadcasts, seen as independent matrix products.

The importer writes a grouped convolution (and any product whose operands vary along
different iterated axes) as `(compute dot-product (access-pair A B))` where A and B are
broadcasts to the same shape ((iterated), (item)): the windows broadcast over the filters
of their group, the weights broadcast over the batch and the output positions. Reading
which iterated axes each operand really varies along (its dims before the broadcast)
recovers the matrix products: axes where both vary index independent `groups`, axes where
only one varies are the rows (left operand) or the columns (right operand) of each
group's (m x k) . (k x n) product, k the item's size. A grouped 3x3 convolution with G
groups of C/G input and M/G output channels over P output positions is G products
(M/G x 9C/G) . (9C/G x P) (or P rows by M/G columns, whichever order the result's axes
take); a depthwise one is C products of 1 x 9 by 9 x P.

Both the systolic cost model (apsat/extract/cost_systolic.py) and the systolic backend
(apsat/backends/systolic/grouped.py) read a product this way, so they price and run the
same thing. The axes must come in the order groups, left, right in the result (size-1
axes anywhere): then each group's m x n result is one contiguous block of the output,
which the array writes in place.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class PairProduct:
    """`groups` independent (m x k) . (k x n) products over an access-pair's iterated
    axes; `left` is the pair operand (0 or 1) whose varying axes are the rows."""

    groups: int
    m: int
    k: int
    n: int
    left: int

    @property
    def macs(self) -> int:
        """Multiply-accumulates of all groups."""
        return self.groups * self.m * self.k * self.n


def _varies(pre: tuple, dims: tuple) -> list[bool]:
    return [p == d for p, d in zip(pre, dims)]


def pair_product(iterated: tuple, item: tuple, pre0: tuple, pre1: tuple) -> PairProduct | None:
    """The products of a dot-product over an access-pair whose operands have iterated dims
    `iterated` and item dims `item`, and iterated dims `pre0` / `pre1` before their
    broadcasts (an operand that is not a broadcast passes `iterated`). None when the
    axes are not in the order groups, one operand's, the other's (size-1 axes ignored), or
    an axis of size > 1 is broadcast in both operands."""
    iterated, pre0, pre1 = tuple(iterated), tuple(pre0), tuple(pre1)
    if len(pre0) != len(iterated) or len(pre1) != len(iterated):
        return None
    kinds = []
    for d, v0, v1 in zip(iterated, _varies(pre0, iterated), _varies(pre1, iterated)):
        if d == 1:
            continue
        if not (v0 or v1):
            return None
        kinds.append(("g" if v0 and v1 else ("0" if v0 else "1"), d))
    runs = [kind for i, (kind, _) in enumerate(kinds) if i == 0 or kinds[i - 1][0] != kind]
    if runs[:1] == ["g"]:
        runs = runs[1:]
    if "g" in runs or len(set(runs)) != len(runs):
        return None
    groups = [d for kind, d in kinds if kind == "g"]
    rest = runs
    left = int(rest[0]) if rest else 0
    size = {kind: math.prod(d for k_, d in kinds if k_ == kind) for kind in ("0", "1")}
    return PairProduct(math.prod(groups), size[str(left)], max(1, math.prod(item)),
                       size[str(1 - left)], left)


__all__ = ["PairProduct", "pair_product"]
