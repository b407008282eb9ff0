"""Kernel counts and modelled time of the gpu target, before and after the fusion rulesets
that turn attention and normalisation chains into one operator each.

Table 1, per model of the real zoo (tests/data/real_zoo, stored inputs) and the light zoo
(the onnx package's nine CNNs, seeded random weights as `apsat zoo` gives them): the gpu
kernel graph's kernels per inference (the graph's kernels less its once-only weight
preparation, KernelGraph.prepare_steps, which runs when the model is loaded) after optimize(target="gpu") with the default
phase plan ("after") and with the same plan minus the rulesets "attention-fusion" and
"norm-fusion" ("before"; a phase left with no ruleset is dropped; the header names those
of the two that a rule file defines and the plan runs), onnxruntime's node count after
ORT_ENABLE_EXTENDED, kernels per transformer layer, `attention` kernels, host steps,
once-only steps and the report's modelled time per inference
(report["gpu_kernels"]["totals"]["modelled_us"]: the H100 roofline of every kernel and
host step outside the weight preparation, apsat/backends/gpu/graph.py). "before" runs the
pipeline unchanged with apsat.rules.saturate.default_plan giving that plan for the call
(optimize() runs one phase of the caller's rules or the default plan, no plan of the
caller's); only "after" is verified against onnxruntime.

Kernels per layer (transformers; the layer count comes from the manifest's config): each
step of the kernel graph is given a layer or "outside".
  1. A weight's place is where the ONNX graph uses it: the layer index in the names of
     the nodes that read it (following the exporter's Identity aliases; the weight's own
     name where a reader has none), e.g. `/model/encoder/layer.1/attention/...`. A
     weight read in one layer places there; one read only outside every layer places
     outside; one read in several places (exporters share identical tensors such as
     LayerNorm gammas of ones and zero biases across layers) places nowhere. A weight
     the ONNX graph does not have (made by the importer) is placed by its own name.
  2. A step reading a weight placed in a layer belongs to it (the highest such layer).
  3. Any other step belongs to the layer it feeds: follow its result forward to the first
     steps that read a placed weight (in a layer or outside); if those are in exactly one
     layer the step belongs to it, unless the step itself reads weights placed outside
     and no step before it is in that layer (the embeddings). Feeding only steps outside
     (the final norm before the head), no step, or several layers (masks, rotary tables)
     makes it outside.
So a pre-norm block's first LayerNorm counts in its own layer, and a post-norm block's
last LayerNorm (BERT) in the next layer, the last one outside, so each layer counts the
same kernels; a LayerNorm that ends the embeddings and shares its weights with the layers'
counts in the first layer (Swin's patch embedding: block 1.0 has one kernel more than
3.0). Layer names are the indices found (Swin: stage.block); --detail lists each
layer's kernels.

Table 2, attention traffic at ViT-B/16 size (1 batch, 12 heads, 197 tokens, head dim 64):
the unfused attention program as the importer writes it and the fused `attention` term,
each lowered by apsat.backends.gpu.lower.lower: kernels, elements read and written (the
kernels' ideal-case figures), MB moved at 4 bytes per element and modelled time.

Each model runs in its own spawned process; a failing model's row says why and the exit
status is 1. Usage:
  python benchmarks/kernels.py [NAME_SUBSTRING ...] [--zoo real|light|all] [--detail] [--json FILE]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing as mp
import re
import resource
import sys
import time
import traceback
from pathlib import Path
from queue import Empty

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from real_zoo import ZOO, ort_extended_nodes, stored_inputs, zoo_models  # noqa: E402

FUSION_RULESETS = ("attention-fusion", "norm-fusion")
CONFIG_LAYER_KEYS = ("num_layers", "num_hidden_layers", "n_layer", "n_layers", "encoder_layers")
ENCODERS = ("vit", "bert", "distilbert_dynamic", "whisper_encoder")
DECODERS = ("llama",)
# Layer indices in node and tensor names, tried in order (the first that matches wins):
# Swin's blocks (features.<stage>.<block>.attn|mlp|norm1|norm2; features.0.0 is the patch
# embedding, features.2 a patch merging), T5's block.N before its sub-layers' layer.M,
# torchvision ViT's encoder_layer_N, transformers' layer.N / layers.N, GPT-2's h.N.
LAYER_PATTERNS = (
    re.compile(r"features[./](\d+)[./](\d+)[./](?:attn|mlp|norm\d)"),
    re.compile(r"blocks?[._](\d+)"),
    re.compile(r"encoder_layer_(\d+)"),
    re.compile(r"layers?[._](\d+)"),
    re.compile(r"(?<![A-Za-z0-9])h[._](\d+)"),
)
OUTSIDE = ()          # the place of a weight read only outside every layer


# ---- the models -------------------------------------------------------------------------

def layer_count(entry: dict) -> int | None:
    """The transformer's layer count from its manifest config (Swin: the sum of its
    depths); None for a CNN."""
    if entry.get("family") != "transformer":
        return None
    config = entry.get("config", {})
    if "depths" in config:
        return sum(config["depths"])
    return next((config[k] for k in CONFIG_LAYER_KEYS if k in config), None)


def models(filters=(), zoo: str = "real") -> list[dict]:
    """The entries to measure: the real zoo's manifest entries (zoo "real") and the light
    zoo's models (zoo "light": name without the `light_` prefix, family "cnn", path)."""
    from apsat.pipeline.zoo import light_model_paths

    out = []
    if zoo in ("real", "all"):
        out += [{**m, "zoo": "real", "layers": layer_count(m)} for m in zoo_models(filters)]
    if zoo in ("light", "all"):
        for p in light_model_paths():
            name = p.stem.replace("light_", "")
            if not filters or any(f in name for f in filters):
                out.append({"name": name, "zoo": "light", "family": "cnn", "path": str(p), "layers": None})
    return out


