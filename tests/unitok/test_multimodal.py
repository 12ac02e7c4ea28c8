"""MultimodalTransformer: any tokens through one backbone. One segment equals the single-modality
family with copied weights (GPT, ViT, Decision Transformer); segments compose by the packing
rules (causal segments never see their future, bidirectional ones see each other, earlier
segments are visible in full, padding never); every head reads its segment; checkpoints round
trip; bad input is a clear error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tokenizers_mm import PatchTokenizer, SpectrogramConfig, Tokens, TrajectoryWindows
from unitok.backbone import Backbone, BackboneConfig
from unitok.models import (
    GPT,
    ActionHeadConfig,
    AudioModality,
    ClassifierHeadConfig,
    CTCHeadConfig,
    DecisionTransformer,
    DecisionTransformerConfig,
    GPTConfig,
    ImageModality,
    LMHeadConfig,
    MultimodalConfig,
    MultimodalTransformer,
    ProjectionHeadConfig,
    TextModality,
    TrajectoryModality,
    ViT,
    ViTConfig,
)
from unitok.packing import Segment, pack_segments

V, K, STATE, ACTIONS = 40, 6, 4, 3


def four_modalities(**overrides) -> MultimodalTransformer:
    torch.manual_seed(0)
    config = MultimodalConfig(
        modalities={"image": ImageModality(), "audio": AudioModality(n_mels=16, max_frames=32),
                    "text": TextModality(vocab_size=V, max_positions=16),
                    "trajectory": TrajectoryModality(state_dim=STATE, act_dim=ACTIONS, context_length=K)},
        heads={"digit": ClassifierHeadConfig(segment="image", num_classes=10),
               "match": ClassifierHeadConfig(num_classes=2),
               "lm": LMHeadConfig(segment="text"), "ctc": CTCHeadConfig(segment="audio", vocabulary=tuple("ab ")),
               "act": ActionHeadConfig(segment="trajectory"),
               "embed": ProjectionHeadConfig(segment="audio", embed_dim=8, pool="mean")},
        d_model=32, n_layers=2, n_heads=4, **overrides)
    return MultimodalTransformer(config).eval()


def image(B: int = 2, seed: int = 0) -> torch.Tensor:
    return torch.randn(B, 1, 32, 32, generator=torch.Generator().manual_seed(seed))


def audio(lengths=(60, 44), seed: int = 1) -> Tokens:
    g = torch.Generator().manual_seed(seed)
    N = max(lengths)
    mask = torch.tensor([[1] * n + [0] * (N - n) for n in lengths])
    return Tokens(features=torch.randn(len(lengths), N, 16, generator=g) * mask[..., None], attention_mask=mask,
                  modality="audio")


def text(B: int = 2, n: int = 7, seed: int = 2) -> Tokens:
    return Tokens(ids=torch.randint(0, V, (B, n), generator=torch.Generator().manual_seed(seed)))


def trajectory(B: int = 2, seed: int = 3) -> TrajectoryWindows:
    g = torch.Generator().manual_seed(seed)
    return TrajectoryWindows(states=torch.randn(B, K, STATE, generator=g),
                             actions=torch.randint(0, ACTIONS, (B, K), generator=g),
                             returns_to_go=torch.randn(B, K, 1, generator=g), timesteps=torch.arange(K).expand(B, K),
                             attention_mask=torch.ones(B, K, dtype=torch.long), rewards=torch.zeros(B, K),
                             terminals=torch.zeros(B, K, dtype=torch.long))


# --------------------------------------------------------------------------- one segment = one family


def test_one_causal_text_segment_is_gpt():
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(vocab_size=V, context_length=16, d_model=32, n_layers=2, n_heads=4)).eval()
    model = MultimodalTransformer.from_gpt(gpt)
    assert not model.training and not model.modality_embed.weight.any()
    ids = torch.randint(0, V, (3, 12))
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    mask[2, :4] = 0  # left padding
    with torch.no_grad():
        torch.testing.assert_close(model({"text": ids}).heads["lm"], gpt(ids).logits, atol=1e-5, rtol=0)
        ours = model({"text": Tokens(ids=ids, attention_mask=mask)}).heads["lm"]
        theirs = gpt(ids, attention_mask=mask).logits
    real = mask.bool()
    torch.testing.assert_close(ours[real], theirs[real], atol=1e-5, rtol=0)


@pytest.mark.parametrize("positions", ["learned", "sincos", "none"])
def test_one_image_segment_is_vit(positions):
    torch.manual_seed(0)
    vit = ViT(ViTConfig.from_name("vit-digits", n_layers=2, positions=positions)).eval()
    model = MultimodalTransformer.from_vit(vit, head="digit")
    pixels = image(B=3)
    with torch.no_grad():
        torch.testing.assert_close(model({"image": pixels}).heads["digit"], vit(pixels).logits, atol=1e-5, rtol=0)
        # patch Tokens from the model's own tokenizer settings give the same answer
        tokens = Tokens(features=__import__("tokenizers_mm").patchify(pixels, 8), grid=(4, 4), modality="image")
        torch.testing.assert_close(model({"image": tokens}).heads["digit"], vit(pixels).logits, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="distill_token"):
        MultimodalTransformer.from_vit(ViT(ViTConfig.from_name("deit-digits", n_layers=1)))


def test_a_one_segment_model_keeps_what_its_source_read_raw_input_with(tmp_path):
    # the GPT's tokenizer and the ViT's class names are stored by no config: built from them, the
    # multimodal model carries them, saves them and reads raw text / names its classes as they did
    import ast

    from tokenizers_mm import BPETokenizer, Processor

    tok = BPETokenizer.train(iterator=[Path(ast.__file__).read_text()], vocab_size=300)
    gpt = GPT(GPTConfig(vocab_size=tok.vocab_size, context_length=16, d_model=32, n_layers=1, n_heads=4))
    gpt.processor = Processor(text=tok)
    model = MultimodalTransformer.from_gpt(gpt)
    assert model.processor.text == tok
    model.save_pretrained(tmp_path / "gpt")
    assert MultimodalTransformer.from_pretrained(tmp_path / "gpt").processor.text == tok
    vit = ViT(ViTConfig.from_name("vit-digits", n_layers=1))
    vit.processor = Processor(labels=tuple("0123456789"))
    assert MultimodalTransformer.from_vit(vit).processor.labels == tuple("0123456789")
    assert MultimodalTransformer.from_vit(ViT(ViTConfig.from_name("vit-digits", n_layers=1))).processor.labels is None


def test_one_trajectory_segment_is_a_decision_transformer():
    torch.manual_seed(0)
    dt = DecisionTransformer(DecisionTransformerConfig(state_dim=STATE, act_dim=ACTIONS, discrete=True, d_model=32,
                                                       n_layers=2, n_heads=2, context_length=K, max_ep_len=64,
                                                       dropout=0.0)).eval()
    model = MultimodalTransformer.from_decision_transformer(dt)
    windows = trajectory(B=3)
    mask = windows.attention_mask.clone()
    mask[1, :2] = 0  # left padding of a window at an episode's start
    windows = TrajectoryWindows(**{**windows.as_dict(), "attention_mask": mask})
    with torch.no_grad():
        ours = model({"trajectory": windows}).heads["action"]
        theirs = dt(**windows.model_inputs()).action_preds
    torch.testing.assert_close(ours[mask.bool()], theirs[mask.bool()], atol=1e-5, rtol=0)
    # float64 states are named, as every family that reads float features names them
    doubled = TrajectoryWindows(**{**windows.as_dict(), "states": windows.states.double()})
    with pytest.raises(TypeError, match="segment 'trajectory' states"):
        model({"trajectory": doubled})
    returns = windows.returns_to_go.clone()
    returns[0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="segment 'trajectory' returns_to_go contain 1 NaN/inf"):
        model({"trajectory": TrajectoryWindows(**{**windows.as_dict(), "returns_to_go": returns})})


# --------------------------------------------------------------------------- packing


def test_packing_rules_causal_prefix_bidirectional_and_padding():
    x = lambda n: torch.zeros(1, n, 4)  # noqa: E731
    ones = lambda n: torch.ones(1, n, dtype=torch.bool)  # noqa: E731
    a_mask = torch.tensor([[True, True, False]])
    packed = pack_segments([Segment("a", x(3), a_mask), Segment("c", x(2), ones(2)),
                            Segment("t", x(3), ones(3), causal=True), Segment("b", x(2), ones(2))])
    m = packed.mask[0, 0]
    a, c, t, b = slice(0, 3), slice(3, 5), slice(5, 8), slice(8, 10)
    assert [s.start for s in packed.spans.values()] == [0, 3, 5, 8]
    assert m[a, 0:2].all() and not m[:, 2][[0, 1, 3, 4, 5, 6, 7, 8, 9]].any()  # the padding key is hidden
    assert m[a, c][:2].all() and m[c, a][:, :2].all()  # adjacent bidirectional segments see each other
    assert m[t, a][:, :2].all() and m[t, c].all()  # the causal segment sees earlier segments in full
    assert torch.equal(m[t, t], torch.ones(3, 3, dtype=torch.bool).tril())  # ... and itself causally
    assert not m[a, t].any() and not m[c, t].any()  # nothing earlier reads a causal segment
    # nor a segment after it, which reads the causal tokens in full: that would leak their future
    assert not m[a, b].any() and not m[c, b].any() and not m[t, b].any()
    assert m[b, t].all() and m[b, c].all()  # a later segment sees everything before it
    assert m.diagonal().all()  # even the padding query sees itself: no NaN rows
    # Plain cases keep the fused kernel's fast path: no mask tensor at all.
    assert pack_segments([Segment("a", x(3), ones(3)), Segment("b", x(2), ones(2))]).mask is None
    plain_causal = pack_segments([Segment("t", x(3), ones(3), causal=True), Segment("u", x(2), ones(2), causal=True)])
    assert plain_causal.mask is None and plain_causal.is_causal
    with pytest.raises(ValueError, match="same batch size"):
        pack_segments([Segment("a", x(3), ones(3)), Segment("b", torch.zeros(2, 2, 4), torch.ones(2, 2))])


def test_text_after_an_image_reads_it_but_never_its_own_future():
    model = four_modalities()
    ids = text(n=8)
    changed = Tokens(ids=ids.ids.clone())
    changed.ids[:, 5] = (changed.ids[:, 5] + 1) % V
    other_image = image(seed=9)
    with torch.no_grad():
        base = model({"image": image(), "text": ids})
        later = model({"image": image(), "text": changed})
        new_image = model({"image": other_image, "text": ids})
    torch.testing.assert_close(later.heads["lm"][:, :5], base.heads["lm"][:, :5], atol=0, rtol=0)
    assert not torch.allclose(later.heads["lm"][:, 5:], base.heads["lm"][:, 5:])
    torch.testing.assert_close(later.heads["digit"], base.heads["digit"], atol=0, rtol=0)  # the image never reads text
    assert not torch.allclose(new_image.heads["lm"][:, 0], base.heads["lm"][:, 0])  # text reads the image


def test_image_and_audio_read_each_other_and_padding_changes_nothing():
    model = four_modalities()
    with torch.no_grad():
        base = model({"image": image(), "audio": audio()})
        other_audio = model({"image": image(), "audio": audio(seed=7)})
        # Row 1's padded frames hold garbage: its outputs must not change.
        noisy = audio()
        features = noisy.features.clone()
        features[1, 44:] = 5.0
        padded = model({"image": image(), "audio": Tokens(features=features, attention_mask=noisy.attention_mask)})
    assert not torch.allclose(other_audio.heads["digit"], base.heads["digit"])  # the image's class token hears
    torch.testing.assert_close(padded.heads["digit"], base.heads["digit"], atol=1e-6, rtol=0)
    seg = base.segments["audio"]
    assert seg.lengths.tolist() == [14, 10] and base.heads["ctc"].shape == (2, seg.hidden.shape[1], 4)
    assert base.segments["image"].start == 0 and seg.start == base.segments["image"].stop == 17


def test_every_head_reads_its_segment_and_every_parameter_learns():
    model = four_modalities().train()
    out = model({"image": image(), "audio": audio(), "text": text(), "trajectory": trajectory()})
    shapes = {name: tuple(value.shape) for name, value in out.heads.items()}
    assert shapes == {"digit": (2, 10), "match": (2, 2), "lm": (2, 7, V), "ctc": (2, 14, 4),
                      "act": (2, K, ACTIONS), "embed": (2, 8)}
    assert out.last_hidden_state.shape == (2, 17 + 14 + 7 + 3 * K, 32)
    sum(v.float().pow(2).mean() for v in out.heads.values()).backward()
    silent = [n for n, p in model.named_parameters() if p.grad is None or float(p.grad.abs().sum()) == 0]
    assert not silent, silent
    # Heads default to those whose segment is present; asked-for ones must have theirs.
    assert set(model({"image": image()}).heads) == {"digit", "match"}
    assert set(model({"image": image()}, heads=["digit"]).heads) == {"digit"}


def test_the_modality_embedding_tells_segments_apart():
    model = four_modalities()
    plain = four_modalities(modality_embedding=False)
    assert plain.modality_embed is None and model.modality_embed.weight.shape == (4, 32)
    with torch.no_grad():
        seg = model.embed_segment("text", text())
        model.modality_embed.weight[model.modality_index["text"]].add_(1.0)
        shifted = model.embed_segment("text", text())
    torch.testing.assert_close(shifted.embeddings - seg.embeddings, torch.ones_like(seg.embeddings))


# --------------------------------------------------------------------------- checkpoints and configs


def test_save_and_load_round_trip_with_tied_lm_head(tmp_path):
    model = four_modalities()
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["family"] == "MultimodalTransformer" and saved["modalities"]["audio"]["kind"] == "audio"
    loaded = MultimodalTransformer.from_pretrained(tmp_path)
    assert not loaded.training  # ready to use: in eval mode as loaded
    assert loaded.config == model.config
    assert loaded.heads["lm"].weight is loaded.embedders["text"].tok_embed.weight
    inputs = {"image": image(), "audio": audio(), "text": text(), "trajectory": trajectory()}
    with torch.no_grad():
        a, b = model(inputs), loaded(inputs)
    for name in a.heads:
        torch.testing.assert_close(a.heads[name], b.heads[name], atol=0, rtol=0)


def test_an_audio_segments_spectrogram_settings_equal_themselves_after_a_save_and_load(tmp_path):
    # global normalisation stores one mean and std per mel bin: tuples here, lists in config.json
    spectrogram = SpectrogramConfig(n_mels=16, normalize="global", global_mean=(0.5,) * 16, global_std=(2.0,) * 16)
    config = MultimodalConfig(modalities={"audio": AudioModality(n_mels=16, spectrogram=spectrogram.to_dict())},
                              heads={"asr": CTCHeadConfig(vocabulary=tuple("ab "))}, d_model=32, n_layers=1, n_heads=4)
    MultimodalTransformer(config).save_pretrained(tmp_path)
    loaded = MultimodalTransformer.from_pretrained(tmp_path)
    assert loaded.config == config and loaded.config.modalities == config.modalities
    assert loaded.processor.audio == spectrogram
    # settings given in part are stored whole, at the segment's n_mels
    partial = AudioModality(n_mels=16, spectrogram={"hop_ms": 20.0})
    assert partial.spectrogram == SpectrogramConfig(n_mels=16, hop_ms=20.0).to_dict()
    with pytest.raises(ValueError, match="global_mean / global_std need 16 values"):
        AudioModality(n_mels=16, spectrogram={"normalize": "global", "global_mean": [0.0], "global_std": [1.0]})


def test_configs_are_data_and_say_what_is_wrong():
    config = MultimodalConfig.from_name("mm-tiny", modalities={"text": {"kind": "text", "vocab_size": 10}},
                                        heads={"lm": {"kind": "lm", "segment": "text"}})
    assert config.d_model == 64 and isinstance(config.modalities["text"], TextModality)
    assert MultimodalConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    with pytest.raises(ValueError, match="unknown kind 'video'"):
        MultimodalConfig(modalities={"v": {"kind": "video"}})
    with pytest.raises(ValueError, match="not a modality"):
        MultimodalConfig(modalities={"text": TextModality()}, heads={"c": CTCHeadConfig(vocabulary=("a",))})
    with pytest.raises(ValueError, match="reads a audio segment, but 'text' is text"):
        MultimodalConfig(modalities={"text": TextModality()}, heads={"c": CTCHeadConfig(segment="text",
                                                                                       vocabulary=("a",))})
    with pytest.raises(ValueError, match="must be causal"):
        MultimodalConfig(modalities={"text": TextModality(causal=False)}, heads={"lm": LMHeadConfig()})
    with pytest.raises(ValueError, match="not divisible by patch_size"):
        ImageModality(image_size=(30, 32))
    with pytest.raises(ValueError, match="needs at least one modality"):
        MultimodalConfig()


def test_load_backbone_and_freeze_it():
    model = four_modalities(norm_eps=1e-6)  # a ViT's LayerNorm epsilon
    vit = ViT(ViTConfig.from_name("vit-digits", n_layers=2, d_model=32, n_heads=4))
    model.load_backbone(vit)
    torch.testing.assert_close(model.backbone.blocks[0].sublayers["attn"].qkv.weight,
                               vit.backbone.blocks[0].sublayers["attn"].qkv.weight)
    model.freeze_backbone()
    assert not any(p.requires_grad for p in model.backbone.parameters())
    assert all(p.requires_grad for p in model.embedders.parameters())
    with pytest.raises(TypeError, match="takes a Backbone"):
        model.load_backbone(torch.nn.Linear(2, 2))


def test_load_backbone_refuses_a_stack_that_computes_something_else():
    # Same parameter names and shapes, another function: each would load and silently change the outputs.
    def backbone(**fields):
        return Backbone(BackboneConfig(**{"d_model": 32, "n_layers": 2, "n_heads": 4, **fields}))
    model = four_modalities()
    for source, message in [
        (DecisionTransformer(DecisionTransformerConfig(d_model=32, n_layers=2, n_heads=4)),
         r"activation='relu' \(this model: 'gelu'\)"),
        (GPT(GPTConfig(vocab_size=V, context_length=16, d_model=32, n_layers=2, n_heads=4)),
         r"activation='gelu_tanh' \(this model: 'gelu'\)"),
        (backbone(norm_position="post", attn_scale=1.0, norm_eps=1e-12),
         r"attn_scale=1.0 \(this model: None\), norm_eps=1e-12 \(this model: 1e-05\), "
         r"norm_position='post' \(this model: 'pre'\)"),
        (backbone(n_heads=8), r"n_heads=8 \(this model: 4\)"),
        (backbone(norm="rmsnorm"), r"norm='rmsnorm' \(this model: 'layernorm'\)"),
        (ViT(ViTConfig.from_name("vit-digits", n_layers=2, d_model=32, n_heads=4)),
         r"norm_eps=1e-06 \(this model: 1e-05\)"),
    ]:
        with pytest.raises(ValueError, match="this backbone was built differently from the multimodal model's: "
                                             + message):
            model.load_backbone(source)
    # what a stack does not compute with may differ: causality (the segments set it), dropout,
    # and defaults spelled out
    model.load_backbone(backbone(causal=True, dropout=0.1, attn_dropout=0.1, d_ff=128, attn_scale=8 ** -0.5))
    gpt = GPT(GPTConfig(vocab_size=V, context_length=16, d_model=32, n_layers=2, n_heads=4))
    four_modalities(activation=gpt.config.activation).load_backbone(gpt)
    MultimodalTransformer.from_gpt(gpt).load_backbone(gpt)  # from_gpt carries the GPT's activation


# --------------------------------------------------------------------------- bad input


def test_left_padded_audio_is_refused_not_read_as_right_padded():
    # the front end reads each utterance's first frames: left padding would mask real frames out
    model = four_modalities()
    right = audio()
    left = Tokens(features=right.features.flip(1), attention_mask=right.attention_mask.flip(1), modality="audio")
    with pytest.raises(ValueError, match="segment 'audio' must be right-padded"):
        model({"audio": left})
    model({"audio": right})


@pytest.mark.parametrize("segment, modality", [
    ("audio", AudioModality(n_mels=16, max_frames=32)),
    ("text", TextModality(vocab_size=V, max_positions=16)),  # causal: its first token sees only itself
    ("image", ImageModality(class_token=False)),
    ("image", ImageModality(causal=True)),  # a class token first in a causal segment sees only itself
])
def test_a_classifier_reading_a_first_token_that_summarises_nothing_is_refused(segment, modality):
    with pytest.raises(ValueError, match=f"head 'c' pools segment '{segment}' by its first token .pool='cls'."):
        MultimodalConfig(modalities={segment: modality}, heads={"c": ClassifierHeadConfig(segment=segment)})
    MultimodalConfig(modalities={segment: modality}, heads={"c": ClassifierHeadConfig(segment=segment, pool="mean")})
    MultimodalConfig(modalities={"text": TextModality(vocab_size=V, causal=False)},  # BERT's [CLS] is a summary
                     heads={"c": ClassifierHeadConfig(segment="text")})


def test_bad_input_is_a_clear_error():
    model = four_modalities()
    with pytest.raises(ValueError, match="unknown modality 'video'; this model reads image, audio, text, trajectory"):
        model({"video": image()})
    with pytest.raises(ValueError, match="segment 'text' is text: it reads Tokens with ids, got audio Tokens"):
        model({"text": audio()})
    with pytest.raises(ValueError, match="segment 'audio' is audio: it reads Tokens of log-mel frames"):
        model({"audio": text()})
    with pytest.raises(ValueError, match="segment 'trajectory' is a trajectory: it reads TrajectoryWindows"):
        model({"trajectory": text()})
    with pytest.raises(ValueError, match="same batch size, got {'image': 3, 'text': 2}"):
        model({"image": image(B=3), "text": text(B=2)})
    with pytest.raises(ValueError, match="text segment of 17 tokens is longer than its 16 positions"):
        model({"text": text(n=17)})
    ids = text(n=3).ids
    for positions, shown in (([[0, 1, 16]] * 2, "0..16"), ([[-1, 0, 1]] * 2, "-1..1")):  # -1 would read the last row
        with pytest.raises(ValueError, match=f"text positions must lie in 0..15 .*, got {shown}"):
            model({"text": Tokens(ids=ids, positions=torch.tensor(positions))})
    with pytest.raises(ValueError, match="more than the 32 configured"):
        model({"audio": audio(lengths=(200, 200))})
    with pytest.raises(ValueError, match="head 'ctc' reads segment 'audio', which this batch does not have"):
        model({"image": image()}, heads=["ctc"])
    with pytest.raises(ValueError, match="unknown head 'nope'"):
        model({"image": image()}, heads=["nope"])
    with pytest.raises(TypeError, match="heads must be a list of head names, got the string 'digit'"):
        model({"image": image()}, heads="digit")
    windows = trajectory()
    empty = TrajectoryWindows(**{k: (v[:, :0] if isinstance(v, torch.Tensor) and v.dim() > 1 else v)
                                 for k, v in windows.as_dict().items()})
    with pytest.raises(ValueError, match="segment 'trajectory' is empty"):
        model({"trajectory": empty})
    with pytest.raises(TypeError, match="segment 'trajectory' timesteps must be integers"):
        model({"trajectory": TrajectoryWindows(**{**windows.as_dict(), "timesteps": windows.timesteps.float()})})
    bad = image()
    bad[0, 0, 3, 3] = float("nan")
    with pytest.raises(ValueError, match="pixels contain 1 NaN"):
        model({"image": bad})
    frames = audio()
    frames.features[0, 2, 1] = float("inf")
    with pytest.raises(ValueError, match="frames contain 1 NaN/inf"):
        model({"audio": frames})
    with pytest.raises(ValueError, match="expects 1 channels"):
        model({"image": torch.randn(2, 3, 32, 32)})
    with pytest.raises(ValueError, match="non-empty mapping"):
        model({})


@pytest.mark.parametrize("eps", [0.0, -1e-5])
def test_a_trajectory_embedding_norm_epsilon_that_is_not_positive_is_refused(eps):
    # as the Decision Transformer's: ≤ 0 makes a constant embedded token NaN
    with pytest.raises(ValueError, match=f"embed_norm_eps must be a finite number > 0, got {eps}"):
        TrajectoryModality(embed_norm_eps=eps)
    assert TrajectoryModality(embed_norm_eps=1e-12).embed_norm_eps == 1e-12


def test_an_action_head_needs_a_causal_trajectory_segment():
    # bidirectional, each step's state token would read the action it is asked to predict
    with pytest.raises(ValueError, match="action head 'act' .* segment 'trajectory' must be causal"):
        MultimodalConfig(modalities={"trajectory": TrajectoryModality(causal=False)},
                         heads={"act": ActionHeadConfig(segment="trajectory")})


def bidirectional_text_classifier() -> MultimodalTransformer:
    torch.manual_seed(0)
    config = MultimodalConfig(modalities={"text": TextModality(vocab_size=V, max_positions=8, causal=False)},
                              heads={"cls": ClassifierHeadConfig(segment="text", num_classes=3),
                                     "embed": ProjectionHeadConfig(segment="text", embed_dim=4, pool="cls")},
                              d_model=32, n_layers=2, n_heads=4)
    return MultimodalTransformer(config).eval()


def test_a_rows_outputs_do_not_depend_on_its_padding_or_its_batch():
    # a row alone, right-padded beside a longer row, or left-padded even past max_positions (its
    # real tokens fit): the same class scores and embeddings, read from its own [CLS]
    model = bidirectional_text_classifier()
    row = torch.randint(0, V, (1, 5), generator=torch.Generator().manual_seed(4))
    longer = torch.randint(0, V, (1, 8), generator=torch.Generator().manual_seed(5))
    pad = torch.zeros(1, 3, dtype=torch.long)
    right = Tokens(ids=torch.cat([torch.cat([row, pad], 1), longer]),
                   attention_mask=torch.tensor([[1] * 5 + [0] * 3, [1] * 8]))
    left = Tokens(ids=torch.cat([torch.zeros(1, 7, dtype=torch.long), row], 1), attention_mask=torch.tensor([[0] * 7 + [1] * 5]))
    with torch.no_grad():
        alone = model({"text": row}).heads
        for batch in (model({"text": right}).heads, model({"text": left}).heads):
            for head in ("cls", "embed"):
                torch.testing.assert_close(batch[head][:1], alone[head], atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="a text segment of 9 tokens is longer than its 8 positions"):
        model({"text": Tokens(ids=torch.zeros(1, 9, dtype=torch.long), attention_mask=torch.ones(1, 9))})


def test_trajectory_actions_of_the_wrong_kind_are_refused_by_segment():
    model = four_modalities()
    windows = trajectory()
    with pytest.raises(ValueError, match=r"segment 'trajectory' reads discrete action ids of shape \(B, K\) = \(2, 6\), "
                                         r"got \(2, 6, 1\)"):
        model({"trajectory": TrajectoryWindows(**{**windows.as_dict(), "actions": windows.actions[..., None]})})
    continuous = MultimodalTransformer(MultimodalConfig(
        modalities={"trajectory": TrajectoryModality(state_dim=STATE, act_dim=ACTIONS, discrete=False, context_length=K)},
        heads={"act": ActionHeadConfig(segment="trajectory")}, d_model=32, n_layers=1, n_heads=4))
    with pytest.raises(TypeError, match=r"segment 'trajectory' has continuous actions: floats of shape \(B, K, 3\), "
                                        r"got torch.int64"):
        continuous({"trajectory": windows})
    with pytest.raises(ValueError, match=r"segment 'trajectory': states have 5 dimensions, the trajectory embedder 4"):
        model({"trajectory": TrajectoryWindows(**{**windows.as_dict(), "states": torch.randn(2, K, 5)})})


def test_a_too_short_utterance_is_named_by_segment_row_and_frames():
    with pytest.raises(ValueError, match=r"segment 'audio': rows \[1\] have \[5\] frames, too short for the ×4 subsampling"):
        four_modalities()({"audio": audio(lengths=(60, 5))})


def test_a_segment_without_return_tokens_reads_windows_without_returns():
    torch.manual_seed(0)
    model = MultimodalTransformer(MultimodalConfig(
        modalities={"trajectory": TrajectoryModality(state_dim=STATE, act_dim=ACTIONS, context_length=K,
                                                     condition_on_returns=False)},
        heads={"act": ActionHeadConfig(segment="trajectory")}, d_model=32, n_layers=1, n_heads=4)).eval()
    windows = trajectory()
    without = TrajectoryWindows(**{**windows.as_dict(), "returns_to_go": None})
    torch.testing.assert_close(model({"trajectory": without}).heads["act"], model({"trajectory": windows}).heads["act"])


def test_an_audio_segment_mask_of_other_values_than_1_and_0_is_refused():
    model = four_modalities()
    bad = audio()
    bad = Tokens(features=bad.features, attention_mask=bad.attention_mask * 2, modality="audio")
    with pytest.raises(ValueError, match=r"segment 'audio' attention_mask holds \[2\]: expected 1 for a real token"):
        model({"audio": bad})


def test_text_patch_and_trajectory_masks_of_other_values_than_1_and_0_are_refused():
    # a 0/2 or an additive (0 / -1e9) mask would be read as something else: positions counted by the
    # mask, the padding taken for the only real tokens
    model = four_modalities()
    ids = text().ids
    for bad in (torch.full_like(ids, 2), torch.where(torch.rand(ids.shape) < 0.5, 0.0, -1e9)):
        with pytest.raises(ValueError, match=r"segment 'text' attention_mask holds .*expected 1 for a real token"):
            model({"text": Tokens(ids=ids, attention_mask=bad)})
    patches = PatchTokenizer(model.default_processor().image).encode(torch.rand(2, 1, 32, 32))
    with pytest.raises(ValueError, match=r"segment 'image' attention_mask holds \[-1000000000.0\]"):
        model({"image": Tokens(features=patches.features, grid=patches.grid,
                               attention_mask=torch.full(patches.features.shape[:2], -1e9))})
    windows = trajectory()
    with pytest.raises(ValueError, match=r"segment 'trajectory' attention_mask holds \[2\]"):
        model({"trajectory": TrajectoryWindows(**{**windows.as_dict(), "attention_mask": windows.attention_mask * 2})})


def test_padded_patches_of_an_image_segment_are_not_read():
    # patch padding (a batch of images with fewer patches in one row): the padded patches change nothing
    model = four_modalities()
    patches = PatchTokenizer(model.default_processor().image).encode(torch.rand(2, 1, 32, 32))
    mask = torch.ones(patches.features.shape[:2], dtype=torch.long)
    mask[1, -4:] = 0
    noisy = patches.features.clone()
    noisy[1, -4:] = 100.0  # what the padding holds must not matter
    with torch.no_grad():
        a = model({"image": Tokens(features=patches.features, grid=patches.grid, attention_mask=mask)}).heads["digit"]
        b = model({"image": Tokens(features=noisy, grid=patches.grid, attention_mask=mask)}).heads["digit"]
        unmasked = model({"image": Tokens(features=noisy, grid=patches.grid)}).heads["digit"]
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    assert not torch.allclose(unmasked[1], b[1], atol=1e-3)  # unmasked, the same patches do change it


def test_returns_to_go_of_another_shape_are_refused_by_segment():
    model = four_modalities()
    windows = trajectory()
    with pytest.raises(ValueError, match=r"segment 'trajectory' returns_to_go must be \(batch, steps\) or "
                                         r"\(batch, steps, 1\) = \(2, 6\) or \(2, 6, 1\), got \(2, 6, 2\)"):
        model({"trajectory": TrajectoryWindows(**{**windows.as_dict(), "returns_to_go": torch.randn(2, K, 2)})})
    flat = TrajectoryWindows(**{**windows.as_dict(), "returns_to_go": windows.returns_to_go[..., 0]})
    torch.testing.assert_close(model({"trajectory": flat}).heads["act"], model({"trajectory": windows}).heads["act"])


def test_an_utterance_fits_by_its_real_frames_whatever_its_batch_pads_to():
    # 100 real frames give 24 positions (max_frames 32); padded to 200 frames beside a row of the
    # same length, it is read as when alone
    model = four_modalities()
    alone = audio(lengths=(100,))
    padded = Tokens(features=torch.cat([alone.features, torch.zeros(1, 100, 16)], 1),
                    attention_mask=torch.cat([alone.attention_mask, torch.zeros(1, 100, dtype=torch.long)], 1),
                    modality="audio")
    with torch.no_grad():
        torch.testing.assert_close(model({"audio": padded}).heads["embed"], model({"audio": alone}).heads["embed"],
                                   atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="segment 'audio': an utterance gives 49 subsampled positions, more than the 32"):
        model({"audio": audio(lengths=(200, 100))})


def test_segment_and_head_names_are_module_names():
    for modalities, heads in (({"my.text": TextModality(vocab_size=V)}, {}),
                              ({"": TextModality(vocab_size=V)}, {}),
                              ({"text": TextModality(vocab_size=V)}, {"a.b": LMHeadConfig(segment="text")})):
        with pytest.raises(ValueError, match="names must be non-empty strings without a '.'"):
            MultimodalConfig(modalities=modalities, heads=heads, d_model=32, n_layers=1, n_heads=4)


def test_two_image_segments_of_different_settings_save_a_folder_that_loads(tmp_path):
    # the processor is the first image segment's by name: the order a saved config.json lists them in
    torch.manual_seed(0)
    model = MultimodalTransformer(MultimodalConfig(
        modalities={"zscan": ImageModality(image_size=32, patch_size=8, channels=1),
                    "aphoto": ImageModality(image_size=16, patch_size=8, channels=3, mean=(0.5,) * 3, std=(0.5,) * 3)},
        heads={"digit": ClassifierHeadConfig(segment="zscan", num_classes=10)},
        d_model=32, n_layers=1, n_heads=4)).eval()
    model.save_pretrained(tmp_path)
    loaded = MultimodalTransformer.from_pretrained(tmp_path)
    assert loaded.processor.image.channels == 3 and tuple(loaded.processor.image.image_size) == (16, 16)
    pixels = {"zscan": torch.randn(2, 1, 32, 32), "aphoto": torch.randn(2, 3, 16, 16)}
    torch.testing.assert_close(loaded(pixels).heads["digit"], model(pixels).heads["digit"])
