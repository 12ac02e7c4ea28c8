"""Projection head: pooled features -> a joint embedding space (CLIP's ``visual.proj`` /
``text_projection``), optionally L2-normalised for contrastive losses and retrieval.

Axis legend: B batch, D width, E embedding width.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn


class ProjectionHead(nn.Linear):
    """(B, D) -> (B, E); ``normalize=True`` returns unit vectors."""

    def __init__(self, d_model: int, embed_dim: int, bias: bool = False, device=None, dtype=None) -> None:
        super().__init__(d_model, embed_dim, bias=bias, device=device, dtype=dtype)
        nn.init.normal_(self.weight, std=d_model**-0.5)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, pooled: Tensor, normalize: bool = False) -> Tensor:
        out = super().forward(pooled)
        return F.normalize(out, dim=-1) if normalize else out
