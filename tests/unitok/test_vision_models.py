"""ViT, DeiT and MLP-Mixer from their presets: shapes, gradients, attention kernels and maps,
position schemes, predict on raw images, other input sizes, and bad input named clearly."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from tokenizers_mm import ImagePreprocessConfig, PatchTokenizer, Processor, Tokens
from unitok.models import DeiT, MixerConfig, MLPMixer, ViT, ViTConfig

PRESETS = {"vit-digits": (ViT, ViTConfig), "deit-digits": (DeiT, ViTConfig), "mixer-digits": (MLPMixer, MixerConfig)}
N_PATCHES = 16  # 32×32 digits in 8×8 patches


def build(preset: str, **overrides):
    torch.manual_seed(0)
    family, config_class = PRESETS[preset]
    return family(config_class.from_name(preset, **overrides)).eval()


def normalised(raw: torch.Tensor) -> torch.Tensor:
    """uint8 digits -> the model's input (mean 0.5, std 0.5 in every digits preset)."""
    return (raw.float() / 255 - 0.5) / 0.5


def raw_digits(batch: int = 3, height: int = 32, width: int = 32) -> torch.Tensor:
    return torch.randint(0, 256, (batch, 1, height, width), dtype=torch.uint8)


@pytest.fixture(params=list(PRESETS), ids=list(PRESETS))
def preset(request) -> str:
    return request.param


# --------------------------------------------------------------------------- every family


def test_preset_output_shapes_and_values_are_finite(preset):
    model = build(preset)
    assert model.config.image_size == (32, 32) and model.grid == (4, 4)
    x = torch.randn(3, 1, 32, 32)
    with torch.no_grad():
        out = model(x, output_hidden_states=True)
    n_prefix = {"vit-digits": 1, "deit-digits": 2, "mixer-digits": 0}[preset]
    assert out.logits.shape == (3, 10) and out.pooled.shape == (3, 64)
    assert out.last_hidden_state.shape == (3, n_prefix + N_PATCHES, 64)
    assert out.grid == (4, 4)
    assert len(out.hidden_states) == model.config.n_layers + 1
    assert torch.isfinite(out.logits).all() and torch.isfinite(out.last_hidden_state).all()
    assert out.logits.std() > 0  # rows differ: the head reads the input


def test_every_parameter_gets_a_gradient(preset):
    model = build(preset).train()
    model(torch.randn(2, 1, 32, 32)).logits.sum().backward()  # DeiT's logits average both heads
    without = [name for name, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert without == []


def test_patch_tokens_and_pixels_give_the_same_logits(preset):
    model = build(preset)
    raw = raw_digits()
    with torch.no_grad():
        from_tokens = model(model.image_tokenizer().encode(raw)).logits
        from_pixels = model(normalised(raw)).logits
    torch.testing.assert_close(from_tokens, from_pixels, atol=1e-6, rtol=0)


def test_predict_on_raw_uint8_images(preset):
    model = build(preset).train()
    raw = raw_digits(5)
    with torch.no_grad():
        expected = model.eval()(normalised(raw)).logits
    model.train()
    proba = model.predict_proba(raw)
    assert proba.shape == (5, 10)
    torch.testing.assert_close(proba.sum(-1), torch.ones(5))
    torch.testing.assert_close(proba, expected.softmax(-1), atol=1e-6, rtol=0)
    labels = model.predict(raw)
    assert labels.dtype == torch.long and labels.tolist() == expected.argmax(-1).tolist()
    assert model.training  # predict runs in eval mode and restores the caller's mode


def test_predict_on_pil_images_and_with_resize(preset):
    model = build(preset)
    arrays = [np.random.default_rng(i).integers(0, 256, (32, 32), dtype=np.uint8) for i in range(2)]
    from_pil = model.predict_proba([Image.fromarray(a, mode="L") for a in arrays])
    from_tensor = model.predict_proba(torch.from_numpy(np.stack(arrays))[:, None])
    torch.testing.assert_close(from_pil, from_tensor)
    # resize=True brings other sizes to the configured 32×32 first.
    resized = model.predict_proba(raw_digits(2, 48, 40), resize=True)
    assert resized.shape == (2, 10)
    torch.testing.assert_close(resized.sum(-1), torch.ones(2))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64], ids=["bf16", "f64"])
