"""Which terms run inside other kernels instead of as kernels of their own.

The lowering (lower.py) makes a kernel of every matmul, reduction and attention term and
of every element-wise chain no element-wise consumer takes in. `Inlining` then decides
which of those roots need no kernel:

* **epilogues**: a point-wise chain rides on the epilogue of the kernel producing its
  operand (a bias, an activation, a residual add after a matmul), when the path back to
  that producer is point-wise steps and bijective views (epilogue.epilogue_path);
* **prologues**: a chain no producer takes is computed in its one consumer kernel's
  operand loads (DenseNet's BatchNorm and ReLU before each convolution, a
  squeeze-excitation's channel scale before the projection);
* **norms read through their row statistics**: a layer-norm or rms-norm whose readers
  are all gemms (its scale and shift inlined with it) is computed in each reader's loads,
  each working out its rows' statistics first (folds.normalised);
* **unrolled reductions**: a reduction over a few values (a 3x3 pool, a depthwise 3x3
  convolution) is folded inside its one consumer kernel's loads (views.Values), when
  that consumer reads each of its values once per tile.

Weight-only terms are never inlined: they are weight preparation, run once at load time
(KernelGraph.prepare_steps), and inlining them would redo it on every inference.
"""
from __future__ import annotations

import math

from apsat.backends.gpu.epilogue import ONE_READ_VIEWS, epilogue_path
from apsat.backends.gpu.expr import value_nodes
from apsat.backends.gpu.folds import NORMALISED, taps
from apsat.backends.gpu.regions import REDUCTIONS, natural
from apsat.backends.gpu.views import (
    UNROLL_LIMIT,
    UNROLLED_REDUCTIONS,
    Unsupported,
    dims_of,
    is_elementwise,
    leading,
    n_iter,
)
from apsat.lang.ops import ATOM_OPS, ELEMENTWISE_OPS
from apsat.lang.program import Program
from apsat.lang.term import Term

WINDOWS = ("access-windows", "access-dilated-windows")


def uses_of(program: Program, order: list[Term]):
    """Consumer slots per term (an output counts as one) and each term's (parent, slot)."""
    uses: dict[Term, int] = {}
    parents: dict[Term, list] = {}
    for t in order:
        for slot, c in enumerate(t.children()):
            uses[c] = uses.get(c, 0) + 1
            parents.setdefault(c, []).append((t, slot))
    for t in program.outputs.values():
        uses[t] = uses.get(t, 0) + 1
    return uses, parents


def is_kernel_op(t: Term) -> bool:
    """A term that is a kernel of its own unless inlined: an atom or a reducing compute."""
    return t.op in ATOM_OPS or (t.op == "compute" and t.args[0].op in REDUCTIONS)


def is_view(t: Term) -> bool:
    """An access pattern: never run, only indexing of the kernels reading it."""
    return t.op not in ("compute", "opaque", "access-tensor", "access-literal") \
        and t.op not in ATOM_OPS


def reads_per_element(program, w: Term) -> float:
    """How many windows of `w` (access-windows) read each element of its operand, on
    average: 1 for a 1x1 convolution's windows, about 9 for a 3x3 one's."""
    child, window = w.args[0], w.args[1]
    n, r = n_iter(program, child), len(window)
    positions = dims_of(program, w)[n:n + r]
    return math.prod(pos * k for pos, k in zip(positions, window)) / math.prod(dims_of(program, child)[n:n + r])


