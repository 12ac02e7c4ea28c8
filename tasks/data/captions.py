"""Image–caption data for CLIP: the built-in captioned digits, or users' pairs (JSONL / CSV /
a folder of images with ``.txt`` captions).

Batches are ``{"pixel_values": (B, C, H, W) normalised floats, "input_ids": (B, N) CLIP BPE
ids padded with 0, "labels": (B,) class indices (-1 when the data has no classes)}``. The
captions are tokenized in the data loader (workers) with `CLIPTokenizer`.
"""

from __future__ import annotations

import csv
import json
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from PIL import Image, UnidentifiedImageError
from torch import Tensor
from torch.utils.data import Dataset
from torchvision.transforms import InterpolationMode, v2

from tasks.data.base import SplitDataModule, check_disjoint, hold_out
from tasks.data.image import (
    IMAGE_SUFFIXES,
    DigitsDataModule,
    Interpolation,
    _square,
    _stats,
    augmentation,
)
from tokenizers_mm import CLIPTokenizer
from unitok.models.clip import OPENAI_MEAN, OPENAI_STD

DIGIT_NAMES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
DIGIT_NUMERALS = tuple(str(d) for d in range(10))
# Captions seen in training: many wordings, the class written as a word ("seven") or as a
# numeral ("7"). Templates kept back for zero-shot evaluation are never captions, and no
# held-out template is a training template with a word changed: the held-out images are
# classified with prompts the text tower never read.
TRAIN_TEMPLATES = (
    "a handwritten {}.", "the digit {}.", "a scan of the number {}.", "{}.", "a photo of a {}.",
    "an image showing {}.", "a {} in ink.", "someone wrote a {}.", "a small grey {}.", "digit: {}",
    "label: {}", "this is a {}.", "a blurry scan of a {}.", "a pixelated {}.", "here is a {}.",
    "the numeral {}.", "a drawing of a {}.", "a {} written with a pen.", "a low resolution {}.",
    "one character: {}.", "a picture of the digit {}.", "a {} drawn by a child.", "the symbol {}.",
    "a tiny image of a {}.", "a scanned {}.", "a neat {}.", "a messy {}.", "class {}.",
    "an example of a {}.", "a sample of the digit {}.", "a centred {}.", "{}, handwritten.",
    "a crooked {}.", "a bold {}.", "a thin {}.", "it is a {}.", "the figure {}.", "a {} from a form.",
)
HELD_OUT_TEMPLATES = (
    "a {} on a white background.", "number {} written by hand.", "there is a {} in this picture.",
    "a close-up photograph of the number {}.", "an old {} on paper.", "my favourite digit is {}.",
    "what a lovely {}!", "the answer is {}.",
)


class Captioned(Dataset):
    """Images (a tensor of [0, 1] images, or files read on access) with captions.

    ``captions[i]`` is a fixed caption, or ``(label, templates)`` to draw a template at random
    each time the image is read (so every epoch pairs the image with new wording); the class is
    then written as ``class_numerals[label]`` with probability ``numerals``, else as its name.
    The draws come from Python's global generator, which the training loader seeds for each
    batch (`tasks.data.sampling.SeededFetch`): a batch's captions depend on (seed, epoch, batch)
    alone, in any worker and in a resumed run.
    """

    def __init__(self, images: Tensor | Sequence[Path], captions: Sequence[Any], labels: Sequence[int],
                 transform: Callable[[Tensor], Tensor], class_names: Sequence[str] = (), mode: str = "RGB",
                 class_numerals: Sequence[str] = (), numerals: float = 0.0) -> None:
        if len(images) != len(captions) or len(captions) != len(labels):
            raise ValueError(f"got {len(images)} images, {len(captions)} captions, {len(labels)} labels")
        if numerals and len(class_numerals) != len(class_names):
            raise ValueError(f"numerals need one numeral per class: {len(class_numerals)} for {len(class_names)}")
        self.images, self.captions, self.labels = images, list(captions), torch.as_tensor(list(labels))
        self.transform, self.class_names, self.mode = transform, list(class_names), mode
        self.class_numerals, self.numerals = list(class_numerals), numerals

    def __len__(self) -> int:
        return len(self.captions)

    def item_id(self, index: int) -> str | int:
        """The image file of item ``index``, or its index for in-memory images (`tasks.PredictionWriter`)."""
        image = self.images[index]
        return str(image) if isinstance(image, Path) else index

    def caption(self, index: int) -> str:
        caption = self.captions[index]
        if isinstance(caption, str):
            return caption
        label, templates = caption
        template = random.choice(templates)
        numeral = self.numerals > 0 and random.random() < self.numerals
        return template.format(self.class_numerals[label] if numeral else self.class_names[label])

    def __getitem__(self, index: int) -> dict[str, Any]:
        image = self.images[index]
        if isinstance(image, Path):
            try:
                with Image.open(image) as im:
                    image = v2.functional.pil_to_tensor(im.convert(self.mode))  # (C, H, W) uint8
            except (UnidentifiedImageError, OSError) as error:
                raise ValueError(f"cannot read image {image}: {error}") from error
        return {"pixel_values": self.transform(image), "caption": self.caption(index), "labels": self.labels[index]}


