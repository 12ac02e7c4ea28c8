"""Activation functions by config name (a registry, so configs stay plain strings)."""

from __future__ import annotations

from typing import Literal

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
