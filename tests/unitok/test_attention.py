"""Attention kernels and masks: the fused SDPA path equals the plain reference."""

from __future__ import annotations

import math

import pytest
import torch

from unitok.layers import build_attention_mask, causal_mask, reference_attention, sdpa_attention
from unitok.layers.attention import SHORT_BF16_SCORES, check_padding_mask


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_sdpa_equals_reference(causal, padded):
    q, k, v = (torch.randn(2, 3, 7, 8) for _ in range(3))
    padding = torch.ones(2, 7, dtype=torch.long)
    if padded:
        padding[1, :3] = 0
    mask = build_attention_mask(7, 7, causal, padding if padded else None)
    ref, weights = reference_attention(q, k, v, mask)
    fused = sdpa_attention(q, k, v, mask)
    torch.testing.assert_close(fused, ref, atol=1e-6, rtol=0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3, 7))


def test_is_causal_flag_equals_explicit_mask():
    q, k, v = (torch.randn(1, 2, 5, 4) for _ in range(3))
    torch.testing.assert_close(sdpa_attention(q, k, v, is_causal=True),
                               reference_attention(q, k, v, causal_mask(5, 5)[None, None])[0], atol=1e-6, rtol=0)


def test_reference_is_softmax_of_scaled_scores():
    q, k, v = torch.randn(1, 1, 3, 4), torch.randn(1, 1, 3, 4), torch.randn(1, 1, 3, 4)
    _, weights = reference_attention(q, k, v)
    expected = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(4), dim=-1)
    torch.testing.assert_close(weights, expected)


def test_causal_mask_with_cached_keys_aligns_queries_to_the_end():
    # 2 new queries after 3 cached keys: query 0 is position 3, query 1 is position 4.
    assert causal_mask(2, 5).tolist() == [[True, True, True, True, False], [True] * 5]


def test_padding_query_rows_never_produce_nan():
    padding = torch.tensor([[0, 0, 1, 1]])
    mask = build_attention_mask(4, 4, True, padding)
    q, k, v = (torch.randn(1, 1, 4, 2) for _ in range(3))
    assert not torch.isnan(sdpa_attention(q, k, v, mask)).any()
    # Real tokens never see padding.
    assert not mask[0, 0, 2:, :2].any()


def test_mask_length_mismatch_is_an_error():
    with pytest.raises(ValueError, match="covers 3 positions, expected 4"):
        build_attention_mask(4, 4, True, torch.ones(1, 3))


@pytest.mark.parametrize("dtype", [torch.bool, torch.long, torch.uint8, torch.float32])
def test_a_padding_mask_says_in_one_reading_whether_anything_is_padded_and_which_rows_are_empty(dtype):
    padded = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 1, 1]]).to(dtype)
    assert check_padding_mask(padded, (3, 3)) == (False, [1])
    assert check_padding_mask(torch.ones(2, 3, dtype=dtype), (2, 3)) == (True, [])


@pytest.mark.parametrize("mask, message", [
    (torch.tensor([[0.0, -1e4]]), r"attention_mask holds \[-10000.0\]: expected 1 for a real token and 0 for padding"),
    (torch.tensor([[1, 3]]), r"attention_mask holds \[3\]"),
    (torch.tensor([[1, -1]]), r"attention_mask holds \[-1\]"),
    (torch.tensor([[1.0, 0.5]]), r"attention_mask holds \[0.5\]"),
    (torch.ones(2, 2), r"attention_mask must be \(1, 2\) \(batch, keys\), got \(2, 2\)"),
], ids=["additive", "3", "-1", "0.5", "shape"])
def test_a_padding_mask_of_other_values_or_shape_is_refused(mask, message):
    with pytest.raises(ValueError, match=message):
        check_padding_mask(mask, (1, 2))


def _inputs(n: int, dtype: torch.dtype, mask_kind: str):
    q, k, v = (torch.randn(2, 3, n, 8).to(dtype).requires_grad_() for _ in range(3))
    mask = {"causal": None, "bool": causal_mask(n, n)[None, None],
            "additive": torch.randn(1, 1, n, n)}[mask_kind]  # a float32 position bias
    return q, k, v, mask


def _exact(q, k, v, mask, mask_kind):
    exact, _ = reference_attention(q.float(), k.float(), v.float(), mask, is_causal=mask_kind == "causal")
    return exact


