"""The chosen program for every value of the model's symbolic dims.

A model with symbolic dims (apsat.frontend.symbols) is imported, saturated and extracted
at representative values. `generalise(program, model)` then finds what every size in the
chosen program is for any value: it walks the program children first with the registry's
shape rules over symbolic dims (apsat.lang.dims.Dim) and reads each size a term states
(a reshape's or broadcast's target, a slice's bounds, an opaque call's result) against
the symbolic dims around it:

- a reshape's target is split into groups of equal element count with its operand, and
  the operand's symbolic dims are placed on the target dims whose value they have;
- a broadcast keeps its operand's dims and takes a new dim by value from the symbolic dims
  seen so far (and the symbols' products);
- a slice bound equal to its axis' full extent is that extent;
- a literal whole number is read like a size (the importer folded Shape into it: a row
  stride of a flattened index, a count to divide by).

Representative values are primes no fixed dim of the model equals, so a value names the
symbols it came from; where two symbolic dims could explain one size, or a constant folded
at import has a symbolic shape and is not one value repeated, or a window strides over a
symbolic dim, generalise raises NotGeneral naming the term. What it finds is checked: the
shapes at the representative values must be the program's, and `General.at(values)`
rebuilds the program, its inputs and weights at other values, shaped again by the
registry's rules (optimize verifies them against onnxruntime).
"""
from __future__ import annotations

import math
from itertools import product
from dataclasses import dataclass, field

import numpy as np

from apsat.errors import ShapeError
from apsat.frontend.symbols import fixed_dims
from apsat.lang.dims import Dim, NotGeneral, at, is_symbolic, parse, simplest
from apsat.lang.program import Program, apply_shape_rule
from apsat.lang.term import Term


class _Target:
    """An access-shape argument with symbolic dims, as apply_shape_rule reads one."""

    __slots__ = ("args",)

    def __init__(self, it: tuple, item: tuple):
        self.args = (it, item)


@dataclass
class General:
    """The program at its representative values, and what varies with the symbols:
    `args` the symbolic arguments of the terms that have any, `tensor_dims` each tensor's
    dims (ints and Dims), `fills` how each weight whose shape is symbolic is made at a
    size: ("fill", value) or ("range", start, delta); `varying` the terms whose shapes
    follow the symbols."""

    program: Program
    symbols: dict
    args: dict = field(default_factory=dict)
    tensor_dims: dict = field(default_factory=dict)
    fills: dict = field(default_factory=dict)
    varying: set = field(default_factory=set)

    @property
    def representative(self) -> dict[str, int]:
        return {name: s.value for name, s in self.symbols.items()}

    def at(self, values: dict[str, int], weights: dict) -> tuple[Program, dict, dict, set]:
        """(program, weights, input dims, varying terms) for the symbols' `values` (all of
        them); `weights` are the model's. ShapeError where a size does not hold there."""
        rebuilt: dict[Term, Term] = {}
        for term in self.program.terms():
            args = self.args.get(term, term.args)
            new = tuple(_concrete(a, values, rebuilt) for a in args)
            rebuilt[term] = Term(term.op, (float(new[0]),) if term.op == "access-literal" else new)
        shapes = {name: at(dims, values) for name, dims in self.tensor_dims.items()}
        if any(d <= 0 for dims in shapes.values() for d in dims):
            raise ShapeError(f"a tensor has no elements at {values}")
        program = Program({n: rebuilt[t] for n, t in self.program.outputs.items()}, shapes,
                          self.program.opaque_nodes, self.program.weights,
                          tensor_types=self.program.tensor_types)
        new_weights = dict(weights)
        for name, (kind, *how) in self.fills.items():
            if kind == "range":
                start, delta = how
                new_weights[name] = (start + delta * np.arange(shapes[name][0])).astype(np.float32)
            else:
                new_weights[name] = np.broadcast_to(np.float32(how[0]), shapes[name])
        inputs = {n: shapes[n] for n in self.tensor_dims if n not in weights}
        return program, new_weights, inputs, {rebuilt[t] for t in self.varying}


