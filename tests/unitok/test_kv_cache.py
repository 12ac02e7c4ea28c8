"""KVCache: appends past its capacity without losing entries, reorders beams."""

from __future__ import annotations

import pytest
import torch

from unitok.layers import KVCache, StaticKVCache
from unitok.layers.kv_cache import static_capacity


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


@pytest.mark.parametrize("step", [(1, 2, 1, 4), (3, 2, 1, 4), (2, 1, 1, 4), (2, 2, 1, 8)],
                         ids=["fewer rows", "more rows", "other heads", "other width"])
def test_keys_that_do_not_continue_the_cache_are_refused_before_anything_is_written(step):
    cache = KVCache(n_layers=1, capacity=8)  # preallocated, as generate makes it: a step could broadcast into it
    first = torch.randn(2, 2, 3, 4)
    cache.update(0, first, -first)
    with pytest.raises(ValueError, match=rf"new keys of shape \({', '.join(map(str, step))}\) \(batch, heads, tokens, "
                                         r"width\) do not continue this cache of 2 rows, 2 heads and width 4"):
        cache.update(0, torch.ones(step), torch.ones(step))
    assert cache.seq_len == 3 and torch.equal(cache.layer(0)[0], first)  # untouched
    static = StaticKVCache(n_layers=1, capacity=8)
    static.index = torch.arange(3)
    static.update(0, first, -first)
    static.index = torch.tensor([3])
    with pytest.raises(ValueError, match="do not continue this cache of 2 rows"):
        static.update(0, torch.ones(step), torch.ones(step))


@pytest.mark.parametrize("index, message", [
    (torch.tensor([3, 3]), r"distinct positions within 0..7, got \[3, 3\]"),  # one token's keys would be lost
    (torch.tensor([8]), r"distinct positions within 0..7, got \[8\]"),
    (torch.tensor([-1, 0]), r"distinct positions within 0..7, got \[-1, 0\]"),
    (torch.tensor([[0, 1]]), r"a \(N,\) long tensor of positions, got torch.int64 \(1, 2\)"),
    (torch.tensor([0.0]), r"a \(N,\) long tensor of positions, got torch.float32 \(1,\)"),
], ids=["duplicate", "past the end", "negative", "2-d", "float"])
def test_a_static_cache_refuses_write_positions_it_cannot_hold_where_they_are_set(index, message):
    cache = StaticKVCache(n_layers=1, capacity=8)
    with pytest.raises(ValueError, match=message):
        cache.index = index
    cache.index = torch.tensor([5, 0, 7])  # distinct, in any order
    assert cache.index.tolist() == [5, 0, 7]


@pytest.mark.parametrize(("needed", "capacity"), [(1, 16), (16, 16), (17, 32), (29, 32), (80, 80), (144, 144),
                                                  (145, 160), (257, 288), (600, 640), (1025, 1152)])
def test_static_capacity_rounds_up_by_at_most_an_eighth_or_16(needed, capacity):
    """Nearby lengths share a capacity (one compiled step), and the rounding costs at most 16
    positions or an eighth of the cache."""
    got = static_capacity(needed, limit=4096)
    assert got == capacity
    assert needed <= got <= max(needed + 15, needed * 9 // 8)


def test_static_capacity_stays_within_the_limit_and_refuses_what_does_not_fit():
    assert static_capacity(1000, limit=1010) == 1010
    with pytest.raises(ValueError, match="needed"):
        static_capacity(0, limit=64)
    with pytest.raises(ValueError, match="a static cache of 100 positions does not fit the limit of 64"):
        static_capacity(100, limit=64)
    for limit in (0, -3, 16.5):
        with pytest.raises((TypeError, ValueError), match="limit"):
            static_capacity(5, limit=limit)
