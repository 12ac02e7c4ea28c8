"""Weight-decay groups and the warm-up + cosine schedule."""

from __future__ import annotations

import math

import pytest

from tasks.optim import warmup_cosine, weight_decay_groups
from unitok.models import GPT, GPTConfig


def test_matrices_decay_biases_and_norms_do_not_and_tied_weights_count_once():
    model = GPT(GPTConfig.from_name("gpt-nano", vocab_size=64))
    decay, no_decay = weight_decay_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in no_decay["params"])
    assert any(p is model.tok_embed.weight for p in decay["params"])
    unique = {id(p) for p in model.parameters()}
    assert len(decay["params"]) + len(no_decay["params"]) == len(unique)


def test_warmup_then_cosine_to_the_floor():
    f = warmup_cosine(warmup_steps=10, total_steps=110, min_ratio=0.1)
    assert f(0) == pytest.approx(0.1) and f(4) == pytest.approx(0.5) and f(9) == pytest.approx(1.0)
    assert f(10) == pytest.approx(1.0)
    assert f(60) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert f(110) == pytest.approx(0.1) and f(500) == pytest.approx(0.1)
    assert all(f(s) >= f(s + 1) for s in range(10, 120))


def test_bad_schedule_arguments():
    with pytest.raises(ValueError, match="min_ratio"):
        warmup_cosine(1, 10, min_ratio=2.0)


def test_adamw_warmup_cosine_builds_lightnings_optimizer_dict_and_refuses_a_frozen_model():
    from types import SimpleNamespace

    from torch import nn

    from tasks.optim import adamw_warmup_cosine

    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    hparams = SimpleNamespace(learning_rate=1e-3, weight_decay=0.1, betas=(0.9, 0.95), warmup_steps=10,
                              min_lr_ratio=0.1)
    trainer = SimpleNamespace(estimated_stepping_batches=100)
    config = adamw_warmup_cosine(model, trainer, hparams)
    optimizer, schedule = config["optimizer"], config["lr_scheduler"]["scheduler"]
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.1, 0.0]
    assert optimizer.defaults["betas"] == (0.9, 0.95) and config["lr_scheduler"]["interval"] == "step"
    assert optimizer.param_groups[0]["lr"] == 1e-3 / 10  # first warm-up step
    for _ in range(100):
        optimizer.step()
        schedule.step()
    assert abs(optimizer.param_groups[0]["lr"] - 1e-4) < 1e-9  # cosine down to min_lr_ratio at the end
    model.requires_grad_(False)
    with __import__("pytest").raises(ValueError, match="every parameter is frozen"):
        adamw_warmup_cosine(model, trainer, hparams)
