"""Images -> P×P patches and back: patchify is exactly invertible, a Linear on its output *is*
ViT's stride-P Conv2d, PatchTokenizer accepts PIL / uint8 / float / numpy input, normalises with
mean/std, resizes, crops or pads only when told to, and names the problem with bad input."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from torch import nn

from tokenizers_mm import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    ImagePreprocessConfig,
    PatchTokenizer,
    Tokens,
    patchify,
    unpatchify,
)

PLAIN = dict(mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))  # no normalisation: features are [0, 1] pixels


def random_uint8(*shape: int) -> torch.Tensor:
    return torch.randint(0, 256, shape, dtype=torch.uint8)


# --------------------------------------------------------------------------- patchify


@settings(max_examples=60, deadline=None)
@given(
    batch=st.integers(1, 3), channels=st.integers(1, 4), patch=st.integers(1, 5),
    rows=st.integers(1, 4), cols=st.integers(1, 4), seed=st.integers(0, 2**16),
)
def test_unpatchify_inverts_patchify_exactly(batch, channels, patch, rows, cols, seed):
    x = torch.randn(batch, channels, rows * patch, cols * patch, generator=torch.Generator().manual_seed(seed))
    patches = patchify(x, patch)
    assert patches.shape == (batch, rows * cols, channels * patch * patch)
    assert torch.equal(unpatchify(patches, (rows, cols), patch, channels), x)
    # Row-major grid order, each patch flattened channel-first (C, P, P).
    i, j = rows - 1, cols // 2
    expected = x[:, :, i * patch : (i + 1) * patch, j * patch : (j + 1) * patch].reshape(batch, -1)
    assert torch.equal(patches[:, i * cols + j], expected)


@settings(max_examples=25, deadline=None)
@given(
    channels=st.integers(1, 4), patch=st.integers(1, 6), rows=st.integers(1, 3), cols=st.integers(1, 3),
    width=st.integers(1, 8), seed=st.integers(0, 2**16),
)
def test_linear_on_patches_is_the_stride_p_conv(channels, patch, rows, cols, width, seed):
    """The key property: ViT's Conv2d(C, D, kernel=P, stride=P) == Linear(C·P·P, D) on patchify."""
    torch.manual_seed(seed)
    conv = nn.Conv2d(channels, width, kernel_size=patch, stride=patch)
    linear = nn.Linear(channels * patch * patch, width)
    with torch.no_grad():
        linear.weight.copy_(conv.weight.reshape(width, channels * patch * patch))
        linear.bias.copy_(conv.bias)
    x = torch.randn(2, channels, rows * patch, cols * patch)
    with torch.no_grad():
        by_conv = conv(x).flatten(2).transpose(1, 2)  # (B, D, h, w) -> (B, h·w, D)
        by_linear = linear(patchify(x, patch))
    torch.testing.assert_close(by_linear, by_conv, atol=1e-5, rtol=0)


def test_patchify_and_unpatchify_refuse_shapes_that_do_not_fit():
    with pytest.raises(ValueError, match="10×16 is not divisible by the patch size 4"):
        patchify(torch.zeros(1, 3, 10, 16), 4)
    with pytest.raises(ValueError, match=r"do not fit grid \(2, 3\)"):
        unpatchify(torch.zeros(1, 5, 48), (2, 3), 4, 3)
    with pytest.raises(ValueError, match="do not fit"):
        unpatchify(torch.zeros(1, 6, 47), (2, 3), 4, 3)


# --------------------------------------------------------------------------- round trips


def test_uint8_tensor_round_trips_to_unit_pixels():
    tok = PatchTokenizer(patch_size=8)
    images = random_uint8(2, 3, 16, 24)
    tokens = tok.encode(images)
    torch.testing.assert_close(tok.decode(tokens), images.float() / 255, atol=1e-6, rtol=0)


def test_float_tensor_round_trips():
    tok = PatchTokenizer(patch_size=4, channels=1, mean=(0.3,), std=(0.2,))
    image = torch.rand(1, 12, 8)  # a single (C, H, W) image
    decoded = tok.decode(tok(image))
    assert decoded.shape == (1, 1, 12, 8)
    torch.testing.assert_close(decoded[0], image, atol=1e-6, rtol=0)


