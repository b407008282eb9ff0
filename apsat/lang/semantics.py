"""Compute operators of the reference interpreter, and the lazy values they consume.

Value model (shared with apsat.lang.evaluate): the value of an access pattern with
access shape ((iterated dims), (item dims)) is a float32 numpy array of shape
iterated ++ item (often a view: windows, broadcasts, slices), or one of two lazy values
that stand for arrays too large to build:

* `LazyCartesian(a, b, n_a, n_b)`: `access-cartesian-product a b`, never built for
  `compute dot-product` (a matmul of a and b instead);
* `LazyPair(a, b, n_iter)`: `access-pair a b`, kept as its two operands so dot-product and
  the elementwise operators work on them directly (grouped convolutions pair two
  broadcasts that would be huge if expanded).

`dense(value)` builds the array of a lazy value, refusing above `MATERIALISE_LIMIT`
elements. Every compute evaluator is `fn(x, n_iter, params) -> ndarray`: `x` the operand's
value, `n_iter` how many of its leading axes are iterated, `params` the operator's
parameters (literals; for `chain`, its two operator terms). Evaluators marked `lazy_ok` may
receive a lazy value; the others get `dense(x)`. The registry (apsat/lang/ops.py) names each
operator's evaluator (`ComputeSpec.evaluate`): the functions below, or for an element-wise
operator its formula read in numpy (`map_evaluator`, `nary_evaluator`).
Arithmetic stays in float32 (onnxruntime's precision); special functions go through
float64 only where float32 would lose accuracy.
"""
from __future__ import annotations

import math

import numpy as np
from numpy.lib.stride_tricks import as_strided

from apsat.errors import ApsatError
from apsat.lang import formula as fm
from apsat.lang.primitives import PRIMITIVES

# Elements a lazy value may have when something forces it to be built (1 GiB of float32).
MATERIALISE_LIMIT = 2 ** 28


class EvaluationError(ApsatError, ValueError):
    """The reference interpreter cannot evaluate a program with the given tensors
    (missing or mis-shaped tensor, a value too large to build, a failing opaque call)."""


def _check_limit(what: str, shape: tuple) -> None:
    n = math.prod(shape)
    if n > MATERIALISE_LIMIT:
        raise EvaluationError(
            f"{what}: building its value of shape {shape} ({n:,} elements) exceeds the "
            f"reference interpreter's limit of {MATERIALISE_LIMIT:,} elements; only "
            f"`compute dot-product` (and elementwise ops for pairs) consume it unbuilt")


class LazyCartesian:
    """`access-cartesian-product a b` left unbuilt. `a` has shape ia ++ item, `b` has shape
    ib ++ item; the value it stands for has shape ia ++ ib ++ (2,) ++ item with
    v[ia.., ib.., 0, item..] = a[ia.., item..] and v[ia.., ib.., 1, item..] = b[ib.., item..]."""

    __slots__ = ("a", "b", "n_a", "n_b", "_dense")

    def __init__(self, a: np.ndarray, b: np.ndarray, n_a: int, n_b: int):
        self.a, self.b, self.n_a, self.n_b, self._dense = a, b, n_a, n_b, None

    @property
    def shape(self) -> tuple:
        return self.a.shape[: self.n_a] + self.b.shape[: self.n_b] + (2,) + self.a.shape[self.n_a:]

    def operands(self) -> tuple[np.ndarray, np.ndarray]:
        """a and b as views of equal rank, ia ++ (1,)*len(ib) ++ item and
        (1,)*len(ia) ++ ib ++ item, so they broadcast against each other."""
        a = self.a.reshape(self.a.shape[: self.n_a] + (1,) * self.n_b + self.a.shape[self.n_a:])
        b = self.b.reshape((1,) * self.n_a + self.b.shape)
        return a, b

    def dense(self) -> np.ndarray:
        """The full value (cached); EvaluationError above MATERIALISE_LIMIT elements."""
        if self._dense is None:
            _check_limit("access-cartesian-product", self.shape)
            a, b = self.operands()
            self._dense = _stack_broadcast(a, b, self.n_a + self.n_b)
        return self._dense


