"""Cases and helpers of the GPU backend tests: small programs, one per kernel kind and
variant, and the comparison they use.

Every size is chosen *not* to be a multiple of the tiles (16 for matmul tiles, powers of
two for element-wise blocks and reduction chunks), so masked edges are exercised; two
reductions have rows longer than one 1024-column chunk. `KERNELS` maps a case name to
(surface text, tensor shapes, the kernel kinds its lowering must produce).
"""
from __future__ import annotations

import numpy as np

# Kernels compute in fp32 but sum in another order than numpy (tiles of K, tree reductions)
# and their transcendental functions are not numpy's (tanh from exp, pow from exp2/log2):
# rtol 1e-5 and an absolute 1e-6 times the output's scale (max |want|, at least 1), a few
# float32 ulps of the sums involved at these sizes.
RTOL, ATOL = 1e-5, 1e-6


def optimized_matches_onnxruntime(model, triton_run):
    """apsat.optimize(model) for the gpu target, its kernels run under Triton, checked
    against onnxruntime on the model (apsat.pipeline.verify's tolerances); returns the
    result and its kernel graph."""
    import apsat
    from apsat.backends.gpu.lower import lower
    from apsat.pipeline.verify import compare
    from apsat.pipeline.zoo import ort_run, random_inputs

    res = apsat.optimize(apsat.load_onnx(model), target="gpu", verify=False)
    inputs = random_inputs(res.model, 0)
    want = ort_run(res.model.onnx, inputs)
    got = triton_run(res.program, {**res.model.weights, **inputs})
    got = got if isinstance(got, dict) else {next(iter(res.program.outputs)): got}
    v = compare(want, got)
    assert v.ok, v
    return res, lower(res.program)


