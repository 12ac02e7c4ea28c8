"""Position-wise feed-forward sublayer: D -> d_ff -> D.

Axis legend: B batch, N tokens, D model width, F hidden width (d_ff).
"""

from __future__ import annotations

from torch import Tensor, nn

from unitok.layers.activations import Activation, make_activation
from unitok.layers.fused_linear import linear


class MLP(nn.Module):
    """fc_in -> activation -> dropout -> fc_out (the Transformer's feed-forward network).

    ``gated=True``: act(fc_in(x)) · fc_gate(x) before fc_out (GLU variants, Shazeer 2020;
    T5 v1.1's gated-GELU).
    """

    def __init__(
        self, d_model: int, d_ff: int, activation: Activation = "gelu", bias: bool = True,
        dropout: float = 0.0, gated: bool = False, device=None, dtype=None,
    ) -> None:
        super().__init__()
        self.fc_in = nn.Linear(d_model, d_ff, bias=bias, device=device, dtype=dtype)
        self.fc_gate = nn.Linear(d_model, d_ff, bias=bias, device=device, dtype=dtype) if gated else None
        self.activation = activation
        self.act = make_activation(activation)
        self.drop = nn.Dropout(dropout)
        self.fc_out = nn.Linear(d_ff, d_model, bias=bias, device=device, dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:  # (B, N, D) -> (B, N, D)
        # `linear`: bias and activation fused into oneDNN's GEMM where nothing needs a gradient
        h = linear(x, self.fc_in, self.activation, self.act)
        if self.fc_gate is not None:
            h = h * linear(x, self.fc_gate)
        if self.training and self.drop.p > 0:
            h = self.drop(h)
        return linear(h, self.fc_out)
