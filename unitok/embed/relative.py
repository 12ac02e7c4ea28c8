"""T5's bucketed relative position bias: one learned scalar per (bucket, head), added to the
attention scores of every layer (Raffel et al., 2020, §2.1).

Axis legend: N query positions, T key positions, H heads.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def relative_position_bucket(relative: Tensor, bidirectional: bool, num_buckets: int, max_distance: int) -> Tensor:
    """Map key − query offsets to buckets: exact for small distances, log-spaced up to
    ``max_distance``, one bucket beyond. Bidirectional: half the buckets for each direction;
    causal: only offsets ≤ 0 (looking back) are distinguished."""
    buckets = torch.zeros_like(relative)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative > 0).long() * num_buckets
        distance = relative.abs()
    else:
        distance = (-relative).clamp(min=0)
    exact = num_buckets // 2
    # log-spaced buckets for distances in [exact, max_distance); clamp before the log keeps it finite
    scaled = torch.log(distance.clamp(min=1).float() / exact) / math.log(max_distance / exact) * (num_buckets - exact)
    far = (exact + scaled.long()).clamp(max=num_buckets - 1)
    return buckets + torch.where(distance < exact, distance, far)


class RelativePositionBias(nn.Module):
    """(1, H, N, T) bias for N queries at positions offset..offset+N−1 against keys 0..T−1."""

    def __init__(self, n_heads: int, num_buckets: int = 32, max_distance: int = 128, bidirectional: bool = True,
                 device=None, dtype=None) -> None:
        super().__init__()
        if num_buckets < 2 or max_distance < 2:
            raise ValueError(f"need num_buckets ≥ 2 and max_distance ≥ 2, got {num_buckets}, {max_distance}")
        self.num_buckets, self.max_distance, self.bidirectional = num_buckets, max_distance, bidirectional
        self.weight = nn.Parameter(torch.zeros(num_buckets, n_heads, device=device, dtype=dtype))

    def forward(self, n_queries: int, n_keys: int, offset: int = 0) -> Tensor:
        device = self.weight.device
        queries = torch.arange(offset, offset + n_queries, device=device)[:, None]
        keys = torch.arange(n_keys, device=device)[None, :]
        bucket = relative_position_bucket(keys - queries, self.bidirectional, self.num_buckets, self.max_distance)
        return self.weight[bucket].permute(2, 0, 1)[None]  # (N, T, H) -> (1, H, N, T)
