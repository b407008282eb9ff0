"""Export small models with symbolic dims (seeded random weights, nothing downloaded) into
tests/data/dynamic/: what `apsat optimize` must keep dynamic (issue: dynamic shapes).

    python benchmarks/export_dynamic.py [OUT_DIR]

bert, distilbert, gpt2: inputs (batch_size, sequence_length); gpt2_kv: GPT-2 with a KV
cache (past_sequence_length);; resnet: pixel_values (batch_size,
3, 32, 32). Exported with torch.onnx.export(dynamo=False), opset 17, dynamic_axes.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch


class _Hidden(torch.nn.Module):
    """A transformers encoder called by keyword, its last hidden state the one output."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def _text(name: str, model, out: Path) -> None:
    model = _Hidden(model)
    ids = torch.randint(0, 50, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.int64)
    axes = {"input_ids": {0: "batch_size", 1: "sequence_length"},
            "attention_mask": {0: "batch_size", 1: "sequence_length"},
            "last_hidden_state": {0: "batch_size", 1: "sequence_length"}}
    torch.onnx.export(model, (ids, mask), str(out / f"{name}.onnx"), input_names=["input_ids", "attention_mask"],
                      output_names=["last_hidden_state"], dynamic_axes=axes, opset_version=17, dynamo=False)


class _Block(torch.nn.Module):
    """torchvision's BasicBlock: two 3x3 conv-BN, the shortcut a strided 1x1 where it shrinks."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        nn = torch.nn
        self.body = nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                                  nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout))
        self.short = nn.Sequential() if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        return torch.relu(self.body(x) + self.short(x))


class _ResNet(torch.nn.Module):
    """A ResNet-18 shape at 1/8 width, one block a stage (torchvision's, written here)."""

    def __init__(self):
        super().__init__()
        nn = torch.nn
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 7, 2, 3, bias=False), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        self.stages = nn.Sequential(_Block(8, 8, 1), _Block(8, 16, 2), _Block(16, 32, 2), _Block(32, 64, 2))
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(self.stages(self.stem(x)), 1), 1))


class _WithCache(torch.nn.Module):
    """A GPT-2 decoder step with a KV cache as tensors: past keys and values in (one pair a
    layer), the present ones out, as optimum's decoder-with-past exports are."""

    def __init__(self, model, config):
        super().__init__()
        self.model, self.config = model, config

    def forward(self, input_ids, attention_mask, *past):
        from transformers import DynamicCache

        cache = DynamicCache(config=self.config)
        for layer in range(len(past) // 2):
            cache.update(past[2 * layer], past[2 * layer + 1], layer)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache, use_cache=True)
        present = [t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)]
        return (out.last_hidden_state, *present)


def _decoder_with_cache(out: Path) -> None:
    """gpt2_kv.onnx: past length symbolic; the mask spans `past_sequence_length +
    sequence_length`, the dim_param optimum writes."""
    from transformers import GPT2Config, GPT2Model

    config = GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=2, n_positions=64)
    model = _WithCache(GPT2Model(config).eval(), config)
    past = [torch.randn(2, 2, 5, 16) for _ in range(4)]
    names = ["past_key_0", "past_value_0", "past_key_1", "past_value_1"]
    outs = ["last_hidden_state", "present_key_0", "present_value_0", "present_key_1", "present_value_1"]
    total = "past_sequence_length + sequence_length"
    axes = {"input_ids": {0: "batch_size", 1: "sequence_length"}, "attention_mask": {0: "batch_size", 1: total},
            "last_hidden_state": {0: "batch_size", 1: "sequence_length"},
            **{n: {0: "batch_size", 2: "past_sequence_length"} for n in names},
            **{n: {0: "batch_size", 2: total} for n in outs[1:]}}
    args = (torch.randint(0, 64, (2, 3)), torch.ones(2, 8, dtype=torch.int64), *past)
    torch.onnx.export(model, args, str(out / "gpt2_kv.onnx"), input_names=["input_ids", "attention_mask"] + names,
                      output_names=outs, dynamic_axes=axes, opset_version=17, dynamo=False)


def main(out: Path) -> None:
    try:                                 # a torchvision built for another torch breaks
        import torchvision  # noqa: F401  transformers' import; these models do not need it
    except Exception:  # noqa: BLE001
        for name in [m for m in sys.modules if m.startswith("torchvision")]:
            del sys.modules[name]
        sys.modules["torchvision"] = None
    from transformers import BertConfig, BertModel, DistilBertConfig, DistilBertModel, GPT2Config, GPT2Model

    torch.manual_seed(0)
    out.mkdir(parents=True, exist_ok=True)
    bert = BertModel(BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                intermediate_size=64, max_position_embeddings=64), add_pooling_layer=False)
    _text("bert", bert.eval(), out)
    distil = DistilBertModel(DistilBertConfig(vocab_size=64, dim=32, n_layers=2, n_heads=2, hidden_dim=64,
                                              max_position_embeddings=64))
    _text("distilbert", distil.eval(), out)
    gpt2 = GPT2Model(GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=2, n_positions=64, use_cache=False))
    _text("gpt2", gpt2.eval(), out)
    _decoder_with_cache(out)
    resnet = _ResNet().eval()
    torch.onnx.export(resnet, (torch.randn(2, 3, 32, 32),), str(out / "resnet.onnx"), input_names=["pixel_values"],
                      output_names=["logits"], dynamic_axes={"pixel_values": {0: "batch_size"},
                                                             "logits": {0: "batch_size"}},
                      opset_version=17, dynamo=False)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent / "tests/data/dynamic")
