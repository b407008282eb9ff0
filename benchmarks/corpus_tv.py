"""The torchvision side of the public corpus (benchmarks/corpus.py): one family per
architecture of `torchvision.models.list_models()`, built with `weights=None` (and
`weights_backbone=None`), seeded, at the smallest size the family's constructor offers.

Families whose constructor takes the widths (ResNet's planes, ConvNeXt's stages, ViT's
layers) are narrowed to a few channels; those whose widths are fixed (AlexNet, Inception-v3,
the detection and video models) are built as the library's smallest variant and skipped by
the weight limit when they exceed it, with that reason. The `quantized_*` entries are the
float families again (the same graph until quantised) and are listed as such.
"""
from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import export_zoo as ez  # noqa: E402  (the real-zoo builders: narrow ResNet, MobileNet-v3, ...)

IMG = 64
# family -> prefixes of list_models() names; first match wins, so longer prefixes first
PREFIXES = [("efficientnet_v2", "efficientnet_v2"), ("efficientnet", "efficientnet"),
            ("swin_v2", "swin_v2"), ("swin3d", "swin3d"), ("swin", "swin"),
            ("mobilenet_v2", "mobilenet_v2"), ("mobilenet_v3", "mobilenet_v3"),
            ("wide_resnet", "wide_resnet"), ("resnext", "resnext"), ("resnet", "resnet"),
            ("regnet", "regnet"), ("vit_", "vit"), ("maxvit", "maxvit"), ("mvit_v1", "mvit_v1"),
            ("mvit_v2", "mvit_v2"), ("r3d", "video_resnet"), ("mc3", "video_resnet"),
            ("r2plus1d", "video_resnet"), ("s3d", "s3d"), ("raft", "raft"),
            ("shufflenet_v2", "shufflenet_v2"), ("squeezenet", "squeezenet"), ("mnasnet", "mnasnet"),
            ("densenet", "densenet"), ("vgg", "vgg"), ("convnext", "convnext"), ("googlenet", "googlenet"),
            ("inception_v3", "inception_v3"), ("alexnet", "alexnet"), ("deeplabv3", "deeplabv3"),
            ("fcn_", "fcn"), ("lraspp", "lraspp"), ("fasterrcnn", "fasterrcnn"), ("fcos", "fcos"),
            ("retinanet", "retinanet"), ("keypointrcnn", "keypointrcnn"), ("maskrcnn", "maskrcnn"),
            ("ssdlite", "ssdlite"), ("ssd", "ssd")]


def family_of(name: str) -> str | None:
    """The family of a torchvision model name, None when no prefix matches."""
    return next((fam for prefix, fam in PREFIXES if name.startswith(prefix)), None)


def families(tv) -> tuple[dict, dict]:
    """(family -> the list_models() names in it, skipped name -> reason) for the installed
    torchvision."""
    fams: dict[str, list[str]] = {}
    skipped = {}
    for name in tv.models.list_models():
        if name.startswith("quantized_"):
            skipped[f"tv-{name}"] = (f"quantization-ready copy of the float family "
                                     f"{family_of(name[len('quantized_'):])} (the same graph until quantised)")
            continue
        fam = family_of(name)
        if fam is None:
            skipped[f"tv-{name}"] = "no entry in the corpus table (a family newer than this script)"
        else:
            fams.setdefault(fam, []).append(name)
    return fams, skipped


