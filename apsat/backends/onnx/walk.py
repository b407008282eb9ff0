"""The exporter's walk: every term of the program to a Val (graph.py), children first.

Work on weights alone was done before the walk (fold.py): those terms arrive as
constants. Views only change a Val's layout; pads, windows and pairs stay lazy until a
consumer reads them (views.py); products, pools and element-wise work write nodes
(contract.py, pool.py, compute.py).
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from apsat.backends.onnx import views as vw
from apsat.backends.onnx.compute import elementwise, operands, over_item, reduce, REDUCE_OPS
from apsat.backends.onnx.contract import conv, matmul
from apsat.backends.onnx.graph import INTEGER_TYPES, Builder, Val, dense, tensor_val
from apsat.backends.onnx.pool import attention, pool
from apsat.lang.semantics import gather_indices
from apsat.lang.ops import COMPUTE_OPS, NARY_OPS, chain_parts, is_elementwise_op
from apsat.lang.term import Term


class Walk:
    """Term -> Val for one program; `leaf(term)` gives inputs and opaque calls."""

    def __init__(self, b: Builder, program, consts: dict, leaf, varying=frozenset()):
        self.b, self.p, self.leaf, self.varying = b, program, leaf, varying
        self.vals: dict[Term, object] = dict(consts)
        # written value name -> the term whose walk wrote its node (a lazy view's node is
        # written for the term that first reads it densely): peep.Planned reads it
        self.owner: dict[str, Term] = {}

    def run(self, terms) -> None:
        for t in terms:
            if t not in self.vals:
                start = len(self.b.nodes)
                self.vals[t] = self.value(t)
                for node in self.b.nodes[start:]:
                    self.owner.update((name, t) for name in node.output)

    def shape(self, t: Term) -> tuple:
        it, item = self.p.shape_of(t)
        return tuple(it) + tuple(item)

    def n_iter(self, t: Term) -> int:
        return len(self.p.shape_of(t)[0])

    def value(self, t: Term):
        op, args, shape = t.op, t.args, self.shape(t)
        kids = [self.vals[c] for c in t.children()]
        b = self.b
        if t in self.varying and op.startswith("access"):   # a view whose shape follows a symbol:
            # a node on the constant, not a constant (products and convs keep their weights)
            kids = [tensor_val(dense(b, k), k.shape) if isinstance(k, Val) and k.is_const else k
                    for k in kids]
        if op in ("access-tensor", "opaque"):
            return self.leaf(t, kids)
        if op == "access":
            return vw.resplit(kids[0])
        if op == "access-transpose":
            return vw.transpose(kids[0], args[1]) or vw.transpose(vw.as_val(b, kids[0]), args[1])
        if op == "access-squeeze":
            return vw.squeeze(kids[0], args[1]) or vw.squeeze(vw.as_val(b, kids[0]), args[1])
        if op == "access-insert-axis":
            return vw.insert_axis(kids[0], args[1]) or vw.insert_axis(vw.as_val(b, kids[0]), args[1])
        if op == "access-broadcast":
            return vw.broadcast(kids[0], shape)
        if op in ("access-reshape", "access-flatten"):
            return vw.reshape(b, kids[0], shape)
        if op == "access-slice":
            return vw.slice_axis(b, kids[0], *args[1:])
        if op == "access-concatenate":
            return vw.concatenate(b, kids[0], kids[1], args[2], shape)
        if op == "access-pad":
            return self.pad(kids[0], args, shape)
        if op == "access-gather":
            return self.gather(kids[0], kids[1], args[2], self.shape(args[0])[args[2]], shape)
        if op in ("access-windows", "access-dilated-windows"):
            return self.windows(t, kids[0], shape)
        if op == "access-pair":
            return vw.Pair((kids[0], kids[1]), self.n_iter(args[0]), shape)
        if op == "access-cartesian-product":
            return self.cartesian(t, kids, shape)
        if op == "compute":
            return self.compute(args[0], args[1], kids[0], shape)
        if op in ("fused-dot-bias", "fused-dot-bias-act"):
            return self.fused(t, kids, shape)
        if op == "attention":
            return self.attention(t, kids, shape)
        raise vw.ExportError(f"{op} has no ONNX form")

    def pad(self, x, args, shape):
        kind, axis, lo, hi = args[1].op, args[2], args[3], args[4]
        if isinstance(x, vw.Padded) and x.kind == kind:
            pads = list(x.pads)
            pads[axis] = (pads[axis][0] + lo, pads[axis][1] + hi)
            return vw.Padded(x.base, tuple(pads), kind, shape)
        base = vw.as_val(self.b, x, full=True)
        pads = [(0, 0)] * len(shape)
        pads[axis] = (lo, hi)
        return vw.Padded(base, tuple(pads), kind, shape)

    def gather(self, data, index, axis: int, n: int, shape):
        """ONNX Gather of the data by its float32-carried indices, read as access-gather
        reads them: constant ones here (evaluate.gather_indices), others rounded half up
        (Floor of + 0.5), cast to int64 and clipped into [-n, n - 1], Gather's own range,
        whose negative indices count from the end."""
        b = self.b
        data = vw.dense_any(b, data)
        index = vw.as_val(b, index, full=True)
        if index.is_const:
            at = b.const(gather_indices(index.logical_array(), n), "gather_index", np.int64)
        else:
            name = vw.dense_any(b, index)
            source, elem = b.cast_from(name)
            if elem in INTEGER_TYPES:         # integer ids cast to float: gather by the ids
                whole = source if elem == TensorProto.INT64 else b.op("Cast", [source], to=TensorProto.INT64)
            else:
                rounded = b.op("Floor", [b.op("Add", [name, b.const(np.float32(0.5))])])
                whole = b.cast(rounded, TensorProto.INT64)
            at = b.op("Clip", [whole, b.const(np.int64(-n), "lo", np.int64), b.const(np.int64(n - 1), "hi", np.int64)])
        return vw.Val(b.op("Gather", [data, at], axis=axis), shape, tuple(range(len(shape))), shape)

    def windows(self, t: Term, src, shape):
        e, window = t.args[0], t.args[1]
        strides = t.args[2]
        dil = t.args[3] if t.op == "access-dilated-windows" else (1,) * len(window)
        n = self.n_iter(e)
        axes = tuple(("i", k) for k in range(n)) + tuple(("o", j) for j in range(len(window))) \
            + tuple(("w", j) for j in range(len(window)))
        if not isinstance(src, (Val, vw.Padded)):
            src = vw.as_val(self.b, src)
        return vw.Windows(src, n, tuple(window), tuple(strides), tuple(dil), axes, shape)

    def cartesian(self, t: Term, kids, shape):
        return self.pair_of(kids[0], kids[1], self.n_iter(t.args[0]), self.n_iter(t.args[1]), shape)

    def pair_of(self, a, b2, na: int, nb: int, shape):
        """A cartesian product's Pair: a broadcast over b's iterated axes and b over a's."""
        for k in range(nb):
            a = vw.insert_axis(_lazy_ok(self.b, a), na + k)
        for k in range(na):
            b2 = vw.insert_axis(_lazy_ok(self.b, b2), 0)
        inner = shape[:na + nb] + shape[na + nb + 1:]
        return vw.Pair((vw.broadcast(a, inner), vw.broadcast(b2, inner)), na + nb, shape)

    def compute(self, op: Term, e: Term, x, shape):
        b, n = self.b, self.n_iter(e)
        if op.op == "dot-product":
            return self.product(x, n, shape)
        if op.op in REDUCE_OPS:
            if isinstance(x, vw.Windows):
                out = pool(b, op.op, x, n, shape)
                if out is not None:
                    return out
            return reduce(b, op.op, x, n, shape)
        if is_elementwise_op(op):
            if chain_parts(op)[0].op in NARY_OPS:
                return elementwise(b, op, operands(b, x, n), shape)
            return elementwise(b, op, [vw.as_val(b, x)], shape)
        if COMPUTE_OPS[op.op].kind == "item":
            return over_item(b, op, x, n, shape)
        raise vw.ExportError(f"compute {op.op} has no ONNX form")

    def product(self, x, n: int, shape, bias=None, act=None):
        """dot-product over a pair (a conv where one side is windows over weights)."""
        pair = x if isinstance(x, vw.Pair) else vw.Pair(tuple(operands(self.b, x, n)), n, x.shape)
        a, w = pair.operands
        for win, other in ((a, w), (w, a)):
            if isinstance(win, vw.Windows) and isinstance(other, Val) and other.is_const:
                done = conv(self.b, win, other, n, shape, bias)
                if done is not None:
                    return self.activate(done, act, shape)
        a, w = (vw.as_val(self.b, v) for v in (a, w))
        if a.is_const and not w.is_const:
            a, w = w, a
        return self.activate(matmul(self.b, a, w, n, shape, bias), act, shape)

    def activate(self, v: Val, act, shape):
        return v if act is None else elementwise(self.b, act, [v], shape)

    def fused(self, t: Term, kids, shape):
        *_, a, w, bias = kids
        act = t.args[0] if t.op == "fused-dot-bias-act" else None
        na, nb = self.n_iter(t.args[-3]), self.n_iter(t.args[-2])
        item = self.p.shape_of(t.args[-3])[1]
        pair = self.pair_of(a, w, na, nb, shape + (2,) + tuple(item))
        if not (isinstance(bias, Val) and bias.is_const):      # a computed bias: added after
            y = self.product(pair, na + nb, shape)
            y = elementwise(self.b, Term("elementwise-add"),
                            [y, _broadcast_bias(vw.as_val(self.b, bias), shape, na)], shape)
            return self.activate(y, act, shape)
        return self.product(pair, na + nb, shape, _broadcast_bias(bias, shape, na), act)

    def attention(self, t: Term, kids, shape):
        qk, bias, v = kids
        q, k = operands(self.b, qk, self.n_iter(t.args[1]))
        if isinstance(bias, Val) and bias.is_const and not np.any(bias.array):
            bias = None
        out = attention(self.b, t.args[0], q, k, bias, v, shape)
        if out is None:
            raise vw.ExportError("attention whose operands are not broadcast query and key rows")
        return out


def _lazy_ok(b, v):
    """Windows and Vals take inserted axes lazily; other forms are materialised first."""
    return v if isinstance(v, (Val, vw.Windows)) else vw.as_val(b, v)


def _broadcast_bias(bias, shape: tuple, n_a: int):
    """A fused product's bias ((ib), ()) as a Val over the whole result (ia ++ ib)."""
    if bias is None:
        return None
    v = bias
    for _ in range(n_a):
        v = vw.insert_axis(v, 0)
    return vw.broadcast(v, shape)
