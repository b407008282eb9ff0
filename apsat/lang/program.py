"""Program: a term DAG in the access-pattern language with everything needed to run it.

A Program holds its output terms (by name), the shape of every tensor it names
(`tensor_shapes`), the element type of its float tensors (`tensor_types`: f32, f16 or bf16;
a tensor absent from it holds exact values, integers or booleans; apsat/lang/dtypes.py), and
the ONNX nodes behind its opaque calls (`opaque_nodes`, keyed by the call's name). Shapes and
types are checked when a Program is built, so a Program that exists is well-shaped and
well-typed; `shape_of(t)` and `dtype_of(t)` give any sub-term's.
"""
from __future__ import annotations

from dataclasses import InitVar, dataclass, field

from apsat.lang import dtypes
from apsat.lang.ops import OPS, AccessShape
from apsat.lang.term import Term, postorder
from apsat.errors import ParseError, ShapeError, UsageError


@dataclass(frozen=True)
class OpaqueNode:
    """An ONNX node the language does not cover, kept whole so onnxruntime can run it alone.

    `node` is the serialized NodeProto (bytes keep Programs picklable). The call's Expr
    arguments feed the node's inputs listed in `arg_inputs` (input positions, in argument
    order); inputs that were constants at import are in `constants` (position -> array).
    `input_types` are the ONNX element types of all inputs (arguments are cast to them),
    `output_index` says which output of the node the call yields, `opsets` the model's
    opset imports as (domain, version) pairs."""

    node: bytes
    arg_inputs: tuple[int, ...]
    constants: dict
    input_types: tuple[int, ...]
    output_index: int
    output_type: int
    opsets: tuple[tuple[str, int], ...]


def infer_shapes(roots, tensor_shapes: dict) -> dict[Term, AccessShape]:
    """Access shape of every term reachable from `roots`, children first.
    Raises ShapeError naming the op and the mismatch."""
    shapes: dict[Term, AccessShape] = {}
    for term in postorder(list(roots)):
        spec = OPS.get(term.op)
        if spec is None:
            raise ShapeError(f"unknown op {term.op!r}")
        shapes[term] = apply_shape_rule(term.op, term.args, shapes.__getitem__, tensor_shapes)
    return shapes


def apply_shape_rule(op: str, args: tuple, shape_of, tensor_shapes: dict) -> AccessShape:
    """The access shape of an `op` node with arguments `args` (as a Term holds them, except
    that Expr children may be any key), `shape_of(child)` giving each child's shape."""
    spec = OPS[op]
    arg_shapes = []
    for kind, value in zip(spec.signature, args):
        if kind == "expr":
            arg_shapes.append(shape_of(value))
        elif kind == "exprs":
            arg_shapes.append(tuple(shape_of(v) for v in value))
        elif kind == "access-shape":
            arg_shapes.append(tuple(value.args))
    return spec.shape(args, arg_shapes, tensor_shapes)