@pytest.mark.parametrize("mask_kind", ["causal", "bool", "additive"])
def test_short_bf16_attention_on_the_cpu_is_written_out_in_bf16(mask_kind):
    # Up to SHORT_BF16_SCORES scores a head, bf16 attention on the CPU is computed as a bf16 kernel
    # would: bf16 products, the softmax in fp32 with its weights rounded to bf16, an fp32 bias
    # added in fp32 (faster than the fp32 flash kernel: forward + backward 5.0 against 8.8 ms).
    q, k, v, mask = _inputs(6, torch.bfloat16, mask_kind)
    out = sdpa_attention(q, k, v, mask, is_causal=mask_kind == "causal")
    assert out.dtype == torch.bfloat16
    scores = (q @ k.transpose(-2, -1)) * (8 ** -0.5)
    bool_mask = causal_mask(6, 6) if mask_kind == "causal" else mask
    scores = scores + mask if mask_kind == "additive" else scores.masked_fill(~bool_mask, float("-inf"))
    torch.testing.assert_close(out, scores.softmax(-1).to(torch.bfloat16) @ v, atol=0, rtol=0)
    torch.testing.assert_close(out, _exact(q, k, v, mask, mask_kind).to(torch.bfloat16), atol=3e-2, rtol=0)
    out.float().sum().backward()
    assert q.grad is not None and q.grad.dtype == torch.bfloat16 and torch.isfinite(q.grad.float()).all()


@pytest.mark.parametrize("mask_kind", ["causal", "bool", "additive"])
@pytest.mark.parametrize("dtype, n", [(torch.bfloat16, 257), (torch.float16, 6)])
def test_long_bf16_and_any_fp16_attention_on_the_cpu_attends_in_fp32(mask_kind, dtype, n):
    # Beyond SHORT_BF16_SCORES (and for fp16 at any length) the fp32 flash kernel attends, since
    # PyTorch's half-precision one is slower on the CPU: the fp32 attention of the same (rounded)
    # inputs, cast back — rounded once, so within half a unit in the last place of the exact value
    # (the half kernel, which rounds scores and weights too, misses that by up to thousands of them).
    assert n * n > SHORT_BF16_SCORES or dtype == torch.float16
    q, k, v, mask = _inputs(n, dtype, mask_kind)
    out = sdpa_attention(q, k, v, mask, is_causal=mask_kind == "causal")
    assert out.dtype == dtype
    half_ulp = torch.finfo(dtype).eps / 2  # relative: 2^-8 for bf16, 2^-11 for fp16
    torch.testing.assert_close(out.float(), _exact(q, k, v, mask, mask_kind), atol=1e-6, rtol=half_ulp)
    out.float().sum().backward()
    assert q.grad is not None and q.grad.dtype == dtype and torch.isfinite(q.grad.float()).all()


def test_attention_under_cpu_autocast_returns_bf16_with_fp32_grads_for_fp32_leaves():
    q, k, v = (torch.randn(2, 3, 6, 8, requires_grad=True) for _ in range(3))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = sdpa_attention(q.to(torch.bfloat16), k.to(torch.bfloat16), v.to(torch.bfloat16), is_causal=True)
    assert out.dtype == torch.bfloat16
    exact = sdpa_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(out.float(), exact, atol=3e-2, rtol=0)
    out.float().sum().backward()
    assert q.grad.dtype == torch.float32


@pytest.mark.parametrize("kernel", ["sdpa", "reference"])
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded source"])
def test_cross_attention_of_beams_reads_their_sources_keys_once_and_equals_repeated_keys(kernel, padded):
    """Beam search runs G adjacent rows per source; the cache keeps one row of keys and values per
    source, and the G rows' queries attend to it together: the same output as with the keys
    repeated for every row (the reference kernel, which returns per-row weights, repeats them)."""
    from unitok.layers.attention import AttentionContext, CrossAttention
    from unitok.layers.kv_cache import KVCache

    torch.manual_seed(0)
    attn = CrossAttention(16, 4, bias=False, scale=1.0).eval()
    S, G, T = 2, 3, 5
    memory, x = torch.randn(S, T, 16), torch.randn(S * G, 1, 16)
    memory_mask = None
    if padded:
        memory_mask = torch.ones(S, 1, 1, T, dtype=torch.bool)
        memory_mask[1, ..., :2] = False
    repeated_mask = memory_mask.repeat_interleave(G, dim=0) if padded else None
    expected = attn(x, AttentionContext(memory=memory.repeat_interleave(G, dim=0), memory_mask=repeated_mask))
    cache = KVCache(1)
    shared = AttentionContext(memory=memory, memory_mask=memory_mask, cache=cache, kernel=kernel)
    for _ in range(2):  # the first call computes and caches the source's keys, the second reads them
        torch.testing.assert_close(attn(x, shared), expected, atol=1e-6, rtol=0)
    assert cache.cross[0][0].shape[0] == S
    with pytest.raises(ValueError, match="7 query rows cannot share the keys and values of 2 encoder rows"):
        attn(torch.randn(7, 1, 16), shared)
    # outside decoding a batch mismatch is a mistake, not beams: refused, not grouped
    with pytest.raises(ValueError, match="encoder_hidden_states hold 2 rows for 6 decoder rows"):
        attn(x, AttentionContext(memory=memory, kernel=kernel))
