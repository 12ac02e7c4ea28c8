"""Activation functions by config name (a registry, so configs stay plain strings)."""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

Activation = Literal["gelu", "gelu_tanh", "relu", "silu", "quick_gelu"]


class QuickGELU(nn.Module):
    """x·σ(1.702x): the GELU approximation of the original CLIP weights."""

    def forward(self, x: Tensor) -> Tensor:
        return x * F.sigmoid(1.702 * x)


def make_activation(name: Activation) -> nn.Module:
    table = {
        "gelu": lambda: nn.GELU(),
        "gelu_tanh": lambda: nn.GELU(approximate="tanh"),  # GPT-2's "gelu_new"
        "relu": lambda: nn.ReLU(),
        "silu": lambda: nn.SiLU(),
        "quick_gelu": lambda: QuickGELU(),
    }
    if name not in table:
        raise ValueError(f"unknown activation {name!r}; expected one of {sorted(table)}")
    return table[name]()


def activate_fresh(act: nn.Module, h: Tensor) -> Tensor:
    """``act(h)`` for an ``h`` just computed and used nowhere else: overwritten in place when
    nothing needs its gradient (inference), saving the allocation and a pass over a buffer of
    h's size; otherwise out of place, as autograd needs h."""
    if h.requires_grad and torch.is_grad_enabled():
        return act(h)
    if type(act) is nn.GELU:
        return torch.ops.aten.gelu_(h, approximate=act.approximate)
    if type(act) is nn.ReLU:
        return F.relu_(h)
    if type(act) is nn.SiLU:
        return F.silu(h, inplace=True)
    return act(h)