class Inlining:
    """The inlining decisions over one program (see the module doc)."""

    def __init__(self, program: Program, order: list[Term]):
        self.p, self.order = program, order
        self.uses, self.parents = uses_of(program, order)
        self.outputs = set(program.outputs.values())
        self._weights_memo: dict[Term, bool] = {}
        self._probe: dict | None = None
        self._kernel_terms: set | None = None      # rides_on_producer's candidates, made once

    def consumer(self, t: Term):
        """The first non-view consumer of t and the slot it reads t's data through, if
        t's value reaches exactly one consumer (through single-use views), else None."""
        if t in self.outputs or self.uses.get(t, 0) != 1:
            return None
        p, slot = self.parents[t][0]
        while is_view(p):
            if p in self.outputs or self.uses.get(p, 0) != 1:
                return None
            p, slot = self.parents[p][0]
        return p, slot

    def inline_elementwise(self, t: Term) -> bool:
        """Element-wise t is computed inside its consumer: the consumer is element-wise,
        t is the bias of a fused matmul (read once per output element in the epilogue),
        or an attention operand's prologue (ViT scales q and k before the product).
        Epilogue first: where the element-wise consumer reads t's values more than once
        (through a broadcast, a concatenation or a local operator such as LRN) and t can
        ride on the epilogue of the kernel producing its operand, it does, and is
        computed once (a grouped convolution's bias before a channel concatenation, a
        squeeze-excitation's gate, AlexNet's bias and ReLU before its LRN)."""
        c = self.consumer(t)
        if c is None:
            return False
        p, slot = c
        if is_elementwise(p):
            return self.reads_once(t) or not self.rides_on_producer(t)
        return (p.op in ("fused-dot-bias", "fused-dot-bias-act") and slot == 2) or p.op == "attention"

    def reads_once(self, t: Term) -> bool:
        """t's one consumer reads each of t's values once: it is point-wise and the views
        between them keep one index per element."""
        p = self.parents[t][0][0]
        while is_view(p):
            if p.op not in ONE_READ_VIEWS:
                return False
            p = self.parents[p][0][0]
        return leading(p.args[0]) in ELEMENTWISE_OPS      # a map or an n-ary operator: never a chain

    def rides_on_producer(self, t: Term) -> bool:
        """t's operand chain reaches a kernel of one use through point-wise steps and
        bijective views (epilogue.epilogue_path): that kernel can compute t. A reduction
        unrolled in its consumer is no kernel (a squeeze-excitation's small product)."""
        if self._kernel_terms is None:
            self._kernel_terms = {u for u in self.order if is_kernel_op(u) and not self.unrolled(u)}
        kernels = self._kernel_terms
        return epilogue_path(self.p, t, lambda q: q in kernels and self.uses.get(q) == 1 and q not in self.outputs,
                             self.uses, kernels) is not None

    def kernels(self, roots: list) -> tuple[list, dict]:
        """The roots that stay kernels, in order, and the epilogue claims among them:
        chain root -> (producer, path); a claimed chain's producer computes it."""
        roots = [t for t in roots if not self.unrolled(t)]
        claimed, producers = self.epilogues(roots)
        folded = set()
        for t in roots:
            if t.op == "compute" and t.args[0].op in NORMALISED and t not in folded:
                folded |= self.norm_readers(t, claimed)
        if folded:       # a folded norm's scale and shift no longer ride on its kernel
            roots = [t for t in roots if t not in folded]
            claimed, producers = self.epilogues(roots)
        roots = [t for t in roots if t in claimed or t in producers or not self.prologue(t)]
        return roots, claimed

    def norm_readers(self, t: Term, claimed: dict) -> set:
        """Normalisation t and the element-wise terms between it and its readers (its
        scale and shift), when every reader is a gemm: its operand (LayerNorm before the
        QKV projections) or its epilogue chain (a post-norm residual add); else nothing.
        Each reader then computes the row's statistics itself (folds.normalised), so the
        norm needs no kernel. A reader that cannot gets the norm materialised after all
        (lower.py's NeedsBuffer)."""
        if self.weight_only(t):
            return set()
        group, stack = {t}, [t]
        while stack:
            u = stack.pop()
            if u in self.outputs:
                return set()
            for p, _ in self.parents.get(u, []):
                if p in group:
                    continue
                producer = claimed.get(p, (None,))[0]
                if is_view(p) or (is_elementwise(p) and producer in (None, t)):
                    group.add(p)
                    stack.append(p)
                    continue
                reader = producer if is_elementwise(p) else p    # an epilogue's gemm
                try:
                    if not is_kernel_op(reader) or self._natural(reader)["kind"] != "gemm":
                        return set()
                except Unsupported:
                    return set()
        return group

    def epilogues(self, roots: list) -> tuple[dict, set]:
        """Which point-wise chain roots ride on a producer kernel's epilogue: (chain root
        -> (producer, path), the producers). Each producer takes at most one chain."""
        root_set = set(roots)
        claimed: dict[Term, tuple] = {}
        producers: set = set()
        for t in roots:
            if is_elementwise(t) and t.args[0].op in ELEMENTWISE_OPS:
                found = epilogue_path(self.p, t, lambda q: (q in root_set and is_kernel_op(q)
                                                            and self.uses.get(q) == 1
                                                            and q not in self.outputs
                                                            and q not in producers),
                                      self.uses, root_set)   # the path stops at any root
                if found:
                    claimed[t] = found
                    producers.add(found[0])
        return claimed, producers

    def prologue(self, t: Term) -> bool:
        """Element-wise t is computed in its one consumer kernel's operand loads (gemm,
        reduce, attention). The consumer recomputes t per read: a few operations against
        a store and a load."""
        if not is_elementwise(t) or self.weight_only(t):
            return False
        c = self.consumer(t)
        return c is not None and is_kernel_op(c[0])

    def unrolled(self, t: Term) -> bool:
        """Reduction t over at most UNROLL_LIMIT values an output is folded in its one
        consumer kernel's loads, directly or through element-wise steps inlined with it:
        Inception's pool before its 1x1 projection, ShuffleNet's depthwise convolution
        before the grouped 1x1 one. Only when no overlapping windows lie between them
        (each tap would redo the work) and the consumer reads each value once per tile;
        a product with two matrix sides stays a gemm."""
        if not (t.op == "compute" and t.args[0].op in UNROLLED_REDUCTIONS) or self.weight_only(t):
            return False
        if math.prod(taps(self.p, t)) > UNROLL_LIMIT:
            return False
        u = t
        while True:         # up to the consumer kernel, through single-use views and maps
            if u in self.outputs or self.uses.get(u, 0) != 1:
                return False
            u = self.parents[u][0][0]
            if u.op in WINDOWS and reads_per_element(self.p, u) > 1:
                return False
            if not is_view(u) and not is_elementwise(u):
                break
        if not is_kernel_op(u) or u.op == "attention":
            return False
        try:
            if t.args[0].op == "dot-product" and self._natural(t)["kind"] != "reduce":
                return False
            return self._read_once_per_row(u, t)
        except Unsupported:
            return False

    def _read_once_per_row(self, consumer: Term, t: Term) -> bool:
        """A gemm reads its operands once per tile of the other side, as it would a
        buffer; a row reduction must read t at an index that depends on every row axis,
        else t's work repeats per row (a pool before a matrix-vector product)."""
        spec = self._natural(consumer)
        if spec["kind"] != "reduce":
            return spec["kind"] == "gemm"
        name = self._probe_buffers()[t][0]
        rows = {f"r{i}" for i, d in enumerate(spec["axes"]["r"]) if d > 1}
        return all(rows <= v[2].deps() for v in value_nodes(spec["values"]["elem"])
                   if v[0] == "load" and v[1] == name)

    def _natural(self, t: Term) -> dict:
        """The kernel t's term would be (regions.natural), every other kernel's result a
        buffer."""
        return natural(self.p, t, self._probe_buffers())

    def _probe_buffers(self) -> dict:
        """Every term a kernel may read as a buffer, to classify a kernel before lowering."""
        if self._probe is None:
            self._probe = {u: (f"probe{i}", dims_of(self.p, u)) for i, u in enumerate(self.order)
                           if not is_view(u) and not is_elementwise(u)}
        return self._probe

    def weight_only(self, t: Term) -> bool:
        """t reads weights and literals only (its value is known at load time)."""
        return weight_only(self.p, t, self._weights_memo)


def weight_only(program: Program, t: Term, memo: dict) -> bool:
    """t reads the program's weights and literals only, no input and no opaque call;
    `memo` (term -> answer) is shared between calls over one program."""
    stack = [t]
    while stack:
        u = stack[-1]
        if u in memo:
            stack.pop()
            continue
        kids = list(u.children())
        todo = [k for k in kids if k not in memo]
        if todo:
            stack.extend(todo)
            continue
        stack.pop()
        if u.op == "access-tensor":
            memo[u] = u.args[0] in program.weights
        elif u.op == "opaque":
            memo[u] = False
        else:
            memo[u] = all(memo[k] for k in kids)
    return memo[t]
