"""The one Backbone across its config choices: shapes, finite outputs, gradients, options."""

from __future__ import annotations

import math

import pytest
import torch

from unitok.backbone import SUBLAYERS, Backbone, BackboneConfig
from unitok.embed import sinusoidal_table
from unitok.layers import RMSNorm

VARIANTS = {
    "gpt (pre-norm, causal)": dict(causal=True),
    "bert (post-norm, no final norm)": dict(norm_position="post", final_norm=False),
    "t5-like (rmsnorm, no bias, relu)": dict(norm="rmsnorm", bias=False, activation="relu", attn_scale=1.0),
    "wide mlp, silu": dict(d_ff=80, activation="silu"),
}


@pytest.mark.parametrize("overrides", VARIANTS.values(), ids=list(VARIANTS))
def test_every_variant_runs_and_every_parameter_learns(overrides):
    cfg = BackboneConfig(d_model=16, n_layers=2, n_heads=4, **overrides)
    model = Backbone(cfg)
    x = torch.randn(2, 5, 16)
    out = model(x, output_hidden_states=True, output_attentions=True)
    assert out.last_hidden_state.shape == (2, 5, 16)
    assert torch.isfinite(out.last_hidden_state).all()
    assert len(out.hidden_states) == cfg.n_layers + 1 and len(out.attentions) == cfg.n_layers
    out.last_hidden_state.square().mean().backward()
    silent = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not silent, f"parameters without gradient: {silent}"


def test_sublayer_registry_builds_norm_choices():
    cfg = BackboneConfig(d_model=8, n_layers=1, n_heads=2, norm="rmsnorm", bias=False)
    block = Backbone(cfg).blocks[0]
    assert list(block.sublayers) == ["attn", "mlp"]
    assert isinstance(block.sublayers["attn"].norm, RMSNorm)
    assert block.sublayers["mlp"].fc_in.bias is None
    assert set(SUBLAYERS) >= {"attn", "mlp"}


def test_pre_norm_and_post_norm_compute_the_documented_formulas():
    torch.manual_seed(0)
    x = torch.randn(1, 3, 8)
    for position in ("pre", "post"):
        cfg = BackboneConfig(d_model=8, n_layers=1, n_heads=2, block=("mlp",), norm_position=position,
                             final_norm=False)
        model = Backbone(cfg).eval()
        mlp = model.blocks[0].sublayers["mlp"]
        expected = x + mlp(mlp.norm(x)) if position == "pre" else mlp.norm(x + mlp(x))
        torch.testing.assert_close(model(x).last_hidden_state, expected)


def _inference_sized_stack(**overrides) -> tuple[Backbone, torch.Tensor]:
    torch.manual_seed(0)
    cfg = BackboneConfig(d_model=64, n_layers=2, n_heads=4, **overrides)
    return Backbone(cfg).eval(), torch.randn(4, 300, 64)  # 76,800 elements a sublayer output


@pytest.mark.parametrize("position", ["pre", "post"])
def test_inference_sums_residuals_as_training_does(position):
    """Without gradients the residual sum is written into the sublayer's output (one buffer
    fewer); the stack's answer is the differentiable path's."""
    model, x = _inference_sized_stack(norm_position=position)
    expected = model(x).last_hidden_state
    with torch.no_grad():
        torch.testing.assert_close(model(x).last_hidden_state, expected.detach())


def test_a_forward_hook_keeps_the_output_it_saw():
    """A feature extractor hooking a sublayer, or the projection whose output the sublayer
    returns, must not see its tensor overwritten by the residual sum."""
    model, x = _inference_sized_stack()
    block = model.blocks[0]
    seen: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    hooked = {"attn": block.sublayers["attn"], "proj": block.sublayers["attn"].proj,
              "fc_out": block.sublayers["mlp"].fc_out}
    for name, module in hooked.items():
        module.register_forward_hook(lambda m, i, out, name=name: seen.__setitem__(name, (out, out.clone())))
    with torch.no_grad():
        model(x)
    assert set(seen) == set(hooked)
    for name, (kept, copy) in seen.items():
        torch.testing.assert_close(kept, copy, msg=f"the {name} output a hook kept was overwritten")


