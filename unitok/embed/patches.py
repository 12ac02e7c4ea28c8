"""Image patch embedding and 2-D position encodings (learned with resampling, or sin-cos).

Axis legend: B batch, N = h·w patches, F = C·P·P patch features, D width, h/w patch grid.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class PatchEmbedding(nn.Linear):
    """A Linear on flattened (C, P, P) patches: the same map as ViT's stride-P Conv2d."""

    def __init__(self, channels: int, patch_size: int, d_model: int, bias: bool = True) -> None:
        super().__init__(channels * patch_size * patch_size, d_model, bias=bias)
        self.channels, self.patch_size = channels, patch_size

    def forward(self, patches: Tensor) -> Tensor:  # (B, N, F) -> (B, N, D)
        if patches.shape[-1] != self.in_features:
            raise ValueError(
                f"patch features have width {patches.shape[-1]}, expected {self.in_features} "
                f"= {self.channels} channels × {self.patch_size}×{self.patch_size}"
            )
        return super().forward(patches)

    def embed_pixels(self, pixels: Tensor) -> Tensor:
        """(B, C, H, W) -> (B, h·w, D) without patchifying: the same weights applied as the
        stride-P convolution they equal (one strided conv instead of a patch copy and a GEMM)."""
        P = self.patch_size
        kernel = self.weight.view(self.out_features, self.channels, P, P)  # (D, C·P·P) is (D, C, P, P)
        return F.conv2d(pixels, kernel, self.bias, stride=P).flatten(2).transpose(1, 2)


def resample_grid_positions(
    table: Tensor, old_grid: tuple[int, int], new_grid: tuple[int, int], n_prefix: int = 0,
    mode: str = "bicubic", antialias: bool = True,
) -> Tensor:
    """Resize a (1, n_prefix + h·w, D) position table to a new patch grid.

    Prefix entries (class / distillation tokens) are kept as they are; the grid part is
    interpolated as a D-channel h×w image (bicubic with antialiasing, as timm does).
    """
    if tuple(old_grid) == tuple(new_grid):
        return table
    expected = n_prefix + old_grid[0] * old_grid[1]
    if table.shape[1] != expected:
        raise ValueError(f"position table has {table.shape[1]} entries, expected {expected} for grid {old_grid}")
    prefix, grid = table[:, :n_prefix], table[:, n_prefix:]
    D = table.shape[-1]
    grid = grid.float().reshape(1, old_grid[0], old_grid[1], D).permute(0, 3, 1, 2)  # (1, D, h, w)
    grid = F.interpolate(grid, size=tuple(new_grid), mode=mode, antialias=antialias, align_corners=False)
    grid = grid.permute(0, 2, 3, 1).reshape(1, -1, D).to(table.dtype)
    return torch.cat([prefix, grid], dim=1)


def sincos_2d_table(grid: tuple[int, int], d_model: int, temperature: float = 10000.0) -> Tensor:
    """(1, h·w, D) fixed 2-D sin-cos positions: a quarter of the channels each for sin/cos of
    the row and of the column index (MoCo v3 / "simple ViT"). Cached per shape, so a forward
    does not rebuild it: add it, never write into it."""
    # built outside inference_mode (a first call may come from validation), so training can use it
    with torch.inference_mode(False), torch.no_grad():
        return _sincos_2d_table((int(grid[0]), int(grid[1])), int(d_model), float(temperature))


@functools.lru_cache(maxsize=32)
def _sincos_2d_table(grid: tuple[int, int], d_model: int, temperature: float) -> Tensor:
    if d_model % 4:
        raise ValueError(f"2-D sin-cos positions need d_model divisible by 4, got {d_model}")
    h, w = grid
    rows, cols = torch.meshgrid(torch.arange(h, dtype=torch.float64), torch.arange(w, dtype=torch.float64),
                                indexing="ij")
    quarter = d_model // 4
    omega = 1.0 / temperature ** (torch.arange(quarter, dtype=torch.float64) / quarter)
    out_r = rows.flatten()[:, None] * omega[None]
    out_c = cols.flatten()[:, None] * omega[None]
    table = torch.cat([out_c.sin(), out_c.cos(), out_r.sin(), out_r.cos()], dim=1)
    return table.float()[None]