def test_predict_follows_the_model_dtype(dtype):
    model = build("vit-digits")
    raw = raw_digits(4)
    expected = model.predict(raw)
    model.to(dtype)
    proba = model.predict_proba(raw)
    assert proba.shape == (4, 10)
    torch.testing.assert_close(proba.float().sum(-1), torch.ones(4), atol=1e-2, rtol=0)
    if dtype == torch.float64:
        assert model.predict(raw).tolist() == expected.tolist()


def test_reset_classifier_changes_the_output_width(preset):
    model = build(preset)
    model.reset_classifier(3)
    assert model.config.num_classes == 3
    with torch.no_grad():
        logits = model(torch.randn(2, 1, 32, 32)).logits
    assert logits.shape == (2, 3) and logits.eq(0).all()  # new heads start at zero
    model.reset_classifier(0)
    with torch.no_grad():
        out = model(torch.randn(2, 1, 32, 32))
    assert out.logits is None and out.pooled.shape == (2, 64)
    with pytest.raises(ValueError, match="no classification head"):
        model.predict(raw_digits(1))


def test_wrong_channels_integer_pixels_and_bad_shapes_are_refused(preset):
    model = build(preset)
    with pytest.raises(ValueError, match=r"expected 1 channels, got 3"):
        model(torch.randn(2, 3, 32, 32))
    with pytest.raises(TypeError, match=r"normalised floats, got torch.uint8; use model.predict"):
        model(raw_digits(2))
    with pytest.raises(ValueError, match="30×32 is not divisible by the patch size 8"):
        model(torch.randn(2, 1, 30, 32))
    with pytest.raises(ValueError, match=r"\(batch, channels, height, width\) tensor, got \(1, 32, 32\)"):
        model(torch.randn(1, 32, 32))
    with pytest.raises(ValueError, match="patch features with a grid"):
        model(Tokens(ids=torch.zeros(1, 16, dtype=torch.long)))


def test_save_and_load_round_trip(preset, tmp_path):
    model = build(preset)
    model.save_pretrained(tmp_path)
    loaded = type(model).from_pretrained(tmp_path).eval()
    assert loaded.config == model.config
    x = torch.randn(2, 1, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x).logits, model(x).logits, atol=0, rtol=0)


# --------------------------------------------------------------------------- ViT / DeiT


@pytest.mark.parametrize("name", ["vit-digits", "deit-digits"])
def test_sdpa_and_reference_kernels_agree(name):
    model = build(name)
    x = torch.randn(2, 1, 32, 32)
    with torch.no_grad():
        fused = model(x).logits
        reference = model(x, kernel="reference").logits
    torch.testing.assert_close(fused, reference, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name,overrides,n_prefix", [
    ("vit-digits", {}, 1), ("deit-digits", {}, 2), ("vit-digits", dict(num_registers=3), 4),
], ids=["vit", "deit", "vit-registers"])
def test_attention_maps_cover_prefix_tokens_and_rows_sum_to_one(name, overrides, n_prefix):
    model = build(name, **overrides)
    with torch.no_grad():
        out = model(torch.randn(2, 1, 32, 32), output_attentions=True)
    assert len(out.attentions) == model.config.n_layers
    n = n_prefix + N_PATCHES
    for weights in out.attentions:
        assert weights.shape == (2, model.config.n_heads, n, n)
        assert weights.min() >= 0
        torch.testing.assert_close(weights.sum(-1), torch.ones(2, model.config.n_heads, n))
    assert out.last_hidden_state.shape[1] == n


