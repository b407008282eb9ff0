"""Model: an imported ONNX model, its program in the access-pattern language and weights.

    model = apsat.load_onnx("resnet50.onnx")      # apsat.frontend.importer.load_onnx
    model.inputs              # {"data": (1, 3, 224, 224)}: true inputs only
    model.run({"data": x})    # {"prob": array}: the program on the reference interpreter
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from apsat.lang.program import Program
from apsat.errors import ModelError


@dataclass
class Model:
    """`program` has one output per ONNX graph output (same names, dims = the ONNX
    shape); `inputs` maps each true input (no initializer) to its dims; `weights` maps
    every tensor the program reads besides the inputs to a float32 array (read-only
    broadcast views for ConstantOfShape fills); `onnx` is the ModelProto as loaded;
    `input_types` gives each input's ONNX element type (the program reads every value as
    float32: integers and booleans are carried exactly up to 2**24); `notices` are what
    the import decided for the user (a symbolic dim kept symbolic), one line each;
    `symbols` the symbolic dims (name -> apsat.frontend.symbols.Symbol, the program built
    at their values) and `signature` each input's declared dims (ints and symbol names);
    `generated` the weights that are a Range of symbolic length (name -> (start, delta)),
    which a program at another size computes afresh; `external` the initializers kept in
    external data (name -> read-only memmap; apsat.frontend.external), whose bytes `onnx`
    does not hold."""

    program: Program
    inputs: dict[str, tuple[int, ...]]
    weights: dict[str, np.ndarray]
    onnx: object
    path: Path | None = None
    import_seconds: float = 0.0
    input_types: dict[str, int] = field(default_factory=dict)
    notices: list[str] = field(default_factory=list)
    symbols: dict = field(default_factory=dict)
    signature: dict = field(default_factory=dict)
    generated: dict = field(default_factory=dict)
    external: dict = field(default_factory=dict)

    def run(self, inputs: dict) -> dict[str, np.ndarray]:
        """Evaluate the program with the reference interpreter: {output name: array of
        the output's ONNX element type}."""
        from apsat.lang.evaluate import evaluate

        missing = sorted(set(self.inputs) - set(inputs))
        extra = sorted(set(inputs) - set(self.inputs))
        if missing or extra:
            raise ModelError(f"run: missing inputs {missing}, unknown inputs {extra}; "
                             f"the model takes {sorted(self.inputs)}")
        for name, dims in self.inputs.items():
            if tuple(np.shape(inputs[name])) != tuple(dims):
                raise ModelError(f"run: input {name!r} has shape {np.shape(inputs[name])}, "
                                 f"the model takes {tuple(dims)}")
        result = evaluate(self.program, {**self.weights, **inputs})
        if not isinstance(result, dict):
            result = {next(iter(self.program.outputs)): result}
        return {name: self._as_declared(name, value) for name, value in result.items()}

    def _as_declared(self, name: str, value: np.ndarray) -> np.ndarray:
        """An output in its ONNX element type: the program carries integers and booleans
        as float32 (rounded back here, never truncated)."""
        from onnx import helper

        elem = next((o.type.tensor_type.elem_type for o in self.onnx.graph.output if o.name == name), 0)
        want = np.dtype(helper.tensor_dtype_to_np_dtype(elem)) if elem else np.dtype(np.float32)
        if want.kind in "biu":
            return np.rint(value).astype(want)
        return value if value.dtype == want else value.astype(want)

    def source_op_counts(self) -> dict[str, int]:
        """How many ONNX nodes of each op type the source graph has."""
        return dict(Counter(n.op_type for n in self.onnx.graph.node))

    def opaque_ops(self) -> dict[str, int]:
        """ONNX op types that became opaque calls, with how many calls each."""
        return dict(Counter(_op_type(n.node) for n in self.program.opaque_nodes.values()))

    def __repr__(self) -> str:
        name = self.path.name if self.path else "<ModelProto>"
        return (f"<Model {name} inputs={self.inputs} weights={len(self.weights)} "
                f"program={len(self.program.terms())} nodes, {len(self.program.opaque_nodes)} opaque>")


def _op_type(node_bytes: bytes) -> str:
    import onnx

    return onnx.NodeProto.FromString(node_bytes).op_type

