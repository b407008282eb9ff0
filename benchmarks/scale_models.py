"""Seeded models as large as people deploy, written straight to ONNX with external data.

Nothing is downloaded and nothing needs torch: each builder writes the graph with onnx's
helpers and streams each weight (seeded normal x 0.02, float32) into one data file beside
the .onnx, 4096-byte aligned so it can be memory-mapped, one tensor in memory at a time.

* `llama(...)`: a Llama-shaped decoder (RMSNorm, rotary positions, grouped-query causal
  attention, SwiGLU MLP, tied embeddings as Llama 3.2 1B has them), one forward pass over
  `seq` tokens;
* `vit(...)`: a ViT (16x16 patches as a convolution, class token, learned positions,
  LayerNorm, GELU MLP).

`LLAMA` and `VIT` hold the sizes benchmarks/scale.py runs.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

ALIGN = 4096
OPSET = 17

# name: (layers, width, heads, kv heads, mlp width, vocabulary); parameters with tied embeddings
LLAMA = {"llama-0.1b": (8, 512, 8, 4, 2048, 128256),      # 97M
         "llama-0.4b": (16, 1024, 16, 8, 4096, 128256),   # 382M
         "llama-0.75b": (8, 2048, 32, 8, 8192, 128256),   # 749M
         "llama-1.2b": (16, 2048, 32, 8, 8192, 128256)}   # 1236M
VIT = {"vit-l16": (24, 1024, 16, 4096, 224, 1000)}         # layers, width, heads, mlp, image, classes: 304M


class _Graph:
    """Nodes, initializers written to the data file as they are made, and fresh names."""

    def __init__(self, data: Path, seed: int):
        self.data, self.rng = data, np.random.default_rng(seed)
        self.file = open(data, "wb")
        self.nodes, self.inits, self.count, self.weight_bytes = [], [], 0, 0

    def name(self, stem: str) -> str:
        self.count += 1
        return f"{stem}_{self.count}"

    def weight(self, stem: str, shape, value: np.ndarray | None = None) -> str:
        """A float32 initializer (seeded normal x 0.02 unless `value`), stored externally."""
        arr = (self.rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)
               if value is None else np.ascontiguousarray(value, dtype=np.float32))
        name = self.name(stem)
        offset = -self.file.tell() % ALIGN + self.file.tell()
        self.file.seek(offset)
        self.file.write(arr.tobytes())
        t = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=list(arr.shape),
                        data_location=TensorProto.EXTERNAL)
        for key, val in (("location", self.data.name), ("offset", str(offset)), ("length", str(arr.nbytes))):
            t.external_data.add(key=key, value=val)
        self.inits.append(t)
        self.weight_bytes += arr.nbytes
        return name

    def const(self, stem: str, value) -> str:
        """A small initializer held in the model itself (shapes, axes, scalars)."""
        arr = np.asarray(value)
        name = self.name(stem)
        self.inits.append(onnx.numpy_helper.from_array(arr, name))
        return name

    def op(self, op_type: str, inputs, **attrs) -> str:
        out = self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], **attrs))
        return out

    def save(self, path: Path, inputs, outputs) -> None:
        self.file.close()
        graph = helper.make_graph(self.nodes, path.stem, inputs, outputs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=8)
        onnx.save_model(model, str(path))   # the external tensors already point into the data file


def _rms_norm(g: _Graph, x: str, width: int) -> str:
    mean = g.op("ReduceMean", [g.op("Mul", [x, x])], axes=[-1], keepdims=1)
    den = g.op("Sqrt", [g.op("Add", [mean, g.const("eps", np.float32(1e-5))])])
    return g.op("Mul", [g.op("Div", [x, den]), g.weight("norm", (width,), np.ones(width))])


def _rotate(g: _Graph, x: str, cos: str, sin: str, half: int) -> str:
    """x * cos + rotate_half(x) * sin over the last axis (2 * half wide)."""
    lo = g.op("Slice", [x, g.const("s", np.array([0])), g.const("e", np.array([half])), g.const("a", np.array([-1]))])
    hi = g.op("Slice", [x, g.const("s", np.array([half])), g.const("e", np.array([2 * half])),
                        g.const("a", np.array([-1]))])
    rotated = g.op("Concat", [g.op("Neg", [hi]), lo], axis=-1)
    return g.op("Add", [g.op("Mul", [x, cos]), g.op("Mul", [rotated, sin])])


def _heads(g: _Graph, x: str, seq: int, heads: int, dim: int) -> str:
    """(1, seq, heads * dim) -> (1, heads, seq, dim)."""
    return g.op("Transpose", [g.op("Reshape", [x, g.const("shape", np.array([1, seq, heads, dim]))])],
                perm=[0, 2, 1, 3])


def _llama_layer(g: _Graph, x: str, sizes, seq: int, cos: str, sin: str, mask: str) -> str:
    _, width, heads, kv, mlp, _ = sizes
    dim = width // heads
    h = _rms_norm(g, x, width)
    q = _rotate(g, _heads(g, g.op("MatMul", [h, g.weight("wq", (width, width))]), seq, heads, dim), cos, sin, dim // 2)
    k = _rotate(g, _heads(g, g.op("MatMul", [h, g.weight("wk", (width, kv * dim))]), seq, kv, dim), cos, sin, dim // 2)
    v = _heads(g, g.op("MatMul", [h, g.weight("wv", (width, kv * dim))]), seq, kv, dim)
    rep = heads // kv

    def repeat(t):   # (1, kv, seq, dim) -> (1, heads, seq, dim), each kv head shared by rep queries
        wide = g.op("Expand", [g.op("Unsqueeze", [t, g.const("axes", np.array([2]))]),
                               g.const("shape", np.array([1, kv, rep, seq, dim]))])
        return g.op("Reshape", [wide, g.const("shape", np.array([1, heads, seq, dim]))])

    scores = g.op("MatMul", [q, g.op("Transpose", [repeat(k)], perm=[0, 1, 3, 2])])
    scores = g.op("Add", [g.op("Mul", [scores, g.const("scale", np.float32(dim ** -0.5))]), mask])
    att = g.op("MatMul", [g.op("Softmax", [scores], axis=-1), repeat(v)])
    att = g.op("Reshape", [g.op("Transpose", [att], perm=[0, 2, 1, 3]), g.const("shape", np.array([1, seq, width]))])
    x = g.op("Add", [x, g.op("MatMul", [att, g.weight("wo", (width, width))])])
    h = _rms_norm(g, x, width)
    gate = g.op("MatMul", [h, g.weight("wg", (width, mlp))])
    up = g.op("MatMul", [h, g.weight("wu", (width, mlp))])
    act = g.op("Mul", [g.op("Mul", [gate, g.op("Sigmoid", [gate])]), up])
    return g.op("Add", [x, g.op("MatMul", [act, g.weight("wd", (mlp, width))])])


def llama(path: Path, name: str, seq: int = 16, seed: int = 0) -> int:
    """Write LLAMA[name] to `path` (+ `path`.data); return the weight bytes."""
    sizes = LLAMA[name]
    layers, width, heads, _, _, vocab = sizes
    g = _Graph(Path(str(path) + ".data"), seed)
    embed = g.weight("embed", (vocab, width))
    x = g.op("Gather", [embed, "input_ids"], axis=0)
    dim = width // heads
    freq = 1.0 / 500000.0 ** (np.arange(0, dim, 2) / dim)
    angles = np.outer(np.arange(seq), freq)
    cos = g.const("cos", np.concatenate([np.cos(angles)] * 2, axis=-1).astype(np.float32))
    sin = g.const("sin", np.concatenate([np.sin(angles)] * 2, axis=-1).astype(np.float32))
    mask = g.const("mask", np.triu(np.full((seq, seq), np.finfo(np.float32).min, np.float32), 1))
    for _ in range(layers):
        x = _llama_layer(g, x, sizes, seq, cos, sin, mask)
    logits = g.op("MatMul", [_rms_norm(g, x, width), g.op("Transpose", [embed], perm=[1, 0])])
    g.save(path, [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, seq])],
           [helper.make_tensor_value_info(logits, TensorProto.FLOAT, [1, seq, vocab])])
    return g.weight_bytes


def _layer_norm(g: _Graph, x: str, width: int) -> str:
    return g.op("LayerNormalization", [x, g.weight("ln", (width,), np.ones(width)),
                                       g.weight("ln_b", (width,), np.zeros(width))], axis=-1, epsilon=1e-6)


def vit(path: Path, name: str, seed: int = 0) -> int:
    """Write VIT[name] to `path` (+ `path`.data); return the weight bytes."""
    layers, width, heads, mlp, image, classes = VIT[name]
    g = _Graph(Path(str(path) + ".data"), seed)
    tokens = (image // 16) ** 2 + 1
    patches = g.op("Conv", ["pixels", g.weight("patch", (width, 3, 16, 16)), g.weight("patch_b", (width,))],
                   strides=[16, 16])
    x = g.op("Transpose", [g.op("Reshape", [patches, g.const("shape", np.array([1, width, tokens - 1]))])], perm=[0, 2, 1])
    x = g.op("Concat", [g.weight("cls", (1, 1, width)), x], axis=1)
    x = g.op("Add", [x, g.weight("pos", (1, tokens, width))])
    dim = width // heads
    for _ in range(layers):
        h = _layer_norm(g, x, width)
        q, k, v = (_heads(g, g.op("Add", [g.op("MatMul", [h, g.weight(f"w{n}", (width, width))]), g.weight(f"b{n}", (width,))]),
                          tokens, heads, dim) for n in "qkv")
        scores = g.op("Mul", [g.op("MatMul", [q, g.op("Transpose", [k], perm=[0, 1, 3, 2])]),
                              g.const("scale", np.float32(dim ** -0.5))])
        att = g.op("MatMul", [g.op("Softmax", [scores], axis=-1), v])
        att = g.op("Reshape", [g.op("Transpose", [att], perm=[0, 2, 1, 3]), g.const("shape", np.array([1, tokens, width]))])
        x = g.op("Add", [x, g.op("Add", [g.op("MatMul", [att, g.weight("wo", (width, width))]), g.weight("bo", (width,))])])
        h = g.op("Add", [g.op("MatMul", [_layer_norm(g, x, width), g.weight("w1", (width, mlp))]), g.weight("b1", (mlp,))])
        gelu = g.op("Mul", [g.op("Mul", [h, g.op("Add", [g.op("Erf", [g.op("Div", [h, g.const("r2", np.float32(2 ** 0.5))])]),
                                                         g.const("one", np.float32(1))])]), g.const("half", np.float32(0.5))])
        x = g.op("Add", [x, g.op("Add", [g.op("MatMul", [gelu, g.weight("w2", (mlp, width))]), g.weight("b2", (width,))])])
    cls = g.op("Gather", [_layer_norm(g, x, width), g.const("first", np.array(0))], axis=1)
    logits = g.op("Add", [g.op("MatMul", [cls, g.weight("head", (width, classes))]), g.weight("head_b", (classes,))])
    g.save(path, [helper.make_tensor_value_info("pixels", TensorProto.FLOAT, [1, 3, image, image])],
           [helper.make_tensor_value_info(logits, TensorProto.FLOAT, [1, classes])])
    return g.weight_bytes
