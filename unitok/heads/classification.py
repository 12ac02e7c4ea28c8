"""Heads over encoder states: the [CLS] pooler, sequence / token classification, extractive QA
spans and ELECTRA's replaced-token detector.

Axis legend: B batch, N tokens, D model width, K labels.
"""

from __future__ import annotations

from torch import Tensor, nn

from tokenizers_mm.checks import check_int
from unitok.layers.activations import Activation, make_activation


class Pooler(nn.Module):
    """BERT's pooler: dense + tanh on the first ([CLS]) token; (B, N, D) -> (B, D)."""

    def __init__(self, d_model: int, device=None, dtype=None) -> None:
        super().__init__()
        self.dense = nn.Linear(d_model, d_model, device=device, dtype=dtype)

    def forward(self, hidden: Tensor) -> Tensor:
        return self.dense(hidden[:, 0]).tanh()


class ClassificationHead(nn.Module):
    """Dropout + linear map to K scores; on pooled (B, D) or on every token (B, N, D).

    K = 1 is regression (one real number per input); the loss is the task's choice.
    """

    def __init__(self, d_model: int, num_labels: int, dropout: float = 0.1, device=None, dtype=None) -> None:
        super().__init__()
        check_int("num_labels", num_labels)
        self.drop = nn.Dropout(dropout)
        self.out = nn.Linear(d_model, num_labels, device=device, dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:  # (…, D) -> (…, K)
        if self.training and self.drop.p > 0:
            x = self.drop(x)
        return self.out(x)


class SpanHead(nn.Module):
    """Extractive QA: a start and an end score for every token; (B, N, D) -> 2 × (B, N)."""

    def __init__(self, d_model: int, device=None, dtype=None) -> None:
        super().__init__()
        self.out = nn.Linear(d_model, 2, device=device, dtype=dtype)

    def forward(self, hidden: Tensor) -> tuple[Tensor, Tensor]:
        start, end = self.out(hidden).unbind(-1)
        return start, end


class ReplacedTokenHead(nn.Module):
    """ELECTRA's discriminator head: dense + activation + one score per token, "was this token
    replaced by the generator?" (B, N, D) -> (B, N)."""

    def __init__(self, d_model: int, activation: Activation = "gelu", device=None, dtype=None) -> None:
        super().__init__()
        self.dense = nn.Linear(d_model, d_model, device=device, dtype=dtype)
        self.act = make_activation(activation)
        self.out = nn.Linear(d_model, 1, device=device, dtype=dtype)

    def forward(self, hidden: Tensor) -> Tensor:
        return self.out(self.act(self.dense(hidden))).squeeze(-1)
