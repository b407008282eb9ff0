"""The systolic target's backend: an instruction stream for the accelerator and its
functional simulator (see apsat.backends.base)."""
from __future__ import annotations

from pathlib import Path

from apsat.backends.base import Backend, Lowered


class SystolicBackend(Backend):
    """Lowering compiles the instruction stream and prices it with the cycle model (report
    key "systolic"); running simulates it; writing puts its text form on disk."""

    name = "systolic"
    run_key = "simulation"
    options = ("im2col", "fold_copies", "fuse_zips")

    def lower(self, program, target, weights, options: dict) -> Lowered:
        from apsat.backends.systolic import compile, cycles

        acc = target.accel
        stream = compile(program, acc, weights=weights, **options)
        cyc = cycles(stream)
        return Lowered(program, stream, {
            "accelerator": {"name": acc.name, "rows": acc.rows, "cols": acc.cols, "dataflow": acc.dataflow},
            "lowering": dict(stream.options),
            "instructions": stream.counts(), "host_steps": cyc["host_steps"],
            "cycles": cyc})

    def price(self, lowered: Lowered) -> dict:
        """The instruction stream's cycles by the cycle model (its report's total)."""
        return {"cost": lowered.report["cycles"]["total_cycles"], "unit": "cycles", "kernels": None}

    def run(self, lowered: Lowered, tensors: dict) -> dict:
        from apsat.backends.systolic import simulate

        return simulate(lowered.artifact, tensors)

    def write(self, lowered: Lowered, directory, compile=False) -> dict:
        from apsat.backends.systolic import to_text

        path = Path(directory) / "instructions.txt"
        path.write_text(to_text(lowered.artifact))
        return {}
