"""Action head of the Decision Transformer: the state token's hidden state -> the action taken
there (tanh-squashed continuous actions in [-1, 1], or logits over discrete actions).

Axis legend: B batch, K steps, D width, A action width or number of actions.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class ActionHead(nn.Linear):
    """(B, K, D) -> (B, K, A); ``tanh``: squash continuous actions into [-1, 1]."""

    def __init__(self, d_model: int, act_dim: int, tanh: bool = False, device=None, dtype=None) -> None:
        super().__init__(d_model, act_dim, device=device, dtype=dtype)
        self.tanh = tanh

    def forward(self, hidden: Tensor) -> Tensor:
        out = super().forward(hidden)
        return torch.tanh(out) if self.tanh else out
