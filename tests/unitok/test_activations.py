"""GPT-2's tanh GELU computed as x·σ(2u) on the CPU is the function PyTorch's kernel computes
(to float32 rounding), with the same gradient; elsewhere it is PyTorch's kernel itself."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from unitok.layers.activations import (
    MIN_SIGMOID_VALUES,
    TanhGELU,
    _TanhGELUFunction,
    make_activation,
)


def inputs() -> torch.Tensor:
    """Enough values for the sigmoid form (`MIN_SIGMOID_VALUES`), edge cases included."""
    torch.manual_seed(0)
    edges = torch.tensor([0.0, -0.0, 1e-30, -1e-30, 8.0, -8.0, 30.0, -30.0, 1e4, -1e4])
    return torch.cat([torch.randn(MIN_SIGMOID_VALUES) * 3, edges])


def test_gelu_tanh_is_the_sigmoid_form():
    assert type(make_activation("gelu_tanh")) is TanhGELU


def test_values_equal_pytorchs_tanh_gelu():
    x = inputs()
    torch.testing.assert_close(TanhGELU()(x), F.gelu(x, approximate="tanh"), atol=1e-6, rtol=1e-6)
    special = torch.tensor([float("inf"), float("-inf"), float("nan")])
    got, expected = TanhGELU()(special), F.gelu(special, approximate="tanh")
    torch.testing.assert_close(got, expected, equal_nan=True)


def test_gradients_equal_pytorchs_and_float64s():
    x = inputs()
    grad = torch.randn_like(x)
    ours, theirs, exact = (x.clone().requires_grad_() for _ in range(3))
    TanhGELU()(ours).backward(grad)
    F.gelu(theirs, approximate="tanh").backward(grad)
    F.gelu(exact.double(), approximate="tanh").backward(grad.double())
    torch.testing.assert_close(ours.grad, theirs.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.grad, exact.grad, atol=1e-5, rtol=1e-5)


def test_the_gradient_formula_passes_gradcheck():
    x = (torch.randn(64, dtype=torch.float64) * 3).requires_grad_()
    assert torch.autograd.gradcheck(_TanhGELUFunction.apply, (x,))


def test_a_retained_graph_backs_up_twice_to_the_same_gradient():
    x = inputs().requires_grad_()
    y = TanhGELU()(x)
    y.sum().backward(retain_graph=True)
    first = x.grad.clone()
    y.sum().backward()
    torch.testing.assert_close(x.grad, 2 * first)


def test_in_place_form_overwrites_its_input():
    x = inputs()
    expected = F.gelu(x, approximate="tanh")
    out = TanhGELU().forward_(x)
    assert out.data_ptr() == x.data_ptr()
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-6)


def test_the_sigmoid_form_is_taken_for_large_float32_tensors_only(monkeypatch):
    calls = []
    original = _TanhGELUFunction.apply
    monkeypatch.setattr(_TanhGELUFunction, "apply", lambda x: calls.append(x.numel()) or original(x))
    big = inputs().requires_grad_()
    small = torch.randn(MIN_SIGMOID_VALUES - 1, requires_grad=True)
    TanhGELU()(big)
    assert torch.equal(TanhGELU()(small), F.gelu(small, approximate="tanh"))  # PyTorch's kernel, bit for bit
    assert calls == [big.numel()]
    with torch.no_grad():
        assert torch.equal(TanhGELU().forward_(small.detach().clone()), F.gelu(small, approximate="tanh"))


def test_float64_takes_pytorchs_kernel():
    x = inputs().double()
    assert torch.equal(TanhGELU()(x), F.gelu(x, approximate="tanh"))
    y = x.clone()
    assert torch.equal(TanhGELU().forward_(y), F.gelu(x, approximate="tanh"))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_is_computed_in_float32_and_rounded(dtype):
    # Rounded once from float32, values and gradients are the float64 function's rounded to the
    # half type nearly everywhere (1 % of bf16 values a step off, at rounding boundaries; torch
    # 2.14's own half kernel is 4-7 % off, so no comparison with it beyond closeness).
    x = inputs().to(dtype)
    exact = F.gelu(x.double(), approximate="tanh").to(dtype)
    got = TanhGELU()(x)
    assert got.dtype == dtype
    torch.testing.assert_close(got, F.gelu(x, approximate="tanh"))
    assert (got != exact).float().mean() <= 0.02
    assert torch.equal(TanhGELU().forward_(x.clone()), got)
    grad = torch.randn_like(x)
    ours, theirs, wide = x.clone().requires_grad_(), x.clone().requires_grad_(), x.double().requires_grad_()
    TanhGELU()(ours).backward(grad)
    F.gelu(theirs, approximate="tanh").backward(grad)
    F.gelu(wide, approximate="tanh").backward(grad.double())
    assert ours.grad.dtype == dtype
    torch.testing.assert_close(ours.grad, theirs.grad)
    assert (ours.grad != wide.grad.to(dtype)).float().mean() <= 0.02


def test_torch_func_transforms_differentiate_it_as_pytorchs_kernel():
    x = inputs()[:MIN_SIGMOID_VALUES].view(128, -1)  # large enough for the sigmoid form
    act = make_activation("gelu_tanh")
    expected = torch.func.grad(lambda x: F.gelu(x, approximate="tanh").sum())(x)
    torch.testing.assert_close(torch.func.grad(lambda x: act(x).sum())(x), expected)
    per_row = torch.func.vmap(torch.func.grad(lambda row: act(row).sum()))(x)  # per-sample gradients
    torch.testing.assert_close(per_row, expected)
