"""The unitok CLIP: two towers on the one backbone, a shared-backbone option, checkpoints,
LiT locking, a ViT as image tower, and clear errors for bad images and captions."""

from __future__ import annotations

import pytest
import torch

from tokenizers_mm import CLIPTokenizer
from unitok.models import CLIP, GPT, CLIPConfig, CLIPTextConfig, GPTConfig, ViT, ViTConfig
from unitok.models.base import CheckpointMismatchError

TINY = dict(embed_dim=16, vision=dict(image_size=(16, 16), patch_size=8, channels=1, d_model=32, n_layers=2,
                                      n_heads=2, mean=(0.5,), std=(0.5,), crop_pct=None),
            text=dict(d_model=32, n_layers=2, n_heads=2, context_length=24))


def tiny(**overrides) -> CLIP:
    return CLIP(CLIPConfig.from_dict({**TINY, **overrides})).eval()


def captions(model: CLIP, texts=("a handwritten seven.", "zero", "the number four.")):
    return model.text_tokenizer().batch_encode(list(texts))


def test_embeddings_logits_and_output_shapes():
    model = tiny()
    pixels, text = torch.randn(2, 1, 16, 16), captions(model)
    out = model(pixels, text)
    assert out.image_embeds.shape == (2, 16) and out.text_embeds.shape == (3, 16)
    torch.testing.assert_close(out.image_embeds.norm(dim=-1), torch.ones(2))
    torch.testing.assert_close(out.logits_per_image, model.logit_scale.exp() * out.image_embeds @ out.text_embeds.T)
    torch.testing.assert_close(out.logits_per_text, out.logits_per_image.T)
    torch.testing.assert_close(model.logit_scale.exp(), torch.tensor(1 / 0.07))


def test_padding_behind_the_end_token_changes_nothing():
    model = tiny()
    text = captions(model)
    padded = CLIPTokenizer(24)(["a handwritten seven.", "zero", "the number four."])  # padded to 24
    torch.testing.assert_close(model.encode_text(text), model.encode_text(padded))


def test_image_embeddings_and_gradients_equal_the_full_tower_forward():
    """The image tower's last block computes only the class token the embedding reads: the same
    embedding and gradients as the forward over every token."""
    torch.manual_seed(0)
    model = tiny().train()
    pixels = torch.randn(3, 1, 16, 16)
    full = model.visual_proj(model.visual(pixels).pooled)
    fast = model.encode_image(pixels)
    torch.testing.assert_close(fast, full, atol=1e-5, rtol=1e-5)
    grads = [torch.autograd.grad(y.square().sum(), list(model.visual.parameters())) for y in (full, fast)]
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_shared_backbone_is_one_set_of_weights_saved_once(tmp_path):
    model = tiny(shared_backbone=True)
    assert model.text.backbone is model.visual.backbone
    separate = tiny()
    assert model.num_parameters() < separate.num_parameters()
    # The text tower still runs causally on the shared (bidirectional) backbone: a later token
    # does not change an earlier end token's features.
    ids = CLIPTokenizer(24)(["one two"])
    longer = ids.clone()
    longer[0, 4] = 320
    torch.testing.assert_close(model.encode_text(ids), model.encode_text(longer))
    model.save_pretrained(tmp_path)
    loaded = CLIP.from_pretrained(tmp_path).eval()
    assert loaded.text.backbone is loaded.visual.backbone
    torch.testing.assert_close(loaded.encode_text(ids), model.encode_text(ids))


def test_shared_backbone_needs_equal_towers():
    with pytest.raises(ValueError, match="text.n_layers"):
        CLIPConfig.from_dict({**TINY, "shared_backbone": True, "text": {**TINY["text"], "n_layers": 3}})


def test_save_and_load_round_trip_and_wrong_family(tmp_path):
    model = tiny()
    model.save_pretrained(tmp_path / "clip")
    loaded = CLIP.from_pretrained(tmp_path / "clip").eval()
    pixels, text = torch.randn(2, 1, 16, 16), captions(model)
    torch.testing.assert_close(loaded(pixels, text).logits_per_image, model(pixels, text).logits_per_image)
    GPT(GPTConfig.from_name("gpt-nano")).save_pretrained(tmp_path / "gpt")
    with pytest.raises(ValueError, match="GPT checkpoint, not a CLIP"):
        CLIP.from_pretrained(tmp_path / "gpt")


def test_presets_build_and_dicts_become_configs():
    config = CLIPConfig.from_name("ViT-B-32")
    assert isinstance(config.vision, ViTConfig) and isinstance(config.text, CLIPTextConfig)
    assert (config.vision.patch_size, config.vision.num_classes, config.vision.patch_bias) == (32, 0, False)
    assert CLIPConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ValueError, match="did you mean 'ViT-B-32'"):
        CLIPConfig.from_name("ViT-B-23")


def test_from_vit_starts_the_image_tower_from_a_trained_vit():
    vit = ViT(ViTConfig.from_name("vit-digits")).eval()
    model = CLIP.from_vit(vit, text=CLIPTextConfig(d_model=32, n_layers=1, n_heads=2), embed_dim=16).eval()
    pixels = torch.randn(2, 1, 32, 32)
    torch.testing.assert_close(model.visual(pixels).pooled, vit(pixels).pooled)
    assert model.visual.head is None
    with pytest.raises(ValueError, match="DeiT"):
        CLIP.from_vit(ViT(ViTConfig.from_name("deit-digits")))


def test_locked_image_tower_gets_no_gradients_and_stays_in_eval_mode():
    model = tiny()
    model.visual.config = model.visual.config.replace(dropout=0.0)
    model.lock_image_tower()
    model.train()
    assert not model.visual.training and model.text.training
    out = model(torch.randn(3, 1, 16, 16), captions(model))
    out.logits_per_image.sum().backward()
    assert all(p.grad is None for p in model.visual.parameters())
    assert all(p.grad is not None for p in model.text_proj.parameters())
    with pytest.raises(ValueError, match="shared"):
        tiny(shared_backbone=True).lock_image_tower()


def test_bad_images_and_captions_are_clear_errors():
    model = tiny()
    with pytest.raises(ValueError, match="takes 16×16 images, got \\(32, 32\\)"):
        model.encode_image(torch.randn(1, 1, 32, 32))
    with pytest.raises(ValueError, match="expected 1 channels"):
        model.encode_image(torch.randn(1, 3, 16, 16))
    with pytest.raises(ValueError, match="NaN"):
        model.encode_image(torch.full((1, 1, 16, 16), float("nan")))
    with pytest.raises(ValueError, match="no end-of-text token"):
        model.encode_text(torch.tensor([[49406, 320, 1125]]))
    with pytest.raises(ValueError, match="more than context_length=24"):
        model.encode_text(torch.zeros(1, 30, dtype=torch.long))
    with pytest.raises(ValueError, match="num_classes must be 0"):
        CLIPConfig.from_dict({**TINY, "vision": {**TINY["vision"], "num_classes": 10}})


def test_checkpoint_with_missing_keys_is_named(tmp_path):
    from safetensors.torch import load_file, save_file

    tiny().save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    del state["text_proj.weight"]
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointMismatchError, match="text_proj.weight"):
        CLIP.from_pretrained(tmp_path)
