"""Input-major weights while a row or two decode: the same logits and tokens, the weights given back
as they were. The copy is proposed for one or two rows and enough new tokens; whether it is lent is
timed on the CPU (tests/unitok/test_layout_timing.py) — here the ``timed`` fixture decides."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.conftest import tiny_gpt
from unitok.generate import GenerationConfig
from unitok.layers.decode_layout import (
    ALL_WIDENING_ROWS,
    MIN_NEW_TOKENS,
    copy_bytes,
    input_major_weights,
    widening_linears,
)
from unitok.models import GPT


def head_strides(model: GPT) -> tuple[list[tuple[int, ...]], torch.utils.hooks.RemovableHandle]:
    """The LM head weight's strides at each call of the head, recorded into the returned list."""
    seen: list[tuple[int, ...]] = []
    handle = model.lm_head.register_forward_pre_hook(lambda module, args: seen.append(module.weight.stride()))
    return seen, handle


def weights(model: nn.Module) -> dict[str, tuple[int, tuple[int, ...], torch.Tensor]]:
    return {name: (p.data_ptr(), p.stride(), p.detach().clone()) for name, p in model.named_parameters()}


def assert_given_back(model: nn.Module, before: dict) -> None:
    for name, p in model.named_parameters():
        ptr, stride, values = before[name]
        assert (p.data_ptr(), p.stride()) == (ptr, stride), name  # the original tensor, not a copy
        assert torch.equal(p, values), name


def test_one_row_decoding_reads_input_major_weights_after_the_prompt_and_gives_them_back(timed):
    timed.wins = "input_major"
    model = tiny_gpt()
    before = weights(model)
    seen, handle = head_strides(model)
    model.generate(torch.tensor([[3, 4, 5]]), max_new_tokens=MIN_NEW_TOKENS)
    handle.remove()
    assert seen[0] == (32, 1)  # the prompt: the weights as they are
    assert set(seen[1:]) == {(1, 40)}  # each one-row step: (40, 32) values stored input-major
    assert timed.proposed() == [{"input_major"}]  # 60 kB of weights: neither output-major nor packed
    assert_given_back(model, before)


def test_a_model_on_input_major_weights_computes_the_same_logits():
    model = tiny_gpt()
    ids = torch.randint(2, 40, (2, 9), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        expected = model(ids).logits
        with input_major_weights(model) as count:
            assert count == 7 and model.lm_head.weight.stride() == (1, 40)
            laid_out = model(ids).logits
    torch.testing.assert_close(laid_out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("strategy", ["greedy", "sample"])
def test_input_major_decoding_gives_the_same_tokens(strategy):
    model = tiny_gpt()
    for prompt in (torch.tensor([[3, 4, 5]]), torch.randint(2, 40, (3, 4), generator=torch.Generator().manual_seed(1))):
        runs = [model.generate(prompt, max_new_tokens=24, strategy=strategy, input_major=choice,
                               generator=torch.Generator().manual_seed(7)) for choice in (True, False)]
        assert torch.equal(runs[0], runs[1])


@pytest.mark.parametrize("wins", ["input_major", None])
@pytest.mark.parametrize("options, laid_out", [
    ({"max_new_tokens": MIN_NEW_TOKENS}, "timed"),  # one row, enough tokens: proposed, lent if timed faster
    ({"max_new_tokens": MIN_NEW_TOKENS - 1}, False),  # the copy would cost more than it saves
    ({"max_new_tokens": MIN_NEW_TOKENS, "input_major": False}, False),
    ({"max_new_tokens": 4, "input_major": True}, True),
    ({"max_new_tokens": MIN_NEW_TOKENS, "strategy": "beam", "num_beams": 2}, False),  # beams: as they are
    ({"max_new_tokens": MIN_NEW_TOKENS, "strategy": "beam", "num_beams": 1}, False),  # one beam too
    ({"max_new_tokens": 4, "strategy": "beam", "num_beams": 2, "input_major": True}, False),  # greedy and sampling's
])
def test_when_the_weights_are_laid_out(options, laid_out, wins, timed):
    timed.wins = wins
    if laid_out == "timed":
        laid_out = wins == "input_major"
    model = tiny_gpt()
    seen, handle = head_strides(model)
    model.generate(torch.tensor([[3, 4, 5]]), **options)
    handle.remove()
    assert ((1, 40) in seen) == laid_out


def test_two_rows_still_read_input_major_weights_more_do_not(timed):
    timed.wins = "input_major"
    model = tiny_gpt()
    everything = widening_linears(model)  # out ≥ in: qkv, attention output, MLP up, the head
    assert len(everything) == 7 and widening_linears(model, rows=ALL_WIDENING_ROWS) == everything
    assert widening_linears(model, rows=ALL_WIDENING_ROWS + 1) == []
    for rows, laid_out in ((ALL_WIDENING_ROWS, True), (ALL_WIDENING_ROWS + 1, False)):
        seen, handle = head_strides(model)
        model.generate(torch.randint(2, 40, (rows, 3)), max_new_tokens=MIN_NEW_TOKENS)
        handle.remove()
        assert seen[0] == (32, 1)
        assert set(seen[1:]) == ({(1, 40)} if laid_out else {(32, 1)})
    seen, handle = head_strides(model)
    model.generate(torch.randint(2, 40, (3, 3)), max_new_tokens=4, input_major=True)  # forced: any batch
    handle.remove()
    assert set(seen[1:]) == {(1, 40)}


def test_an_error_while_decoding_gives_the_weights_back(timed):
    timed.wins = "input_major"
    model = tiny_gpt()
    before = weights(model)
    calls = []

    def fail_on_the_third_step(module, args):
        calls.append(module.weight.stride())
        if len(calls) == 3:
            raise RuntimeError("stopped")

    handle = model.lm_head.register_forward_pre_hook(fail_on_the_third_step)
    with pytest.raises(RuntimeError, match="stopped"):
        model.generate(torch.tensor([[3, 4, 5]]), max_new_tokens=MIN_NEW_TOKENS)
    handle.remove()
    assert calls[2] == (1, 40)  # stopped on the input-major copy (the head's third call, the second step)
    assert_given_back(model, before)


def test_only_widening_float32_linear_weights_are_laid_out():
    model = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 4), nn.Linear(4, 4), nn.Linear(4, 8).bfloat16())
    assert widening_linears(model) == [model[0], model[2]]  # out ≥ in, float32
    with input_major_weights(model) as count:
        assert count == 2
        assert model[0].weight.stride() == (1, 16) and model[2].weight.stride() == (1, 4)
        assert model[1].weight.stride() == (16, 1)  # narrowing: read faster as it is
        x = torch.randn(1, 8)
        torch.testing.assert_close(model[0](x), x @ model[0].weight.detach().T + model[0].bias.detach())
    assert model[0].weight.stride() == (8, 1)


