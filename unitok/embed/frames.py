"""Spectrogram frames -> model vectors: the convolutional subsampling front end of speech models.

Two 3×3 stride-2 convolutions over (time, mel) with ReLU shorten the sequence ×4 (and the mel
axis likewise), then a linear layer maps channels × remaining mels to D — the front end of
ESPnet / NeMo Conformers. Attention over 10 ms frames would be 4× longer and 16× costlier.

Axis legend: B batch, N frames, F mel bins, C channels, D model width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def subsampled_length(lengths: Tensor, layers: int = 2) -> Tensor:
    """Frames left after ``layers`` 3×3 stride-2 convolutions without padding: ⌊(n − 1) / 2⌋ each."""
    for _ in range(layers):
        lengths = torch.div(lengths - 1, 2, rounding_mode="floor")
    return lengths


class ConvSubsampling(nn.Module):
    """(B, N, F) frames -> (B, N', D) with N' = ⌊(⌊(N − 1)/2⌋ − 1)/2⌋."""

    def __init__(self, n_mels: int, d_model: int, channels: int | None = None) -> None:
        super().__init__()
        channels = channels or d_model
        if n_mels < 7:
            raise ValueError(f"×4 subsampling needs at least 7 mel bins, got {n_mels}")
        self.conv1 = nn.Conv2d(1, channels, 3, stride=2)
        self.conv2 = nn.Conv2d(channels, channels, 3, stride=2)
        self.proj = nn.Linear(channels * int(subsampled_length(torch.tensor(n_mels))), d_model)
        self.n_mels = n_mels

    def forward(self, frames: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        if frames.shape[-1] != self.n_mels:
            raise ValueError(f"expected {self.n_mels} mel bins per frame, got {frames.shape[-1]}")
        short = (lengths < 7).nonzero().flatten().tolist()
        if short:  # the two stride-2 convolutions (kernel 3) leave such an utterance no frame
            raise ValueError(f"rows {short} have {lengths[short].tolist()} frames, too short for the ×4 "
                             "subsampling (it needs at least 7 frames, 70 ms)")
        x = F.relu(self.conv2(F.relu(self.conv1(frames[:, None]))))  # (B, C, N', F')
        B, C, N, Fr = x.shape
        return self.proj(x.permute(0, 2, 1, 3).reshape(B, N, C * Fr)), subsampled_length(lengths)
