"""The catalogue of the public corpus (benchmarks/corpus.py): which architectures it holds,
how each is built, and which families are left out and why.

An architecture (`Arch`) is one family of one library: a timm module (or a distinct
architecture inside one, corpus_timm.TABLE), a torchvision family (corpus_tv.PREFIXES), or a
transformers model module (corpus_hf.families). Its name is "LIB-FAMILY" (`timm-resnet`,
`tv-swin_v2`, `hf-bert`); its candidates are what to try in order (transformers: the module's
model types, then their encoders alone) until one builds and exports. `build` returns an
export_zoo.Spec: a module with positional tensor inputs and one tensor out, seeded numpy
inputs of batch 1, its source and config; the weights are seeded random ones, never
downloaded, and BatchNorm statistics come from one training-mode pass (as export_zoo does).
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import export_zoo as ez  # noqa: E402

SEED = 0
LIBS = ("timm", "torchvision", "transformers")
PREFIX = {"timm": "timm", "torchvision": "tv", "transformers": "hf"}
INSTALL = "pip install -e '.[corpus]'  (timm, transformers, torchvision; torch 2.13.0 CPU)"


@dataclass
class Arch:
    """One architecture of the corpus: name ("LIB-FAMILY"), library, family (the library's
    grouping) and the candidates to try in order."""
    name: str
    library: str
    family: str
    candidates: list = field(default_factory=list)


def import_libraries():
    """(torch, torchvision, transformers, timm), with no hub access (any download attempt
    fails, so a model that needs one is skipped saying so); exit with the install line
    when one is missing."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        torch, tv, tf = ez._import_libraries()
        import timm
    except ImportError as exc:
        sys.exit(f"corpus: cannot import {exc.name or exc}; install the corpus extra: {INSTALL}")
    except SystemExit:
        sys.exit(f"corpus: a library is missing; install the corpus extra: {INSTALL}")
    return torch, tv, tf, timm


def catalogue(libs) -> tuple[list[Arch], dict[str, str]]:
    """(every architecture of the installed libraries that the corpus can try, families
    left out -> why). `libs` is import_libraries()'s tuple."""
    import corpus_hf
    import corpus_timm
    import corpus_tv

    torch, tv, tf, timm = libs
    archs: list[Arch] = []
    timm_fams, skipped = corpus_timm.families(timm)
    archs += [Arch(f"timm-{f.replace('/', '-')}", "timm", f, [f]) for f in timm_fams]
    tv_fams, tv_skipped = corpus_tv.families(tv)
    skipped.update(tv_skipped)
    for fam in tv_fams:
        if fam in corpus_tv.BUILDERS:
            archs.append(Arch(f"tv-{fam}", "torchvision", fam, [fam]))
        else:
            skipped[f"tv-{fam}"] = "no builder in the corpus table"
    for module, types in corpus_hf.families(tf).items():
        archs.append(Arch(f"hf-{module}", "transformers", module,
                          [*types, *(f"{t}:encoder" for t in types)]))
    return archs, dict(sorted(skipped.items()))


def build(arch: Arch, candidate: str, libs, extra: dict | None = None):
    """The export_zoo.Spec of one candidate of an architecture; `extra` overrides the
    library builder's keywords or config fields (the CI sample's smaller sizes)."""
    import corpus_hf
    import corpus_timm
    import corpus_tv

    torch, tv, tf, timm = libs
    torch.manual_seed(SEED)
    if arch.library == "timm":
        model, size, kw = corpus_timm.build(candidate, torch, timm, extra)
        name = corpus_timm.TABLE[candidate][0]
        source = f"timm.create_model({name!r}, pretrained=False, num_classes=10, ...)"
        inputs = {"pixel_values": ez.normal(1, 3, size, size)}
        spec = ez.Spec(model, inputs, ["logits"], "vision", source, {"model": name, "image_size": size, **kw})
    elif arch.library == "torchvision":
        return corpus_tv.BUILDERS[candidate](torch, tv, tf)
    else:
        model_type, _, part = candidate.partition(":")
        module, inputs, cfg = corpus_hf.build(model_type, torch, tf, part or "model", extra)
        source = f"transformers.AutoModel.from_config(AutoConfig.for_model({model_type!r}, ...))"
        source += ".get_encoder()" if part else ""
        spec = ez.Spec(module, inputs, ["output"], arch.library, source, cfg)
    calibrate(torch, spec)
    return spec


def calibrate(torch, spec) -> None:
    """Give every BatchNorm the statistics of one training-mode pass over a second seeded
    batch of four (float inputs redrawn, integer ones repeated), as a trained model has;
    an all-zero Linear gets PyTorch's default init. A model whose training-mode pass fails
    keeps BatchNorm's initial statistics (mean 0, variance 1). Leaves it in eval mode."""
    import numpy as np

    module = spec.module
    for m in module.modules():
        if isinstance(m, torch.nn.Linear) and not m.weight.any():
            m.reset_parameters()
    norms = [m for m in module.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if norms:
        rng = np.random.default_rng(SEED + 1)
        batch = [torch.from_numpy(rng.standard_normal((4, *v.shape[1:])).astype(v.dtype)
                                  if v.dtype.kind == "f" else np.repeat(v, 4, axis=0))
                 for v in spec.inputs.values()]
        for m in norms:
            m.reset_running_stats()
            m.momentum = None
        module.train()
        try:
            with torch.no_grad():
                module(*batch)
        except Exception:       # noqa: BLE001 - training mode differs (a detector wants targets)
            for m in norms:
                m.reset_running_stats()
    module.eval()


def weight_bytes(module) -> int:
    """Bytes of the module's parameters and buffers."""
    tensors = list(module.parameters()) + list(module.buffers())
    return sum(t.numel() * t.element_size() for t in tensors)
