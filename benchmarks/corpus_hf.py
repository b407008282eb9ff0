"""The transformers side of the public corpus (benchmarks/corpus.py): one family per model
module of transformers (`transformers.models.<module>`), each built from its own config
class shrunk to a tiny size, never from pretrained weights.

A module's candidates are the model types that transformers' AutoModel maps to it (a
multimodal module also lists its text and vision towers: `clip`, `clip_text_model`,
`clip_vision_model`); the first that builds and exports is the family's model. Shrinking is
generic (`shrink`): every config field that sets a depth, a width, a head count, a vocabulary
or a position table is set to a tiny value wherever it appears, sub-configs included, so a
new transformers release brings its new families without an edit here. Inputs follow the
model's `main_input_name` (token ids and a mask, pixels, raw audio or log-mel features).
"""
from __future__ import annotations

import inspect

import numpy as np

SEED, SEQ, DEC_SEQ, VOCAB = 0, 16, 8, 128
LAYERS, HIDDEN, HEADS, FFN, HEAD_DIM = 2, 32, 2, 64, 16
# config field -> tiny value (set wherever the field holds a number); None leaves it alone
SCALARS = {
    **dict.fromkeys(("num_hidden_layers", "num_layers", "n_layer", "n_layers", "encoder_layers",
                     "decoder_layers", "num_decoder_layers", "num_encoder_layers", "depth",
                     "num_text_layers", "num_vision_layers", "num_audio_layers"), LAYERS),
    **dict.fromkeys(("hidden_size", "d_model", "n_embd", "embed_dim", "dim", "embedding_size",
                     "word_embed_proj_dim", "projection_dim", "output_hidden_size", "text_hidden_size",
                     "vision_hidden_size", "d_embed", "embedding_dim", "hidden_dim_size"), HIDDEN),
    **dict.fromkeys(("num_attention_heads", "n_head", "n_heads", "encoder_attention_heads",
                     "decoder_attention_heads", "num_heads"), HEADS),
    **dict.fromkeys(("num_key_value_heads", "num_kv_heads", "multi_query_group_num"), 1),
    **dict.fromkeys(("intermediate_size", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "d_ff",
                     "n_inner", "ffn_hidden_size", "mlp_dim"), FFN),
    **dict.fromkeys(("moe_intermediate_size", "shared_expert_intermediate_size", "expert_intermediate_size",
                     "decoder_hidden_size", "classifier_proj_size", "codevector_dim", "proj_codevector_dim",
                     "adapter_attn_dim"), HIDDEN),
    **dict.fromkeys(("head_dim", "d_kv", "attention_head_dim", "qk_head_dim", "v_head_dim",
                     "kv_lora_rank", "q_lora_rank", "attention_head_size"), HEAD_DIM),
    **dict.fromkeys(("qk_rope_head_dim", "qk_nope_head_dim"), HEAD_DIM // 2),
    **dict.fromkeys(("num_experts", "num_local_experts", "n_routed_experts"), 4),
    **dict.fromkeys(("num_experts_per_tok", "moe_topk", "top_k"), 2),
    **dict.fromkeys(("n_group", "topk_group", "first_k_dense_replace", "n_shared_experts"), 1),
    **dict.fromkeys(("max_position_embeddings", "n_positions", "max_target_positions", "n_ctx",
                     "max_text_positions", "max_seq_len", "max_sequence_length"), 64),
    "max_source_positions": 16, "num_mel_bins": 16, "image_size": 64, "vocab_size": VOCAB,
    "num_conv_pos_embeddings": 16, "num_conv_pos_embedding_groups": 2,
    "num_codevectors_per_group": 8, "sliding_window": 8, "type_vocab_size": 2, "window_size": 2,
}
LISTS_OF_WIDTHS = ("hidden_sizes", "embed_dims", "dims", "embed_dim", "neck_hidden_sizes", "widths")
LISTS_OF_DEPTHS = ("depths", "num_layers_per_stage", "block_repeats")
LISTS_OF_HEADS = ("num_heads", "num_attention_heads", "heads")
CONV_LISTS = ("conv_dim", "tdnn_dim")
PER_LAYER_LISTS = ("layer_types", "layers_block_type", "block_types", "attn_type_list")
SKIP_KEYS = ("id2label", "label2id", "rope_parameters", "rope_scaling", "quantization_config")


def families(tf) -> dict[str, list[str]]:
    """module name -> its model types (AutoModel's), towers after the combined model."""
    from transformers.models.auto import modeling_auto
    from transformers.models.auto.configuration_auto import model_type_to_module_name

    out: dict[str, list[str]] = {}
    for model_type in modeling_auto.MODEL_MAPPING_NAMES:
        out.setdefault(model_type_to_module_name(model_type), []).append(model_type)
    return dict(sorted(out.items()))


def _tiny_int(key: str, value):
    """The tiny value of one integer field, or the value unchanged."""
    want = SCALARS.get(key)
    if want is None or isinstance(value, bool) or not isinstance(value, int):
        return value
    return min(value, want) if key not in ("vocab_size",) else want


def shrink(d: dict, fields=None) -> dict:
    """A config dict with every size field made tiny (see the module doc); nested config
    dicts (text_config, vision_config, encoder, ...) are shrunk the same way. Only the
    fields the config class takes (`fields`, None: all) are changed: a derived one (Swin's
    hidden_size, computed from embed_dim and depths) is left for the class to compute."""
    layers = next((d[k] for k in ("num_hidden_layers", "num_layers", "n_layer") if isinstance(d.get(k), int)), None)
    out = {}
    for key, value in d.items():
        if key in SKIP_KEYS or key.startswith("_") or (fields is not None and key not in fields):
            out[key] = value
        elif isinstance(value, dict) and ("model_type" in value or key.endswith("config")):
            out[key] = shrink(value, config_fields(value.get("model_type")))
        elif isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            out[key] = _shrink_list(key, value)
        elif isinstance(value, list) and key in PER_LAYER_LISTS and layers and len(value) == layers:
            out[key] = value[:LAYERS]
        elif key.endswith(("_token_id", "_token_index")) and isinstance(value, int) and value >= VOCAB:
            out[key] = 3 + len(out) % (VOCAB - 3)   # special ids must index the tiny vocabulary
        else:
            out[key] = _tiny_int(key, value)
    if isinstance(out.get("qk_rope_head_dim"), int):    # multi-head latent attention's dims agree
        out.update(head_dim=out["qk_rope_head_dim"], qk_head_dim=out["qk_rope_head_dim"] + out["qk_nope_head_dim"])
        if "num_key_value_heads" in out:
            out["num_key_value_heads"] = out.get("num_attention_heads", HEADS)
    return {k: v for k, v in out.items() if fields is None or k in fields or k not in d or k == "model_type"}


def config_fields(model_type) -> set | None:
    """The fields a model type's config class takes (its dataclass fields, else its
    __init__'s parameters); None when the type is unknown."""
    import dataclasses

    from transformers import CONFIG_MAPPING

    try:
        cls = CONFIG_MAPPING[model_type]
    except (KeyError, TypeError):
        return None
    if dataclasses.is_dataclass(cls):
        return {f.name for f in dataclasses.fields(cls)}
    return set(inspect.signature(cls.__init__).parameters)


def _shrink_list(key: str, value: list) -> list:
    """A per-stage list made tiny: widths 16, 32, 64 ...; depths 1; heads 1; conv widths 16."""
    if key in LISTS_OF_WIDTHS:
        return [16 * 2 ** min(i, 3) for i in range(len(value))]
    if key in LISTS_OF_DEPTHS:
        return [1] * len(value)
    if key in LISTS_OF_HEADS:
        return [1] * len(value)
    if key in CONV_LISTS:
        return [16] * len(value)
    return value


def tiny_config(tf, model_type: str, extra: dict | None = None):
    """The model type's config class built from its defaults, shrunk (then `extra`'s
    fields set), without a cache."""
    from transformers import AutoConfig

    base = AutoConfig.for_model(model_type).to_dict()
    d = shrink(base, config_fields(model_type))
    for key in ("model_type", "transformers_version", "architectures"):
        d.pop(key, None)
    if "use_cache" in base:
        d["use_cache"] = False
    d.setdefault("num_labels", 2)
    d.update(extra or {})
    # mixture-of-experts layers: one batched matmul over every expert traces to plain ops,
    # where the default loop over the experts chosen counts tokens with histc (no ONNX form)
    return AutoConfig.for_model(model_type, **d, experts_implementation="batched_mm")


def _image_size(config) -> int:
    size = getattr(config, "image_size", 64)
    return int(size[0] if isinstance(size, (list, tuple)) else size)


def make_inputs(model, config) -> dict:
    """Seeded inputs for the model's main input (and what goes with it), by forward's
    parameter names: token ids (with an attention mask, and decoder ids for an
    encoder-decoder), pixels, raw audio, or log-mel features."""
    rng = np.random.default_rng(SEED)
    params = inspect.signature(model.forward).parameters
    main = getattr(model, "main_input_name", "input_ids")
    vocab = int(getattr(config, "vocab_size", None) or VOCAB)
    ids = lambda n: rng.integers(3, min(vocab, VOCAB), size=(1, n), dtype=np.int64)  # noqa: E731
    inputs: dict[str, np.ndarray] = {}
    if main == "input_ids" or (main not in params and "input_ids" in params):
        inputs["input_ids"] = ids(SEQ)
        if "attention_mask" in params:
            inputs["attention_mask"] = np.ones((1, SEQ), dtype=np.int64)
        vision = getattr(config, "vision_config", None)
        if "pixel_values" in params and vision is not None:     # a dual encoder (CLIP-style)
            ch, size = int(getattr(vision, "num_channels", 3)), _image_size(vision)
            inputs["pixel_values"] = rng.standard_normal((1, ch, size, size)).astype(np.float32)
    elif main == "pixel_values":
        ch = int(getattr(config, "num_channels", 3))
        size = _image_size(config)
        inputs["pixel_values"] = rng.standard_normal((1, ch, size, size)).astype(np.float32)
    elif main == "input_values":
        inputs["input_values"] = rng.standard_normal((1, 4000)).astype(np.float32)
    elif main == "input_features":
        mels = int(getattr(config, "num_mel_bins", 0) or getattr(config, "input_feat_per_channel", 16))
        frames = 2 * int(getattr(config, "max_source_positions", 16) or 16)
        inputs["input_features"] = rng.standard_normal((1, mels, frames)).astype(np.float32)
    else:
        raise NotImplementedError(f"main input {main!r} has no generator here")
    if getattr(config, "is_encoder_decoder", False) and "decoder_input_ids" in params:  # not an encoder's
        inputs["decoder_input_ids"] = ids(DEC_SEQ)
    return inputs


def build(model_type: str, torch, tf, part: str = "model", extra: dict | None = None):
    """(module returning one tensor, inputs, config dict) of AutoModel for one model type,
    from its tiny config with seeded random weights, in eval mode; part "encoder" takes an
    encoder-decoder's encoder alone; `extra` sets config fields after the shrink."""
    from transformers import AutoModel

    config = tiny_config(tf, model_type, extra)
    torch.manual_seed(SEED)
    model = AutoModel.from_config(config).eval()
    if part == "encoder":
        if not getattr(config, "is_encoder_decoder", False) or not hasattr(model, "get_encoder"):
            raise ValueError(f"{model_type} is not an encoder-decoder")
        model = model.get_encoder().eval()
    inputs = make_inputs(model, config)
    return first_output(torch, model, list(inputs)), inputs, _summary(config)


def first_output(torch, model, names: list):
    """The model as a module with positional inputs (in the order of names) and one tensor
    out: the first tensor of its output (last_hidden_state, logits ...)."""
    class First(torch.nn.Module):
        """Positional inputs in, the first output tensor out."""
        def __init__(self):
            """Hold the wrapped model."""
            super().__init__()
            self.model = model

        def forward(self, *args):
            """Call the model with keyword inputs; return its first tensor output."""
            out = self.model(**dict(zip(names, args)))
            return first_tensor(torch, out)
    return First().eval()


def first_tensor(torch, out):
    """The first tensor in a model output (a ModelOutput, tuple, list or dict, nested)."""
    if isinstance(out, torch.Tensor):
        return out
    values = out.values() if isinstance(out, dict) else out.to_tuple() if hasattr(out, "to_tuple") else out
    for value in values:
        if value is None:
            continue
        try:
            return first_tensor(torch, value)
        except TypeError:
            continue
    raise TypeError(f"no tensor among the outputs ({type(out).__name__})")


def _summary(config) -> dict:
    """The config fields worth recording: the sizes shrink set, top level only."""
    d = config.to_dict()
    return {k: v for k, v in d.items() if k in SCALARS and isinstance(v, int) and not isinstance(v, bool)}
