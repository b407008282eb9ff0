"""Targets: what a program is optimised for. One neutral module that the e-graph driver
(target facts for rules), the cost models and the backends all read.

Names: "gpu"; "systolic" (= "systolic:32x32"); "systolic:32x32" and "systolic:256x256"
(the presets, after SCALE-Sim's scale.cfg and google.cfg); "systolic:RxC" for other sizes
(scale.cfg's scratchpads, bandwidth and dataflow); "FILE.toml" or "systolic:FILE.toml"
(an accelerator description, see apsat.targets.accelerator.load_accelerator).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from apsat.errors import ApsatError
from apsat.targets.accelerator import PRESETS, Accelerator, load_accelerator, scale_cfg_like

__all__ = ["PRESETS", "Accelerator", "Target", "load_accelerator", "parse_target"]


def default_accelerator(rows: int, cols: int) -> Accelerator:
    """The accelerator "systolic:RxC" names: the preset of that size if there is one,
    else a scale.cfg-like array (ApsatError for a size below 1x1)."""
    if isinstance(rows, bool) or not isinstance(rows, int) or isinstance(cols, bool) \
            or not isinstance(cols, int) or rows < 1 or cols < 1:
        raise ApsatError(f"systolic target {rows}x{cols}: the array needs at least one row "
                         "and one column")
    return PRESETS.get(f"{rows}x{cols}") or scale_cfg_like(rows, cols)


@dataclass(frozen=True)
class Target:
    """A target: `kind` is "gpu" or "systolic"; rows/cols are the systolic array's size
    (None for gpu); `accel` is the systolic accelerator (None for gpu).

    Target("systolic", R, C) takes the default accelerator of that size (a preset or a
    scale.cfg-like array); Target("systolic", accel=acc) takes rows/cols from `acc`.
    Giving both with different sizes is an ApsatError."""

    kind: str
    rows: int | None = None
    cols: int | None = None
    accel: Accelerator | None = None

    def __post_init__(self):
        if self.kind == "gpu":
            if self.rows is not None or self.cols is not None or self.accel is not None:
                raise ApsatError("target gpu takes no array size or accelerator")
            return
        if self.kind != "systolic":
            raise ApsatError(f"unknown target kind {self.kind!r}: use gpu or systolic")
        acc = self.accel
        if acc is None and (self.rows is None or self.cols is None):
            raise ApsatError("a systolic target needs rows and cols or an accelerator")
        if acc is None:
            acc = default_accelerator(self.rows, self.cols)
            object.__setattr__(self, "accel", acc)
        elif (self.rows, self.cols) not in ((None, None), (acc.rows, acc.cols)):
            raise ApsatError(f"systolic target {self.rows}x{self.cols} does not match its "
                             f"accelerator {acc.name!r} ({acc.rows}x{acc.cols})")
        object.__setattr__(self, "rows", acc.rows)
        object.__setattr__(self, "cols", acc.cols)

    @property
    def name(self) -> str:
        """"gpu", "systolic:RxC" for the default accelerator of a size, else
        "systolic:<accelerator name>"."""
        if self.kind == "gpu":
            return "gpu"
        size = f"{self.rows}x{self.cols}"
        if self.accel == default_accelerator(self.rows, self.cols):
            return f"systolic:{size}"
        return f"systolic:{self.accel.name}"

    def facts(self) -> str:
        """egglog facts the rules read (language.egg declares target-rows/target-cols)."""
        if self.kind != "systolic":
            return ""
        return f"(set (target-rows) {self.rows})\n(set (target-cols) {self.cols})"


_USAGE = ("use gpu, systolic, systolic:RxC (e.g. systolic:32x32, systolic:256x256) "
          "or an accelerator file FILE.toml")


def parse_target(target) -> Target:
    """A Target from a name (see the module docstring), a Path to a .toml file, an
    Accelerator or a Target; ApsatError (one line) for anything else."""
    if isinstance(target, Target):
        return target
    if isinstance(target, Accelerator):
        return Target("systolic", accel=target)
    if isinstance(target, Path):
        return Target("systolic", accel=load_accelerator(target))
    if not isinstance(target, str):
        raise ApsatError(f"unknown target {target!r}: {_USAGE}")
    if target == "gpu":
        return Target("gpu")
    if target == "systolic":
        return Target("systolic", accel=PRESETS["32x32"])
    spec = target[len("systolic:"):] if target.startswith("systolic:") else None
    if target.endswith(".toml"):
        return Target("systolic", accel=load_accelerator(spec if spec is not None else target))
    if spec is not None:
        m = re.fullmatch(r"(\d+)x(\d+)", spec)
        if m:
            rows, cols = int(m.group(1)), int(m.group(2))
            if rows < 1 or cols < 1:
                raise ApsatError(f"target {target!r}: the array needs at least one row and one column")
            return Target("systolic", accel=default_accelerator(rows, cols))
    raise ApsatError(f"unknown target {target!r}: {_USAGE}")
