"""What import folds when a model has symbolic dims (apsat.frontend.symbols).

The program is built at representative values, so Shape folds to them and everything
computed from shapes folds to constants sized by them. A constant of such a size that is
one value repeated (a ConstantOfShape fill of the mask's shape) is general: one value at
any size. One that varies (positions sliced to the sequence length, an index built on
them) would fix the size; `SymbolFolding.varies` says so and the importer computes it in
the program instead, where its size follows the symbol. A Range of symbolic length has no
construct in the language: it stays folded and becomes a `generated` weight, which a
program at another size makes afresh (apsat.pipeline.generalise).
"""
from __future__ import annotations

import numpy as np

from apsat.frontend.folding import Const


class SymbolFolding:
    """The sizes that stand for symbols (representative values, their products and the
    sums of two: a past length and a new one), and
    the Range outputs and weights generated at each size."""

    def __init__(self, values=()):
        values = list(values)
        self.sizes: set[int] = set(values) | {a * b for a in values for b in values} \
            | {a + b for i, a in enumerate(values) for b in values[i + 1:]}
        self._ranges: dict[str, tuple[float, float]] = {}
        self.generated: dict[str, tuple[float, float]] = {}  # weight name -> (start, delta)

    def varies(self, node, env: dict, lowers: bool) -> bool:
        """After `node` folded into `env`: whether an output has a symbol's size and more
        than one value, and the node has a lowering (`lowers`): its outputs are then
        taken out of `env` for the importer to lower the node instead."""
        if not self.sizes or not any(node.input):
            return False                 # a Constant node's value is the model's, whatever its size
        if node.op_type == "Range" and self.sizes & set(np.shape(env[node.output[0]].value)):
            start, _, delta = (float(np.asarray(env[n].value).reshape(-1)[0]) for n in node.input)
            self._ranges[node.output[0]] = (start, delta)
            return False
        for name in node.output:
            v = env.get(name) if name else None
            if isinstance(v, Const) and _shape_vector(v.value):
                continue                 # a shape or index list whose length is a rank
            if isinstance(v, Const) and self.sizes & set(np.shape(v.value)):
                flat = np.asarray(v.value).ravel()
                if lowers and flat.size and not np.all(flat == flat[0]):
                    for out in node.output:
                        env.pop(out, None)
                    return True
        return False

    def weight_made(self, value_name: str, weight_name: str) -> None:
        """The folded value `value_name` became weight `weight_name`: generated if a Range."""
        if value_name in self._ranges:
            self.generated[weight_name] = self._ranges[value_name]


def _shape_vector(value) -> bool:
    """A 1-D integer tensor of at most 8 elements: a shape, axes or a slice's bounds, whose
    length is a rank (5 for a (batch, tokens, 3, heads, width) reshape), never a size that
    stands for a symbol."""
    a = np.asarray(value)
    return a.ndim == 1 and a.dtype.kind in "iu" and a.size <= 8
