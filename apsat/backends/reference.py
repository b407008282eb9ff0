"""The reference backend: the program itself, run by the reference interpreter
(apsat/lang/evaluate.py). It is what every other backend is checked beside."""
from __future__ import annotations

from apsat.backends.base import Backend, Lowered, as_outputs


class ReferenceBackend(Backend):
    """Lowering keeps the program; running evaluates it with numpy."""

    name = "reference"

    def lower(self, program, target, weights, options: dict) -> Lowered:
        return Lowered(program, program, {})

    def run(self, lowered: Lowered, tensors: dict) -> dict:
        from apsat.lang.evaluate import evaluate

        return as_outputs(lowered.program, evaluate(lowered.program, tensors))

    def write(self, lowered: Lowered, directory, compile=False) -> dict:
        return {}