def test_autocast_inference_keeps_a_float32_residual_stream():
    """A bf16 sublayer output added to the float32 stream promotes to float32, as in training;
    writing the sum into the bf16 output would round the stream every sublayer."""
    model, x = _inference_sized_stack(final_norm=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = model(x).last_hidden_state
        with torch.no_grad():
            got = model(x).last_hidden_state
    assert expected.dtype == got.dtype == torch.float32
    torch.testing.assert_close(got, expected.detach())


def test_sinusoidal_table_is_the_lecture_formula():
    table = sinusoidal_table(50, 16)
    p, i = 7, 3
    assert math.isclose(table[p, 2 * i].item(), math.sin(p / 10000 ** (2 * i / 16)), abs_tol=1e-6)
    assert math.isclose(table[p, 2 * i + 1].item(), math.cos(p / 10000 ** (2 * i / 16)), abs_tol=1e-6)


def test_rmsnorm_matches_its_definition():
    norm = RMSNorm(4, eps=1e-6)
    x = torch.randn(2, 4)
    torch.testing.assert_close(norm(x), x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(d_model=10, n_heads=3), "divisible"),
        (dict(block=("attn", "convolution")), "unknown sublayer"),
        (dict(norm_position="middle"), "norm_position"),
        (dict(norm="batchnorm"), "unknown norm .batchnorm. for BackboneConfig"),
        (dict(dropout=1.5), "dropout"),
        # a constant row has variance 0: an epsilon ≤ 0 divides it by 0 (or roots a negative): NaN
        (dict(norm_eps=0.0), r"norm_eps must be > 0 .*got 0\.0"),
        (dict(norm_eps=-1.0), r"norm_eps must be > 0 .*got -1\.0"),
        # 0 hidden units make token mixing a constant; a negative width failed deep in nn.Linear
        (dict(block=("token_mlp", "mlp"), n_tokens=4, token_mlp_dim=0), r"token_mlp_dim must be positive .*got 0"),
        (dict(block=("token_mlp", "mlp"), n_tokens=4, token_mlp_dim=-3), r"token_mlp_dim must be positive .*got -3"),
    ],
)
def test_bad_config_is_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BackboneConfig(**kwargs)


@pytest.mark.parametrize("family, preset", [
    ("GPTConfig", "gpt-nano"), ("ViTConfig", "vit-digits"), ("BERTConfig", "bert-nano"), ("T5Config", "t5-tiny"),
    ("MixerConfig", "mixer-digits"),
])
def test_a_model_config_refuses_a_norm_epsilon_its_backbone_would_refuse(family, preset):
    import unitok.models

    config_class = getattr(unitok.models, family)
    for eps in (0.0, -0.5):
        with pytest.raises(ValueError, match=f"norm_eps must be > 0 .*got {eps}"):
            config_class.from_name(preset, norm_eps=eps)
    assert config_class.from_name(preset, norm_eps=1e-12).norm_eps == 1e-12


def test_token_mlp_dim_none_is_half_the_width():
    config = BackboneConfig(d_model=8, n_layers=1, n_heads=2, block=("token_mlp", "mlp"), n_tokens=4)
    assert Backbone(config).blocks[0].sublayers["token_mlp"].fc_in.out_features == 4


