"""KVCache: appends past its capacity without losing entries, reorders beams."""

from __future__ import annotations

import pytest
import torch

from unitok.layers import KVCache


def test_appends_grow_past_capacity_and_keep_everything():
    cache = KVCache(n_layers=2, capacity=3)
    chunks = [torch.randn(2, 1, n, 4) for n in (2, 3, 1)]
    for chunk in chunks:
        k, v = cache.update(0, chunk, -chunk)
    expected = torch.cat(chunks, dim=2)
    assert torch.equal(k, expected) and torch.equal(v, -expected)
    assert cache.seq_len == 6 and len(cache) == 6
    assert torch.equal(cache.layer(0)[0], expected)
    with pytest.raises(IndexError, match="layer 1 has nothing cached"):
        cache.layer(1)


def test_reorder_selects_batch_rows():
    cache = KVCache(n_layers=1)
    keys = torch.arange(3.0)[:, None, None, None].expand(3, 1, 2, 1).contiguous()
    cache.update(0, keys, keys)
    cache.reorder(torch.tensor([2, 2, 0]))
    assert cache.layer(0)[0][:, 0, 0, 0].tolist() == [2.0, 2.0, 0.0]