def test_pil_image_round_trips_in_rgb():
    array = np.random.default_rng(0).integers(0, 256, (16, 32, 3), dtype=np.uint8)  # PIL is (H, W, C)
    tok = PatchTokenizer(patch_size=8)
    decoded = tok.decode(tok.encode(Image.fromarray(array)))
    expected = torch.from_numpy(array).permute(2, 0, 1)[None].float() / 255
    torch.testing.assert_close(decoded, expected, atol=1e-6, rtol=0)


def test_list_of_pil_images_is_one_batch_in_order():
    rng = np.random.default_rng(1)
    arrays = [rng.integers(0, 256, (8, 8, 3), dtype=np.uint8) for _ in range(3)]
    tok = PatchTokenizer(patch_size=4)
    decoded = tok.decode(tok.encode([Image.fromarray(a) for a in arrays]))
    assert decoded.shape == (3, 3, 8, 8)
    for row, array in zip(decoded, arrays):
        torch.testing.assert_close(row, torch.from_numpy(array).permute(2, 0, 1).float() / 255, atol=1e-6, rtol=0)


def test_grayscale_pil_image_becomes_rgb_for_a_three_channel_tokenizer():
    gray = np.arange(64, dtype=np.uint8).reshape(8, 8) * 3
    pixels = PatchTokenizer(patch_size=4).to_tensor(Image.fromarray(gray, mode="L"))
    assert pixels.shape == (1, 3, 8, 8)
    for c in range(3):
        torch.testing.assert_close(pixels[0, c], torch.from_numpy(gray).float() / 255)


def test_single_channel_pil_image_for_a_one_channel_tokenizer():
    gray = np.arange(32, dtype=np.uint8).reshape(4, 8)
    tok = PatchTokenizer(patch_size=4, channels=1, mean=(0.0,), std=(1.0,))
    tokens = tok.encode(Image.fromarray(gray, mode="L"))
    assert tokens.grid == (1, 2)
    torch.testing.assert_close(tok.decode(tokens)[0, 0], torch.from_numpy(gray).float() / 255)


SIXTEEN_BIT = {"I;16": "<u2", "I;16L": "<u2", "I;16B": ">u2", "I": "=i4"}  # "I": how older PIL opens 16-bit PNGs


@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("mode", sorted(SIXTEEN_BIT))
def test_16_bit_greyscale_pil_images_are_scaled_by_65535_not_clipped_to_8_bits(mode, channels):
    values = np.arange(0, 65536, 4369).reshape(4, 4)  # 0 .. 65535, 32768 (50 % grey) among them
    image = Image.frombytes(mode, (4, 4), values.astype(SIXTEEN_BIT[mode]).tobytes())
    tok = PatchTokenizer(patch_size=4, channels=channels, mean=(0.0,) * channels, std=(1.0,) * channels)
    grey = torch.from_numpy(values / 65535).float()
    torch.testing.assert_close(tok.to_tensor(image), grey.expand(1, channels, 4, 4))  # RGB: grey replicated


@pytest.mark.parametrize("channels", [1, 3])
def test_16_bit_image_files_keep_their_values(tmp_path, channels):
    path = tmp_path / "grey16.png"
    Image.fromarray(np.full((4, 8), 32768, dtype=np.uint16)).save(path)
    tok = PatchTokenizer(patch_size=4, channels=channels, mean=(0.0,) * channels, std=(1.0,) * channels)
    torch.testing.assert_close(tok.to_tensor(path), torch.full((1, channels, 4, 8), 32768 / 65535))


def test_float_pil_images_are_float_pixels_with_the_grey_replicated_for_rgb():
    values = np.linspace(0, 1, 16, dtype=np.float32).reshape(4, 4)
    image = Image.fromarray(values)  # mode "F"
    for channels in (3, 1):
        tok = PatchTokenizer(patch_size=4, channels=channels, mean=(0.0,) * channels, std=(1.0,) * channels)
        torch.testing.assert_close(tok.to_tensor(image), torch.from_numpy(values).expand(1, channels, 4, 4))


