"""Token embeddings: integer ids -> vectors, with the id range checked up front.

Axis legend: B batch, N tokens, D model width, V vocabulary.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class TokenEmbedding(nn.Embedding):
    """``nn.Embedding`` that names out-of-range ids instead of failing deep inside an index op."""

    def forward(self, ids: Tensor, check: bool = True) -> Tensor:  # (B, N) -> (B, N, D)
        """``check=False`` skips the range check, for ids the model produced itself (decoding)."""
        if ids.dtype.is_floating_point:
            raise TypeError(f"token ids must be integers, got {ids.dtype}")
        if check and ids.numel():
            lo, hi = torch.aminmax(ids)  # one reduction instead of min() and max()
            if int(lo) < 0 or int(hi) >= self.num_embeddings:
                bad = ids[(ids < 0) | (ids >= self.num_embeddings)].unique()[:5].tolist()
                raise ValueError(f"token ids {bad} are outside the vocabulary [0, {self.num_embeddings})")
        return super().forward(ids)

