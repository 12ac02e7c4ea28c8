"""Normalisation layers: LayerNorm (with or without bias) and RMSNorm.

Axis legend: B batch, N tokens, D model width.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

NormKind = Literal["layernorm", "rmsnorm"]


class RMSNorm(nn.Module):
    """Root-mean-square norm: x / sqrt(mean(x²) + eps) * weight, no centring, no bias (T5)."""

    def __init__(self, dim: int, eps: float = 1e-6, device=None, dtype=None) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))

    def forward(self, x: Tensor) -> Tensor:  # (B, N, D) -> (B, N, D)
        # Compute the statistic in float32 so half-precision runs do not lose the tiny values.
        variance = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(variance + self.eps)).to(x.dtype) * self.weight


def make_norm(kind: NormKind, dim: int, eps: float, bias: bool = True, device=None, dtype=None) -> nn.Module:
    """Build the norm named by a config field."""
    if kind == "layernorm":
        return nn.LayerNorm(dim, eps=eps, bias=bias, device=device, dtype=dtype)
    if kind == "rmsnorm":
        return RMSNorm(dim, eps=eps, device=device, dtype=dtype)
    raise ValueError(f"unknown norm {kind!r}; expected 'layernorm' or 'rmsnorm'")