def test_palette_pil_image_for_a_one_channel_tokenizer_is_the_luminance_of_its_colours():
    rgb = np.zeros((4, 4, 3), np.uint8)
    rgb[0, :, 0] = 255  # red
    rgb[1, :, 1] = 255  # green
    rgb[2, :, 2] = 255  # blue
    rgb[3] = 128  # grey
    palette = Image.fromarray(rgb).quantize(8)
    tok = PatchTokenizer(patch_size=4, channels=1, mean=(0.0,), std=(1.0,))
    pixels = tok.to_tensor(palette)[0, 0]
    torch.testing.assert_close(pixels[:, 0], torch.tensor([0.299, 0.587, 0.114, 128 / 255]), atol=3e-3, rtol=0)
    as_grey = np.array(Image.fromarray(rgb).convert("L"))  # what PIL's RGB -> L gives
    torch.testing.assert_close(pixels, torch.from_numpy(as_grey).float() / 255)


@pytest.mark.parametrize("dtype", [np.uint8, np.float32, np.float64])
def test_numpy_arrays_round_trip(dtype):
    rng = np.random.default_rng(2)
    unit = rng.random((2, 3, 8, 12))
    array = (unit * 255).round().astype(np.uint8) if dtype == np.uint8 else unit.astype(dtype)
    expected = torch.from_numpy(array.astype(np.float64) / (255 if dtype == np.uint8 else 1)).float()
    tok = PatchTokenizer(patch_size=4)
    torch.testing.assert_close(tok.decode(tok.encode(array)), expected, atol=1e-6, rtol=0)


def test_numpy_view_with_negative_strides_is_accepted():
    bgr = np.random.default_rng(3).integers(0, 256, (3, 8, 8), dtype=np.uint8)
    rgb = bgr[::-1]  # channel flip: a view with a negative stride
    tok = PatchTokenizer(patch_size=4)
    decoded = tok.decode(tok.encode(rgb))
    torch.testing.assert_close(decoded[0], torch.from_numpy(rgb.copy()).float() / 255, atol=1e-6, rtol=0)


# --------------------------------------------------------------------------- tokens and normalisation


def test_tokens_record_the_patch_grid_of_a_non_square_image():
    tokens = PatchTokenizer(patch_size=8).encode(random_uint8(2, 3, 24, 40))
    assert isinstance(tokens, Tokens)
    assert tokens.grid == (3, 5)
    assert tokens.features.shape == (2, 15, 3 * 8 * 8) and tokens.ids is None
    assert tokens.modality == "image"
    assert tokens.attention_mask.tolist() == [[1] * 15] * 2


def test_normalisation_uses_the_configured_mean_and_std():
    mean, std = (0.2, 0.5, 0.6), (0.1, 0.25, 0.3)
    tok = PatchTokenizer(patch_size=2, mean=mean, std=std)
    images = torch.rand(2, 3, 4, 6)
    expected = (images - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)
    torch.testing.assert_close(tok.preprocess(images), expected)
    torch.testing.assert_close(tok.encode(images).features, patchify(expected, 2))
    # A pixel equal to the mean is 0; one std above it is 1, in every channel.
    at_mean = torch.tensor(mean).view(1, 3, 1, 1).expand(1, 3, 2, 2)
    assert tok.preprocess(at_mean).abs().max() < 1e-6
    one_std_up = (torch.tensor(mean) + torch.tensor(std)).view(1, 3, 1, 1).expand(1, 3, 2, 2)
    torch.testing.assert_close(tok.preprocess(one_std_up), torch.ones(1, 3, 2, 2))


def test_default_normalisation_is_imagenet_and_decode_can_skip_it():
    tok = PatchTokenizer(patch_size=4)
    assert tok.config.mean == IMAGENET_MEAN and tok.config.std == IMAGENET_STD
    images = torch.rand(1, 3, 8, 8)
    tokens = tok.encode(images)
    torch.testing.assert_close(tok.decode(tokens, denormalize=False), tok.preprocess(images))


def test_uint8_is_scaled_by_255():
    tok = PatchTokenizer(patch_size=1, channels=1, mean=(0.0,), std=(1.0,))
    pixels = tok.to_tensor(torch.tensor([[[[0, 51, 255]]]], dtype=torch.uint8))
    torch.testing.assert_close(pixels, torch.tensor([[[[0.0, 0.2, 1.0]]]]))


