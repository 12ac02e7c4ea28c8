"""Zero-shot classification with a CLIP model: class names + prompt templates -> a linear
classifier of text embeddings (Radford et al., 2021, §3.1.4), for images — and for audio with
a CLIP that has an audio tower (ImageBind's emergent zero-shot: speech classified by text
prompts it was never paired with).

Works with unitok `CLIP` models and, for images, with open_clip models (anything with
``encode_image``, ``encode_text`` and a tokenizer that maps a list of strings to (B, N) ids).

Axis legend: B images or utterances, K classes, P prompts, E embedding width.
"""

from __future__ import annotations

import string
import warnings
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tokenizers_mm.checks import check_int, check_number

Template = str | Callable[[str], str]


def class_prompts(
    classnames: Sequence[str],
    templates: Sequence[Template] | None = None,
    prompts: Mapping[str, Sequence[str]] | Sequence[Sequence[str]] | None = None,
) -> list[list[str]]:
    """Each class's prompt list: its own ``prompts`` where given, else every template filled with
    its name. Empty class lists, templates without ``{}``, classes with no prompt are errors;
    repeated names are a warning."""
    if isinstance(classnames, str) or len(classnames) == 0:
        raise ValueError(f"classnames must be a non-empty list of names, got {classnames!r}")
    duplicates = sorted(name for name, n in Counter(classnames).items() if n > 1)
    by_position = prompts is not None and not isinstance(prompts, Mapping)  # each class its own list
    if duplicates and not by_position:  # ImageNet's usual class-name list repeats two names (two different classes)
        warnings.warn(f"repeated class names {duplicates}: those classes get the same prompts and cannot "
                      "be told apart (give prompts as a list, one prompt list a class, to tell them apart)",
                      stacklevel=3)
    if templates is not None:
        if isinstance(templates, str) or len(templates) == 0:
            raise ValueError(f"templates must be a non-empty list, got {templates!r}")
        for t in templates:
            if isinstance(t, str) and [field for _, field, _, _ in string.Formatter().parse(t)
                                       if field is not None] != [""]:
                raise ValueError(f"template {t!r} needs exactly one '{{}}' for the class name (and no other "
                                 "field; write a literal brace as '{{' or '}}')")
            if not isinstance(t, str) and not callable(t):
                raise TypeError(f"templates are format strings with '{{}}' or callables, got {type(t).__name__}")
    if by_position:
        if len(prompts) != len(classnames):
            raise ValueError(f"got {len(prompts)} prompt lists for {len(classnames)} classes")
        listed = [list(p) for p in prompts]  # type: ignore[union-attr]
    for name, texts in ([*zip(classnames, prompts)] if by_position else list((prompts or {}).items())):
        if isinstance(texts, str):  # list("a photo") would be its characters
            raise TypeError(f"class {name!r}'s prompts must be a list of strings, got the string {texts!r}")
    own = dict(prompts or {}) if not by_position else {}
    unknown = sorted(set(own) - set(classnames))
    if unknown:
        raise ValueError(f"prompts given for unknown classes {unknown}; classes: {list(classnames)}")
    out = []
    for i, name in enumerate(classnames):
        if by_position:
            texts = listed[i]
        elif name in own:
            texts = list(own[name])
        elif templates is not None:
            texts = [t.format(name) if isinstance(t, str) else t(name) for t in templates]
        else:
            raise ValueError(f"class {name!r} has no prompts: give templates or prompts for it")
        if not texts:
            raise ValueError(f"class {name!r} has an empty prompt list")
        out.append(texts)
    return out


def _embedding_width(model: nn.Module) -> int | None:
    """E of a unitok CLIP (``config.embed_dim``) or an open_clip one (``visual.output_dim``); None if unknown."""
    width = getattr(getattr(model, "config", None), "embed_dim", None)
    if width is None:
        width = getattr(getattr(model, "visual", None), "output_dim", None)
    return width if isinstance(width, int) else None


