"""The attention atom on the gpu target: a FlashAttention-style kernel, or its expansion.

`(attention SAFE qk bias v)` (apsat/lang/ops.py) becomes one kernel of kind "attention"
(graph.Kernel): per batch index and tile of query rows, the kernel loads q once, walks the
keys in tiles (scores q.k^T, plus the bias, an online softmax) and accumulates p.v, so
the m x n scores never reach memory. The Triton and CUDA C sources are written by
triton.py and cuda.py from the description `describe` returns.

The kernel reads the three operands as separate views, so each must be a broadcast where
the atom says it is: the query (qk's operand 0) may not depend on the key index n, the
key (operand 1) and the value (v) not on the query index m. `describe` checks that the
way regions.py's `_dot` finds matrix sides, by the loop variables each operand's value
expression actually reads (emit.used_vars), and raises views.Unsupported otherwise. The
lowering then falls back on `expansion`: the atom's meaning as plain terms (the scores'
dot-product, the bias add, a softmax over n, the NaN select when SAFE, the p.v
dot-product), each lowered as any term is, so a strange atom costs kernels, never a host
step of its own.
"""
from __future__ import annotations

from apsat.backends.gpu.emit import used_vars
from apsat.backends.gpu.expr import const, var
from apsat.backends.gpu.regions import ACC, covered_ops
from apsat.backends.gpu.views import Unsupported, Values, dims_of
from apsat.lang.ops import OPS
from apsat.lang.program import apply_shape_rule
from apsat.lang.term import Term


def describe(program, t: Term, buffers) -> dict:
    """The attention kernel computing atom t, in regions.natural's form: "kind"
    ("attention"), "op" ("safe" when SAFE is 1: a row whose softmax is NaN gives 0;
    "plain" otherwise), "axes" {"b": the batch dims I.., "m", "n", "d", "e": one dim each},
    "values" (below), "p" (the output index (b.., m0, e0)), "post" (ACC: the normalised
    p.v of the element), "vals" (the Values that built them), "covers", "flops" (the
    registry's figure).

    values, over the variables b0.. (batch, one per program), m0 (query row), and per
    operand its own n/d/e variables (so each tile's indexing stays separate):
      "q" at (b.., m0, dq0)   qk's operand 0 at (b.., m0, n=0, 0, dq0)
      "k" at (b.., nk0, dk0)  qk's operand 1 at (b.., m=0, nk0, 1, dk0)
      "bias" at (b.., m0, ns0) (a constant for a scalar literal bias)
      "v" at (b.., ev0, nv0)  v at (b.., m=0, ev0, nv0)
    Raises Unsupported (with the reason) when an operand depends on an index the atom
    says it is broadcast over, or a view cannot be read inside a kernel."""
    safe, qk, bias, v = t.args
    (iq, (_, dd)), (iv, _) = program.shape_of(qk), program.shape_of(v)
    batch, (mm, nn), ee = tuple(iq[:-2]), iq[-2:], iv[-1]
    b = tuple(var(f"b{i}", x) for i, x in enumerate(batch))
    _check_broadcasts(program, t, buffers, b, mm, nn, dd, ee)
    vals = Values(program, buffers)
    m0 = var("m0", mm)
    q = vals.value(qk, b + (m0, const(0), const(0), var("dq0", dd)))
    k = vals.value(qk, b + (const(0), var("nk0", nn), const(1), var("dk0", dd)))
    bias_idx = b + (m0, var("ns0", nn)) if dims_of(program, bias) else ()
    bv = vals.value(bias, bias_idx)
    vv = vals.value(v, b + (const(0), var("ev0", ee), var("nv0", nn)))
    shapes = [program.shape_of(a) for a in (qk, bias, v)]
    flops = OPS["attention"].flops(None, program.shape_of(t), shapes)
    return {"kind": "attention", "op": "safe" if safe else "plain",
            "axes": {"b": batch, "m": (mm,), "n": (nn,), "d": (dd,), "e": (ee,)},
            "values": {"q": q, "k": k, "bias": bv, "v": vv}, "p": b + (m0, var("e0", ee)),
            "post": ACC, "vals": vals, "covers": covered_ops(program, t, buffers),
            "flops": float(flops)}


def _check_broadcasts(program, t, buffers, b, mm, nn, dd, ee):
    """Unsupported unless q ignores n, and k and v ignore m (probed with every index a
    variable, as regions._dot probes a product's operands)."""
    qk, v = t.args[1], t.args[3]
    probe = Values(program, buffers)
    m, n = var("m0", mm), var("n0", nn)
    wrong = []
    if "n0" in used_vars(probe.value(qk, b + (m, n, const(0), var("d0", dd)))):
        wrong.append("the query (qk's operand 0) depends on the key index n")
    if "m0" in used_vars(probe.value(qk, b + (m, n, const(1), var("d0", dd)))):
        wrong.append("the key (qk's operand 1) depends on the query index m")
    if "m0" in used_vars(probe.value(v, b + (m, var("e0", ee), n))):
        wrong.append("the value (v) depends on the query index m")
    if wrong:
        raise Unsupported("attention: " + "; ".join(wrong) + ", which the attention kernel "
                          "reads once per query row or key: computed unfused")