def test_a_tied_head_is_laid_out_once():
    model = tiny_gpt()
    assert model.lm_head.weight is model.tok_embed.weight
    with input_major_weights(model):
        assert model.tok_embed.weight.stride() == (1, 40)


def test_input_major_must_be_a_bool_or_none():
    with pytest.raises(TypeError, match=r"GenerationConfig.input_major must be bool \| None, got 'yes' \(str\)"):
        GenerationConfig(input_major="yes")


def test_inference_mode_decoding_leaves_weights_a_training_step_can_use():
    model = tiny_gpt()
    before = weights(model)
    with torch.inference_mode():  # as the pipelines decode
        out = model.generate(torch.tensor([[3, 4, 5]]), max_new_tokens=MIN_NEW_TOKENS)
    assert_given_back(model, before)
    assert not any(p.is_inference() for p in model.parameters())
    assert torch.equal(out, model.generate(torch.tensor([[3, 4, 5]]), max_new_tokens=MIN_NEW_TOKENS, input_major=False))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.tensor([[3, 4, 5, 6]])
    model.train()(ids, labels=ids, return_logits=False).loss.backward()
    optimizer.step()
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_the_automatic_choice_copies_no_more_than_max_copy_bytes(monkeypatch, timed):
    import unitok.generate as generation

    timed.wins = "input_major"
    model = tiny_gpt()
    assert copy_bytes(model) == sum(m.weight.numel() * 4 for m in widening_linears(model))  # the tied head once
    assert copy_bytes(model, rows=ALL_WIDENING_ROWS + 1) == 0
    monkeypatch.setattr(generation, "MAX_COPY_BYTES", copy_bytes(model) - 1)  # as if the model were larger
    for forced, laid_out in ((None, False), (True, True)):
        seen, handle = head_strides(model)
        model.generate(torch.tensor([[3, 4, 5]]), max_new_tokens=MIN_NEW_TOKENS, input_major=forced)
        handle.remove()
        assert ((1, 40) in seen) == laid_out


def test_encoder_decoder_decoding_lays_out_the_decoder_only_and_gives_the_same_tokens(timed):
    from unitok.models import T5, T5Config

    timed.wins = "input_major"
    torch.manual_seed(0)
    model = T5(T5Config.from_name("t5-tiny", vocab_size=50, dropout=0.0, relative_buckets=8,
                                  relative_max_distance=16)).eval()
    before = weights(model)
    decoder_qkv, encoder_qkv = model.decoder.blocks[0].sublayers.attn.qkv, model.encoder.blocks[0].sublayers.attn.qkv
    seen: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    handle = decoder_qkv.register_forward_pre_hook(
        lambda module, args: seen.append((module.weight.stride(), encoder_qkv.weight.stride())))
    source = torch.randint(2, 50, (1, 7), generator=torch.Generator().manual_seed(2))
    laid_out = model.generate(source, max_new_tokens=MIN_NEW_TOKENS)  # the encoder ran before the layout
    handle.remove()
    out, inp = decoder_qkv.out_features, decoder_qkv.in_features
    assert seen[0] == ((inp, 1), (inp, 1))  # the start token: as the weights are
    assert set(seen[1:]) == {((1, out), (inp, 1))}  # each step: the decoder's weights input-major, not the encoder's
    assert_given_back(model, before)
    assert torch.equal(laid_out, model.generate(source, max_new_tokens=MIN_NEW_TOKENS, input_major=False))
