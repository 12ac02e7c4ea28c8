"""The Conformer's convolution module (Gulati et al., 2020, Fig. 2): local mixing along time.

LayerNorm is the sublayer's own pre-norm (applied by the Block); this module is
pointwise conv (D -> 2C) -> GLU -> depthwise conv (kernel k, "same" padding) -> BatchNorm or
GroupNorm -> SiLU -> pointwise conv (C -> D) -> dropout.

Axis legend: B batch, N frames, D model width, C channels (= D).
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from unitok.layers.onednn_gemm import linear

ConvNorm = Literal["batchnorm", "groupnorm"]


class ConvModule(nn.Module):
    """Depthwise-separable convolution over frames; padded frames are zeroed before the
    depthwise conv when ``mask_padding`` so they cannot leak into real frames' outputs."""

    def __init__(self, d_model: int, kernel_size: int = 31, norm: ConvNorm = "batchnorm", bias: bool = True,
                 dropout: float = 0.0, mask_padding: bool = True) -> None:
        super().__init__()
        if kernel_size < 1 or kernel_size % 2 == 0:
            raise ValueError(f"the depthwise kernel must be odd for 'same' padding, got {kernel_size}")
        if norm not in ("batchnorm", "groupnorm"):
            raise ValueError(f"conv norm must be 'batchnorm' or 'groupnorm', got {norm!r}")
        self.pointwise_in = nn.Conv1d(d_model, 2 * d_model, 1, bias=bias)
        self.depthwise = nn.Conv1d(d_model, d_model, kernel_size, padding=(kernel_size - 1) // 2, groups=d_model,
                                   bias=bias)
        self.conv_norm = nn.BatchNorm1d(d_model) if norm == "batchnorm" else nn.GroupNorm(1, d_model)
        self.pointwise_out = nn.Conv1d(d_model, d_model, 1, bias=bias)
        self.drop = nn.Dropout(dropout)
        self.mask_padding = mask_padding

    def forward(self, x: Tensor, padding: Tensor | None = None) -> Tensor:  # (B, N, D) -> (B, N, D)
        # Channels-last throughout: frames stay (B, N, C) rows, the pointwise convs run as the
        # Linear layers they equal (through oneDNN where preferred: `unitok.layers.onednn_gemm`),
        # and the depthwise conv as a channels-last 2-D conv over a (B, C, 1, N) view — oneDNN's
        # depthwise kernel, ~2.6x the channels-first 1-D conv forward + backward on the CPU.
        # Weights stay Conv1d's (the same state dict).
        h = F.glu(linear(x, self.pointwise_in.weight.squeeze(-1), self.pointwise_in.bias), dim=-1)  # (B, N, C)
        if padding is not None and self.mask_padding:
            h = h.masked_fill(~padding[..., None], 0.0)
        h = h.transpose(1, 2).unsqueeze(2).contiguous(memory_format=torch.channels_last)  # (B, C, 1, N), no copy
        h = F.conv2d(h, self.depthwise.weight.unsqueeze(2), self.depthwise.bias,
                     padding=(0, self.depthwise.padding[0]), groups=self.depthwise.groups)
        h = h.squeeze(2)  # (B, C, N), channels-last strides
        if torch.compiler.is_compiling() and isinstance(self.conv_norm, nn.BatchNorm1d):
            # BatchNorm returns (B, C, N) contiguous whatever its input's strides, but a traced
            # graph predicts them kept (PyTorch 2.14's meta function) and views the transposed rows
            # below as if contiguous (a crash): a contiguous input makes prediction and kernel agree.
            h = h.contiguous()
        h = F.silu(self.conv_norm(h))  # (B, C, N)
        h = linear(h.transpose(1, 2), self.pointwise_out.weight.squeeze(-1), self.pointwise_out.bias)  # (B, N, D)
        return self.drop(h)
