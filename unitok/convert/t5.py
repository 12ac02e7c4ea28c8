"""T5 (`T5ForConditionalGeneration`, `T5EncoderModel`, v1.0 and v1.1) <-> unitok `T5` / `T5Encoder`.

Hugging Face keeps q, k, v as separate linears: they are stacked into our fused projections
(q·k·v for self-attention, k·v for cross-attention). The relative position bias lives in the
first block of each stack there and on the stack here; both share it across layers. One key
map (`t5_stack_rules`) serves both directions (`export_t5`, `export_t5_encoder`).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from unitok.convert.keymap import (
    KeyRule,
    aliased_keys,
    invert,
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
        relative_max_distance=hf_config.relative_attention_max_distance,
        dropout=float(hf_config.dropout_rate),
        norm_eps=hf_config.layer_norm_epsilon, scale_output=bool(scale),
        pad_token_id=hf_config.pad_token_id if hf_config.pad_token_id is not None else 0,
        eos_token_id=hf_config.eos_token_id if isinstance(hf_config.eos_token_id, int) else 1,
        decoder_start_token_id=(start if (start := getattr(hf_config, "decoder_start_token_id", None)) is not None
                                else hf_config.pad_token_id or 0),
    )


def t5_stack_rules(prefix: str, ours: str, n_layers: int, decoder: bool, gated: bool) -> list[KeyRule]:
    """The key map of one T5 stack (``prefix``: "encoder" / "decoder" there, ``ours`` here)."""
    rules: list[KeyRule] = []
    ff = 2 if decoder else 1
    for i in range(n_layers):
        src, dst = f"{prefix}.block.{i}.layer", f"{ours}.blocks.{i}.sublayers"
        attn = f"{src}.0.SelfAttention"
        rules += [KeyRule(tuple(f"{attn}.{p}.weight" for p in "qkv"), f"{dst}.attn.qkv.weight"),
                  KeyRule(f"{attn}.o.weight", f"{dst}.attn.proj.weight"),
                  KeyRule(f"{src}.0.layer_norm.weight", f"{dst}.attn.norm.weight")]
        if decoder:
            cross = f"{src}.1.EncDecAttention"
            rules += [KeyRule(f"{cross}.q.weight", f"{dst}.cross_attn.q.weight"),
                      KeyRule((f"{cross}.k.weight", f"{cross}.v.weight"), f"{dst}.cross_attn.kv.weight"),
                      KeyRule(f"{cross}.o.weight", f"{dst}.cross_attn.proj.weight"),
                      KeyRule(f"{src}.1.layer_norm.weight", f"{dst}.cross_attn.norm.weight")]
        mlp = f"{src}.{ff}.DenseReluDense"
        if gated:  # act(wi_0 x) · wi_1 x
            rules += [KeyRule(f"{mlp}.wi_0.weight", f"{dst}.mlp.fc_in.weight"),
                      KeyRule(f"{mlp}.wi_1.weight", f"{dst}.mlp.fc_gate.weight")]
        else:
            rules.append(KeyRule(f"{mlp}.wi.weight", f"{dst}.mlp.fc_in.weight"))
        rules += [KeyRule(f"{mlp}.wo.weight", f"{dst}.mlp.fc_out.weight"),
                  KeyRule(f"{src}.{ff}.layer_norm.weight", f"{dst}.mlp.norm.weight")]
    return rules + [
        KeyRule(f"{prefix}.block.0.layer.0.SelfAttention.relative_attention_bias.weight", f"{ours}.relative_bias.weight"),
        KeyRule(f"{prefix}.final_layer_norm.weight", f"{ours}.norm.weight"),
    ]


def t5_rules(config: T5Config, decoder: bool = True) -> list[KeyRule]:
    """The key map of a `T5ForConditionalGeneration` (``decoder=False``: a `T5EncoderModel`)."""
    rules = [KeyRule("shared.weight", "shared.weight"),
             *t5_stack_rules("encoder", "encoder", config.n_layers, decoder=False, gated=config.gated)]
    if decoder:
        rules += t5_stack_rules("decoder", "decoder", config.decoder_layers, decoder=True, gated=config.gated)
        if not config.tie_embeddings:
            rules.append(KeyRule("lm_head.weight", "lm_head.weight"))
    return rules


def _state(hf_model: Any, rules: list[KeyRule]) -> dict[str, Tensor]:
    """``hf_model``'s tensors in unitok's keys; ValueError naming one no rule reads. The stacks'
    ``embed_tokens`` (and a tied ``lm_head``) are ``shared`` itself: aliases, not parameters."""
    theirs = {k: v.detach() for k, v in hf_model.state_dict().items()}
    refuse_unmapped(rules, theirs, f"{type(hf_model).__name__} checkpoint", ignore=aliased_keys(hf_model))
    return to_ours(rules, theirs, {})


@register_transformers_converter("T5ForConditionalGeneration")
def convert_t5(hf_model: Any) -> T5:
    """T5ForConditionalGeneration -> `T5`: the same logits, greedy and beam outputs."""
    tied = hf_model.lm_head.weight.data_ptr() == hf_model.shared.weight.data_ptr()
    config = t5_config(hf_model.config).replace(tie_embeddings=tied)
    model = T5(config)
    load_state_dict_strict(model, _state(hf_model, t5_rules(config)), ignore=model.tied_keys)
    return model.to(next(hf_model.parameters()).dtype).eval()


@register_transformers_converter("T5EncoderModel")
def convert_t5_encoder(hf_model: Any) -> T5Encoder:
    """T5EncoderModel -> `T5Encoder`: the same encoder states."""
    model = T5Encoder(t5_config(hf_model.config))
    load_state_dict_strict(model, _state(hf_model, t5_rules(model.config, decoder=False)))
    return model.to(next(hf_model.parameters()).dtype).eval()


def t5_hf_config(config: T5Config) -> Any:
    """A Hugging Face `T5Config` for a unitok `T5Config`; ValueError naming a field T5 cannot express."""
    from transformers import T5Config as HFT5Config

    if config.n_mels:
        raise ValueError(f"T5Config.n_mels={config.n_mels} (a spectrogram front end) has no Hugging Face T5 "
                         "equivalent; only text T5 models export")
    act = invert(_ACTIVATIONS)[config.activation]
    hf_config = HFT5Config(
        vocab_size=config.vocab_size, d_model=config.d_model, d_kv=config.d_kv, d_ff=config.d_ff,
        num_layers=config.n_layers, num_decoder_layers=config.decoder_layers, num_heads=config.n_heads,
        relative_attention_num_buckets=config.relative_buckets,
        relative_attention_max_distance=config.relative_max_distance, dropout_rate=config.dropout,
        layer_norm_epsilon=config.norm_eps, feed_forward_proj=("gated-" if config.gated else "") + act,
        tie_word_embeddings=config.scales_output, pad_token_id=config.pad_token_id,
        eos_token_id=config.eos_token_id, decoder_start_token_id=config.decoder_start_token_id,
    )
    # feed_forward_proj="gated-gelu" means gelu_new there: name the MLP exactly.
    hf_config.dense_act_fn, hf_config.is_gated_act = act, config.gated
    hf_config.scale_decoder_outputs = config.scales_output
    return hf_config


@register_transformers_exporter(T5)
def export_t5(model: T5) -> Any:
    """unitok `T5` -> ``transformers.T5ForConditionalGeneration`` with the same logits (eval mode).

    An untied head (``tie_embeddings=False``) becomes a parameter of its own on the exported
    model; transformers ≥ 5 re-ties it to ``shared`` when it saves and reloads the model."""
    from transformers import T5ForConditionalGeneration

    hf_model = T5ForConditionalGeneration(t5_hf_config(model.config))
    if not model.config.tie_embeddings:
        hf_model.lm_head.weight = nn.Parameter(hf_model.lm_head.weight.detach().clone())
    state = to_theirs(t5_rules(model.config), model.state_dict(), hf_model.state_dict())
    load_reference(hf_model, state)
    return placed_like(hf_model, model)


@register_transformers_exporter(T5Encoder)
def export_t5_encoder(model: T5Encoder) -> Any:
    """unitok `T5Encoder` -> ``transformers.T5EncoderModel`` with the same states (eval mode)."""
    from transformers import T5EncoderModel

    hf_model = T5EncoderModel(t5_hf_config(model.config))
    load_reference(hf_model, to_theirs(t5_rules(model.config, decoder=False), model.state_dict(),
                                       hf_model.state_dict()))
    return placed_like(hf_model, model)