# ---- the fallback: the atom's meaning as plain terms ----------------------------------------

class ExpandedProgram:
    """A Program that also knows the access shapes of terms an expansion added. shape_of
    answers for both; every other attribute is the program's own (the program itself is
    left as it is)."""

    def __init__(self, program, shapes: dict):
        base = program.base if isinstance(program, ExpandedProgram) else program
        extra = dict(program.extra) if isinstance(program, ExpandedProgram) else {}
        extra.update(shapes)
        self.base, self.extra = base, extra

    def shape_of(self, term: Term):
        """The access shape of a term of the program or of an expansion."""
        found = self.extra.get(term)
        return found if found is not None else self.base.shape_of(term)

    def __getattr__(self, name):
        if name in ("base", "extra"):      # not set yet (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self.base, name)


class _Builder:
    """Builds terms over an existing program, shaping each as it is made (never walking
    the program's DAG below)."""

    def __init__(self, program):
        self.program, self.shapes = program, {}

    def shape(self, term):
        return self.shapes[term] if term in self.shapes else self.program.shape_of(term)

    def make(self, op: str, *args) -> Term:
        term = Term(op, tuple(args))
        if term not in self.shapes:
            self.shapes[term] = apply_shape_rule(op, term.args, self.shape, self.program.tensor_shapes)
        return term

    def compute(self, operator: str, x: Term) -> Term:
        return self.make("compute", Term(operator, ()), x)

    def at(self, x: Term, k: int) -> Term:
        """x re-split with its first k dims iterated (x itself when it already is)."""
        return x if len(self.shape(x)[0]) == k else self.make("access", x, k)

    def spread(self, x: Term, dims: tuple) -> Term:
        """Scalar x (shape ((), ())) broadcast to ((dims), ())."""
        ones = self.make("access-reshape", x, Term("access-shape", ((1,) * len(dims), ())))
        return self.make("access-broadcast", ones, Term("access-shape", (tuple(dims), ())))

    def select(self, cond: Term, a: Term, b: Term) -> Term:
        """`compute select` of three all-iterated operands of one shape, stacked on a new
        item axis as the importer stacks ONNX Where's (frontend/lowering.lower_where)."""
        r = len(self.shape(cond)[0])
        parts = [self.at(self.make("access-insert-axis", x, r), r) for x in (cond, a, b)]
        return self.compute("select", self.make("access-concatenate", self.make(
            "access-concatenate", parts[0], parts[1], r), parts[2], r))


def expansion(program, t: Term) -> tuple[ExpandedProgram, list[Term]]:
    """Attention atom t as the unfused terms the registry entry defines it by, over t's
    own operands: s = (compute dot-product qk) (+ bias), p = (compute softmax) of s over
    n, with SAFE p's NaNs replaced by 0 (compute select of compute is-nan), and
    out = (compute dot-product) of p (broadcast over e) paired with v.

    Returns (the program with the new terms' shapes known, the terms the lowering must
    give steps, in order: the scores, the softmax, and out, whose value is t's). The bias
    add and the NaN select are element-wise and inline into the softmax and the product."""
    safe, qk, bias, v = t.args
    mk = _Builder(program)
    (iq, _), (iv, (nn,)) = mk.shape(qk), mk.shape(v)
    rows = len(iq) - 1                    # (I.., m) iterated, n the softmax's item
    scores = s = mk.compute("dot-product", qk)     # ((I.., m, n), ())
    if not (bias.op == "access-literal" and float(bias.args[0]) == 0.0):
        # (s + 0.0 is s: the usual "no bias" needs no add.) A scalar bias is broadcast.
        b_all = mk.at(bias, len(iq)) if sum(map(len, mk.shape(bias))) else mk.spread(bias, iq)
        s = mk.compute("elementwise-add", mk.make("access-pair", s, b_all))
    softmax = p = mk.compute("softmax", mk.at(s, rows))      # ((I.., m), (n))
    if safe:                                                 # Where(IsNaN(p), 0, p)
        p_all = mk.at(p, len(iq))
        zero = mk.spread(mk.make("access-literal", 0.0), iq)
        p = mk.at(mk.select(mk.compute("is-nan", p_all), zero, p_all), rows)
    p_e = mk.make("access-broadcast", mk.make("access-insert-axis", p, rows),
                  Term("access-shape", (tuple(iv), (nn,))))  # ((I.., m, e), (n))
    out = mk.compute("dot-product", mk.make("access-pair", p_e, v))
    return ExpandedProgram(program, mk.shapes), [scores, softmax, out]
