"""Output-major products for decoding steps of a few rows: (weight @ xᵀ)ᵀ instead of ``F.linear``,
proposed where the decoding weights outgrow the cache and lent where timed faster on the CPU (here
the ``timed`` fixture decides) — the same logits within rounding, the same tokens."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F
from torch import nn

import unitok.generate as generation
import unitok.layers.decode_layout as decode_layout
import unitok.layers.fused_linear as fused_linear
from tests.conftest import record_products, tiny_gpt, tiny_t5
from unitok.generate import GenerationConfig
from unitok.layers.decode_layout import (
    FEW_ROWS,
    MIN_COLD_BYTES,
    ROWS_BY_INPUTS,
    head_logits,
    input_major_weights,
    most_rows,
    output_major_linear,
    output_major_products,
    weight_bytes,
)
from unitok.models import GPT, GPTConfig


@pytest.fixture
def taken(monkeypatch) -> list[tuple[int, int]]:
    """Every product computed output-major, as (rows, out_features), recorded in the returned list."""
    return record_products(monkeypatch, decode_layout, "output_major_linear")  # decode_linear calls it for every layer


@pytest.mark.parametrize("rows", range(FEW_ROWS[0], FEW_ROWS[1] + 1))
@pytest.mark.parametrize("bias", [True, False])
def test_a_few_rows_computed_output_major_equal_f_linear(rows, bias):
    torch.manual_seed(rows)
    fc = nn.Linear(48, 200, bias=bias)
    x = torch.randn(rows, 1, 48)  # a decode step: (rows, one new token, features)
    with torch.no_grad(), output_major_products():
        out = output_major_linear(x, fc)
        expected = F.linear(x, fc.weight, fc.bias)
    assert out is not None and out.shape == (rows, 1, 200) and out.is_contiguous()
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)


def test_outside_the_block_and_the_rule_f_linear_runs():
    fc = nn.Linear(48, 200)
    few = torch.randn(FEW_ROWS[0], 48)
    with torch.no_grad():
        assert output_major_linear(few, fc) is None  # not lent: ordinary forwards are untouched
        with output_major_products():
            assert output_major_linear(few, fc) is not None
            assert output_major_linear(torch.randn(FEW_ROWS[0] - 1, 48), fc) is None  # one row: input-major's
            assert output_major_linear(torch.randn(FEW_ROWS[1] + 1, 48), fc) is None  # F.linear catches up
            assert output_major_linear(torch.randn(3, 200), nn.Linear(200, 48)) is None  # narrowing
            assert output_major_linear(few.double(), copy.deepcopy(fc).double()) is None  # float32 only
            assert output_major_linear(few, fc) is not None  # (.double() converts in place: a copy above)
            wide = torch.randn(2, 96)  # 96 features for a 48-input layer: as many numbers as 4 rows
            assert output_major_linear(wide, fc) is None
            with pytest.raises(RuntimeError, match="cannot be multiplied"):
                fused_linear.linear(wide, fc)  # F.linear's own error, not 4 rows of wrong products
            with input_major_weights(fc):  # the weight laid out input-major: that layout's product
                assert output_major_linear(few, fc) is None
            handle = fc.register_forward_hook(lambda *args: None)  # a hook must see the module run
            assert output_major_linear(few, fc) is None
            handle.remove()
    with output_major_products():
        assert output_major_linear(few, fc) is None  # a gradient is wanted: autograd's F.linear


@pytest.mark.parametrize("inputs, rows", [(48, 10), (256, 10), (257, 8), (512, 8), (513, 6), (768, 6)])
def test_wider_layers_take_fewer_rows_output_major(inputs, rows):
    assert most_rows(inputs) == rows and ROWS_BY_INPUTS[0][1] == FEW_ROWS[1]
    fc = nn.Linear(inputs, inputs)
    with torch.no_grad(), output_major_products():
        assert output_major_linear(torch.randn(rows, inputs), fc) is not None
        assert output_major_linear(torch.randn(rows + 1, inputs), fc) is None


def test_head_logits_runs_the_head_where_output_major_does_not_apply():
    head = nn.Linear(16, 64, bias=False)
    hidden = torch.randn(4, 16)
    with torch.no_grad():
        expected = head(hidden)
        torch.testing.assert_close(head_logits(hidden, head), expected, rtol=0, atol=0)
        with output_major_products():
            torch.testing.assert_close(head_logits(hidden, head), expected, rtol=1e-6, atol=1e-6)


def test_the_benchmark_models_one_out_of_cache_one_in():
    """GPT D=256, V=8,192 (21 MB) ran its 5-row steps at cold-cache speed; D=128, V=4,096 (5 MB) did not."""
    large = GPT(GPTConfig(vocab_size=8192, context_length=256, d_model=256, n_layers=4, n_heads=4))
    small = GPT(GPTConfig(vocab_size=4096, context_length=256, d_model=128, n_layers=4, n_heads=4))
    assert weight_bytes(large) >= MIN_COLD_BYTES > weight_bytes(small)


@pytest.mark.parametrize("num_beams", [2, 4])
def test_beam_search_of_a_model_out_of_cache_runs_output_major_and_finds_the_same_answers(
        monkeypatch, taken, timed, num_beams):
    timed.wins = "output_major"
    model = tiny_gpt()
    prompt = torch.tensor([[3, 4, 5, 6]])
    options = dict(max_new_tokens=12, strategy="beam", num_beams=num_beams, eos_token_id=None)
    as_stored = model.generate(prompt, **options)
    assert taken == [] and timed.asked == []  # 60 kB of weights stay in cache: F.linear, nothing timed
    monkeypatch.setattr(generation, "MIN_COLD_BYTES", 0)  # as if they did not
    output_major = model.generate(prompt, **options)
    assert timed.asked == [(num_beams + 1, frozenset(), (frozenset({"output_major"}),))]  # too few tokens to pack
    # the prompt runs once for the input (its 4 tokens, then its head at the last position), then
    # every step is W beams and the greedy row
    prompt = [(4, 96), (4, 32), (4, 128)] * model.config.n_layers + [(1, 40)]
    assert taken[:len(prompt)] == prompt
    assert {r for r, _ in taken[len(prompt):]} == {num_beams + 1}
    assert {out for _, out in taken} == {96, 32, 128, 40}  # qkv, attention output, MLP up, the head
    assert torch.equal(output_major, as_stored)


def test_generation_config_turns_output_major_products_on_or_off(monkeypatch, taken):
    """output_major=None decides by the weights' size; True computes a cached model's few-row
    steps output-major too; False never does, even out of cache; the tokens are the same."""
    model = tiny_gpt()
    prompt = torch.tensor([[3, 4, 5, 6]])
    options = dict(max_new_tokens=8, strategy="beam", num_beams=4, eos_token_id=None)
    expected = model.generate(prompt, **options)
    assert taken == []  # automatic: 60 kB of weights stay in cache
    assert torch.equal(model.generate(prompt, output_major=True, **options), expected)
    assert taken and {r for r, _ in taken} == {4, 1, 5}  # the prompt's 4 tokens and its head's one, then the steps
    taken.clear()
    monkeypatch.setattr(generation, "MIN_COLD_BYTES", 0)  # out of cache: automatic would take the path
    assert torch.equal(model.generate(prompt, output_major=False, **options), expected)
    assert taken == []
    with pytest.raises(TypeError, match=r"GenerationConfig.output_major must be bool \| None, got 1 \(int\)"):
        GenerationConfig(output_major=1)


def test_greedy_batches_out_of_cache_propose_output_major_and_run_it_where_timed_fastest(monkeypatch, taken, timed):
    """Out of cache, greedy steps of 1 to 10 rows propose output-major products — one or two rows the
    input-major copy too, four or more packed weights (test_packed_products.py) — and run the one
    timed fastest: output-major on every step, or input-major, which output-major leaves alone."""
    model = tiny_gpt()
    prompts = torch.randint(2, 40, (4, 7), generator=torch.Generator().manual_seed(1))  # prompt rows: > 6
    expected = model.generate(prompts, max_new_tokens=20)
    monkeypatch.setattr(generation, "MIN_COLD_BYTES", 0)
    timed.wins = "output_major"
    assert torch.equal(model.generate(prompts, max_new_tokens=20, packed=False), expected)
    assert taken and {r for r, _ in taken} == {4}
    blocks = model.config.n_layers
    step = [(96,), (32,), (128,)] * blocks + [(40,)]  # qkv, attention output, MLP up; then the head
    for batch, prompt in ((1, [(7, 96), (7, 32), (7, 128)] * blocks), (2, [])):
        for wins in ("output_major", "input_major"):
            taken.clear()
            timed.asked.clear()
            timed.wins = wins
            assert torch.equal(model.generate(prompts[:batch], max_new_tokens=20), expected[:batch])
            assert timed.proposed() == [{"input_major", "output_major"}]
            if wins == "input_major":  # then nothing runs output-major (test_decode_layout.py)
                assert taken == []
                continue
            # the prompt's products of a few rows (one prompt of 7 tokens; two are 14 rows,
            # F.linear's) and its head (the last position's rows); then 19 steps
            assert taken == [*prompt, (batch, 40), *[(batch, *width) for width in step] * 19]


def test_one_row_steps_run_output_major_as_two_where_no_input_major_copy_is_lent(monkeypatch, taken, timed):
    """A model whose input-major copy would pass MAX_COPY_BYTES (GPT-124M-sized: ~380 MB) decodes
    its one-row steps output-major where timed faster, each row run as two: the same tokens as F.linear's."""
    timed.wins = "output_major"
    model = tiny_gpt()
    prompt = torch.randint(2, 40, (1, 7), generator=torch.Generator().manual_seed(3))
    expected = model.generate(prompt, max_new_tokens=20, input_major=False, output_major=False)
    monkeypatch.setattr(generation, "MIN_COLD_BYTES", 0)  # out of cache
    monkeypatch.setattr(generation, "MAX_COPY_BYTES", 0)  # no copy lent
    assert torch.equal(model.generate(prompt, max_new_tokens=20), expected)
    assert timed.proposed() == [{"output_major"}]
    one_row = [out for rows, out in taken if rows == 1]
    # the prompt's head (its last position), then 19 steps: in each block qkv (32 -> 96), the
    # attention output (32 -> 32) and the MLP's first layer (32 -> 128), then the head (32 -> 40)
    assert len(one_row) == 1 + 19 * (3 * model.config.n_layers + 1)
    assert set(one_row) == {96, 32, 128, 40}
    assert torch.equal(model.generate(prompt, max_new_tokens=20, strategy="sample", top_k=5,
                                      generator=torch.Generator().manual_seed(0)),
                       model.generate(prompt, max_new_tokens=20, strategy="sample", top_k=5, output_major=False,
                                      generator=torch.Generator().manual_seed(0)))


