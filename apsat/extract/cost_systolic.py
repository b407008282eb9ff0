"""The `systolic` cost model: cycles on a systolic-array accelerator.

The accelerator (array size, dataflow, scratchpads, DRAM bandwidth, vector unit) is the
target's description in apsat/targets/systolic.py, and every per-operation figure comes
from the analytical model there (`gemm_cost`, `vector_cycles`, `dram_cycles`), the one the
accelerator backend's cycle model uses too and that is calibrated against SCALE-Sim.

Per node (ops classified in workload.py):
  systolic-array   the array's cycles for an (m×k)·(k×n) product, DRAM stalls included;
                   plus, when the left operand is a window view (im2col) whose input does
                   not fit the ifmap scratchpad, the cost of materialising the im2col matrix
                   in DRAM (written once; the array's own reads are already counted).
                   Windows whose input fits are streamed from the scratchpad: no extra.
  fused atoms      the same product plus the epilogue on the vector unit as results drain.
  attention        per head (grouped-query heads sharing K and V merged into one head's
                   rows, targets.systolic.attention_heads) Q.K^T and P.V on the array,
                   their accumulators starting from the bias as a fused-dot-bias's do,
                   the softmax (and SAFE's is-nan and select) on the vector unit, the
                   queries, K and V, bias and outputs each moved once on their own DMA
                   interface (K and V once per block of query rows when a head's do not
                   fit a filter half), all overlapped, one block's softmax exposed
                   (targets.systolic.attention_cycles). The scores stay in the ofmap
                   when targets.systolic.attention_plan says they fit, as the backend
                   runs it; else the atom costs what this model prices its unfused
                   chain at (the batched products, the bias add, the softmax, SAFE's
                   is-nan, concatenations and select, each with its DRAM round trip of
                   the scores), which is what the backend then runs.
  compute          a dot-product over an access-pair of broadcasts (grouped and depthwise
                   convolutions: independent matrix products, pair_product.py) runs on
                   the array one product after another, on the array several depthwise
                   filters at a time (block-diagonal weights), or on the vector unit,
                   whichever pair_dot_cost says is cheapest; any other dot-product not mapped to the
                   array runs on the host, one MAC per cycle (this is what makes the
                   array form worth finding); every other
                   operator runs on the vector unit, overlapped with its DRAM traffic.
  copies           a DRAM read and write of every element (layout changes).
  opaque           a host step: a fixed hand-off plus the DRAM traffic of its data.
  views            nothing: their data is paid by the node that reads them.
  weight-only      nothing per inference (constants.py): done once at load time, in the
                   stream's init section.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from apsat.extract.decode import expr_child_classes, node_args
from apsat.extract.constants import weight_only_nodes
from apsat.extract.graph import ExtractionGraph
from apsat.extract.workload import compute_op, flops, footprints, needs_shapes, traffic
from apsat.lang.arithmetic import elements, operator_flops
from apsat.lang.ops import COPY_OPS, FLOPS_PER_OUTPUT, HOST_OPS, KERNEL_OPS, VIEW_OPS
from apsat.targets.pair_product import pair_product
from apsat.targets.pair_dot import pair_dot_cost
from apsat.targets.accelerator import PRESETS, Accelerator
from apsat.lang.term import Term
from apsat.targets.systolic import (HOST_HANDOFF_CYCLES, HOST_MACS_PER_CYCLE, attention_cycles, attention_heads,
                                    attention_plan, dram_cycles, vector_cycles)
from apsat.targets.vector_share import product_cycles


@dataclass
class SystolicCycles:
    """Cycles of each e-node on `accel` (default: the 32x32 preset)."""

    accel: Accelerator | None = None
    name: str = "systolic"

    def __post_init__(self):
        if self.accel is None:
            self.accel = PRESETS["32x32"]

    @classmethod
    def for_target(cls, target) -> "SystolicCycles":
        """The model for a systolic Target (its accelerator description)."""
        return cls(target.accel)

    def node_cost(self, graph: ExtractionGraph):
        """node id -> cycles; views 0; a node of a class without a shape costs inf."""
        shapes = needs_shapes(graph, self.name)
        fp = footprints(graph, shapes)
        once = weight_only_nodes(graph, graph.weights) if graph.weights else set()
        acc = self.accel

        def cost(nid: str) -> float:
            node = graph.nodes[nid]
            op = node["op"]
            if nid in once:
                return 0.0   # weight-only: done once when the model is loaded
            if op in VIEW_OPS or op not in KERNEL_OPS | COPY_OPS | HOST_OPS:
                return 0.0
            if node["eclass"] not in shapes:
                return math.inf
            reads, writes = traffic(graph, nid, shapes, fp)
            if op in COPY_OPS:
                return float(dram_cycles(acc, reads + writes))
            if op in HOST_OPS:
                return HOST_HANDOFF_CYCLES + dram_cycles(acc, reads + writes)
            if op == "systolic-array":
                return self._array(graph, nid, shapes, fp)
            if op in ("fused-dot-bias", "fused-dot-bias-act"):
                return self._fused(graph, nid, shapes, fp)
            if op == "attention":
                return self._attention(graph, nid, shapes, fp)
            return self._compute(graph, nid, shapes, reads, writes)
        return cost

    def _array(self, graph, nid, shapes, fp) -> float:
        """A systolic-array atom: (batch×rows)·(rows×cols) on the array."""
        left, right = expr_child_classes(graph, nid)
        (batch, (k,)), (_, (_, n)) = shapes[left], shapes[right]
        m = math.prod(batch)
        return float(product_cycles(self.accel, m, k, n, 0)) + self._im2col(m * k, fp.get(left, 0.0))

    def _im2col(self, matrix_words: float, input_words: float) -> float:
        """Extra cycles for a left operand of `matrix_words` elements that reads only
        `input_words` of stored data (a window view): free when the input fits the ifmap
        scratchpad (windows are formed on chip), else the im2col matrix is written to DRAM."""
        if input_words >= matrix_words or input_words <= self.accel.ifmap_words:
            return 0.0
        return float(dram_cycles(self.accel, matrix_words))

    def _fused(self, graph, nid, shapes, fp) -> float:
        """A fused dot-bias(-act) atom: the product on the array, its accumulators starting
        from the bias, and the activation on the vector unit as the results drain (no DRAM round trip in between), the part
        of the epilogue the array's final passes do not hide added
        (targets.systolic.fused_gemm_cost; on a flexible array a one-row product may
        share its columns with the vector unit, targets.vector_share)."""
        kids = expr_child_classes(graph, nid)
        (ia, item), (ib, _) = shapes[kids[0]], shapes[kids[1]]
        m, k, n = math.prod(ia), math.prod(item), math.prod(ib)
        act = graph.nodes[nid]["op"] == "fused-dot-bias-act"
        # the accumulators start from the bias (the array adds it): only the activation
        epilogue = FLOPS_PER_OUTPUT[compute_op(graph, nid)] if act else 0
        return float(product_cycles(self.accel, m, k, n, epilogue)) + self._im2col(m * k, fp.get(kids[0], 0.0))

    def _attention(self, graph, nid, shapes, fp) -> float:
        """`attention SAFE qk bias v`: on chip when it is a product per head (q broadcast
        over the keys, k and v over the queries) whose scores fit, else its unfused
        chain (see the module docstring)."""
        safe = bool(node_args(graph, nid, lambda c: c)[0])
        qk, bias, v = expr_child_classes(graph, nid)
        (iq, (_, d)), e = shapes[qk], shapes[v][0][-1]
        m, n = iq[-2:]
        pair = _pair_operands(graph, qk, shapes) or (qk, qk)
        pre_q, pre_k, pre_v = (_pre_broadcast(graph, c, shapes) for c in pair + (v,))
        words = {c: fp.get(c, math.inf) for c in (qk, bias, v) + pair}
        q, k = (words[qk] / 2, words[qk] / 2) if pair == (qk, qk) else (words[pair[0]], words[pair[1]])
        product = pair != (qk, qk) and (n == 1 or pre_q[-1] == 1) and (m == 1 or pre_k[-2] == pre_v[-2] == 1)
        heads, rows, _ = attention_heads(iq, pre_k, pre_v)
        plan = attention_plan(self.accel, rows, d, n, e, safe) if product else None
        if plan is not None and plan.rows:
            ops = sum(_per_score(name) for name in (("softmax", "is-nan", "select") if safe else ("softmax",)))
            bias_words = words[bias] if shapes[bias] != ((), ()) else 0.0
            return float(attention_cycles(self.accel, plan, heads, rows, d, n, e, q, k + words[v], bias_words, ops))
        zero = shapes[bias] == ((), ()) and _literal_zero(graph, bias)
        return self._attention_chain(iq, d, e, safe, zero, (pre_q, pre_k, pre_v), (q + k, words[bias], words[v]))

    def _attention_chain(self, iq, d, e, safe, zero, pre, words) -> float:
        """The atom's unfused chain as this model prices its nodes: the batched Q.K^T,
        the bias add (none for a literal 0), the softmax, SAFE's is-nan, concatenations
        (copies) and select, the batched P.V. `pre`: the pre-broadcast iterated dims of
        q, k and v; `words`: the footprints of q and k together, the bias and v."""
        scores, n = math.prod(iq), iq[-1]
        cost = self._pair(iq, (d,), pre[0], pre[1], words[0], scores)
        if not zero:       # S + bias: a zip reading both
            cost += self._vector(2 * scores, 2 * scores + words[1])
        cost += self._vector(_per_score("softmax") * scores, 2 * scores)
        if safe:
            cost += self._vector(scores, 2 * scores) + dram_cycles(self.accel, math.ceil(3 * scores + 1))
            cost += dram_cycles(self.accel, 6 * scores) + self._vector(3 * scores, 4 * scores)
        out = tuple(iq[:-1]) + (e,)
        return cost + self._pair(out, (n,), tuple(iq[:-2]) + (iq[-2], 1), pre[2], scores + words[2], math.prod(out))

    def _pair(self, it, item, pre0, pre1, reads, writes) -> float:
        """A dot-product over an access-pair, as _compute prices one."""
        pp = pair_product(tuple(it), tuple(item), tuple(pre0), tuple(pre1))
        if pp is None:
            macs = math.prod(it) * math.prod(item)
            return HOST_HANDOFF_CYCLES + macs / HOST_MACS_PER_CYCLE + dram_cycles(self.accel, math.ceil(reads + writes))
        cost = pair_dot_cost(self.accel, pp.groups, pp.m, pp.k, pp.n)
        if cost.unit != "vector":
            return float(cost.cycles)
        return float(max(cost.vector_cycles, dram_cycles(self.accel, math.ceil(reads + writes))))

    def _vector(self, work: float, words: float) -> float:
        """A vector-unit pass of `work` operations moving `words` DRAM words, overlapped."""
        return float(max(vector_cycles(self.accel, math.ceil(work), 1), dram_cycles(self.accel, math.ceil(words))))

    def _compute(self, graph, nid, shapes, reads, writes) -> float:
        """`compute OP`: a dot-product on the host, anything else on the vector unit."""
        name = compute_op(graph, nid)
        child = expr_child_classes(graph, nid)[0]
        if name == "dot-product":
            pp = pair_product_of(graph, child, shapes)
            if pp is not None:
                cost = pair_dot_cost(self.accel, pp.groups, pp.m, pp.k, pp.n)
                if cost.unit != "vector":
                    return float(cost.cycles)
                return float(max(cost.vector_cycles, dram_cycles(self.accel, reads + writes)))
            macs = elements(shapes[child]) / 2
            return HOST_HANDOFF_CYCLES + macs / HOST_MACS_PER_CYCLE + dram_cycles(self.accel, reads + writes)
        work = vector_cycles(self.accel, math.ceil(flops(graph, nid, shapes)), 1)
        return float(max(work, dram_cycles(self.accel, reads + writes)))


def _pre_broadcast(graph: ExtractionGraph, cls: str, shapes: dict) -> tuple:
    """Iterated dims of class `cls` before its broadcast (a member `access-broadcast x`
    whose x has as many dims: its first ones, however x splits them, as the backend
    reads a broadcast's address pattern, grouped._before_broadcast), else its own."""
    it, item = shapes[cls]
    for nid in graph.classes.get(cls, ()):
        if graph.nodes[nid]["op"] == "access-broadcast":
            kid = expr_child_classes(graph, nid)[0]
            if kid in shapes and len(shapes[kid][0]) + len(shapes[kid][1]) == len(it) + len(item):
                return (tuple(shapes[kid][0]) + tuple(shapes[kid][1]))[:len(it)]
    return tuple(it)


def _pair_operands(graph: ExtractionGraph, cls: str, shapes: dict):
    """The two operand classes of an access-pair member of class `cls`, or None."""
    for nid in graph.classes.get(cls, ()):
        if graph.nodes[nid]["op"] == "access-pair":
            kids = expr_child_classes(graph, nid)
            if len(kids) == 2 and all(k in shapes for k in kids):
                return tuple(kids)
    return None


def _literal_zero(graph: ExtractionGraph, cls: str) -> bool:
    """Whether class `cls` holds the literal 0 (`access-literal 0.0`: no bias)."""
    return any(graph.nodes[nid]["op"] == "access-literal" and float(node_args(graph, nid, lambda c: c)[0]) == 0.0
               for nid in graph.classes.get(cls, ()))


def _per_score(name: str) -> float:
    """Vector operations a score of compute operator `name` over the scores (select: over
    its three columns), the registry's arithmetic (apsat.lang.arithmetic)."""
    return operator_flops(Term(name, ()), 3 if name == "select" else 1, 1)


def pair_product_of(graph: ExtractionGraph, cls: str, shapes: dict):
    """The PairProduct of a dot-product over class `cls` when `cls` holds an access-pair
    of operands with shapes (apsat/targets/pair_product.py), else None."""
    for nid in graph.classes.get(cls, ()):
        if graph.nodes[nid]["op"] != "access-pair":
            continue
        kids = expr_child_classes(graph, nid)
        if len(kids) != 2 or any(k not in shapes for k in kids):
            return None
        it, item = shapes[kids[0]]
        return pair_product(it, item, *(_pre_broadcast(graph, k, shapes) for k in kids))
    return None
