"""Token embeddings: integer ids -> vectors, with the id range checked up front.

Axis legend: B batch, N tokens, D model width, V vocabulary.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from unitok.checks import defers, host_values, raise_if


class TokenEmbedding(nn.Embedding):
    """``nn.Embedding`` that names out-of-range ids instead of failing deep inside an index op."""

    def forward(self, ids: Tensor, check: bool = True) -> Tensor:  # (B, N) -> (B, N, D)
        """``check=False`` skips the range check, for ids the model produced itself (decoding)."""
        if ids.dtype not in (torch.int64, torch.int32):  # what the gather takes: not float, bool, uint8, int16
            raise TypeError(f"token ids must be integers (torch.long or torch.int32), got {ids.dtype}; "
                            "convert them with .long()")
        if check and ids.numel():
            V = self.num_embeddings
            values = host_values(ids)  # under torch.func.vmap: every sample's ids

            def fail() -> None:
                bad = values[(values < 0) | (values >= V)].unique()[:5].tolist()
                raise ValueError(f"token ids {bad} are outside the vocabulary [0, {V})")

            # on a GPU: the verdict is read as the scope ends, the gather reads clamped ids
            if defers(ids) and values is ids:
                safe = ids.clamp(0, V - 1)
                raise_if((safe != ids).any(), fail, deferred=True)
                return super().forward(safe)
            lo, hi = torch.aminmax(values)  # one reduction instead of min() and max()
            if int(lo) < 0 or int(hi) >= V:
                fail()
        return super().forward(ids)

