"""GPT-2 (`GPT2LMHeadModel`, `GPT2Model`) <-> unitok `GPT`.

GPT-2 stores its linear layers as ``Conv1D`` with weights (in, out): they are transposed.
Its fused ``c_attn`` already packs q, k, v in our order. One key map (`gpt2_rules`) serves
both directions: `convert_gpt2` imports, `export_gpt` builds a ``GPT2LMHeadModel``.
"""

from __future__ import annotations

from typing import Any

import torch

from unitok.convert.dropout import one_rate
from unitok.convert.keymap import (
    KeyRule,
    invert,
    leaves,
    load_reference,
    placed_like,
    refuse_unmapped,
    to_ours,
    to_theirs,
)
from unitok.convert.transformers import (
    register_transformers_converter,
    register_transformers_exporter,
)
from unitok.models.base import load_state_dict_strict
from unitok.models.gpt import GPT, GPTConfig

_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu",
                "silu": "silu", "swish": "silu", "quick_gelu": "quick_gelu"}
# Causal-mask buffers some transformers versions keep in the state dict: rebuilt, not weights.
CAUSAL_MASK_BUFFERS = ("attn.bias", "attn.masked_bias")


def gpt2_dropout(hf_config: Any, family: str = "GPT-2") -> float:
    """GPT-2's ``embd_pdrop`` (embeddings), ``attn_pdrop`` (attention weights) and ``resid_pdrop``
    (residual branches) as the one rate unitok's GPT and Decision Transformer drop those three
    at; ValueError naming them when they differ (GPT-2's checkpoints set all three alike)."""
    names = ("embd_pdrop", "attn_pdrop", "resid_pdrop")
    rate, rejected = one_rate({name: [getattr(hf_config, name)] for name in names})
    if rejected:
        raise ValueError(f"{family} dropout {', '.join(rejected)}: unitok drops embeddings, attention weights and "
                         "residual branches at one rate (dropout); set the three equal before converting")
    return rate


def gpt2_config(hf_config: Any) -> GPTConfig:
    """Translate a `GPT2Config`, refusing options unitok's GPT does not implement."""
    unsupported = {
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "add_cross_attention": False,
        "scale_attn_weights": True,
    }
    for key, expected in unsupported.items():
        if getattr(hf_config, key, expected) != expected:
            raise ValueError(f"GPT-2 option {key}={getattr(hf_config, key)} is not supported (expected {expected})")
    act = hf_config.activation_function
    if act not in _ACTIVATIONS:
        raise ValueError(f"GPT-2 activation {act!r} has no unitok equivalent; known: {sorted(_ACTIVATIONS)}")
    eos = getattr(hf_config, "eos_token_id", None)
    pad = getattr(hf_config, "pad_token_id", None)
    return GPTConfig(
        vocab_size=hf_config.vocab_size,
        context_length=hf_config.n_positions,
        d_model=hf_config.n_embd,
        n_layers=hf_config.n_layer,
        n_heads=hf_config.n_head,
        d_ff=hf_config.n_inner,
        activation=_ACTIVATIONS[act],  # type: ignore[arg-type]
        norm_eps=hf_config.layer_norm_epsilon,
        dropout=gpt2_dropout(hf_config),
        eos_token_id=eos if eos is not None and eos < hf_config.vocab_size else None,
        pad_token_id=pad if pad is not None and pad < hf_config.vocab_size else None,
    )


# Per-layer names: Hugging Face sub-path -> unitok sub-path under backbone.blocks.{i}.sublayers.
_LAYER_KEYS = {
    "ln_1": "attn.norm", "attn.c_attn": "attn.qkv", "attn.c_proj": "attn.proj",
    "ln_2": "mlp.norm", "mlp.c_fc": "mlp.fc_in", "mlp.c_proj": "mlp.fc_out",
}
_CONV1D = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")  # weights stored (in, out)


