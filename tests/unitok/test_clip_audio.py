"""CLIP with an audio tower: speech embedded into the image–text space, raw or as frames; the
shared-backbone option runs all three modalities through one set of weights; zero-shot
classification of audio by text prompts with the model's stored spectrogram settings; bad
audio (no tower, missing or impossible sample rate, empty, silent, NaN) is a clear error."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile
import torch

from tokenizers_mm import SpectrogramTokenizer, Tokens
from unitok.models import CLIP, CLIPConfig
from unitok.zero_shot import ZeroShotClassifier

VISION = dict(image_size=(16, 16), patch_size=8, channels=1, d_model=32, n_layers=2, n_heads=2, mean=(0.5,),
              std=(0.5,), crop_pct=None)
AUDIO = dict(n_mels=20, subsampling_channels=8, d_model=32, n_layers=2, n_heads=2, max_frames=64,
             spectrogram={"n_mels": 20})
NAMES = ["zero", "one", "two"]


def tiny(**overrides) -> CLIP:
    torch.manual_seed(0)
    config = dict(embed_dim=16, vision=VISION, text=dict(d_model=32, n_layers=2, n_heads=2, context_length=24),
                  audio=AUDIO)
    return CLIP(CLIPConfig.from_dict({**config, **overrides})).eval()


def waves(n: int = 3, seconds: float = 0.6, rate: int = 16000) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    t = torch.arange(int(seconds * rate)) / rate
    return [0.3 * torch.sin(2 * torch.pi * (200 + 150 * i) * t) + 0.01 * torch.randn(len(t), generator=g)
            for i in range(n)]


def test_audio_embeds_into_the_joint_space_and_ignores_padding():
    model = tiny()
    tokens = model.audio_tokenizer().encode(waves(), sample_rate=16000)
    embeds = model.encode_audio(tokens, normalize=True)
    assert embeds.shape == (3, 16)
    torch.testing.assert_close(embeds.norm(dim=-1), torch.ones(3))
    # Row 0 padded with garbage frames behind its length: the same embedding.
    frames = torch.cat([tokens.features, torch.full((3, 20, 20), 7.0)], dim=1)
    lengths = tokens.attention_mask.sum(dim=1)
    torch.testing.assert_close(model.encode_audio(frames, lengths, normalize=True), embeds, atol=1e-5, rtol=0)
    assert model.logit_scale_audio is not model.logit_scale  # audio–image pairs have a temperature of their own


def test_encode_takes_every_modality_raw(tmp_path):
    model = tiny()
    path = tmp_path / "a.wav"
    soundfile.write(path, waves(1)[0].numpy(), 16000)
    from_file = model.encode(str(path), modality="audio")
    from_wave = model.encode(waves(1)[0], modality="audio", sample_rate=16000)
    torch.testing.assert_close(from_file, from_wave, atol=1e-4, rtol=0)
    resampled = model.encode(waves(1, rate=8000)[0], modality="audio", sample_rate=8000)
    assert resampled.shape == (1, 16)
    text = model.encode(["a seven.", "zero"], modality="text")
    torch.testing.assert_close(text, torch.nn.functional.normalize(
        model.encode_text(model.text_tokenizer().batch_encode(["a seven.", "zero"])), dim=-1))
    assert model.encode(torch.rand(2, 1, 16, 16), modality="image").shape == (2, 16)
    with pytest.raises(ValueError, match="modality must be"):
        model.encode(["x"], modality="video")


def test_shared_backbone_runs_image_text_and_audio_through_one_set_of_weights(tmp_path):
    model = tiny(shared_backbone=True, text=dict(d_model=32, n_layers=2, n_heads=2, context_length=24))
    assert model.audio.backbone is model.visual.backbone is model.text.backbone
    assert model.num_parameters() < tiny().num_parameters()
    model.save_pretrained(tmp_path)
    loaded = CLIP.from_pretrained(tmp_path).eval()
    assert loaded.audio.backbone is loaded.visual.backbone
    tokens = model.audio_tokenizer().encode(waves(), sample_rate=16000)
    torch.testing.assert_close(loaded.encode_audio(tokens), model.encode_audio(tokens))
    with pytest.raises(ValueError, match="vision.n_layers=2 but audio.n_layers=3"):
        CLIPConfig.from_dict(dict(embed_dim=16, vision=VISION, text=dict(d_model=32, n_layers=2, n_heads=2),
                                  audio={**AUDIO, "n_layers": 3}, shared_backbone=True))


def test_zero_shot_classifies_audio_by_text_prompts(tmp_path):
    model = tiny()
    clf = ZeroShotClassifier(model, NAMES, ["a spoken {}.", "someone says {}."], modality="audio")
    paths = []
    for i, wave in enumerate(waves()):
        paths.append(str(tmp_path / f"{i}.wav"))
        soundfile.write(paths[-1], wave.numpy(), 16000)
    proba = clf.predict_proba(paths)
    assert proba.shape == (3, 3)
    torch.testing.assert_close(proba.sum(dim=1), torch.ones(3))
    audio = model.encode_audio(model.audio_tokenizer().encode(paths), normalize=True)
    expected = clf.logit_scale * audio @ clf.class_embeddings.T
    torch.testing.assert_close(clf.logits(paths), expected, atol=1e-4, rtol=0)
    # the files hold the same waves quantised to 16 bits
    torch.testing.assert_close(clf.logits(waves(), sample_rate=16000), expected, atol=3e-3, rtol=0)
    probs, ids = clf.topk(paths, k=2)
    assert probs.shape == ids.shape == (3, 2)
    assert clf.predict_names(paths) == [NAMES[i] for i in clf.predict(paths).tolist()]


def test_bad_audio_is_a_clear_error(tmp_path):
    model = tiny()
    image_text = CLIP(CLIPConfig.from_dict(dict(embed_dim=16, vision=VISION,
                                                text=dict(d_model=32, n_layers=2, n_heads=2)))).eval()
    with pytest.raises(ValueError, match="has no audio tower"):
        image_text.encode(waves(1), modality="audio", sample_rate=16000)
    with pytest.raises(ValueError, match="needs a CLIP with an audio tower"):
        ZeroShotClassifier(image_text, NAMES, ["a {}."], modality="audio")
    clf = ZeroShotClassifier(model, NAMES, ["a {}."], modality="audio")
    with pytest.raises(ValueError, match="bare waveform: give its sample_rate="):
        clf.predict(waves(1))
    with pytest.raises(ValueError, match="bare waveform: give its sample_rate="):
        model.encode(np.zeros(100, dtype=np.float32) + 0.1, modality="audio")
    with pytest.raises(ValueError, match="sample_rate must be a whole number of Hz"):
        model.encode(waves(1), modality="audio", sample_rate=0)
    with pytest.raises(ValueError, match="is empty"):
        model.encode(torch.zeros(0), modality="audio", sample_rate=16000)
    with pytest.raises(ValueError, match="all silence"):
        model.encode(torch.zeros(16000), modality="audio", sample_rate=16000)
    nan = waves(1)[0].clone()
    nan[10] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        model.encode(nan, modality="audio", sample_rate=16000)
    with pytest.raises(ValueError, match="sample_rate is for audio"):
        ZeroShotClassifier(model, NAMES, ["a {}."]).predict(torch.rand(1, 1, 16, 16), sample_rate=16000)
    with pytest.raises(ValueError, match=r"audio frames must be \(batch, frames, 20\)"):
        model.encode_audio(torch.randn(2, 30, 80))
    frames = SpectrogramTokenizer(n_mels=20).encode(waves(1), sample_rate=16000).features
    frames[0, 3, 3] = float("inf")
    with pytest.raises(ValueError, match="NaN/inf"):
        model.encode_audio(Tokens(features=frames))


def test_image_only_options_are_refused_for_audio_not_ignored():
    # each was accepted and silently had no effect on an audio classifier
    model = tiny()
    with pytest.raises(ValueError, match="preprocess= prepares images; with modality='audio'"):
        ZeroShotClassifier(model, NAMES, ["a {}."], modality="audio", preprocess=lambda image: image)
    with pytest.raises(ValueError, match="resize=True resizes images; modality='audio' has no image"):
        ZeroShotClassifier(model, NAMES, ["a {}."], modality="audio", resize=True)
    clf = ZeroShotClassifier(model, NAMES, ["a {}."], modality="audio", resize=False)  # the default: fine
    for ask in (clf.logits, clf.predict_proba, clf.predict, clf.predict_names):
        with pytest.raises(ValueError, match="normalized=True takes normalised image tensors; this classifier reads audio"):
            ask(waves(1), normalized=True, sample_rate=16000)
    assert clf.predict(waves(1), normalized=False, sample_rate=16000).shape == (1,)


def test_audio_lengths_give_each_utterance_its_frame_count():
    model = tiny()
    frames = torch.randn(4, 40, 20)
    with pytest.raises(ValueError, match=r"audio lengths must be \(4,\), one frame count per utterance, got shape "
                                         r"\(1,\)"):
        model.encode_audio(frames, torch.tensor([30]))  # would be broadcast to every utterance
    with pytest.raises(ValueError, match=r"must be \(4,\).*got shape \(3,\)"):
        model.encode_audio(frames, torch.tensor([30, 30, 30]))
    with pytest.raises(ValueError, match=r"frame counts in \[1, 40\] \(the frames given\), got \[40, 900, 40, 40\]"):
        model.encode_audio(frames, torch.tensor([40, 900, 40, 40]))
    with pytest.raises(ValueError, match=r"in \[1, 40\].*got \[0, 40, 40, 40\]"):
        model.encode_audio(frames, torch.tensor([0, 40, 40, 40]))
    with pytest.raises(TypeError, match="audio lengths must be an integer tensor of frame counts, got a torch.float32"):
        model.encode_audio(frames, torch.tensor([40.0, 40.0, 40.0, 40.0]))
    torch.testing.assert_close(model.encode_audio(frames, torch.tensor([40, 40, 40, 40])), model.encode_audio(frames))


def test_an_audio_towers_spectrogram_settings_equal_themselves_after_a_save_and_load(tmp_path):
    """Settings given in part are stored whole (tuples, as a fresh config holds them), so a saved
    model's config equals the one it was saved from; empty settings read the tower's n_mels."""
    config = CLIPConfig.from_name("clip-digits-audio")
    audio = config.audio.replace(spectrogram={"normalize": "global", "global_mean": (0.0,) * config.audio.n_mels,
                                              "global_std": (1.0,) * config.audio.n_mels})
    model = CLIP(config.replace(audio=audio))
    model.save_pretrained(tmp_path)
    loaded = CLIP.from_pretrained(tmp_path)
    assert loaded.config == model.config
    assert loaded.config.audio.spectrogram["n_mels"] == config.audio.n_mels
    with pytest.raises(ValueError, match="spectrogram n_mels=40 differs from n_mels=32"):
        config.audio.replace(n_mels=32, spectrogram={"n_mels": 40})
    assert CLIP(config.replace(audio=config.audio.replace(n_mels=32, spectrogram={}))).processor.part("audio").n_mels == 32


def test_clip_audio_config_is_exported_beside_the_other_clip_configs():
    from unitok.models import CLIPAudioConfig, CLIPConfig

    assert CLIPConfig(audio=CLIPAudioConfig(n_mels=16)).audio.n_mels == 16


def test_an_audio_mask_of_other_values_than_1_and_0_is_refused_not_summed_into_lengths():
    frames = torch.randn(2, 40, AUDIO["n_mels"])
    mask = torch.tensor([[1] * 40, [2] * 20 + [0] * 20])
    with pytest.raises(ValueError, match=r"audio attention_mask holds \[2\]: expected 1 for a real token and 0"):
        tiny().encode_audio(Tokens(features=frames, attention_mask=mask, modality="audio"))