def _narrow_resnet(block: str, groups: int, width: int, torch, tv, tf):
    """torchvision's ResNet at an eighth of the planes, one block a stage: the basic block
    (resnet), grouped bottlenecks (resnext) or double-width bottlenecks (wide_resnet)."""
    from torchvision.models import resnet

    class Narrow(resnet.ResNet):
        """ResNet with every stage's planes divided by 8."""
        def _make_layer(self, blk, planes, blocks, stride=1, dilate=False):
            """The library's stage builder at an eighth of the width."""
            return super()._make_layer(blk, planes // 8, blocks, stride, dilate)

    blk = getattr(resnet, block)
    m = Narrow(blk, [1, 1, 1, 1], num_classes=10, groups=groups, width_per_group=width)
    m.fc = torch.nn.Linear(64 * blk.expansion, 10)
    cfg = {"block": block, "layers": [1, 1, 1, 1], "groups": groups, "width_per_group": width}
    return ez.vision_spec(torch, m, IMG, "cnn", cfg, f"torchvision.models.resnet.ResNet({block}, planes // 8)")


def _densenet(torch, tv, tf):
    cfg = {"growth_rate": 8, "block_config": (2, 2, 2, 2), "num_init_features": 16, "bn_size": 2,
           "num_classes": 10}
    return ez.vision_spec(torch, tv.models.DenseNet(**cfg), IMG, "cnn", cfg)


def _efficientnet_v2(torch, tv, tf):
    from torchvision.models.efficientnet import EfficientNet, FusedMBConvConfig, MBConvConfig
    rows = [FusedMBConvConfig(1, 3, 1, 16, 16, 1), FusedMBConvConfig(4, 3, 2, 16, 32, 1),
            MBConvConfig(4, 3, 2, 32, 64, 1)]
    m = EfficientNet(rows, dropout=0.2, num_classes=10, last_channel=128)
    cfg = {"fused_mbconv": [[1, 3, 1, 16, 16, 1], [4, 3, 2, 16, 32, 1]], "mbconv": [[4, 3, 2, 32, 64, 1]]}
    return ez.vision_spec(torch, m, IMG, "cnn", cfg)


def _maxvit(torch, tv, tf):
    cfg = {"input_size": (IMG, IMG), "stem_channels": 16, "partition_size": 4, "block_channels": [16, 32],
           "block_layers": [1, 1], "head_dim": 8, "stochastic_depth_prob": 0.0, "num_classes": 10}
    return ez.vision_spec(torch, tv.models.MaxVit(**cfg), IMG, "transformer", cfg)


def _vgg(torch, tv, tf):
    """VGG-11's layout (with BatchNorm) at an eighth of the channels; the classifier
    narrowed to match (its 4096-wide layers alone are 120M parameters)."""
    from torchvision.models.vgg import VGG, make_layers
    layout = [8, "M", 16, "M", 32, 32, "M", 64, 64, "M", 64, 64, "M"]
    m = VGG(make_layers(layout, batch_norm=True), num_classes=10)
    m.avgpool = torch.nn.AdaptiveAvgPool2d(1)     # 2x2 -> 7x7 has no ONNX form at 64x64 input
    m.classifier = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(True), torch.nn.Dropout(),
                                       torch.nn.Linear(64, 64), torch.nn.ReLU(True), torch.nn.Dropout(),
                                       torch.nn.Linear(64, 10))
    return ez.vision_spec(torch, m, IMG, "cnn", {"layers": layout, "batch_norm": True, "avgpool": 1,
                                                 "classifier": [64, 64]})


def _swin_v2(torch, tv, tf):
    from torchvision.models.swin_transformer import PatchMergingV2, SwinTransformer, SwinTransformerBlockV2
    cfg = dict(ez.TORCHVISION["swin"][3])
    m = SwinTransformer(**cfg, block=SwinTransformerBlockV2, downsample_layer=PatchMergingV2)
    return ez.vision_spec(torch, m, 32, "transformer", {**cfg, "block": "SwinTransformerBlockV2"})


DETECTION = ("fasterrcnn", "fcos", "retinanet", "keypointrcnn", "maskrcnn", "ssd")


def _library(name: str, size: int, kwargs: dict, torch, tv, tf):
    """torchvision.models.get_model(name, weights=None, **kwargs) on one size x size image.
    Segmentation and detection models give their first output tensor; a detector is not
    calibrated (training mode wants targets; its untrained BatchNorms hold 0 / 1 stats)."""
    m = tv.models.get_model(name, weights=None, **kwargs)
    cfg, source = {"model": name, **kwargs}, f"torchvision.models.{name}"
    if name.startswith(DETECTION):
        inputs = {"pixel_values": ez.normal(1, 3, size, size)}
        return ez.Spec(first_tensor_of(torch, m).eval(), inputs, ["logits"], "cnn", source, cfg)
    if name.startswith(("deeplabv3", "fcn_", "lraspp")):
        m = first_tensor_of(torch, m)
    return ez.vision_spec(torch, m, size, "cnn", cfg, source)


def first_tensor_of(torch, model):
    """A module returning the first tensor of model's output (a dict, or a list of dicts)."""
    from corpus_hf import first_tensor

    class First(torch.nn.Module):
        """The wrapped model's first output tensor."""
        def __init__(self):
            """Hold the wrapped model."""
            super().__init__()
            self.model = model

        def forward(self, x):
            """Run the model; keep its first tensor."""
            return first_tensor(torch, self.model(x))
    return First()