class LazyPair:
    """`access-pair a b` left unbuilt: a and b have the same shape it ++ item (either may
    be a broadcast view); the value has shape it ++ (2,) ++ item."""

    __slots__ = ("a", "b", "n_iter", "_dense")

    def __init__(self, a: np.ndarray, b: np.ndarray, n_iter: int):
        self.a, self.b, self.n_iter, self._dense = a, b, n_iter, None

    @property
    def shape(self) -> tuple:
        return self.a.shape[: self.n_iter] + (2,) + self.a.shape[self.n_iter:]

    def dense(self) -> np.ndarray:
        """The full value (cached); EvaluationError above MATERIALISE_LIMIT elements."""
        if self._dense is None:
            _check_limit("access-pair", self.shape)
            self._dense = _stack_broadcast(self.a, self.b, self.n_iter)
        return self._dense


def _stack_broadcast(a: np.ndarray, b: np.ndarray, axis: int) -> np.ndarray:
    """Stack broadcastable a and b along a new axis `axis` of the broadcast shape."""
    shape = np.broadcast_shapes(a.shape, b.shape)
    out = np.empty(shape[:axis] + (2,) + shape[axis:], dtype=np.result_type(a, b))
    lead = (slice(None),) * axis
    out[lead + (0,)] = a
    out[lead + (1,)] = b
    return out


def dense(value) -> np.ndarray:
    """The array of any value (lazy values are built, within MATERIALISE_LIMIT)."""
    return value if isinstance(value, np.ndarray) else value.dense()


def lazy_ok(fn):
    """Mark an evaluator that accepts lazy values (the caller then does not build them)."""
    fn.lazy_ok = True
    return fn


# ---- contraction: dot-product without expanding broadcasts or cartesian products --------

def _compact(x: np.ndarray) -> np.ndarray:
    """A read-only view of x with every stride-0 axis (a broadcast) shrunk to size 1."""
    if x.size == 0 or 0 not in x.strides:
        return x
    shape = tuple(1 if s == 0 else n for n, s in zip(x.shape, x.strides))
    return as_strided(x, shape=shape, strides=x.strides, writeable=False)


def contract(a: np.ndarray, b: np.ndarray, n_iter: int) -> np.ndarray:
    """sum over axes >= n_iter of a * b, for a and b of equal rank whose shapes broadcast.

    Result shape: the broadcast of a's and b's first n_iter dims. Broadcast (stride-0 or
    size-1) axes are never expanded: the iterated axes split into batch (both operands),
    m (a only) and n (b only) axes and the product is one batched float32 matmul
    (batch, m, k) @ (batch, k, n); an item axis only one operand varies along is summed
    out of that operand first. The only copies are the matmul operands (im2col)."""
    out_iter = np.broadcast_shapes(a.shape[:n_iter], b.shape[:n_iter])
    a, b = _compact(a), _compact(b)
    for j in range(n_iter, a.ndim):
        if a.shape[j] != b.shape[j] and 1 not in (a.shape[j], b.shape[j]):
            raise EvaluationError(f"dot-product: item dims {a.shape[n_iter:]} and "
                                  f"{b.shape[n_iter:]} do not match")
        if b.shape[j] == 1 < a.shape[j]:       # b is constant along j: sum a there first
            a = a.sum(axis=j, keepdims=True, dtype=np.float32)
        elif a.shape[j] == 1 < b.shape[j]:
            b = b.sum(axis=j, keepdims=True, dtype=np.float32)
    k = [j for j in range(n_iter, a.ndim) if a.shape[j] > 1]
    batch = [i for i in range(n_iter) if a.shape[i] > 1 and b.shape[i] > 1]
    m = [i for i in range(n_iter) if a.shape[i] > 1 and b.shape[i] == 1]
    n = [i for i in range(n_iter) if a.shape[i] == 1 and b.shape[i] > 1]
    sizes = [max(x, y) for x, y in zip(a.shape[:n_iter], b.shape[:n_iter])]
    bt, mm, kk, nn = (math.prod(sizes[i] for i in batch), math.prod(sizes[i] for i in m),
                      math.prod(a.shape[j] for j in k), math.prod(sizes[i] for i in n))
    rest_a = [i for i in range(a.ndim) if i not in batch + m + k]     # all of size 1
    rest_b = [i for i in range(b.ndim) if i not in batch + k + n]
    lhs = a.transpose(batch + m + k + rest_a).reshape(bt, mm, kk)
    rhs = b.transpose(batch + k + n + rest_b).reshape(bt, kk, nn)
    if mm == 1 and nn == 1:     # one dot per batch element: einsum beats bt tiny gemms
        r = np.einsum("bk,bk->b", lhs[:, 0, :], rhs[:, :, 0])
    else:
        r = np.matmul(lhs, rhs)
    order = batch + m + n
    r = r.reshape([sizes[i] for i in order]).transpose(np.argsort(order).tolist())
    compact_iter = [sizes[i] if i in order else 1 for i in range(n_iter)]
    r = r.reshape(compact_iter)
    # Axes of size 1 in both operands but not in the output were broadcasts: a view.
    return r if tuple(compact_iter) == tuple(out_iter) else np.broadcast_to(r, out_iter)


