"""Reading one vector per sequence from token states: the first (class) token, the mean of the
real tokens, or the last real token (the end-of-text token of a causal text segment).

Axis legend: B batch, N tokens, D width.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

Pooling = Literal["cls", "mean", "last"]


def pool_tokens(hidden: Tensor, mask: Tensor | None, how: Pooling) -> Tensor:
    """(B, N, D) states and (B, N) mask (True/1: real) -> (B, D). "cls" reads each row's first
    real token: left padding moves a text segment's [CLS] from position 0."""
    if how == "cls":
        if mask is None:
            return hidden[:, 0]
        first = mask.bool().long().argmax(dim=1)  # the first real position (0 for right padding)
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), first]
    if mask is None:
        return hidden.mean(dim=1) if how == "mean" else hidden[:, -1]
    real = mask.bool()
    if how == "mean":
        weights = real.to(hidden.dtype)[..., None]
        return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)
    if how == "last":
        # the highest real position of each row (right padding: length − 1; left padding: N − 1)
        last = (real.long() * torch.arange(1, real.shape[1] + 1, device=real.device)).argmax(dim=1)
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
    raise ValueError(f"pooling must be 'cls', 'mean' or 'last', got {how!r}")
