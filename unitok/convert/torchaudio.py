"""torchaudio -> unitok: `torchaudio.models.Conformer` (plus an optional linear CTC head) ->
`ConformerCTC`.

torchaudio's Conformer has no subsampling front end (frames come in already D wide) and does
not mask padded frames inside its convolution module; the converted config says both
(``subsampling="none"``, ``conv_mask_padding=False``) so outputs match, padding included.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

from unitok.models.base import load_state_dict_strict
from unitok.models.conformer import ConformerConfig, ConformerCTC


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(f"torchaudio model option not supported by unitok: {message}")


def from_torchaudio(model: nn.Module, ctc_head: nn.Linear | None = None,
                    vocabulary: Sequence[str] | None = None) -> ConformerCTC:
    """Convert a ``torchaudio.models.Conformer`` (and a ``Linear`` CTC head over its output) into
    a `ConformerCTC` with the same outputs. ``vocabulary``: the head's characters after blank."""
    _require(type(model).__name__ == "Conformer", f"model class {type(model).__name__} (Conformer only)")
    layers = model.conformer_layers
    layer = layers[0]
    d_model = layer.self_attn.embed_dim
    conv = layer.conv_module.sequential  # pointwise, GLU, depthwise, norm, SiLU, pointwise, dropout
    norm = conv[3]
    _require(isinstance(norm, (nn.BatchNorm1d, nn.GroupNorm)), f"conv norm {type(norm).__name__}")
    _require(not isinstance(norm, nn.GroupNorm) or norm.num_groups == 1, "GroupNorm with more than one group")
    eps = layer.final_layer_norm.eps
    vocab = tuple(vocabulary or ())
    if ctc_head is not None:
        _require(isinstance(ctc_head, nn.Linear) and ctc_head.in_features == d_model,
                 f"the CTC head must be a Linear({d_model}, V)")
        if vocab and ctc_head.out_features != 1 + len(vocab):
            raise ValueError(f"the CTC head has {ctc_head.out_features} outputs but the vocabulary "
                             f"{len(vocab)} characters + blank")
    config = ConformerConfig(
        n_mels=d_model, subsampling="none", d_model=d_model, n_layers=len(layers),
        n_heads=layer.self_attn.num_heads, d_ff=layer.ffn1.sequential[1].out_features, activation="silu",
        norm_eps=eps, dropout=0.0, conv_kernel_size=conv[2].kernel_size[0],
        conv_norm="batchnorm" if isinstance(norm, nn.BatchNorm1d) else "groupnorm", conv_mask_padding=False,
        convolution_first=bool(layer.convolution_first), vocabulary=vocab,
        vocab_size=ctc_head.out_features if ctc_head is not None else 0,
    )
    ours = ConformerCTC(config)
    state: dict[str, Tensor] = {}
    for i, block in enumerate(layers):
        own = block.state_dict()
        base = f"backbone.blocks.{i}"
        first, attn, cnv, last = (f"{base}.sublayers.{k}" for k in ("half_mlp0", "attn", "conv", "half_mlp3"))
        if config.convolution_first:
            cnv, attn = f"{base}.sublayers.conv", f"{base}.sublayers.attn"
            first, last = f"{base}.sublayers.half_mlp0", f"{base}.sublayers.half_mlp3"
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
        for theirs, key in names.items():
            for leaf in ("weight", "bias"):
                state[f"{key}.{leaf}"] = own[f"{theirs}.{leaf}"]
        # nn.MultiheadAttention stacks q, k, v in one in_proj: our fused qkv.
        state[f"{attn}.qkv.weight"] = own["self_attn.in_proj_weight"]
        state[f"{attn}.qkv.bias"] = own["self_attn.in_proj_bias"]
        for leaf, value in own.items():
            if leaf.startswith("conv_module.sequential.3."):
                state[f"{cnv}.conv_norm.{leaf.rsplit('.', 1)[1]}"] = value
    if ctc_head is not None:
        state.update({f"ctc_head.{k}": v for k, v in ctc_head.state_dict().items()})
    load_state_dict_strict(ours, {k: v.detach() for k, v in state.items()})
    return ours.to(next(model.parameters()).dtype)