def _source(entry: dict):
    """(model to optimise, optimize() keywords, ONNX file for onnxruntime's node count or
    None for the model itself)."""
    if entry["zoo"] == "real":
        inputs = stored_inputs(entry["name"])
        return (ZOO / entry["file"], {"inputs": inputs, "input_shapes": {k: v.shape for k, v in inputs.items()}},
                ZOO / entry["file"])
    import onnx

    from apsat.pipeline.zoo import randomize_weights

    return randomize_weights(onnx.load(entry["path"]), seed=0), {}, None


def _ort_nodes(proto, path) -> int:
    if path is not None:
        return ort_extended_nodes(path)
    import tempfile

    import onnx

    with tempfile.TemporaryDirectory() as tmp:
        onnx.save(proto, f"{tmp}/model.onnx")
        return ort_extended_nodes(Path(tmp) / "model.onnx")


# ---- the plans --------------------------------------------------------------------------

def switched_off() -> list[str]:
    """The fusion rulesets "before" leaves out: those of FUSION_RULESETS that a rule file
    defines and the default gpu plan runs."""
    from apsat.rules.library import RuleLibrary
    from apsat.rules.saturate import default_plan

    defined = RuleLibrary().rulesets
    planned = {r for phase in default_plan("gpu") for r in phase.rulesets}
    return [r for r in FUSION_RULESETS if r in defined and r in planned]


def before_plan() -> tuple:
    """The default gpu plan without FUSION_RULESETS (a phase left empty is dropped)."""
    from apsat.rules.saturate import default_plan

    plan = []
    for phase in default_plan("gpu"):
        kept = tuple(r for r in phase.rulesets if r not in FUSION_RULESETS)
        if kept:
            plan.append(dataclasses.replace(phase, rulesets=kept))
    return tuple(plan)


def optimize_with_plan(model, plan=None, **kwargs):
    """optimize(model, target="gpu", **kwargs) saturating with `plan` (a tuple of
    apsat.rules.saturate.Phase; None: the default plan): the pipeline as it is, with
    apsat.rules.saturate.default_plan giving it for the call (restored after)."""
    from unittest import mock

    from apsat.pipeline.optimize import optimize
    from apsat.rules import saturate

    if plan is None:
        return optimize(model, target="gpu", **kwargs)
    with mock.patch.object(saturate, "default_plan", lambda target, library=None: tuple(plan)):
        return optimize(model, target="gpu", **kwargs)


# ---- kernels per layer ------------------------------------------------------------------

def layer_key(name: str) -> tuple | None:
    """The layer index a node or tensor name carries (a tuple: Swin's (stage, block)),
    None when it carries none."""
    for pattern in LAYER_PATTERNS:
        m = pattern.search(name)
        if m:
            return tuple(int(g) for g in m.groups())
    return None


def label(key) -> str:
    return "outside" if not key else ".".join(map(str, key))


