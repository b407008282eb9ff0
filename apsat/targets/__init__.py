"""Targets: what a program is optimised for. One neutral module that the e-graph driver
(target facts for rules), the cost models and the backends all read.

Names: "gpu"; "systolic" (= "systolic:32x32"); "systolic:RxC" (e.g. "systolic:256x256").
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from apsat.errors import ApsatError


@dataclass(frozen=True)
class Target:
    """A target: `kind` is "gpu" or "systolic"; rows/cols are the systolic array's size
    (None for gpu)."""

    kind: str
    rows: int | None = None
    cols: int | None = None

    @property
    def name(self) -> str:
        return self.kind if self.kind == "gpu" else f"systolic:{self.rows}x{self.cols}"

    def facts(self) -> str:
        """egglog facts the rules read (language.egg declares target-rows/target-cols)."""
        if self.kind != "systolic":
            return ""
        return f"(set (target-rows) {self.rows})\n(set (target-cols) {self.cols})"


def parse_target(target) -> Target:
    """A Target from a name or a Target; ApsatError (one line) for anything else."""
    if isinstance(target, Target):
        return target
    if target == "gpu":
        return Target("gpu")
    if target == "systolic":
        return Target("systolic", 32, 32)
    m = re.fullmatch(r"systolic:(\d+)x(\d+)", str(target))
    if m:
        rows, cols = int(m.group(1)), int(m.group(2))
        if rows < 1 or cols < 1:
            raise ApsatError(f"target {target!r}: the array needs at least one row and one column")
        return Target("systolic", rows, cols)
    raise ApsatError(f"unknown target {target!r}: use gpu, systolic or systolic:RxC (e.g. systolic:32x32)")
