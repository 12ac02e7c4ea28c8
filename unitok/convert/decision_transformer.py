"""Hugging Face `DecisionTransformerModel` <-> unitok `DecisionTransformer`.

Hugging Face's encoder is GPT-2 with its position ids pinned to 0, so it adds the same row
``wpe[0]`` to every token right after the embedding LayerNorm: that constant is folded into
the LayerNorm's bias (LN(x) + c = w·x̂ + (b + c)). The unused word embedding ``wte`` is dropped.
Exporting (`export_decision_transformer`) reads the same key map backwards and leaves that
constant in the bias, with all-zero ``wpe`` and ``wte`` tables.
"""

from __future__ import annotations

from typing import Any

from unitok.convert.gpt2 import _ACTIVATIONS, CAUSAL_MASK_BUFFERS, gpt2_dropout, gpt2_rules
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
        dropout=gpt2_dropout(hf_config, "Decision Transformer"), predict_state=True, predict_return=True,
    )


def decision_transformer_rules(n_layers: int) -> list[KeyRule]:
    """The key map of a `DecisionTransformerModel` (its GPT-2 encoder without wte / wpe)."""
    rules = gpt2_rules(n_layers, prefix="encoder.", embeddings=False)
    rules += [KeyRule("embed_timestep.weight", "embed_timestep.weight"), *leaves("embed_ln", "embed_norm"),
              *leaves("predict_action.0", "action_head"), *leaves("predict_state", "state_head"),
              *leaves("predict_return", "return_head")]
    for name in ("embed_return", "embed_state", "embed_action"):
        rules += leaves(name, name)
    return rules


@register_transformers_converter("DecisionTransformerModel")
def convert_decision_transformer(hf_model: Any) -> DecisionTransformer:
    config = decision_transformer_config(hf_model.config).replace(embed_norm_eps=hf_model.embed_ln.eps)
    model = DecisionTransformer(config)
    state = {k: v.detach() for k, v in hf_model.state_dict().items()}
    rules = decision_transformer_rules(config.n_layers)
    # wpe is read below (its row 0, into the LayerNorm's bias); the word embedding wte is never used there
    refuse_unmapped(rules, state, "Decision Transformer checkpoint",
                    ignore=("encoder.wpe.weight", "encoder.wte.weight", *CAUSAL_MASK_BUFFERS))
    ours = to_ours(rules, state, {})
    ours["embed_norm.bias"] = ours["embed_norm.bias"] + state["encoder.wpe.weight"][0]  # every position id is 0
    load_state_dict_strict(model, ours)
    return model.to(next(hf_model.parameters()).dtype)


def decision_transformer_hf_config(config: DecisionTransformerConfig) -> Any:
    """A Hugging Face `DecisionTransformerConfig` for a unitok one; ValueError naming a field the
    reference cannot express. Discrete models export with ``action_tanh=False``: fed one-hot
    actions, the reference then predicts the same action logits."""
    from transformers import DecisionTransformerConfig as HFConfig

    for name in ("condition_on_returns", "predict_state", "predict_return"):
        if not getattr(config, name):
            raise ValueError(f"DecisionTransformerConfig.{name}=False has no Hugging Face equivalent "
                             "(DecisionTransformerModel always has return tokens and state / return heads)")
    return HFConfig(
        state_dim=config.state_dim, act_dim=config.act_dim, hidden_size=config.d_model,
        max_ep_len=config.max_ep_len, action_tanh=config.action_tanh and not config.discrete,
        n_layer=config.n_layers, n_head=config.n_heads, n_inner=config.d_ff,
        activation_function=invert(_ACTIVATIONS)[config.activation], layer_norm_epsilon=config.norm_eps,
        resid_pdrop=config.dropout, embd_pdrop=config.dropout, attn_pdrop=config.dropout,
        bos_token_id=None, eos_token_id=None,
    )


@register_transformers_exporter(DecisionTransformer)
def export_decision_transformer(model: DecisionTransformer) -> Any:
    """unitok `DecisionTransformer` -> ``transformers.DecisionTransformerModel`` with the same
    action, state and return predictions (eval mode). The trajectory statistics and the
    context length are not part of that model: keep them from ``model.config``."""
    from transformers import DecisionTransformerModel

    config = model.config
    hf_model = DecisionTransformerModel(decision_transformer_hf_config(config))
    hf_model.embed_ln.eps = config.embed_norm_eps
    target = hf_model.state_dict()
    state = to_theirs(decision_transformer_rules(config.n_layers), model.state_dict(), target)
    for unused in ("encoder.wte.weight", "encoder.wpe.weight"):  # no tokens; position ids are all 0
        state[unused] = target[unused].new_zeros(target[unused].shape)
    load_reference(hf_model, state)
    return placed_like(hf_model, model)
