"""Tile tuning (tuning.py) and per-kernel timing (profile.py) under the Triton interpreter.

No GPU here: the search runs its GPU code path with the interpreter and a timer that is
told what to answer, so the choice it must make is known. What is checked: the search
space, the key that lets kernels of one shape share a search, the cache (JSON, robust to
damage, merged across writers), rejection of candidates that compute something else or
leave elements unwritten, that a cached shape is never searched again, and that tuned
tiles reach the kernels lower(), write_kernels and run_kernels produce, which still equal
onnxruntime."""
from __future__ import annotations

import itertools
import json
import math
import warnings

import models
import numpy as np
import pytest
from gpu_cases import KERNELS

import apsat
from apsat.backends.gpu import tiling
from apsat.backends.gpu.lower import lower
from apsat.backends.gpu.write import write_kernels
from apsat.backends.gpu.tuning import TILE_KEYS, TuningCache, candidates, kernel_key, plain_tiles
from apsat.pipeline.verify import compare
from apsat.pipeline.zoo import ort_run, random_inputs

GPU = "Test GPU 80GB"


@pytest.fixture(scope="module")
def mlp():
    """An MLP whose first two layers have one shape (16 -> 16 -> 16 -> 9): two gemm
    kernels of one computation, one of another."""
    res = apsat.optimize(apsat.load_onnx(models.mlp3(batch=7, sizes=(16, 16, 16, 9))), target="gpu",
                         verify=False)
    return res, {**res.model.weights, **random_inputs(res.model, 0)}


def _scripted(times):
    """A timer answering `times` in turn (then a large figure), counting its calls."""
    it = iter(times)

    def timer(fn):
        fn()
        timer.calls += 1
        return next(it, 1e9)
    timer.calls = 0
    return timer


def test_kernels_of_one_shape_share_a_key(mlp):
    res, _ = mlp
    k0, k1, k2 = lower(res.program).kernels
    assert k0.reads != k1.reads                       # different buffers ...
    assert kernel_key(k0) == kernel_key(k1)           # ... one computation
    assert kernel_key(k2) != kernel_key(k0)           # another shape, no activation
    retiled = lower(res.program, {"gemm": {"BM": 32, "BN": 16, "BK": 32}}).kernels[0]
    assert kernel_key(retiled) == kernel_key(k0)      # tiles are not part of the key


def _kernels():
    """One kernel of each kind: gemm and attention from an encoder block, a long-row
    softmax, an element-wise chain."""
    res = apsat.optimize(apsat.load_onnx(models.encoder_block()), target="gpu", verify=False)
    out = list(lower(res.program).kernels)
    for case in ("softmax-long-rows", "chain-gelu-sigmoid-tanh"):
        text, shapes, _ = KERNELS[case]
        out += lower(apsat.parse(text, shapes)).kernels
    return out


def test_candidates_start_with_the_roofline_choice_and_fit():
    kernels = _kernels()
    assert {k.kind for k in kernels} == set(TILE_KEYS)
    for k in kernels:
        cands = candidates(k, 12)
        assert cands[0] == plain_tiles(k.tiles) and 1 < len(cands) <= 12, k.name
        assert len({json.dumps(c, sort_keys=True) for c in cands}) == len(cands)
        for c in cands:
            assert set(c) - {"num_warps", "num_stages"} <= TILE_KEYS[k.kind], c
            if k.kind == "gemm":      # every stage's operand tiles fit shared memory
                a = {g: math.prod(d) for g, d in k.axes.items()}
                assert tiling.gemm_time(a["b"], a["m"], a["n"], a["k"], c["BM"], c["BN"], c["BK"],
                                        c.get("num_stages", 2)) is not None, c
        if k.kind == "gemm":          # the space varies the tile shape within the limit
            assert len({(c["BM"], c["BN"], c["BK"]) for c in cands}) > 1


def test_a_search_keeps_the_fastest_and_is_never_repeated(mlp, tmp_path):
    from apsat.backends.gpu.profile import profile

    res, tensors = mlp
    graph = lower(res.program)
    cache = TuningCache(GPU, tmp_path / "t.json")
    limit = 3
    # kernel k0: its second candidate is fastest; k1 shares its key (not searched again);
    # k2: the roofline's own choice is fastest
    timer = _scripted([50.0, 20.0, 30.0, 21.0, 10.0, 40.0, 45.0])
    rows = profile(graph, tensors, timer, cache=cache, tune=True, limit=limit, device="cpu")
    k0, k1, k2 = graph.kernels
    assert [r["tuning"]["searched"] for r in rows] == [True, False, True]
    assert rows[0]["tiles"] == candidates(k0, limit)[1] and rows[0]["measured_us"] == 20.0
    assert rows[1]["tiles"] == plain_tiles(k1.tiles) and rows[1]["measured_us"] == 21.0
    assert rows[2]["tiles"] == candidates(k2, limit)[0] and rows[2]["measured_us"] == 10.0
    assert timer.calls == 7 and len(cache) == 2

    again = TuningCache(GPU, tmp_path / "t.json")        # read back from disk
    assert again.tiles(k0) == candidates(k0, limit)[1] == again.tiles(k1)
    timer = _scripted([5.0, 6.0, 7.0])
    rows = profile(lower(res.program, tuned=again), tensors, timer, cache=again, tune=True, limit=limit,
                   device="cpu")
    assert timer.calls == 3 and not any(r["tuning"]["searched"] for r in rows)
    assert rows[0]["tiles"] == candidates(k0, limit)[1]          # lowered with the tuned tiles