def weight_places(proto) -> dict[str, tuple]:
    """Tensor name -> place for every initializer and Constant output of the ONNX model
    that the graph reads (and the exporter's Identity aliases of them): a layer key or
    OUTSIDE where it is read in one place only, None where in several; see the module
    docstring."""
    g = proto.graph
    consts = {i.name for i in g.initializer}
    consts |= {o for n in g.node if n.op_type == "Constant" for o in n.output}
    alias = {n.output[0]: n.input[0] for n in g.node if n.op_type == "Identity" and n.input and n.output}

    def root(x):
        seen = set()
        while x in alias and x not in seen:
            seen.add(x)
            x = alias[x]
        return x

    places: dict[str, set] = {}
    for n in g.node:
        if n.op_type == "Identity":
            continue
        for x in n.input:
            r = root(x)
            if r in consts:
                places.setdefault(r, set()).add(layer_key(n.name or x) or OUTSIDE)
    out = {r: next(iter(p)) if len(p) == 1 else None for r, p in places.items()}
    out.update({a: out[root(a)] for a in alias if root(a) in out})
    return out


def attribute_layers(graph, places: dict) -> dict[str, tuple]:
    """Step name -> layer key (OUTSIDE for none) for every step of a KernelGraph, by the
    rules of the module docstring. `places`: weight_places of the model; weights of the
    program that it does not name (made by the importer) are placed by their own name,
    or nowhere."""
    tensor = {b.name: b.tensor for b in graph.buffers.values() if b.kind == "input"}

    def place(buf):
        t = tensor.get(buf)
        if t is None or t not in graph.weights:
            return None
        return places[t] if t in places else layer_key(t)

    steps = graph.steps
    writer = {s.out: i for i, s in enumerate(steps)}
    readers: dict[int, list[int]] = {i: [] for i in range(len(steps))}
    preds: dict[int, list[int]] = {}
    own: dict[int, tuple | None] = {}
    for i, s in enumerate(steps):
        preds[i] = [writer[r] for r in s.reads if r in writer]
        for j in preds[i]:
            readers[j].append(i)
        ps = [p for p in (place(r) for r in s.reads) if p is not None]
        layers = [p for p in ps if p]
        own[i] = max(layers) if layers else (OUTSIDE if ps else None)

    def frontier(i) -> set:
        """Places of the first placed steps downstream of step i."""
        found, seen, todo = set(), set(), list(readers[i])
        while todo:
            j = todo.pop()
            if j in seen:
                continue
            seen.add(j)
            if own[j] is not None:
                found.add(own[j])
            else:
                todo.extend(readers[j])
        return found

    result: list[tuple] = []
    for i in range(len(steps)):
        if own[i]:
            result.append(own[i])
            continue
        layers = {p for p in frontier(i) if p}
        key = next(iter(layers)) if len(layers) == 1 else OUTSIDE
        if key and own[i] == OUTSIDE and not _has_ancestor_in(i, key, preds, own):
            key = OUTSIDE
        result.append(key)
    return {s.name: k for s, k in zip(steps, result)}


def _has_ancestor_in(i, key, preds, own) -> bool:
    seen, todo = set(), list(preds[i])
    while todo:
        j = todo.pop()
        if j in seen:
            continue
        seen.add(j)
        if own[j] == key:
            return True
        todo.extend(preds[j])
    return False


def kernels_per_layer(graph, proto) -> dict:
    """{"outside": kernels outside every layer, "layers": {layer: kernels}, "names":
    {layer or "outside": [kernel names]}} (layers in order; host steps are placed too but
    not counted)."""
    from apsat.backends.gpu.graph import Kernel

    where = attribute_layers(graph, weight_places(proto))
    names: dict[tuple, list[str]] = {}
    for s in graph.steps:
        if isinstance(s, Kernel):
            names.setdefault(where[s.name], []).append(s.name)
    layers = {label(k): len(v) for k, v in sorted(names.items()) if k}
    return {"outside": len(names.get(OUTSIDE, [])), "layers": layers,
            "names": {label(k): v for k, v in sorted(names.items())}}


# ---- one model --------------------------------------------------------------------------

def _why(e: BaseException) -> str:
    frame = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
    where = f" ({Path(frame.filename).name}:{frame.lineno})" if frame else ""
    text = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {text}{where}"


