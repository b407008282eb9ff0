"""Export the public real-zoo: small ONNX models of real architectures for apsat's tests.

Each model comes from its library's own constructor (torchvision, transformers) in a reduced
configuration with seeded random weights, batch 1, exported by the TorchScript exporter at
opset 17. The output folder gets NAME.onnx (weights embedded), NAME.npz (the seeded inputs by
ONNX input name, onnxruntime's outputs on them as "output:<name>") per model and one
manifest.json describing them all. Re-running gives the same bytes.

Usage: python benchmarks/export_zoo.py [--out tests/data/real_zoo] [--only NAME ...]
Needs torch, torchvision and transformers (the install line is INSTALL below).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "tests" / "data" / "real_zoo"
OPSET, SEED, SEQ = 17, 0, 12
INSTALL = ("pip install torch==2.13.0 && pip install --no-deps torchvision==0.28.0 "
           "&& pip install 'transformers>=5,<6'")


@dataclass
class Spec:
    """One model to export: the torch module (plain tensor outputs), its named numpy inputs,
    output names, family, the constructor call it came from, and optional dynamic axes."""
    module: object
    inputs: dict
    outputs: list
    family: str
    source: str
    config: dict
    dynamic_axes: dict = field(default_factory=dict)


def _import_torchvision(torch):
    """Import torchvision. When its native _C cannot load (the CUDA wheel beside CPU torch)
    its fake-op registrations fail for want of the nms/qnms schemas: declare those and
    import again (the model constructors used here are pure Python)."""
    try:
        import torchvision
    except RuntimeError as exc:
        if "torchvision::" not in str(exc):
            raise
        for mod in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[mod]
        for op in ("nms", "qnms"):
            torch.library.define(f"torchvision::{op}",
                                 "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        import torchvision
    return torchvision


def _import_libraries():
    """Import torch, torchvision and transformers and return them; exit with one line naming
    the install command when one is missing."""
    try:
        import torch
        torchvision = _import_torchvision(torch)
        import transformers
    except ImportError as exc:
        sys.exit(f"export_zoo: cannot import {exc.name or exc}; install the zoo extra: {INSTALL}")
    transformers.logging.set_verbosity_error()
    return torch, torchvision, transformers


# ---- inputs ----------------------------------------------------------------------------------

def normal(*shape: int, seed: int = SEED) -> np.ndarray:
    """A seeded float32 array of the given shape with standard-normal values."""
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def tokens(vocab: int, seq: int = SEQ, pad: int = 3) -> dict:
    """Seeded int64 input_ids (1, seq) below vocab and an attention_mask of ones followed by
    pad trailing zeros (right padding; the first positions are always attended)."""
    ids = np.random.default_rng(SEED).integers(1, vocab, size=(1, seq), dtype=np.int64)
    mask = np.ones((1, seq), dtype=np.int64)
    mask[:, seq - pad:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def wrap(torch, model, names: list):
    """Wrap a transformers model as a module whose forward takes the inputs positionally (in
    the order of names) and returns one plain tensor: the first entry of the model's output."""
    class Plain(torch.nn.Module):
        """Positional inputs in, the first output tensor out."""
        def __init__(self):
            """Hold the wrapped model."""
            super().__init__()
            self.model = model

        def forward(self, *args):
            """Call the model with keyword inputs; return its first output as a tensor."""
            return self.model(**dict(zip(names, args)))[0]
    return Plain().eval()


# ---- torchvision CNNs and vision transformers ---------------------------------------------------

def vision_spec(torch, model, size: int, family: str, cfg: dict, source: str = "") -> Spec:
    """The spec of a torchvision classifier on one size x size RGB image, its random weights
    made non-degenerate as training would: all-zero Linear layers (ViT's head) get PyTorch's
    default init, and every BatchNorm's running statistics become those of a training-mode
    pass over a separate seeded batch of four images. The model is left in eval mode; source
    defaults to the model's class path."""
    for m in model.modules():
        if isinstance(m, torch.nn.Linear) and not m.weight.any():
            m.reset_parameters()
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.reset_running_stats()
            m.momentum = None
    model.train()
    with torch.no_grad():
        model(torch.from_numpy(normal(4, 3, size, size, seed=SEED + 1)))
    source = source or f"{type(model).__module__}.{type(model).__name__}"
    inputs = {"pixel_values": normal(1, 3, size, size)}
    return Spec(model.eval(), inputs, ["logits"], family, source, cfg)


