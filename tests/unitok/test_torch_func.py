"""torch.func on unitok models and losses: per-sample gradients (``vmap`` of ``grad`` over
``functional_call``, as differential privacy and influence functions compute them) equal each
sample's own gradient; the input checks still refuse bad ids, labels and pixels inside ``vmap``
(judging every sample's values at once); the LM head fused with its loss runs as the unfused
pair under ``grad``, ``vmap`` and forward-mode AD, whose rules its fused computation lacks."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F
from torch.func import functional_call, grad, jvp, vmap

from unitok.losses import linear_cross_entropy
from unitok.models import (
    BERT,
    GPT,
    BERTConfig,
    DecisionTransformer,
    DecisionTransformerConfig,
    GPTConfig,
    ViT,
    ViTConfig,
)


@pytest.fixture(autouse=True)
def _quiet_batching_fallbacks():
    # PyTorch's own notices: SDPA has no batching rule (vmap runs it sample by sample); forward-mode
    # AD loads its decompositions through torch.jit.script
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="There is a performance drop because we have not yet implemented")
        warnings.filterwarnings("ignore", message=".*torch.jit.script. is deprecated")
        yield


def per_sample_gradients(model: torch.nn.Module, loss_of, *batch: torch.Tensor) -> dict[str, torch.Tensor]:
    """vmap(grad(loss)) over the batch's first dimension, the parameters shared."""
    params = {name: p.detach() for name, p in model.named_parameters()}

    def loss(p, *sample):
        return loss_of(lambda *args, **kwargs: functional_call(model, p, args, kwargs), *(s[None] for s in sample))

    return vmap(grad(loss), in_dims=(None, *[0] * len(batch)))(params, *batch), loss, params


def assert_each_sample_alone(model, loss_of, *batch):
    together, loss, params = per_sample_gradients(model, loss_of, *batch)
    for i in range(batch[0].shape[0]):
        alone = grad(loss)(params, *(b[i] for b in batch))
        for name in params:
            torch.testing.assert_close(together[name][i], alone[name], atol=1e-5, rtol=1e-4, msg=name)
    assert any(g.abs().sum() > 0 for g in together.values())


def tiny_gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=50, d_model=16, n_layers=1, n_heads=2, context_length=16, dropout=0.0)).eval()


@pytest.mark.parametrize("return_logits", [True, False])  # False: the fused LM-head loss
def test_gpt_per_sample_gradients_are_each_samples_own(return_logits):
    ids = torch.randint(0, 50, (3, 8), generator=torch.Generator().manual_seed(1))
    assert_each_sample_alone(tiny_gpt(), lambda run, x: run(x, labels=x, return_logits=return_logits).loss, ids)


