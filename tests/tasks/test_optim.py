"""Weight-decay groups and the warm-up + cosine schedule."""

from __future__ import annotations

import math

import pytest

from tasks.data.base import SplitDataModule
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


def test_tokens_and_positions_are_not_decayed_as_the_references_train_them():
    from tasks.image_classification import ImageClassificationTask
    from unitok.models import CLIP, CLIPConfig, DeiT, ViTConfig

    def exempt(module) -> set[str]:
        names = {id(p): n for n, p in module.named_parameters()}
        decay, no_decay = weight_decay_groups(module, 0.1)
        return {names[id(p)] for p in no_decay["params"] if p.dim() >= 2}

    deit = DeiT(ViTConfig.from_name("deit-digits"))
    assert exempt(deit) == {"cls_token", "dist_token", "pos_embed"}  # timm's no_weight_decay()
    task = ImageClassificationTask(family="deit", preset="deit-digits")
    assert exempt(task) == {"model.cls_token", "model.dist_token", "model.pos_embed"}  # found under a task too
    # open_clip decays what has 2 dimensions there: its positions, not its (D,) class embedding;
    # CLIP's rule holds for its image tower (a ViT, whose own rule would exempt the positions too)
    assert exempt(CLIP(CLIPConfig.from_name("clip-digits"))) == {"visual.cls_token"}


def test_warmup_then_cosine_to_the_floor():
    f = warmup_cosine(warmup_steps=10, total_steps=110, min_ratio=0.1)
    assert f(0) == pytest.approx(0.1) and f(4) == pytest.approx(0.5) and f(9) == pytest.approx(1.0)
    assert f(10) == pytest.approx(1.0)
    assert f(60) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert f(110) == pytest.approx(0.1) and f(500) == pytest.approx(0.1)
    assert all(f(s) >= f(s + 1) for s in range(10, 120))


def test_bad_schedule_arguments():
    with pytest.raises(ValueError, match=r"min_ratio must be in \[0, 1\], got 2\.0$"):
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
    model.requires_grad_(True)
    with pytest.raises(ValueError, match="the run has none: set --trainer.max_steps"):  # max_steps -1, max_epochs -1
        adamw_warmup_cosine(model, SimpleNamespace(estimated_stepping_batches=float("inf")), hparams)


def test_the_tasks_adamw_is_fused_on_cpu_and_steps_as_the_reference_adamw():
    import copy
    from types import SimpleNamespace

    import torch

    from tasks.optim import adamw_warmup_cosine, fused_supported

    torch.manual_seed(0)
    # (no attention here: a key bias's gradient is rounding noise, which Adam scales up to a full step)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))
    reference = copy.deepcopy(model)
    hparams = SimpleNamespace(learning_rate=1e-2, weight_decay=0.1, betas=(0.9, 0.95), warmup_steps=0,
                              min_lr_ratio=1.0)
    optimizer = adamw_warmup_cosine(model, SimpleNamespace(estimated_stepping_batches=10), hparams)["optimizer"]
    assert optimizer.defaults["fused"] is True
    slow = torch.optim.AdamW(weight_decay_groups(reference, 0.1), lr=1e-2, betas=(0.9, 0.95), foreach=False)
    x = torch.randn(32, 8)
    for _ in range(5):
        for m, opt in ((model, optimizer), (reference, slow)):
            opt.zero_grad()
            m(x).square().mean().backward()
            opt.step()
    for (name, a), b in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5, msg=lambda m, name=name: f"{name}: {m}")
    assert not fused_supported([torch.zeros(2, dtype=torch.int64)]) and not fused_supported([])


def test_a_mixed_precision_run_that_clips_gradients_gets_the_unfused_adamw():
    from types import SimpleNamespace

    from torch import nn

    from tasks.optim import adamw_warmup_cosine

    hparams = SimpleNamespace(learning_rate=1e-3, weight_decay=0.1, betas=(0.9, 0.95), warmup_steps=0,
                              min_lr_ratio=0.1)
    for precision, clip, fused in (("bf16-mixed", 1.0, False), ("bf16-mixed", None, True), ("32-true", 1.0, True)):
        trainer = SimpleNamespace(estimated_stepping_batches=10, precision=precision, gradient_clip_val=clip)
        optimizer = adamw_warmup_cosine(nn.Linear(4, 4), trainer, hparams)["optimizer"]
        assert bool(optimizer.defaults["fused"]) is fused, (precision, clip)


def test_counts_given_as_floats_are_refused_where_they_were_read_before():
    # a fractional batch size reached the DataLoader; a fractional warm-up bent the schedule
    with pytest.raises(ValueError, match="batch_size must be an integer ≥ 1, got 2.5"):
        SplitDataModule(batch_size=2.5)
    with pytest.raises(ValueError, match="num_workers must be an integer ≥ 0, got -1"):
        SplitDataModule(batch_size=2, num_workers=-1)
    with pytest.raises(ValueError, match="warmup_steps must be an integer ≥ 0, got 1.5"):
        warmup_cosine(1.5, 10)


@pytest.mark.parametrize(("name", "bad", "message"), [
    ("learning_rate", -1e-3, "learning_rate must be a finite number ≥ 0, got -0.001"),
    ("learning_rate", float("nan"), "learning_rate must be a finite number ≥ 0, got nan"),
    ("weight_decay", -0.1, r"weight_decay must be a finite number ≥ 0, got -0.1"),
    ("betas", (0.9, 1.0), r"betas must be a finite number in \[0, 1\), got 1.0"),
    ("betas", (0.9,), r"betas must be two numbers in \[0, 1\), got \(0.9,\)"),
    ("warmup_steps", 2.5, "warmup_steps must be an integer ≥ 0, got 2.5"),
    ("min_lr_ratio", 1.5, r"min_lr_ratio must be a finite number in \[0, 1\], got 1.5"),
])
def test_optimizer_settings_adamw_would_misread_are_refused_by_name(name, bad, message):
    from types import SimpleNamespace

    from torch import nn

    from tasks.optim import adamw_warmup_cosine

    hparams = dict(learning_rate=1e-3, weight_decay=0.1, betas=(0.9, 0.95), warmup_steps=0, min_lr_ratio=0.1)
    with pytest.raises(ValueError, match=message):
        adamw_warmup_cosine(nn.Linear(4, 4), SimpleNamespace(estimated_stepping_batches=10),
                            SimpleNamespace(**{**hparams, name: bad}))
