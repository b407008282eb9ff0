"""One interface for every backend: lower a program, run it here, write it out.

    lowered = backend.lower(program, target, weights, options)   # Lowered, nothing written
    backend.price(lowered)       # {"cost", "unit", "kernels"}: one inference, as emitted
    backend.run_skipped()        # None when run() works here at a sensible cost, else why not
    outputs = backend.run(lowered, tensors)                        # output name -> array
    written = backend.write(lowered, directory, compile=False)     # what the files and tools say

The pipeline (apsat/pipeline/optimize.py) treats every backend alike: it lowers the
extracted program, puts `lowered.report` in the model's report under `backend.name`, and,
when asked to verify, compares `run`'s outputs with onnxruntime beside the reference
interpreter's.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import numpy as np

from apsat.errors import ApsatError


@dataclass
class Lowered:
    """What a backend made of a program: `artifact` is the backend's own form (the
    Program, a KernelGraph, a Stream); `report` the JSON-ready figures known without
    running anything (kernels and modelled time, instructions and cycles)."""

    program: object
    artifact: object
    report: dict = field(default_factory=dict)


class Backend(ABC):
    """A backend. Subclasses set `name` (the report's key for what lowering says) and
    implement lower, run and write (abstract: a backend lacking one cannot be created)."""

    name = "backend"
    run_key = "run"     # where the report keeps run()'s comparison with onnxruntime

    options: tuple[str, ...] = ()   # the lowering options this backend takes

    def check_options(self, options: dict) -> None:
        """ApsatError (one line) for an option this backend does not take; the pipeline
        asks before any work, so a typo costs no saturation."""
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            known = f"known: {', '.join(self.options)}" if self.options else "it takes none"
            raise ApsatError(f"the {self.name} backend has no lowering option(s) "
                             f"{', '.join(unknown)} ({known})")

    @abstractmethod
    def lower(self, program, target, weights, options: dict) -> Lowered:
        """Lower an extracted Program for `target` (a Target); `weights` names the tensors
        known at load time; `options` are the backend's own (checked by check_options)."""

    def price(self, lowered: Lowered) -> dict | None:
        """What one inference of the lowered program costs on the target: the planner's
        price, by which the pipeline chooses among the extraction's candidates
        (apsat.pipeline.plan), and `lower` itself decides nothing more: {"cost": float, "unit": str, "kernels": int | None};
        None for a backend that has no cost model (the reference interpreter)."""
        return None

    def run_skipped(self) -> str | None:
        """None when `run` works on this machine at a cost fit for every verification;
        else one line saying why verification does not run it by default."""
        return None

    @abstractmethod
    def run(self, lowered: Lowered, tensors: dict) -> dict[str, np.ndarray]:
        """Execute (or simulate) the lowered program on `tensors` (weights and inputs by
        name); returns every program output by name."""

    @abstractmethod
    def write(self, lowered: Lowered, directory, compile=False) -> dict:
        """Write the lowered form under `directory` (compiling it where `compile` asks and
        the tools are present); returns the figures that writing adds to or corrects in
        `lowered.report` (what the compilers said), JSON-ready."""


def as_outputs(program, result) -> dict[str, np.ndarray]:
    """An evaluator's result as {output name: array} (single-output programs return a bare
    array)."""
    return result if isinstance(result, dict) else {next(iter(program.outputs)): result}
