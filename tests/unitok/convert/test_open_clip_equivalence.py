"""from_open_clip: random open_clip models (ViT-B-32 and small custom configs; noise on every
weight, so each norm and bias matters) give the same image and text embeddings in unitok, and the
same zero-shot predictions as open_clip's own `build_zero_shot_classifier` path."""

from __future__ import annotations

import open_clip
import pytest
import torch
import torch.nn.functional as F
from open_clip.model import CLIP as OpenCLIP
from open_clip.model import CLIPTextCfg, CLIPVisionCfg, CustomTextCLIP
from open_clip.transform import PreprocessCfg, image_transform_v2
from open_clip.zero_shot_classifier import build_zero_shot_classifier

from tests.unitok.convert.perturb import perturbed
from unitok.convert import from_open_clip
from unitok.zero_shot import ZeroShotClassifier

CAPTIONS = ["a photo of a cat.", "a diagram of a very small dog sitting next to a much larger red ball", "hi",
            "the number seven"]


def small(quick_gelu: bool = False, vision: dict | None = None, text: dict | None = None, **kwargs) -> OpenCLIP:
    vision_cfg = CLIPVisionCfg(layers=2, width=64, head_width=16, patch_size=8, image_size=32, **(vision or {}))
    text_cfg = CLIPTextCfg(context_length=24, vocab_size=49408, width=48, heads=4, layers=2, **(text or {}))
    return perturbed(OpenCLIP(embed_dim=32, vision_cfg=vision_cfg, text_cfg=text_cfg, quick_gelu=quick_gelu, **kwargs))


def assert_same_embeddings(reference: torch.nn.Module, context_length: int, image_size: int) -> None:
    ours = from_open_clip(reference).eval()
    pixels = torch.randn(3, 3, image_size, image_size)
    ids = open_clip.tokenize(CAPTIONS, context_length=context_length)
    with torch.no_grad():
        torch.testing.assert_close(ours.encode_image(pixels), reference.encode_image(pixels), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ours.encode_text(ids), reference.encode_text(ids), atol=1e-5, rtol=1e-5)
        a, b = ours(pixels, ids), reference.get_logits(pixels, ids)
        torch.testing.assert_close(a.logits_per_image, b[0], atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("variant", [
    dict(),
    dict(quick_gelu=True),
    dict(vision=dict(final_ln_after_pool=True)),
    dict(vision=dict(no_ln_pre=True)),
], ids=["gelu", "quick_gelu", "ln_after_pool", "no_ln_pre"])
def test_small_custom_configs_match(variant):
    assert_same_embeddings(small(**variant), context_length=24, image_size=32)


@pytest.mark.slow
def test_vit_b_32_with_random_weights_matches():
    reference = perturbed(open_clip.create_model("ViT-B-32", pretrained=None))
    assert_same_embeddings(reference, context_length=77, image_size=224)
    ours = from_open_clip(reference)
    assert ours.config.vision.mean == tuple(reference.visual.preprocess_cfg["mean"])


def test_zero_shot_predictions_equal_open_clips_classifier_path():
    torch.manual_seed(5)  # a model that spreads these pixels over several classes
    reference = small()
    ours = from_open_clip(reference).eval()
    classnames = ["cat", "dog", "car", "bird", "ship", "tree", "house", "seven"]
    templates = ["a photo of a {}.", "a drawing of the {}.", "itap of a {}."]

    def tokenizer(texts):
        return open_clip.tokenize(texts, context_length=24)

    weights = build_zero_shot_classifier(reference, tokenizer, classnames, templates, num_classes_per_batch=3)
    pixels = torch.randn(64, 3, 32, 32)
    with torch.no_grad():
        expected = (100.0 * F.normalize(reference.encode_image(pixels), dim=-1) @ weights).argmax(dim=-1)
    for model in (ours, reference):  # our classifier, on our model and on the open_clip model itself
        clf = ZeroShotClassifier(model, classnames, templates, tokenizer=tokenizer, batch_size=5)
        torch.testing.assert_close(clf.class_embeddings, weights.T, atol=1e-6, rtol=1e-5)
        assert torch.equal(clf.predict(pixels, normalized=True), expected)
    assert len(expected.unique()) > 1  # a real comparison, not one constant class


@pytest.mark.parametrize("options, reason", [
    (dict(init_logit_bias=-10.0), "logit_bias"),
    (dict(vision=dict(ls_init_value=0.1)), "layer scale"),
    (dict(vision=dict(attentional_pool=True)), "attentional pooling"),
    (dict(vision=dict(pool_type="avg")), "pool_type='avg'"),
    (dict(text=dict(pool_type="last")), "pool_type='last'"),
    (dict(text=dict(no_causal_mask=True)), "bidirectional"),
    (dict(text=dict(proj_bias=True)), "proj_bias"),
])
def test_options_unitok_lacks_are_refused_by_name(options, reason):
    with pytest.raises(ValueError, match=reason):
        from_open_clip(small(**options))


def preprocess_cfg(resize_mode: str) -> dict:
    return {"size": (32, 32), "mode": "RGB", "mean": open_clip.OPENAI_DATASET_MEAN, "std": open_clip.OPENAI_DATASET_STD,
            "interpolation": "bicubic", "resize_mode": resize_mode, "fill_color": 0}


@pytest.mark.parametrize("resize_mode", ["shortest", "squash"])
def test_raw_images_are_prepared_as_open_clips_preprocess_does(resize_mode):
    import numpy as np
    from PIL import Image

    reference = small()
    reference.visual.preprocess_cfg = preprocess_cfg(resize_mode)  # as create_model sets it
    preprocess = image_transform_v2(PreprocessCfg(**reference.visual.preprocess_cfg), is_train=False)
    ours = from_open_clip(reference).eval()
    tok = ours.image_tokenizer(resize=True)
    for size in ((43, 60), (17, 100)):  # a squash and a crop differ most on long images
        y, x = np.mgrid[0 : size[0], 0 : size[1]]
        smooth = np.stack([128 + 100 * np.sin(x / 5 + c) * np.cos(y / 7 - c) for c in range(3)], -1)
        image = Image.fromarray(smooth.astype(np.uint8))
        with torch.no_grad():
            a, b = ours.encode_image(tok.preprocess(image)), reference.encode_image(preprocess(image)[None])
        assert F.cosine_similarity(a, b).item() > 0.999  # PIL rounds to 8 bits between steps; torch does not


def test_open_clips_padding_resize_mode_is_refused():
    reference = small()
    reference.visual.preprocess_cfg = preprocess_cfg("longest")
    with pytest.raises(ValueError, match="resize_mode 'longest'"):
        from_open_clip(reference)


def test_custom_text_towers_are_refused():
    model = CustomTextCLIP(embed_dim=16, vision_cfg=CLIPVisionCfg(layers=1, width=32, head_width=16, patch_size=8,
                                                                  image_size=16),
                           text_cfg=CLIPTextCfg(context_length=8, width=32, heads=2, layers=1))
    with pytest.raises(ValueError, match="CustomTextCLIP"):
        from_open_clip(model)