def test_vit_takes_non_square_sizes_divisible_by_the_patch():
    model = build("vit-digits")
    with torch.no_grad():
        out = model(torch.randn(2, 1, 48, 24), output_attentions=True)
    assert out.grid == (6, 3) and out.logits.shape == (2, 10)
    assert out.attentions[0].shape[-1] == 1 + 18
    assert model.predict(raw_digits(2, 48, 24)).shape == (2,)


def test_set_image_size_keeps_logits_at_that_size(tmp_path):
    model = build("vit-digits")
    x = torch.randn(2, 1, 48, 24)
    with torch.no_grad():
        resampled_on_the_fly = model(x).logits
    model.set_image_size((48, 24))
    assert model.config.image_size == (48, 24) and model.pos_embed.shape == (1, 1 + 18, 64)
    with torch.no_grad():
        torch.testing.assert_close(model(x).logits, resampled_on_the_fly, atol=1e-6, rtol=0)
    model.save_pretrained(tmp_path)
    loaded = ViT.from_pretrained(tmp_path).eval()
    assert loaded.config.image_size == (48, 24)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x).logits, resampled_on_the_fly, atol=1e-6, rtol=0)


def test_set_image_size_takes_a_square_size_as_one_number():
    model = build("vit-digits")
    model.set_image_size(48)
    assert model.config.image_size == (48, 48) and model.pos_embed.shape == (1, 1 + 36, 64)


def test_deit_logits_average_the_class_and_distillation_heads():
    model = build("deit-digits")
    with torch.no_grad():
        out = model(torch.randn(3, 1, 32, 32))
        h = out.last_hidden_state
        torch.testing.assert_close(out.logits_cls, model.head(h[:, 0]))
        torch.testing.assert_close(out.logits_dist, model.head_dist(h[:, 1]))
    torch.testing.assert_close(out.logits, (out.logits_cls + out.logits_dist) / 2)
    assert not torch.allclose(out.logits_cls, out.logits_dist)


def test_plain_vit_has_no_distillation_outputs():
    with torch.no_grad():
        out = build("vit-digits")(torch.randn(1, 1, 32, 32))
    assert out.logits_cls is None and out.logits_dist is None


def test_deit_needs_a_distillation_token():
    with pytest.raises(ValueError, match="DeiT needs distill_token=True"):
        DeiT(ViTConfig.from_name("vit-digits", distill_token=False))
    with pytest.raises(ValueError, match="DeiT needs distill_token=True"):
        DeiT(ViTConfig(distill_token=False))


