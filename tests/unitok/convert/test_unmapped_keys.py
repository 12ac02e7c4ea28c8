"""Every importer reads the whole reference: a tensor its key map has no place for (a gate, an
extra head, a part unitok lacks) is refused by name, never dropped; buffers the reference
rebuilds and tied aliases of a tensor it reads are not parameters and convert."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import timm
import torch
import torchaudio
from open_clip.model import CLIP as OpenCLIP
from open_clip.model import CLIPTextCfg, CLIPVisionCfg
from torch import nn

from tests.conftest import small_gpt2
from tests.unitok.convert.test_bert_equivalence import bert_config, electra_config
from tests.unitok.convert.test_decision_transformer_equivalence import small_hf_dt
from tests.unitok.convert.test_t5_equivalence import hf_t5
from unitok.convert import from_open_clip, from_timm, from_torchaudio, from_transformers
from unitok.convert.bert import convert_bert_state
from unitok.convert.gpt2 import gpt2_state_dict
from unitok.convert.keymap import KeyRule, refuse_unmapped

transformers = pytest.importorskip("transformers")


def _with_extra(model: nn.Module, where: str) -> tuple[nn.Module, list[str]]:
    """``model`` with a parameter and a buffer added to its submodule ``where`` (keys returned)."""
    module = model.get_submodule(where)
    module.register_parameter("extra_gate", nn.Parameter(torch.zeros(3)))
    module.register_buffer("extra_scale", torch.ones(2))
    return model, [f"{where}.extra_gate", f"{where}.extra_scale"]


def _open_clip() -> nn.Module:
    return OpenCLIP(embed_dim=16, vision_cfg=CLIPVisionCfg(layers=1, width=32, head_width=16, patch_size=8,
                                                           image_size=16),
                    text_cfg=CLIPTextCfg(context_length=8, vocab_size=50, width=32, heads=2, layers=1)).eval()


MODELS: dict[str, tuple[Callable[[], nn.Module], str, Callable]] = {
    "gpt2-lm-head": (small_gpt2, "transformer.h.0.attn", from_transformers),
    "gpt2-model": (lambda: transformers.GPT2Model(small_gpt2().config), "h.1.mlp", from_transformers),
    "decision-transformer": (small_hf_dt, "embed_ln", from_transformers),
    "bert-pretraining": (lambda: transformers.BertForPreTraining(bert_config()), "cls.predictions",
                         from_transformers),
    "bert-model": (lambda: transformers.BertModel(bert_config()), "encoder.layer.1.attention.self",
                   from_transformers),
    "electra-generator": (lambda: transformers.ElectraForMaskedLM(electra_config()), "electra.embeddings",
                          from_transformers),
    "t5": (lambda: hf_t5("v1.0"), "decoder.block.1.layer.1", from_transformers),
    "t5-untied": (lambda: hf_t5("v1.1"), "encoder.final_layer_norm", from_transformers),
    "t5-encoder": (lambda: transformers.T5EncoderModel(hf_t5("v1.0").config), "encoder.block.0.layer.0",
                   from_transformers),
    "open-clip": (_open_clip, "visual.transformer.resblocks.0", from_open_clip),
    "torchaudio": (lambda: torchaudio.models.Conformer(input_dim=16, num_heads=2, ffn_dim=32, num_layers=2,
                                                       depthwise_conv_kernel_size=3),
                   "conformer_layers.1.conv_module", from_torchaudio),
    "timm-vit": (lambda: timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8,
                                           depth=1, num_classes=3), "blocks.0.attn", from_timm),
    "timm-mixer": (lambda: timm.models.mlp_mixer.MlpMixer(num_classes=3, img_size=32, patch_size=8, num_blocks=1,
                                                          embed_dim=16), "stem", from_timm),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_the_reference_converts_without_extras(name):
    build, _, convert = MODELS[name]
    torch.manual_seed(0)
    convert(build())


@pytest.mark.parametrize("name", list(MODELS))
def test_a_tensor_the_key_map_does_not_read_is_refused_by_name(name):
    build, where, convert = MODELS[name]
    torch.manual_seed(0)
    model, extra = _with_extra(build(), where)
    with pytest.raises(ValueError, match="parameters unitok has no place for") as caught:
        convert(model)
    for key in extra:
        assert key in str(caught.value)


def _bert_state(cls: str):
    torch.manual_seed(0)
    model = getattr(transformers, cls)(bert_config())
    return model.config, dict(model.state_dict())


@pytest.mark.parametrize("cls, extras", [
    ("BertModel", ["encoder.layer.0.attention.self.gate", "pooler.extra.weight"]),
    ("BertForSequenceClassification", ["bert.encoder.layer.1.output.gate", "classifier_2.weight"]),
    ("BertForMaskedLM", ["cls.predictions.transform.gate", "cls.seq_relationship.weight"]),
], ids=["bare", "encoder-and-head", "head-of-another-class"])
def test_state_dict_entry_point_refuses_extra_tensors_in_each_part(cls, extras):
    config, state = _bert_state(cls)
    state.update({key: torch.zeros(2) for key in extras})
    with pytest.raises(ValueError, match=f"{cls} checkpoint: parameters unitok has no place for") as caught:
        convert_bert_state(config, state, cls)
    for key in extras:
        assert key in str(caught.value)


def test_state_dict_entry_point_accepts_the_buffers_older_checkpoints_keep():
    config, state = _bert_state("BertForMaskedLM")
    state["bert.embeddings.position_ids"] = torch.arange(config.max_position_embeddings)[None]
    state["bert.embeddings.token_type_ids"] = torch.zeros(1, config.max_position_embeddings, dtype=torch.long)
    convert_bert_state(config, state, "BertForMaskedLM")


def test_gpt2_state_dict_accepts_causal_mask_buffers_and_refuses_the_rest():
    state = dict(transformers.GPT2Model(small_gpt2().config).state_dict())
    state["h.0.attn.bias"] = torch.ones(1, 1, 64, 64, dtype=torch.bool).tril()
    state["h.1.attn.masked_bias"] = torch.tensor(-1e4)
    assert "tok_embed.weight" in gpt2_state_dict(state, 2)
    state["lm_head.weight"] = state["wte.weight"]  # an LM head is the caller's to read
    with pytest.raises(ValueError, match="GPT-2 checkpoint: parameters unitok has no place for: lm_head.weight"):
        gpt2_state_dict(state, 2)


def test_refuse_unmapped_ignores_whole_keys_and_dotted_tails_and_lists_the_rest():
    rules = [KeyRule("a.weight", "x.weight")]
    state = {"a.weight": torch.zeros(1), "h.0.attn.bias": torch.zeros(1), "h.1.attn.bias": torch.zeros(1),
             "wte": torch.zeros(1), "xattn.bias": torch.zeros(1)}
    with pytest.raises(ValueError, match=r"^ref: parameters unitok has no place for: xattn.bias$"):
        refuse_unmapped(rules, state, "ref", ignore=("attn.bias", "wte"))
    many = {f"k{i}": torch.zeros(1) for i in range(9)}
    with pytest.raises(ValueError, match=r"k0, k1, k2, k3, k4, k5 … \(9 in all\)$"):
        refuse_unmapped(rules, many, "ref")
    refuse_unmapped(rules, {"a.weight": torch.zeros(1)}, "ref")
