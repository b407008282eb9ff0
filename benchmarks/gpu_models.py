"""The models benchmarks/gpu.py times, each as (ONNX model with weights, inputs).

    light zoo   the nine CNNs inside the onnx package (no weights there: drawn, seeded)
    real zoo    the transformers of tests/data/real_zoo, on their stored inputs
    bert_base   a BERT-base-sized encoder (transformers' BertModel with BertConfig's defaults:
                12 layers, width 768, 12 heads, MLP 3072), batch 1, 128 tokens
    mlp3        Tensor Comprehensions' MLP3 shape, fp32: batch 128, 1024 -> 4096 -> 4096 -> 1000
                (Gemm + Relu twice, then Gemm); mlp3_b512 the same at batch 512
    small       mlp3_small, encoder_small: tests/models.py's sizes, for the Triton interpreter
    NAME_fp16   any of them in float16: onnxruntime's own converter
                (onnxruntime.transformers.float16, keep_io_types off), as deployments
                convert, its float inputs rounded to float16 (`half`)

bert_base's 435 MB of weights are not kept in the repository: benchmarks/data/bert_base.onnx
is its graph with every float weight of 1024 or more elements replaced by a
ConstantOfShape placeholder, the light zoo's convention, and `load` draws them again
(apsat.pipeline.zoo.randomize_weights). Timing does not depend on the weights' values.
`python benchmarks/gpu_models.py --export-bert-base` remakes the file (needs the zoo
extra: torch, transformers).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "data"
ZOO = ROOT / "tests" / "data" / "real_zoo"
REAL_TRANSFORMERS = ["vit", "swin", "bert", "distilbert_dynamic", "gpt2", "t5_encoder", "llama",
                     "whisper_encoder"]
MLP3 = {"mlp3": 128, "mlp3_b512": 512}
SMALL = ["mlp3_small", "encoder_small"]     # test sizes (tests/models.py), for the interpreter
HALF_SUFFIX = "_fp16"
BERT_SEQ = 128


def light_names() -> list[str]:
    from apsat.pipeline.zoo import light_model_paths

    return [p.stem.removeprefix("light_") for p in light_model_paths()]


def all_names() -> list[str]:
    return [*light_names(), *REAL_TRANSFORMERS, "bert_base", *MLP3]


def known(name: str) -> bool:
    """Whether `name` is a benchmark model (a NAME_fp16 variant of one included)."""
    return name.removesuffix(HALF_SUFFIX) in all_names() + SMALL


def half(model, inputs: dict):
    """(model in float16 by onnxruntime's converter, inputs with float ones in float16)."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    return (convert_float_to_float16(model, keep_io_types=False),
            {k: v.astype(np.float16) if v.dtype.kind == "f" else v for k, v in inputs.items()})


def load(name: str):
    """(onnx.ModelProto with its weights, {input name: array}) of a benchmark model."""
    import onnx

    if name.endswith(HALF_SUFFIX):
        return half(*load(name.removesuffix(HALF_SUFFIX)))

    from apsat.pipeline.zoo import light_model_paths, randomize_weights

    light = {p.stem.removeprefix("light_"): p for p in light_model_paths()}
    if name in light:
        model = randomize_weights(onnx.load(str(light[name])), seed=0)
        return model, _drawn_inputs(model)
    if name in REAL_TRANSFORMERS:
        with np.load(ZOO / f"{name}.npz") as data:
            inputs = {k: data[k] for k in data.files if not k.startswith("output:")}
        return onnx.load(str(ZOO / f"{name}.onnx")), inputs
    if name == "bert_base":
        model = randomize_weights(onnx.load(str(DATA / "bert_base.onnx")), seed=0)
        return model, bert_inputs()
    if name in MLP3 or name in SMALL:
        sys.path.insert(0, str(ROOT / "tests"))
        import models

        model = (models.mlp3(batch=MLP3[name], sizes=(1024, 4096, 4096, 1000)) if name in MLP3
                 else models.mlp3() if name == "mlp3_small" else models.encoder_block())
        return model, _drawn_inputs(model)
    raise KeyError(f"unknown benchmark model {name!r}; known: {', '.join(all_names())}")


def _drawn_inputs(model) -> dict:
    """Seeded inputs of a model's float inputs (apsat.pipeline.zoo.random_inputs)."""
    import apsat
    from apsat.pipeline.zoo import random_inputs

    return random_inputs(apsat.load_onnx(model), 0)


def bert_inputs() -> dict:
    """Seeded token ids (1, 128) below BERT's vocabulary and an attention mask of ones."""
    ids = np.random.default_rng(0).integers(1, 30522, size=(1, BERT_SEQ), dtype=np.int64)
    return {"input_ids": ids, "attention_mask": np.ones((1, BERT_SEQ), dtype=np.int64)}


def strip_weights(model, min_elements: int = 1024):
    """A copy of `model` whose float initializers of at least `min_elements` elements are
    ConstantOfShape placeholders (randomize_weights draws them again)."""
    import onnx
    from onnx import helper, numpy_helper

    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    keep, placeholders = [], []
    for init in g.initializer:
        n = int(np.prod(init.dims)) if init.dims else 1
        if init.data_type != onnx.TensorProto.FLOAT or n < min_elements:
            keep.append(init)
            continue
        shape = numpy_helper.from_array(np.array(init.dims, dtype=np.int64), f"{init.name}__shape")
        keep.append(shape)
        placeholders.append(helper.make_node("ConstantOfShape", [shape.name], [init.name],
                                             value=helper.make_tensor("v", onnx.TensorProto.FLOAT, [1], [0.0])))
    del g.initializer[:]
    g.initializer.extend(keep)
    nodes = placeholders + list(g.node)
    del g.node[:]
    g.node.extend(nodes)
    return out


def export_bert_base(path: Path) -> dict:
    """Export BertModel(BertConfig()) (seeded init) at opset 17 and write it weightless."""
    import onnx

    spec = importlib.util.spec_from_file_location("export_zoo", ROOT / "benchmarks" / "export_zoo.py")
    ez = importlib.util.module_from_spec(spec)
    sys.modules["export_zoo"] = ez            # its dataclasses look their module up
    spec.loader.exec_module(ez)
    torch, _, tf = ez._import_libraries()
    torch.manual_seed(0)
    bert = tf.BertModel(tf.BertConfig(use_cache=False)).eval()
    inputs = bert_inputs()
    model = ez.export_onnx(torch, ez.Spec(ez.wrap(torch, bert, list(inputs)), inputs, ["last_hidden_state"],
                                          "transformer", "transformers.BertModel(BertConfig())", {}))
    stripped = strip_weights(model)
    onnx.checker.check_model(stripped)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(stripped, str(path))
    return {"file": str(path), "nodes": len(model.graph.node), "bytes": path.stat().st_size,
            "versions": {"torch": torch.__version__, "transformers": tf.__version__}}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--export-bert-base", action="store_true", help="remake benchmarks/data/bert_base.onnx")
    args = ap.parse_args()
    if args.export_bert_base:
        print(json.dumps(export_bert_base(DATA / "bert_base.onnx"), indent=1))
    else:
        print("\n".join(all_names()))
