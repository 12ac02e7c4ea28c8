"""Optimiser pieces shared by every task: weight-decay groups and the warm-up + cosine schedule."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor, nn

from tokenizers_mm.checks import check_int, check_number


def weight_decay_groups(module: nn.Module, weight_decay: float) -> list[dict]:
    """Two AdamW groups: matrices (linear and embedding weights) decay; biases, norm gains and
    what a model's ``no_weight_decay()`` names (timm's API: a ViT's class, distillation and
    register tokens and positions; a CLIP's image class token, as open_clip) do not. The
    outermost module that names some decides for everything under it. Tied parameters appear once.
    """
    exempt: set[str] = set()
    claimed: list[str] = []  # prefixes of modules whose no_weight_decay has spoken
    for prefix, sub in module.named_modules():
        if callable(getattr(sub, "no_weight_decay", None)) and not any(
                prefix.startswith(c) for c in claimed):
            head = f"{prefix}." if prefix else ""
            exempt |= {head + name for name in sub.no_weight_decay()}
            claimed.append(head)
    decay, no_decay, seen = [], [], set()
    for name, param in module.named_parameters():
        if not param.requires_grad or id(param) in seen:
            continue
        seen.add(id(param))
        (decay if param.dim() >= 2 and name not in exempt else no_decay).append(param)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def warmup_cosine(warmup_steps: int, total_steps: int, min_ratio: float = 0.1) -> Callable[[int], float]:
    """LR multiplier: linear warm-up to 1 over ``warmup_steps`` (step s at (s + 1) / warmup_steps:
    the first step already learns, and the peak is reached at step warmup_steps − 1, where
    transformers' `get_cosine_schedule_with_warmup` spends step 0 at 0 and peaks a step later),
    then cosine decay to ``min_ratio`` at ``total_steps`` (and flat after); after the warm-up
    the two schedules agree step for step."""
    check_int("warmup_steps", warmup_steps, at_least=0)
    check_int("total_steps", total_steps)
    if not 0.0 <= min_ratio <= 1.0:
        raise ValueError(f"min_ratio must be in [0, 1], got {min_ratio}")

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        span = max(1, total_steps - warmup_steps)
        progress = min(1.0, (step - warmup_steps) / span)
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def fused_supported(params: Iterable[Tensor]) -> bool:
    """Whether torch's fused AdamW takes these parameters: floating point, all on one CPU or CUDA device."""
    params = list(params)
    devices = {p.device for p in params}
    return (bool(params) and len(devices) == 1 and next(iter(devices)).type in ("cpu", "cuda")
            and all(p.dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16) for p in params))


def check_optimizer_settings(hparams: Any) -> None:
    """Refuse optimiser settings AdamW and the schedule would misread (a negative or NaN learning
    rate, betas outside [0, 1)), naming the task's option — before a run builds its data."""
    check_number("learning_rate", getattr(hparams, "learning_rate", None), 0.0)  # 0: a run that must not move the weights
    check_number("weight_decay", getattr(hparams, "weight_decay", 0.0), 0.0)
    betas = getattr(hparams, "betas", (0.9, 0.999))
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ValueError(f"betas must be two numbers in [0, 1), got {betas!r}")
    for beta in betas:
        check_number("betas", beta, 0.0, 1.0, high_open=True)
    check_int("warmup_steps", getattr(hparams, "warmup_steps", 0), at_least=0)
    check_number("min_lr_ratio", getattr(hparams, "min_lr_ratio", 0.0), 0.0, 1.0)


def adamw_warmup_cosine(module: nn.Module, trainer: Any, hparams: Any) -> dict[str, Any]:
    """The optimiser every task uses, as Lightning's ``configure_optimizers`` returns it: AdamW
    over `weight_decay_groups` of ``module`` with a per-step `warmup_cosine` schedule to the
    trainer's total steps. ``hparams`` supplies learning_rate, weight_decay, betas,
    warmup_steps and min_lr_ratio. The update is PyTorch's fused AdamW kernel (one pass over
    each parameter, several times faster than the per-tensor loop) wherever it runs: float
    parameters on the CPU or a CUDA device, unless a mixed-precision run clips gradients."""
    check_optimizer_settings(hparams)
    groups = weight_decay_groups(module, hparams.weight_decay)
    if not any(group["params"] for group in groups):
        raise ValueError("nothing to train: every parameter is frozen")
    # Lightning's mixed-precision plugin refuses to clip the gradients of a fused optimizer
    # (it would unscale fp16 gradients inside step): there, the per-tensor loop.
    mixed = str(getattr(trainer, "precision", "32-true")).endswith("mixed")
    clipped = bool(getattr(trainer, "gradient_clip_val", None))
    fused = fused_supported(p for g in groups for p in g["params"]) and not (mixed and clipped)
    optimizer = torch.optim.AdamW(groups, lr=hparams.learning_rate, betas=tuple(hparams.betas), fused=fused)
    steps = trainer.estimated_stepping_batches
    if not math.isfinite(steps):  # max_steps -1 and max_epochs -1: no end for the cosine to reach
        raise ValueError("the learning-rate schedule decays over the run's length, but the run has none: set "
                         "--trainer.max_steps (or max_epochs)")
    total = max(1, int(steps))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(hparams.warmup_steps, total,
                                                                          hparams.min_lr_ratio))
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}
