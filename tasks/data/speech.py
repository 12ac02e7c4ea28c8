"""Speech recognition data: users' JSONL manifests, or the built-in spoken digits synthesised
with espeak-ng's library (bundled by a PyPI wheel, see `tasks.data.espeak`).

Both modules yield ``{"features": (B, N, F) normalised log-mel frames padded with 0,
"feature_lengths": (B,), "targets": (B, L) character ids padded with 0, "target_lengths": (B,),
"texts": list[str]}`` batches, and expose ``vocabulary`` (a `CharacterVocabulary`, blank = 0)
and ``spectrogram_config`` (a `SpectrogramConfig`) for the task's model. Utterances are read
and turned into frames in the data loader (workers); SpecAugment applies to training only.
Batches are drawn from pools of similar durations (length bucketing), so little is padding.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import shutil
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Sampler, SequentialSampler

from tasks.data.base import Split, SplitDataModule, default_cache_dir
from tasks.data.sampling import (
    ResumableBatchSampler,
    ResumePoint,
    SeededRandomSampler,
    held_out_generator,
    resumable_loader,
)
from tokenizers_mm import (
    CharacterVocabulary,
    SpecAugment,
    SpectrogramConfig,
    SpectrogramTokenizer,
    WaveAugment,
)
from tokenizers_mm.checks import check_int, check_number

DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
# espeak-ng voices are "<accent>+<variant>" ("en" is British English). Training uses five accents
# with seven variants (four male, three female); the held-out voices use variants (timbres) that
# never occur in training, nor any near-copy of them (`NEAR_HELD_OUT_VARIANTS`: the standard set
# had f1 and f2, within 10 % of the held-out f5's formants, until linda and grandma replaced them).
ACCENTS = ("en-us", "en", "en-gb-scotland", "en-029", "en-gb-x-rp")
TRAIN_VARIANTS = ("m1", "m2", "m3", "m6", "f4", "linda", "grandma")
TRAIN_VOICES = tuple(f"{accent}+{variant}" for accent in ACCENTS for variant in TRAIN_VARIANTS)
HELD_OUT_VOICES = ("en-us+m4", "en+f3", "en-gb-scotland+m7", "en-029+f5", "en-gb-x-rp+m5")
# voices="every": each English accent espeak-ng 1.52 has × each voice variant it ships
# (espeak-ng-data/voices/!v: the numbered m/f timbres, named characters, the Klatt-synthesis,
# robotic, whispered and croaky variants), less the held-out voices' variants, so held-out
# timbres stay unheard.
EVERY_ACCENT = ACCENTS + ("en-gb-x-gbclan", "en-gb-x-gbcwmd", "en-us-nyc")
EVERY_VARIANT = (
    "Alex", "Alicia", "Andrea", "Andy", "Annie", "AnxiousAndy", "Demonic", "Denis", "Diogo", "Gene", "Gene2",
    "Henrique", "Hugo", "Jacky", "Lee", "Marco", "Mario", "Michael", "Mike", "Mr serious", "Nguyen", "Reed",
    "RicishayMax", "RicishayMax2", "RicishayMax3", "Storm", "Tweaky", "UniRobot", "adam", "anika", "anikaRobot",
    "announcer", "antonio", "aunty", "belinda", "benjamin", "boris", "caleb", "croak", "david", "ed", "edward",
    "edward2", "f1", "f2", "f3", "f4", "f5", "fast", "grandma", "grandpa", "gustave", "ian", "iven", "iven2",
    "iven3", "iven4", "john", "kaukovalta", "klatt", "klatt2", "klatt3", "klatt4", "klatt5", "klatt6", "linda",
    "m1", "m2", "m3", "m4", "m5", "m6", "m7", "m8", "marcelo", "max", "michel", "miguel", "mike2", "norbert",
    "pablo", "paul", "pedro", "quincy", "rob", "robert", "robosoft", "robosoft2", "robosoft3", "robosoft4",
    "robosoft5", "robosoft6", "robosoft7", "robosoft8", "sandro", "shelby", "steph", "steph2", "steph3", "travis",
    "victor", "whisper", "whisperf", "zac")
# Variants whose formant tables (espeak-ng-data/voices/!v) lie within 10 % of a held-out variant's
# at every formant: near-copies of a held-out timbre (f2 and whisperf share f5's frequencies,
# Nguyen is m7's within 4 %, john m4's within 6 %), so neither voice set trains on them.
NEAR_HELD_OUT_VARIANTS = ("f1", "f2", "whisperf", "john", "pedro", "Nguyen")
EVERY_TRAIN_VOICES = tuple(f"{accent}+{variant}" for accent in EVERY_ACCENT for variant in EVERY_VARIANT
                           if variant not in {v.split("+")[1] for v in HELD_OUT_VOICES} | set(NEAR_HELD_OUT_VARIANTS))
VOICE_SETS = {"standard": TRAIN_VOICES, "every": EVERY_TRAIN_VOICES}
# train_intonation=True: how a digit string is punctuated for espeak-ng (statement, question,
# exclamation, a list read with commas); the transcript is the digits alone.
INTONATIONS = ("{}", "{}.", "{}?", "{}!", "list")
CACHE_ENV = "UNITOK_SPOKEN_DIGITS_DIR"
# Part of the cache key: bump when synthesis changes what the same spec produces.
# 3: espeak-ng 1.52 from the espeakng-loader wheel, a fresh engine per utterance (was: the Debian binary).
CORPUS_VERSION = 3
SILENCE = 1e-4  # |sample| below this is espeak-ng's silence


# ---------------------------------------------------------------------------- manifests


@dataclass(frozen=True)
class Utterance:
    """One row of a manifest: an audio file, its transcript and its duration in seconds."""

    audio_filepath: Path
    text: str
    duration: float


def read_manifest(path: str | Path, lowercase: bool = False) -> list[Utterance]:
    """A JSONL manifest (one ``{"audio_filepath", "text", "duration"}`` object a line, NeMo's
    format, UTF-8 whatever the locale) -> utterances. Relative audio paths are taken from the
    manifest's folder; a missing ``duration`` is read from the file's header. Bad rows are errors
    naming the line."""
    import soundfile

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"manifest {path} does not exist")
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1):  # not at U+2028 in a transcript
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{n} is not JSON: {error}; a manifest is one JSON object per line "
                             "(JSONL)") from error
        if not isinstance(row, dict):  # e.g. a JSON array of the rows on one line
            kind = {list: "array", str: "string", int: "number", float: "number", bool: "boolean"}.get(type(row), "null")
            raise ValueError(f"{path}:{n} is a JSON {kind}, not an object; a manifest is one JSON object per line "
                             "(JSONL)")
        missing = [k for k in ("audio_filepath", "text") if k not in row]
        if missing:
            raise ValueError(f"{path}:{n} lacks {missing}; a manifest row needs audio_filepath, text "
                             f"(and duration), it has {sorted(row)}")
        text = row["text"]
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"{path}:{n} has an empty or non-string text {text!r}")
        audio = Path(row["audio_filepath"])
        audio = audio if audio.is_absolute() else path.parent / audio
        if not audio.is_file():
            raise FileNotFoundError(f"{path}:{n}: audio file {audio} does not exist")
        duration = row.get("duration")
        if duration is None:
            duration = soundfile.info(str(audio)).duration
        duration = check_number(f"{path}:{n} duration (seconds)", duration, 0.0, low_open=True)  # not true, NaN, inf
        rows.append(Utterance(audio, text.lower() if lowercase else text, duration))
    if not rows:
        raise ValueError(f"manifest {path} has no utterances")
    return rows


def write_manifest(path: str | Path, rows: Sequence[dict[str, Any]]) -> Path:
    """Write manifest rows as UTF-8 JSONL (audio paths as given: relative ones are read from
    ``path``'s folder)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


# ---------------------------------------------------------------------------- datasets and batches


class SpeechDataset(Dataset):
    """Utterances read from disk and turned into (N, F) frames on access; ``augment`` (SpecAugment)
    and ``wave_augment`` (`WaveAugment`: acoustic conditions, and no-speech clips whose
    transcript is "") for training. Each item: ``{"features", "targets", "text"}``. With a
    ``cache`` dict, each file's frames are computed once and kept there (SpecAugment still masks
    a fresh copy; with ``wave_augment`` the frames are new every time and nothing is cached)."""

    def __init__(self, utterances: Sequence[Utterance], tokenizer: SpectrogramTokenizer,
                 vocabulary: CharacterVocabulary, augment: SpecAugment | None = None,
                 cache: dict[str, Tensor] | None = None, wave_augment: WaveAugment | None = None) -> None:
        self.utterances, self.tokenizer, self.vocabulary, self.augment = list(utterances), tokenizer, vocabulary, augment
        self.cache, self.wave_augment = cache, wave_augment

    def __len__(self) -> int:
        return len(self.utterances)

    @property
    def durations(self) -> list[float]:
        return [u.duration for u in self.utterances]

    def item_id(self, index: int) -> str:
        """The audio file of item ``index`` (how `tasks.PredictionWriter` names it)."""
        return str(self.utterances[index].audio_filepath)

    def __getitem__(self, index: int) -> dict[str, Any]:
        utterance = self.utterances[index]
        if self.wave_augment is not None:
            # A waveform as the speaker left it: `WaveBatches` records the batch and makes frames.
            rate = self.tokenizer.config.sample_rate
            if self.wave_augment.draw_no_speech():  # as long as the utterance: the batch keeps its length
                return {"wave": self.wave_augment.no_speech(rate, seconds=utterance.duration), "text": ""}
            return {"wave": self.wave_augment.speaker(self.tokenizer.load(utterance.audio_filepath), rate),
                    "text": utterance.text}
        frames = self._frames(utterance)
        if self.augment is not None:
            frames = self.augment(frames)
        return {"features": frames, "targets": self.vocabulary.encode(utterance.text), "text": utterance.text}

    def _frames(self, utterance: Utterance) -> Tensor:
        key = str(utterance.audio_filepath)
        if self.cache is not None and key in self.cache:
            return self.cache[key]
        frames = self.tokenizer.features(utterance.audio_filepath)
        if self.cache is not None:
            self.cache[key] = frames
        return frames


def collate_speech(items: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Pad frames with 0 and targets with 0 (the blank, never a target) into one batch."""
    pad = torch.nn.utils.rnn.pad_sequence
    return {
        "features": pad([it["features"] for it in items], batch_first=True),  # (B, N, F)
        "feature_lengths": torch.tensor([it["features"].shape[0] for it in items], dtype=torch.long),
        "targets": pad([it["targets"] for it in items], batch_first=True, padding_value=0),  # (B, L)
        "target_lengths": torch.tensor([len(it["targets"]) for it in items], dtype=torch.long),
        "texts": [it["text"] for it in items],
    }


class WaveBatches:
    """Collate for training with a `WaveAugment`: the items' waveforms (``{"wave", "text"}``)
    are recorded together (`WaveAugment.batch`: silence to a common length, noise, channel,
    loudness), turned into frames (each with its own vocal-tract warp, `WaveAugment.draw_warp`),
    masked by SpecAugment and padded like `collate_speech`.
    Picklable, so it runs in data-loader workers."""

    def __init__(self, tokenizer: SpectrogramTokenizer, vocabulary: CharacterVocabulary, wave_augment: WaveAugment,
                 spec_augment: SpecAugment | None = None) -> None:
        self.tokenizer, self.vocabulary = tokenizer, vocabulary
        self.wave_augment, self.spec_augment = wave_augment, spec_augment

    def __call__(self, items: Sequence[dict[str, Any]]) -> dict[str, Any]:
        rate = self.tokenizer.config.sample_rate
        waves = self.wave_augment.batch([it["wave"] for it in items], rate)
        out = []
        for wave, item in zip(waves, items):
            frames = self.tokenizer.features(wave, rate, warp=self.wave_augment.draw_warp())
            if self.spec_augment is not None:
                frames = self.spec_augment(frames)
            out.append({"features": frames, "targets": self.vocabulary.encode(item["text"]), "text": item["text"]})
        return collate_speech(out)


class BucketBatchSampler(ResumableBatchSampler):
    """Batches of utterances of similar length: indices from ``sampler`` are taken in pools of
    ``pool_batches`` batches, each pool sorted by length and cut into batches, and (with
    ``shuffle``) the batches are served in an order drawn from (seed, epoch, pass).

    A `BatchSampler` with a ``sampler`` argument, so Lightning can put a `DistributedSampler`
    in its place (each device then buckets its own share); a `ResumableBatchSampler`, so a
    resumed run reads on from its ``resume`` point.
    """

    def __init__(self, sampler: Sampler[int] | Sequence[int], batch_size: int, drop_last: bool,
                 lengths: Sequence[float], pool_batches: int = 32, shuffle: bool = True, seed: int = 0,
                 resume: ResumePoint | None = None) -> None:
        super().__init__(sampler, batch_size, drop_last, seed, resume)
        check_int("pool_batches", pool_batches)
        self.lengths, self.pool_batches, self.shuffle = list(lengths), pool_batches, shuffle

    def pass_batches(self, generator: torch.Generator) -> Iterator[list[int]]:
        indices = list(self.sampler)
        if self.drop_last:  # the remainder dropped in the sampler's (random) order, as a BatchSampler's:
            # cut after sorting, it would be the longest utterances, left out of every epoch
            indices = indices[: len(indices) - len(indices) % self.batch_size]
        pool = self.batch_size * self.pool_batches
        batches = []
        for start in range(0, len(indices), pool):
            chunk = sorted(indices[start:start + pool], key=lambda i: self.lengths[i])
            batches += [chunk[i:i + self.batch_size] for i in range(0, len(chunk), self.batch_size)]
        if self.shuffle:
            order = torch.randperm(len(batches), generator=generator).tolist()
            batches = [batches[i] for i in order]
        yield from batches

    def __len__(self) -> int:
        full, rest = divmod(len(self.sampler), self.batch_size * self.pool_batches)  # type: ignore[arg-type]
        last = rest // self.batch_size if self.drop_last else math.ceil(rest / self.batch_size)
        return full * self.pool_batches + last


# ---------------------------------------------------------------------------- data modules


class SpeechDataModule(SplitDataModule):
    """Shared pieces: the spectrogram tokenizer, SpecAugment, the vocabulary and length-bucketed
    loaders.

    Subclasses fill ``train_utterances`` / ``val_utterances`` (and ``test_utterances``) and
    ``vocabulary`` in ``setup``.
    """

    vocabulary: CharacterVocabulary | None = None

    def __init__(self, spectrogram: dict[str, Any] | None, batch_size: int, num_workers: int, augment: bool,
                 freq_masks: int, freq_width: int, time_masks: int, time_width: int, bucketing: bool,
                 pool_batches: int, cache_features: bool = False,
                 wave_augment: bool | dict[str, Any] = False) -> None:
        super().__init__(batch_size, num_workers)
        self.spectrogram = dict(spectrogram or {})
        self.spectrogram_config = _global_pending(self.spectrogram) or SpectrogramConfig.from_dict(self.spectrogram)
        self.spec_augment = SpecAugment(freq_masks, freq_width, time_masks, time_width) if augment else None
        if not isinstance(wave_augment, (bool, dict)):
            raise TypeError(f"wave_augment must be true / false or a dict of WaveAugment options, got {wave_augment!r}")
        self.wave_augment = (WaveAugment(**wave_augment) if isinstance(wave_augment, dict)
                             else WaveAugment() if wave_augment else None)
        self.bucketing, self.pool_batches = bucketing, pool_batches
        # Frames by file, computed once (built-in data: ~100 MB for 2,300 utterances).
        self.frames_cache: dict[str, Tensor] | None = {} if cache_features else None
        self.train_utterances: list[Utterance] = []
        self.val_utterances: list[Utterance] = []
        self.test_utterances: list[Utterance] | None = None

    @property
    def tokenizer(self) -> SpectrogramTokenizer:
        return SpectrogramTokenizer(self.spectrogram_config)

    def _finish_setup(self) -> None:
        """Fit global statistics when asked for, and check every transcript against the vocabulary."""
        if self.vocabulary is None:
            raise RuntimeError("setup must set the vocabulary")
        if self.spectrogram.get("normalize") == "global" and self.spectrogram.get("global_mean") is None:
            probe = SpectrogramTokenizer(self.spectrogram_config)
            rank_zero_info(f"computing global log-mel statistics over {len(self.train_utterances)} utterances")
            mean, std = probe.global_stats(u.audio_filepath for u in self.train_utterances)
            self.spectrogram = {**self.spectrogram, "global_mean": mean, "global_std": std}
            self.spectrogram_config = SpectrogramConfig.from_dict(self.spectrogram)
        for name, rows in (("validation", self.val_utterances), ("test", self.test_utterances or [])):
            missing = sorted({c for u in rows for c in self.vocabulary.unknown(u.text)})
            if missing:
                raise ValueError(f"the {name} transcripts have characters {missing} that the vocabulary "
                                 f"{''.join(self.vocabulary.chars)!r} lacks (it was built from the training "
                                 "transcripts); pass vocabulary=[...] listing every character")

    def dataset(self, split: Split) -> SpeechDataset | None:
        """The split's utterances, read into frames on access (SpecAugment on training only)."""
        if not self.train_utterances:
            self.setup("fit")
        rows = {"train": self.train_utterances, "val": self.val_utterances, "test": self.test_utterances}[split]
        if rows is None:
            return None
        train = split == "train"
        augment = self.spec_augment if train and self.wave_augment is None else None  # else: in WaveBatches
        return SpeechDataset(rows, self.tokenizer, self.vocabulary, augment,  # type: ignore[arg-type]
                             self.frames_cache, self.wave_augment if train else None)

    def collate_fn(self, split: Split) -> Any:
        if split == "train" and self.wave_augment is not None:
            return WaveBatches(self.tokenizer, self.vocabulary, self.wave_augment,  # type: ignore[arg-type]
                               self.spec_augment)
        return collate_speech

    def loader(self, split: Split) -> DataLoader:
        """Batches of utterances of similar duration (`BucketBatchSampler`) unless ``bucketing`` is off."""
        if split == "train" and len(self.dataset("train")) < self.batch_size:  # type: ignore[arg-type]
            # the training loader drops its partial batch
            raise ValueError(f"{len(self.train_utterances)} training utterances are fewer than batch_size="
                             f"{self.batch_size}: an epoch would have no batch (training would stop at once); "
                             "add utterances or lower batch_size")
        if not self.bucketing:
            return super().loader(split)
        dataset = self.dataset(split)
        if dataset is None:  # no test rows: the held-out "val" split is the test set too
            dataset = self.dataset("val")
        lengths = dataset.durations  # type: ignore[union-attr]
        if split == "train":
            seed = self.train_seed()
            batches = BucketBatchSampler(SeededRandomSampler(dataset, seed), self.batch_size, drop_last=True,  # type: ignore[arg-type]
                                         lengths=lengths, pool_batches=self.pool_batches, seed=seed,
                                         resume=self.take_resume_point())
            return resumable_loader(dataset, batches, self.collate_fn(split), self.num_workers)  # type: ignore[arg-type]
        batches = BucketBatchSampler(SequentialSampler(dataset), self.batch_size, drop_last=False,  # type: ignore[arg-type]
                                     lengths=lengths, pool_batches=self.pool_batches, shuffle=False)
        return DataLoader(dataset, batch_sampler=batches, num_workers=self.num_workers,  # type: ignore[arg-type]
                          persistent_workers=self.num_workers > 0, collate_fn=collate_speech,
                          generator=held_out_generator())

    def predict_dataloader(self) -> DataLoader:
        return self.loader("test")


def _global_pending(spectrogram: dict[str, Any]) -> SpectrogramConfig | None:
    """normalize="global" without statistics: a placeholder config until they are computed in setup."""
    if spectrogram.get("normalize") == "global" and spectrogram.get("global_mean") is None:
        return SpectrogramConfig.from_dict({**spectrogram, "normalize": "none"})
    return None


class ManifestDataModule(SpeechDataModule):
    """Users' speech: JSONL manifests of ``{"audio_filepath", "text", "duration"}`` rows.

    The vocabulary is built from the training transcripts unless ``vocabulary`` lists the
    characters (needed to fine-tune a model whose vocabulary is fixed). Without
    ``val_manifest``, a seeded ``val_fraction`` of the training rows is held out.

    Args:
        train_manifest / val_manifest / test_manifest: JSONL files (relative audio paths are
            read from the manifest's folder).
        val_fraction / split_seed: the held-out split when there is no ``val_manifest``.
        vocabulary: the characters, in id order (ids 1..; 0 is the blank).
        lowercase: lowercase every transcript. max_duration: drop longer training utterances.
        spectrogram: `SpectrogramConfig` fields; ``normalize: global`` without statistics
            computes them over the training audio.
        batch_size / num_workers: data loading. bucketing / pool_batches: length bucketing.
        augment / freq_masks / freq_width / time_masks / time_width: SpecAugment (training only).
        wave_augment: acoustic conditions for training (`tokenizers_mm.WaveAugment`): false,
            true (its defaults) or a dict of its options.
    """

    def __init__(
        self,
        train_manifest: str | None = None,
        val_manifest: str | None = None,
        test_manifest: str | None = None,
        val_fraction: float = 0.1,
        split_seed: int = 0,
        vocabulary: list[str] | None = None,
        lowercase: bool = False,
        max_duration: float | None = None,
        spectrogram: dict[str, Any] | None = None,
        batch_size: int = 16,
        num_workers: int = 0,
        bucketing: bool = True,
        pool_batches: int = 32,
        augment: bool = True,
        freq_masks: int = 2,
        freq_width: int = 15,
        time_masks: int = 2,
        time_width: int = 25,
        wave_augment: bool | dict[str, Any] = False,
    ) -> None:
        super().__init__(spectrogram, batch_size, num_workers, augment, freq_masks, freq_width, time_masks,
                         time_width, bucketing, pool_batches, wave_augment=wave_augment)
        if train_manifest is None:
            raise ValueError("ManifestDataModule needs train_manifest: a JSONL file of {audio_filepath, text, "
                             "duration} rows (--data.train_manifest PATH)")
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
        self.train_manifest = Path(train_manifest)
        self.val_manifest = Path(val_manifest) if val_manifest else None
        self.test_manifest = Path(test_manifest) if test_manifest else None
        self.val_fraction, self.split_seed, self.lowercase, self.max_duration = (val_fraction, split_seed, lowercase,
                                                                                max_duration)
        self.fixed_vocabulary = CharacterVocabulary(vocabulary) if vocabulary else None
        # Read now: a bad manifest fails at construction, and the vocabulary is known before fitting.
        self._read()

    def _read(self) -> None:
        train = read_manifest(self.train_manifest, self.lowercase)
        if self.val_manifest is not None:
            val = read_manifest(self.val_manifest, self.lowercase)
        else:
            if len(train) < 2:
                raise ValueError(f"{self.train_manifest} has one utterance; holding some out needs ≥ 2 "
                                 "(or give val_manifest)")
            order = list(range(len(train)))
            random.Random(self.split_seed).shuffle(order)
            n_val = max(1, round(self.val_fraction * len(train)))
            if n_val >= len(train):
                raise ValueError(f"val_fraction={self.val_fraction} holds out all {len(train)} utterances of "
                                 f"{self.train_manifest}, leaving none to train on (lower it, or give val_manifest)")
            val, train = [train[i] for i in sorted(order[:n_val])], [train[i] for i in sorted(order[n_val:])]
        if self.max_duration is not None:
            kept = [u for u in train if u.duration <= self.max_duration]
            if len(kept) < len(train):
                rank_zero_info(f"dropped {len(train) - len(kept)} training utterances longer than "
                               f"{self.max_duration} s")
            if not kept:
                raise ValueError(f"every training utterance is longer than max_duration={self.max_duration} s")
            train = kept
        self.train_utterances, self.val_utterances = train, val
        self.test_utterances = read_manifest(self.test_manifest, self.lowercase) if self.test_manifest else None
        if self.fixed_vocabulary is not None:
            self.vocabulary = self.fixed_vocabulary
            missing = sorted({c for u in train for c in self.vocabulary.unknown(u.text)})
            if missing:
                raise ValueError(f"the training transcripts have characters {missing} that the given vocabulary "
                                 f"{''.join(self.vocabulary.chars)!r} lacks")
        else:
            self.vocabulary = CharacterVocabulary.build(u.text for u in train)
        self._finish_setup()

    def data_key(self) -> str:
        """A hash of the vocabulary and of the training transcripts and durations (which make the
        batches): built from those transcripts (no ``vocabulary`` given), the vocabulary moves every
        id after a character that a manifest gains or loses, and a model resumed on it would read
        its outputs as other characters. The audio is not read: moved files keep the key."""
        train = self.train_utterances
        return self._content_key_of(train, lambda: (self.vocabulary.chars,  # type: ignore[union-attr]
                                                    [(u.text, u.duration) for u in train]))

    def setup(self, stage: str | None = None) -> None:
        """Everything was read at construction; nothing is left to do per stage."""


# ---------------------------------------------------------------------------- spoken digits


def validation_rows(groups: Sequence[Hashable], val_share: float) -> list[bool]:
    """Which held-out rows validate (True) and which are test rows (False), given each row's group
    in order (its voice, its digit). Each group's rows are cut on their own, so every group of
    two rows or more is in both parts: a group's j-th row validates when it brings the running
    count up to ⌈(j + s + 1)·val_share⌉, staggered by the group's order of appearance s — with 0.5
    its rows alternate, and round-robin voices of an odd count cut exactly as alternate rows; 1.0:
    every row."""
    def quota(k: int) -> int:
        return math.ceil(k * val_share - 1e-9)
    order: dict[Hashable, int] = {}
    seen: dict[Hashable, int] = {}
    validates = []
    for group in groups:
        s = order.setdefault(group, len(order))
        j = seen[group] = seen.get(group, -1) + 1
        validates.append(quota(j + s + 1) > quota(j + s))
    return validates


def spoken_digits_dir(cache_dir: str | Path | None = None) -> Path:
    """``<cache_dir>/spoken_digits``; with no ``cache_dir``, ``$UNITOK_SPOKEN_DIGITS_DIR`` or the
    shared cache's (`tasks.data.base.default_cache_dir`)."""
    if cache_dir is not None:
        return Path(cache_dir) / "spoken_digits"
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return default_cache_dir() / "spoken_digits"


def synthesize(text: str, voice: str, speed: int, pitch: int, sample_rate: int = 16000,
               word_gap: int = 0, margin: float | None = 0.1, pitch_range: int | None = None) -> np.ndarray:
    """Speak ``text`` with espeak-ng -> a float32 mono waveform at ``sample_rate``.

    ``speed`` in words per minute, ``pitch`` 0–99, ``word_gap`` extra pause between words in 10 ms,
    ``pitch_range`` 0–100 how much the intonation moves the pitch (None: the voice's own).
    ``margin``: keep this many seconds of silence before and after the speech (espeak-ng ends
    every utterance with ~0.4 s of it, a fifth of the frames); None keeps all.
    """
    import torchaudio

    from tasks.data import espeak

    wave, rate = espeak.speak(text, voice, rate=speed, pitch=pitch, word_gap=word_gap, pitch_range=pitch_range)
    wave = torch.from_numpy(wave)
    if rate != sample_rate:
        wave = torchaudio.functional.resample(wave, rate, sample_rate)
    wave = wave.numpy()
    if margin is not None:
        voiced = np.flatnonzero(np.abs(wave) > SILENCE)
        if len(voiced):
            keep = int(margin * sample_rate)
            wave = wave[max(0, voiced[0] - keep): voiced[-1] + 1 + keep]
    return wave


@dataclass(frozen=True)
class DigitsCorpusSpec:
    """What the synthesised corpus holds; its hash names the cache folder."""

    train_voices: tuple[str, ...] = TRAIN_VOICES
    held_out_voices: tuple[str, ...] = HELD_OUT_VOICES
    train_utterances: int = 2100
    held_out_utterances: int = 200
    min_digits: int = 1
    max_digits: int = 5
    speeds: tuple[int, int] = (130, 200)
    pitches: tuple[int, int] = (30, 70)
    max_word_gap: int = 3
    sample_rate: int = 16000
    seed: int = 0
    train_speeds: tuple[int, int] | None = None
    train_pitches: tuple[int, int] | None = None
    train_pitch_ranges: tuple[int, int] | None = None
    train_intonation: bool = False
    unheard_strings: bool = False

    def __post_init__(self) -> None:
        for name in ("speeds", "pitches", "train_speeds", "train_pitches", "train_pitch_ranges"):
            value = getattr(self, name)
            if value is not None:  # YAML / JSON give lists
                object.__setattr__(self, name, (int(value[0]), int(value[1])))
        if self.train_pitch_ranges is not None and not 0 <= self.train_pitch_ranges[0] <= self.train_pitch_ranges[1] <= 100:
            raise ValueError(f"train_pitch_ranges must lie in 0..100, got {self.train_pitch_ranges}")
        for speeds, pitches in ((self.speeds, self.pitches), (self.train_speeds or self.speeds,
                                                              self.train_pitches or self.pitches)):
            if not (80 <= speeds[0] <= speeds[1] <= 450 and 0 <= pitches[0] <= pitches[1] <= 99):
                raise ValueError(f"speeds must lie in 80..450 wpm and pitches in 0..99, got {speeds}, {pitches}")
        if not self.train_voices or not self.held_out_voices:
            raise ValueError("need at least one training and one held-out voice")
        shared = sorted(set(self.train_voices) & set(self.held_out_voices))
        if shared:
            raise ValueError(f"voices {shared} are both training and held-out voices; held-out voices must be unseen")
        if not 1 <= self.min_digits <= self.max_digits:
            raise ValueError(f"need 1 ≤ min_digits ≤ max_digits, got {self.min_digits}, {self.max_digits}")
        if self.train_utterances < 1 or self.held_out_utterances < 1:
            raise ValueError("need at least one training and one held-out utterance")

    def key(self) -> str:
        # Options added later count only when set, so the corpora they leave alone keep their caches.
        fields = {k: list(v) if isinstance(v, tuple) else v for k, v in self.__dict__.items()
                  if not (k in _LATER_OPTIONS and v == _LATER_OPTIONS[k])}
        text = json.dumps({**fields, "version": CORPUS_VERSION}, sort_keys=True)
        return hashlib.sha1(text.encode()).hexdigest()[:12]

    def rows(self) -> list[dict[str, Any]]:
        """Every utterance to synthesise: split, voice (round-robin), digits, speed, pitch, gap
        (and for training rows, when asked for, the intonation's pitch range and the
        punctuation it is spoken with). The held-out rows do not depend on the ``train_``
        options."""
        rng = random.Random(self.seed)
        # The train_ options draw from a generator of their own: the main one, and so every
        # held-out row, goes on as it would without them.
        variety = random.Random(f"train-variety-{self.seed}")
        rows = []
        for split, voices, count in (("train", self.train_voices, self.train_utterances),
                                     ("held_out", self.held_out_voices, self.held_out_utterances)):
            train = split == "train"
            for i in range(count):
                n = rng.randint(self.min_digits, self.max_digits)
                row = {
                    "split": split, "index": i, "voice": voices[i % len(voices)],
                    "text": " ".join(rng.choice(DIGIT_WORDS) for _ in range(n)),
                    "speed": rng.randint(*self.speeds), "pitch": rng.randint(*self.pitches),
                    "word_gap": rng.randint(0, self.max_word_gap),
                }
                if train and self.train_speeds is not None:
                    row["speed"] = variety.randint(*self.train_speeds)
                if train and self.train_pitches is not None:
                    row["pitch"] = variety.randint(*self.train_pitches)
                if train and self.train_pitch_ranges is not None:
                    row["pitch_range"] = variety.randint(*self.train_pitch_ranges)
                if train and self.train_intonation:
                    row["spoken"] = punctuate(row["text"], variety.choice(INTONATIONS))
                rows.append(row)
        if self.unheard_strings:
            self._redraw_held_out_strings(rows, random.Random(f"unheard-{self.seed}"))
        return rows

    def _redraw_held_out_strings(self, rows: list[dict[str, Any]], rng: random.Random) -> None:
        """Training rows that would speak a held-out digit string speak another (of any length in
        range: the held-out rows take every one-digit string), so no held-out transcript is ever
        heard in training, in any voice. The held-out rows stay as they were."""
        held_out = {row["text"] for row in rows if row["split"] == "held_out"}
        if sum(10 ** n for n in range(self.min_digits, self.max_digits + 1)) <= len(held_out):
            raise ValueError(f"unheard_strings: the {len(held_out)} held-out strings leave no {self.min_digits}–"
                             f"{self.max_digits}-digit string to train on")
        for row in rows:
            while row["split"] == "train" and row["text"] in held_out:
                n = rng.randint(self.min_digits, self.max_digits)
                row["text"] = " ".join(rng.choice(DIGIT_WORDS) for _ in range(n))
                if "spoken" in row:  # the same intonation, the new words
                    row["spoken"] = _respoken(row["spoken"], row["text"])


_LATER_OPTIONS: dict[str, Any] = {"train_speeds": None, "train_pitches": None, "train_pitch_ranges": None,
                                  "train_intonation": False, "unheard_strings": False}


def _respoken(spoken: str, text: str) -> str:
    """``text`` punctuated as ``spoken`` was (the intonation `punctuate` gave it)."""
    if "," in spoken:
        return punctuate(text, "list")
    return text + (spoken[-1] if spoken[-1] in ".?!" else "")


def punctuate(text: str, intonation: str) -> str:
    """Digit words -> the text espeak-ng speaks: ``intonation`` is a format ("{}?") or "list"
    (commas between the words: a pause and a rising pitch on each)."""
    return ", ".join(text.split()) + "." if intonation == "list" else intonation.format(text)


def spoken_digits_corpus(spec: DigitsCorpusSpec | None = None, cache_dir: str | Path | None = None) -> Path:
    """The corpus folder (``train.jsonl``, ``held_out.jsonl`` and 16-bit wavs), synthesised on
    first use (about 8 ms an utterance) and cached under ``cache_dir`` (default
    `spoken_digits_dir`) in a folder named by the spec's hash."""
    import soundfile

    spec = spec or DigitsCorpusSpec()
    final = spoken_digits_dir(cache_dir) / f"digits-{spec.key()}"
    if (final / "held_out.jsonl").is_file():
        return final
    from tasks.data import espeak

    espeak.check_voices(spec.train_voices + spec.held_out_voices)
    rows = spec.rows()
    rank_zero_info(f"synthesising {len(rows)} spoken-digit utterances with espeak-ng into {final} (once)")
    staging = final.parent / f".{final.name}.{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    for split in ("train", "held_out"):
        (staging / split).mkdir(parents=True)

    def make(row: dict[str, Any]) -> dict[str, Any]:
        wave = synthesize(row.get("spoken", row["text"]), row["voice"], row["speed"], row["pitch"], spec.sample_rate,
                          row["word_gap"], pitch_range=row.get("pitch_range"))
        relative = f"{row['split']}/{row['index']:05d}.wav"
        soundfile.write(str(staging / relative), wave, spec.sample_rate, subtype="PCM_16")
        extra = {k: row[k] for k in ("pitch_range", "spoken") if k in row}
        return {"audio_filepath": relative, "text": row["text"], "duration": round(len(wave) / spec.sample_rate, 4),
                "voice": row["voice"], "speed": row["speed"], "pitch": row["pitch"], **extra}

    try:
        written = [make(row) for row in rows]
        for split in ("train", "held_out"):
            write_manifest(staging / f"{split}.jsonl",
                           [r for r in written if r["audio_filepath"].startswith(split + "/")])
        (staging / "spec.json").write_text(json.dumps(spec.__dict__, indent=2) + "\n", encoding="utf-8")
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    try:
        staging.rename(final)  # atomic: readers see a whole corpus or none
    except OSError:
        if not (final / "held_out.jsonl").is_file():  # not another process's finished copy: a real failure
            raise
        shutil.rmtree(staging, ignore_errors=True)
    return final


class SpokenDigitsDataModule(SpeechDataModule):
    """The built-in speech data: digit strings ("three one four") spoken by espeak-ng (the
    library that the ``espeakng-loader`` wheel bundles) over many voices, speeds (words per minute), pitches and pauses,
    16 kHz, synthesised once and cached on disk.

    Training voices are five English accents × seven voice variants (``voices="every"``: eight
    accents × every variant espeak-ng ships); the held-out utterances are spoken by voices whose
    variants never occur in training, so CER on them measures recognition of unseen speakers.
    They are cut into validation and test rows (each voice's rows
    alternate by default, `validation_rows`: 100 + 100, every held-out voice in both), so
    ``unitok test`` scores utterances that checkpoint selection never heard; the corpus itself
    (and its cache) is the same whatever the cut. The vocabulary is the characters of the ten
    digit words and the space.

    Args:
        cache_dir: the corpus is kept in ``<cache_dir>/spoken_digits`` (default: ``unitok fit``'s
            ``<run root>/cache``; in Python ``$UNITOK_SPOKEN_DIGITS_DIR`` or ``~/.cache/unitok/spoken_digits``).
        train_utterances / held_out_utterances: corpus size. min_digits / max_digits: digits per
            utterance. speeds / pitches: espeak-ng ranges. max_word_gap: pauses (10 ms units).
        train_voices / held_out_voices: espeak-ng voices ("en-us+m3"). seed: the corpus draw.
        val_share: the share of each held-out voice's utterances that validate (`validation_rows`:
            0.5 alternates them); the rest are the test set. 1.0: all validate, and the test loader
            serves them again (no third split).
        spectrogram / batch_size / num_workers / bucketing / pool_batches / augment / freq_masks /
            freq_width / time_masks / time_width: as in `ManifestDataModule`.
        cache_features: keep each utterance's frames in memory once computed (about 100 MB).
        voices: the training voices when ``train_voices`` is not given: "standard" (the five
            accents × seven variants above) or "every" (`EVERY_TRAIN_VOICES`: eight accents ×
            every variant espeak-ng ships but the held-out ones and their near-copies, 744 voices).
        train_speeds / train_pitches: other ranges for the training utterances (the held-out ones
            keep ``speeds`` / ``pitches``). train_pitch_ranges: espeak-ng's intonation range
            (0 monotone – 100) drawn for each training utterance. train_intonation: speak each
            training digit string as a statement, question, exclamation or comma list.
        wave_augment: acoustic conditions for training (`tokenizers_mm.WaveAugment`: speed,
            reverberation, silence, noise, telephone band, loudness, and no-speech clips
            transcribed ""): false, true (its defaults) or a dict of its options. Frames are
            then computed afresh for every training item (``cache_features`` serves validation).
        unheard_strings: no held-out digit string is spoken in training, in any voice (training
            strings that would repeat one are redrawn; the held-out rows are unchanged).

        The ``train_`` options, ``voices``, ``wave_augment`` and ``unheard_strings`` are off by default (the
        multimodal recipes read the plain corpus); the Conformer recipe turns them on.
    """

    def __init__(
        self,
        cache_dir: str | None = None,
        train_utterances: int = 2100,
        held_out_utterances: int = 200,
        min_digits: int = 1,
        max_digits: int = 5,
        speeds: tuple[int, int] = (130, 200),
        pitches: tuple[int, int] = (30, 70),
        max_word_gap: int = 3,
        train_voices: Sequence[str] | None = None,
        held_out_voices: Sequence[str] = HELD_OUT_VOICES,
        seed: int = 0,
        spectrogram: dict[str, Any] | None = None,
        batch_size: int = 16,
        num_workers: int = 0,
        bucketing: bool = True,
        pool_batches: int = 32,
        augment: bool = True,
        freq_masks: int = 2,
        freq_width: int = 15,
        time_masks: int = 2,
        time_width: int = 25,
        cache_features: bool = True,
        val_share: float = 0.5,
        voices: Literal["standard", "every"] = "standard",
        train_speeds: tuple[int, int] | None = None,
        train_pitches: tuple[int, int] | None = None,
        train_pitch_ranges: tuple[int, int] | None = None,
        train_intonation: bool = False,
        wave_augment: bool | dict[str, Any] = False,
        unheard_strings: bool = False,
    ) -> None:
        super().__init__(spectrogram, batch_size, num_workers, augment, freq_masks, freq_width, time_masks,
                         time_width, bucketing, pool_batches, cache_features, wave_augment)
        if not 0.0 < val_share <= 1.0:
            raise ValueError(f"val_share must be in (0, 1], got {val_share}")
        if voices not in VOICE_SETS:
            raise ValueError(f"voices must be one of {sorted(VOICE_SETS)}, got {voices!r}")
        self.val_share = val_share
        self.spec = DigitsCorpusSpec(
            train_voices=tuple(train_voices if train_voices is not None else VOICE_SETS[voices]),
            held_out_voices=tuple(held_out_voices),
            train_utterances=train_utterances, held_out_utterances=held_out_utterances, min_digits=min_digits,
            max_digits=max_digits, speeds=speeds, pitches=pitches, max_word_gap=max_word_gap,
            sample_rate=self.spectrogram_config.sample_rate, seed=seed, train_speeds=train_speeds,
            train_pitches=train_pitches, train_pitch_ranges=train_pitch_ranges, train_intonation=train_intonation,
            unheard_strings=unheard_strings)
        self.cache_dir = cache_dir
        self.vocabulary = CharacterVocabulary.build(DIGIT_WORDS + (" ",))
        self.corpus: Path | None = None

    def prepare_data(self) -> None:
        """Synthesise the corpus once (Lightning calls this on one process per node)."""
        spoken_digits_corpus(self.spec, self.cache_dir)

    def data_key(self) -> str:
        """The corpus's spec (voices, strings, conditions) and synthesis version, as its cache names them."""
        return self.spec.key()

    def setup(self, stage: str | None = None) -> None:
        if self.train_utterances:
            return
        self.corpus = spoken_digits_corpus(self.spec, self.cache_dir)
        self.train_utterances = read_manifest(self.corpus / "train.jsonl")
        held = read_manifest(self.corpus / "held_out.jsonl")
        voices = [row["voice"] for row in self.spec.rows() if row["split"] == "held_out"]  # held_out.jsonl's order
        validates = validation_rows(voices, self.val_share)
        self.val_utterances = [u for u, v in zip(held, validates) if v]
        self.test_utterances = [u for u, v in zip(held, validates) if not v] or None
        self._finish_setup()
