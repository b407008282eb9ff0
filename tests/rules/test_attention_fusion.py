"""The `attention-fusion` rules (apsat/rules/attention-fusion.egg): each main rule is sound
(every member of the root e-class equals the original on seeded random inputs, harness
tolerance rtol 1e-4 / atol 1e-5), reaches the `attention` atom, and refuses the look-alikes
whose reshape or broadcast is not the batched product's; the helper rules are exercised
through them. Then the real-zoo transformers: every attention of each becomes an atom and
the extracted program still equals onnxruntime."""

import json
from pathlib import Path

import numpy as np
import pytest

from apsat.pipeline import optimize as pipeline
from apsat.pipeline.inputs import random_inputs
from apsat.pipeline.verify import verify_program
from harness import check_reaches, check_refuses, check_sound, helper_rules

HELPERS = helper_rules("attention-fusion")
ZOO = Path(__file__).resolve().parents[1] / "data" / "real_zoo"

# Two heads of 5 queries over 6 keys of width 4, values of width 3: the importer's forms.
SHAPES = {"q": (1, 2, 5, 4), "k": (1, 2, 6, 4), "vt": (1, 2, 3, 6), "mask": (1, 1, 5, 6)}
QK = ("(access-pair (access-broadcast (access-reshape (access-tensor q) (access-shape (shape 1 2 5 1 4) (shape))) "
      "(access-shape (shape 1 2 5 6) (shape 4))) (access-broadcast (access-reshape (access-tensor k) "
      "(access-shape (shape 1 2 1 6 4) (shape))) (access-shape (shape 1 2 5 6) (shape 4))))")
S = f"(compute dot-product {QK})"
MASK = "(access-broadcast (access (access-tensor mask) 4) (access-shape (shape 1 2 5 6) (shape)))"
V = ("(access-broadcast (access-reshape (access-tensor vt) (access-shape (shape 1 2 1 3 6) (shape))) "
     "(access-shape (shape 1 2 5 3) (shape 6)))")


def softmax(scores: str) -> str:
    return f"(compute softmax (access {scores} 3))"


def nan_to_zero(p: str, rank: int = 4) -> str:
    """transformers' sdpa export: Where(IsNaN(p), 0, p) as the importer writes it."""
    zero = ("(access-broadcast (access-reshape (access-literal 0.0) (access-shape (shape 1 1 1 1) (shape))) "
            "(access-shape (shape 1 2 5 6) (shape)))")
    part = lambda x: f"(access (access-insert-axis {x} {rank}) {rank})"   # noqa: E731
    return (f"(compute select (access-concatenate (access-concatenate {part(f'(access (compute is-nan {p}) {rank})')} "
            f"{part(zero)} {rank}) {part(f'(access {p} {rank})')} {rank}))")


def times_v(probs: str, reshape: str = "(shape 1 2 5 1 6)", target: str = "(shape 1 2 5 3)", v: str = V) -> str:
    return (f"(compute dot-product (access-pair (access-broadcast (access-reshape {probs} (access-shape {reshape} (shape))) "
            f"(access-shape {target} (shape 6))) {v}))")


PLAIN = times_v(softmax(S))
# the scale after the product: S * 0.125 or S / 2.0 (a scalar broadcast over S)
SCALAR = ("(access-broadcast (access-reshape (access-literal {c}) (access-shape (shape 1 1 1 1) (shape))) "
          "(access-shape (shape 1 2 5 6) (shape)))")
SCALED = times_v(softmax(f"(compute elementwise-mul (access-pair {S} {SCALAR.format(c=0.125)}))"))
DIVIDED = times_v(softmax(f"(compute elementwise-div (access-pair {S} {SCALAR.format(c=2.0)}))"))
# a scalar weight (an initializer of one value) instead of a literal
SCALED_BY_WEIGHT = times_v(softmax(
    "(compute elementwise-mul (access-pair " + S + " (access-broadcast (access-reshape (access-tensor c1) "
    "(access-shape (shape 1 1 1 1) (shape))) (access-shape (shape 1 2 5 6) (shape)))))"))