def _permuted_patches_change_logits(model) -> bool:
    tokens = model.image_tokenizer().encode(raw_digits(2))
    order = torch.randperm(tokens.seq_len, generator=torch.Generator().manual_seed(1))
    shuffled = Tokens(features=tokens.features[:, order], attention_mask=tokens.attention_mask,
                      modality="image", grid=tokens.grid)
    with torch.no_grad():
        return not torch.allclose(model(tokens).logits, model(shuffled).logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize("positions", ["learned", "sincos", "none"])
def test_position_schemes(positions):
    model = build("vit-digits", positions=positions)
    assert (model.pos_embed is not None) == (positions == "learned")
    assert not any("pos" in name for name, _ in model.named_parameters()) or positions == "learned"
    with torch.no_grad():
        out = model(torch.randn(2, 1, 40, 24))  # a size other than the configured one
    assert out.logits.shape == (2, 10) and torch.isfinite(out.logits).all()
    # Without positions a ViT cannot tell where a patch is: shuffling patches changes nothing.
    assert _permuted_patches_change_logits(model) == (positions != "none")


def test_sincos_positions_are_fixed_2d_tables():
    model = build("vit-digits", positions="sincos")
    table = model.position_table((4, 4))
    assert table.shape == (1, 16, 64) and not table.requires_grad
    torch.testing.assert_close(model.position_table((4, 4)), table)
    assert model.position_table((6, 3)).shape == (1, 18, 64)


def test_avg_pooling_with_fc_norm_and_registers():
    model = build("vit-digits", pool="avg", class_token=False, num_registers=2)
    assert model.fc_norm is not None and model.backbone.norm is None
    with torch.no_grad():
        out = model(torch.randn(2, 1, 32, 32))
    patches = out.last_hidden_state[:, 2:]  # registers are left out of the average
    torch.testing.assert_close(out.pooled, model.fc_norm(patches.mean(dim=1)))


# --------------------------------------------------------------------------- MLP-Mixer


def test_mixer_needs_its_configured_number_of_patches():
    model = build("mixer-digits")
    assert model.config.n_patches == N_PATCHES
    with pytest.raises(ValueError, match=r"mixes exactly a 4×4 grid of patches \(32×32 images\); got 20 patches in a 5×4 grid"):
        model(torch.randn(1, 1, 40, 32))
    tokens = model.image_tokenizer().encode(raw_digits(1, 24, 32))
    with pytest.raises(ValueError, match="mixes exactly a 4×4 grid"):
        model(tokens)
    # resize=True is the way to feed other sizes.
    assert model.predict(raw_digits(2, 40, 24), resize=True).shape == (2,)


def test_mixer_refuses_the_right_number_of_patches_in_another_grid():
    # token mixing weighs each grid position: 2×8 patches are not a 4×4 image, though 16 of them
    model = build("mixer-digits")
    with pytest.raises(ValueError, match=r"got 16 patches in a 2×8 grid; resize images to 32×32"):
        model(torch.randn(1, 1, 16, 64))


def test_mixer_token_mixing_sees_patch_order():
    model = build("mixer-digits")
    assert _permuted_patches_change_logits(model)


@pytest.mark.parametrize("bias", [True, False])
def test_mixer_token_mixing_is_the_mlp_over_transposed_tokens_with_its_gradients(bias):
    # The sublayer multiplies W (F, N) @ x (B, N, D) instead of transposing x into a copy:
    # the same outputs and gradients as the MLP applied to xᵀ (timm's form).
    from unitok.backbone import BackboneConfig, TokenMLPSublayer

    torch.manual_seed(0)
    cfg = BackboneConfig(d_model=12, n_layers=1, n_heads=1, block=("token_mlp", "mlp"), n_tokens=7,
                         token_mlp_dim=5, bias=bias)
    sub = TokenMLPSublayer(cfg, 0)
    x = torch.randn(3, 7, 12, requires_grad=True)
    ours = sub(x)
    fc_in, fc_out = sub.fc_in, sub.fc_out
    theirs = fc_out(sub.act(fc_in(x.transpose(1, 2)))).transpose(1, 2)
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-5)
    g = torch.randn_like(ours)
    inputs = [x, *fc_in.parameters(), *fc_out.parameters()]  # (the sublayer's norm is the block's to apply)
    grads = torch.autograd.grad(ours, inputs, g)
    expected = torch.autograd.grad(theirs, inputs, g)
    for a, b in zip(grads, expected, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------- presets and configs


def test_presets_by_name_with_overrides():
    config = ViTConfig.from_name("deit-digits", num_classes=3)
    assert config.distill_token and config.num_classes == 3 and config.n_prefix == 2
    assert MixerConfig.from_name("mixer-digits").token_mlp_dim == 32
    assert ViTConfig.from_name("vit-tiny-patch16-224").d_model == 192


def test_unknown_preset_names_suggest_the_closest():
    with pytest.raises(ValueError, match="unknown ViTConfig preset 'vit-digit' \\(did you mean 'vit-digits'\\?\\)"):
        ViTConfig.from_name("vit-digit")
    with pytest.raises(ValueError, match="unknown MixerConfig preset 'resnet50'; available: mixer-b16-224"):
        MixerConfig.from_name("resnet50")
    with pytest.raises(ValueError, match="unknown ViTConfig key.*'n_layer' \\(did you mean 'n_layers'\\?\\)"):
        ViTConfig.from_name("vit-digits", n_layer=2)


def test_inconsistent_configs_are_refused():
    with pytest.raises(ValueError, match="pool='cls' needs class_token=True"):
        ViTConfig(class_token=False)
    with pytest.raises(ValueError, match="distillation token goes with a class token"):
        ViTConfig(class_token=False, distill_token=True, pool="avg")
    with pytest.raises(ValueError, match="image_size 30×32 is not divisible by patch_size 8"):
        ViTConfig.from_name("vit-digits", image_size=(30, 32))
    with pytest.raises(ValueError, match=r"mean needs 1 values \(one per channel\)"):
        MixerConfig.from_name("mixer-digits", mean=(0.5, 0.5, 0.5))
    with pytest.raises(ValueError, match="unknown positions .rope. for ViTConfig"):
        ViTConfig(positions="rope")
    with pytest.raises(ValueError, match="image_size 32×30 is not divisible"):
        build("vit-digits").set_image_size((32, 30))


def test_checkpoint_of_another_family_is_refused(tmp_path):
    build("mixer-digits").save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="holds a MLPMixer checkpoint, not a ViT"):
        ViT.from_pretrained(tmp_path)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_non_finite_pixels_or_patches_are_refused(bad):
    from tokenizers_mm import patchify

    model = ViT(ViTConfig.from_name("vit-digits"))
    pixels = torch.zeros(1, 1, 32, 32)
    pixels[0, 0, 3, 5] = bad
    with pytest.raises(ValueError, match="pixel_values contain 1 NaN/inf"):
        model(pixels)
    tokens = Tokens(features=patchify(pixels, 8), grid=(4, 4), modality="image")
    with pytest.raises(ValueError, match="patch features contain 1 NaN/inf"):
        model(tokens)