def test_keyword_options_and_config_build_the_same_tokenizer():
    by_options = PatchTokenizer(patch_size=8, mean=[0.5, 0.5, 0.5], std=[0.5, 0.5, 0.5], image_size=[16, 16])
    by_config = PatchTokenizer(ImagePreprocessConfig(patch_size=8, mean=(0.5,) * 3, std=(0.5,) * 3,
                                                     image_size=(16, 16)))
    assert by_options.config == by_config.config
    assert by_options.config.to_dict()["image_size"] == (16, 16)


# --------------------------------------------------------------------------- resize, crop, pad


def test_resize_brings_every_image_to_image_size():
    tok = PatchTokenizer(patch_size=8, image_size=(16, 24), resize=True, interpolation="nearest", **PLAIN)
    images = torch.rand(2, 3, 32, 48)
    pixels = tok.preprocess(images)
    assert pixels.shape == (2, 3, 16, 24)
    torch.testing.assert_close(pixels, images[..., 1::2, 1::2])  # nearest, halving: the pixel at each centre, as PIL
    assert tok.encode(images).grid == (2, 3)


def test_bicubic_resize_keeps_a_constant_image_constant_and_in_range():
    tok = PatchTokenizer(patch_size=4, image_size=(12, 20), resize=True, **PLAIN)
    pixels = tok.preprocess(torch.full((1, 3, 37, 23), 0.7))
    assert pixels.shape == (1, 3, 12, 20)
    torch.testing.assert_close(pixels, torch.full_like(pixels, 0.7))
    checker = tok.preprocess(torch.arange(64.0).reshape(1, 1, 8, 8).remainder(2).expand(1, 3, 8, 8))
    assert checker.min() >= 0 and checker.max() <= 1  # clamped after the bicubic overshoot


def test_resize_lets_images_of_different_sizes_share_a_batch():
    tok = PatchTokenizer(patch_size=4, image_size=(8, 8), resize=True, **PLAIN)
    small, large = torch.full((3, 8, 8), 0.25), torch.full((3, 20, 12), 0.75)
    tokens = tok.encode([small, large])
    assert tokens.features.shape == (2, 4, 48) and tokens.grid == (2, 2)
    torch.testing.assert_close(tok.decode(tokens)[0], small)
    torch.testing.assert_close(tok.decode(tokens)[1], torch.full((3, 8, 8), 0.75))


def test_crop_pct_resizes_to_size_over_crop_pct_then_centre_crops():
    # image_size 32 with crop_pct 0.5: resize to 64 (already the size), keep the central 32×32.
    tok = PatchTokenizer(patch_size=8, image_size=(32, 32), resize=True, crop_pct=0.5, **PLAIN)
    images = torch.rand(2, 3, 64, 64)
    torch.testing.assert_close(tok.preprocess(images), images[..., 16:48, 16:48])
    # The timm recipe: 224 / 0.875 = 256, so a 256×256 image is only centre-cropped.
    timm_like = PatchTokenizer(patch_size=16, image_size=(224, 224), resize=True, crop_pct=0.875, **PLAIN)
    big = torch.rand(1, 3, 256, 256)
    torch.testing.assert_close(timm_like.preprocess(big), big[..., 16:240, 16:240])


