"""Packed weights for decoding steps of four rows or more: oneDNN's product on weights packed for the
step's row count, proposed where the decoding weights outgrow the cache and lent where timed faster on
the CPU (here the ``timed`` fixture decides) — the same logits within rounding, the same tokens, and
the packed copies gone when decoding ends."""

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
    MIN_NEW_TOKENS,
    PACKED_ROWS,
    input_major_weights,
    packed_linear,
    packed_products,
)


def sharp_gpt():
    """`tiny_gpt` with every weight × 3, so that its greedy and beam tokens vary: at init it repeats
    one token, which a step computed on the wrong weights would often repeat too."""
    model = tiny_gpt()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)
    return model


def varied(tokens: torch.Tensor) -> bool:
    """Whether every row of new tokens holds more than one token."""
    return all(len(set(row)) > 1 for row in tokens.tolist())


@pytest.fixture
def packed(monkeypatch) -> list[tuple[int, int]]:
    """Every product computed on packed weights, as (rows, out_features), recorded in the returned list."""
    return record_products(monkeypatch, decode_layout, "packed_linear")  # decode_linear calls it for every layer


@pytest.fixture
def packings(monkeypatch) -> list[tuple[int, ...]]:
    """The shape of every weight oneDNN packs, recorded in the returned list."""
    seen: list[tuple[int, ...]] = []
    real = torch.ops.mkldnn._reorder_linear_weight

    class Ops:  # torch.ops.mkldnn with its packing op spied on
        def __getattr__(self, name):
            if name == "_reorder_linear_weight":
                return lambda weight, rows: (seen.append(tuple(weight.shape)), real(weight, rows))[1]
            return getattr(torch.ops.mkldnn, name)

    monkeypatch.setattr(decode_layout, "_mkldnn", Ops())
    return seen


@pytest.mark.parametrize("rows", [PACKED_ROWS[0], 5, 10, PACKED_ROWS[1]])
@pytest.mark.parametrize("inputs, outputs", [(48, 200), (200, 48)])  # widening and narrowing alike
@pytest.mark.parametrize("bias", [True, False])
def test_packed_products_equal_f_linear(rows, inputs, outputs, bias):
    torch.manual_seed(rows)
    fc = nn.Linear(inputs, outputs, bias=bias)
    x = torch.randn(rows, 1, inputs)  # a decode step: (rows, one new token, features)
    with torch.no_grad(), packed_products(rows):
        out = packed_linear(x, fc)
        expected = F.linear(x, fc.weight, fc.bias)
    assert out is not None and out.shape == (rows, 1, outputs)
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=2e-6)


@pytest.mark.filterwarnings("ignore:TF32 acceleration")  # torch.backends.mkldnn.flags, Intel GPUs only
def test_only_the_lent_row_count_of_a_plain_float32_layer_is_packed():
    fc = nn.Linear(48, 200)
    step = torch.randn(5, 48)
    with torch.no_grad():
        assert packed_linear(step, fc) is None  # not lent: ordinary forwards are untouched
        with packed_products(5):
            assert packed_linear(step, fc) is not None
            assert packed_linear(torch.randn(6, 48), fc) is None  # a one-off product (a prompt): as before
            assert packed_linear(step.double(), copy.deepcopy(fc).double()) is None  # float32 only
            wide = torch.randn(5, 96)  # 96 features for a 48-input layer
            assert packed_linear(wide, fc) is None
            with pytest.raises(RuntimeError, match="cannot be multiplied"):
                fused_linear.linear(wide, fc)  # F.linear's own error, not a wrong product
            with input_major_weights(fc):  # the weight laid out input-major: that layout's product
                assert packed_linear(step, fc) is None
            handle = fc.register_forward_hook(lambda *args: None)  # a hook must see the module run
            assert packed_linear(step, fc) is None
            handle.remove()
            with torch.backends.mkldnn.flags(enabled=False):  # oneDNN turned off: not taken
                assert packed_linear(step, fc) is None
    with packed_products(5):
        assert packed_linear(step, fc) is None  # a gradient is wanted: autograd's F.linear