@pytest.mark.parametrize("causal, buckets, distance, exact", [
    (False, 32, 8, 8),  # the log-spaced buckets' scale is log(8/8) = 0: ids overflowed to -2⁶³
    (False, 32, 4, 8),  # a negative scale: ids went negative (wrapping to the table's end) and folded back
    (True, 32, 16, 16),  # causal: all 32 buckets look back, 16 of them exact
    (True, 8, 3, 4),
])
def test_a_relative_bias_whose_max_distance_is_within_its_exact_buckets_is_refused(causal, buckets, distance, exact):
    from unitok.embed.relative import RelativePositionBias

    message = (f"a {'causal' if causal else 'bidirectional'} relative position bias of {buckets} buckets has "
               f"{exact} exact ones .*: max_distance must be > {exact}, got {distance}")
    with pytest.raises(ValueError, match=message.replace(": max_distance", ": relative_max_distance")):
        BackboneConfig(d_model=16, n_layers=1, n_heads=2, causal=causal, relative_buckets=buckets,
                       relative_max_distance=distance)
    with pytest.raises(ValueError, match=message):
        RelativePositionBias(2, buckets, distance, bidirectional=not causal)
    # one past the exact buckets is the least T5's formula maps: every offset gets a bucket of the table
    ids = RelativePositionBias(2, buckets, exact + 1, bidirectional=not causal).buckets(300, 300)
    assert int(ids.min()) == 0 and int(ids.max()) < buckets


def test_a_relative_bias_needs_an_exact_bucket_each_way():
    from unitok.embed.relative import RelativePositionBias

    with pytest.raises(ValueError, match="a bidirectional relative position bias needs num_buckets ≥ 4, got 3"):
        RelativePositionBias(2, num_buckets=3, max_distance=16)
    with pytest.raises(ValueError, match="a causal relative position bias needs num_buckets ≥ 2, got 1"):
        RelativePositionBias(2, num_buckets=1, max_distance=16, bidirectional=False)
    RelativePositionBias(2, num_buckets=2, max_distance=2, bidirectional=False)  # one exact bucket, one beyond
    # T5's own settings (Hugging Face's default: 32 buckets up to 128) build both ways
    BackboneConfig(d_model=16, n_layers=1, n_heads=2, relative_buckets=32, relative_max_distance=128)
    BackboneConfig(d_model=16, n_layers=1, n_heads=2, causal=True, relative_buckets=32, relative_max_distance=128)


def test_wrong_width_input_is_refused():
    model = Backbone(BackboneConfig(d_model=8, n_layers=1, n_heads=2))
    with pytest.raises(ValueError, match="expects \\(batch, tokens, 8\\)"):
        model(torch.randn(1, 3, 9))


@pytest.mark.parametrize("overrides", [{}, dict(norm_position="post", final_norm=False), dict(d_ff=40)],
                         ids=["pre-norm", "post-norm", "wide mlp"])
def test_keep_last_gives_the_first_tokens_exactly_as_the_full_stack_does(overrides):
    torch.manual_seed(0)
    model = Backbone(BackboneConfig(d_model=16, n_layers=3, n_heads=4, **overrides)).eval()
    x = torch.randn(2, 7, 16)
    padding = torch.tensor([[1] * 7, [1] * 5 + [0] * 2])  # the second row is padded
    for mask in (None, padding):
        full = model(x, attention_mask=mask).last_hidden_state
        kept = model(x, attention_mask=mask, keep_last=2).last_hidden_state
        assert kept.shape == (2, 2, 16)
        torch.testing.assert_close(kept, full[:, :2], atol=1e-6, rtol=0)


def test_keep_last_gradients_equal_those_of_the_full_stack_through_the_kept_tokens():
    torch.manual_seed(0)
    model = Backbone(BackboneConfig(d_model=16, n_layers=2, n_heads=4))
    x, w = torch.randn(2, 6, 16), torch.randn(16)  # a linear read-out (a sum of squares after a LayerNorm is ~constant)
    (model(x).last_hidden_state[:, :1] @ w).sum().backward()
    full = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    (model(x, keep_last=1).last_hidden_state @ w).sum().backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, full[name], atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_keep_last_positions_give_those_tokens_exactly_as_the_full_stack_does(causal):
    torch.manual_seed(0)
    model = Backbone(BackboneConfig(d_model=16, n_layers=2, n_heads=4, causal=causal)).eval()
    x = torch.randn(2, 9, 16)
    positions = torch.tensor([1, 4, 7])  # every third token, as the Decision Transformer keeps its states
    padding = torch.tensor([[1] * 9, [0] * 3 + [1] * 6])  # the second row is left-padded
    for mask in (None, padding):
        full = model(x, attention_mask=mask).last_hidden_state
        kept = model(x, attention_mask=mask, keep_last=positions).last_hidden_state
        assert kept.shape == (2, 3, 16)
        torch.testing.assert_close(kept, full[:, positions], atol=1e-6, rtol=0)