def _figures(res, entry, proto) -> dict:
    graph = res.lowered.artifact
    totals = res.report["gpu_kernels"]["totals"]
    # per inference: the weight preparation (BatchNorm folded into weights, weight
    # layouts) runs once when the model is loaded, as the modelled time already says
    out = {"kernels": totals["inference_kernels"],
           "host_steps": totals["host_steps"], "modelled_us": totals["modelled_us"],
           "prepare_steps": totals["prepare_steps"],
           "attention_kernels": sum(1 for k in graph.kernels if k.kind == "attention"),
           # what the extraction priced (apsat/pipeline/plan.py): the same kernels and time
           "priced_kernels": res.report["extraction"].get("kernels"),
           "priced_us": res.report["extraction"].get("dag_cost")}
    if entry["layers"]:
        out["per_layer"] = kernels_per_layer(graph, proto)
    return out


def measure(entry: dict) -> dict:
    """One model: the "after" and "before" runs' figures and onnxruntime's node count."""
    row = {"model": entry["name"], "zoo": entry["zoo"], "family": entry["family"], "layers": entry["layers"]}
    t = time.perf_counter()
    try:
        model, kwargs, ort_path = _source(entry)
    except Exception as e:
        return {**row, "status": f"load: {_why(e)}"}
    problems = []
    proto = None
    try:
        res = optimize_with_plan(model, None, **kwargs)
        proto = res.model.onnx
        row["after"] = _figures(res, entry, proto)
        v = res.report["verification"]
        if not v["ok"]:
            problems.append(f"after: MISMATCH (max abs err {v['max_abs_err']:.1e})")
        del res
    except Exception as e:
        problems.append(f"after: {_why(e)}")
    try:
        res = optimize_with_plan(model, before_plan(), verify=False,
                                 **{k: v for k, v in kwargs.items() if k != "inputs"})
        row["before"] = _figures(res, entry, res.model.onnx)
        proto = proto or res.model.onnx
        del res
    except Exception as e:
        problems.append(f"before: {_why(e)}")
    try:
        row["ort_nodes"] = _ort_nodes(model, ort_path)
    except Exception as e:
        problems.append(f"ort: {_why(e)}")
    row["status"] = "; ".join(problems) or "ok"
    row["seconds"] = time.perf_counter() - t
    return row


