"""Lowering: an extracted Program becomes a kernel graph for the gpu target.

Each kernel is one fused region:

* **gemm**: `fused-dot-bias(-act)`, `systolic-array`, or `compute dot-product` over a
  pair or cartesian product whose operands vary along different output axes (a batched
  matmul; an im2col convolution reads its windows straight from the padded input). The
  epilogue applies the bias and activation, and may go on with an element-wise consumer
  chain (a residual add, a scale, an activation) when the kernel's result has no other
  consumer.
* **reduce**: reduce-sum/max/mean (pooling, global mean), softmax, layer-norm, rms-norm, and
  dot-products without two matrix sides (a matrix-vector product or a row-wise dot), one
  row of the item dims per output; the same epilogue chains (layer norm's scale and
  shift).
* **attention**: the `attention` atom, FlashAttention-style (attention.py): scores,
  online softmax and p.v in one kernel; element-wise terms feeding its operands (a scale
  of q) are read inside its loads, and an element-wise consumer chain rides on its
  epilogue as on a gemm's. An atom the kernel cannot read is lowered as its expansion
  (the unfused dot-product, softmax and dot-product), never as a host step of its own.
* **elementwise**: a chain of element-wise operators (add, mul, relu, gelu, ...), each
  inlined into its single consumer (a `chain F G` operator is such a chain in one term);
  also the copy of an output that is only a view.

A root needs no kernel of its own where inline.py says so: a point-wise chain rides on
its producer's epilogue, or else on its one consumer kernel's operand loads (a prologue:
DenseNet's BatchNorm and ReLU before each convolution); a reduction over a few values
(Inception's 3x3 pool before its 1x1 projection, a depthwise 3x3 before the pointwise
convolution) is unrolled in its consumer's loads.

Views (access, transpose, reshape, windows, pad, slice, concatenate, broadcast, pair,
cartesian product) never run as kernels: they become the indexing of the kernels that read
them (apsat/backends/gpu/views.py). What no kernel can express becomes a **host step**:
an opaque ONNX node runs in onnxruntime, anything else the views refuse runs in the
reference interpreter. Each host step carries its op and the reason, for the report;
nothing is dropped silently.

`lower(program)` returns a KernelGraph (apsat/backends/gpu/graph.py): the steps in
execution order, the buffers they read and write, and which buffer holds each program
output. The matmul and reduction kernels themselves are described in regions.py.
"""
from __future__ import annotations

import math
import re

from apsat.backends.gpu import tiling
from apsat.backends.gpu.attention import expansion as attention_expansion
from apsat.backends.gpu.epilogue import epilogue_path, invert_path
from apsat.backends.gpu.expr import flat, value_nodes, var
from apsat.backends.gpu.folds import row_stats
from apsat.backends.gpu.graph import HALF, Buffer, HostStep, Kernel, KernelGraph
from apsat.backends.gpu.inline import Inlining, is_kernel_op
from apsat.backends.gpu.regions import ROW_NORMALISATIONS, covered_ops, natural
from apsat.backends.gpu.views import (
    NeedsBuffer,
    Unsupported,
    Values,
    dims_of,
    is_elementwise,
    n_iter,
)
from apsat.lang import dtypes
from apsat.lang.formula import FUNCTION_FLOPS
from apsat.lang.program import Program
from apsat.lang.term import Term

# Arithmetic per evaluation of a kernel function: the registry formulas' figures.
FN_FLOPS = FUNCTION_FLOPS


def _ident(name: str, taken: set) -> str:
    """An identifier for a tensor name, unique among `taken`."""
    base = re.sub(r"\W", "_", name) or "t"
    if base[0].isdigit() or base in ("out", "acc", "tl", "triton"):
        base = "in_" + base
    cand, k = base, 1
    while cand in taken:
        cand, k = f"{base}_{k}", k + 1
    taken.add(cand)
    return cand


# ---- the lowering -------------------------------------------------------------------------------

def lower(program: Program, tiles: dict | None = None, tuned=None) -> KernelGraph:
    """The kernel graph of `program` (see the module doc).

    tiles: optional tile parameters, by kernel name or by kind ("gemm", "reduce",
    "attention", "elementwise"), each a dict such as {"BM": 32, "BN": 32, "BK": 16}.
    tuned: a tuning.TuningCache; a kernel whose shape it holds takes the tuned tiles.
    The others come from the roofline search in apsat/backends/gpu/tiling.py.

    Which products share a gemm is not decided here: the program comes with its sibling
    products merged or not, as extraction and the planner chose (apsat/rules/merge.egg,
    apsat/extract/sharing.py, apsat/pipeline/plan.py)."""
    return _Lowering(program, tiles or {}, tuned).run()