def test_tuned_tiles_reach_write_kernels_and_still_compute_the_model(mlp, tmp_path):
    res, tensors = mlp
    (k0, _, _) = lower(res.program).kernels
    cache = TuningCache(GPU)                        # the session's private XDG cache
    tuned = {"BM": 32, "BN": 16, "BK": 16, "num_warps": 8, "num_stages": 2}
    cache.put(kernel_key(k0), "gemm", tuned, 1.0, default_us=2.0)
    report = write_kernels(res.program, tmp_path / "k", compile=False, gpu=GPU)
    assert [plain_tiles(r["tiles"]) for r in report["kernels"][:2]] == [tuned, tuned]
    source = (tmp_path / "k" / "kernels" / f"{report['kernels'][0]['name']}.py").read_text()
    assert "NUM_STAGES = 2" in source and "num_stages=NUM_STAGES" in source
    from apsat.backends.gpu.runner import run_kernels

    got = run_kernels(res.program, tensors, device="cpu", gpu=GPU)
    want = ort_run(res.model.onnx, random_inputs(res.model, 0))
    v = compare(want, {next(iter(res.program.outputs)): got})
    assert v.ok, v


def _miswritten(original, bad_warps):
    """kernel_source, except that a kernel launched with `bad_warps` warps stores twice
    its value ("double") or only half of its elements ("half")."""
    def source(k):
        text = original(k)
        if k.tiles.get("num_warps") == bad_warps[0]:
            old = "tl.store(out_ptr + offs, "
            text = (text.replace(old, old + "2.0 * ") if bad_warps[1] == "double"
                    else text.replace("mask = offs < N", "mask = offs < N // 2"))
        return text
    return source


@pytest.mark.parametrize("fault", ["double", "half"])
def test_a_candidate_computing_something_else_is_never_chosen(fault, tmp_path, monkeypatch):
    from apsat.backends.gpu import triton as triton_gen
    from apsat.backends.gpu.profile import profile

    text, shapes, _ = KERNELS["chain-gelu-sigmoid-tanh"]
    prog = apsat.parse(text, shapes)
    graph = lower(prog)
    (k,) = graph.kernels
    bad = [c for c in candidates(k, 16) if c.get("num_warps") == 8]
    assert bad and plain_tiles(k.tiles).get("num_warps", 4) != 8
    monkeypatch.setattr(triton_gen, "kernel_source", _miswritten(triton_gen.kernel_source, (8, fault)))
    rng = np.random.default_rng(0)
    tensors = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    times = itertools.count(100.0, -1.0)             # each later candidate "faster"
    cache = TuningCache(GPU, tmp_path / "t.json")
    (row,) = profile(graph, tensors, lambda fn: (fn(), next(times))[1], cache=cache, tune=True,
                     limit=16, device="cpu")
    assert row["tuning"]["rejected"] == len(bad)
    assert row["tiles"].get("num_warps") != 8


def test_damaged_cache_files_are_read_as_empty_with_a_warning(tmp_path):
    path = tmp_path / "t.json"
    path.write_text("{not json")
    with pytest.warns(UserWarning, match="not a tuning cache"):
        assert len(TuningCache(GPU, path)) == 0
    good = {"kind": "gemm", "tiles": {"BM": 32, "BN": 32, "BK": 16}, "us": 3.0}
    bad = [{"kind": "gemm", "tiles": {"BM": -1}, "us": 1.0},          # not a positive size
           {"kind": "gemm", "tiles": {"BLOCK": 256}, "us": 1.0},      # not a gemm's tile
           {"kind": "conv", "tiles": {"BM": 16}, "us": 1.0},          # no such kind
           {"kind": "gemm", "tiles": {"BM": 16}, "us": float("nan")}, # no time
           ["BM", 16]]
    entries = {"good": good, **{f"bad{i}": b for i, b in enumerate(bad)}}
    path.write_text(json.dumps({"format": 1, "gpu": GPU, "entries": entries}, allow_nan=True))
    with pytest.warns(UserWarning, match="5 malformed entries ignored"):
        cache = TuningCache(GPU, path)
    assert list(cache.entries) == ["good"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cache.put("other", "reduce", {"BR": 4, "BC": 64, "num_warps": 2}, 7.5)   # a sound file again
        assert set(TuningCache(GPU, path).entries) == {"good", "other"}
    with pytest.raises(ValueError, match="not an entry"):
        cache.put("x", "gemm", {"BLOCK": 128}, 1.0)


def test_two_writers_of_one_cache_keep_each_others_entries(tmp_path):
    a, b = TuningCache(GPU, tmp_path / "t.json"), TuningCache(GPU, tmp_path / "t.json")
    a.put("ka", "elementwise", {"BLOCK": 512, "num_warps": 4}, 2.0)
    b.put("kb", "elementwise", {"BLOCK": 1024, "num_warps": 8}, 3.0)
    assert set(TuningCache(GPU, tmp_path / "t.json").entries) == {"ka", "kb"}
    assert not list(tmp_path.glob(".*.tmp"))


def test_tuned_stages_compile_ahead_of_time():
    """num_stages reaches triton.compile's options (no GPU needed)."""
    from apsat.backends.gpu.aot import aot_compile_source
    from apsat.backends.gpu.triton import kernel_source

    text, shapes, _ = KERNELS["gemm-relu"]
    (k,) = lower(apsat.parse(text, shapes), {"gemm": {"BM": 32, "BN": 32, "BK": 16, "num_warps": 4,
                                                       "num_stages": 4}}).kernels
    res = aot_compile_source(kernel_source(k), k.name)
    assert "error" not in res, res.get("error")
    assert res["cubin"] and res["num_warps"] == 4
