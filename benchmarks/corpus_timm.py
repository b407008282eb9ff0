"""The timm side of the public corpus (benchmarks/corpus.py): one family per model module
of `timm.list_models()` (timm's own grouping: `resnet`, `vision_transformer`, `swin_transformer`
...), plus the distinct architectures that share a module (MixNet, MNASNet, TinyNet, LCNet,
MobileNet-v4 beside EfficientNet and MobileNet-v3; ConvFormer and CAFormer beside
PoolFormer; MLP-Mixer and ResMLP beside gMLP; CoAtNet and MaxViT; ...).

Each family is built with `pretrained=False` and 10 classes from its smallest variant; where
that is still over the weight limit, the variant's own constructor arguments are overridden
to fewer blocks and narrower stages (`OVERRIDE` below: the entry point's other settings kept,
see `_create`). The image is 64x64 unless the family needs more (its minimum is noted).
"""
from __future__ import annotations

import importlib
import inspect
import sys

IMG = 64
VIT = {"depth": 2, "embed_dim": 64, "num_heads": 2}             # a ViT-style stack, shrunk
SWIN = {"depths": (1, 1, 1, 1), "embed_dim": 32, "num_heads": (1, 2, 4, 8)}
STAGES = {"depths": (1, 1, 1, 1), "embed_dims": (32, 64, 128, 256), "num_heads": (1, 2, 4, 8)}
ONE_BLOCK = {"layers": (1, 1, 1, 1)}
META = {"depths": (1, 1, 1, 1), "dims": (16, 32, 64, 128)}
MIXER = {"num_blocks": 2, "embed_dim": 64, "img_size": IMG}
# family -> (model name, image size, keyword overrides); a family that shares its module
# with others is named "module/arch". Overrides reach the variant's builder (_create).
TABLE = {
    "beit": ("beit_base_patch16_224", IMG, {"img_size": IMG, **VIT}),
    "byoanet": ("halonet_h1", 256, {"img_size": 256}),                # halo attention needs 256
    "byobnet": ("test_byobnet", IMG, {"img_size": IMG}),
    "byobnet/mobileone": ("mobileone_s0", IMG, {}), "byobnet/gernet": ("gernet_s", IMG, {}),
    "byobnet/repvgg": ("repvgg_a0", IMG, {}),
    "cait": ("cait_xxs24_224", IMG, {"img_size": IMG, **VIT}),
    "coat": ("coat_tiny", IMG, {"img_size": IMG}), "convit": ("convit_tiny", IMG, {"img_size": IMG}),
    "convmixer": ("convmixer_768_32", IMG, {"dim": 64, "depth": 2}),
    "convnext": ("test_convnext", IMG, {}), "convnext/convnextv2": ("convnextv2_atto", IMG, {}),
    "cpubone": ("cpubone_nano", IMG, {}), "crossvit": ("crossvit_tiny_240", IMG, {}),
    "csatv2": ("csatv2", IMG, {"dims": (32, 64, 128, 256), "depths": (1, 1, 1, 1),
                               "transformer_depths": (0, 0, 1, 1)}),
    "cspnet": ("cs3darknet_focus_s", IMG, {}), "cspnext": ("cspnext_tiny", IMG, {}),
    "davit": ("davit_tiny", IMG, STAGES),
    "deepseek_vit": ("deepseek_vit_412m", 224, {"img_size": 224, **VIT}),
    "deit": ("deit_tiny_patch16_224", IMG, {"img_size": IMG}), "densenet": ("densenet121", IMG, {}),
    "dla": ("dla46x_c", IMG, {}),
    "dpn": ("dpn48b", IMG, {"k_sec": (1, 1, 1, 1), "num_init_features": 16, "k_r": 32, "inc_sec": (8, 16, 16, 32)}),
    "edgenext": ("edgenext_xx_small", IMG, {}),
    "efficientformer": ("efficientformer_l1", 224, {"img_size": 224, "depths": (1, 1, 1, 1),
                                                    "embed_dims": (32, 64, 128, 256)}),
    "efficientformer_v2": ("efficientformerv2_s0", IMG, {"img_size": IMG}),
    "efficientnet": ("test_efficientnet", IMG, {}), "efficientnet/mixnet": ("mixnet_s", IMG, {}),
    "efficientnet/mnasnet": ("mnasnet_small", IMG, {}), "efficientnet/tinynet": ("tinynet_e", IMG, {}),
    "efficientnet/mobilenetv2": ("mobilenetv2_035", IMG, {}), "efficientnet/fbnetc": ("fbnetc_100", IMG, {}),
    "efficientnet/spnasnet": ("spnasnet_100", IMG, {}), "efficientnet/mobilenetv1": ("mobilenetv1_100", IMG, {}),
    "efficientnet/efficientnet_lite": ("efficientnet_lite0", IMG, {}),
    "efficientnet/mobilenet_edgetpu": ("mobilenet_edgetpu_v2_xs", IMG, {}),
    "efficientvim": ("efficientvim_m1", IMG, {}), "efficientvit_mit": ("efficientvit_b0", IMG, {}),
    "efficientvit_msra": ("efficientvit_m0", IMG, {"img_size": IMG}),
    "eva": ("vit_tiny_patch16_dinov3_qkvb", IMG, {"img_size": IMG}),
    "eva/eva02": ("eva02_tiny_patch14_224", IMG, {"img_size": IMG}),
    "fasternet": ("fasternet_t0", IMG, {}), "fastvit": ("fastvit_t8", IMG, {}),
    "focalnet": ("focalnet_tiny_srf", IMG, {"embed_dim": 32, "depths": (1, 1, 1, 1)}),
    "gcvit": ("gcvit_xxtiny", IMG, {"embed_dim": 32, "depths": (1, 1, 1, 1), "num_heads": (1, 2, 4, 8),
                                    "img_size": IMG}),
    "gemma4_vit": ("gemma4_vit_167m_enc", 96, {"img_size": 96, **VIT}),
    "ghostnet": ("ghostnet_050", IMG, {}), "ghostnet/ghostnetv2": ("ghostnetv2_100", IMG, {}),
    "hardcorenas": ("hardcorenas_b", IMG, {}), "hgnet": ("hgnetv2_b0", IMG, {}),
    "hiera": ("hiera_tiny_224", IMG, {"embed_dim": 32, "num_heads": 1, "stages": (1, 1, 1, 1), "img_size": IMG}),
    "hieradet_sam2": ("sam2_hiera_tiny", IMG, {"embed_dim": 32, "num_heads": 1, "stages": (1, 2, 1, 1),
                                               "global_att_blocks": (2,), "window_spec": (4, 4, 2, 1)}),
    "hrnet": ("hrnet_w18_small", IMG, {}), "iformer": ("iformer_t", IMG, {}),
    "inception_next": ("inception_next_atto", IMG, {}),
    "inception_resnet_v2": ("inception_resnet_v2", 96, {}),          # fixed widths; 75 px at least
    "inception_v3": ("inception_v3", 96, {}), "inception_v4": ("inception_v4", 96, {}),
    "lcnetv2": ("lcnetv2_small", IMG, {}), "levit": ("levit_128s", IMG, {"img_size": IMG}),
    "lowformer": ("lowformer_b0", IMG, {"width_list": (8, 16, 32, 64, 128), "depth_list": (0, 1, 1, 1, 1)}),
    "mambaout": ("test_mambaout", IMG, {}),
    "maxxvit": ("test_coatnet", IMG, {"img_size": IMG}), "maxxvit/maxvit": ("test_maxvit", IMG, {"img_size": IMG}),
    "metaformer": ("poolformerv2_s12", IMG, META), "metaformer/convformer": ("convformer_s18", IMG, META),
    "metaformer/caformer": ("caformer_s18", IMG, META),
    "mlp_mixer": ("gmlp_ti16_224", IMG, {"img_size": IMG}), "mlp_mixer/mixer": ("mixer_s32_224", IMG, MIXER),
    "mlp_mixer/resmlp": ("resmlp_12_224", IMG, MIXER),
    "mobilenetv3": ("mobilenetv3_small_050", IMG, {}), "mobilenetv3/lcnet": ("lcnet_035", IMG, {}),
    "mobilenetv3/mobilenetv4": ("mobilenetv4_conv_small_035", IMG, {}), "mobilenetv3/fbnetv3": ("fbnetv3_b", IMG, {}),
    "mobilenetv5": ("mobilenetv5_base", IMG, {}),
    "mobilevit": ("mobilevit_xxs", IMG, {"img_size": IMG}), "mobilevit/mobilevitv2": ("mobilevitv2_050", IMG, {}),
    "mvitv2": ("mvitv2_tiny", IMG, {"img_size": IMG}),                # shrunk by _mvit_cfg
    "naflexvit": ("naflexvit_base_patch16_parfac_gap", IMG, {"img_size": IMG, **VIT}),
    "nasnet": ("nasnetalarge", IMG, {}),
    "nest": ("nest_tiny", IMG, {"embed_dims": (32, 64, 128), "num_heads": (1, 2, 4), "depths": (1, 1, 1), "img_size": IMG}),
    "nextvit": ("nextvit_small", IMG, {}), "nfnet": ("test_nfnet", IMG, {}),
    "nfnet/nf_regnet": ("nf_regnet_b0", IMG, {}), "pit": ("pit_ti_224", IMG, {"img_size": IMG}),
    "pnasnet": ("pnasnet5large", IMG, {}), "pvt_v2": ("pvt_v2_b0", IMG, {}),
    "qwen3_vit": ("qwen3_vit_88m", IMG, {"img_size": IMG, **VIT}),
    "rdnet": ("rdnet_tiny", IMG, {"num_blocks_list": (1, 1, 1, 1), "growth_rates": (32, 64, 128, 256),
                                  "num_init_features": 32, "is_downsample_block": (None, True, True, True),
                                  "block_type": ("Block",) * 4}),
    "regnet": ("regnetx_002", IMG, {}), "regnet/regnetz": ("regnetz_005", IMG, {}),
    "repghost": ("repghostnet_050", IMG, {}), "repvit": ("repvit_m1", IMG, {"img_size": IMG}),
    "res2net": ("res2next50", IMG, ONE_BLOCK), "resnest": ("resnest14d", IMG, {**ONE_BLOCK, "base_width": 16}),
    "resnet": ("test_resnet", IMG, {}), "resnetv2": ("resnetv2_18", IMG, ONE_BLOCK),
    "rexnet": ("rexnet_100", IMG, {}), "selecsls": ("selecsls42", IMG, {}),
    "senet": ("legacy_seresnet18", IMG, ONE_BLOCK),
    "sequencer": ("sequencer2d_s", IMG, {"img_size": IMG, **ONE_BLOCK}), "shvit": ("shvit_s1", IMG, {}),
    "sknet": ("skresnet18", IMG, ONE_BLOCK), "starnet": ("starnet_s050", IMG, {}),
    "swiftformer": ("swiftformer_xs", IMG, {"img_size": IMG}),
    "swin_transformer": ("swin_tiny_patch4_window7_224", IMG, {"img_size": IMG, **SWIN}),
    "swin_transformer_v2": ("swinv2_tiny_window16_256", IMG, {"img_size": IMG, **SWIN}),
    "swin_transformer_v2_cr": ("swinv2_cr_tiny_224", IMG, {"img_size": IMG, **SWIN}),
    "tiny_vit": ("tiny_vit_5m_224", IMG, {}), "tnt": ("tnt_s_legacy_patch16_224", IMG, {"img_size": IMG, "depth": 2}),
    "tresnet": ("tresnet_m", IMG, {**ONE_BLOCK, "width_factor": 0.5}),
    "twins": ("twins_svt_small", IMG, {"img_size": IMG, **STAGES}),
    "vgg": ("vgg11", 224, {"cfg": [16, "M", 32, "M", 64, "M", 128, "M", 128, "M"], "mlp_ratio": 0.125}),  # 7x7 head
    "visformer": ("visformer_tiny", IMG, {"img_size": IMG, **VIT}),
    "vision_transformer": ("test_vit", IMG, {"img_size": IMG}),
    "vision_transformer_hybrid": ("vit_tiny_r_s16_p8_224", IMG, {"img_size": IMG}),
    "vision_transformer_relpos": ("test_vit_relpos", IMG, {"img_size": IMG}),
    "vision_transformer_sam": ("samvit_base_patch16_224", IMG, {"img_size": IMG, **VIT}),
    "vitamin": ("vitamin_small_224", IMG, {"img_size": IMG, "depth": 2}),
    "volo": ("volo_d1_224", IMG, {"layers": (1, 1, 1, 1), "embed_dims": (64, 128, 128, 128),
                                  "num_heads": (2, 4, 4, 4), "img_size": IMG}),
    "vovnet": ("ese_vovnet19b_slim_dw", IMG, {}), "xception": ("legacy_xception", IMG, {}),
    "xception_aligned": ("xception41p", IMG, {}), "xcit": ("xcit_nano_12_p8_224", IMG, {"img_size": IMG}),
}