# a boolean mask applied by Where with the dtype's minimum, as the importer writes Where
MIN = -3.4028234663852886e38
BOOL_MASK = "(access-broadcast (access (access-tensor bmask) 4) (access-shape (shape 1 2 5 6) (shape)))"


def where(cond: str, a: str, b: str, rank: int = 4) -> str:
    part = lambda x: f"(access (access-insert-axis {x} {rank}) {rank})"   # noqa: E731
    return f"(compute select (access-concatenate (access-concatenate {part(cond)} {part(a)} {rank}) {part(b)} {rank}))"


MASKED_FILL = times_v(softmax(where(BOOL_MASK, SCALAR.format(c=MIN), S)))
MASKED_KEEP = times_v(softmax(where(BOOL_MASK, S, SCALAR.format(c=MIN))))
SCALED_BIASED = times_v(softmax(
    f"(compute elementwise-add (access-pair (compute elementwise-mul (access-pair {S} {SCALAR.format(c=0.125)})) {MASK}))"))
BIASED = times_v(softmax(f"(compute elementwise-add (access-pair {S} {MASK}))"))
BIASED_COMMUTED = times_v(softmax(f"(compute elementwise-add (access-pair {MASK} {S}))"))
SAFE = times_v(nan_to_zero(softmax(f"(compute elementwise-add (access-pair {S} {MASK}))")))

# heads merged into one batch axis (rank 3): 2 x 5 queries, 6 keys
SHAPES3 = {"q": (2, 5, 4), "k": (2, 6, 4), "vt": (2, 3, 6)}
QK3 = ("(access-pair (access-broadcast (access-reshape (access-tensor q) (access-shape (shape 2 5 1 4) (shape))) "
       "(access-shape (shape 2 5 6) (shape 4))) (access-broadcast (access-reshape (access-tensor k) "
       "(access-shape (shape 2 1 6 4) (shape))) (access-shape (shape 2 5 6) (shape 4))))")
MERGED = (f"(compute dot-product (access-pair (access-broadcast (access-reshape (compute softmax (access "
          f"(compute dot-product {QK3}) 2)) (access-shape (shape 2 5 1 6) (shape))) (access-shape (shape 2 5 3) (shape 6))) "
          "(access-broadcast (access-reshape (access-tensor vt) (access-shape (shape 2 1 3 6) (shape))) "
          "(access-shape (shape 2 5 3) (shape 6)))))")


def masked_inputs(seed: int = 0) -> dict:
    """Random q, k, v and a causal mask (-inf above the diagonal) with query row 0 fully
    masked, so the SAFE form's NaN-to-0 select matters."""
    rng = np.random.default_rng(seed)
    out = {n: rng.standard_normal(s).astype(np.float32) for n, s in SHAPES.items() if n != "mask"}
    mask = np.where(np.arange(6)[None, :] > np.arange(5)[:, None], -np.inf, 0.0).astype(np.float32)
    mask[0] = -np.inf
    out["mask"] = mask.reshape(1, 1, 5, 6)
    return out


def test_heads_sound_and_reach():
    assert check_sound("attention-fusion/heads", PLAIN, SHAPES, helpers=HELPERS) >= 2
    check_reaches("attention-fusion/heads", PLAIN, SHAPES, "(attention 0 ?qk (access-literal 0.0) ?v)",
                  helpers=HELPERS)


@pytest.mark.parametrize("text", [BIASED, BIASED_COMMUTED])
def test_heads_bias_sound_and_reach(text):
    assert check_sound("attention-fusion/heads-bias", text, SHAPES, helpers=HELPERS) >= 2
    check_reaches("attention-fusion/heads-bias", text, SHAPES, f"(attention 0 ?qk {MASK} ?v)", helpers=HELPERS)