class _UnreadableVar:
    """Stands in for a decode path's context variable: older dynamo (torch 2.11) cannot trace ``get``."""

    def get(self):
        raise AssertionError("a context variable was read while tracing")


def test_a_traced_graph_takes_neither_decode_path_before_reading_its_context_variable(monkeypatch):
    fc = nn.Linear(48, 200)
    step = torch.randn(5, 48)
    monkeypatch.setattr(decode_layout, "_PACKED", _UnreadableVar())
    monkeypatch.setattr(decode_layout, "_OUTPUT_MAJOR", _UnreadableVar())
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    with torch.no_grad():
        assert decode_layout.decode_linear(step, fc) is None
        assert decode_layout.head_logits(step, fc).shape == (5, 200)
        torch.testing.assert_close(fused_linear.linear(step, fc), F.linear(step, fc.weight, fc.bias))
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: False)
    with pytest.raises(AssertionError, match="read while tracing"):  # the stand-in is read outside a trace
        decode_layout.decode_linear(step, fc)


@pytest.mark.parametrize("rows", [PACKED_ROWS[0] - 1, PACKED_ROWS[1] + 1])
def test_packed_products_refuse_row_counts_where_they_do_not_pay(rows):
    with pytest.raises(ValueError, match=f"packed products serve steps of 4 to 255 rows, got {rows}"):
        with packed_products(rows):
            pass


def test_each_weight_is_packed_once_a_block_again_when_changed_in_place_and_not_kept_after(packings):
    fc = nn.Linear(48, 200)
    step = torch.randn(5, 48)
    with torch.no_grad():
        with packed_products(5):
            for _ in range(3):
                packed_linear(step, fc)
            assert packings == [(200, 48)]  # three steps, one packing
            fc.weight.mul_(2.0)  # changed in place (a version later): packed again, the new values used
            torch.testing.assert_close(packed_linear(step, fc), F.linear(step, fc.weight, fc.bias),
                                       rtol=1e-6, atol=2e-6)
            assert packings == [(200, 48)] * 2
        with packed_products(5):  # a new block (the next generate call) keeps nothing of the last
            packed_linear(step, fc)
        assert packings == [(200, 48)] * 3


@pytest.mark.parametrize("num_beams", [3, 4])
def test_beam_search_out_of_cache_runs_its_steps_on_packed_weights_and_finds_the_same_answers(
        monkeypatch, packed, timed, num_beams):
    timed.wins = "packed"
    model = sharp_gpt()
    prompt = torch.tensor([[3, 4, 5, 6, 7, 8, 9]])  # 7 tokens: not a step's row count
    options = dict(max_new_tokens=MIN_NEW_TOKENS, strategy="beam", num_beams=num_beams, eos_token_id=None)
    expected = model.generate(prompt, **options)
    assert varied(expected[:, 7:])
    assert packed == []  # 60 kB of weights stay in cache: as stored
    monkeypatch.setattr(generation, "MIN_COLD_BYTES", 0)  # as if they did not
    out = model.generate(prompt, **options)
    assert torch.equal(out, expected)
    rows = num_beams + 1  # W beams and the greedy row
    assert timed.proposed() == [{"output_major", "packed"}]
    assert {r for r, _ in packed} == {rows}
    # every layer of a step, narrowing ones too: qkv, attention output, MLP up and down (32), the head
    assert {out for _, out in packed} == {96, 32, 128, 40}
    # the prompt ran once (7 rows; its head one): as before; then a step for each further token
    steps = MIN_NEW_TOKENS - 1
    assert len(packed) == steps * (4 * model.config.n_layers + 1)