def test_per_sample_gradients_over_a_padded_batch_are_each_samples_own():
    # the padding mask's check reads every sample's rows under vmap, as one batch of rows
    ids = torch.randint(0, 50, (3, 8), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(3, 8, dtype=torch.long)
    mask[0, :3] = 0  # left padding in one sample
    assert_each_sample_alone(tiny_gpt(), lambda run, x, m: run(x, attention_mask=m, labels=x).loss, ids, mask)


def test_vit_and_bert_per_sample_gradients_are_each_samples_own():
    torch.manual_seed(0)
    vit = ViT(ViTConfig.from_name("vit-digits", n_layers=1, dropout=0.0)).eval()
    pixels, labels = torch.randn(3, 1, 32, 32), torch.tensor([1, 7, 3])
    assert_each_sample_alone(vit, lambda run, x, y: run(x, labels=y).loss, pixels, labels)
    bert = BERT(BERTConfig(vocab_size=40, d_model=16, n_layers=1, n_heads=2, context_length=12, dropout=0.0)).eval()
    ids, segments = torch.randint(0, 40, (2, 6)), torch.tensor([[0, 0, 0, 1, 1, 1], [0, 0, 1, 1, 1, 1]])
    mlm = ids.masked_fill(torch.tensor([[1, 0, 1, 0, 0, 1], [0, 1, 0, 0, 1, 0]]) == 0, -100)
    assert_each_sample_alone(bert, lambda run, x, s, y: run(x, segment_ids=s, labels=y).loss, ids, segments, mlm)


def test_decision_transformer_per_sample_gradients_are_each_samples_own():
    torch.manual_seed(0)
    model = DecisionTransformer(DecisionTransformerConfig(state_dim=3, act_dim=4, discrete=True, context_length=5,
                                                          max_ep_len=20, d_model=16, n_layers=1, n_heads=2,
                                                          dropout=0.0)).eval()
    states, returns = torch.randn(3, 5, 3), torch.randn(3, 5, 1)
    actions, timesteps = torch.randint(0, 4, (3, 5)), torch.arange(5).repeat(3, 1) + torch.tensor([[0], [4], [9]])

    def loss_of(run, s, a, r, t):
        logits = run(s, a, r, t).action_preds
        return F.cross_entropy(logits.flatten(0, 1), a.flatten())

    assert_each_sample_alone(model, loss_of, states, actions, returns, timesteps)
    with pytest.raises(ValueError, match=r"timesteps must be in \[0, max_ep_len=20\), got 11..24"):
        per_sample_gradients(model, loss_of, states, actions, returns, timesteps + 11)
    with pytest.raises(ValueError, match=r"action ids must be in \[0, 4\), got 0..4"):
        per_sample_gradients(model, loss_of, states, actions.masked_fill(actions == 3, 4), returns, timesteps)


def test_bad_input_is_still_refused_inside_vmap():
    model = tiny_gpt()
    ids = torch.randint(0, 50, (3, 8))
    bad_ids = ids.clone()
    bad_ids[2, 4] = 50
    with pytest.raises(ValueError, match=r"token ids \[50\] are outside the vocabulary \[0, 50\)"):
        per_sample_gradients(model, lambda run, x: run(x, labels=x.clamp(max=49)).loss, bad_ids)
    with pytest.raises(ValueError, match=r"labels \[77\] are outside \[0, 50\)"):
        per_sample_gradients(model, lambda run, x, y: run(x, labels=y, return_logits=False).loss,
                             ids, ids.masked_fill(ids == ids[1, 3], 77))
    vit = ViT(ViTConfig.from_name("vit-digits", n_layers=1)).eval()
    pixels = torch.randn(2, 1, 32, 32)
    pixels[1, 0, 5, 5] = float("nan")
    with pytest.raises(ValueError, match="contain 1 NaN/inf values"):
        per_sample_gradients(vit, lambda run, x: run(x).logits.sum(), pixels)


def test_fused_loss_under_grad_vmap_and_forward_mode_equals_the_unfused_pair():
    g = torch.Generator().manual_seed(0)
    hidden, weight, bias = torch.randn(6, 8, generator=g), torch.randn(10, 8, generator=g), torch.randn(10, generator=g)
    labels = torch.randint(0, 10, (6,), generator=g)
    labels[0] = -100

    def unfused(h, w, b, y):
        return F.cross_entropy(F.linear(h, w, b), y, ignore_index=-100)

    for ours_arg, theirs_arg in ((0, 0), (1, 1), (3, 2)):  # hidden, weight, bias
        ours = grad(linear_cross_entropy, argnums=ours_arg)(hidden, weight, labels, bias)
        theirs = grad(unfused, argnums=theirs_arg)(hidden, weight, bias, labels)
        torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-5)
    per_row = vmap(grad(lambda w, h, y: linear_cross_entropy(h[None], w, y[None], bias)), in_dims=(None, 0, 0))(
        weight, hidden[1:], labels[1:])
    for i in range(1, 6):
        torch.testing.assert_close(per_row[i - 1], grad(unfused, argnums=1)(hidden[i:i + 1], weight, bias, labels[i:i + 1]),
                                   atol=1e-6, rtol=1e-5)
    tangent = torch.randn(weight.shape, generator=g)
    with fwAD.dual_level():
        loss = linear_cross_entropy(hidden, fwAD.make_dual(weight, tangent), labels, bias)
        ours_loss, ours_tangent = fwAD.unpack_dual(loss)
    theirs_loss, theirs_tangent = jvp(lambda w: unfused(hidden, w, bias, labels), (weight,), (tangent,))
    torch.testing.assert_close(ours_loss, theirs_loss, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(ours_tangent, theirs_tangent, atol=1e-6, rtol=1e-5)


@pytest.mark.filterwarnings("ignore:TF32 acceleration")  # torch.backends.mkldnn.flags, Intel GPUs only
def test_forward_mode_through_a_frozen_layer_in_inference_keeps_its_tangent():
    from unitok.layers import MLP
    from unitok.layers.fused_linear import MIN_FEATURES, MIN_ROWS

    torch.manual_seed(0)
    mlp = MLP(MIN_FEATURES, 4 * MIN_FEATURES, "gelu").eval().requires_grad_(False)  # inference sizes: oneDNN's
    x, t = torch.randn(MIN_ROWS + 44, MIN_FEATURES), torch.randn(MIN_ROWS + 44, MIN_FEATURES)
    with torch.backends.mkldnn.flags(enabled=False):  # F.linear, which has the rules
        _, expected = jvp(mlp, (x,), (t,))
    _, tangent = jvp(mlp, (x,), (t,))
    torch.testing.assert_close(tangent, expected, atol=1e-5, rtol=1e-5)
    with fwAD.dual_level():
        tangent = fwAD.unpack_dual(mlp(fwAD.make_dual(x, t))).tangent
    assert tangent is not None
    torch.testing.assert_close(tangent, expected, atol=1e-5, rtol=1e-5)
