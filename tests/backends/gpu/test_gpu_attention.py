"""The attention atom's kernel (apsat/backends/gpu/attention.py): one FlashAttention-style
kernel per atom, equal to the reference interpreter (apsat.lang.evaluate) under the
Triton interpreter, its CUDA C compiling for sm_90 with nvcc, and the unfused fallback.

Sizes are not tile multiples: 3 heads, m = 13 queries, n = 19 keys, d = 12, e = 10 (the
kernel pads d and e to 16 and masks every edge). The masked-row cases force 16-key tiles
over the 19 keys, so one row's scores are all -inf in its first key tile and finite in
the second (the online softmax's -inf guard); one case takes 16 x 16 tiles over 37
queries and 41 keys (several tiles each way, rescaling across key tiles).

Tolerances: rtol 1e-5 and atol 1e-5 x the output's scale (gpu_cases.assert_close). The
kernel sums the scores and p.v in tiles and normalises once at the end, where the
reference takes the softmax first and then an einsum, so its sums round differently; the
largest difference seen is 1.3e-6 at outputs of scale 2.6, and atol is 10x the
element-wise kernels' 1e-6 to leave room for the GPU's exp. NaN must appear exactly where
the reference has it (equal_nan).
"""
from __future__ import annotations

import numpy as np
import pytest
from gpu_cases import assert_close

import apsat
from apsat.backends.gpu import cuda
from apsat.backends.gpu.lower import lower

RTOL, ATOL = 1e-5, 1e-5
H, M, N, D, E = 3, 13, 19, 12, 10
NEG_MAX = -3.4e38          # exporters' "finfo.min" masks


def _shape(it, item=()):
    return f"(access-shape (shape {' '.join(map(str, it))}) (shape {' '.join(map(str, item))}))"


def _bcast(x, it, item, to_it, to_item):
    """x reshaped to (it, item), then broadcast to (to_it, to_item)."""
    return f"(access-broadcast (access-reshape {x} {_shape(it, item)}) {_shape(to_it, to_item)})"


def _attention(q, k, v, bias="(access-literal 0.0)", safe=1, heads=(H,), m=M, n=N, d=D, e=E):
    """`(attention SAFE qk bias v)` over q (heads.., m, d), k (heads.., n, d) and
    v (heads.., n, e) terms, as the importer's batched Q.K^T and P.V read them."""
    hs, r = tuple(heads), len(heads)
    qk = (f"(access-pair {_bcast(q, hs + (m, 1), (d,), hs + (m, n), (d,))} "
          f"{_bcast(k, hs + (1, n), (d,), hs + (m, n), (d,))})")
    perm = " ".join(map(str, list(range(r)) + [r + 1, r]))
    vt = _bcast(f"(access-transpose {v} (list {perm}))", hs + (1, e), (n,), hs + (m, e), (n,))
    return f"(attention {safe} {qk} {bias} {vt})"


def _mask(name, heads=(H,), m=M, n=N):
    """A (1, m, n) mask tensor broadcast over the heads, as the bias."""
    return _bcast(f"(access-tensor {name})", (1,) * len(heads) + (m, n), (), tuple(heads) + (m, n), ())


QKV = {"q": (H, M, D), "k": (H, N, D), "v": (H, N, E)}
PLAIN = ("(access-tensor q)", "(access-tensor k)", "(access-tensor v)")
SCALED_Q = ("(compute elementwise-mul (access-pair (access (access-tensor q) 3) "
            f"{_bcast('(access-literal 0.25)', (1, 1, 1), (), (H, M, D), ())}))")


def _gqa_kv(name, width):
    """(1, 2, n, width) broadcast to 4 heads, query head h reading kv head h // 2."""
    grown = (f"(access-broadcast (access-insert-axis (access-tensor {name}) 2) "
             f"{_shape((1, 2, 2, N, width))})")
    return f"(access-reshape {grown} {_shape((1, 4, N, width))})"


def _masks(rng, m=M, n=N):
    """Mask inputs: random -inf / -3.4e38 entries, a causal mask, and one with row 5
    fully masked and row 2 masked over its first 16 keys."""
    hole = rng.random((1, m, n)) < 0.3
    full = np.zeros((1, m, n), np.float32)
    full[0, 5, :] = -np.inf
    full[0, 2, :16] = -np.inf
    return {"inf": np.where(hole, -np.inf, 0.0).astype(np.float32),
            "neg": np.where(hole, NEG_MAX, 0.0).astype(np.float32),
            "causal": np.triu(np.full((m, n), -np.inf, np.float32), 1)[None],
            "full": full}


