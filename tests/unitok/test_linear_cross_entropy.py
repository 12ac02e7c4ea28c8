"""`linear_cross_entropy`: the LM head fused with the cross-entropy gives the same loss and the same
gradients as ``F.cross_entropy(F.linear(...))`` — float32 to rounding, bf16 autocast within its
rounding — whether the rows fit one chunk or many, with ignored labels, a bias and tied weights;
GPT's and T5's ``return_logits=False`` and the LM tasks that use it train the same model. With
``compile=`` each chunk's softmax and gradient run as one compiled function and give the same
numbers (the ordinary suite traces with ``aot_eager``; ``make test-compile`` with inductor)."""

from __future__ import annotations

import math
import os

import pytest
import torch
import torch.nn.functional as F

import unitok.losses as losses
from unitok.losses import linear_cross_entropy
from unitok.models import GPT, T5, GPTConfig, T5Config

BACKEND = os.environ.get("UNITOK_COMPILE_BACKEND", "aot_eager")


def problem(rows: int = 37, width: int = 16, classes: int = 53, bias: bool = True, seed: int = 0):
    """(hidden (2, rows, D), weight, bias, labels with some -100) needing gradients."""
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(2, rows, width, generator=g, requires_grad=True)
    weight = (0.3 * torch.randn(classes, width, generator=g)).requires_grad_()
    b = (0.1 * torch.randn(classes, generator=g)).requires_grad_() if bias else None
    labels = torch.randint(0, classes, (2, rows), generator=g)
    labels[0, :5] = -100
    labels[1, -3:] = -100
    return hidden, weight, b, labels


def reference(hidden, weight, bias, labels):
    logits = F.linear(hidden, weight, bias)
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100)


def fused(hidden, weight, bias, labels):
    return linear_cross_entropy(hidden, weight, labels, bias)


def loss_and_grads(fn, hidden, weight, bias, labels, scale: float = 1.0):
    inputs = [t for t in (hidden, weight, bias) if t is not None]
    loss = fn(hidden, weight, bias, labels)
    return loss.detach(), torch.autograd.grad(scale * loss, inputs)


@pytest.mark.parametrize("chunk_values", [losses.CHUNK_VALUES, 64 * 53, 1])
@pytest.mark.parametrize("block_values", [losses.BLOCK_VALUES, 5 * 53, 1])
@pytest.mark.parametrize("bias", [True, False])
def test_equals_linear_then_cross_entropy(monkeypatch, chunk_values, block_values, bias):
    """One chunk, several chunks (rows ≥ the width, 16 here) and the smallest chunks, their softmax
    passes in one block, blocks of 5 rows (the last one short) or of one row: the same loss and
    gradients as the unfused pair, whatever scales the loss afterwards."""
    monkeypatch.setattr(losses, "CHUNK_VALUES", chunk_values)
    monkeypatch.setattr(losses, "BLOCK_VALUES", block_values)
    args = problem(bias=bias)
    ref_loss, ref_grads = loss_and_grads(reference, *args, scale=2.5)
    loss, grads = loss_and_grads(fused, *args, scale=2.5)
    torch.testing.assert_close(loss, ref_loss, atol=1e-6, rtol=1e-6)
    for ours, theirs in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("block_values", [losses.BLOCK_VALUES, 5 * 53])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_targets_too_unlikely_for_a_float32_softmax_are_scored_exactly(monkeypatch, block_values, precision):
    """On the CPU log p(target) is the log of the softmax's probability; where that underflows
    (p < 1e-30: here logits 100-400 apart), the row is scored again through log-softmax, so a
    loss of hundreds of nats is the unfused pair's, not log(0)."""
    monkeypatch.setattr(losses, "BLOCK_VALUES", block_values)
    hidden, weight, bias, labels = problem()
    with torch.no_grad():
        hidden[0, 5:12] *= 300.0  # these rows' targets: far below their rows' best classes
    labels[0, 5:12] = weight.detach().mv(hidden[0, 5].detach()).argmin()
    amp = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else torch.autocast("cpu", enabled=False)
    with amp:
        ref_loss, ref_grads = loss_and_grads(reference, hidden, weight, bias, labels)
        loss, grads = loss_and_grads(fused, hidden, weight, bias, labels)
        per_row = F.cross_entropy(F.linear(hidden, weight, bias)[0, 5:12].float(), labels[0, 5:12], reduction="none")
    assert per_row.min() > -math.log(losses.SOFTMAX_FLOOR)  # the fallback was needed
    assert torch.isfinite(loss)
    tol = 1e-6 if precision == "fp32" else 2e-2
    torch.testing.assert_close(loss, ref_loss, atol=tol, rtol=tol)
    for ours, theirs in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(ours, theirs, atol=tol, rtol=tol)