# ---- compute evaluators -------------------------------------------------------------------

def _operand(x: np.ndarray, n_iter: int, i: int) -> np.ndarray:
    """item[i] of every item: a view with the leading item axis indexed away."""
    return x[(slice(None),) * n_iter + (i,)]


def _item_axes(x: np.ndarray, n_iter: int) -> tuple[int, ...]:
    return tuple(range(n_iter, x.ndim))


@lazy_ok
def dot_product(x, n_iter, params):
    """Multiply along the first item axis, sum over all item axes."""
    if isinstance(x, LazyCartesian):
        a, b = x.operands()
        return contract(a, b, x.n_a + x.n_b)
    if isinstance(x, LazyPair):
        return contract(x.a, x.b, x.n_iter)
    if x.shape[n_iter] == 2:
        return contract(_operand(x, n_iter, 0), _operand(x, n_iter, 1), n_iter)
    prod = np.prod(x, axis=n_iter, dtype=np.float32)
    return prod.sum(axis=_item_axes(prod, n_iter), dtype=np.float32)


def reduce_sum(x, n_iter, params):
    return np.sum(x, axis=_item_axes(x, n_iter), dtype=np.float32)


def reduce_mean(x, n_iter, params):
    return np.mean(x, axis=_item_axes(x, n_iter), dtype=np.float32)


def reduce_max(x, n_iter, params):
    return np.max(x, axis=_item_axes(x, n_iter))


def clip(x, n_iter, params):
    """np.clip: its formula min(hi, max(lo, x)) in one pass (NaN stays NaN, clip(-0, 0, hi)
    is -0, as onnxruntime's Clip)."""
    return np.clip(x, np.float32(params[0]), np.float32(params[1]))


def softmax(x, n_iter, params):
    """Softmax over all item axes jointly, shifted by the item's max for stability."""
    axes = _item_axes(x, n_iter)
    e = np.exp(x - np.max(x, axis=axes, keepdims=True))
    return e / e.sum(axis=axes, keepdims=True, dtype=np.float32)


def layer_norm(x, n_iter, params):
    """(x - mean) / sqrt(var + eps) over all item axes (population variance)."""
    axes = _item_axes(x, n_iter)
    centred = x - x.mean(axis=axes, keepdims=True, dtype=np.float32)
    var = np.mean(centred * centred, axis=axes, keepdims=True, dtype=np.float32)
    return centred / np.sqrt(var + np.float32(params[0]))


def rms_norm(x, n_iter, params):
    """x / sqrt(mean(x * x) + eps) over all item axes."""
    axes = _item_axes(x, n_iter)
    ms = np.mean(x * x, axis=axes, keepdims=True, dtype=np.float32)
    return x / np.sqrt(ms + np.float32(params[0]))


