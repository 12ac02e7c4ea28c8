"""unitok's DecisionTransformer *is* Hugging Face's: a random `DecisionTransformerModel`,
converted, predicts the same actions, states and returns (float32, atol 1e-5), with left
padding masked out, and keeps doing so after save_pretrained / from_pretrained."""

from __future__ import annotations

import pytest
import torch

from unitok.convert import from_transformers
from unitok.models import DecisionTransformer

transformers = pytest.importorskip("transformers")

CONFIGS = {
    "base": {},
    "gelu-no-tanh-custom-ff": dict(activation_function="gelu_new", action_tanh=False, n_inner=48, n_head=2),
    "deeper-eps": dict(n_layer=3, hidden_size=48, n_head=3, layer_norm_epsilon=1e-6, state_dim=11, act_dim=1),
}


def small_hf_dt(**overrides):
    """A random Hugging Face Decision Transformer small enough for CPU tests (no dropout)."""
    options = dict(state_dim=5, act_dim=3, hidden_size=32, n_layer=2, n_head=4, max_ep_len=64,
                   resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=None, eos_token_id=None)
    options.update(overrides)
    config = transformers.DecisionTransformerConfig(**options)
    model = transformers.DecisionTransformerModel(config).eval()
    with torch.no_grad():  # HF zero-initialises biases: random ones make the comparison mean more
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.02)
    return model


@pytest.fixture(params=list(CONFIGS), ids=list(CONFIGS))
def pair(request):
    torch.manual_seed(0)
    hf = small_hf_dt(**CONFIGS[request.param])
    return hf, from_transformers(hf).eval()


def random_inputs(hf, batch: int = 3, steps: int = 7, pad: tuple[int, ...] = (0, 3, 6)):
    c = hf.config
    g = torch.Generator().manual_seed(1)
    mask = torch.ones(batch, steps, dtype=torch.long)
    for row, n in enumerate(pad[:batch]):
        mask[row, :n] = 0  # left padding, as at an episode's start
    return dict(
        states=torch.randn(batch, steps, c.state_dim, generator=g),
        actions=torch.rand(batch, steps, c.act_dim, generator=g) * 2 - 1,
        returns_to_go=torch.randn(batch, steps, 1, generator=g),
        timesteps=torch.randint(0, c.max_ep_len, (batch, steps), generator=g),
        attention_mask=mask,
    )


def assert_same_predictions(out, ref, mask):
    real = mask.bool()
    for name in ("action_preds", "state_preds", "return_preds"):
        torch.testing.assert_close(getattr(out, name)[real], getattr(ref, name)[real], atol=1e-5, rtol=0)


def test_converted_model_is_a_unitok_decision_transformer(pair):
    hf, ours = pair
    assert isinstance(ours, DecisionTransformer)
    c = ours.config
    assert (c.state_dim, c.act_dim, c.n_layers, c.d_model) == (hf.config.state_dim, hf.config.act_dim,
                                                               hf.config.n_layer, hf.config.hidden_size)
    assert c.action_tanh == hf.config.action_tanh and not c.discrete


def test_same_predictions_with_padding_masks(pair):
    hf, ours = pair
    inputs = random_inputs(hf)
    with torch.no_grad():
        ref = hf(**inputs)
        out = ours(**inputs)
    assert out.action_preds.shape == ref.action_preds.shape
    assert_same_predictions(out, ref, inputs["attention_mask"])
    # The hidden state of every real token (3 per step) matches too.
    real = inputs["attention_mask"].bool().repeat_interleave(3, dim=1)
    torch.testing.assert_close(out.last_hidden_state[real], ref.last_hidden_state[real], atol=1e-5, rtol=0)


def test_same_predictions_without_a_mask_and_with_hf_rewards_argument(pair):
    hf, ours = pair
    inputs = random_inputs(hf, batch=2, steps=5)
    del inputs["attention_mask"]
    rewards = torch.randn(2, 5, 1)
    with torch.no_grad():
        ref = hf(**inputs, rewards=rewards)
        out = ours(**inputs, rewards=rewards)
    assert_same_predictions(out, ref, torch.ones(2, 5))
    # Fully used: no position differs anywhere.
    torch.testing.assert_close(out.action_preds, ref.action_preds, atol=1e-5, rtol=0)


def test_predictions_survive_save_and_load(pair, tmp_path):
    hf, ours = pair
    inputs = random_inputs(hf)
    loaded = DecisionTransformer.from_pretrained(ours.save_pretrained(tmp_path / "dt")).eval()
    with torch.no_grad():
        assert_same_predictions(loaded(**inputs), hf(**inputs), inputs["attention_mask"])


def test_a_single_step_like_hf_inference(pair):
    # Hugging Face's own example acts from one step with attention_mask of zeros… and ones.
    hf, ours = pair
    inputs = random_inputs(hf, batch=1, steps=1, pad=(0,))
    with torch.no_grad():
        torch.testing.assert_close(ours(**inputs).action_preds, hf(**inputs).action_preds, atol=1e-5, rtol=0)


def test_training_mode_dropout_sits_where_hugging_face_puts_it():
    # Same seed, same random stream: with dropout in the same places (embeddings, attention
    # weights, each residual branch's output, not inside the MLP) the outputs are identical.
    torch.manual_seed(0)
    hf = small_hf_dt(resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1).train()
    ours = from_transformers(hf).train()
    inputs = random_inputs(hf)
    torch.manual_seed(1)
    ref = hf(**inputs).action_preds
    torch.manual_seed(1)
    out = ours(**inputs).action_preds
    real = inputs["attention_mask"].bool()
    torch.testing.assert_close(out[real], ref[real], atol=1e-5, rtol=0)
    torch.manual_seed(2)
    assert not torch.allclose(ours(**inputs).action_preds[real], out[real])  # dropout is on


def test_unsupported_options_are_refused():
    hf = small_hf_dt(scale_attn_by_inverse_layer_idx=True)
    with pytest.raises(ValueError, match="scale_attn_by_inverse_layer_idx"):
        from_transformers(hf)