# name -> (surface text, tensor shapes, tile overrides)
CASES = {
    "no-bias": (_attention(*PLAIN), QKV, None),
    "no-bias-unsafe": (_attention(*PLAIN, safe=0), QKV, None),
    "additive-bias": (_attention(*PLAIN, bias="(access-tensor bias)"), {**QKV, "bias": (H, M, N)}, None),
    "mask-inf": (_attention(*PLAIN, bias=_mask("inf")), {**QKV, "inf": (1, M, N)}, None),
    "mask-neg-max": (_attention(*PLAIN, bias=_mask("neg")), {**QKV, "neg": (1, M, N)}, None),
    "causal": (_attention(*PLAIN, bias=_mask("causal")), {**QKV, "causal": (1, M, N)}, None),
    "masked-row-safe": (_attention(*PLAIN, bias=_mask("full")), {**QKV, "full": (1, M, N)},
                        {"attention": {"BM": 16, "BN": 16}}),
    "masked-row-unsafe": (_attention(*PLAIN, bias=_mask("full"), safe=0), {**QKV, "full": (1, M, N)},
                          {"attention": {"BM": 16, "BN": 16}}),
    "grouped-query": (_attention("(access-tensor q)", _gqa_kv("k", D), _gqa_kv("v", E), heads=(1, 4)),
                      {"q": (1, 4, M, D), "k": (1, 2, N, D), "v": (1, 2, N, E)}, None),
    "scaled-q-prologue": (_attention(SCALED_Q, *PLAIN[1:]), QKV, None),
    "multi-tile-causal": (_attention(*PLAIN, bias=_mask("causal", m=37, n=41), m=37, n=41),
                          {"q": (H, 37, D), "k": (H, 41, D), "v": (H, 41, E), "causal": (1, 37, 41)},
                          {"attention": {"BM": 16, "BN": 16}}),
    # merged heads (transpose to (m, heads, e)) and a relu: the kernel's epilogue chain
    "epilogue-relu": (f"(compute relu (access-transpose {_attention(*PLAIN)} (list 1 0 2)))", QKV, None),
    # tensors named like the CUDA kernel's locals (x, s, p, o): its parameters must not clash
    "names-like-locals": (_attention("(access-tensor x)", "(access-tensor s)", "(access-tensor p)",
                                     bias="(access-tensor o)"),
                          {"x": (H, M, D), "s": (H, N, D), "p": (H, N, E), "o": (H, M, N)}, None),
}


def _mask_values(name, shape, rng):
    """A mask tensor of `shape` (1, m, n): "inf" and "neg" put -inf or -3.4e38 on about a
    third of the scores, "causal" -inf above the diagonal, "full" -inf on all of row 5
    and on the first 16 keys of row 2 (a row that starts masked in the first key tile)."""
    hole = rng.random(shape) < 0.3
    if name in ("inf", "neg"):
        return np.where(hole, -np.inf if name == "inf" else NEG_MAX, 0.0).astype(np.float32)
    if name == "causal":
        return np.triu(np.full(shape[1:], -np.inf, np.float32), 1)[None]
    full = np.zeros(shape, np.float32)
    full[0, 5, :] = -np.inf
    full[0, 2, :16] = -np.inf
    return full


