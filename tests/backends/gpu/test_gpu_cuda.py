"""The generated CUDA C compiles for sm_90 with nvcc, kind by kind, cleanly (nvcc's exit
status 0, no warning, ptxas's register and shared-memory report present); a source with a
generation bug fails. The Triton kernels compile ahead of time for sm_90 without a GPU.
Skipped where nvcc (or triton) is not on the machine."""
from __future__ import annotations

import pytest
from gpu_cases import KERNELS

import apsat
from apsat.backends.gpu import cuda
from apsat.backends.gpu.lower import lower

needs_nvcc = pytest.mark.skipif(cuda.nvcc_path() is None,
                                reason="nvcc is not on PATH: CUDA sources are generated, not compiled")

# One case per kernel kind and variant (each compiles in about half a second).
CASES = ["gemm-relu", "gemm-batched", "gemm-residual", "conv-clip", "gemv-sigmoid", "maxpool",
         "mean-long-rows", "softmax-long-rows", "layernorm-affine", "chain-gelu-sigmoid-tanh",
         "pow", "lrn", "select", "chain-op-mul-tanh-sigmoid", "gemm-chain-residual",
         "layernorm-gemm", "rmsnorm-gemm", "layernorm-residual"]


def _kernels(case):
    text, shapes, _ = KERNELS[case]
    return lower(apsat.parse(text, shapes)).kernels


@needs_nvcc
@pytest.mark.parametrize("case", CASES)
def test_cuda_kernels_compile_for_sm90(case, tmp_path):
    for k in _kernels(case):
        src, launch = cuda.kernel_source(k)
        res = cuda.compile_cuda(src, tmp_path / f"{k.name}.cu")
        assert res["returncode"] == 0, res["log"]
        assert res["ok"] and "warning" not in res["log"].lower(), res["log"]
        assert "Compiling entry function" in res["log"] and res["registers"] > 0
        assert res["spill_stores"] == 0 and (tmp_path / f"{k.name}.cubin").stat().st_size > 0
        if k.kind == "gemm":
            t = launch["tiles"]
            # the A and B tiles, and per norm read inline its rows' statistics (mean and
            # den for layer-norm, den for rms-norm)
            stats = sum(1 if st.op == "rms-norm" else 2 for st in k.stats) * t["BM"]
            assert res["shared_bytes"] == ((t["BM"] + t["BN"]) * t["BK"] + stats) * 4


@needs_nvcc
@pytest.mark.parametrize("bug", ["undefined-function", "syntax", "unused-variable"])
def test_generation_bug_fails(bug, tmp_path):
    """The check reads nvcc's status and output: a broken source is refused, and so is
    one that compiles with a warning."""
    (k,) = _kernels("gemm-relu")
    src, _ = cuda.kernel_source(k)
    broken = {"undefined-function": src.replace("fmaf(", "fmaff(", 1),
              "syntax": src.replace("acc[i][j] = 0.0f;", "acc[i][j] = 0.0f", 1),
              "unused-variable": src.replace("const int tid", "const int unused_by_anything = 3;\n  const int tid", 1)}[bug]
    assert broken != src
    res = cuda.compile_cuda(broken, tmp_path / "broken.cu")
    assert not res["ok"]
    if bug == "unused-variable":
        assert res["returncode"] == 0 and "warning" in res["log"].lower()
    else:
        assert res["returncode"] != 0 and "error" in res["log"].lower() and res["cubin"] is None


@pytest.mark.parametrize("case", ["gemm-residual", "softmax-long-rows"])
def test_triton_kernels_compile_ahead_of_time(case, tmp_path):
    pytest.importorskip("triton", reason="AOT compilation needs triton (pip install apsat[gpu])")
    from apsat.backends.gpu.aot import aot_compile
    from apsat.backends.gpu.triton import kernel_source

    (k,) = _kernels(case)
    path = tmp_path / f"{k.name}.py"
    path.write_text(kernel_source(k))
    res = aot_compile(path)
    assert "error" not in res, res.get("error")
    assert res["cubin"][:4] == b"\x7fELF" and ".target sm_90" in res["ptx"]
    if res["registers"] is not None:        # cuobjdump ships with triton's nvidia backend
        assert res["registers"] > 0 and res["spills"] == 0
    if k.kind == "gemm":
        assert res["shared_bytes"] > 0      # tl.dot stages its operands in shared memory