@pytest.mark.parametrize("config, kwargs, message", [
    (dict(), dict(keep_last=0), "keep_last must be a number of tokens in 1..6"),
    (dict(), dict(keep_last=7), "keep_last must be a number of tokens in 1..6"),
    (dict(causal=True), dict(keep_last=1), "bidirectional"),
    (dict(causal=True), dict(keep_last=torch.tensor([2, 1])), "positions must increase within 0..5"),
    (dict(causal=True), dict(keep_last=torch.tensor([0, 6])), "positions must increase within 0..5"),
    (dict(causal=True), dict(keep_last=torch.tensor([0.0])), "non-empty \\(R,\\) long tensor"),
    (dict(), dict(keep_last=1, output_hidden_states=True), "per-layer hidden states"),
    (dict(block=("half_mlp", "attn", "conv", "half_mlp")), dict(keep_last=1), "self-attention then position-wise"),
])
def test_keep_last_is_refused_where_it_would_change_the_answer(config, kwargs, message):
    model = Backbone(BackboneConfig(d_model=16, n_layers=1, n_heads=4, **config))
    with pytest.raises(ValueError, match=message):
        model(torch.randn(1, 6, 16), **kwargs)


# --------------------------------------------------------------------------- masks
ADDITIVE = torch.tensor([[0.0, 0.0, 0.0, -1e4, -1e4]]).expand(2, 5)  # Hugging Face's "extended" form