def test_heads_bias_nan_to_zero_sound_on_fully_masked_rows():
    inputs = masked_inputs()
    assert check_sound("attention-fusion/heads-bias", SAFE, SHAPES, helpers=HELPERS, inputs=inputs) >= 2
    check_reaches("attention-fusion/heads-bias", SAFE, SHAPES, f"(attention 1 ?qk {MASK} ?v)", helpers=HELPERS)


@pytest.mark.parametrize("text", [SCALED, DIVIDED], ids=["times-scalar", "over-scalar"])
def test_heads_with_the_scale_after_the_product_sound_and_reach(text):
    """The scalar moves onto q inside the atom's qk operand."""
    assert check_sound("attention-fusion/heads", text, SHAPES, helpers=HELPERS) >= 2
    check_reaches("attention-fusion/heads", text, SHAPES,
                  "(attention 0 (access-pair (compute ?op ?qc) ?kb) (access-literal 0.0) ?v)", helpers=HELPERS)


def test_heads_bias_with_the_scale_after_the_product_sound_and_reach():
    assert check_sound("attention-fusion/heads-bias", SCALED_BIASED, SHAPES, helpers=HELPERS) >= 2
    check_reaches("attention-fusion/heads-bias", SCALED_BIASED, SHAPES, f"(attention 0 ?qk {MASK} ?v)",
                  helpers=HELPERS)


def test_heads_with_a_scalar_weight_scale_sound_and_reach():
    shapes = {**SHAPES, "c1": (1,)}
    assert check_sound("attention-fusion/heads", SCALED_BY_WEIGHT, shapes, helpers=HELPERS) >= 2
    check_reaches("attention-fusion/heads", SCALED_BY_WEIGHT, shapes, "(attention 0 ?qk (access-literal 0.0) ?v)",
                  helpers=HELPERS)


def bool_mask_inputs(seed: int = 0) -> dict:
    """Random q, k, v and a 0/1 mask with some keys masked in every query row."""
    rng = np.random.default_rng(seed)
    out = {n: rng.standard_normal(s).astype(np.float32) for n, s in SHAPES.items() if n != "mask"}
    out["bmask"] = (rng.random((1, 1, 5, 6)) < 0.4).astype(np.float32)
    out["bmask"][..., 0] = 0.0          # at least one key kept per row, whichever form
    out["bmask"][..., 1] = 1.0
    return out


@pytest.mark.parametrize("text", [MASKED_FILL, MASKED_KEEP], ids=["masked-fill", "where-keep"])
def test_heads_bias_with_a_where_mask_sound_and_reach(text):
    """Where(mask, min, S) and Where(mask, S, min): S plus a bias of 0 and the minimum."""
    shapes = {**SHAPES, "bmask": (1, 1, 5, 6)}
    assert check_sound("attention-fusion/heads-bias", text, shapes, helpers=HELPERS, inputs=bool_mask_inputs()) >= 2
    check_reaches("attention-fusion/heads-bias", text, shapes, "(attention 0 ?qk (compute select ?b) ?v)",
                  helpers=HELPERS)


def test_refuses_a_where_fill_that_is_not_the_minimum():
    """Where(mask, -5, S) is not S + a bias (-5 + S is not -5)."""
    shapes = {**SHAPES, "bmask": (1, 1, 5, 6)}
    check_refuses("attention-fusion/heads-bias", times_v(softmax(where(BOOL_MASK, SCALAR.format(c=-5.0), S))),
                  shapes, helpers=HELPERS)


def test_refuses_a_scale_that_is_not_a_scalar():
    """S times a tensor of S's shape varies per key: it is not a scale of q."""
    check_refuses("attention-fusion/heads", times_v(softmax(f"(compute elementwise-mul (access-pair {S} {MASK}))")),
                  SHAPES, helpers=HELPERS)


def test_merged_heads_sound_and_reach():
    assert check_sound("attention-fusion/merged-heads", MERGED, SHAPES3, helpers=HELPERS) >= 2
    check_reaches("attention-fusion/merged-heads", MERGED, SHAPES3, "(attention 0 ?qk (access-literal 0.0) ?v)",
                  helpers=HELPERS)


