"""Token embeddings: integer ids -> vectors, with the id range checked up front.

Axis legend: B batch, N tokens, D model width, V vocabulary.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class TokenEmbedding(nn.Embedding):
    """``nn.Embedding`` that names out-of-range ids instead of failing deep inside an index op."""

    def forward(self, ids: Tensor) -> Tensor:  # (B, N) -> (B, N, D)
        if ids.dtype.is_floating_point:
            raise TypeError(f"token ids must be integers, got {ids.dtype}")
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.num_embeddings):
            bad = ids[(ids < 0) | (ids >= self.num_embeddings)].unique()[:5].tolist()
            raise ValueError(f"token ids {bad} are outside the vocabulary [0, {self.num_embeddings})")
        return super().forward(ids)


def init_embedding(module: nn.Embedding, std: float = 0.02) -> None:
    with torch.no_grad():
        module.weight.normal_(0.0, std)
