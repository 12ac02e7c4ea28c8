"""Language-model head: hidden states -> next-token logits over the vocabulary, no bias; its
weight is usually tied to the token embedding (the owner assigns it, as GPT-2 does).

Axis legend: B batch, N tokens, D width, V vocabulary.
"""

from __future__ import annotations

from torch import nn


class LMHead(nn.Linear):
    """(…, D) -> (…, V) logits."""

    def __init__(self, d_model: int, vocab_size: int, device=None, dtype=None) -> None:
        super().__init__(d_model, vocab_size, bias=False, device=device, dtype=dtype)
