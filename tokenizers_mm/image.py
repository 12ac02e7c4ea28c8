"""Images -> normalised P×P patches (the ViT "16×16 words"), and back.

Axis legend: B batch, C channels, H/W pixel height/width, P patch size,
h/w patch-grid rows/columns (H/P, W/P), N = h·w patches, F = C·P·P features per patch.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from tokenizers_mm.checks import check_int, check_number
from tokenizers_mm.tokens import Tokens

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
Interpolation = Literal["bicubic", "bilinear", "nearest"]
INTERPOLATIONS: tuple[str, ...] = get_args(Interpolation)


# the file types read as images (by folder scans and by a processor told a path)
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm")


def patchify(pixels: Tensor, patch_size: int) -> Tensor:
    """(B, C, H, W) -> (B, h·w, C·P·P), patches in row-major grid order.

    Each patch is flattened channel-first (C, P, P) — the order of a Conv2d kernel, so a Linear
    on these features with the kernel reshaped to (D, C·P·P) is that Conv2d with stride P.
    """
    B, C, H, W = pixels.shape
    P = patch_size
    if H % P or W % P:
        raise ValueError(f"image size {H}×{W} is not divisible by the patch size {P}")
    x = pixels.reshape(B, C, H // P, P, W // P, P)  # (B, C, h, P, w, P)
    return x.permute(0, 2, 4, 1, 3, 5).reshape(B, (H // P) * (W // P), C * P * P)


def unpatchify(patches: Tensor, grid: tuple[int, int], patch_size: int, channels: int) -> Tensor:
    """(B, h·w, C·P·P) -> (B, C, h·P, w·P): the exact inverse of `patchify`."""
    B, N, Fdim = patches.shape
    h, w = grid
    P = patch_size
    if N != h * w or Fdim != channels * P * P:
        raise ValueError(
            f"patches of shape {tuple(patches.shape)} do not fit grid {grid} × ({channels}·{P}·{P}) features"
        )
    x = patches.reshape(B, h, w, channels, P, P).permute(0, 3, 1, 4, 2, 5)  # (B, C, h, P, w, P)
    return x.reshape(B, channels, h * P, w * P)


@dataclass(frozen=True)
class ImagePreprocessConfig:
    """How raw images become model input; stored with a model so inference matches training.

    Every field is checked as the config is built (a float patch size, a NaN mean or an unknown
    filter is refused there, naming it, not met later inside a resize or a reshape); lists are
    stored as tuples, so a config read from JSON equals the one written.

    Args:
        patch_size: P. channels: C the model expects.
        mean / std: per-channel normalisation of [0, 1] pixels (finite; std > 0).
        image_size: (H, W) to resize to (only used when ``resize`` is set); one integer is a
            square, as timm's ``img_size`` reads it.
        resize: resize every image to ``image_size`` (else sizes must divide by P).
        interpolation: resize filter. crop_pct: resize the shorter side to image_size /
            crop_pct, the aspect ratio kept, then centre-crop image_size (the timm evaluation
            recipe); None: plain resize to image_size. Both act only when ``resize`` is set.
        pad: zero-pad (after normalisation) up to the next multiple of P instead of failing.
    """

    patch_size: int = 16
    channels: int = 3
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD
    image_size: tuple[int, int] | None = None
    resize: bool = False
    interpolation: Interpolation = "bicubic"
    crop_pct: float | None = None
    pad: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "patch_size", check_int("patch_size", self.patch_size))
        channels = check_int("channels", self.channels)
        object.__setattr__(self, "channels", channels)
        object.__setattr__(self, "mean", _per_channel("mean", self.mean, channels))
        object.__setattr__(self, "std", _per_channel("std", self.std, channels, positive=True))
        if self.image_size is not None:
            object.__setattr__(self, "image_size", _image_size(self.image_size))
        for name in ("resize", "pad"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.resize and self.image_size is None:
            raise ValueError("resize=True needs image_size=(height, width)")
        if self.interpolation not in INTERPOLATIONS:
            raise ValueError(f"interpolation must be one of {', '.join(map(repr, INTERPOLATIONS))}, "
                             f"got {self.interpolation!r}")
        if self.crop_pct is not None:
            object.__setattr__(self, "crop_pct", check_number("crop_pct", self.crop_pct, 0, 1, low_open=True))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _per_channel(name: str, values: Any, channels: int, positive: bool = False) -> tuple[float, ...]:
    """``mean`` / ``std`` as a tuple of one finite float a channel (``positive``: each > 0)."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise ValueError(f"{name} must be a list of {channels} numbers (one per channel), got {values!r}")
    if len(values) != channels:
        raise ValueError(f"{name} needs {channels} values (one per channel), got {tuple(values)}")
    low = 0 if positive else -math.inf
    return tuple(check_number(f"{name}[{i}]", v, low, low_open=positive) for i, v in enumerate(values))


