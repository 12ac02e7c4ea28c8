"""Multi-head attention: the kernel (SDPA or a plain reference) apart from the projections.

Axis legend: B batch, N query tokens, T key tokens, S encoder tokens, D model width, H heads,
K head width. Masks broadcast to (B, H, N, T): boolean (True means "may attend") or float,
added to the scores (a position bias with -inf where attention is not allowed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from unitok.checks import host_values
from unitok.layers.fused_linear import linear
from unitok.layers.kv_cache import KVCache

Kernel = Literal["sdpa", "reference"]
_CPU_HALF = (torch.bfloat16, torch.float16)


def reference_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, is_causal: bool = False,
    scale: float | None = None, dropout_p: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """softmax(q kᵀ · scale + mask) v, written out; also returns the (B, H, N, T) weights."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * scale  # (B, H, N, T)
    if is_causal:
        mask = causal_mask(q.shape[-2], k.shape[-2], q.device)
    if mask is not None and mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask, float("-inf"))
    elif mask is not None:
        scores = scores + mask  # additive: position bias and -inf for masked keys
    weights = scores.softmax(dim=-1)
    dropped = F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights
    return dropped @ v, weights


def sdpa_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, is_causal: bool = False,
    scale: float | None = None, dropout_p: float = 0.0,
) -> Tensor:
    """The same math through PyTorch's fused ``scaled_dot_product_attention``."""
    if q.device.type == "cpu" and q.dtype in _CPU_HALF:
        if q.dtype == torch.bfloat16 and q.shape[-2] * k.shape[-2] <= SHORT_BF16_SCORES:
            return _short_bf16_attention(q, k, v, mask, is_causal, scale, dropout_p)
        # PyTorch's CPU flash-attention kernel is slower in bf16 / fp16 than in fp32 (forward +
        # backward ≈ 1.8× the time at head width 64, AVX-512 BF16): attend in fp32 (autocast off,
        # or it would cast back), return the input dtype. Only more precise than the half kernel.
        with torch.autocast("cpu", enabled=False):
            float_mask = mask if mask is None or mask.dtype == torch.bool else mask.float()
            out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=float_mask,
                                                 is_causal=is_causal and mask is None, scale=scale,
                                                 dropout_p=dropout_p)
        return out.to(q.dtype)
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=is_causal and mask is None, scale=scale, dropout_p=dropout_p
    )


# Scores per head (N · T) up to which bf16 attention on the CPU is written out in the
# input dtype rather than run by the fp32 flash kernel. Forward + backward, bf16, head width 64,
# one Zen 4 thread: N = T = 128 causal 5.0 ms against 8.8 (B=8, H=4); 197 (a ViT) 6.9 against
# 15.2; 256 19 against 27; 1,024 301 against 224 (the written-out path also keeps the (B, H, N, T)
# weights for backward, which the flash kernel does not).
SHORT_BF16_SCORES = 256 * 256


def _short_bf16_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool,
                          scale: float | None, dropout_p: float) -> Tensor:
    """Attention written out in bf16, as a bf16 attention kernel computes it (products accumulated
    in fp32 and rounded; the softmax in fp32, its weights rounded; an fp32 bias added in fp32)."""
    with torch.autocast("cpu", enabled=False):
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
        scores = (q @ k.transpose(-2, -1)).mul_(scale)  # (B, H, N, T); matmul keeps q and k, not this
        if is_causal and mask is None:
            mask = causal_mask(q.shape[-2], k.shape[-2], q.device)
        if mask is not None and mask.dtype == torch.bool:
            scores = scores.masked_fill_(~mask, float("-inf"))
        elif mask is not None:
            scores = scores + mask  # additive (position bias, -inf for masked keys); fp32 if the bias is
        weights = scores.softmax(dim=-1).to(q.dtype)
        if dropout_p > 0:
            weights = F.dropout(weights, p=dropout_p)
        return weights @ v


def causal_mask(n_queries: int, n_keys: int, device: torch.device | None = None) -> Tensor:
    """(N, T) lower-triangular mask; queries are the last ``n_queries`` of the ``n_keys`` positions."""
    offset = n_keys - n_queries
    return torch.ones(n_queries, n_keys, dtype=torch.bool, device=device).tril(diagonal=offset)


