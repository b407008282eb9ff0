"""apsat's ONNX export of full-size models against the best of the other optimisers (CPU).

onnx_out.py's full-size column. ResNet-50, ViT-B/16 and BERT-base, built by the
transformers constructors at their published configurations with seeded random weights
(nothing downloaded), exported by torch with symbolic batch (and sequence) dims, are
optimised by apsat once with those dims kept, and timed at their real sizes (224x224
images; 128 tokens), batch 1, against the same file
  - in onnxruntime at ORT_ENABLE_ALL,
  - after onnxruntime's transformers optimizer (onnxruntime.transformers.optimizer,
    model type bert or vit; none for ResNet), at ORT_ENABLE_ALL,
  - after onnxslim (when installed: pip install apsat[bench]), at ORT_ENABLE_ALL,
interleaved run by run as onnx_out.latency does (2 intra-op threads). ratio = the best of
the three / apsat's export: above 1 apsat's export is faster. Every export is checked
against the original at ORT_DISABLE_ALL (apsat.pipeline.verify.compare's tolerances).

Usage: python benchmarks/onnx_out_full.py [resnet50|vit_b16|bert_base ...] [--runs N]
The exported originals are cached under the user cache dir (apsat/full_size/).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from onnx_out import latency, one_line, outputs, session  # noqa: E402

MODELS = ("resnet50", "vit_b16", "bert_base")


def _cache() -> Path:
    from platformdirs import user_cache_dir

    path = Path(user_cache_dir("apsat")) / "full_size"
    path.mkdir(parents=True, exist_ok=True)
    return path


def export_original(name: str) -> Path:
    """The model's ONNX file (exported once, then cached): symbolic batch and sequence."""
    path = _cache() / f"{name}.onnx"
    if path.exists():
        return path
    import torch
    sys.modules.setdefault("torchvision", None)     # transformers' optional import: unneeded here
    import transformers as tf

    torch.manual_seed(0)
    if name == "bert_base":
        model = tf.BertModel(tf.BertConfig(), add_pooling_layer=False).eval()
        args = (torch.randint(0, 30522, (1, 128)), torch.ones(1, 128, dtype=torch.int64))
        names, axes = ["input_ids", "attention_mask"], {0: "batch_size", 1: "sequence_length"}
        dyn = {"input_ids": axes, "attention_mask": axes, "out": axes}
    else:
        model = (tf.ResNetModel(tf.ResNetConfig()) if name == "resnet50" else
                 tf.ViTModel(tf.ViTConfig(), add_pooling_layer=False)).eval()
        args = (torch.randn(1, 3, 224, 224),)
        names, dyn = ["pixel_values"], {"pixel_values": {0: "batch_size"}, "out": {0: "batch_size"}}

    class Hidden(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, *a):
            return self.m(**dict(zip(names, a))).last_hidden_state

    torch.onnx.export(Hidden(model), args, str(path), input_names=names, output_names=["out"],
                      dynamic_axes=dyn, opset_version=17, dynamo=False)
    return path


def feeds(name: str) -> dict:
    rng = np.random.default_rng(0)
    if name == "bert_base":
        return {"input_ids": rng.integers(0, 30522, (1, 128)).astype(np.int64),
                "attention_mask": np.ones((1, 128), np.int64)}
    return {"pixel_values": rng.standard_normal((1, 3, 224, 224)).astype(np.float32)}


def competitors(name: str, proto) -> dict:
    """Name -> ModelProto (or the reason it is missing) of the other optimisers' files."""
    out = {"ort-all": proto}
    if name != "resnet50":
        from onnxruntime.transformers.optimizer import optimize_model

        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "m.onnx"
            import onnx
            onnx.save(proto, str(path))
            kind = "bert" if name == "bert_base" else "vit"
            heads, hidden = 12, 768
            out["ort-transformers"] = optimize_model(str(path), model_type=kind, num_heads=heads,
                                                     hidden_size=hidden).model
    try:
        import onnxslim
        out["onnxslim"] = onnxslim.slim(proto)
    except ImportError:
        out["onnxslim"] = "onnxslim is not installed (pip install apsat[bench])"
    return out


def measure(name: str, runs: int) -> dict:
    import onnx

    from apsat.pipeline.optimize import optimize
    from apsat.pipeline.verify import compare

    row = {"model": name}
    try:
        path = export_original(name)
        proto = onnx.load(str(path))
        t = time.perf_counter()
        res = optimize(proto, target="gpu", verify=False, representatives=None)
        row["optimise_s"] = time.perf_counter() - t
        export = res.to_onnx()
        row["dynamic"] = bool(res.general) and all(
            any(d.dim_param for d in i.type.tensor_type.shape.dim) for i in export.graph.input)
        inputs = feeds(name)
        want = outputs(session(proto, "disable"), inputs)
        row["ok"] = compare(want, outputs(session(export, "all"), inputs)).ok
        others = competitors(name, proto)
        sessions = {k: session(v, "all") for k, v in others.items() if not isinstance(v, str)}
        sessions["apsat"] = session(export, "all")
        row.update(latency(sessions, inputs, runs, 3, 0.0))
        best = min((k for k in sessions if k != "apsat"), key=lambda k: row[k])
        row["best"], row["ratio"] = best, row[best] / row["apsat"]
        row["missing"] = {k: v for k, v in others.items() if isinstance(v, str)}
    except Exception as e:  # noqa: BLE001 - the row says why
        row["error"] = one_line(e)
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="*", help=f"some of {', '.join(MODELS)} (default: all)")
    p.add_argument("--runs", type=int, default=20)
    args = p.parse_args(argv)
    unknown = sorted(set(args.models) - set(MODELS))
    if unknown:
        p.error(f"unknown models {unknown}: use {', '.join(MODELS)}")
    rows = []
    for name in args.models or MODELS:
        rows.append(measure(name, args.runs))
        print(f"  {name}: {rows[-1].get('error', 'ok')}", file=sys.stderr, flush=True)
    cols = ("ort-all", "ort-transformers", "onnxslim", "apsat")
    print(f"{'model':<10} {'dyn':>4} {'ok':>4} " + " ".join(f"{c:>16}" for c in cols) + f" {'best':>16} {'ratio':>6}")
    for r in rows:
        if "error" in r:
            print(f"{r['model']:<10} error: {r['error']}")
            continue
        ms = " ".join(f"{r[c]:>16.2f}" if c in r else f"{'-':>16}" for c in cols)
        print(f"{r['model']:<10} {str(r['dynamic']):>4} {str(r['ok']):>4} {ms} {r['best']:>16} {r['ratio']:>6.2f}")
    print("ms: median milliseconds per run (onnxruntime CPU, 2 threads); ratio: best other / apsat")
    return 0 if all("error" not in r and r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
