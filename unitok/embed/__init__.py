"""Learned embedders that turn `Tokens` into (B, N, D) vectors, and position encodings."""

from unitok.embed.patches import PatchEmbedding, resample_grid_positions, sincos_2d_table
from unitok.embed.positions import (
    LearnedPositions,
    SinusoidalPositions,
    make_positions,
    positions_from_mask,
    sinusoidal_table,
)
from unitok.embed.relative import RelativePositionBias, relative_position_bucket
from unitok.embed.tokens import TokenEmbedding

__all__ = [
    "LearnedPositions", "PatchEmbedding", "RelativePositionBias", "SinusoidalPositions", "TokenEmbedding", "make_positions",
    "positions_from_mask", "relative_position_bucket", "resample_grid_positions", "sincos_2d_table", "sinusoidal_table",
]