def build_resnet(torch, tv, tf):
    """ResNet with BasicBlocks [1,1,1,1] and stage widths 8/16/32/64 (planes / 8)."""
    from torchvision.models.resnet import BasicBlock, ResNet

    class NarrowResNet(ResNet):
        """torchvision's ResNet with every stage's planes divided by 8."""
        def _make_layer(self, block, planes, blocks, stride=1, dilate=False):
            """The library's stage builder at an eighth of the width."""
            return super()._make_layer(block, planes // 8, blocks, stride, dilate)

    m = NarrowResNet(BasicBlock, [1, 1, 1, 1], num_classes=10)
    m.fc = torch.nn.Linear(64, 10)
    cfg = {"block": "BasicBlock", "layers": [1, 1, 1, 1], "planes": [8, 16, 32, 64]}
    return vision_spec(torch, m, 64, "cnn", cfg, "torchvision.models.resnet.ResNet (planes // 8)")


def build_mobilenet_v3(torch, tv, tf):
    """MobileNetV3 (small-style) with SE blocks, hardswish and five inverted residuals."""
    from torchvision.models.mobilenetv3 import InvertedResidualConfig as C
    rows = [(16, 3, 16, 16, True, "RE", 2), (16, 3, 48, 24, False, "RE", 2),
            (24, 3, 64, 24, False, "RE", 1), (24, 5, 96, 40, True, "HS", 2),
            (40, 5, 120, 48, True, "HS", 1)]
    m = tv.models.MobileNetV3([C(*r, 1, 1.0) for r in rows], last_channel=128, num_classes=10)
    cfg = {"blocks": [list(r) for r in rows], "last_channel": 128, "num_classes": 10}
    return vision_spec(torch, m, 64, "cnn", cfg)


def build_efficientnet(torch, tv, tf):
    """EfficientNet (B0 stages 1-4 at width 0.5, one MBConv each: SE, SiLU, depthwise)."""
    from torchvision.models.efficientnet import EfficientNet, MBConvConfig
    rows = [(1, 3, 1, 32, 16, 1), (6, 3, 2, 16, 24, 1), (6, 5, 2, 24, 40, 1), (6, 3, 2, 40, 80, 1)]
    m = EfficientNet([MBConvConfig(*r, width_mult=0.5) for r in rows], dropout=0.2,
                     num_classes=10, last_channel=128)
    cfg = {"mbconv": [list(r) for r in rows], "width_mult": 0.5, "last_channel": 128}
    return vision_spec(torch, m, 64, "cnn", cfg)


def build_regnet(torch, tv, tf):
    """RegNetY-style: three one-block stages 16/32/64 wide, group width 8, SE ratio 0.25."""
    from torchvision.models.regnet import BlockParams, RegNet
    cfg = {"depths": [1, 1, 1], "widths": [16, 32, 64], "group_widths": [8, 8, 8],
           "bottleneck_multipliers": [1.0, 1.0, 1.0], "strides": [2, 2, 2], "se_ratio": 0.25}
    m = RegNet(BlockParams(**cfg), num_classes=10, stem_width=16)
    return vision_spec(torch, m, 64, "cnn", {**cfg, "stem_width": 16})


def build_convnext(torch, tv, tf):
    """ConvNeXt with three one-block stages 16/32/64 (LayerNorm2d, 7x7 depthwise, layer scale)."""
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt
    rows = [(16, 32, 1), (32, 64, 1), (64, None, 1)]
    m = ConvNeXt([CNBlockConfig(*r) for r in rows], stochastic_depth_prob=0.0, num_classes=10)
    cfg = {"block_setting": [list(r) for r in rows], "num_classes": 10}
    return vision_spec(torch, m, 64, "cnn", cfg)


def build_torchvision(cls: str, size: int, family: str, cfg: dict, torch, tv, tf) -> Spec:
    """torchvision.models.<cls>(**cfg), calibrated, on one size x size image."""
    return vision_spec(torch, getattr(tv.models, cls)(**cfg), size, family, cfg)


# ---- transformers -----------------------------------------------------------------------------

def build_transformers(model_cls: str, config_cls: str, cfg: dict, output: str, dynamic: bool,
                       torch, tv, tf) -> Spec:
    """transformers' model_cls(config_cls(**cfg)) without cache, in eval mode, wrapped to
    return its first output (named output) from token ids and an attention mask; with
    dynamic, batch_size and sequence_length are symbolic in the inputs and the output."""
    model = getattr(tf, model_cls)(getattr(tf, config_cls)(**cfg, use_cache=False)).eval()
    cfg = {**cfg, "attn_implementation": model.config._attn_implementation}
    inputs, axes = tokens(128), {0: "batch_size", 1: "sequence_length"}
    dims = {k: axes for k in [*inputs, output]} if dynamic else {}
    return Spec(wrap(torch, model, list(inputs)), inputs, [output], "transformer",
                f"transformers.{model_cls}({config_cls}(...))", cfg, dims)


def build_whisper_encoder(torch, tv, tf):
    """Whisper encoder: two Conv1d over 16 mel bins x 32 frames, GELU, 2 layers, d_model 32."""
    cfg = {"num_mel_bins": 16, "max_source_positions": 16, "d_model": 32, "encoder_layers": 2,
           "encoder_attention_heads": 2, "encoder_ffn_dim": 64, "decoder_layers": 1,
           "decoder_attention_heads": 2, "decoder_ffn_dim": 64, "vocab_size": 128,
           "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "decoder_start_token_id": 1}
    config = tf.WhisperConfig(**cfg)
    encoder = tf.WhisperModel(config).get_encoder().eval()
    inputs = {"input_features": normal(1, 16, 32)}
    return Spec(wrap(torch, encoder, list(inputs)), inputs, ["last_hidden_state"], "transformer",
                "transformers.WhisperModel(WhisperConfig(...)).get_encoder()", cfg)


TORCHVISION = {  # name: (class, image size, family, constructor keywords)
    "mobilenet_v2": ("MobileNetV2", 64, "cnn", {  # width 0.5, five one-block stages
        "num_classes": 10, "width_mult": 0.5,
        "inverted_residual_setting": [[1, 16, 1, 1], [6, 24, 1, 2], [6, 32, 1, 2], [6, 64, 1, 2],
                                      [6, 96, 1, 1]]}),
    "vit": ("VisionTransformer", 32, "transformer", {  # 8x8 patches: 16 tokens + class token
        "image_size": 32, "patch_size": 8, "num_layers": 2, "num_heads": 2, "hidden_dim": 32,
        "mlp_dim": 64, "num_classes": 10}),
    "swin": ("SwinTransformer", 32, "transformer", {  # 2 stages x 2 blocks (one shifted each)
        "patch_size": [2, 2], "embed_dim": 16, "depths": [2, 2], "num_heads": [2, 4],
        "window_size": [4, 4], "stochastic_depth_prob": 0.0, "num_classes": 10}),
}
TRANSFORMERS = {  # name: (model class, config class, config keywords, output, dynamic dims)
    "bert": ("BertModel", "BertConfig", {  # encoder with a padding attention mask
        "vocab_size": 128, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
        "intermediate_size": 64, "max_position_embeddings": 32}, "last_hidden_state", False),
    "distilbert_dynamic": ("DistilBertModel", "DistilBertConfig", {  # symbolic batch and sequence
        "vocab_size": 128, "dim": 32, "n_layers": 2, "n_heads": 2, "hidden_dim": 64,
        "max_position_embeddings": 32}, "last_hidden_state", True),
    "gpt2": ("GPT2LMHeadModel", "GPT2Config", {  # tied LM head, causal + padding mask
        "vocab_size": 128, "n_positions": 32, "n_embd": 32, "n_layer": 2, "n_head": 2},
        "logits", False),
    "t5_encoder": ("T5EncoderModel", "T5Config", {  # relative position buckets, RMS-style norm
        "vocab_size": 128, "d_model": 32, "d_kv": 16, "d_ff": 64, "num_layers": 2, "num_heads": 2,
        "relative_attention_num_buckets": 8, "relative_attention_max_distance": 16},
        "last_hidden_state", False),
    "llama": ("LlamaForCausalLM", "LlamaConfig", {  # RMSNorm, RoPE, SiLU-gated MLP, GQA 4 over 2
        "vocab_size": 128, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
        "tie_word_embeddings": False}, "logits", False),
}
ORDER = ["resnet", "mobilenet_v2", "mobilenet_v3", "efficientnet", "regnet", "convnext", "vit",
         "swin", "bert", "distilbert_dynamic", "gpt2", "t5_encoder", "llama", "whisper_encoder"]
BUILDERS = {"resnet": build_resnet, "mobilenet_v3": build_mobilenet_v3, "regnet": build_regnet,
            "efficientnet": build_efficientnet, "convnext": build_convnext,
            "whisper_encoder": build_whisper_encoder,
            **{n: partial(build_torchvision, *row) for n, row in TORCHVISION.items()},
            **{n: partial(build_transformers, *row) for n, row in TRANSFORMERS.items()}}
BUILDERS = {name: BUILDERS[name] for name in ORDER}  # name -> f(torch, tv, tf) -> Spec


# ---- export, run, record ------------------------------------------------------------------------

def export_onnx(torch, spec: Spec):
    """Export spec.module with the TorchScript exporter at OPSET on spec.inputs and return
    the onnx ModelProto (weights embedded, node doc strings cleared)."""
    import io

    import onnx
    args = tuple(torch.from_numpy(v) for v in spec.inputs.values())
    buf = io.BytesIO()
    torch.onnx.export(spec.module, args, buf, dynamo=False, opset_version=OPSET,
                      input_names=list(spec.inputs), output_names=spec.outputs,
                      dynamic_axes=spec.dynamic_axes or None, do_constant_folding=True)
    model = onnx.load_from_string(buf.getvalue())
    for node in model.graph.node:
        node.doc_string = ""
    onnx.checker.check_model(model, full_check=True)
    return model


def run_ort(model_bytes: bytes, inputs: dict) -> dict:
    """onnxruntime's outputs (name -> array) of a serialized model on inputs, on one CPU
    thread with graph optimisations disabled."""
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(model_bytes, opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, inputs)))


