"""ZeroShotClassifier: template ensembles, per-class prompts, cached class embeddings, and
predict / predict_proba / topk on raw or normalised images; bad prompts are clear errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from unitok.models import CLIP, CLIPConfig
from unitok.zero_shot import ZeroShotClassifier, class_prompts

NAMES = ["zero", "one", "two"]
TEMPLATES = ["a photo of the number {}.", "a handwritten {}."]


@pytest.fixture
def model() -> CLIP:
    config = CLIPConfig.from_dict(dict(
        embed_dim=16, vision=dict(image_size=(16, 16), patch_size=8, channels=1, d_model=32, n_layers=1, n_heads=2,
                                  mean=(0.5,), std=(0.5,), crop_pct=None),
        text=dict(d_model=32, n_layers=1, n_heads=2)))
    return CLIP(config).eval()


def test_class_embedding_is_the_renormalised_mean_of_its_prompts(model):
    clf = ZeroShotClassifier(model, NAMES, TEMPLATES)
    tok = model.text_tokenizer()
    for k, name in enumerate(NAMES):
        prompts = tok.batch_encode([t.format(name) for t in TEMPLATES])
        expected = F.normalize(F.normalize(model.encode_text(prompts), dim=-1).mean(dim=0), dim=0)
        torch.testing.assert_close(clf.class_embeddings[k], expected, atol=1e-6, rtol=1e-5)


def test_per_class_prompts_replace_the_templates_for_that_class(model):
    clf = ZeroShotClassifier(model, NAMES, TEMPLATES, prompts={"two": ["a pair of things."]})
    assert clf.prompts[2] == ["a pair of things."] and clf.prompts[0] == ["a photo of the number zero.",
                                                                         "a handwritten zero."]
    alone = model.encode_text(model.text_tokenizer().batch_encode(["a pair of things."]), normalize=True)[0]
    torch.testing.assert_close(clf.class_embeddings[2], alone, atol=1e-6, rtol=1e-5)
    lists = class_prompts(NAMES, prompts=[["0"], ["1"], ["2", "two"]])
    assert lists == [["0"], ["1"], ["2", "two"]]


def test_class_embeddings_are_built_once_in_batches_and_can_be_passed_back(model, monkeypatch):
    calls = []
    original = model.encode_text
    monkeypatch.setattr(model, "encode_text", lambda ids, **kw: calls.append(len(ids)) or original(ids, **kw))
    clf = ZeroShotClassifier(model, NAMES, TEMPLATES, batch_size=4, progress=True)
    first = clf.class_embeddings
    images = torch.rand(5, 1, 16, 16)
    clf.predict(images)
    clf.predict_proba(images)
    assert calls == [4, 2] and clf.class_embeddings is first  # 6 prompts, once
    again = ZeroShotClassifier(model, NAMES, TEMPLATES, class_embeddings=first)
    assert torch.equal(again.predict(images), clf.predict(images)) and calls == [4, 2]


def test_cached_class_embeddings_must_be_unit_rows_of_the_models_width(model):
    built = ZeroShotClassifier(model, NAMES, TEMPLATES).class_embeddings  # (3, 16) unit rows
    with pytest.raises(ValueError, match=r"class_embeddings must be \(3, 16\).*got \(3, 32\)"):
        ZeroShotClassifier(model, NAMES, TEMPLATES, class_embeddings=torch.randn(3, 32))
    with pytest.raises(ValueError, match=r"class_embeddings must be \(3, 16\).*got \(2, 16\)"):
        ZeroShotClassifier(model, NAMES, TEMPLATES, class_embeddings=built[:2])
    with pytest.raises(ValueError, match=r"rows must have norm 1 .* got 1 that do not \(row 2: 3\); normalise"):
        ZeroShotClassifier(model, NAMES, TEMPLATES, class_embeddings=built * torch.tensor([[1.0], [1.0], [3.0]]))
    with pytest.raises(TypeError, match="class_embeddings must be a float tensor, got a torch.int64 tensor"):
        ZeroShotClassifier(model, NAMES, TEMPLATES, class_embeddings=built.long())
    assert ZeroShotClassifier(model, NAMES, TEMPLATES, class_embeddings=built.half()).class_embeddings.shape == (3, 16)


def test_predictions_probabilities_and_topk_agree(model):
    clf = ZeroShotClassifier(model, NAMES, TEMPLATES)
    images = (torch.rand(6, 1, 16, 16) * 255).to(torch.uint8)  # raw images: the model's preprocessing applies
    probs = clf.predict_proba(images)
    torch.testing.assert_close(probs.sum(dim=-1), torch.ones(6))
    assert torch.equal(clf.predict(images), probs.argmax(dim=-1))
    values, indices = clf.topk(images, k=2)
    assert indices.shape == (6, 2) and torch.equal(indices[:, 0], probs.argmax(dim=-1))
    assert (values[:, 0] >= values[:, 1]).all()
    assert clf.predict_names(images) == [NAMES[i] for i in probs.argmax(dim=-1).tolist()]
    normalized = (images.float() / 255 - 0.5) / 0.5
    torch.testing.assert_close(clf.predict_proba(normalized, normalized=True), probs)


def test_a_logit_scale_or_k_that_would_answer_wrongly_is_refused(model):
    for bad in (float("nan"), -1.0, 0.0, "100"):  # NaN probabilities; an inverted or flat ranking
        with pytest.raises(ValueError, match=f"logit_scale must be a finite number > 0, got {bad!r}"):
            ZeroShotClassifier(model, NAMES, TEMPLATES, logit_scale=bad)
    clf = ZeroShotClassifier(model, NAMES, TEMPLATES, logit_scale=50)
    images = (torch.rand(2, 1, 16, 16) * 255).to(torch.uint8)
    for bad in (2.5, True, 0):
        with pytest.raises(ValueError, match=f"k must be an integer ≥ 1, got {bad}"):
            clf.topk(images, k=bad)
    with pytest.raises(ValueError, match=r"k must be in \[1, 3\], got 4"):
        clf.topk(images, k=4)


def test_logits_use_the_models_learned_temperature(model):
    clf = ZeroShotClassifier(model, NAMES, TEMPLATES)
    features = torch.randn(2, 16)
    expected = model.logit_scale.exp() * F.normalize(features, dim=-1) @ clf.class_embeddings.T
    torch.testing.assert_close(clf.logits_from_features(features), expected)
    fixed = ZeroShotClassifier(model, NAMES, TEMPLATES, logit_scale=100.0)
    torch.testing.assert_close(fixed.logits_from_features(features), 100.0 * F.normalize(features, dim=-1)
                               @ clf.class_embeddings.T)


def test_wrong_image_size_is_an_error_unless_resizing(model):
    clf = ZeroShotClassifier(model, NAMES, TEMPLATES)
    big = torch.rand(2, 1, 32, 32)
    with pytest.raises(ValueError, match="takes 16×16 images"):
        clf.predict(big)
    assert ZeroShotClassifier(model, NAMES, TEMPLATES, resize=True).predict(big).shape == (2,)


@pytest.mark.parametrize("classnames, templates, prompts, message", [
    ([], TEMPLATES, None, "non-empty list of names"),
    (NAMES, ["a photo of a digit."], None, "needs exactly one '\\{\\}'"),
    (NAMES, [], None, "non-empty list"),
    (NAMES, None, {"zero": ["0"]}, "class 'one' has no prompts"),
    (NAMES, TEMPLATES, {"seven": ["7"]}, "unknown classes \\['seven'\\]"),
    (NAMES, None, [["0"], ["1"]], "2 prompt lists for 3 classes"),
    (NAMES, TEMPLATES, {"zero": []}, "empty prompt list"),
])
def test_bad_class_lists_and_templates_are_refused(model, classnames, templates, prompts, message):
    with pytest.raises(ValueError, match=message):
        ZeroShotClassifier(model, classnames, templates, prompts=prompts)


def test_repeated_class_names_warn(model):
    with pytest.warns(UserWarning, match="repeated class names \\['a'\\]"):
        ZeroShotClassifier(model, ["a", "b", "a"], TEMPLATES)


def test_models_without_a_tokenizer_need_one():
    import open_clip
    from open_clip.model import CLIP as OpenCLIP
    from open_clip.model import CLIPTextCfg, CLIPVisionCfg

    reference = OpenCLIP(16, CLIPVisionCfg(layers=1, width=32, head_width=16, patch_size=8, image_size=16),
                         CLIPTextCfg(context_length=16, width=32, heads=2, layers=1)).eval()
    with pytest.raises(ValueError, match="pass tokenizer="):
        ZeroShotClassifier(reference, NAMES, TEMPLATES)
    clf = ZeroShotClassifier(reference, NAMES, TEMPLATES, tokenizer=lambda t: open_clip.tokenize(t, 16))
    with pytest.raises(ValueError, match="preprocess="):
        clf.predict([object()])
    assert clf.predict(torch.randn(2, 3, 16, 16), normalized=True).shape == (2,)
    with pytest.raises(TypeError, match="no encode_image"):
        ZeroShotClassifier(torch.nn.Linear(2, 2), NAMES, TEMPLATES)


def test_prompts_given_as_a_list_keep_each_class_its_own_even_under_a_repeated_name():
    # ImageNet has two "crane" classes (a bird, a machine): per-class prompts exist to tell them apart
    lists = class_prompts(["crane", "crane"], prompts=[["a photo of a crane, the bird"],
                                                      ["a photo of a crane, the machine"]])
    assert lists == [["a photo of a crane, the bird"], ["a photo of a crane, the machine"]]
    with pytest.raises(TypeError, match="class 'a''s prompts must be a list of strings, got the string 'a photo'"):
        class_prompts(["a"], prompts=["a photo"])


@pytest.mark.parametrize("template", ["a {} of a {}", "a {} of a {name}", "a photo"])
def test_a_template_needs_exactly_one_empty_field(template):
    with pytest.raises(ValueError, match="needs exactly one '\\{\\}' for the class name"):
        class_prompts(["cat"], [template])
    assert class_prompts(["cat"], ["a {{literal}} {}"]) == [["a {literal} cat"]]
