"""A systolic-array accelerator's description: the `Accelerator` dataclass (validated on
construction), SCALE-Sim's two configurations as `PRESETS`, arrays of other sizes like
scale.cfg (`scale_cfg_like`), and descriptions read from TOML files (`load_accelerator`).
What a product costs on one is apsat/targets/systolic.py's analytical model.

Units: one word is one tensor element, `operand_bytes` bytes wide (an accumulator,
`accumulator_bytes`). Scratchpad sizes are given in kB (1024 bytes), so the ifmap and
filter scratchpads hold kB * 1024 / operand_bytes words and the ofmap scratchpad, whose
values are accumulators, kB * 1024 / accumulator_bytes. DRAM bandwidth is in bytes per
cycle. At the default widths (1 byte each) a word is SCALE-Sim's one-byte word and every
figure is the one-byte model's. SCALE-Sim keeps its bandwidth in words per cycle at any
word size; apsat's counts bytes, which a DRAM interface moves (only its stalls differ,
and SCALE-Sim's CALC mode has none).
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields
from pathlib import Path

from apsat.errors import ApsatError

DATAFLOWS = ("os", "ws", "is")
FLEX = "flex"          # the array is configured per product: each GEMM takes its best dataflow
# A flexible array takes, among the dataflows within this fraction of a product's fewest
# modelled cycles, the one that moves the fewest DRAM words. The per-product model prices a
# product alone, but DRAM words cost cycles it does not see: the three DMA interfaces are
# shared with neighbouring layers, and SCALE-Sim's total leaves the first prefetch out. On
# the light zoo (benchmarks/systolic.py, 32x32) 10% cut ResNet-50's traffic 15% and
# SqueezeNet's 32% at equal stream cycles; 0% (cycles alone) chose ws for products whose
# partial sums then dominated the traffic.
FLEX_CYCLE_SLACK = 0.10
WORDS_PER_KB = 1024     # bytes per kB: words per kB at one byte a word
ELEMENT_BYTES = (1, 2, 4, 8)   # element widths a description may give
# A flexible array has one more loop order, which SCALE-Sim's os mapping lacks: "osk",
# output stationary with B's k-chunks reused across an ofmap block of row folds
# (os_blocking). Only where B's column block does not fit a filter half, so that os
# re-reads B for every row fold; elsewhere osk would be os and is not offered.
OS_BLOCKED = "osk"
FLEX_DATAFLOWS = DATAFLOWS + (OS_BLOCKED,)


@dataclass(frozen=True)
class Accelerator:
    """A systolic-array accelerator.

    rows, cols: the PE array (rows x cols multiply-accumulate units).
    dataflow: "os" (output stationary), "ws" (weight stationary), "is" (input
        stationary, SCALE-Sim's third dataflow), or "flex": the array is reconfigured
        per product, each GEMM taking, among the dataflows within `flex_slack` of
        its fewest total cycles under this model, the one of fewest DRAM words (ties:
        fewer cycles, then os, ws, is). A flexible array's per-product figures are each
        one of the three fixed dataflows', so the SCALE-Sim calibration carries over
        product by product, or osk's (os passes in another order, os_blocking).
    ifmap_kb, filter_kb, ofmap_kb: scratchpad sizes in kB of 1024 bytes (ifmap_words etc.
        give them in words); each is double buffered (half feeds the array, half fills
        from DRAM).
    dram_bandwidth: bytes per cycle on each scratchpad's DRAM interface (the three
        interfaces run in parallel; at one-byte operands, words per cycle); math.inf
        means unlimited (SCALE-Sim's CALC mode).
    vector_lanes: elements per cycle of the vector unit (activations, element-wise ops).
    name: a label for reports.
    flex_slack: for "flex", the fraction of a product's fewest cycles it may give up for
        fewer DRAM words (default FLEX_CYCLE_SLACK; 0: cycles alone), between 0 and 1.
    operand_bytes: bytes an operand element takes in the scratchpads and in DRAM (1, 2,
        4 or 8; default 1, SCALE-Sim's word). A width, not a number format: nothing
        rounds values to it (apsat/backends/systolic/simulate.py).
    accumulator_bytes: bytes of an accumulator: the ofmap scratchpad's values and the
        partial sums ws and is drain to DRAM (one of ELEMENT_BYTES, at least
        operand_bytes), or None (the default): the operand width, the one word size
        SCALE-Sim has, so that replacing operand_bytes alone widens both. The models
        read `accumulator_width`, which resolves None.

    Construction validates every field and raises ApsatError with a one-line message.
    """

    rows: int
    cols: int
    dataflow: str = "os"
    ifmap_kb: int = 64
    filter_kb: int = 64
    ofmap_kb: int = 64
    dram_bandwidth: float = 64.0
    vector_lanes: int = 32
    name: str = "systolic"
    flex_slack: float = FLEX_CYCLE_SLACK
    operand_bytes: int = 1
    accumulator_bytes: int | None = None

    def __post_init__(self):
        who = f"accelerator {self.name!r}"
        for f in ("rows", "cols", "vector_lanes"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ApsatError(f"{who}: {f} must be a positive integer, got {v!r}")
        if self.dataflow not in DATAFLOWS + (FLEX,):
            raise ApsatError(f"{who}: unknown dataflow {self.dataflow!r} (use os, ws, is or flex)")
        bw = self.dram_bandwidth
        if isinstance(bw, bool) or not isinstance(bw, (int, float)) or not bw > 0:
            raise ApsatError(f"{who}: dram_bandwidth must be a positive number of words "
                             f"per cycle, got {bw!r}")
        object.__setattr__(self, "dram_bandwidth", float(bw))
        slack = self.flex_slack
        if isinstance(slack, bool) or not isinstance(slack, (int, float)) or not 0 <= slack <= 1:
            raise ApsatError(f"{who}: flex_slack must be a number from 0 to 1, got {slack!r}")
        object.__setattr__(self, "flex_slack", float(slack))
        if not isinstance(self.name, str) or not self.name:
            raise ApsatError(f"{who}: name must be a non-empty string")
        self._check_widths(who)
        tile = self.rows * self.cols
        for f in ("ifmap_kb", "filter_kb", "ofmap_kb"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ApsatError(f"{who}: {f} must be a positive integer (kB), got {v!r}")
            words = getattr(self, f"{f[:-3]}_words")
            if words < tile:
                raise ApsatError(
                    f"{who}: the {f[:-3]} scratchpad ({v} kB = {words} words) "
                    f"cannot hold one {self.rows}x{self.cols} tile ({tile} words)")

    def _check_widths(self, who: str) -> None:
        """Validate operand_bytes and accumulator_bytes (None: the operand width)."""
        for f in ("operand_bytes", "accumulator_bytes"):
            v = getattr(self, f)
            if f == "accumulator_bytes" and v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v not in ELEMENT_BYTES:
                raise ApsatError(f"{who}: {f} must be one of {', '.join(map(str, ELEMENT_BYTES))} "
                                 f"(bytes an element), got {v!r}")
        if self.accumulator_width < self.operand_bytes:
            raise ApsatError(f"{who}: accumulator_bytes ({self.accumulator_bytes}) must be at least "
                             f"operand_bytes ({self.operand_bytes})")

    @property
    def accumulator_width(self) -> int:
        """Bytes of an accumulator: accumulator_bytes, or operand_bytes where None."""
        return self.operand_bytes if self.accumulator_bytes is None else self.accumulator_bytes

    def output_bytes(self, dataflow: str, row_folds: int) -> int:
        """Bytes a word of a product's output moves to DRAM: accumulators where ws or is
        drain partial sums (more than one row fold; the last fold adds to them), else
        operands."""
        return self.accumulator_width if dataflow in ("ws", "is") and row_folds > 1 else self.operand_bytes

    @property
    def ifmap_words(self) -> int:
        """Capacity of the ifmap scratchpad in operand words (both halves)."""
        return self.ifmap_kb * WORDS_PER_KB // self.operand_bytes

    @property
    def filter_words(self) -> int:
        """Capacity of the filter scratchpad in operand words (both halves)."""
        return self.filter_kb * WORDS_PER_KB // self.operand_bytes

    @property
    def ofmap_words(self) -> int:
        """Capacity of the ofmap scratchpad in accumulator words (both halves)."""
        return self.ofmap_kb * WORDS_PER_KB // self.accumulator_width

    @property
    def macs_per_cycle(self) -> int:
        """Peak multiply-accumulates per cycle (rows * cols)."""
        return self.rows * self.cols

    @property
    def dataflows(self) -> tuple[str, ...]:
        """The dataflows a product may take: os, ws, is and the osk loop order for
        "flex", else the one."""
        return FLEX_DATAFLOWS if self.dataflow == FLEX else (self.dataflow,)

    def fill_cycles(self, dataflow: str | None = None) -> int:
        """Cycles one fold adds to its T streaming cycles (pipeline fill and drain) under
        `dataflow` (default: the accelerator's; a flexible array needs one named)."""
        df = dataflow or self.dataflow
        if df not in FLEX_DATAFLOWS:
            raise ApsatError(f"accelerator {self.name!r}: fill cycles need a dataflow "
                             f"(os, ws, is or osk), got {df!r}")
        if df in ("os", OS_BLOCKED):
            return self.rows + self.cols - 2
        return 2 * self.rows + self.cols - 2


# SCALE-Sim's own configurations (DESIGN.md): scale.cfg and google.cfg.
PRESETS: dict[str, Accelerator] = {
    "32x32": Accelerator(32, 32, "os", 64, 64, 64, 64.0, 32, "32x32"),
    "256x256": Accelerator(256, 256, "ws", 6144, 6144, 2048, 10.0, 256, "256x256"),
}


def scale_cfg_like(rows: int, cols: int, name: str | None = None) -> Accelerator:
    """A rows x cols array with the 32x32 preset's scratchpads, bandwidth and dataflow
    (scale.cfg), each scratchpad grown to hold at least one rows x cols tile; vector
    lanes = cols."""
    p = PRESETS["32x32"]
    need = -(-rows * cols // WORDS_PER_KB) if rows > 0 and cols > 0 else 1
    return Accelerator(rows, cols, p.dataflow, max(p.ifmap_kb, need), max(p.filter_kb, need),
                       max(p.ofmap_kb, need), p.dram_bandwidth, cols if cols > 0 else 1,
                       name or f"{rows}x{cols}")


_TOML_KEYS = {f.name for f in fields(Accelerator)}
_TOML_REQUIRED = {"rows", "cols"}


def load_accelerator(path) -> Accelerator:
    """An Accelerator from a TOML file whose top-level keys are Accelerator's fields
    (rows and cols required; the others default to the 32x32 preset's values, name to
    the file's stem, accumulator_bytes to the operand width; dram_bandwidth may be the
    TOML float inf). ApsatError (one line, naming the file) for an unreadable or
    malformed file, unknown or missing keys and invalid values."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except OSError as e:
        raise ApsatError(f"{path}: cannot read accelerator file: {e.strerror or e}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ApsatError(f"{path}: not valid TOML: {str(e).splitlines()[0]}") from None
    unknown = sorted(set(data) - _TOML_KEYS)
    if unknown:
        raise ApsatError(f"{path}: unknown key(s) {', '.join(unknown)} "
                         f"(known: {', '.join(sorted(_TOML_KEYS))})")
    missing = sorted(_TOML_REQUIRED - set(data))
    if missing:
        raise ApsatError(f"{path}: missing key(s) {', '.join(missing)}")
    data.setdefault("name", path.stem)
    p = PRESETS["32x32"]
    data.setdefault("vector_lanes", data["cols"] if isinstance(data["cols"], int) else 1)
    for f in ("dataflow", "ifmap_kb", "filter_kb", "ofmap_kb", "dram_bandwidth", "operand_bytes"):
        data.setdefault(f, getattr(p, f))
    try:
        return Accelerator(**data)
    except ApsatError as e:
        raise ApsatError(f"{path}: {e}") from None
