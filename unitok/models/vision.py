"""What the image families share: input checks, patching, preprocessing stored with the model,
``predict`` on raw images."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

import torch
from torch import Tensor

from tokenizers_mm import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    ImagePreprocessConfig,
    PatchTokenizer,
    Processor,
    Tokens,
)
from unitok.checks import check_dtype, check_finite
from unitok.config import Config
from unitok.models.base import PretrainedModel


@dataclass(frozen=True)
class ImageConfig(Config):
    """Input and label fields every image family shares (preprocessing travels with the model).

    Args:
        image_size: (H, W) the model is configured for. patch_size: P. channels: C.
        num_classes: K (0: no head). mean / std / interpolation / crop_pct: how raw images
            are prepared (`ImageModel.image_tokenizer`).
    """

    image_size: tuple[int, int] = (224, 224)
    patch_size: int = 16
    channels: int = 3
    num_classes: int = 1000
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD
    interpolation: Literal["bicubic", "bilinear", "nearest"] = "bicubic"
    crop_pct: float | None = 0.875

    def __post_init__(self) -> None:
        if isinstance(self.image_size, int):  # a square size given as one number
            object.__setattr__(self, "image_size", (self.image_size, self.image_size))
        for name in ("image_size", "mean", "std"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        H, W = self.image_size
        if self.patch_size < 1 or H % self.patch_size or W % self.patch_size:
            raise ValueError(f"image_size {H}×{W} is not divisible by patch_size {self.patch_size}")
        if self.num_classes < 0:
            raise ValueError(f"num_classes must be ≥ 0, got {self.num_classes}")
        self.preprocess_config()  # validates mean/std against channels

    @property
    def grid(self) -> tuple[int, int]:
        return self.image_size[0] // self.patch_size, self.image_size[1] // self.patch_size

    def preprocess_config(self, resize: bool = False) -> ImagePreprocessConfig:
        """How raw images are prepared; ``interpolation`` and ``crop_pct`` are carried either way (they
        act only with ``resize``), so a processor saved without it resizes as the model does when
        asked (``model.processor(image, resize=True)``)."""
        return ImagePreprocessConfig(
            patch_size=self.patch_size, channels=self.channels, mean=self.mean, std=self.std,
            image_size=self.image_size, resize=resize, interpolation=self.interpolation, crop_pct=self.crop_pct,
        )


class ImageModel(PretrainedModel):
    """Base for ViT / DeiT / MLP-Mixer, whose configs are `ImageConfig`s."""

    config: ImageConfig

    @property
    def grid(self) -> tuple[int, int]:
        """The patch grid of the configured image size."""
        return self.config.grid

    def default_processor(self) -> Processor:
        """Images as the config says: size, patch size and normalisation (no resizing unless asked)."""
        return Processor(image=self.config.preprocess_config())

    def class_count(self) -> int | None:
        return self.config.num_classes or None

    def image_tokenizer(self, resize: bool = False) -> PatchTokenizer:
        """The `PatchTokenizer` that prepares raw images exactly as this model expects
        (``resize=True``: resize / centre-crop to the configured size first)."""
        return PatchTokenizer(self.config.preprocess_config(resize))

    def _patches(self, pixel_values: Tensor | Tokens) -> tuple[Tensor, tuple[int, int]]:
        """Normalised (B, C, H, W) pixels or image `Tokens` -> (B, N, D) patch embeddings and grid.

        Pixels go through ``patch_embed`` as the strided convolution it equals (no patch copy);
        patch `Tokens` through it as the Linear on their features."""
        c = self.config
        if isinstance(pixel_values, Tokens):
            if pixel_values.features is None or pixel_values.grid is None:
                raise ValueError("image models read image Tokens (patch features with a grid)")
            grid, n = tuple(pixel_values.grid), pixel_values.features.shape[1]
            if grid[0] * grid[1] != n:  # positions are laid out by the grid: they would not add up
                raise ValueError(f"image Tokens hold {n} patches but their grid {grid[0]}×{grid[1]} has "
                                 f"{grid[0] * grid[1]}")
            check_dtype(pixel_values.features, self.patch_embed.weight, "patch features")
            check_finite(pixel_values.features, "patch features")
            return self.patch_embed(pixel_values.features), grid
        x = pixel_values
        if not isinstance(x, Tensor) or x.dim() != 4:
            shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"pixel_values must be a (batch, channels, height, width) tensor, got {shape}")
        if not x.dtype.is_floating_point:
            raise TypeError(
                f"pixel_values must be normalised floats, got {x.dtype}; use model.predict(images) "
                "or model.image_tokenizer() for raw images"
            )
        if x.shape[1] != c.channels:
            raise ValueError(f"expected {c.channels} channels, got {x.shape[1]} in shape {tuple(x.shape)}")
        H, W = x.shape[-2:]
        if H % c.patch_size or W % c.patch_size:
            raise ValueError(f"image size {H}×{W} is not divisible by the patch size {c.patch_size}")
        check_dtype(x, self.patch_embed.weight, "pixel_values")
        check_finite(x, "pixel_values")
        return self.patch_embed.embed_pixels(x), (H // c.patch_size, W // c.patch_size)

    @torch.no_grad()
    def predict_proba(self, images: Any, resize: bool = False) -> Tensor:
        """Raw images (PIL, uint8 or [0, 1] float tensors) -> (B, K) class probabilities."""
        tokens = self.image_tokenizer(resize).encode(images)
        was_training = self.training
        self.eval()
        try:
            param = next(self.parameters())
            tokens = replace(tokens, features=tokens.features.to(param.device, param.dtype))
            logits = self(tokens).logits
        finally:
            self.train(was_training)
        if logits is None:
            raise ValueError("this model has no classification head (num_classes=0)")
        return logits.softmax(dim=-1)

    def predict(self, images: Any, resize: bool = False) -> Tensor:
        """Raw images -> (B,) predicted class indices. Any H×W divisible by the patch size."""
        return self.predict_proba(images, resize).argmax(dim=-1)