def _inputs(program, seed=0) -> dict:
    """Standard normal q, k, v and biases; the masks by name (_mask_values)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name in program.tensor_names():
        shape = program.tensor_shapes[name]
        out[name] = (_mask_values(name, shape, rng) if name in ("inf", "neg", "causal", "full")
                     else rng.standard_normal(shape).astype(np.float32))
    return out


def _program(case):
    text, shapes, _ = CASES[case]
    return apsat.parse(text, shapes)


@pytest.mark.parametrize("case", sorted(CASES))
def test_attention_kernel_matches_reference(case, triton_run):
    program = _program(case)
    tiles = CASES[case][2]
    graph = lower(program, tiles)
    assert [k.kind for k in graph.kernels] == ["attention"] and not graph.host_steps
    tensors = _inputs(program)
    want = apsat.evaluate(program, tensors)
    got = triton_run(program, tensors, tiles=tiles)
    assert_close(got, want, RTOL, ATOL)
    if case == "masked-row-unsafe":      # the fully masked row is NaN, the others are not
        assert np.isnan(want[:, 5]).all() and not np.isnan(np.delete(want, 5, axis=1)).any()
    if case == "masked-row-safe":
        assert (want[:, 5] == 0).all() and not np.isnan(want).any()


def test_one_kernel_reads_operands_and_writes_only_the_output():
    """No m x n scores buffer: the kernel reads q, k, v and the mask once each (ideal
    traffic) and writes the (heads, m, e) output; the prologue and epilogue ride along."""
    graph = lower(_program("mask-inf"))
    (k,) = graph.steps
    assert k.kind == "attention" and k.op == "safe" and k.reads == ["q", "k", "inf", "v"]
    assert k.elements_read == H * M * D + H * N * D + M * N + H * N * E
    assert k.elements_written == H * M * E
    assert [b.dims for b in graph.buffers.values() if b.kind != "input"] == [(H, M, E)]
    assert k.axes == {"b": (H,), "m": (M,), "n": (N,), "d": (D,), "e": (E,)}
    assert k.flops == H * M * N * (2 * D + 1 + 4) + H * M * E * 2 * N     # the registry's figure
    (pro,) = lower(_program("scaled-q-prologue")).kernels
    assert sorted(pro.covers) == ["attention", "elementwise-mul"]
    (epi,) = lower(_program("epilogue-relu")).kernels
    assert sorted(epi.covers) == ["attention", "relu"]


@pytest.mark.parametrize("safe", [0, 1])
def test_unsupported_atom_falls_back_to_unfused_kernels(safe, triton_run):
    """A query that varies along the key axis is no broadcast: the atom is lowered as its
    expansion (scores, softmax, the NaN select when SAFE, p.v), as kernels and not a host
    step, and still equals the reference (row 5 fully masked: 0 or NaN)."""
    qf = "(access (access-tensor qf) 3)"
    qk = f"(access-pair {qf} {_bcast('(access-tensor k)', (H, 1, N), (D,), (H, M, N), (D,))})"
    vt = _bcast("(access-transpose (access-tensor v) (list 0 2 1))", (H, 1, E), (N,), (H, M, E), (N,))
    text = f"(attention {safe} {qk} {_mask('full')} {vt})"
    program = apsat.parse(text, {"qf": (H, M, N, D), "k": (H, N, D), "v": (H, N, E), "full": (1, M, N)})
    graph = lower(program)
    assert not graph.host_steps and "attention" not in [k.kind for k in graph.kernels]
    assert [(k.kind, k.op) for k in graph.kernels] == [("reduce", "sum"), ("reduce", "softmax"),
                                                      ("gemm", "")]
    tensors = _inputs(program)
    want = apsat.evaluate(program, tensors)
    assert np.isnan(want[:, 5]).all() != bool(safe)
    assert_close(triton_run(program, tensors), want, RTOL, ATOL)


needs_nvcc = pytest.mark.skipif(cuda.nvcc_path() is None,
                                reason="nvcc is not on PATH: CUDA sources are generated, not compiled")


@needs_nvcc
@pytest.mark.parametrize("case", sorted(CASES))
def test_attention_cuda_compiles_for_sm90(case, tmp_path):
    (k,) = lower(_program(case), CASES[case][2]).kernels
    src, launch = cuda.kernel_source(k)
    res = cuda.compile_cuda(src, tmp_path / f"{k.name}.cu")
    assert res["ok"], res["log"]
    assert res["registers"] > 0 and res["spill_stores"] == 0
    assert res["shared_bytes"] == launch["tiles"]["shared_bytes"]


def test_triton_attention_compiles_ahead_of_time(tmp_path):
    pytest.importorskip("triton", reason="AOT compilation needs triton (pip install apsat[gpu])")
    from apsat.backends.gpu.aot import aot_compile
    from apsat.backends.gpu.triton import kernel_source

    (k,) = lower(_program("causal")).kernels
    path = tmp_path / f"{k.name}.py"
    path.write_text(kernel_source(k))
    res = aot_compile(path)
    assert "error" not in res, res.get("error")
    assert res["cubin"][:4] == b"\x7fELF" and ".target sm_90" in res["ptx"]