def test_merged_heads_bias_sound_and_reach():
    bias = "(access-broadcast (access (access-tensor b3) 3) (access-shape (shape 2 5 6) (shape)))"
    text = MERGED.replace(f"(compute dot-product {QK3})", f"(compute elementwise-add (access-pair (compute dot-product {QK3}) {bias}))")
    shapes = {**SHAPES3, "b3": (1, 5, 6)}
    assert check_sound("attention-fusion/merged-heads-bias", text, shapes, helpers=HELPERS) >= 2
    check_reaches("attention-fusion/merged-heads-bias", text, shapes, f"(attention 0 ?qk {bias} ?v)", helpers=HELPERS)


def test_heads_bias_through_a_reshaped_mask_sound_and_reach():
    """Swin's shifted windows: (S + b0) reshaped to (windows, heads, ..), a mask added, and
    reshaped back; the atom's bias becomes b0 + the mask reshaped."""
    shifted = ("(access-reshape (compute elementwise-add (access-pair (access-reshape (compute elementwise-add "
               f"(access-pair {S} {MASK})) (access-shape (shape 1 1 2 5 6) (shape))) "
               "(access-broadcast (access (access-tensor win) 5) (access-shape (shape 1 1 2 5 6) (shape))))) "
               "(access-shape (shape 1 2 5 6) (shape)))")
    text = times_v(softmax(shifted))
    shapes = {**SHAPES, "win": (1, 1, 1, 5, 6)}
    assert check_sound("attention-fusion/heads-bias", text, shapes, helpers=HELPERS) >= 2
    check_reaches("attention-fusion/heads-bias", text, shapes, "(attention 0 ?qk (compute elementwise-add ?b) ?v)",
                  helpers=HELPERS)
    check_refuses("attention-fusion/heads-bias", text, shapes,
                  helpers=[h for h in HELPERS if h != "attention-fusion/aux-scores-reshaped-bias"])


# Each helper is the only way to its form: without it, the main rule refuses that form.
@pytest.mark.parametrize("rule,helper,text", [
    ("attention-fusion/heads", "attention-fusion/aux-scores", PLAIN),
    ("attention-fusion/heads", "attention-fusion/aux-probs", PLAIN),
    ("attention-fusion/heads-bias", "attention-fusion/aux-scores-bias", BIASED),
    ("attention-fusion/heads-bias", "attention-fusion/aux-scores-bias", BIASED_COMMUTED),
    ("attention-fusion/heads-bias", "attention-fusion/aux-probs-nan-to-zero", SAFE),
    ("attention-fusion/heads", "attention-fusion/aux-scores-scaled", SCALED),
    ("attention-fusion/heads", "attention-fusion/aux-scores-divided", DIVIDED),
])
def test_each_helper_is_needed(rule, helper, text):
    check_reaches(rule, text, SHAPES, "(attention ?f ?qk ?b ?v)", helpers=HELPERS)
    check_refuses(rule, text, SHAPES, helpers=[h for h in HELPERS if h != helper])


@pytest.mark.parametrize("helper,text", [
    ("attention-fusion/aux-scores-masked-fill", MASKED_FILL),
    ("attention-fusion/aux-scores-masked-keep", MASKED_KEEP),
])
def test_each_where_mask_helper_is_needed(helper, text):
    shapes = {**SHAPES, "bmask": (1, 1, 5, 6)}
    check_reaches("attention-fusion/heads-bias", text, shapes, "(attention ?f ?qk ?b ?v)", helpers=HELPERS)
    check_refuses("attention-fusion/heads-bias", text, shapes, helpers=[h for h in HELPERS if h != helper])


