"""T5 (`T5ForConditionalGeneration`, `T5EncoderModel`, v1.0 and v1.1) -> unitok `T5` / `T5Encoder`.

Hugging Face keeps q, k, v as separate linears: they are stacked into our fused projections
(q·k·v for self-attention, k·v for cross-attention). The relative position bias lives in the
first block of each stack there and on the stack here; both share it across layers.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from unitok.convert.transformers import register_transformers_converter
from unitok.models.base import load_state_dict_strict
from unitok.models.t5 import T5, T5Config, T5Encoder

_ACTIVATIONS = {"relu": "relu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu",
                "silu": "silu"}


def t5_config(hf_config: Any) -> T5Config:
    """Translate a `T5Config` (whose ``dense_act_fn`` / ``is_gated_act`` name the MLP)."""
    act = hf_config.dense_act_fn
    if act not in _ACTIVATIONS:
        raise ValueError(f"T5 activation {act!r} has no unitok equivalent; known: {sorted(_ACTIVATIONS)}")
    # transformers ≥ 5 always ties the head and keeps v1.0's output rescale as its own flag.
    scale = getattr(hf_config, "scale_decoder_outputs", getattr(hf_config, "tie_word_embeddings", True))
    return T5Config(
        vocab_size=hf_config.vocab_size, d_model=hf_config.d_model, d_kv=hf_config.d_kv,
        n_layers=hf_config.num_layers, n_decoder_layers=hf_config.num_decoder_layers, n_heads=hf_config.num_heads,
        d_ff=hf_config.d_ff, activation=_ACTIVATIONS[act], gated=bool(hf_config.is_gated_act),  # type: ignore[arg-type]
        relative_buckets=hf_config.relative_attention_num_buckets,
        relative_max_distance=hf_config.relative_attention_max_distance, dropout=0.0,
        norm_eps=hf_config.layer_norm_epsilon, scale_output=bool(scale),
        pad_token_id=hf_config.pad_token_id if hf_config.pad_token_id is not None else 0,
        eos_token_id=hf_config.eos_token_id if isinstance(hf_config.eos_token_id, int) else 1,
        decoder_start_token_id=(start if (start := getattr(hf_config, "decoder_start_token_id", None)) is not None
                                else hf_config.pad_token_id or 0),
    )


def _stack_state(theirs: dict[str, Tensor], prefix: str, ours: str, n_layers: int, decoder: bool) -> dict[str, Tensor]:
    state: dict[str, Tensor] = {}
    ff = 2 if decoder else 1
    for i in range(n_layers):
        src, dst = f"{prefix}.block.{i}.layer", f"{ours}.blocks.{i}.sublayers"
        attn = f"{src}.0.SelfAttention"
        state[f"{dst}.attn.qkv.weight"] = torch.cat([theirs[f"{attn}.{p}.weight"] for p in "qkv"])
        state[f"{dst}.attn.proj.weight"] = theirs[f"{attn}.o.weight"]
        state[f"{dst}.attn.norm.weight"] = theirs[f"{src}.0.layer_norm.weight"]
        if decoder:
            cross = f"{src}.1.EncDecAttention"
            state[f"{dst}.cross_attn.q.weight"] = theirs[f"{cross}.q.weight"]
            state[f"{dst}.cross_attn.kv.weight"] = torch.cat([theirs[f"{cross}.k.weight"], theirs[f"{cross}.v.weight"]])
            state[f"{dst}.cross_attn.proj.weight"] = theirs[f"{cross}.o.weight"]
            state[f"{dst}.cross_attn.norm.weight"] = theirs[f"{src}.1.layer_norm.weight"]
        mlp = f"{src}.{ff}.DenseReluDense"
        if f"{mlp}.wi.weight" in theirs:
            state[f"{dst}.mlp.fc_in.weight"] = theirs[f"{mlp}.wi.weight"]
        else:  # gated: act(wi_0 x) · wi_1 x
            state[f"{dst}.mlp.fc_in.weight"] = theirs[f"{mlp}.wi_0.weight"]
            state[f"{dst}.mlp.fc_gate.weight"] = theirs[f"{mlp}.wi_1.weight"]
        state[f"{dst}.mlp.fc_out.weight"] = theirs[f"{mlp}.wo.weight"]
        state[f"{dst}.mlp.norm.weight"] = theirs[f"{src}.{ff}.layer_norm.weight"]
    state[f"{ours}.relative_bias.weight"] = theirs[f"{prefix}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"]
    state[f"{ours}.norm.weight"] = theirs[f"{prefix}.final_layer_norm.weight"]
    return state


@register_transformers_converter("T5ForConditionalGeneration")
def convert_t5(hf_model: Any) -> T5:
    """T5ForConditionalGeneration -> `T5`: the same logits, greedy and beam outputs."""
    theirs = {k: v.detach() for k, v in hf_model.state_dict().items()}
    tied = hf_model.lm_head.weight.data_ptr() == hf_model.shared.weight.data_ptr()
    config = t5_config(hf_model.config).replace(tie_embeddings=tied)
    model = T5(config)
    state = {"shared.weight": theirs["shared.weight"]}
    state.update(_stack_state(theirs, "encoder", "encoder", config.n_layers, decoder=False))
    state.update(_stack_state(theirs, "decoder", "decoder", config.decoder_layers, decoder=True))
    if not tied:
        state["lm_head.weight"] = theirs["lm_head.weight"]
    load_state_dict_strict(model, state, ignore=model.tied_keys)
    return model.to(next(hf_model.parameters()).dtype).eval()


@register_transformers_converter("T5EncoderModel")
def convert_t5_encoder(hf_model: Any) -> T5Encoder:
    """T5EncoderModel -> `T5Encoder`: the same encoder states."""
    theirs = {k: v.detach() for k, v in hf_model.state_dict().items()}
    model = T5Encoder(t5_config(hf_model.config))
    state = {"shared.weight": theirs["shared.weight"]}
    state.update(_stack_state(theirs, "encoder", "encoder", model.config.n_layers, decoder=False))
    load_state_dict_strict(model, state)
    return model.to(next(hf_model.parameters()).dtype).eval()