def test_pad_fills_up_to_a_multiple_of_the_patch_size():
    tok = PatchTokenizer(patch_size=8, pad=True, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
    images = torch.rand(1, 3, 30, 18)
    tokens = tok.encode(images)
    assert tokens.grid == (4, 3)
    pixels = tok.preprocess(images)
    assert pixels.shape == (1, 3, 32, 24)
    assert pixels[..., 30:, :].eq(0).all() and pixels[..., :, 18:].eq(0).all()  # zero after normalising
    decoded = tok.decode(tokens)
    torch.testing.assert_close(decoded[..., :30, :18], images, atol=1e-6, rtol=0)
    torch.testing.assert_close(decoded[..., 30:, :], torch.full((1, 3, 2, 24), 0.5))  # padding decodes to the mean


def test_pad_leaves_divisible_images_alone():
    tok = PatchTokenizer(patch_size=4, pad=True)
    images = torch.rand(1, 3, 8, 12)
    assert tok.preprocess(images).shape == (1, 3, 8, 12)


# --------------------------------------------------------------------------- bad input


def test_size_not_divisible_by_the_patch_size_names_both():
    with pytest.raises(ValueError, match=r"30×32 is not divisible by the patch size 16.*resize=True.*pad=True"):
        PatchTokenizer(patch_size=16).encode(torch.rand(3, 30, 32))


def test_wrong_channel_count_is_refused():
    with pytest.raises(ValueError, match=r"expected 3 channels .* got 1 in shape \(2, 1, 8, 8\)"):
        PatchTokenizer(patch_size=4).encode(torch.rand(2, 1, 8, 8))
    with pytest.raises(ValueError, match="expected 1 channels"):
        PatchTokenizer(patch_size=4, channels=1, mean=(0.5,), std=(0.5,)).encode(Image.new("RGB", (8, 8)))


@pytest.mark.parametrize("value", [-0.1, 1.5, float("inf")])
def test_float_pixels_outside_unit_range_are_refused(value):
    images = torch.rand(1, 3, 8, 8)
    images[0, 1, 2, 3] = value
    with pytest.raises(ValueError, match=r"must be in \[0, 1\].*uint8"):
        PatchTokenizer(patch_size=4).encode(images)


def test_nan_pixels_are_refused():
    images = torch.rand(1, 3, 8, 8)
    images[0, 0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        PatchTokenizer(patch_size=4).encode(images)


@pytest.mark.parametrize("value", [-1, 65536])
def test_32_bit_integer_pil_images_outside_the_16_bit_range_are_refused(value):
    values = np.zeros((8, 8), np.int32)
    values[2, 3] = value
    with pytest.raises(ValueError, match=rf"'I' image values must be 16-bit, in \[0, 65535\].*{value}"):
        PatchTokenizer(patch_size=4).encode(Image.fromarray(values))


def test_float_pil_images_outside_unit_range_are_refused():
    values = np.full((8, 8), 0.5, np.float32)
    values[1, 1] = 1.5
    with pytest.raises(ValueError, match=r"must be in \[0, 1\], got values in \[0.5, 1.5\]"):
        PatchTokenizer(patch_size=4).encode(Image.fromarray(values))


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
@pytest.mark.parametrize("shape", [(3, 0, 16), (3, 16, 0), (0, 3, 16, 16)], ids=str)
def test_images_with_a_zero_dimension_are_refused_naming_the_shape(shape, dtype):
    shown = shape if len(shape) == 4 else (1, *shape)
    with pytest.raises(ValueError, match=rf"must not be empty .* got shape {re.escape(str(shown))}"):
        PatchTokenizer(patch_size=8).encode(torch.zeros(shape, dtype=dtype))


def test_an_empty_pil_image_is_refused():
    with pytest.raises(ValueError, match=r"must not be empty .* got shape \(1, 3, 0, 16\)"):
        PatchTokenizer(patch_size=8).encode(Image.new("RGB", (16, 0)))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool])
def test_integer_types_other_than_uint8_are_refused(dtype):
    with pytest.raises(TypeError, match=f"uint8 or float, got {dtype}"):
        PatchTokenizer(patch_size=4).encode(torch.zeros(1, 3, 8, 8, dtype=dtype))


def test_other_bad_inputs_say_what_is_wrong():
    tok = PatchTokenizer(patch_size=4)
    with pytest.raises(ValueError, match="empty list"):
        tok.encode([])
    with pytest.raises(ValueError, match="different sizes .* need resize=True"):
        tok.encode([torch.rand(3, 8, 8), torch.rand(3, 8, 12)])
    with pytest.raises(FileNotFoundError, match="no image file at cat.png"):
        tok.encode("cat.png")  # a path is read as an image file, so a missing one says so
    with pytest.raises(TypeError, match="unsupported image type int; give PIL images, image file paths"):
        tok.encode(3)
    with pytest.raises(ValueError, match=r"\(C, H, W\) or \(B, C, H, W\)"):
        tok.encode(torch.rand(8, 8))
    with pytest.raises(ValueError, match="features and a grid"):
        tok.decode(Tokens(features=torch.zeros(1, 4, 48)))