def _raft(torch, tv, tf):
    """RAFT-small on two 128x128 frames (its correlation pyramid needs 16x16 features), two flow updates (the default twelve repeat the same
    update block); the last flow estimate."""
    m = tv.models.optical_flow.raft_small(weights=None)

    class TwoUpdates(torch.nn.Module):
        """RAFT with two refinement iterations, returning the final flow."""
        def __init__(self):
            """Hold RAFT."""
            super().__init__()
            self.model = m

        def forward(self, image1, image2):
            """The flow from image1 to image2 after two updates."""
            return self.model(image1, image2, num_flow_updates=2)[-1]

    frames = {"image1": ez.normal(1, 3, 128, 128), "image2": ez.normal(1, 3, 128, 128, seed=1)}
    return ez.Spec(TwoUpdates().eval(), frames, ["flow"], "cnn", "torchvision.models.optical_flow.raft_small",
                   {"num_flow_updates": 2})


def _video(name: str, kwargs: dict, torch, tv, tf):
    """A video classifier on one clip of 4 frames of 64x64 (batch, channels, time, h, w)."""
    m = tv.models.get_model(name, weights=None, **kwargs).eval()
    inputs = {"video": ez.normal(1, 3, 4, IMG, IMG)}
    return ez.Spec(m, inputs, ["logits"], "cnn", f"torchvision.models.{name}", {"model": name, **kwargs})


NC = {"num_classes": 10}
BUILDERS = {  # family -> f(torch, tv, tf) -> export_zoo.Spec
    "resnet": ez.build_resnet, "resnext": partial(_narrow_resnet, "Bottleneck", 4, 16),
    "wide_resnet": partial(_narrow_resnet, "Bottleneck", 1, 128),
    "mobilenet_v2": partial(ez.build_torchvision, *ez.TORCHVISION["mobilenet_v2"]),
    "mobilenet_v3": ez.build_mobilenet_v3, "efficientnet": ez.build_efficientnet,
    "efficientnet_v2": _efficientnet_v2, "regnet": ez.build_regnet, "convnext": ez.build_convnext,
    "vit": partial(ez.build_torchvision, *ez.TORCHVISION["vit"]),
    "swin": partial(ez.build_torchvision, *ez.TORCHVISION["swin"]), "swin_v2": _swin_v2,
    "maxvit": _maxvit, "densenet": _densenet, "vgg": _vgg, "raft": _raft,
    "mnasnet": partial(_library, "mnasnet0_5", IMG, NC),
    "shufflenet_v2": partial(_library, "shufflenet_v2_x0_5", IMG, NC),
    "squeezenet": partial(_library, "squeezenet1_1", IMG, NC),
    "googlenet": partial(_library, "googlenet", IMG, {**NC, "aux_logits": False, "init_weights": True}),
    "inception_v3": partial(_library, "inception_v3", 75, {**NC, "aux_logits": False, "init_weights": True}),
    "alexnet": partial(_library, "alexnet", IMG, NC),
    "lraspp": partial(_library, "lraspp_mobilenet_v3_large", IMG, {**NC, "weights_backbone": None}),
    "deeplabv3": partial(_library, "deeplabv3_mobilenet_v3_large", IMG, {**NC, "weights_backbone": None}),
    "fcn": partial(_library, "fcn_resnet50", IMG, {**NC, "weights_backbone": None, "aux_loss": False}),
    "ssdlite": partial(_library, "ssdlite320_mobilenet_v3_large", IMG, {**NC, "weights_backbone": None}),
    "ssd": partial(_library, "ssd300_vgg16", IMG, {**NC, "weights_backbone": None}),
    "fasterrcnn": partial(_library, "fasterrcnn_mobilenet_v3_large_320_fpn", IMG, {**NC, "weights_backbone": None}),
    "fcos": partial(_library, "fcos_resnet50_fpn", IMG, {**NC, "weights_backbone": None}),
    "retinanet": partial(_library, "retinanet_resnet50_fpn", IMG, {**NC, "weights_backbone": None}),
    "keypointrcnn": partial(_library, "keypointrcnn_resnet50_fpn", IMG, {"weights_backbone": None}),
    "maskrcnn": partial(_library, "maskrcnn_resnet50_fpn", IMG, {**NC, "weights_backbone": None}),
    "video_resnet": partial(_video, "r3d_18", NC), "s3d": partial(_video, "s3d", NC),
    "mvit_v1": partial(_video, "mvit_v1_b", NC), "mvit_v2": partial(_video, "mvit_v2_s", NC),
    "swin3d": partial(_video, "swin3d_t", NC),
}
