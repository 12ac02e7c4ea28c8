"""Weights out: `to_transformers`, `to_timm`, `to_open_clip` and `to_torchaudio` turn random unitok
models into the reference implementations' models with the same outputs (float32, atol 1e-5);
reference -> unitok -> reference and unitok -> reference -> unitok keep every weight; what a
reference cannot express is refused by field (ValueError), an unsupported model by type (TypeError)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import small_gpt2
from tests.unitok.convert.perturb import perturbed
from unitok.convert import (
    TorchaudioConformer,
    from_open_clip,
    from_timm,
    from_torchaudio,
    from_transformers,
    to_open_clip,
    to_timm,
    to_torchaudio,
    to_transformers,
)
from unitok.models import (
    BERT,
    CLIP,
    GPT,
    T5,
    BERTConfig,
    CLIPConfig,
    ConformerConfig,
    ConformerCTC,
    DecisionTransformer,
    DecisionTransformerConfig,
    DeiT,
    GPTConfig,
    MixerConfig,
    MLPMixer,
    T5Config,
    T5Encoder,
    ViT,
    ViTConfig,
)

transformers = pytest.importorskip("transformers")
timm = pytest.importorskip("timm")
open_clip = pytest.importorskip("open_clip")
torchaudio = pytest.importorskip("torchaudio")

ATOL = 1e-5


def assert_same(ours: torch.Tensor, theirs: torch.Tensor, mask: torch.Tensor | None = None) -> None:
    if mask is not None:
        ours, theirs = ours[mask.bool()], theirs[mask.bool()]
    torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=0)


def assert_same_state(a: torch.nn.Module, b: torch.nn.Module, skip: tuple[str, ...] = ()) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        if key not in skip:
            assert torch.equal(sa[key], sb[key]), key


def ids_and_mask(vocab: int, batch: int = 3, length: int = 11, low: int = 1):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(low, vocab, (batch, length), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 8:], mask[2, 4:] = 0, 0
    return ids, mask


# ---------------------------------------------------------------------------------------- GPT
@pytest.mark.parametrize("options", [{}, dict(tie_embeddings=False, activation="gelu", d_ff=48, norm_eps=1e-6)],
                         ids=["tied", "untied-gelu-custom-ff"])
def test_gpt_exports_to_gpt2(options):
    ours = perturbed(GPT(GPTConfig(vocab_size=61, context_length=32, d_model=32, n_layers=2, n_heads=4,
                                   eos_token_id=2, **options)))
    hf = to_transformers(ours)
    assert type(hf).__name__ == "GPT2LMHeadModel" and not hf.training
    ids, mask = ids_and_mask(61)
    with torch.no_grad():
        assert_same(ours(ids).logits, hf(ids).logits)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        assert_same(ours(ids, attention_mask=mask).logits,
                    hf(ids, attention_mask=mask, position_ids=positions).logits, mask)
    assert_same_state(from_transformers(hf), ours)


def test_gpt2_round_trip_keeps_the_reference_weights():
    hf = perturbed(small_gpt2())
    back = to_transformers(from_transformers(hf))
    assert_same_state(back, hf)


# --------------------------------------------------------------------------------------- BERT
# case: (heads, config options, the Hugging Face class, [(our output, theirs)] compared)
BERT_CASES = {
    "pretraining": (("pooler", "mlm", "nsp"), {}, "BertForPreTraining",
                    [("mlm_logits", "prediction_logits"), ("nsp_logits", "seq_relationship_logits")]),
    "masked-lm": (("mlm",), dict(activation="gelu_tanh"), "BertForMaskedLM", [("mlm_logits", "logits")]),
    "encoder": ((), dict(type_vocab_size=3), "BertModel", []),
    "pooler": (("pooler",), {}, "BertModel", [("pooled", "pooler_output")]),
    "sequence-classifier": (("pooler", "classifier"), dict(num_labels=3), "BertForSequenceClassification",
                            [("logits", "logits")]),
    "token-classifier": (("token_classifier",), dict(num_labels=4), "BertForTokenClassification",
                         [("logits", "logits")]),
    "question-answering": (("span",), {}, "BertForQuestionAnswering",
                           [("start_logits", "start_logits"), ("end_logits", "end_logits")]),
    "electra-discriminator": (("rtd",), dict(embedding_size=16), "ElectraForPreTraining", [("rtd_logits", "logits")]),
    "electra-generator": (("mlm",), dict(embedding_size=16), "ElectraForMaskedLM", [("mlm_logits", "logits")]),
}


def small_bert(heads, **options) -> BERT:
    config = BERTConfig(vocab_size=67, context_length=32, d_model=32, n_layers=2, n_heads=4, d_ff=48, dropout=0.0,
                        attn_dropout=0.0, heads=heads, **options)
    return perturbed(BERT(config))


@pytest.mark.parametrize("case", list(BERT_CASES), ids=list(BERT_CASES))
def test_bert_exports_to_the_class_of_its_heads(case):
    heads, options, architecture, outputs = BERT_CASES[case]
    ours = small_bert(heads, **options)
    hf = to_transformers(ours)
    assert type(hf).__name__ == architecture and not hf.training
    ids, mask = ids_and_mask(67)
    seg = torch.zeros_like(ids)
    seg[:, 5:] = 1
    with torch.no_grad():
        out = ours(ids, attention_mask=mask, segment_ids=seg)
        ref = hf(ids, attention_mask=mask, token_type_ids=seg, output_hidden_states=True)
    assert_same(out.last_hidden_state, ref.hidden_states[-1], mask)
    for mine, theirs in outputs:
        mine, theirs = getattr(out, mine), getattr(ref, theirs)
        assert_same(mine, theirs, mask if mine.shape[:2] == mask.shape else None)
    assert_same_state(from_transformers(hf), ours)


def test_bert_round_trip_keeps_the_reference_weights():
    config = transformers.BertConfig(vocab_size=67, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=48, max_position_embeddings=32)
    hf = perturbed(transformers.BertForPreTraining(config))
    assert_same_state(to_transformers(from_transformers(hf)), hf)


def test_bert_heads_without_a_class_need_an_explicit_architecture():
    ours = small_bert(("pooler", "mlm"))
    with pytest.raises(ValueError, match=r"heads=\('pooler', 'mlm'\).*architecture="):
        to_transformers(ours)
    hf = to_transformers(ours, architecture="BertForMaskedLM")  # the pooler is left out
    ids, mask = ids_and_mask(67)
    with torch.no_grad():
        assert_same(ours(ids, attention_mask=mask).mlm_logits, hf(ids, attention_mask=mask).logits, mask)
    with pytest.raises(ValueError, match=r"lacks \['nsp'\]"):
        to_transformers(ours, architecture="BertForPreTraining")


def test_bert_without_segment_embeddings_exports_one_zero_segment_row():
    ours = small_bert(("mlm",), type_vocab_size=0)
    hf = to_transformers(ours)
    assert hf.config.type_vocab_size == 1 and not hf.bert.embeddings.token_type_embeddings.weight.any()
    ids, mask = ids_and_mask(67)
    with torch.no_grad():
        assert_same(ours(ids, attention_mask=mask).mlm_logits, hf(ids, attention_mask=mask).logits, mask)


def test_bert_fields_the_class_cannot_express_are_named():
    with pytest.raises(ValueError, match="embedding_size=16"):
        to_transformers(small_bert(("mlm",), embedding_size=16), architecture="BertForMaskedLM")
    with pytest.raises(ValueError, match="activation='relu'"):
        to_transformers(small_bert(("mlm",), embedding_size=16, activation="relu"))
    mixed = small_bert(("token_classifier",), num_labels=3, classifier_layers=(0, 2))  # a layer-mix classifier
    with pytest.raises(ValueError, match=r"classifier_layers=\(0, 2\)\), which BertForTokenClassification cannot"):
        to_transformers(mixed)
    encoder = to_transformers(mixed, architecture="BertModel")  # the encoder alone, as stated
    ids, mask = ids_and_mask(67)
    with torch.no_grad():
        assert_same(mixed(ids, attention_mask=mask).last_hidden_state,
                    encoder(ids, attention_mask=mask).last_hidden_state, mask)


# ----------------------------------------------------------------------------------------- T5
T5_CASES = {"v1.0": {}, "v1.1": dict(activation="gelu_tanh", gated=True, tie_embeddings=False),
            "gated-exact-gelu-deeper-decoder": dict(activation="gelu", gated=True, n_decoder_layers=3)}


@pytest.mark.parametrize("case", list(T5_CASES), ids=list(T5_CASES))
def test_t5_exports_to_conditional_generation(case):
    config = T5Config(vocab_size=53, d_model=32, d_kv=8, n_layers=2, n_heads=4, d_ff=48, relative_buckets=8,
                      relative_max_distance=20, dropout=0.0, **T5_CASES[case])
    ours = perturbed(T5(config))
    hf = to_transformers(ours)
    assert type(hf).__name__ == "T5ForConditionalGeneration" and not hf.training
    ids, mask = ids_and_mask(53, low=2)
    target = torch.randint(2, 53, (3, 6))
    with torch.no_grad():
        out = ours(ids, attention_mask=mask, decoder_input_ids=target).logits
        ref = hf(input_ids=ids, attention_mask=mask, decoder_input_ids=target).logits
    assert_same(out, ref)
    assert_same_state(from_transformers(hf), ours)
    assert_same_state(to_transformers(from_transformers(hf)), hf)


def test_t5_encoder_exports_to_t5_encoder_model():
    ours = perturbed(T5Encoder(T5Config(vocab_size=53, d_model=32, d_kv=8, n_layers=2, n_heads=4, d_ff=48,
                                        dropout=0.0)))
    hf = to_transformers(ours)
    ids, mask = ids_and_mask(53, low=2)
    with torch.no_grad():
        assert_same(ours(ids, attention_mask=mask).last_hidden_state,
                    hf(ids, attention_mask=mask).last_hidden_state, mask)
    assert_same_state(from_transformers(hf), ours)


# ------------------------------------------------------------------------ Decision Transformer
@pytest.mark.parametrize("options", [{}, dict(activation="gelu_tanh", action_tanh=False, embed_norm_eps=1e-6),
                                     dict(discrete=True)], ids=["continuous", "no-tanh-eps", "discrete"])
def test_decision_transformer_exports(options):
    config = DecisionTransformerConfig(state_dim=5, act_dim=3, d_model=32, n_layers=2, n_heads=4, max_ep_len=40,
                                       dropout=0.0, **options)
    ours = perturbed(DecisionTransformer(config))
    hf = to_transformers(ours)
    assert type(hf).__name__ == "DecisionTransformerModel" and not hf.training
    B, K = 3, 6
    states, rtg = torch.randn(B, K, 5), torch.randn(B, K, 1)
    timesteps, mask = torch.randint(0, 40, (B, K)), torch.ones(B, K, dtype=torch.long)
    mask[1, :2] = 0  # left padding
    if config.discrete:  # the reference reads one-hot actions and predicts the same logits
        actions = torch.randint(0, 3, (B, K))
        out = ours(states, actions, rtg, timesteps, mask)
        actions = F.one_hot(actions, 3).float()
    else:
        actions = torch.rand(B, K, 3) * 2 - 1
        out = ours(states, actions, rtg, timesteps, mask)
    with torch.no_grad():
        ref = hf(states=states, actions=actions, returns_to_go=rtg, timesteps=timesteps, attention_mask=mask)
    for mine, theirs in ((out.action_preds, ref.action_preds), (out.state_preds, ref.state_preds),
                         (out.return_preds, ref.return_preds)):
        assert_same(mine.detach(), theirs, mask)
    back = from_transformers(hf)
    assert_same_state(back, ours)
    again = to_transformers(back)  # the wpe[0] row lives in the LayerNorm bias: equal weights again
    assert_same_state(again, hf)


def test_decision_transformer_round_trip_from_the_reference():
    config = transformers.DecisionTransformerConfig(state_dim=5, act_dim=3, hidden_size=32, n_layer=2, n_head=4,
                                                    max_ep_len=40, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    hf = perturbed(transformers.DecisionTransformerModel(config))
    back = to_transformers(from_transformers(hf))
    # wpe[0] is folded into embed_ln.bias on the way in (and wte is unused): the rest is equal.
    assert_same_state(back, hf, skip=("encoder.wpe.weight", "encoder.wte.weight", "embed_ln.bias"))
    states, actions, rtg = torch.randn(2, 4, 5), torch.rand(2, 4, 3), torch.randn(2, 4, 1)
    timesteps, mask = torch.randint(0, 40, (2, 4)), torch.ones(2, 4, dtype=torch.long)
    with torch.no_grad():
        a = hf(states=states, actions=actions, returns_to_go=rtg, timesteps=timesteps, attention_mask=mask)
        b = back(states=states, actions=actions, returns_to_go=rtg, timesteps=timesteps, attention_mask=mask)
    assert_same(a.action_preds, b.action_preds)
    assert_same(a.state_preds, b.state_preds)


# --------------------------------------------------------------------------------------- timm
VISION = dict(image_size=(32, 32), patch_size=8, num_classes=5, d_model=32, n_layers=2, n_heads=4)
VIT_CASES = {
    "cls-token": (ViT, {}),
    "avg-pool-no-class-token": (ViT, dict(pool="avg", class_token=False)),
    "registers-positions-after-prefix": (ViT, dict(num_registers=2, positions_cover_prefix=False)),
    "no-positions-pre-norm-gelu-tanh": (ViT, dict(positions="none", pre_norm=True, activation="gelu_tanh", d_ff=40)),
    "quick-gelu-no-patch-bias-one-channel": (ViT, dict(activation="quick_gelu", patch_bias=False, channels=1,
                                                       mean=(0.5,), std=(0.5,), norm_eps=1e-5)),
    "pre-norm-with-patch-bias": (ViT, dict(pre_norm=True, patch_bias=True)),
    "deit-distilled": (DeiT, dict(distill_token=True)),
}


@pytest.mark.parametrize("case", list(VIT_CASES), ids=list(VIT_CASES))
def test_vit_and_deit_export_to_timm(case):
    cls, options = VIT_CASES[case]
    ours = perturbed(cls(ViTConfig(**{**VISION, **options})))
    theirs = to_timm(ours)
    assert type(theirs).__name__ == ("VisionTransformerDistilled" if cls is DeiT else "VisionTransformer")
    assert not theirs.training and theirs.pretrained_cfg["mean"] == ours.config.mean
    pixels = torch.randn(2, ours.config.channels, 32, 32)
    with torch.no_grad():
        assert_same(ours(pixels).logits, theirs(pixels))
    back = from_timm(theirs)
    assert type(back) is cls
    assert_same_state(back, ours)


def test_mixer_exports_to_timm():
    ours = perturbed(MLPMixer(MixerConfig(image_size=(32, 32), patch_size=8, num_classes=5, d_model=24, n_layers=2,
                                          token_mlp_dim=10, d_ff=50, activation="silu", norm_eps=1e-5)))
    theirs = to_timm(ours)
    assert type(theirs).__name__ == "MlpMixer"
    pixels = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert_same(ours(pixels).logits, theirs(pixels))
    assert_same_state(from_timm(theirs), ours)


@pytest.mark.parametrize("name, options", [
    ("vit_tiny_patch16_224", {}),
    ("vit_tiny_patch16_224", dict(global_pool="avg", class_token=False, reg_tokens=2)),
    ("deit_tiny_distilled_patch16_224", {}),
    ("mixer", dict(num_blocks=2, embed_dim=32)),
], ids=["vit", "vit-avg-registers", "deit", "mixer"])
def test_timm_round_trip_keeps_the_reference_weights(name, options):
    small = dict(num_classes=5, img_size=32, patch_size=8, **options)
    if name == "mixer":
        theirs = perturbed(timm.models.mlp_mixer.MlpMixer(**small))
    else:
        theirs = perturbed(timm.create_model(name, pretrained=False, depth=2, **small))
    back = to_timm(from_timm(theirs))
    assert type(back) is type(theirs)
    assert_same_state(back, theirs)


# ---------------------------------------------------------------------------------- open_clip
CLIP_TEXT = dict(vocab_size=61, eot_token_id=60, context_length=12, d_model=24, n_layers=2, n_heads=4)
CLIP_CASES = {
    "openai-style": {},
    "eos-pool-one-channel-quick-gelu-fc-norm": dict(
        vision=dict(**VISION | dict(num_classes=0, channels=1, mean=(0.5,), std=(0.5,), crop_pct=None,
                                    fc_norm=True, pre_norm=False, activation="quick_gelu", patch_bias=True, d_ff=40)),
        text=CLIP_TEXT | dict(eot_token_id=5, activation="quick_gelu", norm_eps=1e-6)),
    "shared-backbone": dict(shared_backbone=True, text=CLIP_TEXT | dict(d_model=32)),
}


def small_clip(**options) -> CLIP:
    fields = dict(embed_dim=16, vision=VISION | dict(num_classes=0), text=CLIP_TEXT)
    return perturbed(CLIP(CLIPConfig(**(fields | options))))


def captions(eot: int) -> torch.Tensor:
    ids = torch.randint(6, 60, (3, 12))
    ids[0, 4], ids[1, 11], ids[2, 0] = eot, eot, eot
    ids[0, 5:] = 0
    return ids


@pytest.mark.parametrize("case", list(CLIP_CASES), ids=list(CLIP_CASES))
def test_clip_exports_to_open_clip(case):
    ours = small_clip(**CLIP_CASES[case])
    theirs = to_open_clip(ours)
    assert type(theirs).__name__ == "CLIP" and not theirs.training
    pixels = torch.randn(2, ours.config.vision.channels, 32, 32)
    ids = captions(ours.config.text.eot_token_id)
    with torch.no_grad():
        assert_same(ours.encode_image(pixels), theirs.encode_image(pixels))
        assert_same(ours.encode_text(ids), theirs.encode_text(ids))
    assert torch.equal(theirs.logit_scale.detach(), ours.logit_scale.detach())
    assert_same_state(from_open_clip(theirs), ours)


def test_open_clip_round_trip_keeps_the_reference_weights():
    vision = open_clip.model.CLIPVisionCfg(layers=2, width=32, head_width=8, patch_size=8, image_size=32)
    text = open_clip.model.CLIPTextCfg(context_length=12, vocab_size=61, width=24, heads=4, layers=2)
    theirs = perturbed(open_clip.model.CLIP(embed_dim=16, vision_cfg=vision, text_cfg=text))
    assert_same_state(to_open_clip(from_open_clip(theirs)), theirs)


def test_clip_fields_open_clip_cannot_hold_are_named():
    with pytest.raises(ValueError, match="CLIPConfig.audio"):
        to_open_clip(small_clip(audio=dict(n_mels=16, d_model=16, n_layers=1, n_heads=2)))
    with pytest.raises(ValueError, match="projection_bias"):
        to_open_clip(small_clip(projection_bias=True))
    with pytest.raises(ValueError, match="text.activation"):
        to_open_clip(small_clip(text=CLIP_TEXT | dict(activation="quick_gelu")))
    with pytest.raises(ValueError, match="vision.num_registers"):
        to_open_clip(small_clip(vision=VISION | dict(num_classes=0, num_registers=1)))


# --------------------------------------------------------------------------------- torchaudio
@pytest.mark.parametrize("options", [{}, dict(conv_norm="groupnorm", norm_eps=1e-6), dict(convolution_first=True)],
                         ids=["batchnorm", "groupnorm-eps", "convolution-first"])
def test_conformer_exports_to_torchaudio(options):
    config = ConformerConfig(n_mels=32, subsampling="none", d_model=32, n_layers=2, n_heads=4, d_ff=48,
                             conv_kernel_size=7, conv_mask_padding=False, dropout=0.0, vocabulary=tuple("abcde"),
                             **options)
    ours = perturbed(ConformerCTC(config))  # with non-trivial running statistics: eval-mode BatchNorm matters
    exported = to_torchaudio(ours)
    assert isinstance(exported, TorchaudioConformer) and type(exported.conformer).__name__ == "Conformer"
    assert not exported.conformer.training and exported.ctc_head.out_features == 6
    frames, lengths = torch.randn(3, 20, 32), torch.tensor([20, 13, 7])
    with torch.no_grad():
        out = ours(frames, lengths)
        hidden, their_lengths = exported.conformer(frames, lengths)
    real = torch.arange(20)[None, :] < lengths[:, None]
    assert torch.equal(out.lengths, their_lengths)
    assert_same(out.last_hidden_state, hidden, real)
    assert_same(out.logits, exported.ctc_head(hidden), real)
    back = from_torchaudio(*exported, vocabulary=config.vocabulary)
    assert_same_state(back, ours)


def test_torchaudio_round_trip_keeps_the_reference_weights():
    theirs = perturbed(torchaudio.models.Conformer(input_dim=32, num_heads=4, ffn_dim=48, num_layers=2,
                                                   depthwise_conv_kernel_size=7, use_group_norm=True))
    head = perturbed(torch.nn.Linear(32, 6))
    conformer, ctc_head = to_torchaudio(from_torchaudio(theirs, head))
    assert_same_state(conformer, theirs)
    assert_same_state(ctc_head, head)
    assert to_torchaudio(from_torchaudio(theirs)).ctc_head is None


def test_conformer_with_a_front_end_exports_only_when_not_strict():
    config = ConformerConfig(n_mels=16, d_model=32, n_layers=1, n_heads=4, conv_kernel_size=7, dropout=0.0,
                             vocabulary=tuple("ab"))
    ours = perturbed(ConformerCTC(config))
    with pytest.raises(ValueError, match="subsampling='conv2d4'"):
        to_torchaudio(ours)
    with pytest.raises(ValueError, match="conv_mask_padding=True"):
        to_torchaudio(ConformerCTC(config.replace(subsampling="none", n_mels=32)))
    conformer, head = to_torchaudio(ours, strict=False)  # the blocks read the front end's output
    frames, lengths = torch.randn(2, 40, 16), torch.tensor([40, 40])
    with torch.no_grad():
        out = ours(frames, lengths)
        x, sub_lengths = ours.frontend(frames, lengths)
        hidden, _ = conformer(x, sub_lengths)
    assert_same(out.last_hidden_state, hidden)
    assert_same(out.logits, head(hidden))


# ------------------------------------------------------------------------------------- errors
def test_unsupported_model_types_are_refused_by_type():
    vit = ViT(ViTConfig(**VISION))
    gpt = GPT(GPTConfig(vocab_size=11, context_length=8, d_model=8, n_layers=1, n_heads=2))
    with pytest.raises(TypeError, match=r"ViT.*supported unitok classes: .*BERT.*DecisionTransformer.*GPT.*T5"):
        to_transformers(vit)
    with pytest.raises(TypeError, match=r"GPT.*ViT, DeiT, MLPMixer"):
        to_timm(gpt)
    with pytest.raises(TypeError, match=r"GPT.*CLIP"):
        to_open_clip(gpt)
    with pytest.raises(TypeError, match=r"ViT.*ConformerCTC"):
        to_torchaudio(vit)


@pytest.mark.parametrize("model, message", [
    (lambda: GPT(GPTConfig(vocab_size=11, context_length=8, d_model=8, n_layers=1, n_heads=2,
                           positions="sinusoidal")), "GPTConfig.positions='sinusoidal'"),
    (lambda: GPT(GPTConfig(vocab_size=11, context_length=8, d_model=8, n_layers=1, n_heads=2, bias=False)),
     "GPTConfig.bias=False"),
    (lambda: T5(T5Config(vocab_size=11, d_model=8, d_kv=4, n_layers=1, n_heads=2, d_ff=16, n_mels=8)),
     "T5Config.n_mels=8"),
    (lambda: DecisionTransformer(DecisionTransformerConfig(state_dim=2, act_dim=2, d_model=8, n_layers=1,
                                                           n_heads=2, predict_state=False)),
     "predict_state=False"),
    (lambda: DecisionTransformer(DecisionTransformerConfig(state_dim=2, act_dim=2, d_model=8, n_layers=1,
                                                           n_heads=2, condition_on_returns=False)),
     "condition_on_returns=False"),
], ids=["gpt-sinusoidal", "gpt-no-bias", "t5-speech", "dt-no-state-head", "dt-no-returns"])
def test_transformers_fields_without_an_equivalent_are_named(model, message):
    with pytest.raises(ValueError, match=message):
        to_transformers(model())


@pytest.mark.parametrize("options, message", [
    (dict(positions="sincos"), "ViTConfig.positions='sincos'"),
    (dict(bias=False), "ViTConfig.bias=False"),
    (dict(distill_token=True, num_registers=1), "ViTConfig.num_registers=1"),
], ids=["sincos", "no-bias", "deit-registers"])
def test_timm_fields_without_an_equivalent_are_named(options, message):
    with pytest.raises(ValueError, match=message):
        to_timm(ViT(ViTConfig(**{**VISION, **options})))
