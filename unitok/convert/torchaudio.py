"""torchaudio <-> unitok: `torchaudio.models.Conformer` (plus an optional linear CTC head) <->
`ConformerCTC`.

torchaudio's Conformer has no subsampling front end (frames come in already D wide) and does
not mask padded frames inside its convolution module; the converted config says both
(``subsampling="none"``, ``conv_mask_padding=False``) so outputs match, padding included.
`to_torchaudio` goes back through the same key map (`conformer_rules`): the Conformer blocks
and the CTC head as a separate ``nn.Linear`` — exactly the two parts `from_torchaudio` reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from torch import nn

from tokenizers_mm import CharacterVocabulary
from unitok.convert.dropout import one_rate
from unitok.convert.keymap import (
    KeyRule,
    load_reference,
    placed_like,
    refuse_unmapped,
    renames,
    to_ours,
    to_theirs,
)
from unitok.models.base import load_state_dict_strict
from unitok.models.conformer import ConformerConfig, ConformerCTC

_NOT_SUPPORTED = "torchaudio model option not supported by unitok"


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(f"{_NOT_SUPPORTED}: {message}")


def _dropout(layers: nn.ModuleList) -> float:
    """torchaudio's one ``dropout`` (feed-forward hidden layers and outputs, attention weights and
    output, convolution output), read back from its modules."""
    rates = [m.p for m in layers.modules() if isinstance(m, nn.Dropout)]
    rates += [m.dropout for m in layers.modules() if isinstance(m, nn.MultiheadAttention)]
    rate, rejected = one_rate({"dropout": rates})
    _require(not rejected, f"{', '.join(rejected)} differing by module: unitok's Conformer has one rate")
    return rate


def from_torchaudio(model: nn.Module, ctc_head: nn.Linear | None = None,
                    vocabulary: Sequence[str] | CharacterVocabulary | None = None) -> ConformerCTC:
    """Convert a ``torchaudio.models.Conformer`` (and a ``Linear`` CTC head over its output) into
    a `ConformerCTC` with the same outputs. ``vocabulary``: the head's characters after blank (a
    sequence of characters, or a `tokenizers_mm.CharacterVocabulary`, whose ids are blank + them).

    torchaudio's ``dropout`` becomes ``ConformerConfig.dropout``, which drops every site
    torchaudio does and, in training, also the Conformer's input frames and the CTC head's
    input (torchaudio's Conformer drops neither: that is the caller's front end and head).
    """
    _require(type(model).__name__ == "Conformer", f"model class {type(model).__name__} (Conformer only)")
    layers = model.conformer_layers
    layer = layers[0]
    d_model = layer.self_attn.embed_dim
    conv = layer.conv_module.sequential  # pointwise, GLU, depthwise, norm, SiLU, pointwise, dropout
    norm = conv[3]
    _require(isinstance(norm, (nn.BatchNorm1d, nn.GroupNorm)), f"conv norm {type(norm).__name__}")
    _require(not isinstance(norm, nn.GroupNorm) or norm.num_groups == 1, "GroupNorm with more than one group")
    eps = layer.final_layer_norm.eps
    vocab = tuple(vocabulary.chars if isinstance(vocabulary, CharacterVocabulary) else vocabulary or ())
    if ctc_head is not None:
        _require(isinstance(ctc_head, nn.Linear) and ctc_head.in_features == d_model,
                 f"the CTC head must be a Linear({d_model}, V)")
        if vocab and ctc_head.out_features != 1 + len(vocab):
            raise ValueError(f"the CTC head has {ctc_head.out_features} outputs but the vocabulary "
                             f"{len(vocab)} characters + blank")
    config = ConformerConfig(
        n_mels=d_model, subsampling="none", d_model=d_model, n_layers=len(layers),
        n_heads=layer.self_attn.num_heads, d_ff=layer.ffn1.sequential[1].out_features, activation="silu",
        norm_eps=eps, dropout=_dropout(layers), conv_kernel_size=conv[2].kernel_size[0],
        conv_norm="batchnorm" if isinstance(norm, nn.BatchNorm1d) else "groupnorm", conv_mask_padding=False,
        convolution_first=bool(layer.convolution_first), vocabulary=vocab,
        vocab_size=ctc_head.out_features if ctc_head is not None else 0,
    )
    ours = ConformerCTC(config)
    rules, theirs = conformer_rules(config.n_layers), model.state_dict()
    refuse_unmapped(rules, theirs, _NOT_SUPPORTED)
    state = to_ours(rules, theirs, {})
    if ctc_head is not None:
        state.update({f"ctc_head.{k}": v.detach() for k, v in ctc_head.state_dict().items()})
    load_state_dict_strict(ours, state)
    return ours.to(next(model.parameters()).dtype).eval()


_NORM_LEAVES = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")  # BatchNorm or GroupNorm


def conformer_rules(n_layers: int) -> list[KeyRule]:
    """The key map of a torchaudio ``Conformer`` onto `ConformerCTC`'s backbone (either block order:
    the sublayers keep their names when ``convolution_first`` reorders them)."""
    rules: list[KeyRule] = []
    for i in range(n_layers):
        base = f"backbone.blocks.{i}"
        first, attn, cnv, last = (f"{base}.sublayers.{k}" for k in ("half_mlp0", "attn", "conv", "half_mlp3"))
        names = {
            "ffn1.sequential.0": f"{first}.norm", "ffn1.sequential.1": f"{first}.fc_in",
            "ffn1.sequential.4": f"{first}.fc_out",
            "ffn2.sequential.0": f"{last}.norm", "ffn2.sequential.1": f"{last}.fc_in",
            "ffn2.sequential.4": f"{last}.fc_out",
            "self_attn_layer_norm": f"{attn}.norm", "self_attn.out_proj": f"{attn}.proj",
            "conv_module.layer_norm": f"{cnv}.norm", "conv_module.sequential.0": f"{cnv}.pointwise_in",
            "conv_module.sequential.2": f"{cnv}.depthwise", "conv_module.sequential.5": f"{cnv}.pointwise_out",
            "final_layer_norm": f"{base}.norm",
        }
        src = f"conformer_layers.{i}."
        rules += renames(names, src)
        # nn.MultiheadAttention stacks q, k, v in one in_proj: our fused qkv.
        rules += [KeyRule(f"{src}self_attn.in_proj_weight", f"{attn}.qkv.weight"),
                  KeyRule(f"{src}self_attn.in_proj_bias", f"{attn}.qkv.bias")]
        rules += renames({"conv_module.sequential.3": f"{cnv}.conv_norm"}, src, names=_NORM_LEAVES)
    return rules


class TorchaudioConformer(NamedTuple):
    """What `to_torchaudio` returns: torchaudio's ``Conformer`` (the blocks) and the CTC head
    over its output (None for an encoder without a head) — the arguments of `from_torchaudio`."""

    conformer: nn.Module
    ctc_head: nn.Linear | None


def to_torchaudio(model: nn.Module, strict: bool = True) -> TorchaudioConformer:
    """Convert a unitok `ConformerCTC` to ``torchaudio.models.Conformer`` + a ``Linear`` CTC head
    (eval mode): ``head(conformer(frames, lengths)[0])`` gives the model's logits.

    torchaudio has no subsampling front end and does not mask padded frames in its convolution
    module. ``strict`` refuses models whose outputs it therefore cannot reproduce
    (``subsampling="conv2d4"``, ``conv_mask_padding=True``); ``strict=False`` exports the blocks
    anyway: they then read the front end's (B, N', D) output, and match on unpadded batches.
    The vocabulary and spectrogram settings stay in ``model.config``.
    """
    import torchaudio

    if not isinstance(model, ConformerCTC):
        raise TypeError(f"to_torchaudio cannot convert a {type(model).__name__}; supported unitok classes: "
                        "ConformerCTC")
    c = model.config
    if c.activation != "silu":
        raise ValueError(f"ConformerConfig.activation={c.activation!r}: torchaudio's Conformer uses SiLU")
    if strict and c.subsampling != "none":
        raise ValueError(f"ConformerConfig.subsampling={c.subsampling!r}: torchaudio's Conformer has no front end; "
                         "pass strict=False to export the blocks alone (they read the front end's output)")
    if strict and c.conv_mask_padding:
        raise ValueError("ConformerConfig.conv_mask_padding=True: torchaudio's convolution module does not mask "
                         "padded frames; pass strict=False to export anyway (equal outputs on unpadded batches)")
    conformer = torchaudio.models.Conformer(
        input_dim=c.d_model, num_heads=c.n_heads, ffn_dim=c.backbone_config().hidden_dim, num_layers=c.n_layers,
        depthwise_conv_kernel_size=c.conv_kernel_size, dropout=c.dropout, use_group_norm=c.conv_norm == "groupnorm",
        convolution_first=c.convolution_first,
    )
    for module in conformer.modules():  # torchaudio's LayerNorms take the default eps
        if isinstance(module, nn.LayerNorm):
            module.eps = c.norm_eps
    load_reference(conformer, to_theirs(conformer_rules(c.n_layers), model.state_dict(), conformer.state_dict()))
    head = None
    if model.ctc_head is not None:
        head = nn.Linear(c.d_model, model.ctc_head.out_features)
        head.load_state_dict(model.ctc_head.state_dict())
        head = placed_like(head, model)
    return TorchaudioConformer(placed_like(conformer, model), head)
