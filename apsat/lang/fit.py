"""Sizes as polynomials in symbolic dims, found from the same artefact made at several sizes.

An export or a kernel source made from a general program (apsat.pipeline.generalise) at
different values of the symbols differs only in the numbers that follow them. With k
symbols, made at the 2**k corners of two values each (`corners`), each such number is one
polynomial with a coefficient per set of symbols (1, batch, seq, batch*seq, ...), which
`fit` solves for exactly and checks at a third value of every symbol. `text` writes one.
"""
from __future__ import annotations

from itertools import combinations

import numpy as np

Poly = dict        # frozenset(symbol names) -> int coefficient


class FitError(ValueError):
    """A number that follows no polynomial in the symbols (a floor division, a tile
    choice that changed): the message says which."""


def corners(symbols: dict[str, tuple[int, int, int]]) -> list[tuple[frozenset, dict]]:
    """(set of moved symbols, values) for each corner; symbols: name -> (rep, other, third)."""
    names = list(symbols)
    return [(frozenset(moved), {n: symbols[n][1 if n in moved else 0] for n in names})
            for k in range(len(names) + 1) for moved in combinations(names, k)]


def value(poly: Poly, values: dict[str, int]) -> int:
    return sum(c * int(np.prod([values[n] for n in s], dtype=np.int64)) for s, c in poly.items())


def fit(samples: list, points: list, third, third_values: dict) -> list[Poly]:
    """One polynomial per position of `samples` (one sequence of numbers per corner of
    `points`, as corners gives them), exact whole coefficients, confirmed by `third` (the
    numbers at `third_values`); FitError otherwise."""
    subsets = [moved for moved, _ in points]
    a = np.array([[np.prod([vals[n] for n in s], dtype=np.float64) for s in subsets] for _, vals in points])
    y = np.stack([np.asarray(v, dtype=np.float64).ravel() for v in samples])
    coef = np.linalg.solve(a, y)
    rounded = np.rint(coef)
    if not np.allclose(coef, rounded, atol=1e-6):
        raise FitError("a size is not a whole-number polynomial in the symbolic dims")
    polys = [{s: int(rounded[i, j]) for i, s in enumerate(subsets) if rounded[i, j]} for j in range(y.shape[1])]
    for poly, want in zip(polys, np.asarray(third, dtype=np.float64).ravel()):
        if value(poly, third_values) != want:
            raise FitError(f"a size follows no polynomial in {', '.join(sorted(third_values))} "
                           f"({text(poly)} gives {value(poly, third_values)} at the third size, not {want:g})")
    return polys


def text(poly: Poly, name=lambda s: s) -> str:
    """The polynomial as `batch*seq*32 + 1` (each symbol written by `name`)."""
    parts = []
    for s, c in sorted(poly.items(), key=lambda sc: (-len(sc[0]), sorted(sc[0]))):
        names = "*".join(name(n) for n in sorted(s))
        parts.append(str(c) if not names else names if c == 1 else f"{names}*{c}")
    return " + ".join(parts).replace("+ -", "- ") or "0"
