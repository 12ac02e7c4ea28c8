"""CTC head: per-frame scores over the blank (id 0) and the output characters (Graves et al., 2006).

Axis legend: B batch, N frames, D width, V = 1 + characters.
"""

from __future__ import annotations

from torch import nn


class CTCHead(nn.Linear):
    """(B, N, D) -> (B, N, V) logits; decode with `unitok.ctc`, train with a CTC loss (``tasks``)."""

    def __init__(self, d_model: int, vocab_size: int, device=None, dtype=None) -> None:
        if vocab_size < 2:
            raise ValueError(f"a CTC head needs the blank and at least one character, got vocab_size={vocab_size}")
        super().__init__(d_model, vocab_size, device=device, dtype=dtype)
