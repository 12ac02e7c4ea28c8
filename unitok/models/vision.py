"""What the image families share: input checks, patching, preprocessing stored with the model,
``predict`` on raw images."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from tokenizers_mm import ImagePreprocessConfig, PatchTokenizer, Tokens, patchify
from unitok.models.base import PretrainedModel


class ImageModel(PretrainedModel):
    """Base for ViT / DeiT / MLP-Mixer. The config carries ``image_size``, ``patch_size``,
    ``channels``, ``mean``, ``std``, ``interpolation`` and ``crop_pct``."""

    @property
    def grid(self) -> tuple[int, int]:
        """The patch grid of the configured image size."""
        H, W = self.config.image_size
        return H // self.config.patch_size, W // self.config.patch_size

    def preprocess_config(self, resize: bool = False) -> ImagePreprocessConfig:
        c = self.config
        return ImagePreprocessConfig(patch_size=c.patch_size, channels=c.channels, mean=tuple(c.mean),
                                     std=tuple(c.std), image_size=tuple(c.image_size), resize=resize,
                                     interpolation=c.interpolation, crop_pct=c.crop_pct if resize else None)

    def image_tokenizer(self, resize: bool = False) -> PatchTokenizer:
        """The `PatchTokenizer` that prepares raw images exactly as this model expects."""
        return PatchTokenizer(self.preprocess_config(resize))

    def _patches(self, pixel_values: Tensor | Tokens) -> tuple[Tensor, tuple[int, int]]:
        """Normalised (B, C, H, W) pixels or image `Tokens` -> (B, N, C·P·P) patches and grid."""
        c = self.config
        if isinstance(pixel_values, Tokens):
            if pixel_values.features is None or pixel_values.grid is None:
                raise ValueError("image models read image Tokens (patch features with a grid)")
            return pixel_values.features, pixel_values.grid
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
        return patchify(x, c.patch_size), (H // c.patch_size, W // c.patch_size)

    @torch.no_grad()
    def predict_proba(self, images: Any, resize: bool = False) -> Tensor:
        """Raw images (PIL, uint8 or [0, 1] float tensors) -> (B, K) class probabilities."""
        tokens = self.image_tokenizer(resize).encode(images)
        was_training = self.training
        self.eval()
        try:
            device = next(self.parameters()).device
            logits = self(tokens.to(device)).logits
        finally:
            self.train(was_training)
        if logits is None:
            raise ValueError("this model has no classification head (num_classes=0)")
        return logits.softmax(dim=-1)

    def predict(self, images: Any, resize: bool = False) -> Tensor:
        """Raw images -> (B,) predicted class indices. Any H×W divisible by the patch size."""
        return self.predict_proba(images, resize).argmax(dim=-1)