def test_bad_configs_are_refused():
    with pytest.raises(ValueError, match=r"mean needs 3 values \(one per channel\)"):
        ImagePreprocessConfig(mean=(0.5,), std=(0.5,))
    with pytest.raises(ValueError, match=r"std\[1\] must be a finite number > 0, got 0.0"):
        ImagePreprocessConfig(std=(0.5, 0.0, 0.5))
    with pytest.raises(ValueError, match="resize=True needs image_size"):
        ImagePreprocessConfig(resize=True)
    with pytest.raises(ValueError, match="crop_pct"):
        ImagePreprocessConfig(image_size=(8, 8), crop_pct=1.5)
    with pytest.raises(ValueError, match="patch_size"):
        ImagePreprocessConfig(patch_size=0)
    with pytest.raises(ValueError, match="not both"):
        PatchTokenizer(ImagePreprocessConfig(), patch_size=8)


@pytest.mark.parametrize(("options", "message"), [
    (dict(mean=(float("nan"), 0.5, 0.5)), r"mean\[0\] must be a finite number, got nan"),
    (dict(mean=(0.5, float("inf"), 0.5)), r"mean\[1\] must be a finite number, got inf"),
    (dict(std=(float("nan"),) * 3), r"std\[0\] must be a finite number > 0, got nan"),
    (dict(std=(1.0, 1.0, float("inf"))), r"std\[2\] must be a finite number > 0, got inf"),
    (dict(mean="abc"), r"mean must be a list of 3 numbers"),
    (dict(patch_size=16.0), r"patch_size must be an integer ≥ 1, got 16.0"),
    (dict(patch_size=True), r"patch_size must be an integer ≥ 1, got True"),
    (dict(channels=0, mean=(), std=()), r"channels must be an integer ≥ 1, got 0"),
    (dict(image_size=(0, 32)), r"image_size\[0\] \(height\) must be an integer ≥ 1, got 0"),
    (dict(image_size=(32, 32.0)), r"image_size\[1\] \(width\) must be an integer ≥ 1, got 32.0"),
    (dict(image_size=(32,)), r"image_size must be \(height, width\) \(or one integer: a square\), got \(32,\)"),
    (dict(image_size="32"), r"image_size must be \(height, width\)"),
    (dict(interpolation="BICUBIC"), r"interpolation must be one of 'bicubic', 'bilinear', 'nearest', got 'BICUBIC'"),
    (dict(interpolation="lanczos"), r"interpolation must be one of .*got 'lanczos'"),
    (dict(crop_pct=float("nan")), r"crop_pct must be a finite number in \(0, 1\], got nan"),
    (dict(crop_pct="0.9"), r"crop_pct must be a finite number in \(0, 1\], got '0.9'"),
    (dict(resize="yes", image_size=(32, 32)), r"resize must be True or False, got 'yes'"),
    (dict(pad=1), r"pad must be True or False, got 1"),
])
def test_a_bad_field_is_refused_as_the_config_is_built_naming_it(options, message):
    # not later, inside a resize or a reshape, and never as all-NaN (or all-zero) features
    with pytest.raises(ValueError, match=message):
        ImagePreprocessConfig(**options)


def test_lists_are_stored_as_tuples_and_one_integer_is_a_square_image_size():
    as_lists = ImagePreprocessConfig(patch_size=8, channels=1, mean=[0.5], std=[0.25], image_size=[32, 48])
    as_tuples = ImagePreprocessConfig(patch_size=8, channels=1, mean=(0.5,), std=(0.25,), image_size=(32, 48))
    assert as_lists == as_tuples and hash(as_lists) == hash(as_tuples)
    assert ImagePreprocessConfig(image_size=224) == ImagePreprocessConfig(image_size=(224, 224))  # timm's img_size
    tok = PatchTokenizer(patch_size=8, image_size=32, resize=True, **PLAIN)
    assert tok.encode(torch.rand(3, 40, 50)).grid == (4, 4)


