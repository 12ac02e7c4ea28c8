"""The oneDNN fused linear (CPU inference) computes what ``act(fc(x))`` computes, and is taken
only where it may be: nothing needs a gradient, float32 on the CPU, products large enough, no
autocast, no hooks or Linear subclasses, oneDNN enabled."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from unitok.layers import MLP, onednn_gemm
from unitok.layers.activations import TanhGELU, activate_fresh, make_activation
from unitok.layers.fused_linear import MIN_FEATURES, MIN_ROWS, linear, uses_onednn

BIG = (MIN_ROWS + 44, MIN_FEATURES)  # rows × in-features that take the fused path


@pytest.fixture(autouse=True)
def onednn_preferred(monkeypatch):
    """oneDNN's products preferred, as a Zen 5 times them: products with no activation fuse too."""
    monkeypatch.setattr(onednn_gemm, "PREFERRED", True)


def big_linear(out_features: int = 2 * MIN_FEATURES) -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(BIG[1], out_features)


@pytest.mark.parametrize("activation", [None, "gelu", "gelu_tanh", "relu", "silu"])
def test_fused_equals_linear_then_activation(activation):
    fc = big_linear()
    act = make_activation(activation) if activation else None
    x = torch.randn(2, BIG[0] // 2, BIG[1])  # a leading batch axis is read as more rows
    expected = act(fc(x)) if act else fc(x)
    with torch.no_grad():
        assert uses_onednn(x, fc, activation)
        got = linear(x, fc, activation, act)
    assert got.shape == expected.shape == (2, BIG[0] // 2, 2 * MIN_FEATURES)
    torch.testing.assert_close(got, expected.detach(), atol=1e-5, rtol=1e-5)


def test_transposed_input_is_read_by_its_strides():
    fc = big_linear()
    x = torch.randn(BIG[1], BIG[0]).t()  # (rows, in) with in-features as the outer stride
    with torch.no_grad():
        assert uses_onednn(x, fc)
        torch.testing.assert_close(linear(x, fc), fc(x), atol=1e-5, rtol=1e-5)


def test_training_keeps_the_differentiable_path():
    fc = big_linear()
    x = torch.randn(*BIG)
    assert not uses_onednn(x, fc, "gelu")  # the weights need gradients
    y = linear(x, fc, "gelu", nn.GELU())
    assert y.grad_fn is not None
    y.sum().backward()
    assert fc.weight.grad is not None and fc.weight.grad.abs().sum() > 0
    with torch.no_grad():
        assert uses_onednn(x, fc, "gelu")
    with torch.inference_mode():
        assert uses_onednn(x, fc, "gelu")
    fc.requires_grad_(False)
    assert uses_onednn(x, fc, "gelu")  # frozen weights on an input that needs no gradient
    assert not uses_onednn(x.requires_grad_(), fc, "gelu")


@pytest.mark.filterwarnings("ignore:TF32 acceleration")  # torch.backends.mkldnn.flags, Intel GPUs only
def test_small_products_autocast_other_dtypes_and_disabled_onednn_stay_unfused():
    fc = big_linear()
    with torch.no_grad():
        assert not uses_onednn(torch.randn(MIN_ROWS - 1, BIG[1]), fc)
        assert not uses_onednn(torch.randn(*BIG), nn.Linear(BIG[1], MIN_FEATURES - 1))
        assert not uses_onednn(torch.randn(*BIG, dtype=torch.float64), fc.double())
        fc.float()
        assert not uses_onednn(torch.randn(*BIG), fc, "quick_gelu")  # no oneDNN post-op for it
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert not uses_onednn(torch.randn(*BIG), fc)
            assert linear(torch.randn(*BIG), fc).dtype == torch.bfloat16
        with torch.backends.mkldnn.flags(enabled=False):
            assert not uses_onednn(torch.randn(*BIG), fc)
        x = torch.randn(*BIG)
        with torch._subclasses.fake_tensor.FakeTensorMode(allow_non_fake_inputs=True):  # sees every op: F.linear's
            assert not uses_onednn(x, fc)
        assert uses_onednn(torch.randn(*BIG), fc)


def test_hooks_and_linear_subclasses_keep_the_module_forward():
    fc = big_linear()
    seen = []
    handle = fc.register_forward_hook(lambda module, inputs, output: seen.append(output))
    x = torch.randn(*BIG)
    with torch.no_grad():
        assert not uses_onednn(x, fc)
        y = linear(x, fc, "gelu", nn.GELU())
    handle.remove()
    assert len(seen) == 1
    torch.testing.assert_close(y, nn.functional.gelu(seen[0]))  # the hooked output was not overwritten

    class Scaled(nn.Linear):
        def forward(self, x):
            return 2 * super().forward(x)

    with torch.no_grad():
        scaled = Scaled(BIG[1], MIN_FEATURES)
        assert not uses_onednn(x, scaled)
        torch.testing.assert_close(linear(x, scaled), 2 * nn.functional.linear(x, scaled.weight, scaled.bias))


def test_an_activation_needs_its_module():
    with pytest.raises(ValueError, match="activation='gelu' needs its module"):
        linear(torch.randn(2, 4), nn.Linear(4, 4), "gelu")


@pytest.mark.parametrize("act", [nn.GELU(), nn.GELU(approximate="tanh"), TanhGELU(), nn.ReLU(), nn.SiLU()],
                         ids=["gelu", "torch_gelu_tanh", "gelu_tanh", "relu", "silu"])
def test_activate_fresh_overwrites_only_without_gradients(act):
    h = torch.randn(5, 6)
    expected = act(h.clone())
    with torch.no_grad():
        out = activate_fresh(act, h)
    assert out.data_ptr() == h.data_ptr()
    torch.testing.assert_close(out, expected)
    g = torch.randn(5, 6, requires_grad=True)
    h = g * 1
    out = activate_fresh(act, h)
    assert out.data_ptr() != h.data_ptr()
    out.sum().backward()
    assert g.grad is not None


def test_mlp_inference_equals_its_training_path():
    torch.manual_seed(0)
    for gated in (False, True):
        mlp = MLP(MIN_FEATURES, 4 * MIN_FEATURES, "gelu_tanh", gated=gated).eval()
        x = torch.randn(3, MIN_ROWS, MIN_FEATURES)
        expected = mlp(x)  # weights need gradients: F.linear
        with torch.no_grad():
            assert uses_onednn(x, mlp.fc_in, "gelu_tanh")
            torch.testing.assert_close(mlp(x), expected.detach(), atol=1e-5, rtol=1e-5)


def test_masked_lm_head_inference_equals_its_training_path():
    from unitok.heads.mlm import MLMHead

    torch.manual_seed(0)
    head = MLMHead(MIN_FEATURES, MIN_FEATURES, 4 * MIN_FEATURES, "gelu").eval()
    hidden = torch.randn(2, MIN_ROWS, MIN_FEATURES)
    expected = head(hidden)  # weights need gradients: F.linear
    assert expected.grad_fn is not None
    with torch.no_grad():
        assert uses_onednn(hidden, head.dense, "gelu") and uses_onednn(head.transform(hidden), head.decoder)
        torch.testing.assert_close(head(hidden), expected.detach(), atol=1e-5, rtol=1e-5)


def test_a_wrong_input_width_is_refused_naming_both_shapes():
    fc = big_linear()
    with torch.no_grad():
        for width in (BIG[1] // 2, 2 * BIG[1]):  # as many numbers as a fused call would take, the wrong width
            x = torch.randn(BIG[0] * BIG[1] // width + 1, width)
            assert not uses_onednn(x, fc)
            with pytest.raises(RuntimeError, match=rf"cannot be multiplied .*{width}.* and {BIG[1]}x"):
                linear(x, fc)


def test_language_model_heads_take_the_fused_path_in_inference():
    """GPT's and T5's logits over the vocabulary (a (rows, D) x (D, V) product, the largest of an
    inference forward) go through oneDNN without a gradient, with the values of the training path."""
    from unitok.models import GPT, T5, GPTConfig, T5Config

    torch.manual_seed(0)
    gpt = GPT(GPTConfig.from_name("gpt-micro", vocab_size=640, dropout=0.0)).eval()
    t5 = T5(T5Config.from_name("t5-tiny", d_model=MIN_FEATURES, d_ff=2 * MIN_FEATURES, vocab_size=640,
                               dropout=0.0)).eval()
    ids = torch.randint(0, 640, (3, MIN_ROWS // 2))  # 384 rows
    calls = []
    fused = torch.ops.mkldnn._linear_pointwise

    def spy(x, weight, *rest):
        calls.append(tuple(weight.shape))
        return fused(x, weight, *rest)

    for run in (lambda: gpt(ids).logits, lambda: t5(ids, decoder_input_ids=ids).logits):
        expected = run()  # weights need gradients: F.linear
        assert expected.grad_fn is not None
        calls.clear()
        with torch.no_grad(), pytest.MonkeyPatch.context() as patch:
            patch.setattr(torch.ops.mkldnn, "_linear_pointwise", spy)
            got = run()
        assert (640, MIN_FEATURES) in calls  # the LM head's weight, (V, D)
        torch.testing.assert_close(got, expected.detach(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("hook", ["forward", "forward_pre"])
def test_a_hook_on_the_activation_sees_it_run_in_inference_too(hook):
    mlp = MLP(MIN_FEATURES, 4 * MIN_FEATURES, "gelu").eval()
    x = torch.randn(*BIG)
    seen = []
    register = mlp.act.register_forward_hook if hook == "forward" else mlp.act.register_forward_pre_hook
    register(lambda *args: seen.append(1))
    expected = mlp(x)
    assert seen == [1]
    with torch.no_grad():
        assert uses_onednn(x, mlp.fc_in, "gelu")  # the product alone could fuse: the hook keeps the module call
        torch.testing.assert_close(mlp(x), expected.detach(), atol=1e-5, rtol=1e-5)
    assert seen == [1, 1]
    h = torch.randn(5, 6)
    with torch.no_grad():
        out = activate_fresh(mlp.act, h.clone())  # the in-place form would bypass the hook too
    assert seen == [1, 1, 1]
    torch.testing.assert_close(out, nn.functional.gelu(h))


@pytest.mark.parametrize("replacement", [nn.Identity(), nn.GELU(approximate="tanh"), nn.Tanh()],
                         ids=["identity", "gelu_of_the_other_approximation", "tanh"])
def test_an_activation_module_swapped_in_is_the_one_inference_runs(replacement):
    mlp = MLP(MIN_FEATURES, 4 * MIN_FEATURES, "gelu").eval()
    mlp.act = replacement  # the config still says "gelu"
    x = torch.randn(*BIG)
    expected = mlp.fc_out(replacement(mlp.fc_in(x)))
    with torch.no_grad():
        torch.testing.assert_close(mlp(x), expected.detach(), atol=1e-5, rtol=1e-5)


def test_a_strided_bias_is_added_as_its_values():
    fc = big_linear()
    interleaved = torch.randn(fc.out_features, 3)  # e.g. de-interleaved from a fused q/k/v bias
    fc.bias = nn.Parameter(interleaved[:, 0])  # a view with stride 3, which oneDNN would read as contiguous
    x = torch.randn(*BIG)
    with torch.no_grad():
        expected = nn.functional.linear(x, fc.weight, fc.bias)
        assert not uses_onednn(x, fc)
        torch.testing.assert_close(linear(x, fc, "relu", nn.ReLU()), expected.relu())


def test_without_an_activation_the_product_is_onednns_only_where_its_products_are_preferred(monkeypatch):
    fc = big_linear()
    x = torch.randn(*BIG)
    monkeypatch.setattr(onednn_gemm, "PREFERRED", False)  # MKL timed faster (an AMX Xeon)
    with torch.no_grad():
        assert not uses_onednn(x, fc)
        assert uses_onednn(x, fc, "gelu")  # a GELU pass saved is worth it
        torch.testing.assert_close(linear(x, fc), fc(x))

