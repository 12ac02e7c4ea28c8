"""Position encodings: learned tables and the fixed sinusoids of "Attention Is All You Need".

Axis legend: B batch, N tokens, D model width.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from unitok.checks import checked_indices


def sinusoidal_table(n_positions: int, d_model: int) -> Tensor:
    """(P, D) table with PE[p, 2i] = sin(p / 10000^(2i/D)) and PE[p, 2i+1] = cos(p / 10000^(2i/D))."""
    if d_model % 2:
        raise ValueError(f"sinusoidal positions need an even d_model, got {d_model}")
    position = torch.arange(n_positions, dtype=torch.float64)[:, None]
    inv_freq = torch.exp(-math.log(10000.0) * torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    table = torch.zeros(n_positions, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(position * inv_freq)
    table[:, 1::2] = torch.cos(position * inv_freq)
    return table.float()


def checked_positions(positions: Tensor, n_positions: int) -> Tensor:
    """``positions`` as a table of ``n_positions`` rows may be indexed by them (`checked_indices`:
    an error naming the ids outside 0..n_positions-1; clamped while a GPU's verdict is deferred)."""
    return checked_indices(positions, n_positions, "position ids", f"0..{n_positions - 1} (the model's positions)")


class LearnedPositions(nn.Module):
    """A trainable (P, D) table indexed by position id (GPT-2's ``wpe``, BERT's position embeddings)."""

    def __init__(self, n_positions: int, d_model: int, device=None, dtype=None) -> None:
        super().__init__()
        self.n_positions = n_positions
        self.weight = nn.Parameter(torch.empty(n_positions, d_model, device=device, dtype=dtype))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, positions: Tensor, check: bool = True) -> Tensor:  # (B, N) -> (B, N, D)
        """``check=False`` skips the range check, for positions the caller counted itself."""
        return nn.functional.embedding(checked_positions(positions, self.n_positions) if check else positions,
                                       self.weight)

    def span(self, start: int, length: int) -> Tensor:
        """(length, D) encodings of positions start … start+length-1 (no index tensor needed)."""
        return self.weight.narrow(0, start, length)


class SinusoidalPositions(nn.Module):
    """Fixed sinusoidal encodings; a buffer, so nothing to learn and nothing in the checkpoint."""

    def __init__(self, n_positions: int, d_model: int) -> None:
        super().__init__()
        self.n_positions = n_positions
        self.register_buffer("table", sinusoidal_table(n_positions, d_model), persistent=False)

    def forward(self, positions: Tensor, check: bool = True) -> Tensor:  # (B, N) -> (B, N, D)
        """``check=False`` skips the range check, for positions the caller counted itself."""
        return nn.functional.embedding(checked_positions(positions, self.n_positions) if check else positions,
                                       self.table)

    def span(self, start: int, length: int) -> Tensor:
        """(length, D) encodings of positions start … start+length-1."""
        return self.table.narrow(0, start, length)


def positions_from_mask(attention_mask: Tensor) -> Tensor:
    """(B, T) 1/0 mask -> (B, T) position ids counted from each row's first real token (left
    padding shifts nothing); padding positions get 0. Whatever the mask holds, they lie in
    0..T-1 (any nonzero counts as real, as attention reads it): a mask of other values than 1 and
    0 is refused by the backbone it goes to, not by a position table indexed past its end first."""
    real = attention_mask != 0
    return real.cumsum(-1).sub_(1).mul_(real)  # a bool cumsum counts in long; times real: 0 at padding


def make_positions(kind: str, n_positions: int, d_model: int) -> nn.Module | None:
    """Position encoding named by a config field ('learned', 'sinusoidal' or 'none')."""
    if kind == "learned":
        return LearnedPositions(n_positions, d_model)
    if kind == "sinusoidal":
        return SinusoidalPositions(n_positions, d_model)
    if kind == "none":
        return None
    raise ValueError(f"unknown position encoding {kind!r}; expected 'learned', 'sinusoidal' or 'none'")
