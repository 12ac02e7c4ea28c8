"""ViT and DeiT: patch embedding + prefix tokens + positions -> bidirectional backbone -> head.

Axis legend: B batch, N patches, R prefix tokens (class, distillation, registers), D width,
K classes, h/w patch grid.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from tokenizers_mm import Tokens
from unitok.backbone import Backbone, BackboneConfig, init_weights
from unitok.checks import deferred_checks
from unitok.embed import PatchEmbedding, resample_grid_positions, sincos_2d_table
from unitok.layers.activations import Activation
from unitok.layers.attention import Kernel
from unitok.layers.norms import make_norm
from unitok.losses import cross_entropy
from unitok.models.vision import ImageConfig, ImageModel
from unitok.outputs import ImageClassifierOutput


@dataclass(frozen=True)
class ViTConfig(ImageConfig):
    """A Vision Transformer (Dosovitskiy et al., 2021), DeiT's distillation token included.

    Args:
        image fields: see `ImageConfig`; other image sizes divisible by the patch size work
            too (positions are resampled).
        d_model / n_layers / n_heads / d_ff / activation / norm_eps / bias / dropout: backbone.
        class_token / distill_token / num_registers: prefix tokens, in that order.
        positions: "learned", "sincos" (fixed 2-D) or "none".
        positions_cover_prefix: learned positions also cover the prefix tokens (original ViT
            and DeiT) rather than only the patches.
        pool: read the class token ("cls") or average the patch tokens ("avg").
        pre_norm: a norm before the backbone (CLIP's ln_pre).
        patch_bias: a bias in the patch embedding (CLIP's image towers have none).
        fc_norm: norm after pooling instead of at the end of the backbone (default: pool="avg").
    """

    d_model: int = 768
    n_layers: int = 12
    n_heads: int = 12
    d_ff: int | None = None
    activation: Activation = "gelu"
    norm_eps: float = 1e-6
    bias: bool = True
    dropout: float = 0.0
    class_token: bool = True
    distill_token: bool = False
    num_registers: int = 0
    positions: Literal["learned", "sincos", "none"] = "learned"
    positions_cover_prefix: bool = True
    pool: Literal["cls", "avg"] = "cls"
    pre_norm: bool = False
    fc_norm: bool | None = None
    patch_bias: bool = True

    presets = {
        "vit-tiny-patch16-224": dict(d_model=192, n_layers=12, n_heads=3),
        "vit-small-patch16-224": dict(d_model=384, n_layers=12, n_heads=6),
        "vit-base-patch16-224": dict(d_model=768, n_layers=12, n_heads=12),
        "vit-large-patch16-224": dict(d_model=1024, n_layers=24, n_heads=16),
        "deit-tiny-distilled-patch16-224": dict(d_model=192, n_layers=12, n_heads=3, distill_token=True),
        "deit-small-distilled-patch16-224": dict(d_model=384, n_layers=12, n_heads=6, distill_token=True),
        "deit-base-distilled-patch16-224": dict(d_model=768, n_layers=12, n_heads=12, distill_token=True),
        # CPU-sized: the built-in digits (8×8 scans upsampled to 32×32, one channel, 4×4 patches of 8×8).
        "vit-digits": dict(image_size=(32, 32), patch_size=8, channels=1, num_classes=10, d_model=64,
                           n_layers=4, n_heads=4, mean=(0.5,), std=(0.5,), crop_pct=None),
        "deit-digits": dict(image_size=(32, 32), patch_size=8, channels=1, num_classes=10, d_model=64,
                            n_layers=4, n_heads=4, mean=(0.5,), std=(0.5,), crop_pct=None, distill_token=True),
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_registers < 0:
            raise ValueError(f"num_registers must be ≥ 0, got {self.num_registers}")
        if self.pool == "cls" and not self.class_token:
            raise ValueError("pool='cls' needs class_token=True")
        if self.distill_token and not self.class_token:
            raise ValueError("a distillation token goes with a class token")
        self.backbone_config()

    @property
    def n_prefix(self) -> int:
        return int(self.class_token) + int(self.distill_token) + self.num_registers

    @property
    def use_fc_norm(self) -> bool:
        return self.pool == "avg" if self.fc_norm is None else self.fc_norm

    def backbone_config(self) -> BackboneConfig:
        return BackboneConfig(
            d_model=self.d_model, n_layers=self.n_layers, n_heads=self.n_heads, d_ff=self.d_ff,
            block=("attn", "mlp"), norm="layernorm", norm_position="pre", norm_eps=self.norm_eps,
            bias=self.bias, activation=self.activation, causal=False, dropout=self.dropout,
            attn_dropout=self.dropout, final_norm=not self.use_fc_norm,
        )


class ViT(ImageModel):
    """Vision Transformer on the shared backbone; DeiT is the same model with a distillation token."""

    config_class = ViTConfig

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        self.patch_embed = PatchEmbedding(c.channels, c.patch_size, c.d_model, bias=c.patch_bias)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, c.d_model)) if c.class_token else None
        self.dist_token = nn.Parameter(torch.zeros(1, 1, c.d_model)) if c.distill_token else None
        self.reg_tokens = nn.Parameter(torch.zeros(1, c.num_registers, c.d_model)) if c.num_registers else None
        h, w = self.grid
        if c.positions == "learned":
            n_pos = (c.n_prefix if c.positions_cover_prefix else 0) + h * w
            self.pos_embed = nn.Parameter(torch.randn(1, n_pos, c.d_model) * 0.02)
        else:
            self.pos_embed = None
        self.norm_pre = make_norm("layernorm", c.d_model, c.norm_eps) if c.pre_norm else None
        self.drop = nn.Dropout(c.dropout)
        self.backbone = Backbone(c.backbone_config())
        self.fc_norm = make_norm("layernorm", c.d_model, c.norm_eps) if c.use_fc_norm else None
        self.head = nn.Linear(c.d_model, c.num_classes) if c.num_classes else None
        self.head_dist = nn.Linear(c.d_model, c.num_classes) if c.num_classes and c.distill_token else None
        init_weights(self.backbone, std=0.02)
        for token in (self.cls_token, self.dist_token, self.reg_tokens):
            if token is not None:
                nn.init.normal_(token, std=1e-6 if token is self.cls_token else 0.02)
        # Patch embedding as a conv would be initialised (fan-in uniform), heads at zero bias.
        nn.init.uniform_(self.patch_embed.weight, -1 / math.sqrt(self.patch_embed.in_features),
                         1 / math.sqrt(self.patch_embed.in_features))
        for head in (self.head, self.head_dist):
            if head is not None:
                nn.init.normal_(head.weight, std=0.02)
                nn.init.zeros_(head.bias)

    def no_weight_decay(self) -> set[str]:
        """Parameters AdamW should not decay, as timm's ViT names them (``no_weight_decay``): the
        class, distillation and register tokens and the learned positions."""
        return {name for name in ("cls_token", "dist_token", "reg_tokens", "pos_embed") if getattr(self, name) is not None}

    # ------------------------------------------------------------------ positions
    def position_table(self, grid: tuple[int, int]) -> Tensor | None:
        """(1, n_pos, D) positions for a patch grid: the learned table resampled if the grid differs."""
        c = self.config
        if c.positions == "sincos":
            return sincos_2d_table(grid, c.d_model).to(self.patch_embed.weight)
        if self.pos_embed is None:
            return None
        n_prefix = c.n_prefix if c.positions_cover_prefix else 0
        return resample_grid_positions(self.pos_embed, self.grid, grid, n_prefix)

    def set_image_size(self, image_size: int | tuple[int, int]) -> None:
        """Resample the learned positions to a new configured size (e.g. after loading a
        checkpoint trained at another resolution); class/distillation entries are kept."""
        config = self.config.replace(image_size=image_size)
        if self.pos_embed is not None:
            self.pos_embed = nn.Parameter(self.position_table(config.grid).detach().clone())
        self.config = config

    # ------------------------------------------------------------------ forward
    def embed(self, pixel_values: Tensor | Tokens) -> tuple[Tensor, tuple[int, int]]:
        """Pixels or patch Tokens -> (B, R + N, D) backbone input and the patch grid."""
        x, grid = self._patches(pixel_values)  # (B, N, D)
        B = x.shape[0]
        prefix = [t.expand(B, -1, -1) for t in (self.cls_token, self.dist_token, self.reg_tokens) if t is not None]
        table = self.position_table(grid)
        if table is not None and not (self.config.positions_cover_prefix and self.config.positions == "learned"):
            x = x + table  # positions for the patches only; prefix tokens carry none
            table = None
        x = torch.cat([*prefix, x], dim=1) if prefix else x
        if table is not None:
            x = x + table
        x = self.drop(x)
        if self.norm_pre is not None:
            x = self.norm_pre(x)
        return x, grid

    @deferred_checks()  # on a GPU, input checks' verdicts are read as the forward ends: no host sync
    def forward(
        self,
        pixel_values: Tensor | Tokens,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        kernel: Kernel = "sdpa",
        labels: Tensor | None = None,
        class_tokens_only: bool = False,
    ) -> ImageClassifierOutput:
        """Normalised (B, C, H, W) pixels, or image `Tokens`, -> class logits.

        Any H×W divisible by the patch size works; positions are resampled (bicubic).
        ``class_tokens_only`` (class-token pooling): the last block computes the class (and
        distillation) tokens alone — the same logits for a layer's worth less work on the
        patches (`Backbone.forward`'s ``keep_last``); ``last_hidden_state`` then holds just
        those tokens (B, R, D). Training and the pipelines read the logits this way.
        ``labels`` (B,) class ids give ``loss``: the cross-entropy of ``logits`` (for DeiT in eval
        mode the averaged heads; in train mode the mean of both heads' cross-entropies, the
        no-teacher objective of `tasks`; distillation from a teacher lives in `tasks`).
        """
        if labels is not None and self.head is None:
            raise ValueError("labels given, but this model has no classification head (num_classes=0)")
        keep = None
        if class_tokens_only:
            if not self.reads_class_tokens:
                raise ValueError(f"class_tokens_only needs class-token pooling; this model pools with "
                                 f"{self.config.pool!r} (every patch token)")
            keep = self.config.n_prefix
        x, grid = self.embed(pixel_values)
        out = self.backbone(x, output_hidden_states=output_hidden_states,
                            output_attentions=output_attentions, kernel=kernel, keep_last=keep)
        h = out.last_hidden_state
        result = ImageClassifierOutput(logits=None, pooled=self.pool(h), last_hidden_state=h, grid=grid,
                                       hidden_states=out.hidden_states, attentions=out.attentions)
        if self.head is None:
            return result
        if self.head_dist is not None:
            # DeiT: a class head and a distillation head; at inference their average.
            result.logits_cls = self.head(h[:, 0])
            result.logits_dist = self.head_dist(h[:, 1])
            result.logits = (result.logits_cls + result.logits_dist) / 2
        else:
            result.logits = self.head(result.pooled)
        if labels is not None:
            if self.head_dist is not None and self.training:
                result.loss = (cross_entropy(result.logits_cls, labels)  # type: ignore[arg-type]
                               + cross_entropy(result.logits_dist, labels)) / 2  # type: ignore[arg-type]
            else:
                result.loss = cross_entropy(result.logits, labels)
        return result

    @property
    def reads_class_tokens(self) -> bool:
        """Whether the head reads only the prefix (class, distillation) tokens, so that
        ``class_tokens_only=True`` gives the same logits."""
        return self.config.pool == "cls" or self.head_dist is not None

    def pool(self, hidden: Tensor) -> Tensor:
        """(B, R + N, D) -> (B, D): the class token, or the mean of the patch tokens."""
        pooled = hidden[:, 0] if self.config.pool == "cls" else hidden[:, self.config.n_prefix :].mean(dim=1)
        if self.head_dist is not None:
            pooled = (hidden[:, 0] + hidden[:, 1]) / 2
        return self.fc_norm(pooled) if self.fc_norm is not None else pooled

    def reset_classifier(self, num_classes: int) -> None:
        """A new zero-initialised head (and distillation head) for ``num_classes`` classes; the
        processor's class names are dropped unless they still number one a class."""
        self.config = self.config.replace(num_classes=num_classes)
        d = self.config.d_model
        self.head = nn.Linear(d, num_classes) if num_classes else None
        self.head_dist = nn.Linear(d, num_classes) if num_classes and self.config.distill_token else None
        for head in (self.head, self.head_dist):
            if head is not None:
                nn.init.zeros_(head.weight)
                nn.init.zeros_(head.bias)
        self._drop_stale_class_names()


class DeiT(ViT):
    """Data-efficient image Transformer: a ViT with a distillation token and a second head
    (Touvron et al., 2021). Training losses (hard / soft distillation) live in `tasks`."""

    def __init__(self, config: ViTConfig) -> None:
        if not config.distill_token:
            raise ValueError("DeiT needs distill_token=True (use a deit-* preset, or ViT for plain models)")
        super().__init__(config)