def test_encoder_decoder_beam_search_runs_its_decoder_output_major_and_finds_the_same_answers(monkeypatch, taken,
                                                                                             timed):
    timed.wins = "output_major"
    model = tiny_t5()
    source = torch.randint(2, 100, (1, 7), generator=torch.Generator().manual_seed(2))
    expected = model.generate(source, max_new_tokens=10, strategy="beam", num_beams=4)
    assert taken == []
    monkeypatch.setattr(generation, "MIN_COLD_BYTES", 0)
    out = model.generate(source, max_new_tokens=10, strategy="beam", num_beams=4)
    # the decoder's first step once for the source (one row), then 4 beams and the greedy row; once,
    # cross-attention's keys and values of the 7 source positions
    assert {r for r, _ in taken} == {1, 5, 7} and sum(r == 7 for r, _ in taken) == len(model.decoder.blocks)
    assert any(out == 100 for _, out in taken)  # the head (64 -> 100) among them
    assert torch.equal(out, expected)


def test_a_forward_mode_tangent_or_a_torch_func_transform_leaves_the_product_to_f_linear():
    fc = nn.Linear(48, 200).requires_grad_(False)
    x, t = torch.randn(4, 48), torch.randn(4, 48)
    with output_major_products():
        assert output_major_linear(x, fc) is not None
        with fwAD.dual_level():  # (weight @ xᵀ)ᵀ through numpy carries no tangent
            assert output_major_linear(fwAD.make_dual(x, t), fc) is None
        _, tangent = torch.func.jvp(lambda x: head_logits(x, fc), (x,), (t,))
    torch.testing.assert_close(tangent, F.linear(t, fc.weight))