@pytest.mark.parametrize("chunk_values, block_values", [(losses.CHUNK_VALUES, losses.BLOCK_VALUES), (40 * 101, 7 * 101)])
def test_bf16_autocast_matches_autocast_reference(monkeypatch, chunk_values, block_values):
    """Under autocast the GEMMs run in bf16 and the softmax in float32 (a block of rows at a time
    in a float32 buffer), as autocast runs the unfused pair; the gradients come back in the
    parameters' float32."""
    monkeypatch.setattr(losses, "CHUNK_VALUES", chunk_values)
    monkeypatch.setattr(losses, "BLOCK_VALUES", block_values)
    args = problem(rows=64, width=32, classes=101)
    with torch.autocast("cpu", torch.bfloat16):
        ref_loss, ref_grads = loss_and_grads(reference, *args)
        loss, grads = loss_and_grads(fused, *args)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, ref_loss, atol=1e-5, rtol=1e-5)  # the same bf16 logits
    for ours, theirs, param in zip(grads, ref_grads, [a for a in args[:3] if a is not None], strict=True):
        assert ours.dtype == param.dtype == torch.float32
        # bf16 products: about three significant digits (the bias's sum is float32 here, bf16 there)
        torch.testing.assert_close(ours, theirs, atol=2e-3, rtol=2e-2)


def test_float16_with_a_loss_scale_keeps_the_gradients_the_unfused_pair_keeps():
    # the fused path forms (softmax − one-hot) / count in the forward, before a GradScaler's scale
    # reaches it: in float16 a big batch's ~1e-8 values flushed to zero (35 % of the weight's
    # gradient entries here); float16 runs the unfused pair instead
    torch.manual_seed(0)
    rows, dim, vocab, scale = 4096, 32, 2048, 2.0 ** 16
    hidden, weight, labels = torch.randn(rows, dim), torch.randn(vocab, dim) * 0.02, torch.randint(0, vocab, (rows,))

    def weight_grad(fused: bool) -> torch.Tensor:
        w = weight.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = linear_cross_entropy(hidden, w, labels) if fused else \
                F.cross_entropy(F.linear(hidden, w).float(), labels)
        (loss * scale).backward()  # GradScaler.scale(loss).backward(), then unscale
        return w.grad / scale

    fused, plain = weight_grad(True), weight_grad(False)
    assert (fused == 0).float().mean() == (plain == 0).float().mean() == 0
    torch.testing.assert_close(fused, plain)


