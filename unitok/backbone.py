"""The one backbone: a Block is a list of residual sublayers; a Backbone is a stack of Blocks.

GPT/ViT block = ("attn", "mlp"); MLP-Mixer block = ("token_mlp", "mlp"); T5 decoder block =
("attn", "cross_attn", "mlp"); Conformer block = ("half_mlp", "attn", "conv", "half_mlp").
Other families add sublayer kinds to `SUBLAYERS` instead of writing new block classes. Pre-/post-norm, LayerNorm/RMSNorm,
biases, gated MLPs and T5's relative position bias are config fields.

Axis legend: B batch, N tokens, T key positions (cache + new), S encoder positions, D model
width, H heads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn
from torch.nn.modules import module as _module

from unitok.config import Config
from unitok.embed.relative import RelativePositionBias, check_relative_buckets
from unitok.layers.activations import Activation, activate_fresh
from unitok.layers.attention import (
    AttentionContext,
    CrossAttention,
    Kernel,
    SelfAttention,
    add_position_bias,
    build_attention_mask,
    causal_mask,
    check_padding_mask,
)
from unitok.layers.conv_module import ConvModule, ConvNorm
from unitok.layers.kv_cache import KVCache, StaticKVCache
from unitok.layers.mlp import MLP
from unitok.layers.norms import NormKind, make_norm
from unitok.outputs import BackboneOutput


@dataclass(frozen=True)
class BackboneConfig(Config):
    """Shape and wiring of the shared transformer stack.

    Args:
        d_model: width D. n_layers: number of Blocks. n_heads: attention heads.
        d_ff: MLP hidden width (default 4·D).
        block: the sublayers of every Block, by registry name.
        norm / norm_position / norm_eps: which norm, before ("pre") or after ("post") each
            residual add, and its epsilon.
        bias: biases in linear layers and LayerNorms.
        activation: MLP nonlinearity. causal: mask future tokens in self-attention.
        dropout: on each sublayer's output before the residual add. attn_dropout: on weights.
        mlp_dropout: on the MLP's hidden activation (T5 and the Conformer drop it; GPT-2 and
            BERT do not).
        final_norm: a norm after the last Block (pre-norm stacks need it).
        attn_scale: attention score scale; None means 1/sqrt(head width).
        n_tokens / token_mlp_dim: sequence length and hidden width of the token-mixing MLP
            ("token_mlp" sublayer, MLP-Mixer); token_mlp_dim defaults to D/2.
        head_dim: per-head width K (default D/H; T5 allows H·K ≠ D).
        mlp_gated: act(fc_in(x)) · fc_gate(x) in the MLP (T5 v1.1's gated-GELU).
        relative_buckets / relative_max_distance: T5's bucketed relative position bias, one
            table shared by every layer, bidirectional unless causal (0 buckets: none).
        conv_kernel_size / conv_norm / conv_mask_padding: the Conformer "conv" sublayer (zeroing
            padded frames before its depthwise conv unless False, as torchaudio does not).
        block_norm: a norm at the end of every Block (the Conformer's per-block LayerNorm).
    """

    d_model: int = 768
    n_layers: int = 12
    n_heads: int = 12
    d_ff: int | None = None
    block: tuple[str, ...] = ("attn", "mlp")
    norm: NormKind = "layernorm"
    norm_position: Literal["pre", "post"] = "pre"
    norm_eps: float = 1e-5
    bias: bool = True
    activation: Activation = "gelu"
    causal: bool = False
    dropout: float = 0.0
    attn_dropout: float = 0.0
    mlp_dropout: float = 0.0
    final_norm: bool = True
    attn_scale: float | None = None
    n_tokens: int | None = None
    token_mlp_dim: int | None = None
    head_dim: int | None = None
    mlp_gated: bool = False
    relative_buckets: int = 0
    relative_max_distance: int = 128
    conv_kernel_size: int = 31
    conv_norm: ConvNorm = "batchnorm"
    conv_mask_padding: bool = True
    block_norm: bool = False

    def __post_init__(self) -> None:
        for name in ("d_model", "n_layers", "n_heads"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.head_dim is None and self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} must be divisible by n_heads={self.n_heads} "
                             "(or set head_dim)")
        if self.head_dim is not None and self.head_dim <= 0:
            raise ValueError(f"head_dim must be positive, got {self.head_dim}")
        if self.relative_buckets < 0 or (self.relative_buckets and self.relative_buckets < 4):
            raise ValueError(f"relative_buckets must be 0 (none) or ≥ 4, got {self.relative_buckets}")
        if self.relative_buckets:  # bidirectional unless causal, as the Backbone builds its bias
            check_relative_buckets(self.relative_buckets, self.relative_max_distance, bidirectional=not self.causal,
                                   names=("relative_buckets", "relative_max_distance"))
        if self.d_ff is not None and self.d_ff <= 0:
            raise ValueError(f"d_ff must be positive, got {self.d_ff}")
        unknown = [s for s in self.block if s not in SUBLAYERS]
        if unknown or not self.block:
            raise ValueError(f"unknown sublayer(s) {unknown} in block={self.block}; known: {sorted(SUBLAYERS)}")
        if "token_mlp" in self.block and (self.n_tokens is None or self.n_tokens < 1):
            raise ValueError(f"a token_mlp sublayer mixes a fixed number of tokens: set n_tokens, got {self.n_tokens}")
        for name in ("dropout", "attn_dropout", "mlp_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if not self.norm_eps > 0:  # 0 divides a constant row by 0, a negative one takes the root of < 0: NaN
            raise ValueError(f"norm_eps must be > 0 (added to the variance a norm divides by), got {self.norm_eps}")
        if self.token_mlp_dim is not None and self.token_mlp_dim <= 0:
            raise ValueError(f"token_mlp_dim must be positive (or None: d_model / 2), got {self.token_mlp_dim}")

    @property
    def hidden_dim(self) -> int:
        return self.d_ff if self.d_ff is not None else 4 * self.d_model

    @property
    def head_width(self) -> int:
        return self.head_dim if self.head_dim is not None else self.d_model // self.n_heads


# --------------------------------------------------------------------------- sublayers
class AttentionSublayer(SelfAttention):
    """Self-attention with its own norm; causal or not as the backbone says."""

    def __init__(self, cfg: BackboneConfig, layer_idx: int) -> None:
        super().__init__(cfg.d_model, cfg.n_heads, bias=cfg.bias, dropout=cfg.attn_dropout,
                         scale=cfg.attn_scale, layer_idx=layer_idx, head_dim=cfg.head_dim)
        self.norm = make_norm(cfg.norm, cfg.d_model, cfg.norm_eps, cfg.bias)


class CrossAttentionSublayer(CrossAttention):
    """Attention to the encoder's output (``encoder_hidden_states``), with its own norm."""

    def __init__(self, cfg: BackboneConfig, layer_idx: int) -> None:
        super().__init__(cfg.d_model, cfg.n_heads, bias=cfg.bias, dropout=cfg.attn_dropout,
                         scale=cfg.attn_scale, layer_idx=layer_idx, head_dim=cfg.head_dim)
        self.norm = make_norm(cfg.norm, cfg.d_model, cfg.norm_eps, cfg.bias)


class MLPSublayer(MLP):
    """Position-wise feed-forward with its own norm."""

    def __init__(self, cfg: BackboneConfig, layer_idx: int) -> None:
        super().__init__(cfg.d_model, cfg.hidden_dim, cfg.activation, bias=cfg.bias, dropout=cfg.mlp_dropout,
                         gated=cfg.mlp_gated)
        self.norm = make_norm(cfg.norm, cfg.d_model, cfg.norm_eps, cfg.bias)

    def forward(self, x: Tensor, ctx: AttentionContext | None = None) -> Tensor:
        return super().forward(x)


class HalfMLPSublayer(MLPSublayer):
    """The Conformer's macaron feed-forward: x + ½·FFN(x) (Gulati et al., 2020, eq. 1)."""

    def forward(self, x: Tensor, ctx: AttentionContext | None = None) -> Tensor:
        return 0.5 * super().forward(x)


class ConvSublayer(ConvModule):
    """The Conformer's convolution module with its own (Layer)norm; reads the padding mask."""

    def __init__(self, cfg: BackboneConfig, layer_idx: int) -> None:
        # no dropout of its own: the Block drops every sublayer's output once, as torchaudio's
        # Conformer drops the convolution module's (its last layer) before the residual add
        super().__init__(cfg.d_model, cfg.conv_kernel_size, cfg.conv_norm, bias=cfg.bias, dropout=0.0,
                         mask_padding=cfg.conv_mask_padding)
        self.norm = make_norm(cfg.norm, cfg.d_model, cfg.norm_eps, cfg.bias)

    def forward(self, x: Tensor, ctx: AttentionContext | None = None) -> Tensor:  # type: ignore[override]
        if ctx is not None and ctx.cache is not None:
            raise ValueError("the convolution sublayer mixes along time and cannot decode incrementally")
        return super().forward(x, ctx.padding if ctx is not None else None)


class TokenMLPSublayer(MLP):
    """MLP-Mixer's token mixing: one MLP across the N tokens, shared by every channel."""

    def __init__(self, cfg: BackboneConfig, layer_idx: int) -> None:
        hidden = cfg.token_mlp_dim if cfg.token_mlp_dim is not None else cfg.d_model // 2
        super().__init__(cfg.n_tokens, hidden, cfg.activation, bias=cfg.bias, dropout=cfg.dropout)  # type: ignore[arg-type]
        self.norm = make_norm(cfg.norm, cfg.d_model, cfg.norm_eps, cfg.bias)

    def forward(self, x: Tensor, ctx: AttentionContext | None = None) -> Tensor:  # (B, N, D) -> (B, N, D)
        if x.shape[1] != self.fc_in.in_features:
            raise ValueError(
                f"the token-mixing MLP was built for {self.fc_in.in_features} tokens, got {x.shape[1]}; "
                "MLP-Mixer needs the image size it was configured with"
            )
        # Mix along N for each of the D channels: fc(xᵀ)ᵀ, computed as W (F, N) @ x (B, N, D) so
        # that neither the input nor the output is transposed into a copy (the same products).
        h = activate_fresh(self.act, self._token_linear(self.fc_in, x))  # (B, F, D)
        if self.training and self.drop.p > 0:
            h = self.drop(h)
        return self._token_linear(self.fc_out, h)  # (B, N, D)

    @staticmethod
    def _token_linear(fc: nn.Linear, x: Tensor) -> Tensor:
        """fc applied along dim 1 of (B, in, D) -> (B, out, D)."""
        B, _, D = x.shape
        weight = fc.weight.expand(B, -1, -1)
        if fc.bias is None:
            return torch.bmm(weight, x)
        return torch.baddbmm(fc.bias[:, None].expand(B, -1, D), weight, x)


# name -> constructor(cfg, layer_idx). Every sublayer has `.norm` and `forward(x, ctx)`.
SUBLAYERS: dict[str, type[nn.Module]] = {
    "attn": AttentionSublayer,
    "cross_attn": CrossAttentionSublayer,
    "half_mlp": HalfMLPSublayer,
    "conv": ConvSublayer,
    "mlp": MLPSublayer,
    "token_mlp": TokenMLPSublayer,
}


# Below this many elements (a decode step's few rows) the saved buffer is not worth the checks.
_IN_PLACE_MIN_NUMEL = 1 << 16


def _sum_fits_in_place(x: Tensor, y: Tensor, sub: nn.Module) -> bool:
    """Whether the residual sum x + y may be written into y, the sublayer's fresh output (one
    buffer fewer a sublayer in inference): not when autograd needs y, when the sum would
    promote (an autocast sublayer's bf16 y on a float32 stream stays float32) or broadcast,
    or when a forward hook may hold y (a feature extractor must keep what it saw)."""
    return (
        y.numel() >= _IN_PLACE_MIN_NUMEL
        and not (torch.is_grad_enabled() and (x.requires_grad or y.requires_grad))
        and y.dtype == x.dtype
        and y.shape == x.shape
        and not _module._global_forward_hooks
        and not any(m._forward_hooks for m in sub.modules())  # a hooked proj / fc_out returns y itself
    )


class Block(nn.Module):
    """Residual sublayers in order: pre-norm x + f(norm(x)), or post-norm norm(x + f(x))."""

    def __init__(self, cfg: BackboneConfig, layer_idx: int) -> None:
        super().__init__()
        self.pre_norm = cfg.norm_position == "pre"
        self.drop = nn.Dropout(cfg.dropout)
        self.sublayers = nn.ModuleDict()
        for i, name in enumerate(cfg.block):
            key = name if cfg.block.count(name) == 1 else f"{name}{i}"
            self.sublayers[key] = SUBLAYERS[name](cfg, layer_idx)
        self.norm = make_norm(cfg.norm, cfg.d_model, cfg.norm_eps, cfg.bias) if cfg.block_norm else None

    def forward(self, x: Tensor, ctx: AttentionContext, keep: int | Tensor | None = None) -> Tensor:
        """(B, N, D) -> (B, N, D); with ``keep`` (R, or R positions), -> (B, R, D): only those
        tokens come out (`Backbone.forward`'s ``keep_last``)."""
        drop = self.drop if self.training and self.drop.p > 0 else None
        for sub in self.sublayers.values():
            h = sub.norm(x) if self.pre_norm else x
            if keep is not None and isinstance(sub, AttentionSublayer):
                kept = x[:, :keep] if isinstance(keep, int) else x[:, keep]
                y, x = sub(h, ctx, queries=keep), kept  # every token is read, R answer
            else:
                y = sub(h, ctx)
            if drop is not None:
                y = drop(y)
            s = y.add_(x) if _sum_fits_in_place(x, y, sub) else x + y
            x = s if self.pre_norm else sub.norm(s)
        return self.norm(x) if self.norm is not None else x

    def answers_a_subset(self) -> bool:
        """Whether `forward` can keep a subset of tokens: self-attention first, then only
        position-wise sublayers (a convolution or token-mixing MLP needs every token)."""
        names = [type(s) for s in self.sublayers.values()]
        return bool(names) and names[0] is AttentionSublayer and all(
            n in (MLPSublayer, HalfMLPSublayer) for n in names[1:])


class Backbone(nn.Module):
    """A stack of Blocks over (B, N, D) embeddings, with masks, KV cache and optional outputs."""

    def __init__(self, cfg: BackboneConfig) -> None:
        super().__init__()
        self.config = cfg
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm = make_norm(cfg.norm, cfg.d_model, cfg.norm_eps, cfg.bias) if cfg.final_norm else None
        self.relative_bias = (RelativePositionBias(cfg.n_heads, cfg.relative_buckets, cfg.relative_max_distance,
                                                   bidirectional=not cfg.causal) if cfg.relative_buckets else None)

    def new_cache(self, capacity: int = 0) -> KVCache:
        return KVCache(self.config.n_layers, capacity)

    def _check_input(self, x: Tensor) -> None:
        if x.dim() != 3 or x.shape[-1] != self.config.d_model:
            raise ValueError(f"backbone expects (batch, tokens, {self.config.d_model}), got {tuple(x.shape)}")

    def checked_masks(
        self, x: Tensor, attention_mask: Tensor | None = None, cache: KVCache | StaticKVCache | None = None,
        encoder_hidden_states: Tensor | None = None, encoder_attention_mask: Tensor | None = None,
    ) -> tuple[Tensor | None, Tensor | None]:
        """The padding masks as `forward` reads them: checked (1 / 0 values of the right shape, no
        all-padding source row), and None where every position is real, so that the fused kernel
        takes its unmasked path. The checks read values on the host, so a compiled stack runs this
        eagerly before its graph (`unitok.compile`): under torch.compile they would break it."""
        self._check_input(x)
        B, n_new = x.shape[:2]
        n_keys = cache.key_length(n_new) if cache is not None else n_new
        if attention_mask is not None:
            if cache is not None and n_keys > n_new and tuple(attention_mask.shape) == (B, n_keys):
                # a decoding step: the columns of the cached tokens were checked as the prompt ran,
                # and re-reading the whole mask each token would cost the step more than it checks
                unpadded = bool(attention_mask.all())
            else:
                unpadded = check_padding_mask(attention_mask, (B, n_keys), "attention_mask")[0]
            if unpadded:
                attention_mask = None  # nothing padded: let the fused kernel take its fast path
        if encoder_hidden_states is not None and encoder_attention_mask is not None:
            unpadded, empty = check_padding_mask(encoder_attention_mask, tuple(encoder_hidden_states.shape[:2]),
                                                 "encoder_attention_mask")
            if empty:  # a query row would attend to no key: NaN, or a number no reference computes
                raise ValueError(f"source row(s) {empty} are empty (all padding in encoder_attention_mask): give "
                                 "each row at least one token")
            if unpadded:
                encoder_attention_mask = None
        return attention_mask, encoder_attention_mask

    def forward(
        self,
        x: Tensor,
        attention_mask: Tensor | None = None,
        cache: KVCache | StaticKVCache | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        kernel: Kernel = "sdpa",
        causal: bool | None = None,
        encoder_hidden_states: Tensor | None = None,
        encoder_attention_mask: Tensor | None = None,
        mask: Tensor | None = None,
        keep_last: int | Tensor | None = None,
        _masks_checked: bool = False,
    ) -> BackboneOutput:
        """Run the stack.

        Args:
            x: (B, N, D) embedded tokens.
            attention_mask: (B, T) 1 (or True) for real tokens, 0 for padding, nothing else (not an
                additive mask); with a cache it covers the cached positions followed by the N new ones.
            cache: a `KVCache` to read and extend (incremental decoding), or a `StaticKVCache`
                (fixed capacity, read whole: ``mask`` then says which positions are written).
            output_hidden_states / output_attentions: also return per-layer states / weights
                (attention weights come from the reference kernel, which materialises them).
            kernel: "sdpa" (fused) or "reference" (plain math, for tests and inspection).
            causal: override the config's masking for this call (one backbone shared by a
                causal text tower and a bidirectional image tower, as in CLIP's shared option).
            encoder_hidden_states / encoder_attention_mask: (B, S, D) states and (B, S) 1/0 mask
                that "cross_attn" sublayers attend to (encoder–decoder models); every row needs
                a real state to attend to.
            mask: a ready (B|1, H|1, N, T) boolean mask of which keys each query may see (True:
                may attend), replacing the one built from ``attention_mask`` and ``causal``
                (packed multimodal sequences, `unitok.packing`); ``attention_mask`` then only
                tells sublayers that mix along N which tokens are padding.
            keep_last: R, or None: only the first R tokens leave the last block (a class-token
                classifier reads nothing else); or a (R,) tensor of increasing positions, causal
                stacks too (the Decision Transformer's action head reads only state tokens).
                That block still reads every token as keys and values, but computes queries,
                the output projection and the MLP for R tokens only: the same values for those
                R, a layer's worth of work saved on the rest. ``last_hidden_state`` is then
                (B, R, D). Without a cache or per-layer outputs only.
            _masks_checked: set by `unitok.compile`'s wrapper, which ran `checked_masks` before the graph.
        """
        self._check_input(x)
        B, n_new = x.shape[:2]
        n_keys = cache.key_length(n_new) if cache is not None else n_new
        if mask is not None:
            H = self.config.n_heads
            if (mask.dtype != torch.bool or mask.dim() != 4 or tuple(mask.shape[-2:]) != (n_new, n_keys)
                    or mask.shape[0] not in (1, B) or mask.shape[1] not in (1, H)):
                raise ValueError(f"mask must be a boolean ({B}|1, {H}|1, {n_new}, {n_keys}) tensor (batch, heads, "
                                 f"queries, keys), got {mask.dtype} {tuple(mask.shape)}")
        if isinstance(cache, StaticKVCache):
            if mask is None:
                raise ValueError("a StaticKVCache is read whole: pass mask= (batch|1, 1, N, capacity) saying "
                                 "which positions each query may see")
            if self.relative_bias is not None and (cache.index is None or cache.index.shape != (n_new,)):
                shape = None if cache.index is None else tuple(cache.index.shape)
                raise ValueError(f"a relative position bias reads the queries' positions from StaticKVCache.index: "
                                 f"set it to the {n_new} positions being written, got {shape}")
        # A stack compiled by `unitok.compile` had its masks checked before its graph (`checked_masks`,
        # this call's ``_masks_checked``); traced any other way, it checks them here, as eager does.
        if not _masks_checked:
            attention_mask, encoder_attention_mask = self.checked_masks(
                x, attention_mask, cache, encoder_hidden_states, encoder_attention_mask)
        causal = self.config.causal if causal is None else causal
        if mask is not None:
            is_causal = False
        elif attention_mask is None and causal and n_new == n_keys:
            mask, is_causal = None, True
        elif attention_mask is None and causal and n_new == 1:
            mask, is_causal = None, False  # one new query may see every cached key
        else:
            mask = build_attention_mask(n_new, n_keys, causal, attention_mask, x.device)
            is_causal = False
        if self.relative_bias is not None:
            # T5: one bias table for every layer, for queries at positions past .. past + N − 1.
            if is_causal:
                mask, is_causal = causal_mask(n_new, n_keys, x.device)[None, None], False
            if isinstance(cache, StaticKVCache):  # the queries sit where they are written, keys 0..capacity-1
                bias = self.relative_bias.at(cache.index, n_keys).to(x.dtype)  # type: ignore[arg-type]
            else:
                bias = self.relative_bias(n_new, n_keys, n_keys - n_new).to(x.dtype)
            mask = add_position_bias(bias, mask)
        memory_mask = None
        if encoder_hidden_states is not None and encoder_attention_mask is not None:
            memory_mask = encoder_attention_mask.bool()[:, None, None, :]
        padding = attention_mask[:, -n_new:].bool() if attention_mask is not None else None
        ctx = AttentionContext(mask=mask, is_causal=is_causal, cache=cache, kernel=kernel,
                               attentions=[] if output_attentions else None, memory=encoder_hidden_states,
                               memory_mask=memory_mask, padding=padding)
        if keep_last is not None:
            self._check_keep(keep_last, n_new, is_causal or causal, cache, output_hidden_states or output_attentions)
        hidden: list[Tensor] | None = [x] if output_hidden_states else None
        last = len(self.blocks) - 1
        for i, block in enumerate(self.blocks):
            x = block(x, ctx, keep_last if i == last else None)
            if hidden is not None:
                hidden.append(x)
        if self.norm is not None:
            x = self.norm(x)
            if hidden is not None:
                hidden[-1] = x
        return BackboneOutput(
            last_hidden_state=x,
            hidden_states=tuple(hidden) if hidden is not None else None,
            attentions=tuple(ctx.attentions) if ctx.attentions is not None else None,
            cache=cache,
        )


    def _check_keep(self, keep: int | Tensor, n: int, causal: bool, cache: KVCache | None, outputs: bool) -> None:
        if isinstance(keep, Tensor):
            if keep.dim() != 1 or keep.dtype != torch.long or not len(keep):
                raise ValueError(f"keep_last positions must be a non-empty (R,) long tensor, got {keep.dtype} "
                                 f"{tuple(keep.shape)}")
            bad = (keep[0] < 0) | (keep[-1] >= n) | (keep[1:] <= keep[:-1]).any()  # one host sync, not three
            if bool(bad):
                raise ValueError(f"keep_last positions must increase within 0..{n - 1}, got {keep.tolist()}")
        elif isinstance(keep, bool) or not isinstance(keep, int) or not 1 <= keep <= n:
            raise ValueError(f"keep_last must be a number of tokens in 1..{n} or a tensor of positions, got {keep!r}")
        elif causal:
            raise ValueError("keep_last=R (the first R tokens) needs a bidirectional stack; a causal one takes "
                             "a tensor of positions")
        if cache is not None or outputs:
            raise ValueError("keep_last needs no cache, and no per-layer hidden states or attentions (they would "
                             "be cut short)")
        if not self.blocks[-1].answers_a_subset():
            raise ValueError(f"keep_last needs a last block of self-attention then position-wise sublayers; this "
                             f"one has {self.config.block}")


def init_weights(module: nn.Module, std: float = 0.02, residual_std: float | None = None) -> None:
    """GPT-2 style init: normal(0, std) linears/embeddings, zero biases, unit norms;
    output projections of residual branches scaled by ``residual_std`` when given."""
    for name, m in module.named_modules():
        if isinstance(m, nn.Linear):
            s = residual_std if residual_std is not None and name.endswith(("proj", "fc_out")) else std
            nn.init.normal_(m.weight, 0.0, s)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, 0.0, std)
        elif isinstance(m, nn.LayerNorm):
            if m.weight is not None:
                nn.init.ones_(m.weight)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