def test_huge_finite_pixels_pass_and_opposite_infinities_are_caught():
    """The finite check sums once: a sum that overflows from finite values must not be refused,
    and +inf and -inf (whose sum is NaN, not inf) must still be."""
    model = ViT(ViTConfig.from_name("vit-digits")).eval()
    pixels = torch.full((1, 1, 32, 32), 3e38)  # the sum overflows to inf; every value is finite
    assert torch.isinf(pixels.sum())
    model(pixels)  # no error: the values are finite (what the model makes of them is its own matter)
    pixels = torch.zeros(1, 1, 32, 32)
    pixels[0, 0, 0, 0], pixels[0, 0, 9, 9] = float("inf"), float("-inf")
    with pytest.raises(ValueError, match="pixel_values contain 2 NaN/inf"):
        model(pixels)


def test_pixels_and_their_patches_give_the_same_logits():
    """Pixels take the strided-convolution path, patch Tokens the Linear: one map, two routes."""
    from tokenizers_mm import patchify

    for preset in PRESETS:
        model = build(preset)
        pixels = normalised(raw_digits())
        tokens = Tokens(features=patchify(pixels, 8), grid=(4, 4), modality="image")
        torch.testing.assert_close(model(pixels).logits, model(tokens).logits, atol=1e-5, rtol=1e-5)


def test_sincos_positions_first_built_under_inference_mode_serve_training():
    model = build("vit-digits", positions="sincos")
    with torch.inference_mode():
        model(normalised(raw_digits(1)))
    model.train()(normalised(raw_digits(2))).logits.sum().backward()
    assert model.patch_embed.weight.grad is not None


@pytest.mark.parametrize("preset, prefix", [("vit-digits", 1), ("deit-digits", 2)])
def test_class_tokens_only_gives_the_same_logits_and_gradients(preset, prefix):
    model = build(preset)
    pixels = normalised(raw_digits(4))
    full, fast = model(pixels), model(pixels, class_tokens_only=True)
    assert model.reads_class_tokens and fast.last_hidden_state.shape == (4, prefix, model.config.d_model)
    torch.testing.assert_close(fast.logits, full.logits, atol=1e-5, rtol=0)
    model.train()
    labels = torch.arange(4)
    model(pixels, labels=labels).loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    model(pixels, labels=labels, class_tokens_only=True).loss.backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[name], atol=1e-5, rtol=1e-4, msg=name)