class CaptionCollator:
    """Stacks pixels and labels, tokenizes the captions (padded to the longest)."""

    def __init__(self, tokenizer: CLIPTokenizer) -> None:
        self.tokenizer = tokenizer

    def __call__(self, items: list[dict[str, Any]]) -> dict[str, Tensor]:
        return {
            "pixel_values": torch.stack([it["pixel_values"] for it in items]),
            "input_ids": self.tokenizer.batch_encode([it["caption"] for it in items]).ids,
            "labels": torch.stack([it["labels"] for it in items]),
        }


class CaptionDataModule(SplitDataModule):
    """What the caption data modules share: CLIP's tokenizer in the loader. Subclasses set
    ``train_set`` / ``val_set`` in ``setup`` and the image fields (``channels``, ``image_size``,
    ``mean``, ``std``); ``class_names`` + ``zero_shot_templates`` (when the data has classes)
    let the task score zero-shot accuracy."""

    class_names: list[str] | None = None
    zero_shot_templates: tuple[str, ...] | None = None
    channels: int
    image_size: tuple[int, int]
    mean: tuple[float, ...]
    std: tuple[float, ...]

    def __init__(self, batch_size: int, num_workers: int, context_length: int, truncation: str) -> None:
        if batch_size < 2:
            raise ValueError(f"contrastive training needs batch_size ≥ 2 (negatives), got {batch_size}")
        super().__init__(batch_size, num_workers)
        self.context_length = context_length
        self.tokenizer = CLIPTokenizer(context_length, truncation=truncation)  # type: ignore[arg-type]

    def collate_fn(self, split: str) -> CaptionCollator:
        return CaptionCollator(self.tokenizer)


