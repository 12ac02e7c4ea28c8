"""MLP-Mixer (Tolstikhin et al., 2021): the one backbone with ("token_mlp", "mlp") blocks.

Axis legend: B batch, N patches, D width, K classes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from tokenizers_mm import Tokens
from unitok.backbone import Backbone, BackboneConfig, init_weights
from unitok.checks import deferred_checks
from unitok.embed import PatchEmbedding
from unitok.layers.activations import Activation
from unitok.losses import cross_entropy
from unitok.models.vision import ImageConfig, ImageModel
from unitok.outputs import ImageClassifierOutput


@dataclass(frozen=True)
class MixerConfig(ImageConfig):
    """MLP-Mixer: patches mixed by a token MLP (across patches) and a channel MLP (per patch).

    The token MLP has one weight per patch position, so the image size is fixed:
    ``image_size`` / ``patch_size`` set the number of patches it mixes.
    """

    d_model: int = 512
    n_layers: int = 8
    token_mlp_dim: int = 256
    d_ff: int = 2048
    activation: Activation = "gelu"
    norm_eps: float = 1e-6
    dropout: float = 0.0
    mean: tuple[float, ...] = (0.5, 0.5, 0.5)  # timm's Mixer weights use 0.5 normalisation
    std: tuple[float, ...] = (0.5, 0.5, 0.5)

    presets = {
        "mixer-s16-224": dict(d_model=512, n_layers=8, token_mlp_dim=256, d_ff=2048),
        "mixer-b16-224": dict(d_model=768, n_layers=12, token_mlp_dim=384, d_ff=3072),
        "mixer-l16-224": dict(d_model=1024, n_layers=24, token_mlp_dim=512, d_ff=4096),
        "mixer-digits": dict(image_size=(32, 32), patch_size=8, channels=1, num_classes=10, d_model=64,
                             n_layers=4, token_mlp_dim=32, d_ff=256, mean=(0.5,), std=(0.5,), crop_pct=None),
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        self.backbone_config()

    @property
    def n_patches(self) -> int:
        return (self.image_size[0] // self.patch_size) * (self.image_size[1] // self.patch_size)

    def backbone_config(self) -> BackboneConfig:
        return BackboneConfig(
            d_model=self.d_model, n_layers=self.n_layers, n_heads=1, d_ff=self.d_ff,
            block=("token_mlp", "mlp"), norm="layernorm", norm_position="pre", norm_eps=self.norm_eps,
            activation=self.activation, dropout=self.dropout, final_norm=True,
            n_tokens=self.n_patches, token_mlp_dim=self.token_mlp_dim,
        )


class MLPMixer(ImageModel):
    """Patch embedding -> Mixer blocks -> mean over patches -> linear head."""

    config_class = MixerConfig

    def __init__(self, config: MixerConfig) -> None:
        super().__init__()
        self.config = config
        self.patch_embed = PatchEmbedding(config.channels, config.patch_size, config.d_model)
        self.drop = nn.Dropout(config.dropout)
        self.backbone = Backbone(config.backbone_config())
        self.head = nn.Linear(config.d_model, config.num_classes) if config.num_classes else None
        init_weights(self, std=0.02)

    @deferred_checks()  # on a GPU, input checks' verdicts are read as the forward ends: no host sync
    def forward(self, pixel_values: Tensor | Tokens, output_hidden_states: bool = False,
                labels: Tensor | None = None) -> ImageClassifierOutput:
        """Normalised (B, C, H, W) pixels, or image `Tokens`, -> class logits; ``labels`` (B,)
        class ids give ``loss``, the cross-entropy of the logits."""
        if labels is not None and self.head is None:
            raise ValueError("labels given, but this model has no classification head (num_classes=0)")
        x, grid = self._patches(pixel_values)  # (B, N, D)
        if tuple(grid) != self.config.grid:  # token mixing weighs each grid position: the layout matters, not the count
            H, W = self.config.image_size
            raise ValueError(
                f"MLP-Mixer mixes exactly a {self.config.grid[0]}×{self.config.grid[1]} grid of patches "
                f"({H}×{W} images); got {x.shape[1]} patches in a {grid[0]}×{grid[1]} grid; resize images to {H}×{W}"
            )
        out = self.backbone(self.drop(x), output_hidden_states=output_hidden_states)
        pooled = out.last_hidden_state.mean(dim=1)
        logits = self.head(pooled) if self.head is not None else None
        loss = cross_entropy(logits, labels) if logits is not None and labels is not None else None
        return ImageClassifierOutput(
            logits=logits, pooled=pooled, last_hidden_state=out.last_hidden_state, grid=grid,
            hidden_states=out.hidden_states, loss=loss,
        )

    def reset_classifier(self, num_classes: int) -> None:
        """A new zero-initialised head for ``num_classes`` classes; the processor's class names are
        dropped unless they still number one a class."""
        self.config = self.config.replace(num_classes=num_classes)
        self.head = nn.Linear(self.config.d_model, num_classes) if num_classes else None
        if self.head is not None:
            torch.nn.init.zeros_(self.head.weight)
            torch.nn.init.zeros_(self.head.bias)
        self._drop_stale_class_names()
