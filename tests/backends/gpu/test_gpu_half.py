"""Half-precision kernels (issue 32, part 4): f16 models converted by onnxruntime's own tool
(onnxruntime.transformers.float16, keep_io_types off) run under the Triton interpreter and
pass apsat's float64 verification rule (apsat.pipeline.verify.judge: apsat's error against
a float64 run at most 8x onnxruntime's own float16 error, plus a floor). That rule, not a
fixed tolerance, is the right yardstick: onnxruntime rounds every node to f16, the kernels
round once per fused kernel (a chain computed in f32 registers), so both sit at f16's
rounding error (~1e-3 of the scale) and differ from each other by about as much.

The generated sources are checked too: tl.dot on f16 operands with out_dtype float32,
f16 buffers in the signature, WMMA in the CUDA C, which compiles for sm_90 with no spill.
bf16 runs element-wise work under the interpreter; its products are compiled only (the
Triton 3.9 interpreter multiplies bf16 dot operands as raw integers)."""
from __future__ import annotations

import re
from pathlib import Path

import models
import numpy as np
import pytest
from onnx import TensorProto

import apsat
from apsat.backends.gpu import cuda
from apsat.backends.gpu.lower import lower
from apsat.backends.gpu.triton import kernel_source
from apsat.pipeline.verify import judge, run_oracle
from apsat.pipeline.zoo import random_inputs

ZOO = Path(__file__).resolve().parents[2] / "data" / "real_zoo"
needs_nvcc = pytest.mark.skipif(cuda.nvcc_path() is None,
                                reason="nvcc is not on PATH: CUDA sources are generated, not compiled")


def _f16(proto):
    f16 = pytest.importorskip("onnxruntime.transformers.float16")
    return f16.convert_float_to_float16(proto, keep_io_types=False)


def _optimized(proto):
    return apsat.optimize(apsat.load_onnx(proto), target="gpu", verify=False)


def _check(proto, run, inputs=None):
    """Run proto's optimised program with its kernels; judged against onnxruntime on
    proto itself (the half model), by the float64 rule."""
    res = _optimized(proto)
    inputs = inputs if inputs is not None else random_inputs(res.model, 0)
    got = run(res.program, {**res.model.weights, **inputs})
    got = got if isinstance(got, dict) else {next(iter(res.program.outputs)): got}
    v = judge(run_oracle(proto, inputs), got)
    assert v.ok and v.err_apsat is not None, v
    return res


@pytest.fixture(scope="module")
def mlp_f16():
    return _optimized(_f16(models.mlp3()))


def test_half_buffers_and_tensor_core_products_in_the_triton_source(mlp_f16):
    graph = lower(mlp_f16.program)
    assert {b.dtype for b in graph.buffers.values()} == {"f16"}
    k = graph.kernels[0]
    assert k.kind == "gemm" and k.operand == "f16"
    src = kernel_source(k)
    assert "tl.dot(a, b, out_dtype=tl.float32)" in src and "input_precision" not in src
    assert "a = tl.where(mask_a, va0, 0.0).to(tl.float16)" in src
    assert re.search(r"tl\.store\(out_ptr \+ .*\.to\(tl\.float16\), mask=mask\)", src)
    assert "'out_ptr': '*fp16'" in src and "'*fp32'" not in src
    # the epilogue's bias load is widened: element-wise work is float32
    assert re.search(r"tl\.load\(b0_ptr \+ n0, mask=mask, other=0\.0\)\.to\(tl\.float32\)", src)


def test_float32_products_stay_ieee():
    (k, *_) = lower(_optimized(models.mlp3()).program).kernels
    src = kernel_source(k)
    assert k.operand == "f32" and 'tl.dot(a, b, input_precision="ieee")' in src and "float16" not in src


def test_half_product_matches_onnxruntime(triton_run):
    _check(_f16(models.mlp3()), triton_run)


def test_half_convnet_matches_onnxruntime(triton_run):
    """Convolutions as im2col gemms with a residual epilogue, a pool and a Gemm, in f16
    (tests/models.small_convnet: the real zoo's ResNet took 75 s under the interpreter)."""
    res = _check(_f16(models.small_convnet()), triton_run)
    gemms = [k for k in lower(res.program).kernels if k.kind == "gemm"]
    assert len(gemms) >= 2 and all(k.operand == "f16" for k in gemms)


def test_half_bert_attention_matches_onnxruntime(triton_run):
    """The real zoo's BERT in f16: the attention kernel multiplies f16 q.k^T and p.v."""
    import onnx

    res = _check(_f16(onnx.load(ZOO / "bert.onnx")), triton_run)
    att = [k for k in lower(res.program).kernels if k.kind == "attention"]
    assert att and all(k.operand == "f16" for k in att)
    src = kernel_source(att[0])
    assert "s = tl.dot(q, kt, out_dtype=tl.float32)" in src
    assert "tl.dot(p.to(tl.float16), vt, out_dtype=tl.float32)" in src