def _concrete(arg, values, rebuilt):
    """One argument at `values`: a child rebuilt, sizes evaluated, an opaque call's tuple
    of children item by item."""
    if isinstance(arg, Term):
        return rebuilt.get(arg, arg)
    if isinstance(arg, _Target):
        return Term("access-shape", at(arg.args, values))
    if isinstance(arg, tuple) and any(isinstance(a, Term) for a in arg):
        return tuple(_concrete(a, values, rebuilt) for a in arg)
    return at(arg, values)


def generalise(program: Program, model, scaled: bool | None = None) -> General:
    """The General form of `program` (extracted from `model`'s e-graph); NotGeneral when a
    size in it holds only at the representative values. `scaled`: whether a size that is
    a small multiple of a symbolic dim by value (2 * batch heads) is read so; None: so
    first, and as a constant where that reading does not hold together (22 = 2 * 11 where
    a grid has 22 cells)."""
    if scaled is not None:
        return _generalise(program, model, scaled)
    try:
        return _generalise(program, model, scaled=True)
    except NotGeneral:
        return _generalise(program, model, scaled=False)


def _generalise(program: Program, model, scaled: bool) -> General:
    symbols = model.symbols
    syms = {name: Dim.symbol(name, s.value) for name, s in symbols.items()}
    vocab = _Vocabulary(syms.values(), fixed_dims(model.onnx) if getattr(model, "onnx", None) else set(),
                        scaled)
    general = General(program, symbols)
    for name, dims in program.tensor_shapes.items():
        if name in model.signature:
            general.tensor_dims[name] = tuple(d if not isinstance(d, str) else syms[d] if d in syms
                                              else simplest(parse(d, syms)) for d in model.signature[name])
            vocab.add((general.tensor_dims[name],))
        else:
            general.tensor_dims[name] = _weight_dims(name, dims, model.weights.get(name), vocab, general.fills,
                                                     model.generated.get(name))
    shapes: dict[Term, tuple] = {}
    for term in program.terms():
        if term.op == "opaque":
            _opaque_constants(term, program, vocab)
        args = _symbolic_args(term, shapes, vocab)
        if any(is_symbolic(a.args if isinstance(a, _Target) else a) for a in args if not isinstance(a, Term)):
            general.args[term] = args
        try:
            shape = apply_shape_rule(term.op, args, shapes.__getitem__, general.tensor_dims)
        except ShapeError as e:
            raise NotGeneral(f"{term.op}: with its sizes read symbolically, {e}") from None
        shape = tuple(tuple(simplest(d) for d in part) for part in shape)
        if at(shape, general.representative) != tuple(program.shape_of(term)):
            raise NotGeneral(f"{term.op}: symbolic shape {shape} does not give the program's "
                             f"{program.shape_of(term)}")
        vocab.add(shape)
        shapes[term] = shape
        if is_symbolic(shape):
            general.varying.add(term)
    return general


def _opaque_constants(term: Term, program: Program, vocab) -> None:
    """An opaque call (onnxruntime runs its ONNX node) keeps its constant inputs as
    imported: one sized by a symbol fixes the call to the representative sizes."""
    node = program.opaque_nodes.get(term.args[0])
    for arr in (node.constants.values() if node else ()):
        if any(d > 1 and d in vocab.by_value for d in np.shape(arr)):
            raise NotGeneral(f"opaque call {term.args[0]!r} holds a constant of shape {np.shape(arr)}, "
                             "sized by the symbolic dims")


