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
    return sum(c * int(np.prod([_power(n, values) for n in s], dtype=np.int64)) for s, c in poly.items())


def _power(name: str, values: dict[str, int]) -> int:
    """A key's symbol's value: `seq` or `seq^2`."""
    base, _, exp = name.partition("^")
    return values[base] ** int(exp or 1)


def fit(samples: list, points: list, third, third_values: dict) -> list[Poly]:
    """One polynomial per position of `samples` (one sequence of numbers per corner of
    `points`, as corners gives them), exact whole coefficients, confirmed by `third` (the
    numbers at `third_values`); FitError otherwise. A number that no polynomial of degree
    one in each symbol gives (a sequence squared: a mask's seq x seq elements) is fitted
    by the sparsest sum of at most three monomials of degree two or less in each symbol
    that gives it at every point (sparse_fit)."""
    try:
        return _multilinear(samples, points, third, third_values)
    except FitError:
        if len(points) + 1 < 5:
            raise
        columns = list(zip(*[np.asarray(v, dtype=np.float64).ravel() for v in samples]))
        thirds = np.asarray(third, dtype=np.float64).ravel()
        return [sparse_fit(list(col) + [t], [v for _, v in points] + [third_values]) for col, t in zip(columns, thirds)]


def sparse_fit(numbers: list, values: list[dict]) -> Poly:
    """The polynomial with the fewest (at most three) monomials, each of degree two or less
    in every symbol, whole coefficients, that gives `numbers` at `values` exactly; at least
    two points more than its terms, so that every fit is checked. FitError otherwise."""
    from itertools import product as cartesian

    names = sorted(values[0])
    monos = [m for m in cartesian(range(3), repeat=len(names))]
    col = {m: np.array([float(np.prod([v[n] ** e for n, e in zip(names, m)])) for v in values]) for m in monos}
    y = np.asarray(numbers, dtype=np.float64)
    for size in range(1, min(3, len(values) - 2) + 1):
        for chosen in combinations(monos, size):
            a = np.stack([col[m] for m in chosen], axis=1)
            coef, *_ = np.linalg.lstsq(a, y, rcond=None)
            rounded = np.rint(coef)
            if np.array_equal(a @ rounded, y) and np.all(rounded != 0):
                return {_key(names, m): int(c) for m, c in zip(chosen, rounded)}
    raise FitError(f"a size follows no polynomial in {', '.join(names)} (values {[int(n) for n in numbers]})")


def _key(names, mono) -> frozenset:
    """A monomial as the polynomial keys here: a frozenset of names, squares as `name^2`."""
    return frozenset(n if e == 1 else f"{n}^2" for n, e in zip(names, mono) if e)


def _multilinear(samples: list, points: list, third, third_values: dict) -> list[Poly]:
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
    """The polynomial as `batch*seq*32 + 1` (each symbol written by `name`, a square as
    `seq*seq`)."""
    parts = []
    for s, c in sorted(poly.items(), key=lambda sc: (-len(sc[0]), sorted(sc[0]))):
        names = "*".join("*".join([name(n.partition("^")[0])] * int(n.partition("^")[2] or 1)) for n in sorted(s))
        parts.append(str(c) if not names else names if c == 1 else f"{names}*{c}")
    return " + ".join(parts).replace("+ -", "- ") or "0"
