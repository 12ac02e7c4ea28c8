"""Digit scans paired with spoken digits: the built-in data of tasks that no single family can do.

A pair is one of scikit-learn's handwritten digit scans and one spoken digit from the
built-in espeak-ng corpus (single-digit utterances). ``same_fraction`` of the pairs show the
same digit (label 1), the rest a different one (label 0): with 0.5 the "same digit?" task is
balanced; with 1.0 every pair is a positive (audio, image) pair for contrastive binding.
Training pairs come from the training scans and training voices; held-out pairs from the
held-out scans and the held-out voices only, so accuracy measures unseen speakers and unseen
handwriting. The held-out scans and utterances are each cut into a validation and a test part
(`DigitsDataModule`'s scan split; the utterances of each digit alternately): validation pairs
are drawn from the validation parts, test pairs from the test parts, so ``unitok test`` never
scores a scan or an utterance that checkpoint selection saw.

Batches: ``{"pixel_values": (B, 1, H, W), "features": (B, N, F) log-mel frames padded with 0,
"feature_lengths": (B,), "labels": (B,) 1 = same digit, "image_digits": (B,), "audio_digits":
(B,)}``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torch import Tensor
from torch.utils.data import Dataset
from torchvision.transforms import v2

from tasks.data.base import DisjointSets, SplitDataModule, check_disjoint, hold_out
from tasks.data.captions import read_rows, row_file
from tasks.data.image import DigitsDataModule, _square, _stats, augmentation
from tasks.data.speech import (
    DIGIT_WORDS,
    HELD_OUT_VOICES,
    TRAIN_VOICES,
    DigitsCorpusSpec,
    read_manifest,
    spoken_digits_corpus,
    validation_rows,
)
from tokenizers_mm import SpecAugment, SpectrogramConfig, SpectrogramTokenizer


class ImageAudioPairs(Dataset):
    """Pairs drawn from (images, image digits) and (frames, audio digits): pair ``i`` is fixed by
    (seed, i) — the same on every worker and every run — and is a same-digit pair with
    probability ``same_fraction`` (exactly alternating when it is 0.5, so the set is balanced)."""

    def __init__(self, images: Tensor, image_digits: Tensor, frames: Sequence[Tensor], audio_digits: Sequence[int],
                 size: int, same_fraction: float, seed: int, transform: Any = None,
                 spec_augment: SpecAugment | None = None) -> None:
        if not 0.0 <= same_fraction <= 1.0:
            raise ValueError(f"same_fraction must be in [0, 1], got {same_fraction}")
        self.images, self.image_digits = images, image_digits
        self.frames, self.audio_digits = list(frames), np.asarray(audio_digits)
        self.by_digit = {d: np.flatnonzero(self.audio_digits == d) for d in range(10)}
        missing = [DIGIT_WORDS[d] for d, idx in self.by_digit.items() if len(idx) == 0]
        if missing:
            raise ValueError(f"the spoken corpus has no utterance of {missing}; use more utterances")
        self.size, self.same_fraction, self.seed = size, same_fraction, seed
        self.transform, self.spec_augment = transform, spec_augment

    def __len__(self) -> int:
        return self.size

    def pair(self, index: int) -> tuple[int, int, bool]:
        """(image index, utterance index, same digit?) of pair ``index``."""
        rng = np.random.default_rng([self.seed, index])
        same = index % 2 == 0 if self.same_fraction == 0.5 else bool(rng.random() < self.same_fraction)
        image = int(rng.integers(len(self.images)))
        digit = int(self.image_digits[image])
        if not same:
            digit = int((digit + rng.integers(1, 10)) % 10)  # any of the nine other digits
        utterance = int(rng.choice(self.by_digit[digit]))
        return image, utterance, same

    def __getitem__(self, index: int) -> dict[str, Any]:
        image, utterance, same = self.pair(index)
        pixels = self.images[image]
        frames = self.frames[utterance]
        if self.transform is not None:
            pixels = self.transform(pixels)
        if self.spec_augment is not None:
            frames = self.spec_augment(frames)
        return {"pixel_values": pixels, "features": frames, "labels": int(same),
                "image_digits": int(self.image_digits[image]), "audio_digits": int(self.audio_digits[utterance])}


def collate_pairs(items: Sequence[dict[str, Any]]) -> dict[str, Tensor]:
    """Stack pixels, pad frames with 0 (their lengths kept), stack the labels (and digits when known)."""
    batch = {
        "pixel_values": torch.stack([it["pixel_values"] for it in items]),
        "features": torch.nn.utils.rnn.pad_sequence([it["features"] for it in items], batch_first=True),
        "feature_lengths": torch.tensor([it["features"].shape[0] for it in items], dtype=torch.long),
    }
    for key in ("labels", "image_digits", "audio_digits"):
        if key in items[0]:
            batch[key] = torch.tensor([it[key] for it in items], dtype=torch.long)
    return batch


class ImageAudioPairsDataModule(SplitDataModule):
    """Digit scans × spoken digits (see the module docstring).

    Each row is one scan and one utterance, drawn independently of the other rows (with
    replacement): a batch may repeat a scan or an utterance, and under a contrastive loss its
    other rows of the same digit are negatives, as other captions of a class are in CLIP.

    Args:
        same_fraction: share of same-digit pairs (0.5: the balanced "same digit?" task; 1.0:
            positive pairs for contrastive training).
        train_pairs / held_out_pairs: pairs per training epoch / in the validation set (and
            as many in the test set).
        image_size / mean / std / test_fraction / split_seed / augment_images / degrees /
            translate: the scans, as in `DigitsDataModule` (the same stratified split).
        val_share: the share of the held-out scans, and of each digit's held-out utterances
            (`tasks.data.speech.validation_rows`), that validate; the rest are for test pairs.
            1.0: no test split (the test loader serves the validation pairs).
        train_utterances / held_out_utterances / train_voices / held_out_voices / speeds /
            pitches / corpus_seed / cache_dir: the single-digit spoken corpus
            (`DigitsCorpusSpec` with one digit per utterance).
        spectrogram: `SpectrogramConfig` fields (default: 80 mel bins, per-utterance
            normalisation — the same frames as `SpokenDigitsDataModule`).
        augment_audio: SpecAugment on training frames. seed: the pair draw.
        batch_size / num_workers: data loading.
    """

    def __init__(
        self,
        same_fraction: float = 0.5,
        train_pairs: int = 20_000,
        held_out_pairs: int = 720,
        image_size: int = 32,
        test_fraction: float = 0.2,
        split_seed: int = 0,
        augment_images: bool = False,
        degrees: float = 10.0,
        translate: float = 0.1,
        train_utterances: int = 1400,
        held_out_utterances: int = 300,
        train_voices: Sequence[str] = TRAIN_VOICES,
        held_out_voices: Sequence[str] = HELD_OUT_VOICES,
        speeds: tuple[int, int] = (130, 200),
        pitches: tuple[int, int] = (30, 70),
        corpus_seed: int = 0,
        cache_dir: str | None = None,
        spectrogram: dict[str, Any] | None = None,
        augment_audio: bool = False,
        seed: int = 0,
        batch_size: int = 64,
        num_workers: int = 0,
        val_share: float = 0.5,
        mean: float | tuple[float, ...] = 0.5,
        std: float | tuple[float, ...] = 0.5,
    ) -> None:
        super().__init__(batch_size, num_workers)
        if train_pairs < 2 or held_out_pairs < 2:
            raise ValueError(f"need at least 2 training and 2 held-out pairs, got {train_pairs}, {held_out_pairs}")
        self.digits = DigitsDataModule(image_size=image_size, mean=mean, std=std, test_fraction=test_fraction,
                                       split_seed=split_seed, augment=augment_images, degrees=degrees,
                                       translate=translate, val_share=val_share)
        self.val_share = val_share
        self.image_size, self.channels = self.digits.image_size, self.digits.channels
        self.mean, self.std = self.digits.mean, self.digits.std
        self.class_names = list(DIGIT_WORDS)
        self.spectrogram_config = SpectrogramConfig.from_dict(dict(spectrogram or {}))
        self.spec = DigitsCorpusSpec(
            train_voices=tuple(train_voices), held_out_voices=tuple(held_out_voices),
            train_utterances=train_utterances, held_out_utterances=held_out_utterances, min_digits=1, max_digits=1,
            speeds=(int(speeds[0]), int(speeds[1])), pitches=(int(pitches[0]), int(pitches[1])),
            sample_rate=self.spectrogram_config.sample_rate, seed=corpus_seed)
        self.same_fraction, self.train_pairs, self.held_out_pairs = same_fraction, train_pairs, held_out_pairs
        self.augment_audio, self.seed, self.cache_dir = augment_audio, seed, cache_dir

    def prepare_data(self) -> None:
        """Synthesise the single-digit corpus once (cached)."""
        spoken_digits_corpus(self.spec, self.cache_dir)

    def spoken(self, split: str) -> tuple[list[Tensor], list[int], list[str]]:
        """The corpus split ("train" / "held_out") as frames, digits and audio paths."""
        corpus = spoken_digits_corpus(self.spec, self.cache_dir)
        tokenizer = SpectrogramTokenizer(self.spectrogram_config)
        rows = read_manifest(corpus / f"{split}.jsonl")
        return ([tokenizer.features(u.audio_filepath) for u in rows], [DIGIT_WORDS.index(u.text) for u in rows],
                [str(u.audio_filepath) for u in rows])

    def held_out_utterance_parts(self, digits: Sequence[int]) -> tuple[list[int], list[int]]:
        """(validation, test) row indices of the held-out utterances: each digit's utterances
        alternately (`validation_rows` with ``val_share``), so both parts hold every digit."""
        val, test = [], []
        for d in range(10):
            rows = [i for i, digit in enumerate(digits) if digit == d]
            for i, validates in zip(rows, validation_rows([d] * len(rows), self.val_share)):
                (val if validates else test).append(i)
        return sorted(val), sorted(test)

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        self.digits.setup(stage)
        images, labels = self.digits.images()
        train = torch.from_numpy(self.digits.train_indices)  # type: ignore[arg-type]
        normalize = v2.Normalize(self.mean, self.std)
        train_transform = (v2.Compose([augmentation(self.digits.degrees, self.digits.translate), normalize])
                           if self.digits.augment else normalize)
        train_frames, train_digits, _ = self.spoken("train")
        held_frames, held_digits, _ = self.spoken("held_out")
        self.train_set = ImageAudioPairs(images[train], labels[train], train_frames, train_digits, self.train_pairs,
                                         self.same_fraction, self.seed, train_transform,
                                         SpecAugment() if self.augment_audio else None)
        # The held-out sets: normalised once, pairs fixed by seeds of their own; validation and
        # test pairs share no scan and no utterance.
        val_rows, test_rows = self.held_out_utterance_parts(held_digits)
        parts = (("val_set", self.digits.val_indices, val_rows, self.seed + 1),
                 ("test_set", self.digits.test_indices, test_rows, self.seed + 2))
        for name, scans, rows, seed in parts:
            if not len(scans) or not rows:  # val_share=1.0: no test part
                continue
            held = torch.from_numpy(scans)
            setattr(self, name, ImageAudioPairs(normalize(images[held]), labels[held], [held_frames[i] for i in rows],
                                                [held_digits[i] for i in rows], self.held_out_pairs,
                                                self.same_fraction, seed))

    def data_key(self) -> str:
        """The spoken corpus's spec and synthesis version (as `SpokenDigitsDataModule`'s key), the
        scans' key (`DigitsDataModule.data_key`) and the training utterances' digits. Not the
        frames: their floats round differently from one CPU to another."""
        train: ImageAudioPairs = self.dataset("train")  # type: ignore[assignment]
        return self._content_key_of(train, lambda: (self.spec.key(), self.digits.data_key(), train.audio_digits))

    def collate_fn(self, split: str) -> Any:
        return collate_pairs


class AudioImageFiles(Dataset):
    """(audio file, image file) pairs read on access: log-mel frames and a normalised image."""

    def __init__(self, pairs: Sequence[tuple[Path, Path]], tokenizer: SpectrogramTokenizer, mode: str,
                 transform: Any) -> None:
        self.pairs, self.tokenizer, self.mode, self.transform = list(pairs), tokenizer, mode, transform

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, index: int) -> dict[str, Any]:
        audio, image = self.pairs[index]
        try:
            with Image.open(image) as im:
                pixels = v2.functional.pil_to_tensor(im.convert(self.mode))
        except (UnidentifiedImageError, OSError) as error:
            raise ValueError(f"cannot read image {image}: {error}") from error
        return {"pixel_values": self.transform(pixels), "features": self.tokenizer.features(audio), "labels": 1}


def read_audio_image_pairs(path: Path, audio_key: str = "audio", image_key: str = "image") -> list[tuple[Path, Path]]:
    """(audio, image) rows of a JSONL / CSV manifest (relative paths from its folder); missing keys
    and missing files are errors naming the row."""
    pairs = []
    for n, row in enumerate(read_rows(path), 1):
        missing = [k for k in (audio_key, image_key) if k not in row]
        if missing:
            raise ValueError(f"{path} row {n} lacks {missing}; it has {sorted(row)} (set audio_key / image_key)")
        pairs.append((row_file(path, row, n, audio_key), row_file(path, row, n, image_key)))
    if not pairs:
        raise ValueError(f"{path} has no audio–image rows")
    return pairs


def linked_groups(pairs: Sequence[tuple[Path, Path]]) -> dict[tuple[Path, Path], tuple[str, Path]]:
    """Each (audio, image) pair's group: pairs that share an audio file or an image (files compared
    resolved), directly or through other pairs, are one group, so a split that keeps groups whole
    shares no file between its parts. Without shared audio the groups are the images."""
    sets = DisjointSets()
    nodes = {pair: (("audio", pair[0].resolve()), ("image", pair[1].resolve())) for pair in pairs}
    for audio, image in nodes.values():
        sets.join(image, audio)
    return {pair: sets.root(image) for pair, (_, image) in nodes.items()}  # type: ignore[misc]


class AudioImageManifestDataModule(SplitDataModule):
    """Users' (audio, image) pairs for binding speech to images: a JSONL / CSV manifest with one
    ``{"audio": path, "image": path}`` per line. Images are converted to ``channels``, resized
    (short side) and centre-cropped to ``image_size`` and normalised; audio becomes log-mel
    frames with ``spectrogram`` settings. Validation: ``val_manifest`` or a seeded
    ``val_fraction`` of the training rows (rows that share an image or an audio file are held out
    together, `linked_groups`). Test: ``test_manifest`` when given (else
    ``unitok test`` scores the validation pairs).
    """

    def __init__(
        self,
        train_manifest: str | None = None,
        val_manifest: str | None = None,
        audio_key: str = "audio",
        image_key: str = "image",
        image_size: int | tuple[int, int] = 224,
        channels: int = 3,
        mean: float | tuple[float, ...] = 0.5,
        std: float | tuple[float, ...] = 0.5,
        spectrogram: dict[str, Any] | None = None,
        val_fraction: float = 0.1,
        split_seed: int = 0,
        batch_size: int = 64,
        num_workers: int = 0,
        test_manifest: str | None = None,
    ) -> None:
        if batch_size < 2:
            raise ValueError(f"contrastive training needs batch_size ≥ 2 (negatives), got {batch_size}")
        super().__init__(batch_size, num_workers)
        if train_manifest is None:
            raise ValueError("AudioImageManifestDataModule needs train_manifest: a JSONL/CSV of {audio, image} rows")
        if channels not in (1, 3):
            raise ValueError(f"channels must be 1 (grey) or 3 (RGB), got {channels}")
        self.image_size, self.channels = _square(image_size), channels
        self.mean, self.std = _stats(mean, channels, "mean"), _stats(std, channels, "std")
        self.spectrogram_config = SpectrogramConfig.from_dict(dict(spectrogram or {}))
        self.train_pairs = read_audio_image_pairs(Path(train_manifest), audio_key, image_key)
        if val_manifest is not None:
            self.val_pairs = read_audio_image_pairs(Path(val_manifest), audio_key, image_key)
        else:  # pairs that share an image or an audio file stay together
            groups = linked_groups(self.train_pairs)
            self.train_pairs, self.val_pairs = hold_out(self.train_pairs, val_fraction, split_seed, groups.__getitem__,
                                                        "groups of pairs linked by a shared image or audio file")
        self.test_pairs = (read_audio_image_pairs(Path(test_manifest), audio_key, image_key)
                           if test_manifest is not None else None)
        splits = {"the training pairs": self.train_pairs, "the validation pairs": self.val_pairs,
                  "the test pairs": self.test_pairs}
        check_disjoint(splits, lambda pair: pair[1].resolve(), "image")
        check_disjoint(splits, lambda pair: pair[0].resolve(), "audio file")

    def _dataset(self, pairs: Sequence[tuple[Path, Path]]) -> AudioImageFiles:
        transform = v2.Compose([v2.Resize(min(self.image_size), antialias=True), v2.CenterCrop(self.image_size),
                                v2.ToDtype(torch.float32, scale=True), v2.Normalize(self.mean, self.std)])
        return AudioImageFiles(pairs, SpectrogramTokenizer(self.spectrogram_config),
                               "L" if self.channels == 1 else "RGB", transform)

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is None:
            self.train_set, self.val_set = self._dataset(self.train_pairs), self._dataset(self.val_pairs)
            if self.test_pairs is not None:
                self.test_set = self._dataset(self.test_pairs)

    def collate_fn(self, split: str) -> Any:
        return collate_pairs