def test_class_tokens_only_needs_class_token_pooling():
    model = build("vit-digits", pool="avg", fc_norm=True)
    assert not model.reads_class_tokens
    with pytest.raises(ValueError, match="class_tokens_only needs class-token pooling"):
        model(normalised(raw_digits(1)), class_tokens_only=True)


def test_image_tokens_whose_grid_does_not_hold_their_patches_are_refused():
    vit = ViT(ViTConfig.from_name("vit-digits")).eval()
    tokens = vit.image_tokenizer().encode(torch.rand(1, 1, 32, 32))
    bad = Tokens(features=tokens.features[:, :8], attention_mask=tokens.attention_mask[:, :8], modality="image",
                 grid=(4, 4))
    with pytest.raises(ValueError, match="image Tokens hold 8 patches but their grid 4×4 has 16"):
        vit(bad)



# --------------------------------------------------------------------------- the processor


def test_the_processor_resizes_as_image_tokenizer_and_timm_do_after_a_save(tmp_path):
    # crop_pct travels with the processor (it acts only with resize): a non-square image is
    # resized keeping its aspect ratio and centre-cropped, not squashed
    from timm.data import create_transform

    model = ViT(ViTConfig(image_size=(32, 32), patch_size=8, d_model=32, n_layers=1, n_heads=2, num_classes=3,
                          crop_pct=0.875, interpolation="bilinear"))
    model.save_pretrained(tmp_path)
    loaded = ViT.from_pretrained(tmp_path)
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (48, 80, 3), dtype=np.uint8))
    by_processor = loaded.processor(image, resize=True)
    torch.testing.assert_close(by_processor.features, loaded.image_tokenizer(resize=True).encode(image).features)
    reference = create_transform(input_size=(3, 32, 32), interpolation="bilinear", crop_pct=0.875,
                                 mean=model.config.mean, std=model.config.std)(image)
    pixels = PatchTokenizer(loaded.processor.image).decode(by_processor, denormalize=False)[0]
    torch.testing.assert_close(pixels, reference, atol=0.02, rtol=0)


def test_a_processor_contradicting_the_configs_resizing_is_refused_naming_the_field():
    model = ViT(ViTConfig(image_size=(32, 32), patch_size=8, d_model=32, n_layers=1, n_heads=2, num_classes=3))
    mine = model.config.preprocess_config()
    with pytest.raises(ValueError, match=r"image part differs .* \(interpolation='bilinear' \(config: 'bicubic'\)\)"):
        model.processor = Processor(image=ImagePreprocessConfig(**{**mine.to_dict(), "interpolation": "bilinear"}))
    with pytest.raises(ValueError, match=r"\(crop_pct=None \(config: 0.875\)\)"):
        model.processor = Processor(image=ImagePreprocessConfig(**{**mine.to_dict(), "crop_pct": None}))


def test_the_call_time_options_of_a_set_processor_are_kept_and_saved(tmp_path):
    model = ViT(ViTConfig(image_size=(32, 32), patch_size=8, d_model=32, n_layers=1, n_heads=2, num_classes=3))
    mine = ImagePreprocessConfig(**{**model.config.preprocess_config().to_dict(), "resize": True, "pad": True})
    model.processor = Processor(image=mine)
    assert model.processor.image == mine
    model.save_pretrained(tmp_path)
    assert ViT.from_pretrained(tmp_path).processor.image == mine


def test_a_processor_given_as_lists_is_the_configs_own():
    model = build("vit-digits")
    as_lists = ImagePreprocessConfig(patch_size=8, channels=1, mean=[0.5], std=[0.5], image_size=[32, 32])
    model.processor = Processor(image=as_lists)  # equal values, not refused for being lists
    assert model.processor.image == model.config.preprocess_config()
