"""Importers carry the reference's dropout rates into the unitok fields that drop at the same
sites (eval outputs never depend on them; fine-tuning does), and refuse, naming option and
value, a rate unitok cannot reproduce rather than merging or dropping it."""

from __future__ import annotations

import pytest
import timm
import torchaudio
from open_clip.model import CLIP as OpenCLIP
from open_clip.model import CLIPTextCfg, CLIPVisionCfg

from tests.conftest import small_gpt2
from tests.unitok.convert.test_bert_equivalence import bert_config
from tests.unitok.convert.test_decision_transformer_equivalence import small_hf_dt
from tests.unitok.convert.test_t5_equivalence import hf_t5
from unitok.convert import (
    from_open_clip,
    from_timm,
    from_torchaudio,
    from_transformers,
    to_timm,
    to_torchaudio,
)
from unitok.convert.dropout import one_rate
from unitok.models import ConformerConfig, ConformerCTC, ViT, ViTConfig

transformers = pytest.importorskip("transformers")

TIMM_SMALL = dict(pretrained=False, img_size=32, patch_size=8, depth=2, num_classes=3)


# ------------------------------------------------------------------ Hugging Face
@pytest.mark.parametrize("build", [small_gpt2, small_hf_dt], ids=["gpt2", "decision-transformer"])
def test_gpt2_family_equal_rates_are_carried(build):
    ours = from_transformers(build(embd_pdrop=0.15, attn_pdrop=0.15, resid_pdrop=0.15))
    assert ours.config.dropout == 0.15
    backbone = ours.config.backbone_config()
    assert backbone.dropout == backbone.attn_dropout == 0.15 and ours.drop.p == 0.15


@pytest.mark.parametrize("build, family", [(small_gpt2, "GPT-2"), (small_hf_dt, "Decision Transformer")],
                         ids=["gpt2", "decision-transformer"])
def test_gpt2_family_distinct_rates_are_refused_by_name_and_value(build, family):
    # one rate used to stand for all three (resid_pdrop's), the others silently replaced
    with pytest.raises(ValueError, match=f"{family} dropout embd_pdrop=0.05, attn_pdrop=0.1, resid_pdrop=0.2: "):
        from_transformers(build(embd_pdrop=0.05, attn_pdrop=0.1, resid_pdrop=0.2))


def test_bert_hidden_attention_and_classifier_rates_are_carried_apart():
    hf = transformers.BertForSequenceClassification(bert_config(hidden_dropout_prob=0.1,
                                                                attention_probs_dropout_prob=0.2,
                                                                classifier_dropout=0.3, num_labels=3))
    config = from_transformers(hf).config
    assert (config.dropout, config.attn_dropout, config.classifier_dropout) == (0.1, 0.2, 0.3)


def test_t5_rate_is_carried():
    ours = from_transformers(hf_t5("v1.0", dropout_rate=0.15))
    backbone = ours.config.backbone_config(decoder=False)
    assert ours.config.dropout == backbone.dropout == backbone.attn_dropout == backbone.mlp_dropout == 0.15


# ------------------------------------------------------------------ timm
@pytest.mark.parametrize("options, message", [
    (dict(proj_drop_rate=0.1), r"proj_drop_rate \(MLP hidden layer\)=0.1"),
    (dict(pos_drop_rate=0.1, attn_drop_rate=0.1), r"pos_drop_rate=0.1, attn_drop_rate=0.1, "
                                                  r"proj_drop_rate \(attention output\)=0,"),
    (dict(drop_rate=0.25), r"drop_rate \(before the head\)=0.25"),
    (dict(drop_path_rate=0.1), r"drop_path_rate \(stochastic depth\)=0…0.1"),
    (dict(patch_drop_rate=0.5), r"patch_drop_rate=0.5"),
], ids=["proj-drop", "pos-and-attn-without-proj", "head-drop", "drop-path", "patch-drop"])
def test_timm_vit_rates_unitok_cannot_reproduce_are_refused_by_name_and_value(options, message):
    theirs = timm.create_model("vit_tiny_patch16_224", **TIMM_SMALL, **options)
    with pytest.raises(ValueError, match=f"not supported by unitok: dropout .*{message}"):
        from_timm(theirs)