class _Lowering:
    def __init__(self, program: Program, tiles: dict, tuned=None):
        self.p, self.tiles, self.tuned = program, tiles, tuned
        self.order = program.terms()
        self.inlining = Inlining(program, self.order)
        self.uses, self.parents = self.inlining.uses, self.inlining.parents
        self.outputs = self.inlining.outputs
        self.buffers: dict[str, Buffer] = {}
        self.term_buf: dict[Term, tuple[str, tuple]] = {}   # materialised term -> (name, dims)
        self.steps: list = []
        self._names: set = set()

    def _new_buffer(self, dims, kind, tensor=None, name=None, dtype=None) -> str:
        name = _ident(name or f"t{len(self.buffers)}", self._names)
        self.buffers[name] = Buffer(name, tuple(dims), kind, tensor, dtype or dtypes.F32)
        return name

    def _dtype(self, term: Term) -> str:
        """The element type of term's buffer: the program's type, f32 for exact values
        (carried as float32) and for a term the program does not type."""
        try:
            return self.p.dtype_of(term) or dtypes.F32
        except KeyError:
            return dtypes.F32

    def run(self) -> KernelGraph:
        p = self.p
        roots = []       # materialised terms that need a step, in order
        for t in self.order:
            if t.op == "access-tensor":
                name = self._new_buffer(p.tensor_shapes[t.args[0]], "input", t.args[0], t.args[0],
                                        p.tensor_types.get(t.args[0]))
                self.term_buf[t] = (name, dims_of(p, t))
            elif t.op == "opaque" or is_kernel_op(t) or (
                    is_elementwise(t) and not self.inlining.inline_elementwise(t)):
                roots.append(t)
        roots, claimed = self.inlining.kernels(roots)
        producers = {c[0] for c in claimed.values()}
        for t in roots:
            if t in producers:
                continue
            if t in claimed:
                producer, path = claimed[t]
                self._step(t, producer, path)
            else:
                self._step(t, None, None)
        outputs = {}
        for name, t in p.outputs.items():
            if t in self.term_buf and self.buffers[self.term_buf[t][0]].kind != "input":
                outputs[name] = self.term_buf[t][0]
            else:                      # a view (or an input itself): copy it out
                outputs[name] = self._copy(t, f"copy of output {name}")
        return KernelGraph(self.steps, self.buffers, outputs, frozenset(p.weights), frozenset(self.term_buf))

    # -- steps
    def _step(self, t: Term, producer, path):
        """Build the step computing t (with `producer`'s kernel computing it in its
        epilogue when given); a term no kernel can express becomes a host step."""
        if t.op == "opaque":
            self._host(t, "onnxruntime", f"ONNX {_onnx_op(self.p, t)} is outside the language "
                                         "(an opaque call): no kernel is generated for it")
            return
        try:
            if producer is not None:
                try:
                    self._kernel(producer, t, path)
                    return
                except NeedsBuffer:
                    raise
                except Unsupported:
                    self._step(producer, None, None)     # un-fuse: producer, then the chain
            self._kernel(t, None, None)
        except NeedsBuffer as e:     # a norm or a view this kernel cannot read inline
            self._own_buffer(self._with_affine(e.term))
            self._step(t, producer, path)
        except Unsupported as e:
            if t.op == "attention":      # no attention kernel: the unfused terms instead
                self._unfused_attention(t)
                return
            self._host(t, "reference", str(e))

    def _unfused_attention(self, t: Term):
        """Attention atom t as its expansion (attention.expansion: the scores' product,
        the softmax, the p.v product), each term lowered as any is; t's buffer is the
        last one's."""
        self.p, terms = attention_expansion(self.p, t)
        for u in terms:
            if u not in self.term_buf:
                self._step(u, None, None)
        self.term_buf[t] = self.term_buf[terms[-1]]

    def _name(self, kind: str, t: Term) -> str:
        label = t.args[0].op if t.op == "compute" else (
            t.args[0].op if t.op == "fused-dot-bias-act" else t.op)
        label = re.sub(r"[^a-z0-9]+", "_", label)
        # the attention atom's kernel is named by its kind alone (not k07_attention_attention)
        return f"k{len(self.steps):02d}_{kind}" + ("" if label == kind else f"_{label}")

    def _finish(self, kernel: Kernel, vals: Values, out_term: Term | None, out_dims, typed=None):
        """Register the kernel's output buffer (of the type of `typed`, default out_term)
        and figures and append it."""
        biggest = max([math.prod(out_dims)] + [math.prod(d) for d in vals.read.values()])
        if biggest >= 2 ** 31:
            raise Unsupported(f"a buffer of {biggest:,} elements needs 64-bit indexing, "
                              "which the generated kernels do not use")
        kernel.stats = row_stats(kernel, vals)
        typed = out_term if typed is None else typed
        out = self._new_buffer(out_dims, "kernel", dtype=self._dtype(typed) if typed is not None else None)
        if out_term is not None:
            self.term_buf[out_term] = (out, tuple(out_dims))
        kernel.out = out
        kernel.reads = list(vals.read)
        kernel.elements_read = float(sum(math.prod(d) for d in vals.read.values()))
        kernel.elements_written = float(math.prod(out_dims))
        kernel.types = {b: self.buffers[b].dtype for b in [out, *kernel.reads]}
        # bytes at each buffer's width: for f32 buffers exactly (elements) * 4, as before types
        kernel.bytes_moved = float(sum(math.prod(d) * dtypes.BYTES[kernel.types[r]] for r, d in vals.read.items())
                                   + math.prod(out_dims) * dtypes.BYTES[kernel.types[out]])
        self._tile(kernel)
        self.steps.append(kernel)

    def _tile(self, k: Kernel):
        given = self.tiles.get(k.name) or self.tiles.get(k.kind)
        if not given and self.tuned is not None:
            given = self.tuned.tiles(k)
        a = {g: math.prod(d) for g, d in k.axes.items()}
        if k.kind == "gemm":
            k.tiles = dict(given) if given else tiling.gemm_tiles(a["b"], a["m"], a["n"], a["k"])
        elif k.kind == "reduce":
            k.tiles = dict(given) if given else tiling.reduce_tiles(a["r"], a["c"], k.bytes)
        elif k.kind == "attention":
            k.tiles = dict(given) if given else tiling.attention_tiles(
                a["b"], a["m"], a["n"], a["d"], a["e"], k.elements_read)
        else:
            k.tiles = dict(given) if given else tiling.elementwise_tiles(a["o"], k.bytes)

    def _host(self, t: Term, runner: str, reason: str):
        """A host step for t: its materialised descendants become named tensors. Its
        terms are rebuilt children first on an explicit stack, in the order a depth-first
        walk reaches them (so are the reads): a host step may sit on a chain thousands of
        terms deep, which recursion would follow frame by frame."""
        shapes, reads = {}, []
        memo: dict = {}

        def rebuild(term):
            """term over its children's replacements in `memo`."""
            kids = set(term.children())
            return Term(term.op, tuple(
                memo[a] if isinstance(a, Term) and a in kids else
                tuple(memo[x] for x in a) if isinstance(a, tuple) and a and all(isinstance(x, Term) for x in a)
                else a for a in term.args))

        stack = list(reversed(list(t.children())))
        while stack:
            term = stack[-1]
            if term in memo:
                stack.pop()
            elif term in self.term_buf:
                name, dims = self.term_buf[term]
                if name not in shapes:
                    shapes[name] = dims
                    reads.append(name)
                memo[stack.pop()] = Term("access", (Term("access-tensor", (name,)), n_iter(self.p, term)))
            else:
                todo = [c for c in term.children() if c not in memo]
                stack.extend(reversed(todo))
                if not todo:
                    memo[stack.pop()] = rebuild(term)
        root = rebuild(t)
        keys = {u.args[0] for u in memo.values() if u.op == "opaque"} | (
            {t.args[0]} if t.op == "opaque" else set())
        prog = Program({"out": root}, shapes, {k: self.p.opaque_nodes[k] for k in keys
                                               if k in self.p.opaque_nodes})
        out = self._new_buffer(dims_of(self.p, t), "host", dtype=self._dtype(t))
        self.term_buf[t] = (out, dims_of(self.p, t))
        label = f"opaque {_onnx_op(self.p, t)}" if t.op == "opaque" else t.op
        name = f"h{len(self.steps):02d}_{re.sub(r'[^a-z0-9]+', '_', label.lower())}"
        self.steps.append(HostStep(name, out, reads, prog, label, runner, reason))

    def _copy(self, t: Term, what: str, keep: bool = False) -> str:
        """An element-wise kernel materialising a view (or input): a program output, or
        (keep) a view its readers take from the buffer from now on."""
        d = dims_of(self.p, t)
        idx = tuple(var(f"o{k}", n) for k, n in enumerate(d))
        vals = Values(self.p, self.term_buf)
        k = Kernel(f"k{len(self.steps):02d}_elementwise_copy", "elementwise", "", [],
                   {"o": d}, {"out": vals.value(t, idx)}, None, [what])
        k.flops = 0.0
        self._finish(k, vals, t if keep else None, d, typed=t)
        return k.out

    def _with_affine(self, term: Term) -> Term:
        """A normalisation materialised after all takes its point-wise tail (its scale and
        shift) in its kernel's epilogue: the tail's root is what gets the buffer, computed
        once, where the readers' loads would redo it per tile (and the ONNX export writes
        one LayerNormalization with its scale and bias). Any other term: itself."""
        if not (term.op == "compute" and term.args[0].op in ROW_NORMALISATIONS):
            return term
        root, c = term, self.inlining.consumer(term)
        while c is not None and is_elementwise(c[0]) and c[0] not in self.term_buf:
            root, c = c[0], self.inlining.consumer(c[0])
        if root is term:
            return term
        found = epilogue_path(self.p, root, lambda q: q is term, self.uses, {term})
        if found is None:
            return term
        self._step(root, term, found[1])
        return root

    def _own_buffer(self, term: Term):
        """Give `term` a buffer of its own: its kernel, or for a view a copy; a view under
        it that the copy cannot read inline either is copied first (a loop, not recursion:
        a shuffling chain can be long)."""
        pending = [term]
        while pending:
            u = pending[-1]
            if u in self.term_buf:
                pending.pop()
            elif is_kernel_op(u) or is_elementwise(u):
                pending.pop()
                self._step(u, None, None)
            else:
                try:
                    self._copy(u, f"copy of {u.op} (its readers' index would outgrow a kernel)", keep=True)
                    pending.pop()
                except NeedsBuffer as e:
                    pending.append(e.term)

    def _kernel(self, t: Term, chain: Term | None, path):
        """The kernel computing t; with `chain`, the kernel stores chain's value instead
        (t's result is the chain's operand reached through `path`)."""
        p = self.p
        buffers = dict(self.term_buf)
        if is_elementwise(t):
            d = dims_of(p, t)
            idx = tuple(var(f"o{k}", n) for k, n in enumerate(d))
            vals = Values(p, buffers)
            out = vals._compute(t, idx, ())
            k = Kernel(self._name("elementwise", t), "elementwise", "", [], {"o": d},
                       {"out": out}, None, covered_ops(p, t, buffers))
            k.flops = _ops(out) * math.prod(d)
            self._finish(k, vals, t, d)
            return
        spec = natural(p, t, buffers)
        out_term, out_dims = t, dims_of(p, t)
        covers = spec.pop("covers")
        if chain is not None:
            o = invert_path(p, path, spec["p"])
            vals = Values(p, buffers, {t: spec["post"]}, stats=spec["vals"].stats)
            value = vals.value(chain, o)
            store, out_term, out_dims = flat(o, dims_of(p, chain)), chain, dims_of(p, chain)
            covers = covers + covered_ops(p, chain, buffers, stop=t)
        else:
            vals, value, store = spec["vals"], spec["post"], flat(spec["p"], out_dims)
        # the operand reads first, so kernel arguments follow the data flow
        reads = dict(spec["vals"].read)
        reads.update(vals.read)
        vals.read = reads
        kind = spec["kind"]
        values = dict(spec["values"], out=value)
        k = Kernel(self._name(kind, t), kind, "", [], spec["axes"], values, store, covers,
                   op=spec.get("op", ""), eps=spec.get("eps", 0.0))
        if kind in ("gemm", "attention") and self._dtype(t) in HALF:
            k.operand = self._dtype(t)      # a product's type is its operands' (dtypes.KEEPS)
        out_elems = math.prod(out_dims)
        a = {g: math.prod(dd) for g, dd in spec["axes"].items()}
        if kind == "gemm":
            k.flops = 2.0 * a["b"] * a["m"] * a["n"] * a["k"] + _ops(value) * out_elems
        elif kind == "attention":      # the registry's figure, plus an epilogue chain's
            k.flops = spec["flops"] + _ops(value) * out_elems
        else:
            per = 1 + _ops(values["elem"]) + (2 if spec["op"] in ROW_NORMALISATIONS else 0)
            k.flops = float(a["r"] * a["c"] * per + _ops(value) * out_elems)
        self._finish(k, vals, out_term, out_dims)


def _onnx_op(program, t: Term) -> str:
    """The ONNX op type behind an opaque call ("?" if its node is missing)."""
    node = program.opaque_nodes.get(t.args[0])
    if node is None:
        return "?"
    import onnx

    return onnx.NodeProto.FromString(node.node).op_type


def _ops(value) -> int:
    """Arithmetic of one evaluation of a value expression (shared parts counted once)."""
    return sum(FN_FLOPS.get(v[1], 1) for v in value_nodes(value) if v[0] == "call") \
        + sum(1 for v in value_nodes(value) if v[0] == "where")


__all__ = ["Buffer", "HostStep", "Kernel", "KernelGraph", "Unsupported", "lower"]
