"""The gpu target's machine: H100 SXM figures and the roofline time of one kernel.

Figures (H100 SXM5, public data sheet): fp32 67 TFLOP/s without tensor cores, tf32
494 TFLOP/s and fp16/bf16 989 TFLOP/s dense on tensor cores (the sheet's 1979 is with
2:4 sparsity; matrix products only: element-wise work is computed in float32 registers
whatever the value's type, so it stays at the fp32 rate), 3.35 TB/s HBM3, PCIe Gen5 x16
~64 GB/s, ~3 us per launch.

By element type (apsat/lang/dtypes.py): a product whose operands are f16 or bf16 runs at
that type's tensor-core peak (`PEAK_OF`), and a kernel's bytes are each buffer's elements
times its type's width (dtypes.BYTES), which the callers pass as `moved_bytes`.
The gpu cost model (apsat/extract/cost_gpu.py) prices e-nodes with these; the GPU backend
(apsat/backends/gpu) prices the kernels it writes with the same figures.

A calibration (apsat/targets/gpu_calibration.py: launch time and per-kind fractions of
these peaks, fitted to measured kernels) replaces the data-sheet formula for every kernel
priced with its kind; without one the figures are the data sheet's alone.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from apsat.targets import gpu_calibration
from apsat.targets.gpu_calibration import Calibration

TFLOPS = {"fp32": 67.0, "tf32": 494.0, "bf16": 989.0, "fp16": 989.0}
BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2}
# the precision a product of operands of each half element type (apsat.lang.dtypes' names,
# spelt out: targets sit below the language) runs at; f32 operands: the roofline's own
# precision, fp32 unless a tf32/bf16 model is asked for
PEAK_OF = {"f16": "fp16", "bf16": "bf16"}
HBM_BYTES_PER_US = 3.35e6          # 3.35 TB/s
PCIE_BYTES_PER_US = 64e3           # 64 GB/s
LAUNCH_US = 3.0


@dataclass
class Roofline:
    """Roofline time (microseconds) of a kernel on an H100 at `precision` ("fp32",
    "tf32", "bf16" or "fp16": what f32 products are assumed to run at, and the element
    width when a caller gives no bytes; verification stays fp32 whatever it assumes).

    `calibration`: fitted constants (gpu_calibration.Calibration) or None for the data
    sheet's; by default the one in force when the roofline is made
    (gpu_calibration.active())."""

    precision: str = "fp32"
    calibration: Calibration | None = field(default_factory=gpu_calibration.active)

    def __post_init__(self):
        if self.precision not in TFLOPS:
            raise ValueError(f"gpu cost model: unknown precision {self.precision!r}; known: {', '.join(TFLOPS)}")

    def kernel_us(self, flop: float, elements_moved: float, matrix: bool, kind: str | None = None,
                  dtype: str | None = None, moved_bytes: float | None = None) -> float:
        """One kernel's time: launch plus the larger of compute and memory time; `matrix`
        kernels run at the tensor-core peak of their operands' element type `dtype` (f16,
        bf16; f32 or None: the roofline's precision), the others at the fp32 rate.
        `moved_bytes`: the bytes moved, each buffer at its type's width; None: every
        element at the precision's width. With a calibration and the kernel's `kind`
        (gpu_calibration.KINDS), the fitted launch and that kind's fractions of the two
        peaks apply."""
        peak = TFLOPS[self.peak_precision(dtype)] if matrix else TFLOPS["fp32"]
        moved = elements_moved * BYTES[self.precision] if moved_bytes is None else moved_bytes
        if self.calibration is not None and kind is not None:
            return self.calibration.kernel_us(kind, flop, moved, peak * 1e6, HBM_BYTES_PER_US)
        return LAUNCH_US + max(flop / (peak * 1e6), moved / HBM_BYTES_PER_US)

    def peak_precision(self, dtype: str | None) -> str:
        """The precision a matrix product of operands of element type `dtype` runs at."""
        return PEAK_OF.get(dtype, self.precision)

    @property
    def launch_us(self) -> float:
        """One launch: the calibration's when there is one, else the data sheet's."""
        return self.calibration.launch_us if self.calibration is not None else LAUNCH_US

    def host_us(self, elements_moved: float) -> float:
        """A host step's time: its operands down and its result back over PCIe (fp32),
        plus a launch each way."""
        return 2 * self.launch_us + elements_moved * BYTES["fp32"] / PCIE_BYTES_PER_US
