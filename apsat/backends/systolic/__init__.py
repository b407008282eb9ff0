"""The systolic-array accelerator backend: lowering, instruction stream, simulator, cycles.

    stream = compile(program, "systolic:32x32", weights=model.weights)   # -> Stream
    outputs = simulate(stream, {**model.weights, **inputs})             # name -> array
    report = cycles(stream)              # total cycles, utilisation, DRAM traffic ...
    write(stream, "out/")                # out/instructions.txt (+ out/cycles.json)
    stream == parse(to_text(stream))     # the text form round-trips

Modules: isa (the instructions and Stream as dataclasses), views (address patterns),
lower (Program -> Stream; HOST steps for what the accelerator cannot run), gemm (GEMMs:
entry points and dataflow choice), dataflows and tiles (the tiling per dataflow, double
buffered), grouped (grouped and depthwise convolutions), attention (the attention atom, its scores
kept on chip when they fit), shared (one-row products split
between the array and the vector unit), vector (vector-unit ops and DMA copies), simulate
(the numpy functional simulator), timing (cycles and traffic from the analytical model in
apsat/targets/systolic.py), text (the text form).
"""
from __future__ import annotations

import json
from pathlib import Path

from apsat.backends.systolic.isa import (ARRAY, Buffer, Copy, Group, Host, Load, Matmul, Operand, Preload,
                                         Region, Slot, Store, Stream, Vec, View)
from apsat.backends.systolic.simulate import SimulationError, simulate
from apsat.backends.systolic.text import StreamParseError, parse, to_text
from apsat.backends.systolic.timing import cycles
from apsat.errors import ApsatError

__all__ = ["compile", "simulate", "cycles", "write", "read", "parse", "to_text", "accelerator_of",
           "Stream", "Buffer", "View", "Group", "Slot", "Region", "Operand", "ARRAY",
           "Load", "Store", "Copy", "Preload", "Matmul", "Vec", "Host",
           "SimulationError", "StreamParseError"]


def accelerator_of(target):
    """The Accelerator of a systolic target (an Accelerator, a Target, a target name such
    as "systolic:32x32", or a .toml path); ApsatError for a non-systolic target."""
    from apsat.targets import parse_target

    t = parse_target(target)
    if t.kind != "systolic":
        raise ApsatError(f"the systolic backend needs a systolic target, got {t.name!r}")
    return t.accel


def compile(program, target="systolic:32x32", weights=None, im2col: str = "model",  # noqa: A001
            fold_copies: bool = False, fuse_zips: bool = False):
    """Lower `program` (an extracted Program) for a systolic target; `weights` (names, or a
    dict whose keys are the names; default the program's own `weights`) are the tensors
    known at load time: what depends only on them is computed once, in the stream's init
    section. `im2col` ("model" | "gather"), `fold_copies` and `fuse_zips`: see
    apsat.backends.systolic.lower (the defaults follow the extractor's cost model). ApsatError (one line) when a tile cannot be formed on this
    accelerator."""
    from apsat.backends.systolic.lower import compile_program

    names = program.weights if weights is None else weights
    return compile_program(program, accelerator_of(target), names, im2col, fold_copies, fuse_zips)


def write(stream: Stream, directory, report: dict | None = None) -> Path:
    """Write DIR/instructions.txt (the text form) and DIR/cycles.json (`report`, or
    cycles(stream) when none is given); returns the instructions path."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    path = d / "instructions.txt"
    path.write_text(to_text(stream))
    (d / "cycles.json").write_text(json.dumps(report if report is not None else cycles(stream),
                                              indent=2, default=str) + "\n")
    return path


def read(path) -> Stream:
    """A stream from a file written by `write` (or to_text)."""
    return parse(Path(path).read_text())
