"""Generated GPU kernels against PyTorch eager.

For each model (a conv net, a transformer encoder block, a 3-layer MLP; tests/models.py):
optimise for the gpu target, lower to kernels and print each kernel's modelled figures
(FLOPs, bytes, H100 roofline microseconds, tiles). A hand-written PyTorch eager version of
the same model is checked against onnxruntime first. With an NVIDIA GPU
(torch.cuda.is_available()) the script then times the generated kernels (the generated
runner, inputs already on the device) and the eager version on the same inputs, with CUDA
events after warm-up, and prints the ratio; without one it says so after the modelled
figures.

Usage: python benchmarks/gpu.py [--small] [--iters N] [MODEL ...]
  --small   the test-sized models (default: larger ones where a GPU has work to do)
  MODEL     small_convnet, encoder_block, mlp3 (default: all three)
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import models

SIZES = {   # builder keyword arguments: the larger benchmark sizes
    "small_convnet": {},
    "encoder_block": {"batch": 8, "seq": 128, "d_model": 256, "heads": 8, "hidden": 1024},
    "mlp3": {"batch": 512, "sizes": (1024, 4096, 4096, 1000)},
}


# ---- PyTorch eager versions of the models (weights by their ONNX names) ------------------

def eager_small_convnet(w, x):
    import torch.nn.functional as F

    r1 = F.relu(F.conv2d(x, w["c1w"], w["c1b"], padding=1))
    r2 = F.relu(F.conv2d(r1, w["c2w"], w["c2b"], padding=1) + r1)
    gap = F.max_pool2d(r2, 2, 2).mean(dim=(2, 3))
    return gap @ w["fw"].T + w["fb"]


def eager_encoder_block(w, x, heads):
    import torch.nn.functional as F

    b, s, d = x.shape
    dh = d // heads
    h = F.layer_norm(x, (d,), w["ln_s"], w["ln_b"], 1e-5)
    q = (h @ w["Wq"] + w["bq"]).reshape(b, s, heads, dh).transpose(1, 2)
    k = (h @ w["Wk"] + w["bk"]).reshape(b, s, heads, dh).permute(0, 2, 3, 1)
    v = (h @ w["Wv"] + w["bv"]).reshape(b, s, heads, dh).transpose(1, 2)
    probs = F.softmax((q @ k) / math.sqrt(dh), dim=-1)
    ctx = (probs @ v).transpose(1, 2).reshape(b, s, d)
    y = x + (ctx @ w["Wo"] + w["bo"])
    h2 = F.layer_norm(y, (d,), w["ln2_s"], w["ln2_b"], 1e-5)
    m = F.gelu(h2 @ w["mlp_W1"] + w["mlp_b1"])          # exact (erf) GELU
    return y + (m @ w["mlp_W2"] + w["mlp_b2"])


def eager_mlp3(w, x):
    import torch.nn.functional as F

    n = sum(1 for k in w if k.startswith("W"))
    for i in range(n):
        x = x @ w[f"W{i}"].T + w[f"b{i}"]
        x = F.relu(x) if i < n - 1 else x
    return x


def eager(name, kwargs):
    if name == "encoder_block":
        heads = kwargs.get("heads", 4)
        return lambda w, x: eager_encoder_block(w, x, heads)
    return {"small_convnet": eager_small_convnet, "mlp3": eager_mlp3}[name]


# ---- timing ---------------------------------------------------------------------------------

def cuda_ms(fn, iters: int) -> float:
    """Milliseconds per call of fn on the GPU (CUDA events, after 10 warm-up calls)."""
    import torch

    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def bench(name: str, small: bool, iters: int, gpu: bool) -> dict:
    import torch

    import apsat
    from apsat.backends.gpu.lower import lower
    from apsat.backends.gpu.runner import load_runner, write_sources
    from apsat.pipeline.zoo import ort_run, random_inputs

    kwargs = {} if small else SIZES[name]
    t = time.perf_counter()
    model = apsat.load_onnx(getattr(models, name)(**kwargs))
    res = apsat.optimize(model, target="gpu", verify=False)
    graph = lower(res.program)
    seconds = time.perf_counter() - t
    print(f"\n== {name} {kwargs or '(test size)'}: {len(graph.kernels)} kernels, "
          f"{len(graph.host_steps)} host steps (optimise + lower {seconds:.1f} s)")
    print(f"{'kernel':34} {'covers':44} {'MFLOP':>9} {'MB':>8} {'model us':>9}  tiles")
    for k in graph.kernels:
        tiles = " ".join(f"{a}={b}" for a, b in k.tiles.items() if a not in ("modelled_us", "num_warps"))
        print(f"{k.name:34} {', '.join(k.covers)[:44]:44} {k.flops / 1e6:9.3f} {k.bytes / 1e6:8.3f} "
              f"{k.modelled_us:9.2f}  {tiles}")
    for h in graph.host_steps:
        print(f"{h.name:34} {'host: ' + h.reason[:38]:44} {'':9} {h.bytes / 1e6:8.3f} {h.modelled_us:9.2f}")
    modelled = sum(s.modelled_us for s in graph.steps)
    print(f"modelled total: {modelled:.1f} us")

    inputs = random_inputs(model, 0)
    device = "cuda" if gpu else "cpu"
    w = {k: torch.tensor(np.asarray(v, np.float32), device=device) for k, v in model.weights.items()}
    x = torch.tensor(inputs["x"], device=device)
    fn = eager(name, kwargs)
    with torch.no_grad():
        want = next(iter(ort_run(model.onnx, inputs).values()))
        got = fn(w, x).cpu().numpy()
    err = float(np.abs(got - want).max())
    print(f"PyTorch eager vs onnxruntime: max abs error {err:.2e}")
    row = {"model": name, "kernels": len(graph.kernels), "modelled_us": modelled, "eager_err": err}
    if not gpu:
        return row
    runner = load_runner(write_sources(graph))
    tensors = {**{k: v for k, v in w.items()}, "x": x}
    out = runner.run(tensors, device="cuda")
    kerr = float(np.abs(next(iter(out.values())).cpu().numpy() - want).max())
    with torch.no_grad():
        row["kernels_ms"] = cuda_ms(lambda: runner.run(tensors, device="cuda"), iters)
        row["eager_ms"] = cuda_ms(lambda: fn(w, x), iters)
    row["kernels_err"] = kerr
    print(f"kernels vs onnxruntime: max abs error {kerr:.2e}; kernels {row['kernels_ms']:.3f} ms, "
          f"eager {row['eager_ms']:.3f} ms, eager / kernels = {row['eager_ms'] / row['kernels_ms']:.2f}")
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=list(SIZES))
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--iters", type=int, default=100)
    args = ap.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("torch is not installed (pip install apsat[gpu]): nothing to run")
        return 1
    gpu = torch.cuda.is_available()
    rows = [bench(name, args.small, args.iters, gpu) for name in args.models]
    print()
    if not gpu:
        print("No NVIDIA GPU present (torch.cuda.is_available() is False): the figures above "
              "are modelled (H100 roofline), nothing was timed.")
        return 0
    print(f"GPU: {torch.cuda.get_device_name()}")
    print(f"{'model':16} {'kernels':>7} {'model us':>9} {'kernels ms':>11} {'eager ms':>9} {'eager/kernels':>14}")
    for r in rows:
        print(f"{r['model']:16} {r['kernels']:7d} {r['modelled_us']:9.1f} {r['kernels_ms']:11.3f} "
              f"{r['eager_ms']:9.3f} {r['eager_ms'] / r['kernels_ms']:14.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