def test_timm_vit_rate_at_unitoks_sites_is_carried():
    theirs = timm.create_model("vit_tiny_patch16_224", **TIMM_SMALL, pos_drop_rate=0.1, attn_drop_rate=0.1,
                               proj_drop_rate=0.1)
    for block in theirs.blocks:  # unitok's ViT drops nothing inside the MLP
        block.mlp.drop1.p = 0.0
    assert from_timm(theirs).config.dropout == 0.1


def test_vit_dropout_survives_the_round_trip_through_timm():
    ours = ViT(ViTConfig(image_size=(32, 32), patch_size=8, num_classes=3, d_model=32, n_layers=2, n_heads=2,
                         dropout=0.1))
    theirs = to_timm(ours)
    block = theirs.blocks[0]
    assert (theirs.pos_drop.p, block.attn.attn_drop.p, block.attn.proj_drop.p, block.mlp.drop2.p) == (0.1,) * 4
    assert block.mlp.drop1.p == 0.0 and theirs.head_drop.p == 0.0
    assert from_timm(theirs).config.dropout == 0.1


@pytest.mark.parametrize("options, message", [
    (dict(proj_drop_rate=0.1), "proj_drop_rate=0.1"),
    (dict(drop_rate=0.2), r"drop_rate \(before the head\)=0.2"),
    (dict(drop_path_rate=0.1), r"drop_path_rate \(stochastic depth\)=0.1"),
], ids=["proj-drop", "head-drop", "drop-path"])
def test_timm_mixer_rates_are_refused_by_name_and_value(options, message):
    theirs = timm.models.mlp_mixer.MlpMixer(num_classes=3, img_size=32, patch_size=8, num_blocks=2, embed_dim=16,
                                           **options)
    with pytest.raises(ValueError, match=f"not supported by unitok: dropout .*{message}"):
        from_timm(theirs)


# ------------------------------------------------------------------ open_clip, torchaudio
def test_open_clip_patch_dropout_is_refused_by_value():
    theirs = OpenCLIP(embed_dim=16, vision_cfg=CLIPVisionCfg(layers=1, width=32, head_width=16, patch_size=8,
                                                             image_size=16, patch_dropout=0.5),
                      text_cfg=CLIPTextCfg(context_length=8, vocab_size=50, width=32, heads=2, layers=1))
    with pytest.raises(ValueError, match="not supported by unitok: patch_dropout=0.5"):
        from_open_clip(theirs)


def _conformer(dropout: float) -> torchaudio.models.Conformer:
    return torchaudio.models.Conformer(input_dim=16, num_heads=2, ffn_dim=32, num_layers=2,
                                       depthwise_conv_kernel_size=3, dropout=dropout)


def test_torchaudio_rate_is_carried_and_round_trips():
    ours = from_torchaudio(_conformer(0.15))
    assert ours.config.dropout == 0.15  # it was always 0
    backbone = ours.config.backbone_config()
    assert backbone.dropout == backbone.attn_dropout == backbone.mlp_dropout == 0.15
    config = ConformerConfig(n_mels=16, subsampling="none", d_model=16, n_layers=1, n_heads=2, conv_kernel_size=3,
                             conv_mask_padding=False, dropout=0.2)
    assert from_torchaudio(*to_torchaudio(ConformerCTC(config))).config.dropout == 0.2


def test_torchaudio_rates_that_differ_by_module_are_refused():
    theirs = _conformer(0.1)
    theirs.conformer_layers[1].self_attn_dropout.p = 0.3
    with pytest.raises(ValueError, match="not supported by unitok: dropout=0.1…0.3 differing by module"):
        from_torchaudio(theirs)


# ------------------------------------------------------------------ the rule itself
def test_one_rate_needs_shared_sites_equal_and_absent_sites_zero():
    assert one_rate({"a": [0.1], "b": [0.1, 0.1]}, {"c": [0.0]}) == (0.1, [])
    assert one_rate({"a": [0.1], "b": [0.2]}) == (0.0, ["a=0.1", "b=0.2"])
    assert one_rate({"a": [0.0]}, {"c": [0.0, 0.3]}) == (0.0, ["c=0…0.3"])
    assert one_rate({}, {}) == (0.0, [])
