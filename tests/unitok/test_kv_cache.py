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


def test_reorder_keeps_the_preallocated_buffer_and_later_appends_land_after_it():
    """Beam search permutes rows every step: the capacity buffer is reused (no reallocation),
    the filled part is permuted, and appends after a reorder continue where it ended."""
    cache = KVCache(n_layers=1, capacity=16)
    first = torch.arange(3.0)[:, None, None, None].expand(3, 1, 2, 1).contiguous()
    cache.update(0, first, first)
    buffer = cache._keys[0]
    cache.reorder(torch.tensor([1, 0, 0]))
    assert cache._keys[0] is buffer and buffer.shape[2] == 16
    k, _ = cache.update(0, torch.full((3, 1, 1, 1), 9.0), torch.full((3, 1, 1, 1), 9.0))
    assert k[:, 0, :, 0].tolist() == [[1.0, 1.0, 9.0], [0.0, 0.0, 9.0], [0.0, 0.0, 9.0]]


def test_reorder_to_another_row_count_builds_new_buffers():
    cache = KVCache(n_layers=1, capacity=8)
    cache.update(0, torch.randn(2, 1, 3, 4), torch.randn(2, 1, 3, 4))
    cache.reorder(torch.tensor([0, 0, 1, 1]))  # expanding a batch to 2 beams each
    assert cache.layer(0)[0].shape == (4, 1, 3, 4)
    assert torch.equal(cache.layer(0)[0][0], cache.layer(0)[0][1])