def assert_close(got, want, rtol=RTOL, atol=ATOL):
    """|got - want| <= atol * scale + rtol * |want| elementwise (nan where want is nan)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    finite = np.isfinite(want)
    scale = max(1.0, float(np.abs(want[finite]).max(initial=0.0)))
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol * scale, equal_nan=True)


def _bcast(name, shape, ones_at, target):
    """A 1-D tensor reshaped with 1s except at one axis, then broadcast to `target`."""
    rl = " ".join("1" if i != ones_at else str(shape) for i in range(len(target)))
    return (f"(access-broadcast (access-reshape (access-tensor {name}) (access-shape (shape {rl}) (shape))) "
            f"(access-shape (shape {' '.join(map(str, target))}) (shape)))")


KERNELS = {
    # gemm: fused matmul + bias + activation
    "gemm-relu": (
        "(fused-dot-bias-act relu (access (access-tensor x) 1) (access (access-tensor w) 1) (access (access-tensor b) 1))",
        {"x": (37, 19), "w": (23, 19), "b": (23,)}, ["gemm"]),
    "gemm-gelu-3d": (
        "(fused-dot-bias-act gelu (access (access-tensor x) 2) (access (access-transpose (access-tensor w) (list 1 0)) 1) (access (access-tensor b) 1))",
        {"x": (3, 7, 21), "w": (21, 45), "b": (45,)}, ["gemm"]),
    # gemm: an im2col convolution (zero padding, stride 2) + bias + relu6; the NCHW
    # transpose of the result is an output view, copied out by an element-wise kernel
    "conv-clip": (
        "(access-transpose (fused-dot-bias-act (clip 0.0 6.0) (access-squeeze (access-windows (access (access-pad (access-pad (access-tensor x) zero-padding 2 1 1) zero-padding 3 1 1) 1) (shape 3 3 3) (shape 1 2 2)) 1) (access (access-tensor w) 1) (access (access-tensor b) 1)) (list 0 3 1 2))",
        {"x": (1, 3, 11, 11), "w": (5, 3, 3, 3), "b": (5,)}, ["gemm", "elementwise"]),
    # gemm: batched (attention-style) dot-product of two broadcasts
    "gemm-batched": (
        "(compute dot-product (access-pair (access-broadcast (access-reshape (access-tensor q) (access-shape (shape 3 17 1) (shape 20))) (access-shape (shape 3 17 19) (shape 20))) (access-broadcast (access-reshape (access-tensor k) (access-shape (shape 3 1 19) (shape 20))) (access-shape (shape 3 17 19) (shape 20)))))",
        {"q": (3, 17, 20), "k": (3, 19, 20)}, ["gemm"]),
    # gemm with an epilogue chain: residual add + relu through a transpose
    "gemm-residual": (
        "(compute relu (compute elementwise-add (access-pair (access-transpose (fused-dot-bias (access (access-tensor x) 1) (access (access-tensor w) 1) (access (access-tensor b) 1)) (list 1 0)) (access (access-tensor r) 2))))",
        {"x": (37, 19), "w": (23, 19), "b": (23,), "r": (23, 37)}, ["gemm"]),
    # gemm whose epilogue is a chain operator: (chain elementwise-add relu) over the pair
    "gemm-chain-residual": (
        "(compute (chain elementwise-add relu) (access-pair (access-transpose (fused-dot-bias (access (access-tensor x) 1) (access (access-tensor w) 1) (access (access-tensor b) 1)) (list 1 0)) (access (access-tensor r) 2)))",
        {"x": (37, 19), "w": (23, 19), "b": (23,), "r": (23, 37)}, ["gemm"]),
    "gemm-systolic": (
        "(systolic-array 19 23 (access (access-tensor a) 1) (access (access-tensor b) 0))",
        {"a": (37, 19), "b": (19, 23)}, ["gemm"]),
    # reduce: a matrix-vector product (one row of x) with sigmoid
    "gemv-sigmoid": (
        "(fused-dot-bias-act sigmoid (access (access-tensor x) 1) (access (access-tensor w) 1) (access (access-tensor b) 1))",
        {"x": (1, 50), "w": (23, 50), "b": (23,)}, ["reduce"]),
    # reduce: max pooling over min-padded windows with strides, mean, sum, softmax, layer norm
    "maxpool": (
        "(compute reduce-max (access-windows (access (access-pad (access-pad (access-tensor x) min-padding 2 1 1) min-padding 3 0 1) 2) (shape 3 2) (shape 2 2)))",
        {"x": (2, 3, 9, 7)}, ["reduce"]),
    "mean-long-rows": (
        "(compute reduce-mean (access (access-tensor x) 1))", {"x": (3, 1500)}, ["reduce"]),
    "sum-4d": (
        "(compute reduce-sum (access (access-tensor x) 2))", {"x": (3, 5, 7, 9)}, ["reduce"]),
    "softmax-long-rows": (
        "(compute softmax (access (access-tensor x) 1))", {"x": (5, 1100)}, ["reduce"]),
    "layernorm-affine": (
        "(compute elementwise-add (access-pair (compute elementwise-mul (access-pair "
        "(access (compute (layer-norm 1e-05) (access (access-tensor x) 1)) 2) "
        + _bcast("s", 37, 1, (5, 37)) + ")) " + _bcast("c", 37, 1, (5, 37)) + "))",
        {"x": (5, 37), "s": (37,), "c": (37,)}, ["reduce"]),
    # gemm reading a norm inline (folds.normalised): each tile computes its rows'
    # statistics first; pre-norm with scale and shift, rms-norm with a scale, and
    # post-norm, the norm read by the operand and by the residual add in the epilogue
    "layernorm-gemm": (
        "(fused-dot-bias (access (compute elementwise-add (access-pair (compute elementwise-mul (access-pair "
        "(access (compute (layer-norm 1e-05) (access (access-tensor x) 1)) 2) "
        + _bcast("s", 45, 1, (37, 45)) + ")) " + _bcast("c", 45, 1, (37, 45)) + ")) 1) "
        "(access (access-tensor w) 1) (access (access-tensor b) 1))",
        {"x": (37, 45), "s": (45,), "c": (45,), "w": (23, 45), "b": (23,)}, ["gemm"]),
    "rmsnorm-gemm": (
        "(fused-dot-bias-act relu (access (compute elementwise-mul (access-pair "
        "(access (compute (rms-norm 1e-06) (access (access-tensor x) 2)) 3) "
        + _bcast("s", 45, 2, (2, 19, 45)) + ")) 2) (access (access-tensor w) 1) (access (access-tensor b) 1))",
        {"x": (2, 19, 45), "s": (45,), "w": (23, 45), "b": (23,)}, ["gemm"]),
    "layernorm-residual": (
        "(compute elementwise-add (access-pair (access (fused-dot-bias "
        "(access (compute (layer-norm 1e-05) (access (access-tensor x) 1)) 1) "
        "(access (access-tensor w) 1) (access (access-tensor b) 1)) 2) "
        "(access (compute (layer-norm 1e-05) (access (access-tensor x) 1)) 2)))",
        {"x": (37, 45), "w": (45, 45), "b": (45,)}, ["gemm"]),
    # a norm read as the B operand: its rows vary along n, so the gemm cannot compute
    # their statistics before its main loop, and the norm keeps a kernel of its own
    "layernorm-gemm-b-side": (
        "(fused-dot-bias (access (access-tensor x) 1) "
        "(access (compute (layer-norm 1e-05) (access (access-tensor y) 1)) 1) (access (access-tensor b) 1))",
        {"x": (37, 45), "y": (23, 45), "b": (23,)}, ["reduce", "gemm"]),
    # elementwise chains
    "chain-gelu-sigmoid-tanh": (
        "(compute gelu (compute elementwise-mul (access-pair (compute sigmoid (access-tensor x)) (compute tanh (compute negative (access-tensor y))))))",
        {"x": (7, 45), "y": (7, 45)}, ["elementwise"]),
    "chain-div-sqrt-clip-exp-erf": (
        "(compute elementwise-div (access-pair (compute sqrt (compute (clip 0.5 3.0) (compute exp (access-tensor x)))) (compute erf (access-tensor y))))",
        {"x": (7, 45), "y": (7, 45)}, ["elementwise"]),
    # chain operators (fusion/chain): one kernel; a nested chain over a pair, and a
    # unary chain inlined into a consumer
    "chain-op-mul-tanh-sigmoid": (
        "(compute (chain (chain elementwise-mul tanh) sigmoid) (access-pair (access-tensor x) (access-tensor y)))",
        {"x": (7, 45), "y": (7, 45)}, ["elementwise"]),
    "chain-op-inlined": (
        "(compute elementwise-sub (access-pair (compute (chain exp (clip 0.5 3.0)) (access-tensor x)) (compute (chain (chain select gelu) negative) (access (access-tensor c) 0))))",
        {"x": (7, 45), "c": (3, 7, 45)}, ["elementwise"]),
    "select": ("(compute select (access (access-tensor c) 0))", {"c": (3, 7, 45)}, ["elementwise"]),
    "pow": ("(compute elementwise-pow (access-pair (access-tensor x) (access-tensor y)))",
            {"x": (6, 33), "y": (6, 33)}, ["elementwise"]),
    "nary-add-sub": (
        "(compute elementwise-sub (access-pair (compute elementwise-add (access (access-tensor c) 1)) (access (access-tensor d) 1)))",
        {"c": (5, 3, 4), "d": (5, 4)}, ["elementwise"]),
    "lrn": ("(compute (lrn 3 0.0001 0.75 1.0) (access (access-tensor x) 1))", {"x": (2, 7, 5, 5)},
            ["elementwise"]),
    "concat-slice": (
        "(compute relu (access-concatenate (access-slice (access-tensor x) 1 2 30) (access-tensor y) 1))",
        {"x": (4, 33), "y": (4, 9)}, ["elementwise"]),
}


def inputs_for(case: str, program, seed: int = 0) -> dict:
    """Seeded inputs; pow gets negative bases with integer exponents and positive bases
    with fractional ones, select gets zeros in its condition."""
    rng = np.random.default_rng(seed)
    out = {n: rng.standard_normal(program.tensor_shapes[n]).astype(np.float32)
           for n in program.tensor_names()}
    if case == "pow":
        x, y = out["x"], out["y"]
        neg = np.arange(x.size).reshape(x.shape) % 2 == 0
        out["x"] = np.where(neg, -np.abs(x) - 0.1, np.abs(x) + 0.1).astype(np.float32)
        out["y"] = np.where(neg, np.round(2 * y), y).astype(np.float32)
    if case == "select":
        out["c"][0][::2] = 0.0
    return out