def build_attention_mask(
    n_queries: int, n_keys: int, causal: bool, key_padding_mask: Tensor | None,
    device: torch.device | None = None,
) -> Tensor | None:
    """Combine causal and padding masks into one (B|1, 1, N, T) boolean mask, or None if no mask.

    ``key_padding_mask`` is (B, T), 1/True for real tokens. Under a causal mask a padding query
    could see no key at all (left padding) and produce NaN, so there every query may attend to
    its own position; what those padding positions compute is never used.
    """
    if key_padding_mask is None:
        if not causal:
            return None
        return causal_mask(n_queries, n_keys, device)[None, None]
    if key_padding_mask.shape[-1] != n_keys:
        raise ValueError(f"attention_mask covers {key_padding_mask.shape[-1]} positions, expected {n_keys}")
    keys = key_padding_mask.bool()
    mask = keys[:, None, None, :].expand(-1, 1, n_queries, n_keys)
    if causal:
        return (mask & causal_mask(n_queries, n_keys, device)) | _diagonal(n_queries, n_keys, device)
    # Bidirectional: every query sees the real keys (padding queries too, as the references
    # compute them: their values feed later convolutions); only an all-padding row needs its diagonal.
    empty = ~keys.any(dim=-1)
    if torch.compiler.is_compiling() or bool(empty.any()):  # (compiled: no host read, the same mask)
        mask = mask | (_diagonal(n_queries, n_keys, device) & empty[:, None, None, None])
    return mask


def check_padding_mask(mask: Tensor, shape: tuple[int, int], name: str = "attention_mask") -> tuple[bool, list[int]]:
    """Refuse a padding mask that is not ``shape`` (batch, keys) of 1 (a real token) and 0
    (padding): an additive mask (0 / -10000), a 0/2 or a 0.3 mask would be read as something else.
    Returns whether every position is real and which rows are all padding, read in one transfer
    (the host sync that choosing the fused kernel's unmasked path takes anyway)."""
    if tuple(mask.shape) != tuple(shape):
        raise ValueError(f"{name} must be {tuple(shape)} (batch, keys), got {tuple(mask.shape)}")
    if mask.dtype.is_complex:
        raise TypeError(f"{name} must hold 1 for a real token and 0 for padding (bool, integer or float), "
                        f"got {mask.dtype}")
    if not mask.numel():
        return True, []
    values = host_values(mask)  # under torch.func.vmap: every sample's, (samples, B, keys)
    if values.dim() > 2:  # every sample's rows as rows of one batch; a row's index read modulo B
        values = values.reshape(-1, values.shape[-1])
    lo, hi = torch.aminmax(values, dim=-1)  # (rows,) each: 0/1 integers lie in [0, 1]
    rows = [lo, hi]
    if values.is_floating_point():  # 0.3 lies in [0, 1] too, and NaN compares as nothing
        rows.append(((values != 0) & (values != 1)).any(dim=-1).to(values.dtype))
    stats = torch.stack(rows).tolist()
    lo_rows, hi_rows = stats[0], stats[1]
    if min(lo_rows) < 0 or max(hi_rows) > 1 or (len(stats) > 2 and any(stats[2])):
        found = values[(values != 0) & (values != 1)].unique()[:5].tolist()
        raise ValueError(f"{name} holds {found}: expected 1 for a real token and 0 for padding "
                         "(a padding mask, not an additive one)")
    B = shape[0]
    return min(lo_rows) == 1, sorted({row % B for row, top in enumerate(hi_rows) if top == 0})


def add_position_bias(bias: Tensor, mask: Tensor | None) -> Tensor:
    """A (1, H, N, T) additive bias with a boolean (B|1, 1, N, T) mask folded in as -inf."""
    if mask is None:
        return bias
    return bias.masked_fill(~mask, float("-inf"))


def _diagonal(n_queries: int, n_keys: int, device: torch.device | None) -> Tensor:
    """(N, T) mask of each query's own position (queries are the last N of T)."""
    rows = torch.arange(n_queries, device=device)[:, None] + (n_keys - n_queries)
    return rows == torch.arange(n_keys, device=device)[None, :]