def gpt2_rules(n_layers: int, prefix: str = "", embeddings: bool = True) -> list[KeyRule]:
    """The GPT-2 key map (reference keys under ``prefix``, e.g. "transformer."); ``embeddings``
    includes the token and position tables."""
    rules = [KeyRule(f"{prefix}wte.weight", "tok_embed.weight"),
             KeyRule(f"{prefix}wpe.weight", "pos_embed.weight")] if embeddings else []
    rules += leaves(f"{prefix}ln_f", "backbone.norm")
    for i in range(n_layers):
        for theirs, ours in _LAYER_KEYS.items():
            src, dst = f"{prefix}h.{i}.{theirs}", f"backbone.blocks.{i}.sublayers.{ours}"
            # Conv1D weights are (in, out); nn.Linear wants (out, in). LayerNorm weights are 1-D.
            rules += [KeyRule(f"{src}.weight", f"{dst}.weight", transpose=theirs in _CONV1D),
                      KeyRule(f"{src}.bias", f"{dst}.bias")]
    return rules


def gpt2_state_dict(hf_state: dict[str, torch.Tensor], n_layers: int) -> dict[str, torch.Tensor]:
    """Rename (and transpose) a `GPT2Model`'s weights (keys bare or under "transformer.") into
    unitok's key layout; ValueError naming any other tensor (an LM head is the caller's to read)."""
    prefix = "transformer." if any(k.startswith("transformer.") for k in hf_state) else ""
    rules = gpt2_rules(n_layers, prefix)
    refuse_unmapped(rules, hf_state, "GPT-2 checkpoint", ignore=CAUSAL_MASK_BUFFERS)
    return to_ours(rules, hf_state, {})


@register_transformers_converter("GPT2LMHeadModel", "GPT2Model")
def convert_gpt2(hf_model: Any) -> GPT:
    config = gpt2_config(hf_model.config)
    state = dict(hf_model.state_dict())
    lm_head = state.pop("lm_head.weight", None)
    untied = lm_head is not None and not torch.equal(lm_head, state["transformer.wte.weight"])
    model = GPT(config.replace(tie_embeddings=not untied))
    ours = gpt2_state_dict(state, config.n_layers)
    if untied:
        ours["lm_head.weight"] = lm_head.detach()
    load_state_dict_strict(model, ours, ignore=model.tied_keys)
    return model.to(next(hf_model.parameters()).dtype)


def gpt2_hf_config(config: GPTConfig) -> Any:
    """A `GPT2Config` for a unitok `GPTConfig`; ValueError naming a field GPT-2 cannot express."""
    from transformers import GPT2Config

    if config.positions != "learned":
        raise ValueError(f"GPTConfig.positions={config.positions!r} has no GPT-2 equivalent (GPT-2 learns "
                         "its position table: positions='learned')")
    if not config.bias:
        raise ValueError("GPTConfig.bias=False has no GPT-2 equivalent (its linears and LayerNorms have biases)")
    eos, pad = config.eos_token_id, config.pad_token_id
    return GPT2Config(
        vocab_size=config.vocab_size, n_positions=config.context_length, n_embd=config.d_model,
        n_layer=config.n_layers, n_head=config.n_heads, n_inner=config.d_ff,
        activation_function=invert(_ACTIVATIONS)[config.activation], layer_norm_epsilon=config.norm_eps,
        resid_pdrop=config.dropout, embd_pdrop=config.dropout, attn_pdrop=config.dropout,
        bos_token_id=eos, eos_token_id=eos, pad_token_id=pad, tie_word_embeddings=config.tie_embeddings,
    )


@register_transformers_exporter(GPT)
def export_gpt(model: GPT) -> Any:
    """unitok `GPT` -> ``transformers.GPT2LMHeadModel`` with the same logits (eval mode)."""
    from transformers import GPT2LMHeadModel

    hf_model = GPT2LMHeadModel(gpt2_hf_config(model.config))
    rules = gpt2_rules(model.config.n_layers, prefix="transformer.")
    if not model.config.tie_embeddings:
        rules.append(KeyRule("lm_head.weight", "lm_head.weight"))
    load_reference(hf_model, to_theirs(rules, model.state_dict(), hf_model.state_dict()))
    return placed_like(hf_model, model)