@dataclass
class Program:
    """Output terms plus the tensor shapes and opaque ONNX nodes they refer to.
    `weights`: the tensors whose values are known when the model is loaded (ONNX
    initializers); work that reads only those is done once, not per inference."""

    outputs: dict[str, Term]
    tensor_shapes: dict[str, tuple[int, ...]]
    opaque_nodes: dict[str, OpaqueNode] = field(default_factory=dict)
    weights: frozenset = frozenset()
    cost: float | None = None          # set by extractors: the cost of this choice
    extraction: dict | None = None     # set by extractors: method, seconds, notes
    tensor_types: dict = field(default_factory=dict)   # tensor -> "f32" | "f16" | "bf16"
    # Shapes already known for the outputs' terms (Term -> AccessShape), e.g. extraction's
    # e-class shapes, which egglog derived and checked: taken as they are when they cover
    # every term, so the chosen program is not shaped a second time. Not stored as a field.
    known_shapes: InitVar[dict | None] = None

    def __post_init__(self, known_shapes=None):
        self.tensor_shapes = {k: _dims(k, v) for k, v in self.tensor_shapes.items()}
        self.weights = frozenset(self.weights)
        terms = postorder(list(self.outputs.values())) if known_shapes is not None else ()
        if known_shapes is not None and all(t in known_shapes for t in terms):
            self._shapes = {t: known_shapes[t] for t in terms}
        else:
            self._shapes = infer_shapes(self.outputs.values(), self.tensor_shapes)
        self.tensor_types = {k: v for k, v in self.tensor_types.items() if v is not None}
        self._dtypes = dtypes.infer(self._shapes, self.tensor_types, lambda op: OPS[op].signature,
                                    self._opaque_type)

    def _opaque_type(self, term: Term):
        """An opaque call's element type: its ONNX node output's, when a float type."""
        node = self.opaque_nodes.get(term.args[0])
        return dtypes.NAMES.get(node.output_type) if node is not None else None

    def dtype_of(self, term: Term) -> str | None:
        """Element type of any sub-term: "f32", "f16", "bf16", or None for exact values
        (integers, booleans, literals), which are carried as float32."""
        return self._dtypes[term]

    def half_type(self) -> str | None:
        """The half type ("f16" or "bf16") some term computes in, None when none does."""
        return next((t for t in self._dtypes.values() if t in (dtypes.F16, dtypes.BF16)), None)

    def float_type(self) -> str:
        """The model's float type: the one float type its tensors have ("f32" when none
        or several)."""
        found = set(self.tensor_types.values())
        return found.pop() if len(found) == 1 else dtypes.F32

    @property
    def root(self) -> Term:
        """The single output term; UsageError (a ValueError) when the program has several."""
        if len(self.outputs) != 1:
            raise UsageError(f"program has {len(self.outputs)} outputs; use .outputs")
        return next(iter(self.outputs.values()))

    @property
    def shape(self) -> AccessShape:
        """Access shape ((iterated dims), (item dims)) of the single output."""
        return self._shapes[self.root]

    def shape_of(self, term: Term) -> AccessShape:
        """Access shape of any sub-term of this program."""
        return self._shapes[term]

    def terms(self) -> list[Term]:
        """Every distinct sub-term, children before parents (a new list each call)."""
        # The shapes were made over exactly this postorder, in this order (__post_init__):
        # the walk is not repeated (1.3 s over 16 calls on a 15k-term chain).
        return list(self._shapes)

    def tensor_names(self) -> list[str]:
        """The tensors the program reads (inputs and weights), in first-use order."""
        return [t.args[0] for t in self.terms() if t.op == "access-tensor"]

    def op_counts(self) -> dict[str, int]:
        """How many distinct nodes of each op (compute ops counted by operator)."""
        counts: dict[str, int] = {}
        for t in self.terms():
            key = f"compute {t.args[0].op}" if t.op == "compute" else t.op
            counts[key] = counts.get(key, 0) + 1
        return counts

    def to_text(self) -> str:
        """Surface syntax of the single output (tree form: shared terms written per use)."""
        from apsat.lang.syntax import to_text

        return to_text(self.root)

    def __repr__(self) -> str:
        n = len(self.terms())
        return f"<Program outputs={list(self.outputs)} nodes={n} shapes={[self._shapes[t] for t in self.outputs.values()]}>"


def parse(text: str, shapes: dict) -> Program:
    """Parse surface syntax into a single-output Program (output name "out").
    `shapes` maps every tensor name the text uses to its dims (non-negative ints).
    ParseError for text that does not parse, ShapeError for missing or bad shapes."""
    from apsat.lang.syntax import parse_term

    if not isinstance(text, str):
        raise ParseError(f"parse: expected program text (a str), not {type(text).__name__}")
    if not isinstance(shapes, dict):
        raise ShapeError(f"shapes must be a dict of tensor name -> dims, not {type(shapes).__name__}")
    return Program({"out": parse_term(text)}, dict(shapes))


def _dims(name, value) -> tuple[int, ...]:
    """A tensor's dims as a tuple of non-negative ints; ShapeError naming it otherwise."""
    try:
        dims = tuple(value)
        if all(int(d) == d and d >= 0 for d in dims):
            return tuple(int(d) for d in dims)
    except (TypeError, ValueError):
        pass
    raise ShapeError(f"tensor {name!r}: dims must be non-negative ints, not {value!r}")
