"""Token embeddings: integer ids -> vectors, with the id range checked up front.

Axis legend: B batch, N tokens, D model width, V vocabulary.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from unitok.checks import checked_indices


class TokenEmbedding(nn.Embedding):
    """``nn.Embedding`` that names out-of-range ids instead of failing deep inside an index op."""

    def forward(self, ids: Tensor, check: bool = True) -> Tensor:  # (B, N) -> (B, N, D)
        """``check=False`` skips the range check, for ids the model produced itself (decoding)."""
        if check:
            ids = checked_indices(ids, self.num_embeddings, "token ids", f"the vocabulary [0, {self.num_embeddings})")
        elif ids.dtype not in (torch.int64, torch.int32):  # what the gather takes
            raise TypeError(f"token ids must be integers (torch.long or torch.int32), got {ids.dtype}; "
                            "convert them with .long()")
        return super().forward(ids)