def _child(entry: dict, queue):
    row = measure(entry)
    row["peak_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    queue.put(row)


def run_isolated(entry: dict) -> dict:
    """measure() in a fresh spawned process (as benchmarks/real_zoo.py runs its models)."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(entry, queue))
    proc.start()
    row = None
    while row is None:      # read before join: a row bigger than the pipe holds blocks the child
        try:
            row = queue.get(timeout=1)
        except Empty:
            if not proc.is_alive():
                try:
                    row = queue.get(timeout=1)
                except Empty:
                    break
    proc.join()
    if row is None:
        return {"model": entry["name"], "zoo": entry["zoo"], "family": entry["family"],
                "layers": entry["layers"], "status": f"crashed (exit {proc.exitcode})"}
    return row


# ---- attention traffic at ViT-B/16 size --------------------------------------------------

VIT_B16 = {"batch": 1, "heads": 12, "tokens": 197, "head_dim": 64}


def attention_terms(batch=1, heads=12, tokens=197, head_dim=64) -> tuple[str, str, dict]:
    """(unfused program text, fused program text, tensor shapes): softmax(Q K^T) V over
    q, k (batch, heads, tokens, head_dim) and the values transposed, vt (batch, heads,
    head_dim, tokens), in the importer's forms (tests/rules/test_attention_fusion.py)."""
    b, h, n, d = batch, heads, tokens, head_dim

    def sh(*dims):
        return "(shape " + " ".join(map(str, dims)) + ")"

    qk = (f"(access-pair (access-broadcast (access-reshape (access-tensor q) "
          f"(access-shape {sh(b, h, n, 1, d)} (shape))) (access-shape {sh(b, h, n, n)} {sh(d)})) "
          f"(access-broadcast (access-reshape (access-tensor k) "
          f"(access-shape {sh(b, h, 1, n, d)} (shape))) (access-shape {sh(b, h, n, n)} {sh(d)})))")
    v = (f"(access-broadcast (access-reshape (access-tensor vt) (access-shape {sh(b, h, 1, d, n)} (shape))) "
         f"(access-shape {sh(b, h, n, d)} {sh(n)}))")
    probs = f"(compute softmax (access (compute dot-product {qk}) 3))"
    unfused = (f"(compute dot-product (access-pair (access-broadcast (access-reshape {probs} "
               f"(access-shape {sh(b, h, n, 1, n)} (shape))) (access-shape {sh(b, h, n, d)} {sh(n)})) {v}))")
    fused = f"(attention 0 {qk} (access-literal 0.0) {v})"
    return unfused, fused, {"q": (b, h, n, d), "k": (b, h, n, d), "vt": (b, h, d, n)}


def attention_traffic(**size) -> list[dict]:
    """Rows {"variant", "kernels", "read", "written", "mb", "modelled_us"} for the unfused
    and the fused program at `size` (VIT_B16 by default); a variant that cannot be parsed
    or lowered has {"variant", "error"} instead."""
    import apsat
    from apsat.backends.gpu.lower import lower
    from apsat.backends.gpu.write import kernel_figures

    unfused, fused, shapes = attention_terms(**{**VIT_B16, **size})
    rows = []
    for variant, text in (("unfused", unfused), ("fused", fused)):
        try:
            graph = lower(apsat.parse(text, shapes))
            totals = kernel_figures(graph)["totals"]
        except Exception as e:
            rows.append({"variant": variant, "error": _why(e)})
            continue
        read = sum(k.elements_read for k in graph.kernels)
        written = sum(k.elements_written for k in graph.kernels)
        rows.append({"variant": variant, "kernels": len(graph.kernels), "host_steps": len(graph.host_steps),
                     "read": read, "written": written, "mb": (read + written) * 4 / 1e6,
                     "modelled_us": totals["modelled_us"]})
    return rows


# ---- printing ---------------------------------------------------------------------------

def _per_layer(row: dict) -> tuple[str, str]:
    counts = _layer_counts(row, "after")
    if not counts:
        return "", ""
    return str(max(counts)), f"{sum(counts) / len(counts):.1f}"


def _layers_cell(r: dict) -> str:
    if not r.get("layers"):
        return ""
    found = len(((r.get("after") or r.get("before") or {}).get("per_layer") or {}).get("layers", {}))
    return str(r["layers"]) + ("" if found in (0, r["layers"]) else f"*{found}")


def print_models(rows: list[dict]):
    head = (f"{'model':<19} {'family':<11} {'layers':>6} {'kernels':>7} {'before':>6} {'ort ext':>7} "
            f"{'k/ort':>5} {'k/layer max':>11} {'mean':>5} {'attn':>4} {'host':>4} {'once':>4} "
            f"{'us before':>9} {'us after':>9} {'priced':>6}  status")
    print(head)
    print("-" * len(head))
    for zoo in ("real", "light"):
        part = [r for r in rows if r["zoo"] == zoo]
        if not part:
            continue
        print(f"[{zoo} zoo]")
        for r in part:
            a, b = r.get("after") or {}, r.get("before") or {}
            ratio = f"{a['kernels'] / r['ort_nodes']:.2f}" if a and r.get("ort_nodes") else ""
            top, mean = _per_layer(r)
            us_b = f"{b['modelled_us']:.1f}" if b else ""
            us_a = f"{a['modelled_us']:.1f}" if a else ""
            print(f"{r['model']:<19} {r['family']:<11} {_layers_cell(r):>6} {a.get('kernels', ''):>7} "
                  f"{b.get('kernels', ''):>6} {r.get('ort_nodes', ''):>7} {ratio:>5} {top:>11} {mean:>5} "
                  f"{a.get('attention_kernels', ''):>4} {a.get('host_steps', ''):>4} {a.get('prepare_steps', ''):>4} "
                  f"{us_b:>9} {us_a:>9} {_priced_cell(a):>6}  {r['status']}")
    print("kernels: the gpu kernel graph's kernels per inference; once: the weight preparation's kernels "
          "and host steps, run once when the model is loaded (in neither the kernels nor the modelled time)")
    print("priced: 'same' when the extraction's kernels and modelled time (report extraction.kernels, "
          "dag_cost) are the emitted ones (time within 5 %)")
    if any("*" in _layers_cell(r) for r in rows):
        print("layers N*M: the manifest says N layers, the attribution found M (see --detail)")


def _priced_cell(a: dict) -> str:
    """"same" when the extraction priced the emitted kernels (count equal, modelled time
    within 5 %), else "k:N" or "us:X" for what differs."""
    if not a:
        return ""
    if a.get("priced_kernels") != a["kernels"]:
        return f"k:{a.get('priced_kernels')}"
    priced = a.get("priced_us") or 0.0
    return "same" if abs(priced - a["modelled_us"]) <= 0.05 * a["modelled_us"] else f"us:{priced:.0f}"


def _layer_counts(row: dict, which: str) -> list[int]:
    """Kernels per layer of a row's "after" or "before" run ([] when none)."""
    return list((((row.get(which) or {}).get("per_layer") or {}).get("layers") or {}).values())


def footer(rows: list[dict]) -> list[str]:
    """Per zoo: kernels after and before against onnxruntime's nodes (over the models with
    all three) and the largest per-model kernels/ort ratio; the largest kernels per layer
    of the encoders and of the decoder."""
    lines = []
    for zoo in ("real", "light"):
        part = [r for r in rows if r["zoo"] == zoo]
        both = [r for r in part if r.get("after") and r.get("before") and r.get("ort_nodes")]
        if both:
            after, before = (sum(r[w]["kernels"] for r in both) for w in ("after", "before"))
            ort = sum(r["ort_nodes"] for r in both)
            lines.append(f"{zoo} zoo ({len(both)} of {len(part)} models): {after} kernels after, {before} before, "
                         f"{ort} ort ext nodes: {after / ort:.2f} after, {before / ort:.2f} before")
        ratios = [(r["after"]["kernels"] / r["ort_nodes"], r["model"]) for r in part
                  if r.get("after") and r.get("ort_nodes")]
        if ratios:
            top, model = max(ratios)
            lines.append(f"{zoo} zoo: largest kernels/ort ratio {top:.2f} ({model})")
    for what, names in (("encoder", ENCODERS), ("decoder", DECODERS)):
        parts = []
        for which in ("after", "before"):
            best = [(max(c), r["model"]) for r in rows if r["model"] in names for c in [_layer_counts(r, which)] if c]
            if best:
                n, model = max(best)
                parts.append(f"{n} {which} ({model})")
        if parts:
            lines.append(f"largest kernels per {what} layer ({', '.join(names)}): {'; '.join(parts)}")
    return lines


def print_detail(rows: list[dict]):
    for r in rows:
        for which in ("after", "before"):
            per = (r.get(which) or {}).get("per_layer")
            if not per:
                continue
            print(f"\n{r['model']} ({which}): {per['outside']} kernels outside, per layer "
                  + ", ".join(f"{k}: {n}" for k, n in per["layers"].items()))
            for where, names in per["names"].items():
                print(f"  {where:>8}: {' '.join(names)}")


def print_traffic(rows: list[dict], size=VIT_B16):
    scores = size["batch"] * size["heads"] * size["tokens"] ** 2
    print(f"attention traffic at ViT-B/16 size ({size['batch']} batch, {size['heads']} heads, "
          f"{size['tokens']} tokens, head dim {size['head_dim']}; the scores are {scores} elements)")
    head = (f"{'program':<8} {'kernels':>7} {'elements read':>13} {'elements written':>16} {'MB moved':>8} "
            f"{'modelled us':>11}")
    print(head)
    print("-" * len(head))
    for r in rows:
        if "error" in r:
            print(f"{r['variant']:<8} unavailable: {r['error']}")
        else:
            print(f"{r['variant']:<8} {r['kernels']:>7} {r['read']:>13.0f} {r['written']:>16.0f} "
                  f"{r['mb']:>8.2f} {r['modelled_us']:>11.2f}")
    ok = {r["variant"]: r for r in rows if "error" not in r}
    if len(ok) == 2:
        u, f = ok["unfused"], ok["fused"]
        print(f"unfused / fused: {u['mb'] / f['mb']:.2f}x the traffic, {u['kernels'] / f['kernels']:.1f}x the kernels, "
              f"{u['modelled_us'] / f['modelled_us']:.2f}x the modelled time")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("filters", nargs="*", help="model name substrings (default: all)")
    parser.add_argument("--zoo", choices=("real", "light", "all"), default="real")
    parser.add_argument("--detail", action="store_true", help="print each layer's kernel names")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args(argv)
    off = switched_off()
    rows = []
    for entry in models(args.filters, args.zoo):
        rows.append(run_isolated(entry))
        print(f"  {entry['name']}: {rows[-1]['status']} ({rows[-1].get('seconds', 0):.1f} s)",
              file=sys.stderr, flush=True)
    without = ", ".join(off) or "nothing: the plan runs no fusion ruleset of FUSION_RULESETS"
    print(f"gpu kernels after the default plan and before it (without {without})")
    print_models(rows)
    for line in footer(rows):
        print(line)
    if args.detail:
        print_detail(rows)
    print()
    traffic = attention_traffic()
    print_traffic(traffic)
    if args.json:
        Path(args.json).write_text(json.dumps({"switched_off": off, "models": rows, "attention_traffic": traffic},
                                              indent=1, default=str) + "\n")
    return 1 if any(r["status"] != "ok" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
