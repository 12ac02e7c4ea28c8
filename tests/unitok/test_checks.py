"""Deferred input checks (`unitok.checks.deferred_checks`): on a GPU the models' forwards and the
fused loss queue their input checks' verdicts and read them as they end, so a training step has
no host sync; the error is the same and comes before any result. CI has no GPU, so these tests
let CPU tensors defer too (``cpu_defers``); `benchmarks/cuda_checks.py` runs the CUDA path."""

from __future__ import annotations

import pytest
import torch

import unitok.checks as checks
from tests.conftest import tiny_gpt
from unitok.checks import check_finite, deferred_checks, defers
from unitok.embed import TokenEmbedding
from unitok.losses import cross_entropy, linear_cross_entropy
from unitok.models import BERT, BERTConfig, ViT, ViTConfig


@pytest.fixture
def cpu_defers(monkeypatch):
    """CPU tensors' checks defer as CUDA tensors' do."""
    monkeypatch.setattr(checks, "_DEFERRING_DEVICES", frozenset({"cpu", "cuda"}))


def test_cpu_tensors_are_checked_at_once_and_nothing_defers_outside_a_scope(cpu_defers):
    ids = torch.tensor([[1, 2]])
    assert not defers(ids)
    with deferred_checks():
        assert defers(ids)
    assert not defers(ids)
    checks._DEFERRING_DEVICES = frozenset({"cuda"})
    with deferred_checks():
        assert not defers(ids)
        with pytest.raises(ValueError, match=r"token ids \[50\] are outside the vocabulary \[0, 50\)"):
            TokenEmbedding(50, 4)(torch.tensor([[3, 50]]))  # at once, inside the scope


def test_a_deferred_id_check_raises_as_the_scope_ends_and_the_gather_never_sees_the_bad_id(cpu_defers):
    embed = TokenEmbedding(50, 4)
    reached = False
    with pytest.raises(ValueError, match=r"token ids \[-3, 57\] are outside the vocabulary \[0, 50\)"):
        with deferred_checks():
            out = embed(torch.tensor([[57, 2, -3]]))  # nn.Embedding itself would raise IndexError
            reached = True
    assert reached
    torch.testing.assert_close(out, embed(torch.tensor([[49, 2, 0]])), rtol=0, atol=0)  # clamped meanwhile


def test_nested_scopes_read_their_verdicts_at_the_outermost_end(cpu_defers):
    embed = TokenEmbedding(10, 4)
    order = []
    with pytest.raises(ValueError, match=r"token ids \[10\]"):
        with deferred_checks():
            with deferred_checks():
                embed(torch.tensor([10]))
            order.append("inner scope ended without raising")
    assert order == ["inner scope ended without raising"]


def test_a_scope_left_by_an_error_raises_that_error_and_leaves_nothing_pending(cpu_defers):
    embed = TokenEmbedding(10, 4)
    with pytest.raises(KeyError):
        with deferred_checks():
            embed(torch.tensor([99]))
            raise KeyError("first")
    with deferred_checks():  # a fresh scope: the dropped verdict does not come back
        embed(torch.tensor([3]))


def test_a_gpt_forward_defers_and_gives_the_same_outputs(cpu_defers):
    model = tiny_gpt(vocab_size=50)
    ids = torch.tensor([[1, 5, 7, 49]])
    checks._DEFERRING_DEVICES = frozenset()
    expected = model(ids, labels=ids)
    checks._DEFERRING_DEVICES = frozenset({"cpu"})
    out = model(ids, labels=ids)
    torch.testing.assert_close(out.logits, expected.logits, rtol=0, atol=0)
    torch.testing.assert_close(out.loss, expected.loss, rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"token ids \[50\] are outside the vocabulary \[0, 50\)"):
        model(torch.tensor([[1, 50]]))
    model(ids)  # each call is its own scope: the last one's verdict is gone


@pytest.mark.parametrize("return_logits", [True, False], ids=["logits", "fused"])
def test_bad_labels_are_named_after_a_deferred_check(cpu_defers, return_logits):
    model = tiny_gpt(vocab_size=50)
    ids = torch.tensor([[1, 5, 7, 9]])
    labels = torch.tensor([[1, 5, 70, -100]])
    with pytest.raises(ValueError, match=r"labels \[70\] are outside \[0, 50\)"):
        model(ids, labels=labels, return_logits=return_logits)
    hidden = torch.randn(3, 8, requires_grad=True)
    weight = torch.randn(6, 8, requires_grad=True)
    with pytest.raises(ValueError, match=r"labels \[6, 9\] are outside \[0, 6\)"):
        linear_cross_entropy(hidden, weight, torch.tensor([9, -100, 6]))
    good = torch.tensor([5, -100, 0])
    torch.testing.assert_close(linear_cross_entropy(hidden, weight, good),
                               cross_entropy(hidden @ weight.t(), good), rtol=1e-6, atol=1e-6)


def test_bert_masked_lm_labels_defer_through_its_unfused_loss(cpu_defers):
    torch.manual_seed(0)
    model = BERT(BERTConfig(vocab_size=40, context_length=16, d_model=16, n_layers=1, n_heads=2,
                            heads=("mlm",))).eval()
    ids = torch.tensor([[2, 5, 7, 3]])
    with pytest.raises(ValueError, match=r"labels \[40\] are outside \[0, 40\)"):
        model(ids, labels=torch.tensor([[-100, 40, -100, -100]]))  # not F.cross_entropy's IndexError


def test_non_finite_pixels_are_counted_after_a_deferred_check(cpu_defers):
    model = ViT(ViTConfig.from_name("vit-digits")).eval()
    pixels = torch.zeros(2, 1, 32, 32)
    pixels[1, 0, 4, 4] = float("nan")
    pixels[0, 0, 0, 0] = float("-inf")
    with pytest.raises(ValueError, match="pixel_values contain 2 NaN/inf"):
        model(pixels)
    with deferred_checks():
        check_finite(torch.full((4,), 3e38), "values")  # the sum overflows; every value is finite