class _Vocabulary:
    """The symbolic dims seen so far, by representative value: what a size that states a
    value (a broadcast target, a slice bound) can be besides a constant."""

    def __init__(self, symbols, fixed=frozenset(), scaled: bool = True):
        symbols = list(symbols)
        self.scaled = scaled
        self.fixed = set(fixed) - {s.rep for s in symbols}
        self.reps = {next(iter(s.symbols())): s.rep for s in symbols}
        self.by_value: dict[int, set] = {}
        for i, a in enumerate(symbols):
            self._put(a)
            for b in symbols[i:]:
                self._put(a * b)

    def _put(self, d: Dim):
        self.by_value.setdefault(d.rep, set()).add(d)

    def add(self, shape):
        for part in shape:
            for d in part:
                if isinstance(d, Dim) and not d.is_const:
                    self._put(d)

    def read(self, value: int, where: str, scaled: bool = False):
        """`value` as the one symbolic dim with that value, else as the int: a fixed size of
        the model (a width of 512) stays a constant even where an expression of the symbols
        has that value too (128 * (batch - 1) at batch 5). `scaled`: also a small multiple
        of one (a ConstantOfShape fill of (2 * batch, seq, seq), read before any shape of
        the program has shown 2 * batch)."""
        found = self.by_value.get(value)
        if not found and scaled and self.scaled and value not in self.fixed:
            found = {c * d for c in range(2, 17) if value % c == 0
                     for d in self.by_value.get(value // c, ()) if not d.is_const}
        if not found or value in self.fixed:
            return value
        if len(found) > 1:
            raise NotGeneral(f"{where}: size {value} could be any of {sorted(map(repr, found))}")
        return next(iter(found))


def _weight_dims(name, dims, array, vocab, fills, generated=None) -> tuple:
    """A weight's dims; one with a symbolic dim (a constant folded at import from the
    shapes) must be a Range (`generated`, (start, delta)) or one value repeated, recorded
    in `fills` as ("range", start, delta) or ("fill", value)."""
    out = tuple(simplest(vocab.read(d, f"constant {name!r}", scaled=True)) for d in dims)
    if is_symbolic(out) and generated is not None:
        fills[name] = ("range",) + tuple(generated)
    elif is_symbolic(out):
        flat = None if array is None else np.asarray(array).ravel()
        if flat is None or flat.size == 0 or not np.all(flat == flat[0]):
            raise NotGeneral(f"constant {name!r} of shape {tuple(dims)} was folded at import "
                             f"from the symbolic dims ({out}) and holds more than one value")
        fills[name] = ("fill", float(flat[0]))
    return out


def _symbolic_args(term: Term, shapes: dict, vocab: _Vocabulary) -> tuple:
    """The term's arguments with the sizes it states read symbolically."""
    op, args = term.op, term.args
    if op == "access-reshape":
        it, item = shapes[args[0]]
        new_it, new_item = args[1].args
        dims = _reshape_target(it + item, new_it + new_item, vocab.reps, op)
        return (args[0], _Target(dims[:len(new_it)], dims[len(new_it):]))
    if op == "access-broadcast":
        it, item = shapes[args[0]]
        new_it, new_item = args[1].args
        dims = tuple(s if (s.rep if isinstance(s, Dim) else s) == d else vocab.read(d, op, scaled=True)
                     for s, d in zip(it + item, new_it + new_item))
        return (args[0], _Target(dims[:len(new_it)], dims[len(new_it):]))
    if op == "access-slice":
        it, item = shapes[args[0]]
        axis, lo, hi = args[1], args[2], args[3]
        extent = (it + item)[axis] if 0 <= axis < len(it + item) else None
        return (args[0], axis, _bound(lo, extent, vocab, op), _bound(hi, extent, vocab, op))
    if op == "access-literal":     # a size computed into a value (an index stride, a count)
        v = args[0]
        if float(v).is_integer() and abs(v) > 1:         # -n: an index counted from the end
            return (simplest(vocab.read(int(v), op)) if v > 0 else -simplest(vocab.read(int(-v), op)),)
    if op == "opaque":
        return args[:2] + (tuple(simplest(vocab.read(d, op)) for d in args[2]),)
    if op in ("access-windows", "access-dilated-windows"):
        it, item = shapes[args[0]]
        if is_symbolic(item) and any(s != 1 for s in args[2]):
            raise NotGeneral(f"{op}: a stride of {args[2]} over the symbolic dims {item}")
    return args


def _bound(value: int, extent, vocab, where: str):
    """A slice bound: the axis' extent where it has its value, fixed or symbolic (80 on an
    axis of 80 is the end, not 16 * batch at batch 5); else read by value (positions
    sliced to the sequence length: 31 of 64 rows)."""
    if extent is not None and (extent.rep if isinstance(extent, Dim) else extent) == value:
        return extent
    return simplest(vocab.read(value, where)) if value > 1 else value


def _reshape_target(src: tuple, target: tuple, reps: dict[str, int], where: str) -> tuple:
    """The reshape target `target` (ints) of symbolic dims `src`, group by group: the
    group's symbolic factors spread over its target dims (_spread)."""
    out: list = []
    for s_group, t_group in _groups(src, target):
        count = math.prod(s_group, start=Dim.of(1))
        dims = _spread(s_group, list(t_group), reps, where) if is_symbolic(count) else list(t_group)
        if math.prod(dims, start=Dim.of(1)) != count:
            raise NotGeneral(f"{where}: target {t_group} does not keep the {count} elements of {s_group}")
        out.extend(simplest(d) for d in dims)
    return tuple(out)


def _atoms(dims, reps: dict[str, int]) -> tuple[int, list]:
    """(constant, factors): the dims as a whole number times symbolic factors that a
    reshape cannot split further: each symbol of a monomial, a sum (`past + seq`) whole."""
    constant, factors = 1, []
    for d in dims:
        d = Dim.of(d)
        if d.is_const:
            constant *= d.rep
        elif len(d.terms) == 1:
            (mono, c), = d.terms.items()
            constant *= c
            factors.extend(Dim.symbol(s, reps[s]) for s, e in mono for _ in range(e))
        else:
            g = math.gcd(*d.terms.values())
            constant *= g
            core = d // g
            factors.append(Dim(core.terms, core.at(reps)))
    return constant, factors


def _spread(src: tuple, values: list[int], reps: dict[str, int], where: str) -> list:
    """Target dims of values `values` for the symbolic dims `src` of the same element
    count: each symbolic factor of `src` goes to a dim whose value its representative
    divides, every dim keeping a whole constant; exactly one such placement, or NotGeneral."""
    constant, factors = _atoms(src, reps)
    found = set()
    for places in product(range(len(values)), repeat=len(factors)):
        sym = [1] * len(values)
        for f, j in zip(factors, places):
            sym[j] *= f.rep
        if all(v % p == 0 for v, p in zip(values, sym)) and math.prod(v // p for v, p in zip(values, sym)) == constant:
            found.add(tuple(sorted((repr(f), j) for f, j in zip(factors, places))))
    if len(found) != 1:
        raise NotGeneral(f"{where}: cannot place the symbolic dims of {src} on the target dims {tuple(values)}")
    placed = dict.fromkeys(range(len(values)), Dim.of(1))
    for f, j in zip(factors, next(p for p in product(range(len(values)), repeat=len(factors))
                                  if tuple(sorted((repr(f), j) for f, j in zip(factors, p))) in found)):
        placed[j] = placed[j] * f
    return [simplest((v // placed[j].rep) * placed[j]) for j, v in enumerate(values)]


def _groups(src: tuple, target: tuple) -> list:
    """(src dims, target values) in the smallest groups of equal element count at the
    representative values; size-1 dims join the group before them."""
    reps = [d.rep if isinstance(d, Dim) else d for d in src]
    ps, pt = _prefix(reps), _prefix(target)
    common = sorted(set(ps) & set(pt))
    cuts = [(max(i for i, p in enumerate(ps) if p == v), max(i for i, p in enumerate(pt) if p == v))
            for v in common]
    groups, (i0, j0) = [], (0, 0)
    for i, j in cuts:
        if (i, j) != (i0, j0) or not groups:
            groups.append((tuple(src[i0:i]), tuple(target[j0:j])))
        i0, j0 = i, j
    return [g for g in groups if g[0] or g[1]]


def _prefix(values) -> list[int]:
    out, p = [1], 1
    for v in values:
        p *= v
        out.append(p)
    return out

