"""unitok's ViT, DeiT and MLP-Mixer *are* timm's: random timm models, converted, give the same
logits and features (float32, atol 1e-5) — at the trained size, at other sizes through resampled
positions, and after a save/load round trip; options unitok lacks are refused by name."""

from __future__ import annotations

import json

import pytest
import timm
import torch
from timm.layers import GluMlp, SwiGLUPacked, resample_abs_pos_embed
from timm.models.mlp_mixer import MlpMixer
from timm.models.vision_transformer import ResPostBlock, VisionTransformer, checkpoint_filter_fn

from tests.unitok.convert.perturb import perturbed
from tokenizers_mm import IMAGENET_MEAN, IMAGENET_STD
from unitok.convert import from_timm
from unitok.layers import onednn_gemm
from unitok.layers.fused_linear import uses_onednn
from unitok.models import DeiT, MixerConfig, MLPMixer, ViT

SIZE = 64  # 4×4 patches of 16
SMALL = dict(pretrained=False, num_classes=7, img_size=SIZE, depth=2)

VIT_CASES = {
    "cls-token": ("vit_tiny_patch16_224", {}),
    "avg-pool-fc-norm": ("vit_tiny_patch16_224", dict(global_pool="avg", class_token=False)),
    "registers-no-embed-class": ("vit_tiny_patch16_224", dict(reg_tokens=4, no_embed_class=True)),
    "avg-pool-without-fc-norm": ("vit_tiny_patch16_224", dict(global_pool="avg", fc_norm=False)),
    "no-positions": ("vit_tiny_patch16_224", dict(pos_embed="none")),
    "quick-gelu-mlp-ratio-2": ("vit_tiny_patch16_224", dict(act_layer="quick_gelu", mlp_ratio=2.0)),
    "deit-distilled": ("deit_tiny_distilled_patch16_224", {}),
}


def timm_vit(arch: str = "vit_tiny_patch16_224", **options) -> torch.nn.Module:
    return perturbed(timm.create_model(arch, **{**SMALL, **options}))


def timm_mixer(**options) -> MlpMixer:
    # timm.create_model("mixer_s16_224", num_blocks=...) clashes with the preset's own num_blocks.
    return perturbed(MlpMixer(**{**dict(num_classes=7, img_size=SIZE, patch_size=16, num_blocks=2,
                                        embed_dim=64), **options}))