def save_npz(path: Path, arrays: dict) -> None:
    """Write arrays to an .npz that np.load reads, byte-for-byte reproducible (fixed zip
    timestamps, deflate)."""
    import zipfile
    with zipfile.ZipFile(path, "w") as zf:
        for key, value in arrays.items():
            info = zipfile.ZipInfo(f"{key}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            with zf.open(info, "w") as f:
                np.lib.format.write_array(f, np.ascontiguousarray(value), allow_pickle=False)


def describe(values, arrays: dict) -> list:
    """Manifest rows for graph inputs or outputs: name, dtype, declared shape (ints, or the
    dim_param names of symbolic dims) and, where a dim is symbolic, the concrete shape used."""
    from onnx.helper import tensor_dtype_to_np_dtype
    rows = []
    for v in values:
        t = v.type.tensor_type
        shape = [d.dim_param if d.dim_param else d.dim_value for d in t.shape.dim]
        row = {"name": v.name, "dtype": str(tensor_dtype_to_np_dtype(t.elem_type)), "shape": shape}
        if any(isinstance(d, str) for d in shape):
            row["dim_params"] = [d for d in shape if isinstance(d, str)]
            row["npz_shape"] = list(arrays[v.name].shape)
        rows.append(row)
    return rows


def export_one(torch, name: str, spec: Spec, out: Path) -> dict:
    """Export one model to out/NAME.onnx and out/NAME.npz, check onnxruntime against torch on
    the seeded inputs, and return its manifest entry."""
    model = export_onnx(torch, spec)
    outputs = run_ort(model.SerializeToString(), spec.inputs)
    if not spec.dynamic_axes:  # pin dims the exporter's shape inference left symbolic
        for value in model.graph.output:
            for dim, n in zip(value.type.tensor_type.shape.dim, outputs[value.name].shape):
                dim.dim_value = n
    data = model.SerializeToString()
    (out / f"{name}.onnx").write_bytes(data)
    with torch.no_grad():
        ref = spec.module(*(torch.from_numpy(v) for v in spec.inputs.values()))
    err = float(np.max(np.abs(ref.numpy() - outputs[spec.outputs[0]])))
    if err > 1e-3:
        raise RuntimeError(f"{name}: onnxruntime differs from torch by {err:.2e}")
    save_npz(out / f"{name}.npz", {**spec.inputs, **{f"output:{k}": v for k, v in outputs.items()}})
    ops: dict = {}
    for node in model.graph.node:
        ops[node.op_type] = ops.get(node.op_type, 0) + 1
    return {"file": f"{name}.onnx", "npz": f"{name}.npz", "family": spec.family,
            "source": spec.source, "config": spec.config,
            "inputs": describe(model.graph.input, spec.inputs),
            "outputs": describe(model.graph.output, outputs),
            "nodes": len(model.graph.node), "ops": dict(sorted(ops.items())),
            "bytes": len(data), "max_abs_error_vs_torch": float(f"{err:.3g}")}


def write_manifest(out: Path, entries: dict, versions: dict) -> dict:
    """Merge entries into out/manifest.json (models kept in BUILDERS order, entries of
    models not re-exported kept as they were) and return the merged models."""
    path = out / "manifest.json"
    old = json.loads(path.read_text())["models"] if path.exists() else {}
    models = {n: entries.get(n, old.get(n)) for n in BUILDERS if n in entries or n in old}
    manifest = {"generator": "benchmarks/export_zoo.py", "opset": OPSET, "seed": SEED,
                "exporter": "torch.onnx.export(dynamo=False)", "versions": versions,
                "models": models}
    path.write_text(json.dumps(manifest, indent=1) + "\n")
    return models


def main(argv: list | None = None) -> int:
    """Export the selected models (all by default) into --out, merge their entries into
    manifest.json there and print one line per model: name, nodes, KB, ops used. A model
    that fails is reported in one line and skipped; the exit status is then 1."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--only", nargs="+", choices=sorted(BUILDERS), metavar="NAME")
    args = parser.parse_args(argv)
    torch, tv, tf = _import_libraries()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
    warnings.filterwarnings("ignore", message=".*aten::index.*")
    args.out.mkdir(parents=True, exist_ok=True)
    entries, failed, start = {}, [], time.perf_counter()
    for name in args.only or BUILDERS:
        torch.manual_seed(SEED)
        try:
            entries[name] = entry = export_one(torch, name, BUILDERS[name](torch, tv, tf), args.out)
        except Exception as exc:  # noqa: BLE001 - one line per failing model, then go on
            failed.append(name)
            print(f"{name:20s} FAILED: {type(exc).__name__}: {exc}".splitlines()[0], flush=True)
            continue
        print(f"{name:20s} {entry['nodes']:5d} nodes {entry['bytes'] / 1024:7.1f} KB  "
              f"{' '.join(entry['ops'])}", flush=True)
    versions = {"torch": torch.__version__.split("+")[0],
                "torchvision": tv.__version__.split("+")[0], "transformers": tf.__version__}
    models = write_manifest(args.out, entries, versions)
    total = sum(m["bytes"] for m in models.values())
    print(f"{len(models)} models in the manifest, {total / 1024:.1f} KB of ONNX in {args.out}; "
          f"exported {len(entries)} in {time.perf_counter() - start:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