@pytest.mark.parametrize("block_values", [losses.BLOCK_VALUES, 5 * 53])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_compiled_chunks_give_the_eager_loss_and_gradients(monkeypatch, precision, block_values):
    """Three chunks, the last one short, a bias and ignored labels, each chunk in one block (as on
    a GPU) or in blocks of 5 rows (as on the CPU, the last one short): the compiled softmax
    gradient (the one-hot a comparison instead of a scatter) equals the eager passes — float32
    to rounding, under bf16 autocast to the rounding of the gradient's cast back to bf16."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    monkeypatch.setattr(losses, "CHUNK_VALUES", 32 * 53)
    monkeypatch.setattr(losses, "BLOCK_VALUES", block_values)
    args = problem()  # 74 rows: chunks of 32, 32 and 10
    with torch.autocast("cpu", torch.bfloat16, enabled=precision == "bf16"):
        loss, grads = loss_and_grads(fused, *args, scale=2.5)
        compiled_loss, compiled_grads = loss_and_grads(
            lambda h, w, b, y: linear_cross_entropy(h, w, y, b, compile=BACKEND), *args, scale=2.5)
    # traced for the first block's rows, then once with the rows dynamic, whatever the blocks after
    assert counters["stats"]["unique_graphs"] == 2
    with torch.autocast("cpu", torch.bfloat16, enabled=precision == "bf16"):
        other = problem(rows=23, seed=1)  # another batch's row counts: no new trace
        loss_and_grads(lambda h, w, b, y: linear_cross_entropy(h, w, y, b, compile=BACKEND), *other)
    assert counters["stats"]["unique_graphs"] == 2
    tolerance = {"atol": 1e-6, "rtol": 1e-5} if precision == "fp32" else {"atol": 2e-3, "rtol": 2e-2}
    torch.testing.assert_close(compiled_loss, loss, atol=1e-6, rtol=1e-6)  # the loss is float32 either way
    for ours, theirs in zip(compiled_grads, grads, strict=True):
        torch.testing.assert_close(ours, theirs, **tolerance)
    # the loss alone: the compiled function without its gradient
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=precision == "bf16"):
        torch.testing.assert_close(linear_cross_entropy(*args[:2], args[3], args[2], compile=BACKEND), loss,
                                   atol=1e-6, rtol=1e-6)


def test_compile_takes_a_bool_or_a_backend_name_or_callable():
    import torch._dynamo

    torch._dynamo.reset()
    hidden, weight, bias, labels = problem()
    graphs = []

    def backend(graph, example_inputs):  # a torch.compile backend: record the graph, run it as traced
        graphs.append(graph)
        return graph.forward

    loss = linear_cross_entropy(hidden, weight, labels, bias, compile=backend)
    assert graphs  # the chunk's softmax gradient went through it
    torch.testing.assert_close(loss, linear_cross_entropy(hidden, weight, labels, bias), atol=1e-6, rtol=1e-6)
    for bad in ("", 1, None):
        with pytest.raises(ValueError, match=r"compile must be True/False or a torch.compile backend \(a name"):
            linear_cross_entropy(hidden, weight, labels, bias, compile=bad)


def test_without_gradients_only_the_loss_is_computed():
    hidden, weight, bias, labels = problem()
    with torch.no_grad():
        loss = linear_cross_entropy(hidden, weight, labels, bias)
        ref = reference(hidden, weight, bias, labels)
    assert loss.grad_fn is None
    torch.testing.assert_close(loss, ref, atol=1e-6, rtol=1e-6)
    frozen = weight.detach()  # a frozen head: only the hidden states get a gradient
    loss = linear_cross_entropy(hidden, frozen, labels)
    (grad,) = torch.autograd.grad(loss, hidden)
    (ref_grad,) = torch.autograd.grad(reference(hidden, frozen, None, labels), hidden)
    torch.testing.assert_close(grad, ref_grad, atol=1e-6, rtol=1e-5)


def test_nothing_scored_is_nan_with_zero_gradients_as_in_torch():
    hidden, weight, bias, labels = problem()
    labels = torch.full_like(labels, -100)
    ref_loss, ref_grads = loss_and_grads(reference, hidden, weight, bias, labels)
    loss, grads = loss_and_grads(fused, hidden, weight, bias, labels)
    assert torch.isnan(loss) and torch.isnan(ref_loss)
    for ours, theirs in zip(grads, ref_grads, strict=True):
        assert torch.equal(ours, torch.zeros_like(ours)) and torch.equal(theirs, torch.zeros_like(theirs))


def test_bad_input_is_refused():
    hidden, weight, bias, labels = problem()
    with pytest.raises(ValueError, match="share D"):
        linear_cross_entropy(hidden, weight[:, :-1], labels)
    with pytest.raises(ValueError, match=r"bias must be \(53,\)"):
        linear_cross_entropy(hidden, weight, labels, bias[:-1])
    with pytest.raises(ValueError, match="shape"):
        linear_cross_entropy(hidden, weight, labels[:, :-1])
    with pytest.raises(ValueError, match=r"outside \[0, 53\)"):
        linear_cross_entropy(hidden, weight, labels.clamp(min=0) + 53)
    with pytest.raises(TypeError, match="integer"):
        linear_cross_entropy(hidden, weight, labels.float())
    with pytest.raises(ValueError, match="hidden is torch.float32 but the weight / bias are torch.float64"):
        linear_cross_entropy(hidden, weight.double(), labels)  # as F.linear, no silent cast


def gradients(model: torch.nn.Module, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    loss.backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def assert_same_gradients(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> None:
    assert ours.keys() == theirs.keys()
    for name in ours:
        torch.testing.assert_close(ours[name], theirs[name], atol=1e-6, rtol=1e-5, msg=name)


@pytest.mark.parametrize("tie", [True, False])
def test_gpt_without_logits_scores_labels_the_same(tie):
    """``return_logits=False`` keeps ``.loss`` (the shift inside) and every gradient, the tied
    embedding's included, and returns no logits."""
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("gpt-nano", vocab_size=61, context_length=16, tie_embeddings=tie, dropout=0.0))
    ids = torch.randint(0, 61, (3, 11))
    labels = ids.masked_fill(torch.rand(ids.shape) < 0.3, -100)
    plain = model(ids, labels=labels)
    fused = model(ids, labels=labels, return_logits=False)
    assert fused.logits is None and plain.logits is not None
    torch.testing.assert_close(fused.loss, plain.loss, atol=1e-6, rtol=1e-6)
    assert_same_gradients(gradients(model, fused.loss), gradients(model, plain.loss))
    with pytest.raises(ValueError, match=r"labels must be \(batch, tokens\) = \(3, 11\)"):
        model(ids, labels=labels[:, 1:], return_logits=False)


@pytest.mark.parametrize("tie", [True, False])
def test_t5_without_logits_scores_labels_the_same(tie):
    """T5's tied head reads the decoder states scaled by D^-0.5: the fused loss reads them too."""
    torch.manual_seed(0)
    model = T5(T5Config.from_name("t5-tiny", vocab_size=67, tie_embeddings=tie, dropout=0.0))
    src = torch.randint(2, 67, (2, 9))
    labels = torch.randint(2, 67, (2, 6))
    labels[1, -2:] = -100
    plain = model(src, labels=labels)
    fused = model(src, labels=labels, return_logits=False)
    assert fused.logits is None
    torch.testing.assert_close(fused.loss, plain.loss, atol=1e-6, rtol=1e-6)
    assert_same_gradients(gradients(model, fused.loss), gradients(model, plain.loss))
