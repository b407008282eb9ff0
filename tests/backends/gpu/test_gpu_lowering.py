"""The lowering (no torch or triton needed): which fused regions become kernels, how views
become indexing, and that the core never imports the GPU extras."""
from __future__ import annotations

import subprocess
import sys

import models

import apsat
from apsat.backends.gpu.expr import const, flat, unflat, value_nodes, var
from apsat.backends.gpu.lower import lower


def _graph(builder):
    res = apsat.optimize(getattr(models, builder)(), target="gpu", verify=False)
    return res.program, lower(res.program)


def test_small_convnet_kernels():
    """conv+bias+relu; conv+bias with the residual add and relu in its epilogue (through
    the NCHW transpose); the global mean with the 2x2 max pool unrolled in its loads (each
    pooled value is read once, so nothing is recomputed); the final Gemm as a
    matrix-vector product."""
    _, g = _graph("small_convnet")
    assert [(k.kind, k.op) for k in g.kernels] == [("gemm", ""), ("gemm", ""),
                                                  ("reduce", "mean"), ("reduce", "sum")]
    assert g.kernels[2].covers == ["reduce-mean", "reduce-max"]
    assert g.kernels[0].covers == ["fused-dot-bias-act relu"]
    assert sorted(g.kernels[1].covers) == ["elementwise-add", "fused-dot-bias", "relu"]
    assert not g.host_steps
    # the im2col operand reads the (padded) input buffer directly: no copy kernel
    assert g.kernels[0].reads == ["x", "c1w", "c1b"]


def test_encoder_block_kernels():
    """Q, K and V projections merged into one gemm (merge.egg, taken by extraction) that reads the first layer
    norm (scale and shift included) through its rows' statistics; the attention atom
    (the scores' 1/sqrt(d) divide, written after the product, moved onto q by
    attention-fusion/aux-scores-divided and read in the kernel's q loads); output
    projection with the residual add; the GELU MLP reading the second layer norm; its
    second residual: five kernels, no norm kernel."""
    _, g = _graph("encoder_block")
    kinds = [(k.kind, k.op) for k in g.kernels]
    assert kinds == [("gemm", ""), ("attention", "plain"), ("gemm", ""), ("gemm", ""), ("gemm", "")]
    assert [[st.op for st in k.stats] for k in g.kernels] == [["layer-norm"], [], [], ["layer-norm"], []]
    assert g.kernels[0].axes["n"] == (96,)                   # Q, K and V: 3 x 32 columns
    assert g.kernels[1].name == "k01_attention"
    assert ("call", "div") in {v[:2] for v in value_nodes(g.kernels[1].values["q"])}
    assert "elementwise-add" in g.kernels[2].covers         # residual in the epilogue
    assert "fused-dot-bias-act gelu" in g.kernels[3].covers
    assert "elementwise-add" in g.kernels[4].covers
    assert g.kernels[1].axes["b"] == (2, 4) and g.kernels[1].axes["m"] == (8,) and g.kernels[1].axes["n"] == (8,)


def test_head_split_indexing_has_no_div_or_mod():
    """Reshape (2, 8, 32) -> (2, 8, 4, 8) and back is plain per-axis indexing."""
    o = tuple(var(f"o{i}", d) for i, d in enumerate((2, 8, 4, 8)))
    back = unflat(flat(o, (2, 8, 4, 8)), (2, 8, 32))
    assert back[0] == o[0] and back[1] == o[1]
    assert repr(back[2]) == "(o2 * 8 + o3)"
    assert "//" not in repr(flat(back, (2, 8, 32))) and "%" not in repr(flat(back, (2, 8, 32)))
    assert unflat(const(0), (1, 1)) == (const(0), const(0))


def test_kernel_graph_as_networkx():
    _, g = _graph("mlp3")
    nx_graph = g.to_networkx()
    assert list(nx_graph.edges) == [("k00_gemm_relu", "k01_gemm_relu"), ("k01_gemm_relu", "k02_gemm_fused_dot_bias")]


def test_core_never_imports_torch_or_triton(tmp_path):
    """Lowering, writing sources and CUDA generation work without the gpu extra."""
    code = f"""
import sys
sys.modules['torch'] = None; sys.modules['triton'] = None    # importing them fails
sys.path.insert(0, 'tests')
import apsat, models
from apsat.backends.gpu.write import write_kernels
import apsat.backends.triton, apsat.backends.cuda
res = apsat.optimize(models.mlp3(), target='gpu', verify=False)
rep = write_kernels(res.program, {str(tmp_path)!r}, compile=False)
assert len(rep['kernels']) == 3 and rep['kernels'][0]['cuda']['cubin'] is None
print('ok')
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_grouped_convolutions():
    """A grouped convolution is a matmul batched over the groups (bias and relu in its
    epilogue); a depthwise one, with one output channel a group, a row reduction; an
    average pool a sum with the division in its epilogue."""
    _, g = _graph("grouped_convnet")
    grouped, depthwise, pool = g.kernels
    assert grouped.kind == "gemm" and grouped.axes["b"] == (1, 2) and grouped.axes["n"] == (4,)
    assert sorted(grouped.covers) == ["dot-product", "elementwise-add", "relu"]
    assert (depthwise.kind, depthwise.op) == ("reduce", "sum")
    assert (pool.kind, pool.op) == ("reduce", "sum") and "elementwise-div" in pool.covers
