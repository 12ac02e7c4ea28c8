"""`Processor`: everything that turns a model's raw input into `Tokens`, saved beside its weights.

A saved model folder holds ``processor_config.json`` (which parts there are and their settings)
next to the tokenizer's own files, so ``unitok.load(folder)`` gives a model that reads raw text,
images, audio or episodes the way it was trained — the role of a Hugging Face processor.

Parts (each optional): ``text`` (byte-level BPE, WordPiece or CLIP's BPE), ``image`` (patching
and normalisation), ``audio`` (log-mel settings), ``characters`` (a CTC model's output
vocabulary), ``trajectory`` (return / state / action normalisation) and ``labels`` (class names,
Hugging Face's ``id2label``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tokenizers_mm.audio import AUDIO_SUFFIXES, SpectrogramConfig, SpectrogramTokenizer
from tokenizers_mm.characters import CharacterVocabulary
from tokenizers_mm.clip_bpe import CLIPTokenizer
from tokenizers_mm.image import IMAGE_SUFFIXES, ImagePreprocessConfig, PatchTokenizer
from tokenizers_mm.text import BPETokenizer
from tokenizers_mm.tokens import Tokens
from tokenizers_mm.trajectory import TrajectoryTokenizer
from tokenizers_mm.wordpiece import WordPieceTokenizer

PROCESSOR_FILE = "processor_config.json"
TEXT_CONFIG_FILE = "tokenizer_config.json"  # written by BPETokenizer.save / WordPieceTokenizer.save
Modality = Literal["text", "image", "audio", "trajectory"]
TextTokenizer = BPETokenizer | WordPieceTokenizer | CLIPTokenizer


@dataclass
class Processor:
    """Raw input -> `Tokens` for one model; ``save`` / ``load`` with the model's folder.

    Args:
        text: the text tokenizer (files saved next to the weights).
        image: how images become patches (size, normalisation).
        audio: the log-mel settings (sample rate, window, normalisation statistics).
        characters: the characters a CTC head emits (id 0 is the blank).
        trajectory: the Decision Transformer's return / state / action statistics.
        labels: class names by class id (``id2label``).
    """

    text: TextTokenizer | None = None
    image: ImagePreprocessConfig | None = None
    audio: SpectrogramConfig | None = None
    characters: CharacterVocabulary | None = None
    trajectory: TrajectoryTokenizer | None = None
    labels: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.labels is not None:
            labels = tuple(self.labels)
            if not labels or not all(isinstance(name, str) for name in labels):
                raise ValueError(f"labels must be a non-empty list of class names, got {self.labels!r}")
            self.labels = labels

    # ------------------------------------------------------------------ what it holds
    @property
    def modalities(self) -> list[str]:
        """The raw inputs this processor reads, in a fixed order."""
        parts = {"text": self.text, "image": self.image, "audio": self.audio, "trajectory": self.trajectory}
        return [name for name, part in parts.items() if part is not None]

    @property
    def id2label(self) -> dict[int, str] | None:
        return None if self.labels is None else dict(enumerate(self.labels))

    @property
    def label2id(self) -> dict[str, int] | None:
        return None if self.labels is None else {name: i for i, name in enumerate(self.labels)}

    def merge(self, other: Processor | None) -> Processor:
        """This processor with ``other``'s parts filling the ones it lacks."""
        if other is None:
            return self
        return Processor(**{f.name: getattr(self, f.name) if getattr(self, f.name) is not None
                            else getattr(other, f.name) for f in dataclasses.fields(self)})

    # ------------------------------------------------------------------ raw -> Tokens
    def __call__(self, raw: Any, modality: Modality | None = None, **options: Any) -> Any:
        """Raw input -> `Tokens` (episodes -> `TrajectoryWindows`).

        ``modality`` says what ``raw`` is; without it the processor's only modality is used, or,
        with several (CLIP), strings are text unless they name an image or audio file, 1-D
        waveforms are audio and everything else is an image. ``options`` go to the part's
        encoder (``sample_rate=`` for bare waveforms, ``max_length=`` for text…).
        """
        modality = modality or self.guess_modality(raw)
        if modality == "text":
            return self.encode_text(raw, **options)
        if modality == "image":
            return self.encode_image(raw, **options)
        if modality == "audio":
            return self.encode_audio(raw, **options)
        if modality == "trajectory":
            return self.part("trajectory").encode(raw, **options)
        raise ValueError(f"modality must be one of text, image, audio, trajectory; got {modality!r}")

    def guess_modality(self, raw: Any) -> str:
        own = self.modalities
        if not own:
            raise ValueError("this processor is empty: it has no text tokenizer, image, audio or trajectory "
                             "settings; build one with Processor(text=…, image=…)")
        if len(own) == 1:
            return own[0]
        first = raw[0] if isinstance(raw, (list, tuple)) and raw else raw
        if isinstance(first, (str, Path)):
            suffix = Path(str(first)).suffix.lower()
            for kind, suffixes in (("image", IMAGE_SUFFIXES), ("audio", AUDIO_SUFFIXES)):
                if kind in own and suffix in suffixes:
                    if Path(str(first)).is_file():
                        return kind
                    if isinstance(first, Path) or "text" not in own or " " not in str(first).strip():
                        # a mistyped path is not a caption: say so rather than read "cat.png" as text
                        raise FileNotFoundError(f"{first} looks like an {kind} file but does not exist; pass "
                                                "modality='text' to read it as text")
            if "text" in own:
                return "text"
        dim = getattr(first, "ndim", None)
        if "audio" in own and dim == 1:
            return "audio"
        if "image" in own:
            return "image"
        raise ValueError(f"cannot tell which of {own} a {type(raw).__name__} is; pass modality=")

    def part(self, name: str) -> Any:
        """One part by name, or a clear error naming what the processor has."""
        value = getattr(self, name)
        if value is None:
            raise ValueError(f"this model's processor has no {name} part (it has: "
                             f"{', '.join(self.modalities) or 'nothing'}); save the model with one "
                             f"(model.processor = Processor({name}=…))")
        return value

    def encode_text(self, texts: str | Sequence[str], **options: Any) -> Tokens:
        """Strings -> padded id `Tokens` (one string is a batch of one)."""
        tokenizer = self.part("text")
        texts = [texts] if isinstance(texts, str) else list(texts)
        if not texts or not all(isinstance(t, str) for t in texts):
            raise ValueError(f"text input must be a string or a non-empty list of strings, got {texts!r}")
        return tokenizer.batch_encode(texts, **options)

    def encode_image(self, images: Any, **options: Any) -> Tokens:
        """Images (paths, PIL, arrays or tensors; one or a list) -> patch `Tokens`."""
        config = self.part("image")
        if options:
            config = dataclasses.replace(config, **options)
        return PatchTokenizer(config).encode(images)

    def encode_audio(self, audio: Any, sample_rate: int | None = None) -> Tokens:
        """Audio files or waveforms (one or a list) -> log-mel `Tokens`.

        A bare waveform needs its ``sample_rate``: nothing is assumed about an array's rate.
        """
        items = list(audio) if isinstance(audio, (list, tuple)) else [audio]
        if sample_rate is None and any(not isinstance(a, (str, Path)) for a in items):
            raise ValueError("a waveform needs its sample_rate= (files carry their own); the model expects "
                             f"{self.part('audio').sample_rate} Hz and resamples other rates")
        return SpectrogramTokenizer(self.part("audio")).encode(items, sample_rate)

    # ------------------------------------------------------------------ files
    def save(self, directory: str | Path) -> Path:
        """Write ``processor_config.json`` (and the text tokenizer's own files) into ``directory``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        payload: dict[str, Any] = {}
        if isinstance(self.text, CLIPTokenizer):
            payload["text"] = {"type": "clip", "context_length": self.text.context_length,
                               "truncation": self.text.truncation}
        elif self.text is not None:
            self.text.save(directory)
            payload["text"] = {"type": "bpe" if isinstance(self.text, BPETokenizer) else "wordpiece"}
        if self.image is not None:
            payload["image"] = self.image.to_dict()
        if self.audio is not None:
            payload["audio"] = self.audio.to_dict()
        if self.characters is not None:
            payload["characters"] = self.characters.to_list()
        if self.trajectory is not None:
            payload["trajectory"] = self.trajectory.to_dict()
        if self.labels is not None:
            payload["id2label"] = {str(i): name for i, name in enumerate(self.labels)}
        path = directory / PROCESSOR_FILE
        path.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
        return path

    @classmethod
    def load(cls, directory: str | Path) -> Processor | None:
        """Read a folder written by ``save``; None when it has no ``processor_config.json``."""
        directory = Path(directory)
        path = directory / PROCESSOR_FILE
        if not path.is_file():
            return None
        try:
            payload = json.loads(path.read_text())
        except json.JSONDecodeError as error:
            raise ValueError(f"{path} is not valid JSON: {error}") from None
        if not isinstance(payload, dict):
            raise ValueError(f"{path} must hold a JSON object of processor parts, got {type(payload).__name__}")
        known = {"text", "image", "audio", "characters", "trajectory", "id2label"}
        unknown = sorted(set(payload) - known)
        if unknown:
            raise ValueError(f"{path}: unknown processor part(s) {unknown}; known: {sorted(known)}")
        shapes = {"text": dict, "image": dict, "audio": dict, "trajectory": dict, "characters": list, "id2label": dict}
        for name, value in payload.items():
            if value is not None and not isinstance(value, shapes[name]):
                kind = "object" if shapes[name] is dict else "list"
                raise ValueError(f"{path}: the {name!r} part must be a JSON {kind}, got {str(value)[:80]!r}")
        try:
            parts = _parts(payload, directory, path)
        except (TypeError, KeyError) as error:  # a field missing or misnamed in a hand-edited file
            raise ValueError(f"{path}: cannot read its parts ({type(error).__name__}: {error})") from None
        return cls(**parts)


def _parts(payload: dict[str, Any], directory: Path, path: Path) -> dict[str, Any]:
    """`Processor` fields from a ``processor_config.json`` payload (shapes already checked)."""
    parts: dict[str, Any] = {}
    text = payload.get("text")
    if text is not None:
        kind = text.get("type")
        if kind == "clip":
            parts["text"] = CLIPTokenizer(text["context_length"], truncation=text.get("truncation", "error"))
        elif kind == "bpe":
            parts["text"] = BPETokenizer.load(directory)
        elif kind == "wordpiece":
            parts["text"] = WordPieceTokenizer.load(directory)
        else:
            raise ValueError(f"{path}: text tokenizer type must be 'bpe', 'wordpiece' or 'clip', got {kind!r}")
    if payload.get("image") is not None:
        try:  # its lists are stored as tuples by the config
            parts["image"] = ImagePreprocessConfig(**payload["image"])
        except ValueError as error:
            raise ValueError(f"{path}: the image part: {error}") from None
    if payload.get("audio") is not None:
        parts["audio"] = SpectrogramConfig.from_dict(payload["audio"])
    if payload.get("characters") is not None:
        parts["characters"] = CharacterVocabulary.from_list(payload["characters"])
    if payload.get("trajectory") is not None:
        parts["trajectory"] = TrajectoryTokenizer.from_dict(payload["trajectory"])
    if payload.get("id2label") is not None:
        id2label = payload["id2label"]
        bad = [k for k in id2label if not (k.isdigit() and str(int(k)) == k)]
        if bad:
            raise ValueError(f"{path}: id2label's keys must be class ids \"0\", \"1\", …, got {bad[:3]}")
        ids = sorted(int(i) for i in id2label)
        if ids != list(range(len(ids))):
            raise ValueError(f"{path}: id2label must number the classes 0..K-1, got ids {ids}")
        parts["labels"] = tuple(id2label[str(i)] for i in ids)
    return parts