def same(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


@pytest.fixture(params=list(VIT_CASES), ids=list(VIT_CASES))
def vit_pair(request):
    torch.manual_seed(0)
    arch, options = VIT_CASES[request.param]
    theirs = timm_vit(arch, **options)
    return theirs, from_timm(theirs).eval()


# --------------------------------------------------------------------------- ViT / DeiT


def test_same_logits_and_token_features(vit_pair):
    theirs, ours = vit_pair
    x = torch.randn(3, 3, SIZE, SIZE)
    with torch.no_grad():
        ref_logits, ref_features = theirs(x), theirs.forward_features(x)
        out = ours(x)
    same(out.logits, ref_logits)
    same(out.last_hidden_state, ref_features)  # (B, prefix + N, D), after the final norm
    assert out.grid == (4, 4)
    assert ref_logits.abs().max() > 0.05  # a real comparison, not of two near-zero heads


def test_converted_model_is_the_unitok_family_with_the_timm_shape(vit_pair):
    theirs, ours = vit_pair
    distilled = type(theirs).__name__ == "VisionTransformerDistilled"
    assert type(ours) is (DeiT if distilled else ViT)
    c = ours.config
    assert c.n_layers == len(theirs.blocks) == 2 and c.d_model == theirs.embed_dim
    assert c.image_size == (SIZE, SIZE) and c.patch_size == 16 and c.num_classes == 7
    assert c.n_prefix == theirs.num_prefix_tokens
    assert ours.num_parameters() == sum(p.numel() for p in theirs.parameters())


def test_deit_heads_match_timm_on_their_own_tokens():
    torch.manual_seed(0)
    theirs = timm_vit("deit_tiny_distilled_patch16_224")
    ours = from_timm(theirs).eval()
    x = torch.randn(2, 3, SIZE, SIZE)
    with torch.no_grad():
        tokens = theirs.forward_features(x)
        out = ours(x)
        same(out.logits_cls, theirs.head(tokens[:, 0]))
        same(out.logits_dist, theirs.head_dist(tokens[:, 1]))
        same(out.logits, theirs(x))  # timm's eval forward averages the two heads too
    torch.testing.assert_close(out.logits, (out.logits_cls + out.logits_dist) / 2)


def test_headless_vit_pooled_features_match():
    torch.manual_seed(0)
    theirs = timm_vit(num_classes=0)
    ours = from_timm(theirs).eval()
    x = torch.randn(2, 3, SIZE, SIZE)
    with torch.no_grad():
        out = ours(x)
        ref = theirs(x)  # timm without a head returns the pooled features
    assert out.logits is None and ours.config.num_classes == 0
    same(out.pooled, ref)


# --------------------------------------------------------------------------- other image sizes


@pytest.mark.parametrize("arch,options", [
    ("vit_tiny_patch16_224", {}),
    ("vit_tiny_patch16_224", dict(reg_tokens=4, no_embed_class=True)),
    ("deit_tiny_distilled_patch16_224", {}),
], ids=["cls-token", "registers-no-embed-class", "deit-distilled"])
def test_other_input_sizes_resample_positions_like_timm_dynamic_img_size(arch, options):
    torch.manual_seed(0)
    theirs = timm_vit(arch, dynamic_img_size=True, **options)
    ours = from_timm(theirs).eval()
    x = torch.randn(2, 3, 96, 48)  # 6×3 patches, trained on 4×4
    with torch.no_grad():
        out = ours(x)
        same(out.logits, theirs(x))
    assert out.grid == (6, 3)


@pytest.mark.parametrize("new_size", [(96, 96), (96, 48)], ids=["96x96", "96x48"])
@pytest.mark.parametrize("options", [{}, dict(reg_tokens=4, no_embed_class=True)],
                         ids=["cls-token", "registers-no-embed-class"])
def test_set_image_size_matches_timm_loading_at_the_new_size(new_size, options):
    torch.manual_seed(0)
    small = timm_vit(**options)
    ours = from_timm(small).eval()
    ours.set_image_size(new_size)
    assert ours.config.image_size == new_size and ours.grid == (new_size[0] // 16, new_size[1] // 16)

    big = timm.create_model("vit_tiny_patch16_224", **{**SMALL, "img_size": new_size, **options}).eval()
    big.load_state_dict(checkpoint_filter_fn(small.state_dict(), big))  # timm resamples pos_embed here
    assert ours.pos_embed.shape == big.pos_embed.shape
    same(ours.pos_embed, big.pos_embed)
    x = torch.randn(2, 3, *new_size)
    with torch.no_grad():
        same(ours(x).logits, big(x))


def test_set_image_size_equals_timm_resample_abs_pos_embed():
    torch.manual_seed(0)
    small = timm_vit()
    ours = from_timm(small)
    ours.set_image_size((128, 80))
    expected = resample_abs_pos_embed(small.pos_embed.detach(), [8, 5], old_size=[4, 4], num_prefix_tokens=1)
    same(ours.pos_embed.detach(), expected)


# --------------------------------------------------------------------------- MLP-Mixer


def test_mixer_same_logits_and_features():
    torch.manual_seed(0)
    theirs = timm_mixer()
    ours = from_timm(theirs).eval()
    assert type(ours) is MLPMixer
    c = ours.config
    assert (c.n_layers, c.d_model, c.token_mlp_dim, c.d_ff) == (2, 64, 32, 256) and c.n_patches == 16
    x = torch.randn(3, 3, SIZE, SIZE)
    with torch.no_grad():
        out = ours(x)
        same(out.logits, theirs(x))
        same(out.last_hidden_state, theirs.forward_features(x))
    assert out.logits.abs().max() > 0.05


def test_mixer_non_square_and_custom_ratios():
    torch.manual_seed(0)
    theirs = timm_mixer(img_size=(32, 64), patch_size=8, embed_dim=48, mlp_ratio=(1.0, 2.0), num_classes=5)
    ours = from_timm(theirs).eval()
    assert ours.config.n_patches == 32 and ours.config.token_mlp_dim == 48 and ours.config.d_ff == 96
    x = torch.randn(2, 3, 32, 64)
    with torch.no_grad():
        same(ours(x).logits, theirs(x))


@pytest.mark.parametrize("kind", ["vit", "deit", "mixer"])
def test_inference_at_fused_sizes_equals_timm_and_the_training_path(kind, monkeypatch):
    """At ViT-Tiny / Mixer widths and 16 images (272 / 256 token rows) inference runs the linear
    layers as fused oneDNN calls (`unitok.layers.fused_linear`): still timm's function, and
    the same as the differentiable path training takes."""
    monkeypatch.setattr(onednn_gemm, "PREFERRED", True)  # as a Zen 5 times it: fc_out fuses too
    torch.manual_seed(0)
    if kind == "mixer":
        theirs = timm_mixer(embed_dim=128)
    else:
        theirs = timm_vit("deit_tiny_distilled_patch16_224" if kind == "deit" else "vit_tiny_patch16_224")
    ours = from_timm(theirs).eval()
    x = torch.randn(16, 3, SIZE, SIZE)
    mlp = ours.backbone.blocks[0].sublayers["mlp"]
    rows = 16 * ours(x[:1]).last_hidden_state.shape[1]
    with torch.no_grad():
        assert uses_onednn(torch.zeros(rows, mlp.fc_in.in_features), mlp.fc_in, mlp.activation)
        assert uses_onednn(torch.zeros(rows, mlp.fc_out.in_features), mlp.fc_out)
        fused = ours(x).logits
        same(fused, theirs(x))
    same(fused, ours(x).logits.detach())  # with gradients: F.linear throughout


# --------------------------------------------------------------------------- checkpoints and preprocessing


def test_config_carries_timm_preprocessing():
    torch.manual_seed(0)
    vit = from_timm(timm_vit())  # augreg weights: 0.5 normalisation, crop 0.9
    assert vit.config.mean == (0.5, 0.5, 0.5) and vit.config.std == (0.5, 0.5, 0.5)
    assert vit.config.crop_pct == 0.9 and vit.config.interpolation == "bicubic"
    deit = from_timm(timm_vit("deit_tiny_distilled_patch16_224"))
    assert deit.config.mean == IMAGENET_MEAN and deit.config.std == IMAGENET_STD
    assert deit.config.crop_pct == 0.9
    assert deit.image_tokenizer().config.mean == IMAGENET_MEAN
    # A Mixer built from its class directly has no pretrained_cfg: the Mixer defaults apply.
    mixer = from_timm(timm_mixer())
    assert mixer.config.mean == MixerConfig().mean == (0.5, 0.5, 0.5)


@pytest.mark.parametrize("family", ["vit", "mixer"])
def test_a_one_channel_timm_model_converts_with_one_channel_of_its_normalisation(family):
    # timm keeps its pretrained config's RGB mean / std for in_chans=1: the average is taken
    torch.manual_seed(0)
    theirs = timm_vit(in_chans=1) if family == "vit" else timm_mixer(in_chans=1)
    theirs.pretrained_cfg = dict(mean=(0.4, 0.5, 0.6), std=(0.2, 0.3, 0.4))
    ours = from_timm(theirs)
    assert ours.config.channels == 1 and ours.config.mean == pytest.approx((0.5,)) and ours.config.std == pytest.approx((0.3,))
    pixels = torch.randn(2, 1, SIZE, SIZE)
    with torch.no_grad():
        same(ours(pixels).logits, theirs(pixels))


def test_pretrained_cfg_of_a_mixer_is_read():
    torch.manual_seed(0)
    theirs = timm_mixer()
    theirs.pretrained_cfg = dict(mean=(0.1, 0.2, 0.3), std=(0.4, 0.5, 0.6), interpolation="bilinear",
                                 crop_pct=0.95)
    c = from_timm(theirs).config
    assert (c.mean, c.std, c.interpolation, c.crop_pct) == ((0.1, 0.2, 0.3), (0.4, 0.5, 0.6), "bilinear", 0.95)


@pytest.mark.parametrize("family", ["vit", "deit", "mixer"])
def test_save_and_load_keeps_logits_and_preprocessing(tmp_path, family):
    torch.manual_seed(0)
    theirs = {"vit": lambda: timm_vit(reg_tokens=2), "deit": lambda: timm_vit("deit_tiny_distilled_patch16_224"),
              "mixer": timm_mixer}[family]()
    ours = from_timm(theirs).eval()
    ours.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["family"] == type(ours).__name__
    assert tuple(saved["mean"]) == ours.config.mean and tuple(saved["std"]) == ours.config.std
    loaded = type(ours).from_pretrained(tmp_path).eval()
    assert type(loaded) is type(ours) and loaded.config == ours.config
    x = torch.randn(2, 3, SIZE, SIZE)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x).logits, ours(x).logits, atol=0, rtol=0)
        same(loaded(x).logits, theirs(x))


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("options,message", [
    (dict(init_values=1e-5), "layer scale"),
    (dict(qk_norm=True), "q_norm"),
    (dict(global_pool="map"), "global_pool='map'"),
    (dict(global_pool="max"), "global_pool='max'"),
    (dict(act_layer="gelu_tanh"), "activation GELUTanh"),
    (dict(embed_norm_layer="layernorm"), "norm inside the patch embedding"),
    (dict(scale_mlp_norm=True), "norm inside the MLP"),
], ids=["layer-scale", "qk-norm", "map-pool", "max-pool", "gelu-tanh-class", "embed-norm", "mlp-norm"])
def test_unsupported_vit_options_are_refused_by_name(options, message):
    theirs = timm.create_model("vit_tiny_patch16_224", **{**SMALL, **options})
    with pytest.raises(ValueError, match=f"not supported by unitok: .*{message}"):
        from_timm(theirs)