def _image_size(size: Any) -> tuple[int, int]:
    """``image_size`` as (H, W) of positive integers; one integer is a square (timm's ``img_size``)."""
    if not isinstance(size, bool) and isinstance(size, numbers.Integral):
        size = (size, size)
    if isinstance(size, (str, bytes)) or not hasattr(size, "__len__") or len(size) != 2:
        raise ValueError(f"image_size must be (height, width) (or one integer: a square), got {size!r}")
    return check_int("image_size[0] (height)", size[0]), check_int("image_size[1] (width)", size[1])


def torch_interpolation(mode: str) -> str:
    """``F.interpolate``'s name for a filter as PIL (and timm's transforms) apply it: torch's
    "nearest" picks pixels by a floor rule of its own, "nearest-exact" by PIL's pixel centres."""
    return "nearest-exact" if mode == "nearest" else mode


def _scaled_keeping_ratio(size: tuple[int, int], target: tuple[int, int], crop_pct: float) -> tuple[int, int]:
    """The (h, w) an image of ``size`` is resized to before timm's evaluation centre crop of
    ``target``: its shorter side to target / crop_pct, the aspect ratio kept (timm's "center"
    crop mode: torchvision's ``Resize(int)`` for a square target, ``ResizeKeepRatio`` else)."""
    (h, w), (H, W) = size, target
    scale = (math.floor(H / crop_pct), math.floor(W / crop_pct))
    if scale[0] == scale[1]:
        short, long = (h, w) if h <= w else (w, h)
        new_short, new_long = scale[0], int(scale[0] * long / short)
        return (new_short, new_long) if h <= w else (new_long, new_short)
    ratio = min(h / scale[0], w / scale[1])
    return round(h / ratio), round(w / ratio)