def _check_class_embeddings(embeddings: Tensor, K: int, E: int | None) -> None:
    """Cached class embeddings must be what `ZeroShotClassifier.build` returns: a (K, E) float
    tensor of unit rows (another width fails later on the images; other norms would stop the
    logits being scaled cosines and reweight the classes)."""
    if not isinstance(embeddings, Tensor) or not embeddings.is_floating_point():
        got = f"a {embeddings.dtype} tensor" if isinstance(embeddings, Tensor) else type(embeddings).__name__
        raise TypeError(f"class_embeddings must be a float tensor, got {got}")
    if embeddings.dim() != 2 or embeddings.shape[0] != K or (E is not None and embeddings.shape[1] != E):
        raise ValueError(f"class_embeddings must be ({K}, {E if E is not None else 'E'}): one row per class, the "
                         f"model's embedding width; got {tuple(embeddings.shape)}")
    norms = embeddings.detach().float().norm(dim=-1)
    off = (~((norms - 1).abs() <= 1e-2)).nonzero().flatten().tolist()  # 1e-2: rows kept in half precision pass
    if off:
        shown = ", ".join(f"row {k}: {float(norms[k]):.4g}" for k in off[:5])
        raise ValueError(f"class_embeddings rows must have norm 1 (as build() returns them), got {len(off)} that "
                         f"do not ({shown}{', …' if len(off) > 5 else ''}); normalise them (F.normalize(x, dim=-1))")


