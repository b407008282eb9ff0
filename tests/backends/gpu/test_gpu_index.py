"""Index expressions render to source that both dialects evaluate as the simplifier means.

The simplifier (apsat.backends.gpu.expr) uses floor division and modulo; Triton's `//`
and `%` on integers and C's `/` and `%` round toward zero. Where a dividend can be
negative (pad offsets folded into a reshape's division: ConvTranspose's zero insertion
padded twice gave wrong Triton values before), the rendering shifts it non-negative. Each
case is evaluated over every value of its variables with truncating arithmetic and
compared with Python's floor arithmetic on the unrendered meaning."""
from __future__ import annotations

import math
import re

import pytest

from apsat.backends.gpu.emit import render_ix
from apsat.backends.gpu.expr import add, div, mod, mul, var

I, J = var("i", 8), var("j", 5)
CASES = {
    "div-negative-offset": (div(add(I, -2), 3), lambda i, j: (i - 2) // 3),
    "mod-negative-offset": (mod(add(I, -2), 3), lambda i, j: (i - 2) % 3),
    "div-two-vars": (div(add(mul(I, 5), J, -7), 4), lambda i, j: (5 * i + j - 7) // 4),
    "mod-two-vars": (mod(add(mul(I, 5), J, -7), 4), lambda i, j: (5 * i + j - 7) % 4),
    "div-of-div": (div(div(add(I, -5), 2), 3), lambda i, j: ((i - 5) // 2) // 3),
    "non-negative": (div(add(I, 3), 2), lambda i, j: (i + 3) // 2),
}


class _Trunc(int):
    """An int whose / and % round toward zero, as C's and Triton's integer operators."""

    def __truediv__(self, o):
        return _Trunc(int(int(self) / int(o)))

    def __mod__(self, o):
        return _Trunc(int(math.fmod(int(self), int(o))))

    def __add__(self, o):
        return _Trunc(int(self) + int(o))

    __radd__ = __add__

    def __sub__(self, o):
        return _Trunc(int(self) - int(o))

    def __rsub__(self, o):
        return _Trunc(int(o) - int(self))

    def __mul__(self, o):
        return _Trunc(int(self) * int(o))

    __rmul__ = __mul__


def _truncating(text: str, env: dict) -> int:
    """`text` (the C rendering) evaluated with truncating / and %."""
    text = re.sub(r"\b(\d+)\b", r"T(\1)", text)
    return int(eval(text, {"T": _Trunc, **{k: _Trunc(v) for k, v in env.items()}}))


@pytest.mark.parametrize("case", sorted(CASES))
def test_rendered_index_truncates_like_the_floor_it_means(case):
    expr, meaning = CASES[case]
    text = render_ix(expr, "/")
    for i in range(8):
        for j in range(5):
            assert _truncating(text, {"i": i, "j": j}) == meaning(i, j), (text, i, j)
