"""GPT-2 (`GPT2LMHeadModel`, `GPT2Model`) -> unitok `GPT`.

GPT-2 stores its linear layers as ``Conv1D`` with weights (in, out): they are transposed.
Its fused ``c_attn`` already packs q, k, v in our order.
"""

from __future__ import annotations

from typing import Any

import torch

from unitok.convert.transformers import register_transformers_converter
from unitok.models.base import load_state_dict_strict
from unitok.models.gpt import GPT, GPTConfig

_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu",
                "silu": "silu", "swish": "silu", "quick_gelu": "quick_gelu"}


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
        dropout=0.0,
        eos_token_id=eos if eos is not None and eos < hf_config.vocab_size else None,
        pad_token_id=pad if pad is not None and pad < hf_config.vocab_size else None,
    )


def gpt2_state_dict(hf_state: dict[str, torch.Tensor], n_layers: int) -> dict[str, torch.Tensor]:
    """Rename (and transpose) GPT-2 weights into unitok's key layout."""
    state = {k.removeprefix("transformer."): v for k, v in hf_state.items()}
    out = {
        "tok_embed.weight": state["wte.weight"],
        "pos_embed.weight": state["wpe.weight"],
        "backbone.norm.weight": state["ln_f.weight"],
        "backbone.norm.bias": state["ln_f.bias"],
    }
    for i in range(n_layers):
        src, dst = f"h.{i}.", f"backbone.blocks.{i}.sublayers."
        pairs = {
            "ln_1": "attn.norm", "attn.c_attn": "attn.qkv", "attn.c_proj": "attn.proj",
            "ln_2": "mlp.norm", "mlp.c_fc": "mlp.fc_in", "mlp.c_proj": "mlp.fc_out",
        }
        for hf_name, ours in pairs.items():
            weight = state[f"{src}{hf_name}.weight"]
            # Conv1D weights are (in, out); nn.Linear wants (out, in). LayerNorm weights are 1-D.
            out[f"{dst}{ours}.weight"] = weight.t().contiguous() if weight.dim() == 2 else weight
            out[f"{dst}{ours}.bias"] = state[f"{src}{hf_name}.bias"]
    return out


@register_transformers_converter("GPT2LMHeadModel", "GPT2Model")
def convert_gpt2(hf_model: Any) -> GPT:
    config = gpt2_config(hf_model.config)
    model = GPT(config)
    state = {k: v for k, v in hf_model.state_dict().items() if not k.endswith((".attn.bias", ".attn.masked_bias"))}
    lm_head = state.pop("lm_head.weight", None)
    if lm_head is not None and not torch.equal(lm_head, state["transformer.wte.weight"]):
        raise ValueError("GPT-2 checkpoint has an untied lm_head; unitok GPT ties it to the token embedding")
    load_state_dict_strict(model, gpt2_state_dict(state, config.n_layers), ignore=model.tied_keys)
    return model.to(next(hf_model.parameters()).dtype)
