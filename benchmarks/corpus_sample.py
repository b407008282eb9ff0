"""The corpus's CI sample (benchmarks/corpus.py sample): about ten small models of the public
corpus that span its families, exported into tests/data/corpus/ for
tests/test_corpus_sample.py.

Each is a corpus architecture built exactly as `corpus.py export` builds it (seeded random
weights, nothing downloaded, batch 1, TorchScript exporter at opset 17), some at a smaller
size than the corpus's (`extra`, the builder's keywords or config fields) so that every
file stays under MAX_BYTES. The folder also gets manifest.json (per model: source, variant,
config, inputs, node and op counts) and README.md (what is there and how it was made).
"""
from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

MAX_BYTES = 1 << 20
# sample name -> (corpus architecture, candidate, extra keywords, what it stands for)
SAMPLE = {
    "cnn_densenet": ("timm-densenet", "densenet", {"growth_rate": 4},
                     "CNN with deep concatenation chains: DenseNet-121's layout (6/12/24/16 layers), growth 4"),
    "vit": ("hf-vit", "vit", None, "ViT-style encoder: patch embedding, class token, attention"),
    "mobile_efficientnet": ("timm-efficientnet", "efficientnet", None,
                            "mobile net: depthwise convs, squeeze-excitation, SiLU (timm's test EfficientNet)"),
    "mixer_resmlp": ("timm-mlp_mixer-resmlp", "mlp_mixer/resmlp", None,
                     "MLP-mixer-style: token-mixing linear layers, affine norms (ResMLP)"),
    "bert": ("hf-bert", "bert", None, "BERT-style encoder: token, position and segment embeddings, padding mask"),
    "gpt2": ("hf-gpt2", "gpt2", None, "GPT-style decoder: causal mask, Conv1D projections"),
    "t5": ("hf-t5", "t5", {"num_layers": 6, "num_decoder_layers": 6},
           "T5 encoder-decoder at T5-small's depth (6 + 6 layers): relative position buckets, cross-attention"),
    "wav2vec2": ("hf-wav2vec2", "wav2vec2", None,
                 "audio: raw waveform, conv feature extractor, grouped positional conv"),
    "swin": ("timm-swin_transformer", "swin_transformer",
             {"img_size": 32, "embed_dim": 16, "depths": (1, 1), "num_heads": (1, 2), "window_size": 4},
             "Swin: shifted windows with a relative-position-bias table"),
    "deberta_v2": ("hf-deberta_v2", "deberta-v2", None,
                   "embedding lookups beyond tokens: DeBERTa-v2's disentangled relative-position gathers"),
    "llama": ("hf-llama", "llama", None, "Llama-style decoder: RMSNorm, rotary embeddings, grouped-query attention"),
}


def write_sample(dest: Path) -> int:
    """Export every SAMPLE model into dest (NAME.onnx), then manifest.json and README.md;
    print one line per model; 1 when one fails or is over MAX_BYTES."""
    import corpus_export as cx
    import corpus_models as cm

    warnings.filterwarnings("ignore")
    libs = cm.import_libraries()
    libs[0].set_num_threads(1)
    archs = {a.name: a for a in cm.catalogue(libs)[0]}
    dest.mkdir(parents=True, exist_ok=True)
    entries, bad = {}, 0
    for name, (arch_name, candidate, extra, what) in SAMPLE.items():
        arch = archs[arch_name]
        renamed = cm.Arch(name, arch.library, arch.family, [candidate])
        try:
            entry = cx.export_candidate(renamed, candidate, libs, dest, extra)
        except cx.ExportFailure as exc:
            print(f"{name:22s} FAILED: {exc}", flush=True)
            bad += 1
            continue
        entry.update(file=f"{name}.onnx", corpus_name=arch_name, stands_for=what, extra=extra or {})
        entries[name] = entry
        big = entry["bytes"] > MAX_BYTES
        bad += big
        print(f"{name:22s} {entry['nodes']:5d} nodes {entry['bytes'] / 1024:7.1f} KB"
              f"{'  OVER 1 MB' if big else ''}  {arch_name}", flush=True)
    versions = {"torch": libs[0].__version__.split("+")[0], "torchvision": libs[1].__version__.split("+")[0],
                "transformers": libs[2].__version__, "timm": libs[3].__version__}
    manifest = {"generator": "benchmarks/corpus.py sample", "opset": 17, "seed": 0,
                "exporter": "torch.onnx.export(dynamo=False)", "versions": versions, "models": entries}
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=1, default=str) + "\n")
    (dest / "README.md").write_text(readme(entries, versions))
    return 1 if bad else 0


def readme(entries: dict, versions: dict) -> str:
    """The folder's README: what each file stands for and how the set was made."""
    rows = "\n".join(f"| `{n}.onnx` | {e['corpus_name']} (`{e['variant']}`) | {e['stands_for']} | "
                     f"{e['nodes']} | {e['bytes'] / 1024:.0f} KB |" for n, e in entries.items())
    made = ", ".join(f"{k} {v}" for k, v in versions.items())
    return f"""# The corpus CI sample

Small models of the public corpus (`benchmarks/corpus.py`, docs/corpus.md), one per kind of
architecture, for `tests/test_corpus_sample.py` (slow-marked: each is optimised and verified
on gpu and systolic:32x32).

Made by `python benchmarks/corpus.py sample` ({made}): each model comes from its library's
own constructor (timm `pretrained=False`, torchvision `weights=None`, transformers from a tiny
config, never `from_pretrained`), with seeded random weights (BatchNorm statistics from one
training-mode pass over a second seeded batch), batch 1, static shapes, exported by torch's
TorchScript exporter at opset 17. `manifest.json` holds each one's source, config, inputs,
node and op counts and its largest difference between onnxruntime and torch.

| file | corpus architecture | stands for | nodes | size |
|---|---|---|---|---|
{rows}
"""