class ZeroShotClassifier:
    """A CLIP model turned into a K-way classifier of images (or audio) by text prompts.

    Each class's embedding is the mean of its prompts' normalised text embeddings, normalised
    again (the template ensemble of the CLIP paper). The (K, E) class embeddings are built once,
    in batches, and cached (``class_embeddings``); pass them back in to skip the text tower.

    Args:
        model: a unitok `CLIP` or an open_clip CLIP model.
        classnames: the K class names. templates: format strings ("a photo of a {}.") or
            callables. prompts: per-class prompt lists (a dict by name, or one list per class),
            used instead of the templates for those classes.
        tokenizer: strings -> (B, N) ids; defaults to the unitok model's `CLIPTokenizer`
            (required for open_clip models: ``open_clip.get_tokenizer(name)``).
        preprocess: raw image -> normalised (C, H, W) tensor (open_clip's transform); without
            it a unitok model prepares raw images itself (``resize`` to its configured size).
            Both are image options: refused with ``modality="audio"``.
        logit_scale: multiplies the cosine similarities; default the model's learned exp(scale).
        batch_size: prompts (and images) per forward pass. progress: a tqdm bar while building.
        class_embeddings: (K, E) cached embeddings from an earlier build (unit rows; other
            shapes or norms are refused).
        modality: what is classified: "image", or "audio" (a unitok CLIP with an audio tower;
            raw audio is file paths, or waveforms with ``sample_rate=``, read with the model's
            stored spectrogram settings).
    """

    def __init__(
        self,
        model: nn.Module,
        classnames: Sequence[str],
        templates: Sequence[Template] | None = None,
        prompts: Mapping[str, Sequence[str]] | Sequence[Sequence[str]] | None = None,
        tokenizer: Callable[[list[str]], Tensor] | None = None,
        preprocess: Callable[[Any], Tensor] | None = None,
        resize: bool = False,
        logit_scale: float | None = None,
        batch_size: int = 256,
        progress: bool = False,
        class_embeddings: Tensor | None = None,
        modality: Literal["image", "audio"] = "image",
    ) -> None:
        if modality not in ("image", "audio"):
            raise ValueError(f"modality must be 'image' or 'audio', got {modality!r}")
        for name in (f"encode_{modality}", "encode_text"):
            if not callable(getattr(model, name, None)):
                raise TypeError(f"{type(model).__name__} has no {name}(); expected a CLIP model"
                                + (" with an audio tower" if modality == "audio" else ""))
        if modality == "audio" and getattr(getattr(model, "config", None), "audio", None) is None:
            raise ValueError("modality='audio' needs a CLIP with an audio tower; this one is an image–text model")
        if modality == "audio":  # image options that audio would ignore without a word
            if preprocess is not None:
                raise ValueError("preprocess= prepares images; with modality='audio' raw audio is read with the "
                                 "model's stored spectrogram settings (or pass audio Tokens)")
            if resize:
                raise ValueError(f"resize={resize!r} resizes images; modality='audio' has no image to resize")
        self.modality = modality
        check_int("batch_size", batch_size)
        self.model, self.classnames = model, list(classnames)
        self.prompts = class_prompts(self.classnames, templates, prompts)
        if tokenizer is None:
            if not callable(getattr(model, "text_tokenizer", None)):
                raise ValueError(f"{type(model).__name__} brings no tokenizer: pass tokenizer= "
                                 "(for open_clip: open_clip.get_tokenizer(model_name))")
            tokenizer = model.text_tokenizer()
        self.tokenizer, self.preprocess, self.resize = tokenizer, preprocess, resize
        if logit_scale is not None:  # a scale ≤ 0 would invert or flatten the ranking, NaN every probability
            logit_scale = check_number("logit_scale", logit_scale, 0, low_open=True)
        self._logit_scale, self.batch_size, self.progress = logit_scale, batch_size, progress
        if class_embeddings is not None:
            _check_class_embeddings(class_embeddings, len(self.classnames), _embedding_width(model))
        self._class_embeddings = class_embeddings

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def logit_scale(self) -> float:
        if self._logit_scale is not None:
            return self._logit_scale
        scale = getattr(self.model, "logit_scale", None)
        return float(scale.detach().exp()) if isinstance(scale, Tensor) else 100.0

    # ------------------------------------------------------------------ building
    @property
    def class_embeddings(self) -> Tensor:
        """(K, E) normalised class embeddings, built on first use and kept."""
        if self._class_embeddings is None:
            self._class_embeddings = self.build()
        return self._class_embeddings

    @torch.no_grad()
    def build(self) -> Tensor:
        """Encode every prompt (``batch_size`` at a time) and average per class -> (K, E)."""
        texts = [t for group in self.prompts for t in group]
        owner = torch.cat([torch.full((len(g),), k, dtype=torch.long) for k, g in enumerate(self.prompts)])
        starts = range(0, len(texts), self.batch_size)
        if self.progress:
            from tqdm.auto import tqdm

            starts = tqdm(starts, desc="zero-shot classifier", unit="batch")
        was_training = self.model.training
        self.model.eval()
        try:
            chunks = []
            for s in starts:
                ids = self.tokenizer(texts[s : s + self.batch_size]).to(self.device)
                chunks.append(F.normalize(self.model.encode_text(ids).float(), dim=-1))
        finally:
            self.model.train(was_training)
        embeds = torch.cat(chunks)  # (P, E)
        sums = torch.zeros(len(self.prompts), embeds.shape[1], device=embeds.device).index_add_(
            0, owner.to(embeds.device), embeds)
        counts = torch.tensor([len(g) for g in self.prompts], device=embeds.device, dtype=embeds.dtype)
        return F.normalize(sums / counts[:, None], dim=-1)

    # ------------------------------------------------------------------ classifying
    def logits_from_features(self, features: Tensor) -> Tensor:
        """(B, E) image (or audio) embeddings, normalised or not -> (B, K) scaled cosine similarities."""
        weights = self.class_embeddings.to(features.device)
        if features.dim() != 2 or features.shape[1] != weights.shape[1]:
            raise ValueError(f"{self.modality} features must be (batch, {weights.shape[1]}), got {tuple(features.shape)}")
        return self.logit_scale * F.normalize(features.float(), dim=-1) @ weights.T

    def _inputs(self, items: Any, normalized: bool, sample_rate: int | None) -> Any:
        if self.modality == "image":
            if sample_rate is not None:
                raise ValueError("sample_rate is for audio; this classifier reads images")
            return self._pixels(items, normalized)
        if normalized:
            raise ValueError("normalized=True takes normalised image tensors; this classifier reads audio (pass "
                             "audio Tokens to skip the spectrogram)")
        from tokenizers_mm import Tokens
        from unitok.models.clip import encode_raw_audio

        if isinstance(items, Tokens):
            return items
        return encode_raw_audio(self.model.audio_tokenizer(), items, sample_rate)

    def _pixels(self, images: Any, normalized: bool) -> Any:
        if normalized:
            if not (isinstance(images, Tensor) and images.dim() == 4 and images.dtype.is_floating_point):
                got = tuple(images.shape) if isinstance(images, Tensor) else type(images).__name__
                raise ValueError(f"normalized=True takes a (B, C, H, W) float tensor, got {got}")
            return images
        if self.preprocess is not None:
            items = list(images) if isinstance(images, (list, tuple)) else [images]
            return torch.stack([self.preprocess(im) for im in items])
        if callable(getattr(self.model, "image_tokenizer", None)):
            return self.model.image_tokenizer(self.resize).encode(images)
        raise ValueError("open_clip models need preprocess= (their transform) for raw images, "
                         "or normalised (B, C, H, W) tensors with normalized=True")

    @torch.no_grad()
    def logits(self, inputs: Any, normalized: bool = False, sample_rate: int | None = None) -> Tensor:
        """Images (or audio) -> (B, K) logits. Raw images (PIL, uint8, [0, 1] floats) are prepared
        by the unitok model's stored preprocessing or by ``preprocess``; ``normalized=True``
        takes (B, C, H, W) tensors that are already normalised. Raw audio: file paths, or
        waveforms with their ``sample_rate``; or audio `Tokens`."""
        inputs = self._inputs(inputs, normalized, sample_rate)
        encode = self.model.encode_image if self.modality == "image" else self.model.encode_audio
        was_training = self.model.training
        self.model.eval()
        try:
            out = []
            n = inputs.batch_size if hasattr(inputs, "batch_size") else inputs.shape[0]
            for s in range(0, n, self.batch_size):
                batch = _slice(inputs, s, s + self.batch_size)
                batch = batch.to(self.device)
                out.append(self.logits_from_features(encode(batch)))
        finally:
            self.model.train(was_training)
        return torch.cat(out)

    def predict_proba(self, inputs: Any, normalized: bool = False, sample_rate: int | None = None) -> Tensor:
        """Images (or audio) -> (B, K) class probabilities (softmax of the logits)."""
        return self.logits(inputs, normalized, sample_rate).softmax(dim=-1)

    def predict(self, inputs: Any, normalized: bool = False, sample_rate: int | None = None) -> Tensor:
        """Images (or audio) -> (B,) class indices."""
        return self.logits(inputs, normalized, sample_rate).argmax(dim=-1)

    def predict_names(self, inputs: Any, normalized: bool = False, sample_rate: int | None = None) -> list[str]:
        """Images (or audio) -> the predicted class names."""
        return [self.classnames[i] for i in self.predict(inputs, normalized, sample_rate).tolist()]

    def topk(self, inputs: Any, k: int = 5, normalized: bool = False,
             sample_rate: int | None = None) -> tuple[Tensor, Tensor]:
        """Images (or audio) -> ((B, k) probabilities, (B, k) class indices), most likely first."""
        if check_int("k", k) > len(self.classnames):  # type: ignore[operator]
            raise ValueError(f"k must be in [1, {len(self.classnames)}], got {k}")
        return self.predict_proba(inputs, normalized, sample_rate).topk(k, dim=-1)


def _slice(inputs: Any, start: int, stop: int) -> Any:
    if isinstance(inputs, Tensor):
        return inputs[start:stop]
    from dataclasses import replace

    return replace(inputs, features=inputs.features[start:stop], attention_mask=inputs.attention_mask[start:stop])
