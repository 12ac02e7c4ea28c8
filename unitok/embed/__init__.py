"""Learned embedders that turn `Tokens` into (B, N, D) vectors, and position encodings."""

from unitok.embed.positions import (
    LearnedPositions,
    SinusoidalPositions,
    make_positions,
    sinusoidal_table,
)
from unitok.embed.tokens import TokenEmbedding

__all__ = ["LearnedPositions", "SinusoidalPositions", "TokenEmbedding", "make_positions", "sinusoidal_table"]