def lrn(x, n_iter, params):
    """ONNX LRN across the first item axis (channels c):
    square_sum[c] = sum of x[c']^2 for c' in [c - floor((size-1)/2), c + ceil((size-1)/2)]
    within range; y = x / (bias + alpha / size * square_sum) ** beta."""
    size, alpha, beta, bias = params
    axis, channels = n_iter, x.shape[n_iter]
    sq = x * x
    square_sum = np.zeros_like(sq)
    for off in range(-((size - 1) // 2), -(-(size - 1) // 2) + 1):
        lo, hi = max(0, -off), min(channels, channels - off)   # c with c + off in range
        if lo >= hi:
            continue
        dst = (slice(None),) * axis + (slice(lo, hi),)
        src = (slice(None),) * axis + (slice(lo + off, hi + off),)
        square_sum[dst] += sq[src]
    scale = np.float32(bias) + np.float32(alpha / size) * square_sum
    return x / scale ** np.float32(beta)


@lazy_ok
def chain(x, n_iter, params):
    """(chain F G): F, then G on F's result, each in its own float32 steps (so a chain
    rounds exactly like the two computes it stands for); F may take a lazy pair."""
    f, g = params
    return apply_compute(g.op, g.args, apply_compute(f.op, f.args, x, n_iter), n_iter)


# ---- element-wise operators: their formulas (apsat/lang/formula.py) in numpy -------------------

# Each formula function in float32 numpy: its table's reading (apsat/lang/primitives.py).
NUMPY_FUNCTIONS = {name: p.numpy for name, p in PRIMITIVES.items()}
NUMPY = fm.Reading(
    const=np.float32,
    call=lambda fn, *xs: NUMPY_FUNCTIONS[fn](*xs),
    compare=lambda kind, a, b=None: a != 0 if kind == "nz" else a >= b,
    select=np.where,
)


def map_evaluator(formula: fm.Formula):
    """The evaluator of a unary map: its formula on every value."""
    def evaluate(x, n_iter, params):
        return fm.interpret(formula, (x,), params, NUMPY)
    return evaluate


def nary_evaluator(formula: fm.Formula, fold: bool):
    """The evaluator of an n-ary operator over the leading item axis: the formula on the
    operands, or with `fold` on (acc, operand) left to right (so n-ary sums round like
    onnxruntime's chain of Adds); a pair's operands are read unbuilt."""
    @lazy_ok
    def evaluate(x, n_iter, params):
        if isinstance(x, LazyPair):
            operands = [x.a, x.b]
        else:
            x = dense(x)
            operands = [_operand(x, n_iter, i) for i in range(x.shape[n_iter])]
        if not fold:
            return fm.interpret(formula, operands, params, NUMPY)
        acc = operands[0]
        for o in operands[1:]:
            acc = fm.interpret(formula, (acc, o), params, NUMPY)
        return acc
    return evaluate


def apply_compute(name: str, params: tuple, x, n_iter: int) -> np.ndarray:
    """Apply compute operator `name` with literal `params` to value `x` whose first
    `n_iter` axes are iterated; returns a float32 array (iterated dims ++ result item).
    The operator's semantics are its registry entry's (`ComputeSpec.evaluate`)."""
    from apsat.lang.ops import COMPUTE_OPS   # here, not at the top: the registry imports us

    fn = COMPUTE_OPS[name].evaluate
    if not getattr(fn, "lazy_ok", False):
        x = dense(x)
    out = np.asarray(fn(x, n_iter, params))
    return out if out.dtype == np.float32 else out.astype(np.float32)


def gather_indices(index: np.ndarray, n: int) -> np.ndarray:
    """access-gather's reading of float32-carried indices into an axis of size n, in
    float32 steps as the kernels take them: NaN as 0, rounded half up, a negative one
    counted from the end, then clamped into [0, n) (every backend's rule)."""
    v = np.asarray(index, np.float32)
    with np.errstate(invalid="ignore"):
        i = np.floor(np.where(np.isnan(v), np.float32(0), v) + np.float32(0.5))
        i = np.where(i < 0, i + np.float32(n), i)
        return np.clip(i, 0, n - 1).astype(np.int64)