@pytest.mark.parametrize("mask, found", [
    (ADDITIVE, r"\[-10000.0\]"),
    (torch.tensor([[2, 2, 2, 0, 0]]).expand(2, 5), r"\[2\]"),
    (torch.tensor([[1.0, 1.0, 0.3, 0.0, 0.0]]).expand(2, 5), r"\[0.30000001192092896\]"),
    (torch.tensor([[1.0, 1.0, float("nan"), 0.0, 0.0]]).expand(2, 5), r"\[nan.*\]"),
], ids=["additive", "0/2", "0.3", "nan"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_a_padding_mask_of_values_other_than_1_and_0_is_refused_naming_them(mask, found, causal):
    model = Backbone(BackboneConfig(d_model=16, n_layers=1, n_heads=2, causal=causal))
    with pytest.raises(ValueError, match=found + r": expected 1 for a real token and 0 for padding \(a padding mask, "
                                              r"not an additive one\)"):
        model(torch.randn(2, 5, 16), mask)


def test_bool_integer_and_float_padding_masks_of_1_and_0_give_one_answer():
    torch.manual_seed(0)
    model = Backbone(BackboneConfig(d_model=16, n_layers=1, n_heads=2)).eval()
    x = torch.randn(2, 5, 16)
    real = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    expected = model(x, real).last_hidden_state
    for mask in (real.long(), real.int(), real.to(torch.uint8), real.float(), real.half()):
        torch.testing.assert_close(model(x, mask).last_hidden_state, expected, rtol=0, atol=0)


@pytest.mark.parametrize("kwargs, message", [
    (dict(attention_mask=torch.ones(1, 5, dtype=torch.long)), r"attention_mask must be \(4, 5\) \(batch, keys\), "
                                                               r"got \(1, 5\)"),
    (dict(attention_mask=torch.ones(2, 5, dtype=torch.long)), r"attention_mask must be \(4, 5\)"),
    (dict(attention_mask=torch.ones(5, dtype=torch.long)), r"attention_mask must be \(4, 5\) .*got \(5,\)"),
    (dict(attention_mask=torch.ones(4, 1, 5, dtype=torch.long)), r"attention_mask must be \(4, 5\) .*got \(4, 1, 5\)"),
    (dict(mask=torch.ones(3, 1, 5, 5, dtype=torch.bool)), r"mask must be a boolean \(4\|1, 2\|1, 5, 5\) tensor"),
    (dict(mask=torch.ones(4, 3, 5, 5, dtype=torch.bool)), r"mask must be a boolean \(4\|1, 2\|1, 5, 5\) tensor "
                                                          r"\(batch, heads, queries, keys\), got torch.bool \(4, 3, 5, 5\)"),
], ids=["one row for four", "two rows for four", "1-d", "3-d", "mask of 3 rows", "mask of 3 heads"])
def test_masks_of_another_shape_are_refused_naming_the_one_expected(kwargs, message):
    model = Backbone(BackboneConfig(d_model=16, n_layers=1, n_heads=2, causal=True))
    with pytest.raises(ValueError, match=message):
        model(torch.randn(4, 5, 16), **kwargs)


def test_a_mask_for_every_row_or_every_head_broadcasts():
    torch.manual_seed(0)
    model = Backbone(BackboneConfig(d_model=16, n_layers=1, n_heads=2)).eval()
    x = torch.randn(4, 5, 16)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    expected = model(x, mask=causal.expand(4, 2, 5, 5)).last_hidden_state
    for shape in ((1, 1, 5, 5), (4, 1, 5, 5), (1, 2, 5, 5)):
        torch.testing.assert_close(model(x, mask=causal.expand(shape)).last_hidden_state, expected, rtol=0, atol=0)


CROSS = BackboneConfig(d_model=16, n_layers=1, n_heads=2, block=("attn", "cross_attn", "mlp"), causal=True)


@pytest.mark.parametrize("options", [dict(kernel="sdpa"), dict(kernel="reference"), dict(output_attentions=True)],
                         ids=["sdpa", "reference", "attentions"])
def test_an_all_padding_encoder_row_is_refused_before_it_attends_to_nothing(options):
    # Every kernel would answer it differently: NaN (reference, bf16) or a number no reference computes (fp32 SDPA).
    model = Backbone(CROSS).eval()
    source_mask = torch.tensor([[1, 1, 1, 0, 0], [0, 0, 0, 0, 0], [1, 0, 0, 0, 0]])
    with pytest.raises(ValueError, match=r"source row\(s\) \[1\] are empty \(all padding in encoder_attention_mask\): "
                                         "give each row at least one token"):
        model(torch.randn(3, 2, 16), encoder_hidden_states=torch.randn(3, 5, 16), encoder_attention_mask=source_mask,
              **options)


def test_an_encoder_mask_is_checked_as_the_padding_mask_is():
    model = Backbone(CROSS).eval()
    x, memory = torch.randn(2, 2, 16), torch.randn(2, 5, 16)
    with pytest.raises(ValueError, match=r"encoder_attention_mask holds \[2\]: expected 1 for a real token"):
        model(x, encoder_hidden_states=memory, encoder_attention_mask=torch.tensor([[2, 2, 0, 0, 0]] * 2))
    with pytest.raises(ValueError, match=r"encoder_attention_mask must be \(2, 5\) \(batch, keys\), got \(2, 4\)"):
        model(x, encoder_hidden_states=memory, encoder_attention_mask=torch.ones(2, 4))
    padded = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    expected = model(x, encoder_hidden_states=memory, encoder_attention_mask=padded).last_hidden_state
    got = model(x, encoder_hidden_states=memory, encoder_attention_mask=padded.bool()).last_hidden_state
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