def families(timm) -> tuple[dict, dict]:
    """(family -> (model, size, overrides) for the installed timm's modules that the table
    covers, skipped "timm-MODULE" -> reason for the modules it does not)."""
    from timm.models import _registry

    modules = {_registry._model_to_module[m] for m in timm.list_models()}
    fams = {f: row for f, row in TABLE.items() if f.split("/")[0] in modules}
    skipped = {f"timm-{m}": "no entry in the corpus table (a timm module newer than this script)"
               for m in sorted(modules) if m not in TABLE}
    return fams, skipped


def build(family: str, torch, timm, extra: dict | None = None):
    """(model in eval mode, image size, the keywords used) of one family, seeded, with
    pretrained=False and 10 classes; `extra` overrides the table's keywords (and
    "img_size" the image size)."""
    name, size, overrides = TABLE[family]
    overrides = {**overrides, **(extra or {})}
    size = overrides.get("img_size", size)
    torch.manual_seed(0)
    if family == "mvitv2":
        from timm.models.mvitv2 import MultiScaleVit, MultiScaleVitCfg
        cfg = MultiScaleVitCfg(depths=(1, 1, 1, 1), embed_dim=32, num_heads=1)
        model = MultiScaleVit(cfg, img_size=(size, size), num_classes=10)
        return model.eval(), size, {"depths": (1, 1, 1, 1), "embed_dim": 32, "num_heads": 1}
    if family == "vgg":         # timm's VGG takes its layer list only from the class
        from timm.models.vgg import VGG
        return VGG(num_classes=10, **overrides).eval(), size, overrides
    return _create(timm, name, overrides).eval(), size, overrides


def _create(timm, name: str, overrides: dict):
    """timm.create_model(name, pretrained=False, num_classes=10) with `overrides` applied to
    the keywords the variant's entry point hands its module's builder (`_create_*`): an
    entry point that fixes a keyword itself (depths, dims ...) would refuse it as a
    second value, and calling the builder directly would lose the variant's other settings
    (ConvFormer's token mixer)."""
    from timm.models import _registry

    module = sys.modules.get(_registry._model_entrypoints[name].__module__) or importlib.import_module(
        _registry._model_entrypoints[name].__module__)
    builders = {k: v for k, v in vars(module).items() if k.startswith("_create") and callable(v)
                and next(iter(inspect.signature(v).parameters), "") == "variant"}
    if not overrides or not builders:
        return timm.create_model(name, pretrained=False, num_classes=10, **overrides)

    def patched(orig):
        def builder(*args, **kwargs):
            return orig(*args, **{**kwargs, **overrides})
        return builder
    try:
        for k, v in builders.items():
            setattr(module, k, patched(v))
        return timm.create_model(name, pretrained=False, num_classes=10)
    finally:
        for k, v in builders.items():
            setattr(module, k, v)