class PatchTokenizer:
    """Images (file paths, PIL, uint8 or float tensors/arrays, single or batched) -> `Tokens` of patches.

    uint8 input is scaled from [0, 255], 16-bit PIL images from [0, 65535]; float input (and
    "F" PIL images) must already be in [0, 1]. Nothing is resized or padded unless the config
    says so: a size that does not divide by P is an error.
    """

    def __init__(self, config: ImagePreprocessConfig | None = None, **options: Any) -> None:
        if config is not None and options:
            raise ValueError("give either an ImagePreprocessConfig or keyword options, not both")
        if config is None:
            config = ImagePreprocessConfig(**options)
        self.config = config

    @property
    def patch_size(self) -> int:
        return self.config.patch_size

    # ------------------------------------------------------------------ pixels
    def to_tensor(self, images: Any) -> Tensor:
        """Any supported image input -> float (B, C, H, W) in [0, 1] (not yet normalised)."""
        if isinstance(images, (list, tuple)):
            if not images:
                raise ValueError("got an empty list of images")
            tensors = [self.to_tensor(im) for im in images]
            shapes = {tuple(t.shape[1:]) for t in tensors}
            if len(shapes) > 1 and not self.config.resize:
                raise ValueError(f"images of different sizes {sorted(shapes)} need resize=True to batch")
            if len(shapes) > 1:
                tensors = [self._resize(t) for t in tensors]
            return torch.cat(tensors)
        if isinstance(images, (str, Path)):
            images = open_image(images, self.config.channels)
        if _is_pil(images):
            images = _pil_to_tensor(images, self.config.channels)
        elif isinstance(images, np.ndarray):
            images = torch.from_numpy(np.ascontiguousarray(images))  # views like bgr[::-1] have negative strides
        if not isinstance(images, Tensor):
            raise TypeError(f"unsupported image type {type(images).__name__}; give PIL images, image file paths, tensors or arrays")
        if images.dim() == 3:
            images = images[None]
        if images.dim() != 4:
            raise ValueError(f"images must be (C, H, W) or (B, C, H, W), got shape {tuple(images.shape)}")
        if images.shape[1] != self.config.channels:
            raise ValueError(
                f"expected {self.config.channels} channels (B, C, H, W), got {images.shape[1]} "
                f"in shape {tuple(images.shape)}"
            )
        if images.numel() == 0:
            raise ValueError(f"images must not be empty (B, C, H, W all ≥ 1), got shape {tuple(images.shape)}")
        if images.dtype == torch.uint8:
            return images.float() / 255.0
        if not images.dtype.is_floating_point:
            raise TypeError(f"images must be uint8 or float, got {images.dtype}")
        if torch.isnan(images).any():
            raise ValueError("images contain NaN")
        low, high = float(images.min()), float(images.max())
        if low < 0.0 or high > 1.0:
            raise ValueError(
                f"float images must be in [0, 1], got values in [{low:.3g}, {high:.3g}]; "
                "scale them (or pass uint8)"
            )
        return images.float()

    def _resize(self, pixels: Tensor) -> Tensor:
        H, W = self.config.image_size  # type: ignore[misc]
        mode = torch_interpolation(self.config.interpolation)
        kwargs = {"antialias": True} if mode in ("bicubic", "bilinear") else {}
        if self.config.crop_pct is not None:
            big = _scaled_keeping_ratio(tuple(pixels.shape[-2:]), (H, W), self.config.crop_pct)
            pixels = F.interpolate(pixels, size=big, mode=mode, **kwargs)
            top, left = int(round((big[0] - H) / 2)), int(round((big[1] - W) / 2))  # torchvision's CenterCrop
            return pixels[..., top : top + H, left : left + W].clamp(0, 1)
        return F.interpolate(pixels, size=(H, W), mode=mode, **kwargs).clamp(0, 1)

    def preprocess(self, images: Any) -> Tensor:
        """Images -> normalised float (B, C, H, W), resized/padded only when configured."""
        if self.config.resize and isinstance(images, (list, tuple)) and images:
            # each image resized on its own, as it would be alone (not resized twice to batch)
            pixels = torch.cat([self._resize(self.to_tensor(image)) for image in images])
        else:
            pixels = self.to_tensor(images)
            if self.config.resize:
                pixels = self._resize(pixels)
        mean = torch.tensor(self.config.mean).view(1, -1, 1, 1)
        std = torch.tensor(self.config.std).view(1, -1, 1, 1)
        pixels = (pixels - mean) / std
        P = self.patch_size
        H, W = pixels.shape[-2:]
        if H % P or W % P:
            if not self.config.pad:
                raise ValueError(
                    f"image size {H}×{W} is not divisible by the patch size {P}; "
                    "configure resize=True with image_size, or pad=True"
                )
            pixels = F.pad(pixels, (0, (-W) % P, 0, (-H) % P))
        return pixels

    # ------------------------------------------------------------------ tokens
    def encode(self, images: Any) -> Tokens:
        """Images -> `Tokens` with (B, N, C·P·P) patch features and the patch grid."""
        pixels = self.preprocess(images)
        H, W = pixels.shape[-2:]
        features = patchify(pixels, self.patch_size)
        mask = torch.ones(features.shape[:2], dtype=torch.long)
        return Tokens(features=features, attention_mask=mask, modality="image",
                      grid=(H // self.patch_size, W // self.patch_size))

    def decode(self, tokens: Tokens, denormalize: bool = True) -> Tensor:
        """`Tokens` of patches -> (B, C, H, W) pixels (in [0, 1] when ``denormalize``)."""
        if tokens.features is None or tokens.grid is None:
            raise ValueError("decode needs image Tokens with features and a grid")
        pixels = unpatchify(tokens.features, tokens.grid, self.patch_size, self.config.channels)
        if denormalize:
            mean = torch.tensor(self.config.mean).view(1, -1, 1, 1)
            std = torch.tensor(self.config.std).view(1, -1, 1, 1)
            pixels = pixels * std + mean
        return pixels

    def __call__(self, images: Any) -> Tokens:
        return self.encode(images)


def open_image(path: str | Path, channels: int = 3) -> Any:
    """An image file -> a PIL image in RGB (3 channels) or greyscale (1), fully read; 16-bit and
    float greyscale stay as they are (converting them goes through 8 bits), for `to_tensor`."""
    from PIL import Image, UnidentifiedImageError

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no image file at {path}")
    try:
        with Image.open(path) as image:
            if _is_high_depth(image.mode):
                image.load()
                return image.copy()
            # a grey, bilevel or palette file as `_in_model_mode` reads that image given (a colour
            # file for a one-channel model: its luminance)
            return image.convert("RGB" if channels == 3 else "L")
    except (UnidentifiedImageError, OSError) as error:
        raise ValueError(f"cannot read image {path}: {error}") from error


def read_image(path: str | Path, channels: int = 3) -> Tensor:
    """An image file -> (C, H, W) pixels as `PatchTokenizer` reads them: uint8, or float in [0, 1]
    for 16-bit and float greyscale (whose values an 8-bit conversion would clip)."""
    return _pil_to_tensor(open_image(path, channels), channels)


def _is_pil(obj: Any) -> bool:
    return type(obj).__module__.startswith("PIL.")


def _is_high_depth(mode: str) -> bool:
    """32-bit int ("I", as older PIL opens 16-bit PNGs), 16-bit ("I;16", "I;16B", ...) or float ("F") greyscale."""
    return mode == "F" or mode.startswith("I")


# PIL modes a one-channel model reads as one channel of luminance: grey (its alpha dropped),
# bilevel (to 0 / 255) and palette images (through the palette's colours, not its indices)
GREY_MODES = ("L", "LA", "1", "P", "PA")


def _in_model_mode(image: Any, channels: int) -> Any:
    """An 8-bit PIL image in the mode the model reads, as `open_image` reads the same image from a
    file: RGB for three channels, "L" for one from a `GREY_MODES` image (a colour image given for
    a one-channel model keeps its channels, refused by `PatchTokenizer.to_tensor`)."""
    if channels == 3:
        return image.convert("RGB")
    return image.convert("L") if channels == 1 and image.mode in GREY_MODES else image


def _pil_to_tensor(image: Any, channels: int) -> Tensor:
    """A PIL image -> (C, H, W): uint8, or float for 16-bit (scaled by 65535) and "F" images."""
    if _is_high_depth(image.mode):
        # read the true values: PIL's convert("L"/"RGB") clips these to 8 bits (16-bit 50 % grey -> white)
        array = np.asarray(image)
        if image.mode != "F":
            array = array.astype(np.int64)  # also the native byte order for "I;16B"
            if array.size and (array.min() < 0 or array.max() > 65535):
                raise ValueError(
                    f"{image.mode!r} image values must be 16-bit, in [0, 65535], "
                    f"got values in [{array.min()}, {array.max()}]"
                )
            array = array / 65535
        pixels = torch.from_numpy(array.astype(np.float32))[None]
        return pixels.repeat(3, 1, 1) if channels == 3 else pixels  # grey -> RGB: the channel replicated
    image = _in_model_mode(image, channels)
    pixels = torch.from_numpy(np.asarray(image).copy())
    return pixels[None] if pixels.dim() == 2 else pixels.permute(2, 0, 1)  # HWC -> CHW