def test_pre_norm_vit_converts():
    torch.manual_seed(0)
    theirs = timm_vit(pre_norm=True)
    ours = from_timm(theirs).eval()
    assert ours.config.pre_norm
    x = torch.randn(2, 3, SIZE, SIZE)
    with torch.no_grad():
        same(ours(x).logits, theirs(x))


CANNOT_EXPRESS = {
    "no-qkv-bias": (lambda: timm.create_model("vit_tiny_patch16_224", **SMALL, qkv_bias=False), "qkv_bias"),
    "no-proj-bias": (lambda: timm.create_model("vit_tiny_patch16_224", **SMALL, proj_bias=False), "bias"),
    "no-final-norm": (lambda: timm.create_model("vit_tiny_patch16_224", **SMALL, final_norm=False), "final_norm"),
    "rmsnorm": (lambda: timm.create_model("vit_tiny_patch16_224", **SMALL, norm_layer="rmsnorm"), "RmsNorm"),
    "swiglu-packed": (lambda: timm.create_model("vit_tiny_patch16_224", **SMALL, mlp_layer=SwiGLUPacked,
                                                act_layer="silu"), "MLP type GluMlp"),
    "gated-mixer": (lambda: timm_mixer(mlp_layer=GluMlp, act_layer=torch.nn.SiLU), "gated MLPs"),
    # options whose modules keep the attribute names unitok reads: converted, they gave other logits
    "pool-include-prefix": (lambda: timm.create_model("vit_tiny_patch16_224", **SMALL, global_pool="avg",
                                                      pool_include_prefix=True), "pool_include_prefix=True"),
    "post-norm-block": (lambda: timm.create_model("vit_tiny_patch16_224", **SMALL, block_fn=ResPostBlock),
                        "block type ResPostBlock"),
    "diff-attention": (lambda: timm.create_model("vit_tiny_patch16_224", **SMALL, attn_layer="diff"),
                       "attention type DiffAttention"),
    "no-linear-biases": (lambda: timm.create_model("vit_tiny_patch16_224", **SMALL, qkv_bias=False, proj_bias=False),
                         "qkv_bias / proj_bias.*=False beside LayerNorms with biases"),
}


@pytest.mark.parametrize("name", list(CANNOT_EXPRESS))
def test_options_unitok_cannot_express_are_refused_by_name(name):
    build, message = CANNOT_EXPRESS[name]
    theirs = build()
    with pytest.raises(ValueError, match=f"not supported by unitok: .*{message}"):
        from_timm(theirs)


def test_a_grey_vit_built_without_a_pretrained_config_converts_with_grey_statistics():
    # ImageNet's three RGB values reached the one-channel config and were refused
    torch.manual_seed(0)
    theirs = VisionTransformer(img_size=SIZE, patch_size=16, in_chans=1, embed_dim=64, depth=2, num_heads=4,
                               num_classes=7).eval()
    ours = from_timm(theirs)
    assert ours.config.channels == 1 and ours.config.mean == (0.5,) and ours.config.std == (0.5,)
    x = torch.randn(2, 1, SIZE, SIZE)
    with torch.no_grad():
        same(ours(x).logits, theirs(x))


def test_unknown_model_class_is_named():
    with pytest.raises(ValueError, match="no converter for timm class Linear; supported: MlpMixer"):
        from_timm(torch.nn.Linear(2, 2))