def test_bf16_elementwise_runs_under_the_interpreter(triton_run):
    """bf16 buffers load and store under the interpreter (its products are compiled only)."""
    from apsat.pipeline.oracle import retyped_copy

    from apsat.lang.dtypes import round_to
    from apsat.lang.evaluate import evaluate

    proto = retyped_copy(models.elementwise_chain(("Add", "Relu", "Sigmoid")), TensorProto.BFLOAT16)
    res = _optimized(proto)
    assert {b.dtype for b in lower(res.program).buffers.values()} == {"bf16"}
    tensors = {**res.model.weights, **random_inputs(res.model, 0)}
    got, want = triton_run(res.program, tensors), evaluate(res.program, tensors)
    # onnxruntime's CPU has no bf16 Add, so the reference interpreter is the oracle: it
    # rounds after each of the three nodes, the one kernel once, so they may differ by
    # two bf16 rounding steps (2 x 2^-8 relative each side: 2^-7)
    assert np.allclose(got, want, rtol=2.0 ** -7, atol=2.0 ** -7 * max(1.0, float(np.abs(want).max())))
    assert np.array_equal(got, round_to(got, "bf16"))      # stored in bf16


def test_bf16_products_compile_for_sm90_on_tensor_cores():
    pytest.importorskip("triton")
    from apsat.backends.gpu.aot import aot_compile_source
    from apsat.pipeline.oracle import retyped_copy

    (k, *_) = lower(_optimized(retyped_copy(models.mlp3(), TensorProto.BFLOAT16)).program).kernels
    out = aot_compile_source(kernel_source(k), k.name)
    assert "error" not in out, out
    assert re.search(r"mma\.sync\.aligned\.\w+\.row\.col\.f32\.bf16\.bf16\.f32", out["ptx"])
    assert out["spills"] in (0, None)


@needs_nvcc
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_half_gemm_cuda_uses_wmma_and_compiles_without_spills(dtype, tmp_path):
    from apsat.pipeline.oracle import retyped_copy

    proto = _f16(models.mlp3()) if dtype == "f16" else retyped_copy(models.mlp3(), TensorProto.BFLOAT16)
    ctype = {"f16": "__half", "bf16": "__nv_bfloat16"}[dtype]
    for k in lower(_optimized(proto).program).kernels:
        src, launch = cuda.kernel_source(k)
        assert "nvcuda::wmma::mma_sync" in src and f"const {ctype}* __restrict__" in src
        assert f"16, 16, 16, {ctype}, nvcuda::wmma::row_major" in src
        assert ("__float2half_rn(" if dtype == "f16" else "__float2bfloat16_rn(") in src
        res = cuda.compile_cuda(src, tmp_path / f"{k.name}.cu")
        assert res["ok"], res["log"]
        assert res["spill_stores"] == 0 and res["spill_loads"] == 0
        t = launch["tiles"]
        # A and B tiles in the half type, the float accumulator tile
        assert res["shared_bytes"] == (t["BM"] + t["BN"]) * t["BK"] * 2 + t["BM"] * t["BN"] * 4


@needs_nvcc
@pytest.mark.parametrize("builder", ["small_convnet", "encoder_block"])
def test_every_f16_kernel_kind_compiles_without_spills(builder, tmp_path):
    """Convolutions, reductions and attention on f16 buffers: clean sm_90 builds."""
    kinds = set()
    for k in lower(_optimized(_f16(getattr(models, builder)())).program).kernels:
        src, _ = cuda.kernel_source(k)
        res = cuda.compile_cuda(src, tmp_path / f"{k.name}.cu")
        assert res["ok"] and res["spill_stores"] == 0 and res["spill_loads"] == 0, res["log"]
        kinds.add(k.kind)
    assert kinds >= ({"gemm", "reduce"} if builder == "small_convnet" else {"gemm", "attention"})


@needs_nvcc
@pytest.mark.parametrize("tile, guarded", [(32, True), (64, False)])
def test_wmma_fragment_guard_only_where_warps_outnumber_fragments(mlp_f16, tile, guarded, tmp_path):
    """32 x 32: four fragments for eight warps, so each checks that its fragment exists;
    64 x 64: two each, no check (the checked form spilled on ResNet-50)."""
    k = lower(mlp_f16.program, tiles={"gemm": {"BM": tile, "BN": tile, "BK": 32}}).kernels[1]
    src, launch = cuda.kernel_source(k)
    assert launch["tiles"]["BM"] == launch["tiles"]["BN"] == tile
    assert ("if (f < BM / 16 * FN)" in src) == guarded
    res = cuda.compile_cuda(src, tmp_path / f"{k.name}.cu")
    assert res["ok"] and res["spill_stores"] == 0 and res["spill_loads"] == 0, res["log"]
