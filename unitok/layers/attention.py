"""Multi-head attention: the kernel (SDPA or a plain reference) apart from the projections.

Axis legend: B batch, N query tokens, T key tokens, D model width, H heads, K head width.
Masks are boolean and broadcast to (B, H, N, T); True means "may attend".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from unitok.layers.kv_cache import KVCache

Kernel = Literal["sdpa", "reference"]


def reference_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, is_causal: bool = False,
    scale: float | None = None, dropout_p: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """softmax(q kᵀ · scale + mask) v, written out; also returns the (B, H, N, T) weights."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * scale  # (B, H, N, T)
    if is_causal:
        mask = causal_mask(q.shape[-2], k.shape[-2], q.device)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)
    dropped = F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights
    return dropped @ v, weights


def sdpa_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, is_causal: bool = False,
    scale: float | None = None, dropout_p: float = 0.0,
) -> Tensor:
    """The same math through PyTorch's fused ``scaled_dot_product_attention``."""
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=is_causal and mask is None, scale=scale, dropout_p=dropout_p
    )


def causal_mask(n_queries: int, n_keys: int, device: torch.device | None = None) -> Tensor:
    """(N, T) lower-triangular mask; queries are the last ``n_queries`` of the ``n_keys`` positions."""
    offset = n_keys - n_queries
    return torch.ones(n_queries, n_keys, dtype=torch.bool, device=device).tril(diagonal=offset)


def build_attention_mask(
    n_queries: int, n_keys: int, causal: bool, key_padding_mask: Tensor | None,
    device: torch.device | None = None,
) -> Tensor | None:
    """Combine causal and padding masks into one (B|1, 1, N, T) boolean mask, or None if no mask.

    ``key_padding_mask`` is (B, T), 1/True for real tokens. A padding query could otherwise see
    no key at all (left padding + causal) and produce NaN, so every query may attend to its own
    position; what padding positions compute is never used.
    """
    if key_padding_mask is None:
        if not causal:
            return None
        return causal_mask(n_queries, n_keys, device)[None, None]
    if key_padding_mask.shape[-1] != n_keys:
        raise ValueError(f"attention_mask covers {key_padding_mask.shape[-1]} positions, expected {n_keys}")
    mask = key_padding_mask.bool()[:, None, None, :].expand(-1, 1, n_queries, n_keys)
    if causal:
        mask = mask & causal_mask(n_queries, n_keys, device)
    return mask | _diagonal(n_queries, n_keys, device)


def _diagonal(n_queries: int, n_keys: int, device: torch.device | None) -> Tensor:
    """(N, T) mask of each query's own position (queries are the last N of T)."""
    rows = torch.arange(n_queries, device=device)[:, None] + (n_keys - n_queries)
    return rows == torch.arange(n_keys, device=device)[None, :]


@dataclass
class AttentionContext:
    """What every attention sublayer of one forward pass shares: mask, cache, kernel, outputs."""

    mask: Tensor | None = None
    is_causal: bool = False
    cache: KVCache | None = None
    kernel: Kernel = "sdpa"
    attentions: list[Tensor] | None = None  # filled with (B, H, N, T) weights when requested


class SelfAttention(nn.Module):
    """Multi-head self-attention with fused QKV projection and an optional KV cache.

    Args:
        d_model: model width D. n_heads: heads H (D must divide by H).
        bias: biases on the projections. dropout: dropout on attention weights.
        scale: score scale; None means 1/sqrt(K).
        layer_idx: which slot of the KV cache this layer uses.
    """

    def __init__(
        self, d_model: int, n_heads: int, bias: bool = True, dropout: float = 0.0,
        scale: float | None = None, layer_idx: int = 0, device=None, dtype=None,
    ) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.scale = scale
        self.dropout = dropout
        self.layer_idx = layer_idx
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias, device=device, dtype=dtype)
        self.proj = nn.Linear(d_model, d_model, bias=bias, device=device, dtype=dtype)

    def forward(self, x: Tensor, ctx: AttentionContext) -> Tensor:  # (B, N, D) -> (B, N, D)
        B, N, D = x.shape
        q, k, v = self.qkv(x).view(B, N, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        if ctx.cache is not None:
            k, v = ctx.cache.update(self.layer_idx, k, v)  # (B, H, T, K) with T ≥ N
        dropout_p = self.dropout if self.training else 0.0
        if ctx.attentions is not None or ctx.kernel == "reference":
            out, weights = reference_attention(q, k, v, ctx.mask, ctx.is_causal, self.scale, dropout_p)
            if ctx.attentions is not None:
                ctx.attentions.append(weights)
        else:
            out = sdpa_attention(q, k, v, ctx.mask, ctx.is_causal, self.scale, dropout_p)
        return self.proj(out.transpose(1, 2).reshape(B, N, D))