@dataclass
class AttentionContext:
    """What every attention sublayer of one forward pass shares: mask, cache, kernel, outputs,
    and for cross-attention the encoder's states (``memory``) with their mask."""

    mask: Tensor | None = None
    is_causal: bool = False
    cache: KVCache | None = None
    kernel: Kernel = "sdpa"
    attentions: list[Tensor] | None = None  # filled with (B, H, N, T) weights when requested
    memory: Tensor | None = None  # (B, S, D) encoder output read by cross-attention
    memory_mask: Tensor | None = None  # (B, 1, 1, S) boolean, None when nothing is padded
    padding: Tensor | None = None  # (B, N) True for real tokens, for sublayers that mix along N (convolution)


def _attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool, scale: float | None,
            dropout_p: float, ctx: AttentionContext) -> Tensor:
    """Run the kernel the context asks for; record weights when asked."""
    if ctx.attentions is not None or ctx.kernel == "reference":
        out, weights = reference_attention(q, k, v, mask, is_causal, scale, dropout_p)
        if ctx.attentions is not None:
            ctx.attentions.append(weights)
        return out
    return sdpa_attention(q, k, v, mask, is_causal, scale, dropout_p)


class _MultiHead(nn.Module):
    """Shape and settings shared by self- and cross-attention: H heads of width K; subclasses
    create their input projections, then the output projection ``proj`` (in that order, so
    seeded initialisation stays as it was)."""

    def __init__(self, d_model: int, n_heads: int, bias: bool, dropout: float, scale: float | None,
                 layer_idx: int, head_dim: int | None, device=None, dtype=None) -> None:
        super().__init__()
        if head_dim is None and d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.n_heads = n_heads
        self.head_dim = head_dim if head_dim is not None else d_model // n_heads
        self.inner = n_heads * self.head_dim
        self.scale, self.dropout, self.layer_idx = scale, dropout, layer_idx

    def _output(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool,
                ctx: AttentionContext) -> Tensor:
        """(B, H, N, K) queries against (B, H, T, K) keys/values -> (B, N, D)."""
        B, _, N, _ = q.shape
        dropout_p = self.dropout if self.training else 0.0
        out = _attend(q, k, v, mask, is_causal, self.scale, dropout_p, ctx)
        return linear(out.transpose(1, 2).reshape(B, N, self.inner), self.proj)


