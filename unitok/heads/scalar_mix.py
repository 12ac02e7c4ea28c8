"""A learnable weighted sum of layers (ELMo's "scalar mix"), for the feature-based approach:
γ · Σ_l softmax(w)_l · h_l over the hidden states of a frozen encoder.

Axis legend: L layers mixed, B batch, N tokens, D width.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn


class ScalarMix(nn.Module):
    """Mix ``n_layers`` equally shaped hidden states with softmax-normalised learned weights.

    Args:
        n_layers: how many layers are mixed (L). layer_norm: normalise each layer first
            (without learned gains), which helps when layer scales differ widely.
    Starts as the plain average (all weights equal, γ = 1).
    """

    def __init__(self, n_layers: int, layer_norm: bool = False) -> None:
        super().__init__()
        if n_layers < 1:
            raise ValueError(f"ScalarMix needs at least one layer, got {n_layers}")
        self.n_layers = n_layers
        self.layer_norm = layer_norm
        self.weights = nn.Parameter(torch.zeros(n_layers))
        self.gamma = nn.Parameter(torch.ones(()))

    def forward(self, layers: Sequence[Tensor] | Tensor) -> Tensor:  # L × (B, N, D) -> (B, N, D)
        if len(layers) != self.n_layers:
            raise ValueError(f"ScalarMix was built for {self.n_layers} layers, got {len(layers)}")
        stacked = torch.stack(list(layers)) if not isinstance(layers, Tensor) else layers  # (L, B, N, D)
        if self.layer_norm:
            stacked = nn.functional.layer_norm(stacked, stacked.shape[-1:])
        w = self.weights.softmax(0).to(stacked.dtype)
        return self.gamma * torch.einsum("l,l...->...", w, stacked)

    @property
    def layer_weights(self) -> Tensor:
        """The current normalised weights (L,), for inspection."""
        return self.weights.detach().softmax(0)