def test_encoder_decoder_beam_search_packs_its_decoder_steps_only_and_finds_the_same_answers(monkeypatch, packed,
                                                                                             packings, timed):
    timed.wins = "packed"
    model = tiny_t5()
    source = torch.randint(2, 100, (1, 7), generator=torch.Generator().manual_seed(2))
    expected = model.generate(source, max_new_tokens=MIN_NEW_TOKENS, strategy="beam", num_beams=4)
    monkeypatch.setattr(generation, "MIN_COLD_BYTES", 0)
    out = model.generate(source, max_new_tokens=MIN_NEW_TOKENS, strategy="beam", num_beams=4)
    assert torch.equal(out, expected)
    # the decoder's steps of 4 beams and the greedy row; cross-attention's keys and values of the
    # 7 source positions, computed once, are not packed (nor anything of the encoder)
    assert packed and {r for r, _ in packed} == {5}
    linears = [name for name, m in model.named_modules() if type(m) is nn.Linear]
    stepping = [name for name in linears if name.startswith("decoder.") and not name.endswith("cross_attn.kv")]
    assert len(packings) == len(stepping) + 1  # each packed once, and the head (lm_head)
    assert any(out == 100 for _, out in packed)  # the head (64 -> 100) among them


def test_generation_config_chooses_packed_weights_automatically_or_as_told(monkeypatch, packed, timed):
    """packed=None proposes packing a batch of four or more rows where the weights are out of cache,
    the copy is at most MAX_COPY_BYTES and at least MIN_NEW_TOKENS are asked for, and packs where
    that is timed fastest; True packs whatever the size and length; False never; the tokens are the
    same every way."""
    timed.wins = "packed"
    model = sharp_gpt()
    prompts = torch.randint(2, 40, (4, 7), generator=torch.Generator().manual_seed(1))
    expected = model.generate(prompts, max_new_tokens=MIN_NEW_TOKENS)
    assert varied(expected[:, 7:])
    assert packed == []  # in cache
    assert torch.equal(model.generate(prompts, max_new_tokens=MIN_NEW_TOKENS, packed=True), expected)
    assert {r for r, _ in packed} == {4}
    packed.clear()
    assert timed.asked == []  # in cache: nothing proposed; True: nothing left to time
    monkeypatch.setattr(generation, "MIN_COLD_BYTES", 0)  # out of cache
    assert torch.equal(model.generate(prompts, max_new_tokens=MIN_NEW_TOKENS), expected)
    assert {r for r, _ in packed} == {4} and timed.proposed() == [{"output_major", "packed"}]
    packed.clear()
    timed.wins = "output_major"  # timed faster than packing: output-major products instead
    assert torch.equal(model.generate(prompts, max_new_tokens=MIN_NEW_TOKENS), expected)
    assert packed == []
    timed.wins = "packed"
    for options in (dict(packed=False), dict(max_new_tokens=MIN_NEW_TOKENS - 1)):
        packed.clear()
        length = options.pop("max_new_tokens", MIN_NEW_TOKENS)
        assert torch.equal(model.generate(prompts, max_new_tokens=length, **options), expected[:, :7 + length])
        assert packed == []
    monkeypatch.setattr(generation, "MAX_COPY_BYTES", 0)  # a copy too large to lend
    timed.asked.clear()
    assert torch.equal(model.generate(prompts, max_new_tokens=MIN_NEW_TOKENS), expected)
    assert packed == [] and timed.proposed() == [{"output_major"}]
    assert torch.equal(model.generate(prompts[:3], max_new_tokens=MIN_NEW_TOKENS, packed=True),
                       expected[:3])  # three rows: output-major's, even when told
    assert packed == []
    with pytest.raises(TypeError, match=r"GenerationConfig.packed must be bool \| None, got 'yes' \(str\)"):
        GenerationConfig(packed="yes")


def test_a_strided_bias_or_a_forward_mode_tangent_leaves_the_product_to_f_linear():
    fc = nn.Linear(48, 200).requires_grad_(False)
    x = torch.randn(PACKED_ROWS[0], 48)
    with packed_products(PACKED_ROWS[0]):
        with fwAD.dual_level():  # oneDNN's product has no forward-mode rule
            assert packed_linear(fwAD.make_dual(x, torch.randn_like(x)), fc) is None
        fc.bias = nn.Parameter(torch.randn(200, 3)[:, 0], requires_grad=False)  # stride 3: oneDNN misreads it
        assert packed_linear(x, fc) is None
        assert packed_linear(x, nn.Linear(48, 200).requires_grad_(False)) is not None  # a plain one is taken
