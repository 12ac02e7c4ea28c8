"""Training's float32 CPU products through oneDNN equal PyTorch's own, gradients included, and
are taken only where they may be (a float32 CPU product, oneDNN on, no autocast, no trace) and
where this CPU runs them faster (timed once per thread count, unless set)."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import unitok.layers.fused_linear as fused_linear
import unitok.layers.onednn_gemm as onednn_gemm
from tests.conftest import tiny_gpt
from unitok.layers import MLP
from unitok.layers.onednn_gemm import linear, mm, onednn_products
from unitok.losses import linear_cross_entropy


@pytest.fixture
def products(monkeypatch) -> list[tuple[int, ...]]:
    """oneDNN preferred whatever this CPU is; records the output shape of every oneDNN product."""
    calls: list[tuple[int, ...]] = []
    real = onednn_gemm._product

    def spy(x, weight, bias):
        out = real(x, weight, bias)
        calls.append(tuple(out.shape))
        return out

    monkeypatch.setattr(onednn_gemm, "PREFERRED", True)
    monkeypatch.setattr(onednn_gemm, "_product", spy)
    return calls


def _grads(fn, *inputs):
    out = fn(*inputs)
    grad = torch.randn_like(out)
    return out, torch.autograd.grad(out, inputs, grad)


@pytest.mark.parametrize("shape", [(37, 24), (3, 5, 24), (24,)])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_equals_f_linear_with_its_gradients(products, shape, bias):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=g, requires_grad=True)
    w = torch.randn(40, 24, generator=g, requires_grad=True)
    b = torch.randn(40, generator=g, requires_grad=True) if bias else None
    inputs = (x, w, b) if bias else (x, w)
    torch.manual_seed(1)
    out, grads = _grads(linear, *inputs)
    torch.manual_seed(1)
    ref, ref_grads = _grads(F.linear, *inputs)
    assert out.shape == ref.shape == (*shape[:-1], 40)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert len(products) == 3  # the forward and both gradient products went through oneDNN


def test_linear_is_twice_differentiable(products):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(9, 16, generator=g, requires_grad=True)
    w = torch.randn(12, 16, generator=g, requires_grad=True)

    def second_order(fn):
        y = fn(x, w)
        (gx,) = torch.autograd.grad(y.square().sum(), x, create_graph=True)
        return torch.autograd.grad(gx.square().sum(), (x, w))

    for got, want in zip(second_order(linear), second_order(F.linear)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert len(products) >= 5  # the first and second derivatives' products went through oneDNN


@pytest.mark.filterwarnings("ignore:.*torch.jit.script.* is deprecated:FutureWarning")  # inside torch's forward AD
def test_linear_has_forward_mode_derivatives(products):
    import torch.autograd.forward_ad as fwAD

    g = torch.Generator().manual_seed(8)
    x, w, b = torch.randn(6, 10, generator=g), torch.randn(7, 10, generator=g), torch.randn(7, generator=g)
    tangents = [torch.randn(6, 10, generator=g), torch.randn(7, 10, generator=g), torch.randn(7, generator=g)]
    for which in ([0], [1], [0, 1, 2]):  # the input's tangent, the weight's, all three
        duals = {}
        for fn in (linear, F.linear):
            with fwAD.dual_level():
                args = [fwAD.make_dual(t, tangents[i]) if i in which else t for i, t in enumerate((x, w, b))]
                duals[fn] = fwAD.unpack_dual(fn(*args)).tangent
        torch.testing.assert_close(duals[linear], duals[F.linear], rtol=1e-5, atol=1e-5)
    assert products  # the tangents went through oneDNN too


def test_mm_equals_torch_mm_for_transposed_views_too(products):
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(33, 20, generator=g), torch.randn(20, 50, generator=g)
    torch.testing.assert_close(mm(a, b), a @ b, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mm(b.t(), a.t()), b.t() @ a.t(), rtol=1e-5, atol=1e-5)
    assert products == [(33, 50), (50, 33)]


@pytest.mark.filterwarnings("ignore:TF32 acceleration")  # torch.backends.mkldnn.flags, Intel GPUs only
def test_only_float32_cpu_products_outside_autocast_and_traces_are_taken(products, monkeypatch):
    x, w = torch.randn(8, 16), torch.randn(4, 16)
    assert onednn_products(x, w, None)
    assert not onednn_products(x.double(), w.double())  # float32 only
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast's GEMMs are its own
        assert not onednn_products(x, w)
    with torch.backends.mkldnn.flags(enabled=False):  # oneDNN turned off: PyTorch's kernels
        assert not onednn_products(x, w)
        assert torch.equal(linear(x, w), F.linear(x, w))
    with pytest.raises(RuntimeError, match="cannot be multiplied"):  # F.linear's own error for a wrong width
        linear(torch.randn(8, 12), w)
    with pytest.raises(RuntimeError, match="expanded size of the tensor"):  # and for a bias of the wrong size
        linear(x, w, torch.randn(5))
    torch.testing.assert_close(linear(x, w, torch.ones(1)), x @ w.t() + 1)  # a bias F.linear broadcasts
    empty = torch.randn(0, 16, requires_grad=True)  # an empty batch (oneDNN refuses it): PyTorch's own
    assert not onednn_products(empty, w)
    linear(empty, w.requires_grad_()).sum().backward()
    assert linear(torch.randn(2, 0, 16), w).shape == (2, 0, 4) and torch.equal(w.grad, torch.zeros_like(w))
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert not onednn_products(x, w)  # inductor picks its own kernels
    monkeypatch.setattr(onednn_gemm, "PREFERRED", False)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: False)
    assert not onednn_products(x, w)  # a CPU where MKL is as fast (no AVX-512)
    assert products == []


def test_layers_take_it_only_for_a_product_that_needs_gradients(products):
    fc = nn.Linear(16, 32)
    x = torch.randn(4, 16)
    fused_linear.linear(x, fc).sum().backward()
    assert products == [(4, 32), (32, 16)]  # forward and the weight's gradient (x needs none)
    products.clear()
    with torch.no_grad():
        fused_linear.linear(x, fc)  # inference: its own paths (below oneDNN's inference size: F.linear)
    handle = fc.register_forward_hook(lambda *args: None)  # a hook must see the module run
    fused_linear.linear(x, fc).sum().backward()
    handle.remove()
    assert products == []


def test_torch_func_transforms_run_pytorchs_own_products(products):
    mlp = MLP(8, 16)  # its layers go through `fused_linear.linear`
    x = torch.randn(5, 8)
    params = {name: p.detach() for name, p in mlp.named_parameters()}

    def loss(p, row):
        return torch.func.functional_call(mlp, p, (row,)).square().sum()

    per_sample = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0))(params, x)  # per-sample gradients
    for i, row in enumerate(x):
        mlp.zero_grad()
        loss(dict(mlp.named_parameters()), row).backward()
        for name, p in mlp.named_parameters():
            torch.testing.assert_close(per_sample[name][i], p.grad)
    # the loop's autograd steps did take oneDNN: two forwards, the second layer's two gradients, the first's weight's
    assert len(products) == 5 * 5
    products.clear()
    torch.func.grad(loss)(params, x[0])
    assert products == []  # the transforms did not: oneDNN's call has no vmap or grad rules


@pytest.mark.filterwarnings("ignore:TF32 acceleration")
def test_a_gpt_training_step_through_onednn_equals_pytorchs_own(products):
    model = tiny_gpt().train()
    ids = torch.randint(0, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(5))

    def step() -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad()
        torch.manual_seed(6)
        loss = model(ids, labels=ids, return_logits=False).loss
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    loss, grads = step()
    assert len(products) > 3 * len(model.backbone.blocks)  # every layer's products, the LM head's too
    with torch.backends.mkldnn.flags(enabled=False):
        ref_loss, ref_grads = step()
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_the_fused_loss_through_onednn_equals_cross_entropy_of_linear(products):
    g = torch.Generator().manual_seed(7)
    hidden = torch.randn(30, 16, generator=g, requires_grad=True)
    weight = torch.randn(50, 16, generator=g, requires_grad=True)
    bias = torch.randn(50, generator=g, requires_grad=True)
    labels = torch.randint(0, 50, (30,), generator=g)
    labels[::7] = -100
    loss = linear_cross_entropy(hidden, weight, labels, bias)
    grads = torch.autograd.grad(loss, (hidden, weight, bias))
    assert products == [(30, 50), (30, 16), (50, 16)]  # logits, the hidden states' and weight's gradients
    ref = F.cross_entropy(F.linear(hidden, weight, bias), labels)
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-6)
    for got, want in zip(grads, torch.autograd.grad(ref, (hidden, weight, bias))):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("hook", ["module_full", "module_pre", "global_full", "global_pre"])
def test_a_backward_hook_on_a_layer_sees_its_gradients(products, hook):
    fc = nn.Linear(16, 32)
    seen = []
    register = {"module_full": fc.register_full_backward_hook,
                "module_pre": fc.register_full_backward_pre_hook,
                "global_full": torch.nn.modules.module.register_module_full_backward_hook,
                "global_pre": torch.nn.modules.module.register_module_full_backward_pre_hook}[hook]
    handle = register(lambda *args: seen.append(1))
    try:
        fused_linear.linear(torch.randn(4, 16, requires_grad=True), fc).sum().backward()
    finally:
        handle.remove()
    assert seen == [1]  # the module ran as itself, hooks and all
    assert products == []


def test_a_strided_bias_runs_pytorchs_own_products(products):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(8, 16, generator=g, requires_grad=True)
    weight = torch.randn(32, 16, generator=g, requires_grad=True)
    bias = torch.randn(32, 3, generator=g)[:, 0].requires_grad_()  # stride 3: oneDNN would read it as contiguous
    assert not onednn_products(x, weight, bias)
    torch.testing.assert_close(linear(x, weight, bias), F.linear(x, weight, bias))
    assert products == []
    labels = torch.randint(0, 32, (8,), generator=g)
    loss = linear_cross_entropy(x, weight, labels, bias)
    torch.testing.assert_close(loss, F.cross_entropy(F.linear(x, weight, bias), labels))
    assert products == []


@pytest.fixture
def timings(monkeypatch) -> list[bool]:
    """oneDNN's preference left to timing, from a clean slate (nothing decided, nothing inherited);
    every timing recorded."""
    monkeypatch.setattr(onednn_gemm, "PREFERRED", None)
    monkeypatch.delenv(onednn_gemm.ENV, raising=False)
    calls: list[bool] = []
    real = onednn_gemm._training_products_seconds
    monkeypatch.setattr(onednn_gemm, "_training_products_seconds", lambda: calls.append(True) or real())
    return calls


@pytest.mark.parametrize("onednn_speedup, taken", [(2.0, True), (onednn_gemm.MIN_GAIN + 0.05, True),
                                                   (onednn_gemm.MIN_GAIN - 0.03, False), (0.6, False)])
def test_onednn_is_preferred_where_timed_min_gain_faster_once_for_the_processes_to_come(monkeypatch, onednn_speedup,
                                                                                        taken):
    monkeypatch.setattr(onednn_gemm, "PREFERRED", None)
    monkeypatch.delenv(onednn_gemm.ENV, raising=False)
    calls = []
    monkeypatch.setattr(onednn_gemm, "_training_products_seconds",
                        lambda: calls.append(True) or (1.0, 1.0 / onednn_speedup))  # (MKL's, oneDNN's) seconds
    x, w = torch.randn(8, 16), torch.randn(4, 16)
    assert onednn_gemm.preferred() is taken and onednn_products(x, w) is taken
    before = torch.get_num_threads()
    torch.set_num_threads(before + 1)
    try:
        assert onednn_gemm.preferred() is taken  # another thread count: the same decision, not timed again
    finally:
        torch.set_num_threads(before)
    assert len(calls) == 1
    # in the environment: a process started from here (a DDP worker) decides the same, untimed
    assert os.environ[onednn_gemm.ENV] == ("1" if taken else "0")
    monkeypatch.setattr(onednn_gemm, "PREFERRED", None)
    assert onednn_gemm.preferred() is taken and len(calls) == 1
    for told in (True, False):  # set: as told, untimed
        monkeypatch.setattr(onednn_gemm, "PREFERRED", told)
        assert onednn_gemm.preferred() is told and onednn_products(x, w) is told
    assert len(calls) == 1


def test_the_environment_fixes_the_choice_and_a_bad_value_is_refused(monkeypatch, timings):
    for value, expected in (("1", True), ("0", False)):
        monkeypatch.setattr(onednn_gemm, "PREFERRED", None)
        monkeypatch.setenv(onednn_gemm.ENV, value)
        assert onednn_gemm.preferred() is expected
    monkeypatch.setattr(onednn_gemm, "PREFERRED", None)
    monkeypatch.setenv(onednn_gemm.ENV, "yes")
    with pytest.raises(ValueError, match=r"UNITOK_ONEDNN='yes': expected 1 \(oneDNN's products\) or 0"):
        onednn_gemm.preferred()
    assert timings == []


def test_a_process_started_after_the_timing_inherits_it(monkeypatch, timings):
    import subprocess
    import sys

    choice = onednn_gemm.preferred()
    assert timings == [True]
    code = ("import unitok.layers.onednn_gemm as o; o._training_products_seconds = None; "  # would fail if timed
            "o.PREFERRED = None; print(o.preferred())")  # (None: as the fixture left this process, on any CPU)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(choice)


def test_the_timing_runs_only_where_a_product_could_take_onednn_and_disturbs_nothing(timings):
    x, w = torch.randn(8, 16), torch.randn(4, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not onednn_products(x, w)  # autocast: PyTorch's (its low-precision GEMMs), nothing timed
    assert not onednn_products(x.double(), w.double()) and not onednn_products(torch.randn(0, 16), w)
    assert timings == []
    rng = torch.get_rng_state()
    state = (torch.is_grad_enabled(), torch.get_num_threads(), torch.are_deterministic_algorithms_enabled(),
             torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"))
    choice = onednn_gemm.preferred()  # the real timing: a few milliseconds of products each way
    assert timings == [True] and torch.equal(torch.get_rng_state(), rng)
    assert state == (torch.is_grad_enabled(), torch.get_num_threads(), torch.are_deterministic_algorithms_enabled(),
                     torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"))
    assert onednn_products(x, w) is choice and timings == [True]


def test_the_timing_returns_mkls_seconds_then_onednns(monkeypatch):
    import time

    real = onednn_gemm._product
    monkeypatch.setattr(onednn_gemm, "_product", lambda *args: time.sleep(0.002) or real(*args))  # oneDNN slowed
    mkl, onednn = onednn_gemm._training_products_seconds()
    assert onednn > mkl + 9 * 0.002  # nine products a repetition, each 2 ms slower


def test_a_dispatch_mode_that_sees_every_op_gets_pytorchs_own_products_and_no_timing(timings):
    from torch.utils.flop_counter import FlopCounterMode

    fc = nn.Linear(16, 4)
    x = torch.randn(8, 16, requires_grad=True)
    with FlopCounterMode(display=False) as counter:  # (its module hooks keep layers on F.linear: called directly)
        linear(x, fc.weight, fc.bias).sum().backward()
    assert counter.get_total_flops() == 3 * 2 * 8 * 16 * 4  # the forward and both gradients, counted
    assert timings == [] and onednn_gemm.PREFERRED is None
