"""T5's bucketed relative position bias: one learned scalar per (bucket, head), added to the
attention scores of every layer (Raffel et al., 2020, §2.1).

Axis legend: N query positions, T key positions, H heads.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

CACHE_LIMIT = 2048  # positions up to which the (query, key) bucket table is kept (2048² ids: 32 MiB)


def exact_buckets(num_buckets: int, bidirectional: bool) -> int:
    """How many of a direction's buckets hold one distance each (0, 1, …): half of its buckets,
    where a bidirectional bias gives each direction half of ``num_buckets``."""
    return (num_buckets // 2 if bidirectional else num_buckets) // 2


def check_relative_buckets(num_buckets: int, max_distance: int, bidirectional: bool,
                           names: tuple[str, str] = ("num_buckets", "max_distance")) -> None:
    """Refuse bucket settings T5's formula cannot map: it needs at least one exact bucket per
    direction, and ``max_distance`` beyond the exact ones (the log-spaced buckets span
    exact … max_distance; at or below it the log's scale is 0 or negative and the ids fold
    back, go negative or overflow). ``names``: the two settings' names in the caller's config."""
    buckets_name, distance_name = names
    direction = "bidirectional" if bidirectional else "causal"
    exact = exact_buckets(num_buckets, bidirectional)
    if exact < 1:
        raise ValueError(f"a {direction} relative position bias needs {buckets_name} ≥ {4 if bidirectional else 2}, "
                         f"got {num_buckets}")
    if max_distance <= exact:
        raise ValueError(f"a {direction} relative position bias of {num_buckets} buckets has {exact} exact ones "
                         f"(distances 0…{exact - 1}): {distance_name} must be > {exact}, got {max_distance}")


def relative_position_bucket(relative: Tensor, bidirectional: bool, num_buckets: int, max_distance: int) -> Tensor:
    """Map key − query offsets to buckets: exact for small distances, log-spaced up to
    ``max_distance``, one bucket beyond. Bidirectional: half the buckets for each direction;
    causal: only offsets ≤ 0 (looking back) are distinguished."""
    check_relative_buckets(num_buckets, max_distance, bidirectional)
    exact = exact_buckets(num_buckets, bidirectional)
    buckets = torch.zeros_like(relative)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative > 0).long() * num_buckets
        distance = relative.abs()
    else:
        distance = (-relative).clamp(min=0)
    # log-spaced buckets for distances in [exact, max_distance); clamp before the log keeps it finite
    scaled = torch.log(distance.clamp(min=1).float() / exact) / math.log(max_distance / exact) * (num_buckets - exact)
    far = (exact + scaled.long()).clamp(max=num_buckets - 1)
    return buckets + torch.where(distance < exact, distance, far)


class RelativePositionBias(nn.Module):
    """(1, H, N, T) bias for N queries at positions offset..offset+N−1 against keys 0..T−1."""

    def __init__(self, n_heads: int, num_buckets: int = 32, max_distance: int = 128, bidirectional: bool = True,
                 device=None, dtype=None) -> None:
        super().__init__()
        check_relative_buckets(num_buckets, max_distance, bidirectional)
        self.num_buckets, self.max_distance, self.bidirectional = num_buckets, max_distance, bidirectional
        self.weight = nn.Parameter(torch.zeros(num_buckets, n_heads, device=device, dtype=dtype))
        self._table: Tensor | None = None  # buckets of every (query, key) pair up to a size, built once

    def buckets(self, n_queries: int, n_keys: int, offset: int = 0) -> Tensor:
        """(N, T) bucket ids. A bucket depends only on key − query, so one table of all pairs
        up to the longest sequence seen serves every call (a decoder asks once per token);
        beyond ``CACHE_LIMIT`` positions they are computed each time instead."""
        device, need = self.weight.device, max(offset + n_queries, n_keys)
        if need > CACHE_LIMIT:
            queries = torch.arange(offset, offset + n_queries, device=device)[:, None]
            keys = torch.arange(n_keys, device=device)[None, :]
            return relative_position_bucket(keys - queries, self.bidirectional, self.num_buckets, self.max_distance)
        table = self._table
        if table is None or table.shape[0] < need or table.device != device:
            size = min(CACHE_LIMIT, max(need, 64, 2 * (table.shape[0] if table is not None else 0)))
            # a normal tensor even when first asked for under inference_mode (validation), so
            # training can index with it afterwards
            with torch.inference_mode(False), torch.no_grad():
                positions = torch.arange(size, device=device)
                table = relative_position_bucket(positions[None, :] - positions[:, None], self.bidirectional,
                                                 self.num_buckets, self.max_distance)
            self._table = table
        return table[offset:offset + n_queries, :n_keys]

    def forward(self, n_queries: int, n_keys: int, offset: int = 0) -> Tensor:
        bucket = self.buckets(n_queries, n_keys, offset)
        return self.weight[bucket].permute(2, 0, 1)[None]  # (N, T, H) -> (1, H, N, T)

    def at(self, queries: Tensor, n_keys: int) -> Tensor:
        """(1, H, N, T) bias for queries at the (N,) positions ``queries`` against keys 0..T−1: a
        `StaticKVCache`'s write index, a tensor read without a host sync (a compiled decode step)."""
        keys = torch.arange(n_keys, device=queries.device)
        bucket = relative_position_bucket(keys[None, :] - queries[:, None], self.bidirectional, self.num_buckets,
                                          self.max_distance)
        return self.weight[bucket].permute(2, 0, 1)[None]