@pytest.mark.parametrize("mode", ["LA", "PA", "P", "1", "L"])
def test_a_one_channel_tokenizer_reads_grey_images_with_alpha_as_their_files_are_read(mode, tmp_path):
    rng = np.random.default_rng(1)
    grey = Image.fromarray(rng.integers(0, 256, (8, 8), dtype=np.uint8), "L")
    image = grey.convert("P").convert("PA") if mode == "PA" else grey.convert(mode)
    tok = PatchTokenizer(patch_size=4, channels=1, mean=(0.0,), std=(1.0,))
    (image.convert("LA") if mode == "PA" else image).save(tmp_path / "image.png")  # PNG holds no "PA"
    from_file = tok.preprocess(str(tmp_path / "image.png"))
    assert from_file.shape == (1, 1, 8, 8)
    torch.testing.assert_close(tok.preprocess(image), from_file)  # the alpha dropped, as for the file


@pytest.mark.parametrize("size", [(40, 60), (60, 40), (50, 50), (37, 91)])
@pytest.mark.parametrize("image_size", [(32, 32), (32, 48)])
def test_crop_pct_keeps_the_aspect_ratio_as_timms_evaluation_transform_does(size, image_size):
    # timm's eval transform ("center" crop mode): the shorter side to image_size / crop_pct, the
    # aspect ratio kept, then torchvision's centre crop — not a squash of the whole image.
    from timm.data.transforms import ResizeKeepRatio
    from torchvision.transforms import v2

    tok = PatchTokenizer(patch_size=8, image_size=image_size, resize=True, crop_pct=0.875, **PLAIN)
    smooth = torch.linspace(0.25, 0.75, size[0] * size[1]).view(1, 1, *size).expand(1, 3, *size)
    image = (smooth + 0.2 * torch.rand(size).sub(0.5)).clamp(0, 1)
    scale = [int(s / 0.875) for s in image_size]
    size_first = scale[0] if scale[0] == scale[1] else ResizeKeepRatio.get_params(image, scale, 0.0)
    first = v2.Resize(size_first, interpolation=v2.InterpolationMode.BICUBIC, antialias=True)
    expected = v2.CenterCrop(image_size)(first(image))
    torch.testing.assert_close(tok.preprocess(image), expected.clamp(0, 1), atol=1e-6, rtol=0)


def test_nearest_resizing_picks_the_pixels_pil_and_timm_pick():
    # torch's "nearest" floors its own way; PIL's (timm's transforms) takes pixel centres
    from PIL import Image
    from timm.data import create_transform

    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (217, 300, 3), dtype=np.uint8))
    reference = create_transform(input_size=(3, 64, 64), interpolation="nearest", crop_pct=0.875, mean=(0,) * 3,
                                 std=(1,) * 3)(image)
    tok = PatchTokenizer(patch_size=8, image_size=(64, 64), resize=True, interpolation="nearest", crop_pct=0.875,
                         **PLAIN)
    torch.testing.assert_close(tok.preprocess(image)[0], reference, atol=1e-6, rtol=0)


def test_a_list_of_sizes_is_resized_and_cropped_once_as_each_image_alone():
    tok = PatchTokenizer(patch_size=8, image_size=(32, 32), resize=True, crop_pct=0.875, **PLAIN)
    a, b = torch.rand(3, 40, 60), torch.rand(3, 50, 50)
    torch.testing.assert_close(tok.preprocess([a, b]), torch.cat([tok.preprocess(a), tok.preprocess(b)]))


@pytest.mark.parametrize("mode", ["1", "P"])
def test_a_one_channel_tokenizer_reads_bilevel_and_palette_images_as_their_files_are_read(mode, tmp_path):
    # one channel of luminance: bilevel to 0 / 255, a palette through its colours
    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8), "RGB").convert(mode)
    tok = PatchTokenizer(patch_size=4, channels=1, mean=(0.0,), std=(1.0,))
    image.save(tmp_path / "image.png")
    from_file = tok.preprocess(str(tmp_path / "image.png"))
    torch.testing.assert_close(tok.preprocess(image), from_file)
    torch.testing.assert_close(from_file[0, 0], torch.from_numpy(np.array(image.convert("L"))).float() / 255)