class SelfAttention(_MultiHead):
    """Multi-head self-attention with fused QKV projection and an optional KV cache.

    Args:
        d_model: model width D. n_heads: heads H. head_dim: K (default D / H; T5 allows H·K ≠ D).
        bias: biases on the projections. dropout: dropout on attention weights.
        scale: score scale; None means 1/sqrt(K) (T5 uses 1).
        layer_idx: which slot of the KV cache this layer uses.
    """

    def __init__(
        self, d_model: int, n_heads: int, bias: bool = True, dropout: float = 0.0,
        scale: float | None = None, layer_idx: int = 0, head_dim: int | None = None, device=None, dtype=None,
    ) -> None:
        super().__init__(d_model, n_heads, bias, dropout, scale, layer_idx, head_dim, device, dtype)
        self.qkv = nn.Linear(d_model, 3 * self.inner, bias=bias, device=device, dtype=dtype)
        self.proj = nn.Linear(self.inner, d_model, bias=bias, device=device, dtype=dtype)

    def forward(self, x: Tensor, ctx: AttentionContext, queries: int | Tensor | None = None) -> Tensor:
        """(B, N, D) -> (B, N, D); with ``queries`` only some tokens ask, still reading all N as keys
        and values (a head that reads a few positions needs no more from the last layer):
        Q = an int, the first Q tokens (bidirectional only) -> (B, Q, D); a (Q,) tensor of
        positions, those tokens, causal or not -> (B, Q, D). No cache."""
        B, N, _ = x.shape
        q, k, v = linear(x, self.qkv).view(B, N, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        if ctx.cache is not None:
            k, v = ctx.cache.update(self.layer_idx, k, v)  # (B, H, T, K) with T ≥ N
        if queries is None:
            return self._output(q, k, v, ctx.mask, ctx.is_causal, ctx)
        if ctx.cache is not None:
            raise ValueError("an attention with a cache cannot answer a subset of queries")
        if isinstance(queries, int):
            if ctx.is_causal:
                raise ValueError("only a bidirectional attention answers its first Q queries; pass positions")
            mask = ctx.mask[..., :queries, :] if ctx.mask is not None else None
            return self._output(q[:, :, :queries], k, v, mask, False, ctx)
        # the kept rows of the mask; causal without a mask: row i sees keys 0..queries[i]
        if ctx.mask is not None:
            mask = ctx.mask[..., queries, :]
        elif ctx.is_causal:
            mask = (torch.arange(N, device=x.device) <= queries[:, None])[None, None]  # (1, 1, Q, N)
        else:
            mask = None
        return self._output(q[:, :, queries], k, v, mask, False, ctx)


class CrossAttention(_MultiHead):
    """Multi-head attention from the tokens (queries) to an encoder's output (keys, values).

    The encoder output is fixed while a decoder generates, so its keys and values are computed
    once and kept in the cache (``KVCache.cross``). Arguments as for `SelfAttention`.
    """

    def __init__(
        self, d_model: int, n_heads: int, bias: bool = True, dropout: float = 0.0,
        scale: float | None = None, layer_idx: int = 0, head_dim: int | None = None, device=None, dtype=None,
    ) -> None:
        super().__init__(d_model, n_heads, bias, dropout, scale, layer_idx, head_dim, device, dtype)
        self.q = nn.Linear(d_model, self.inner, bias=bias, device=device, dtype=dtype)
        self.kv = nn.Linear(d_model, 2 * self.inner, bias=bias, device=device, dtype=dtype)
        self.proj = nn.Linear(self.inner, d_model, bias=bias, device=device, dtype=dtype)

    def memory_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """(B, S, D) encoder states -> (B, H, S, K) keys and values."""
        B, S, _ = memory.shape
        k, v = linear(memory, self.kv).view(B, S, 2, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        return k, v

    def forward(self, x: Tensor, ctx: AttentionContext) -> Tensor:  # (B, N, D) -> (B, N, D)
        if ctx.memory is None:
            raise ValueError("a cross-attention sublayer needs encoder states: pass encoder_hidden_states")
        B, N, _ = x.shape
        q = linear(x, self.q).view(B, N, self.n_heads, self.head_dim).transpose(1, 2)
        cached = ctx.cache.cross.get(self.layer_idx) if ctx.cache is not None else None
        if cached is None:
            k, v = self.memory_kv(ctx.memory)
            if ctx.cache is not None:
                ctx.cache.cross[self.layer_idx] = (k, v)
        else:
            k, v = cached
        if k.shape[0] != B:
            if ctx.cache is None:  # only decoding (a cache) runs several beams per source row
                raise ValueError(f"encoder_hidden_states hold {k.shape[0]} rows for {B} decoder rows: "
                                 "give one row of encoder states per decoder row")
            return self._grouped_output(q, k, v, ctx)
        return self._output(q, k, v, ctx.memory_mask, False, ctx)

    def _grouped_output(self, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext) -> Tensor:
        """(B, H, N, K) queries, G = B / S adjacent rows per encoder row (beam search: the beams
        of one source), against that row's (S, H, T, K) keys and values -> (B, N, D). The G rows'
        queries attend as one row's G·N queries: the same attention, its keys and values read
        once instead of G times (T5 D=256 beam search: the cross-attention's time a step /4)."""
        B, H, N, K = q.shape
        S = k.shape[0]
        if B % S:
            raise ValueError(f"{B} query rows cannot share the keys and values of {S} encoder rows")
        G, mask = B // S, ctx.memory_mask
        if ctx.attentions is not None or ctx.kernel == "reference":  # per-row weights: repeat the keys instead
            mask = mask.repeat_interleave(G, dim=0) if mask is not None else None
            return self._output(q, k.repeat_interleave(G, dim=0), v.repeat_interleave(G, dim=0), mask, False, ctx)
        grouped = q.view(S, G, H, N, K).transpose(1, 2).reshape(S, H, G * N, K)
        out = _attend(grouped, k, v, mask, False, self.scale, self.dropout if self.training else 0.0, ctx)
        out = out.view(S, H, G, N, K).permute(0, 2, 3, 1, 4).reshape(B, N, self.inner)  # rows (s, g), as q's
        return linear(out, self.proj)