def _where_masked_attention(keep: bool):
    """ONNX: q.k^T * 0.5, Where over a causal boolean mask with float32's minimum (as
    Constant nodes, which the importer reads as literals), Softmax, . v."""
    from models import make_model
    from onnx import helper, numpy_helper

    def const(name, value):
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(value, np.float32)))

    tril = np.tril(np.ones((5, 5), bool)).reshape(1, 1, 5, 5)
    where = (helper.make_node("Where", ["mask", "s", "fill"], ["sm"]) if keep
             else helper.make_node("Where", ["mask", "fill", "s"], ["sm"]))
    nodes = [const("scale", 0.5), const("fill", MIN),
             helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["s0"]), helper.make_node("Mul", ["s0", "scale"], ["s"]),
             where, helper.make_node("Softmax", ["sm"], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v"], ["y"])]
    return make_model(nodes, {"q": (1, 2, 5, 4), "k": (1, 2, 5, 4), "v": (1, 2, 5, 3)}, ["y"],
                      {"mask": tril if keep else ~tril})


@pytest.mark.parametrize("keep", [False, True], ids=["masked-fill", "where-keep"])
def test_where_masked_attention_from_onnx_is_one_atom(keep):
    """The importer's Where and Mul forms, end to end: one attention atom, and the
    extracted program equals onnxruntime."""
    import apsat

    res = apsat.optimize(apsat.load_onnx(_where_masked_attention(keep)), target="gpu")
    assert res.program.op_counts().get("attention") == 1
    assert not any(t.op == "compute" and t.args[0].op == "softmax" for t in res.program.terms())
    assert res.report["verification"]["ok"]


def test_refuses_a_reshape_that_moves_elements():
    # (1 2 5 1 6) -> (2 1 5 1 6): same element count, but the head axis is no longer S's
    moved = times_v(softmax(S), reshape="(shape 2 1 5 1 6)", target="(shape 2 1 5 3)",
                    v="(access-broadcast (access-reshape (access-tensor vt) (access-shape (shape 2 1 1 3 6) (shape))) "
                      "(access-shape (shape 2 1 5 3) (shape 6)))")
    check_refuses("attention-fusion/heads", moved, SHAPES, helpers=HELPERS)


def test_refuses_a_broadcast_of_the_batch_axis():
    # S has batch 1; the product broadcasts it to 2, which the atom's operands cannot say
    wide = times_v(softmax(S), target="(shape 2 2 5 3)",
                   v="(access-broadcast (access-reshape (access-tensor vt) (access-shape (shape 1 2 1 3 6) (shape))) "
                     "(access-shape (shape 2 2 5 3) (shape 6)))")
    check_refuses("attention-fusion/heads", wide, SHAPES, helpers=HELPERS)


def test_refuses_softmax_over_another_axis():
    # softmax over (n) of an access split at 2 is over (m, n) jointly: not attention
    joint = times_v(f"(compute softmax (access {S} 2))")
    check_refuses("attention-fusion/heads", joint, SHAPES, helpers=HELPERS)


MANIFEST = json.loads((ZOO / "manifest.json").read_text())["models"]
TRANSFORMERS = [n for n, e in MANIFEST.items() if e["family"] == "transformer"]


@pytest.mark.slow
@pytest.mark.parametrize("name", TRANSFORMERS)
def test_every_attention_of_the_real_zoo_becomes_an_atom(name):
    """Every attention (one per exported Softmax) of each transformer (ViT, Swin, BERT, DistilBERT
    with symbolic dims, GPT-2 and Llama with causal masks, T5 with its position bias,
    Whisper) are extracted as atoms, and the extracted program equals onnxruntime."""
    seconds = {}
    quiet = lambda *a: None   # noqa: E731
    m, eg, handles, _ = pipeline._load(ZOO / f"{name}.onnx", "gpu", quiet, seconds)
    pipeline._saturate(eg, m, None, False, quiet, seconds)
    program = pipeline._extract(eg, handles, "greedy-dag")[0][1]   # the extractor's own candidate
    ops = [t.op for t in program.terms()]
    assert ops.count("attention") == MANIFEST[name]["ops"]["Softmax"]
    assert not any(t.op == "compute" and t.args[0].op == "softmax" for t in program.terms())
    assert verify_program(m, program, random_inputs(m, 0)).ok
