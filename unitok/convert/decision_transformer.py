"""Hugging Face `DecisionTransformerModel` -> unitok `DecisionTransformer`.

Hugging Face's encoder is GPT-2 with its position ids pinned to 0, so it adds the same row
``wpe[0]`` to every token right after the embedding LayerNorm: that constant is folded into
the LayerNorm's bias (LN(x) + c = w·x̂ + (b + c)). The unused word embedding ``wte`` is dropped.
"""

from __future__ import annotations

from typing import Any

from unitok.convert.gpt2 import _ACTIVATIONS, gpt2_state_dict
from unitok.convert.transformers import register_transformers_converter
from unitok.models.base import load_state_dict_strict
from unitok.models.decision_transformer import DecisionTransformer, DecisionTransformerConfig


def decision_transformer_config(hf_config: Any) -> DecisionTransformerConfig:
    """Translate a Hugging Face `DecisionTransformerConfig`, refusing options unitok lacks."""
    unsupported = {"scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
                   "add_cross_attention": False, "scale_attn_weights": True}
    for key, expected in unsupported.items():
        if getattr(hf_config, key, expected) != expected:
            raise ValueError(f"Decision Transformer option {key}={getattr(hf_config, key)} is not supported "
                             f"(expected {expected})")
    act = hf_config.activation_function
    if act not in _ACTIVATIONS:
        raise ValueError(f"activation {act!r} has no unitok equivalent; known: {sorted(_ACTIVATIONS)}")
    return DecisionTransformerConfig(
        state_dim=hf_config.state_dim, act_dim=hf_config.act_dim, discrete=False,
        action_tanh=bool(hf_config.action_tanh), max_ep_len=hf_config.max_ep_len,
        d_model=hf_config.hidden_size, n_layers=hf_config.n_layer, n_heads=hf_config.n_head,
        d_ff=hf_config.n_inner, activation=_ACTIVATIONS[act],  # type: ignore[arg-type]
        norm_eps=hf_config.layer_norm_epsilon, embed_norm_eps=1e-5,
        dropout=float(hf_config.resid_pdrop), predict_state=True, predict_return=True,
    )


@register_transformers_converter("DecisionTransformerModel")
def convert_decision_transformer(hf_model: Any) -> DecisionTransformer:
    config = decision_transformer_config(hf_model.config).replace(embed_norm_eps=hf_model.embed_ln.eps)
    model = DecisionTransformer(config)
    state = {k: v.detach() for k, v in hf_model.state_dict().items()}
    encoder = {k.removeprefix("encoder."): v for k, v in state.items() if k.startswith("encoder.")}
    encoder = {k: v for k, v in encoder.items() if not k.endswith((".attn.bias", ".attn.masked_bias"))}
    ours = gpt2_state_dict(encoder, config.n_layers)
    ours.pop("tok_embed.weight")
    wpe0 = ours.pop("pos_embed.weight")[0]  # every token has position id 0
    ours.update({
        "embed_timestep.weight": state["embed_timestep.weight"],
        "embed_norm.weight": state["embed_ln.weight"],
        "embed_norm.bias": state["embed_ln.bias"] + wpe0,
        "action_head.weight": state["predict_action.0.weight"],
        "action_head.bias": state["predict_action.0.bias"],
        "state_head.weight": state["predict_state.weight"],
        "state_head.bias": state["predict_state.bias"],
        "return_head.weight": state["predict_return.weight"],
        "return_head.bias": state["predict_return.bias"],
    })
    for name in ("embed_return", "embed_state", "embed_action"):
        for leaf in ("weight", "bias"):
            ours[f"{name}.{leaf}"] = state[f"{name}.{leaf}"]
    load_state_dict_strict(model, ours)
    return model.to(next(hf_model.parameters()).dtype)