class CaptionedDigitsDataModule(CaptionDataModule):
    """The built-in digits (`DigitsDataModule`'s 1,797 real scans and its stratified split), each
    captioned from a template with its class, written as a word or a numeral ("a handwritten
    seven.", "a 7 in ink.").

    Training images get a random training template each time they are read; the held-out
    images (never trained on) are captioned with ``held_out_templates``, which are also the
    zero-shot prompts — so zero-shot accuracy measures held-out images *and* unseen wording.
    The held-out scans are `DigitsDataModule`'s validation and test parts (180 + 180 by
    default): ``unitok test`` scores the test scans, which checkpoint selection never saw.

    Args:
        image_size / interpolation / mean / std / test_fraction / val_share / split_seed /
            augment / degrees / translate: as in `DigitsDataModule`.
        templates / held_out_templates: caption templates with ``{}`` for the class.
        class_names / class_numerals: the words and the numerals for 0–9.
        numerals: the probability that a training caption writes its class as a numeral
            (held-out captions alternate when it is above 0).
        batch_size / num_workers: data loading. context_length / truncation: the tokenizer.
    """

    def __init__(
        self,
        image_size: int = 32,
        interpolation: Interpolation = "bilinear",
        mean: float | tuple[float, ...] = 0.5,
        std: float | tuple[float, ...] = 0.5,
        test_fraction: float = 0.2,
        split_seed: int = 0,
        templates: Sequence[str] = TRAIN_TEMPLATES,
        held_out_templates: Sequence[str] = HELD_OUT_TEMPLATES,
        class_names: Sequence[str] = DIGIT_NAMES,
        class_numerals: Sequence[str] = DIGIT_NUMERALS,
        numerals: float = 0.5,
        batch_size: int = 64,
        num_workers: int = 0,
        augment: bool = False,
        degrees: float = 10.0,
        translate: float = 0.1,
        context_length: int = 77,
        truncation: str = "error",
        val_share: float = 0.5,
    ) -> None:
        super().__init__(batch_size, num_workers, context_length, truncation)
        for t in (*templates, *held_out_templates):
            if "{}" not in t:
                raise ValueError(f"template {t!r} has no '{{}}' for the class name")
        if not templates or not held_out_templates:
            raise ValueError("need at least one training and one held-out template")
        if shared := sorted(set(templates) & set(held_out_templates)):
            raise ValueError(f"held-out templates are never captions (zero-shot prompts): {shared} are in both")
        if len(class_names) != 10 or len(class_numerals) != 10:
            raise ValueError(f"class_names and class_numerals need 10 entries (digits 0–9), got "
                             f"{len(class_names)}, {len(class_numerals)}")
        if not 0.0 <= numerals <= 1.0:
            raise ValueError(f"numerals is a probability, got {numerals}")
        self.digits = DigitsDataModule(image_size=image_size, interpolation=interpolation, mean=mean, std=std,
                                       test_fraction=test_fraction, split_seed=split_seed, augment=augment,
                                       degrees=degrees, translate=translate, val_share=val_share)
        self.templates, self.held_out_templates = tuple(templates), tuple(held_out_templates)
        self.class_names, self.class_numerals, self.numerals = list(class_names), list(class_numerals), numerals
        self.zero_shot_templates = self.held_out_templates
        self.channels, self.image_size = 1, self.digits.image_size
        self.mean, self.std = self.digits.mean, self.digits.std
        self.split_seed = split_seed

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        self.digits.setup(stage)
        images, labels = self.digits.images()
        train = self.digits.train_indices
        normalize = v2.Normalize(self.mean, self.std)
        train_transform = (v2.Compose([augmentation(self.digits.degrees, self.digits.translate), normalize])
                           if self.digits.augment else normalize)
        train_labels = labels[torch.from_numpy(train)].tolist()
        self.train_set = Captioned(images[torch.from_numpy(train)], [(y, self.templates) for y in train_labels],
                                   train_labels, train_transform, self.class_names,
                                   class_numerals=self.class_numerals, numerals=self.numerals)
        # Held-out captions are fixed (template i mod T; numeral every other one when numerals are
        # used), so validation and test losses are deterministic.
        T = len(self.held_out_templates)
        for name, held in (("val_set", self.digits.val_indices), ("test_set", self.digits.test_indices)):
            if not len(held):  # val_share=1.0: no test part
                continue
            held_labels = labels[torch.from_numpy(held)].tolist()
            captions = [self.held_out_templates[i % T].format(
                            self.class_numerals[y] if self.numerals > 0 and (i // T) % 2 else self.class_names[y])
                        for i, y in enumerate(held_labels)]
            setattr(self, name, Captioned(images[torch.from_numpy(held)], captions, held_labels, normalize,
                                          self.class_names))

    def data_key(self) -> str:
        """A hash of what the training captions are drawn from: the scans' key (`DigitsDataModule.data_key`),
        the templates and the words and numerals of the classes."""
        self.setup()
        return self._content_key_of(self.train_set, lambda: (self.digits.data_key(), self.templates, self.class_names,
                                                             self.class_numerals, self.numerals))


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a JSONL or CSV / TSV file as dicts; a line that is not JSON is an error naming it."""
    if not path.is_file():
        raise FileNotFoundError(f"pair file {path} does not exist")
    if path.suffix == ".jsonl":
        rows = []
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as error:
                    raise ValueError(f"{path}:{n} is not JSON: {error}") from error
        return rows
    if path.suffix in (".csv", ".tsv"):
        with path.open(newline="") as f:
            return list(csv.DictReader(f, delimiter="\t" if path.suffix == ".tsv" else ","))
    raise ValueError(f"pair file {path} must be .jsonl, .csv or .tsv")


def row_file(path: Path, row: dict[str, Any], n: int, key: str) -> Path:
    """The file a row names under ``key`` (relative paths from the pair file's folder); it must exist."""
    file = Path(row[key])
    file = file if file.is_absolute() else path.parent / file
    if not file.is_file():
        raise FileNotFoundError(f"{path} row {n}: {key} file {file} does not exist")
    return file


def read_pairs(path: Path, image_key: str = "image", caption_key: str = "caption") -> list[tuple[Path, str]]:
    """(image path, caption) rows from a JSONL or CSV file; relative paths are taken from the
    file's folder. Missing keys, empty captions and missing images are errors naming the row."""
    pairs = []
    for n, row in enumerate(read_rows(path), 1):
        missing = [k for k in (image_key, caption_key) if k not in row]
        if missing:
            raise ValueError(f"{path} row {n} lacks {missing}; it has {sorted(row)} "
                             f"(set image_key / caption_key)")
        caption = str(row[caption_key]).strip()
        if not caption:
            raise ValueError(f"{path} row {n} has an empty caption")
        pairs.append((row_file(path, row, n, image_key), caption))
    if not pairs:
        raise ValueError(f"{path} has no image–caption rows")
    return pairs


def folder_pairs(folder: Path) -> list[tuple[Path, str]]:
    """``folder/**/name.jpg`` with its caption in ``name.txt`` beside it -> pairs."""
    if not folder.is_dir():
        raise FileNotFoundError(f"image folder {folder} does not exist")
    pairs = []
    for image in sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file()):
        text = image.with_suffix(".txt")
        if not text.is_file():
            raise FileNotFoundError(f"image {image} has no caption file {text.name} beside it")
        caption = text.read_text().strip()
        if not caption:
            raise ValueError(f"caption file {text} is empty")
        pairs.append((image, caption))
    if not pairs:
        raise ValueError(f"{folder} has no images (looked for {', '.join(IMAGE_SUFFIXES)})")
    return pairs


class ImageCaptionDataModule(CaptionDataModule):
    """Users' image–caption pairs: a JSONL / CSV file (``--data.train_file captions.jsonl``, one
    ``{"image": path, "caption": text}`` per line) or a folder of images with ``.txt`` captions.

    Images are converted to ``channels``, resized (short side) and centre-cropped to
    ``image_size``, then normalised (``mean`` / ``std``: CLIP's for RGB, 0.5 for grey by default). Validation is ``val_file`` / ``val_folder`` or a seeded
    ``val_fraction`` of the training pairs; ``test_file`` / ``test_folder`` (same formats), when
    given, is the test set (else ``unitok test`` scores the validation pairs).
    """

    def __init__(
        self,
        train_file: str | None = None,
        val_file: str | None = None,
        train_folder: str | None = None,
        val_folder: str | None = None,
        image_key: str = "image",
        caption_key: str = "caption",
        image_size: int | tuple[int, int] = 224,
        channels: int = 3,
        mean: float | tuple[float, ...] | None = None,
        std: float | tuple[float, ...] | None = None,
        interpolation: Interpolation = "bicubic",
        val_fraction: float = 0.1,
        split_seed: int = 0,
        batch_size: int = 64,
        num_workers: int = 0,
        context_length: int = 77,
        truncation: str = "error",
        test_file: str | None = None,
        test_folder: str | None = None,
    ) -> None:
        super().__init__(batch_size, num_workers, context_length, truncation)
        if (train_file is None) == (train_folder is None):
            raise ValueError("give exactly one of train_file (JSONL/CSV of image, caption) or train_folder "
                             "(images with .txt captions)")
        if channels not in (1, 3):
            raise ValueError(f"channels must be 1 (grey) or 3 (RGB), got {channels}")
        self.image_size, self.channels = _square(image_size), channels
        default_mean, default_std = (OPENAI_MEAN, OPENAI_STD) if channels == 3 else (0.5, 0.5)  # CLIP's for RGB
        mean, std = default_mean if mean is None else mean, default_std if std is None else std
        self.mean, self.std = _stats(mean, channels, "mean"), _stats(std, channels, "std")
        self.interpolation = interpolation

        def load(file: str | None, folder: str | None) -> list[tuple[Path, str]] | None:
            if file is not None:
                return read_pairs(Path(file), image_key, caption_key)
            return folder_pairs(Path(folder)) if folder is not None else None

        def image(pair: tuple[Path, str]) -> Path:
            return pair[0].resolve()

        self.train_pairs = load(train_file, train_folder)
        self.val_pairs = load(val_file, val_folder)
        self.test_pairs = load(test_file, test_folder)
        if self.val_pairs is None:  # an image's captions stay together (COCO has five an image)
            self.train_pairs, self.val_pairs = hold_out(self.train_pairs, val_fraction, split_seed, image, "images")
        check_disjoint({"the training pairs": self.train_pairs, "the validation pairs": self.val_pairs,
                        "the test pairs": self.test_pairs}, image, "image")
        for pairs in (self.train_pairs, self.val_pairs, self.test_pairs or []):  # fail now, not in a worker mid-epoch
            for _, caption in pairs:
                self.tokenizer.encode(caption)

    def _transform(self) -> v2.Transform:
        return v2.Compose([
            v2.Resize(min(self.image_size), interpolation=InterpolationMode(self.interpolation), antialias=True),
            v2.CenterCrop(self.image_size), v2.ToDtype(torch.float32, scale=True), v2.Normalize(self.mean, self.std),
        ])

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        mode = "L" if self.channels == 1 else "RGB"
        for name, pairs in (("train_set", self.train_pairs), ("val_set", self.val_pairs), ("test_set", self.test_pairs)):
            if pairs is None:
                continue
            images, captions = [p for p, _ in pairs], [c for _, c in pairs]
            setattr(self, name, Captioned(images, captions, [-1] * len(pairs), self._transform(), mode=mode))
