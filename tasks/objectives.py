"""Objectives of a multi-task run: what one task contributes to the one `MultimodalTransformer`.

Each objective reads its own data module's batches (the built-in ones the single-family tasks
use: digit scans, spoken digits, the standard-library text, CartPole trajectories, image–audio
pairs), turns them into named segments, and names the head that reads them, the loss and the
held-out metric. `tasks.MultiTaskTask` builds one model from every objective's segments and
heads, and sums the weighted losses.

Axis legend: B batch, N frames / tokens, K classes or steps, V vocabulary.
"""

from __future__ import annotations

import importlib
import inspect
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import MeanMetric, Metric
from torchmetrics.classification import MulticlassAccuracy
from torchmetrics.text import CharErrorRate, WordErrorRate

from tasks.ctc_asr import ctc_log_likelihood, ctc_loss
from tasks.decision_transformer import action_loss, action_records
from tasks.plain import plain
from tasks.predictions import Record, class_records, records
from tokenizers_mm import CharacterVocabulary, Tokens, TrajectoryWindows
from tokenizers_mm.checks import check_int, check_number
from unitok.ctc import ctc_greedy_decode
from unitok.models import (
    ActionHeadConfig,
    AudioModality,
    ClassifierHeadConfig,
    CTCHeadConfig,
    ImageModality,
    LMHeadConfig,
    MultimodalOutput,
    MultimodalTransformer,
    TextModality,
    TrajectoryModality,
)
from unitok.rollouts import check_target_returns, evaluate_returns


class Objective:
    """One task of a multi-task run (subclasses below).

    Args:
        loss_weight: this task's loss is multiplied by it in the sum (CTC and LM losses are not
            on a classification loss's scale; per-task curves are logged unweighted).
        sampling_weight: with ``tasks_per_step="one"``, this task's probability of being the
            step's task is proportional to it.
    """

    metric: str = "acc"  # the held-out metric's name
    higher_is_better: bool = True

    def __new__(cls, *args: Any, **kwargs: Any) -> Objective:
        # the arguments it is made with, kept for `spec` (a copy or unpickling calls this bare)
        objective = super().__new__(cls)
        bound = inspect.signature(cls.__init__).bind(objective, *args, **kwargs)
        bound.apply_defaults()
        objective._init_args = dict(list(bound.arguments.items())[1:])
        return objective

    def spec(self) -> dict[str, Any]:
        """This objective as plain values, ``{"class_path": …, "init_args": {…}}`` as a recipe
        writes it: what a checkpoint holds, so that it loads with ``weights_only=True``."""
        return {"class_path": f"{type(self).__module__}.{type(self).__qualname__}",
                "init_args": plain(self._init_args)}

    def __init__(self, loss_weight: float = 1.0, sampling_weight: float = 1.0) -> None:
        check_number("loss_weight", loss_weight, 0.0)
        check_number("sampling_weight", sampling_weight, 0.0)
        self.loss_weight, self.sampling_weight = float(loss_weight), float(sampling_weight)
        self.name = ""
        self.head = ""

    def bind(self, name: str, data: Any) -> None:
        """Read what the model needs from this task's data module (after its ``setup``)."""
        self.name = name
        self.head = self.head or name

    def modalities(self) -> dict[str, Any]:
        """Segment name -> modality config, as this task's data shapes it."""
        raise NotImplementedError

    def heads(self) -> dict[str, Any]:
        raise NotImplementedError

    def inputs(self, batch: Any) -> dict[str, Any]:
        """A data-module batch -> the model's ``{segment: tokens}``."""
        raise NotImplementedError

    def loss(self, out: MultimodalOutput, batch: Any) -> Tensor:
        raise NotImplementedError

    def make_metrics(self) -> dict[str, Metric]:
        """Held-out metric states (registered on the LightningModule, so they follow its device)."""
        return {}

    def update(self, metrics: nn.ModuleDict, out: MultimodalOutput, batch: Any, loss: Tensor) -> None:
        """Accumulate a held-out batch."""

    def compute(self, metrics: nn.ModuleDict) -> dict[str, float]:
        """The held-out metrics after a pass, by name (``metric`` among them)."""
        return {name: float(m.compute()) for name, m in metrics.items()}

    def evaluate(self, model: MultimodalTransformer) -> dict[str, float]:
        """Evaluation beyond the held-out batches (rollouts); run after each validation."""
        return {}

    def predict(self, out: MultimodalOutput, batch: Any, model: MultimodalTransformer, data: Any) -> list[Record]:
        """One record per input of a held-out batch (`tasks.predictions`): ``prediction``,
        ``score`` and, where the batch knows it, ``target``; ``data`` is this task's data module."""
        raise NotImplementedError(f"{type(self).__name__} has no predict")

    def batch_size(self, batch: Any) -> int:
        first = next(iter(self.inputs(batch).values()))
        return first.batch_size if isinstance(first, (Tokens, TrajectoryWindows)) else int(first.shape[0])


def as_objective(name: str, objective: Objective | Mapping[str, Any]) -> Objective:
    """An objective, or one made from its `Objective.spec` (a checkpoint's, a plain config's)."""
    if isinstance(objective, Objective):
        return objective
    if not isinstance(objective, Mapping) or not isinstance(objective.get("class_path"), str):
        raise TypeError(f"objective {name!r} must be an Objective or {{'class_path': …, 'init_args': {{…}}}}, "
                        f"got {objective!r}")
    module, _, cls_name = objective["class_path"].rpartition(".")
    cls = getattr(importlib.import_module(module), cls_name, None) if module else None
    if not (isinstance(cls, type) and issubclass(cls, Objective)):
        raise ValueError(f"objective {name!r}: {objective['class_path']!r} is not an Objective class")
    return cls(**dict(objective.get("init_args") or {}))


class ImageClassification(Objective):
    """Class logits from an image segment's class token (`DigitsDataModule`, `ImageFolderDataModule`
    batches: ``pixel_values``, ``labels``). Metric: accuracy."""

    def __init__(self, segment: str = "image", patch_size: int = 8, loss_weight: float = 1.0,
                 sampling_weight: float = 1.0, label_smoothing: float = 0.0) -> None:
        super().__init__(loss_weight, sampling_weight)
        check_number("label_smoothing", label_smoothing, 0.0, 1.0)  # as ImageClassificationTask: at once
        self.segment, self.patch_size, self.label_smoothing = segment, patch_size, label_smoothing

    def bind(self, name: str, data: Any) -> None:
        super().bind(name, data)
        self.image = ImageModality(image_size=tuple(data.image_size), patch_size=self.patch_size,
                                   channels=data.channels, mean=tuple(data.mean), std=tuple(data.std))
        self.num_classes, self.class_names = int(data.num_classes), tuple(data.class_names)

    def modalities(self) -> dict[str, Any]:
        return {self.segment: self.image}

    def heads(self) -> dict[str, Any]:
        return {self.head: ClassifierHeadConfig(segment=self.segment, num_classes=self.num_classes, pool="cls",
                                                class_names=self.class_names)}

    def inputs(self, batch: dict[str, Tensor]) -> dict[str, Any]:
        return {self.segment: batch["pixel_values"]}

    def loss(self, out: MultimodalOutput, batch: dict[str, Tensor]) -> Tensor:
        return F.cross_entropy(out.heads[self.head].float(), batch["labels"], label_smoothing=self.label_smoothing)

    def make_metrics(self) -> dict[str, Metric]:
        return {"acc": MulticlassAccuracy(self.num_classes, average="micro")}

    def update(self, metrics: nn.ModuleDict, out: MultimodalOutput, batch: Any, loss: Tensor) -> None:
        metrics["acc"].update(out.heads[self.head], batch["labels"])

    def predict(self, out: MultimodalOutput, batch: Any, model: MultimodalTransformer, data: Any) -> list[Record]:
        """The class name with its probability; the true class as ``target``."""
        return class_records(out.heads[self.head], self.class_names, batch.get("labels"))


class SpeechRecognition(Objective):
    """CTC over an audio segment (`SpokenDigitsDataModule`, `ManifestDataModule` batches:
    ``features``, ``feature_lengths``, ``targets``, ``target_lengths``, ``texts``). Metric:
    character error rate (greedy decoding), and word error rate."""

    metric = "cer"
    higher_is_better = False

    def __init__(self, segment: str = "audio", max_frames: int = 512, subsampling_channels: int | None = 32,
                 loss_weight: float = 1.0, sampling_weight: float = 1.0) -> None:
        super().__init__(loss_weight, sampling_weight)
        self.segment, self.max_frames, self.subsampling_channels = segment, max_frames, subsampling_channels

    def bind(self, name: str, data: Any) -> None:
        super().bind(name, data)
        spectrogram = data.spectrogram_config
        self.audio = AudioModality(n_mels=spectrogram.n_mels, max_frames=self.max_frames,
                                   subsampling_channels=self.subsampling_channels, spectrogram=spectrogram.to_dict())
        self.vocabulary = CharacterVocabulary(data.vocabulary.chars)

    def modalities(self) -> dict[str, Any]:
        return {self.segment: self.audio}

    def heads(self) -> dict[str, Any]:
        return {self.head: CTCHeadConfig(segment=self.segment, vocabulary=tuple(self.vocabulary.chars))}

    def inputs(self, batch: dict[str, Any]) -> dict[str, Any]:
        return {self.segment: audio_tokens(batch["features"], batch["feature_lengths"])}

    def loss(self, out: MultimodalOutput, batch: dict[str, Any]) -> Tensor:
        lengths = out.segments[self.segment].lengths
        return ctc_loss(out.heads[self.head], lengths, batch["targets"], batch["target_lengths"])

    def make_metrics(self) -> dict[str, Metric]:
        return {"cer": CharErrorRate(), "wer": WordErrorRate()}

    def transcribe(self, out: MultimodalOutput) -> list[str]:
        log_probs = out.heads[self.head].float().log_softmax(-1)
        return [self.vocabulary.decode(p) for p in ctc_greedy_decode(log_probs, out.segments[self.segment].lengths)]

    def update(self, metrics: nn.ModuleDict, out: MultimodalOutput, batch: Any, loss: Tensor) -> None:
        hypotheses = self.transcribe(out)
        metrics["cer"].update(hypotheses, batch["texts"])
        metrics["wer"].update(hypotheses, batch["texts"])

    def predict(self, out: MultimodalOutput, batch: Any, model: MultimodalTransformer, data: Any) -> list[Record]:
        """The greedy transcript with its CTC log-likelihood; the true transcript as ``target``."""
        log_probs = out.heads[self.head].float().log_softmax(-1)
        lengths = out.segments[self.segment].lengths
        paths = ctc_greedy_decode(log_probs, lengths)
        return records([self.vocabulary.decode(p) for p in paths], ctc_log_likelihood(log_probs, lengths, paths),
                       target=batch.get("texts"))

    def batch_size(self, batch: Any) -> int:
        return len(batch["texts"])


class LanguageModelling(Objective):
    """Next-token prediction over a causal text segment (`TextDataModule` batches: ``input_ids``,
    ``labels``). Metric: held-out perplexity. ``predict_tokens``: how far `predict` continues
    each held-out window."""

    metric = "ppl"
    higher_is_better = False

    def __init__(self, segment: str = "text", loss_weight: float = 1.0, sampling_weight: float = 1.0,
                 predict_tokens: int = 16) -> None:
        super().__init__(loss_weight, sampling_weight)
        check_int("predict_tokens", predict_tokens)
        self.segment, self.predict_tokens = segment, predict_tokens

    def bind(self, name: str, data: Any) -> None:
        super().bind(name, data)
        self.text = TextModality(vocab_size=int(data.vocab_size), max_positions=int(data.context_length), causal=True)

    def modalities(self) -> dict[str, Any]:
        return {self.segment: self.text}

    def heads(self) -> dict[str, Any]:
        return {self.head: LMHeadConfig(segment=self.segment)}

    def inputs(self, batch: dict[str, Tensor]) -> dict[str, Any]:
        return {self.segment: Tokens(ids=batch["input_ids"], attention_mask=batch.get("attention_mask"))}

    def loss(self, out: MultimodalOutput, batch: dict[str, Tensor]) -> Tensor:
        logits = out.heads[self.head]
        return F.cross_entropy(logits.flatten(0, 1).float(), batch["labels"].flatten(), ignore_index=-100)

    def make_metrics(self) -> dict[str, Metric]:
        return {"loss": MeanMetric()}

    def update(self, metrics: nn.ModuleDict, out: MultimodalOutput, batch: Any, loss: Tensor) -> None:
        metrics["loss"].update(loss.detach(), weight=int((batch["labels"] != -100).sum()))

    def compute(self, metrics: nn.ModuleDict) -> dict[str, float]:
        loss = float(metrics["loss"].compute())
        return {"loss": loss, "ppl": math.exp(min(loss, 50.0))}

    def predict(self, out: MultimodalOutput, batch: Any, model: MultimodalTransformer, data: Any) -> list[Record]:
        """Greedy continuation of each held-out window by ``predict_tokens`` tokens (the window
        slides to keep its length): the text as ``prediction``, the mean log-probability of its
        tokens as ``score``, the window's text as ``input`` (decoded with the data's tokenizer)."""
        ids = batch["input_ids"]
        window = ids.shape[1]
        logits = out.heads[self.head][:, -1].float()
        new, log_probs = [], []
        for step in range(self.predict_tokens):
            if step:
                context = torch.cat([ids, *new], dim=1)[:, -window:]
                logits = model({self.segment: Tokens(ids=context)}, heads=[self.head]).heads[self.head][:, -1].float()
            token = logits.argmax(-1, keepdim=True)  # (B, 1)
            log_probs.append(logits.log_softmax(-1).gather(-1, token))
            new.append(token)
        tok = data.tokenizer
        score = torch.cat(log_probs, dim=1).mean(dim=1)
        return records(tok.batch_decode(torch.cat(new, dim=1)), score, input=tok.batch_decode(ids))


class ReturnConditionedControl(Objective):
    """The Decision Transformer's objective over a trajectory segment (`TrajectoryDataModule`
    batches): predict each step's action; held-out action accuracy (discrete actions), and
    after each validation, rollouts in the data's environment at ``eval_targets`` — the metric
    is the mean achieved return at the highest target.

    Args:
        eval_targets: target returns for rollouts (default: the data's best episode return).
        eval_episodes: episodes per target (0: no rollouts). eval_seed: episode e starts from
            seed eval_seed + e. sample: sample discrete actions (None: the rollout default).
    """

    metric = "return"

    def __init__(self, segment: str = "trajectory", eval_targets: list[float] | None = None, eval_episodes: int = 10,
                 eval_seed: int = 10_000, sample: bool | None = None, loss_weight: float = 1.0,
                 sampling_weight: float = 1.0) -> None:
        super().__init__(loss_weight, sampling_weight)
        if eval_targets is not None:
            check_target_returns(eval_targets)
        # as DecisionTransformerTask: refused here, not at the first validation (500 steps into a recipe)
        check_int("eval_episodes", eval_episodes, 0)
        check_int("eval_seed", eval_seed, 0)
        if sample is not None and not isinstance(sample, bool):
            raise TypeError(f"sample must be True, False or None (the rollout default), got {sample!r}")
        self.segment, self.eval_targets, self.eval_episodes = segment, eval_targets, eval_episodes
        self.eval_seed, self.sample = eval_seed, sample

    def bind(self, name: str, data: Any) -> None:
        super().bind(name, data)
        tokenizer = data.tokenizer
        self.trajectory = TrajectoryModality.from_tokenizer(tokenizer, max_ep_len=max(1024, data.max_episode_length))
        self.env_id = data.env_id
        if self.sample and not self.trajectory.discrete:
            raise ValueError(f"sample=True draws discrete actions; the {name!r} data's actions are continuous "
                             "(leave sample out)")
        if self.eval_targets is None:
            self.eval_targets = [float(np.round(data.episode_returns().max(), 1))]

    def modalities(self) -> dict[str, Any]:
        return {self.segment: self.trajectory}

    def heads(self) -> dict[str, Any]:
        return {self.head: ActionHeadConfig(segment=self.segment)}

    def inputs(self, batch: dict[str, Tensor]) -> dict[str, Any]:
        return {self.segment: TrajectoryWindows(**{k: batch[k] for k in (
            "states", "actions", "returns_to_go", "timesteps", "attention_mask", "rewards", "terminals")})}

    def loss(self, out: MultimodalOutput, batch: dict[str, Tensor]) -> Tensor:
        return action_loss(out.heads[self.head], batch["actions"], batch["attention_mask"], self.trajectory.discrete)

    def make_metrics(self) -> dict[str, Metric]:
        if not self.trajectory.discrete:
            return {"action_mse": MeanMetric()}
        return {"action_acc": MulticlassAccuracy(self.trajectory.act_dim, average="micro")}

    def update(self, metrics: nn.ModuleDict, out: MultimodalOutput, batch: Any, loss: Tensor) -> None:
        real = batch["attention_mask"].bool()
        preds = out.heads[self.head][real]
        if self.trajectory.discrete:
            metrics["action_acc"].update(preds, batch["actions"][real])
        else:
            metrics["action_mse"].update(loss.detach(), weight=int(real.sum()))  # per step, as the loss averages

    def predict(self, out: MultimodalOutput, batch: Any, model: MultimodalTransformer, data: Any) -> list[Record]:
        """The action at each window's last step (`tasks.decision_transformer.action_records`)."""
        return action_records(out.heads[self.head], batch, data.tokenizer)

    def evaluate(self, model: MultimodalTransformer) -> dict[str, float]:
        if self.env_id is None or self.eval_episodes == 0:
            return {}
        result = evaluate_returns(model.policy(self.segment, self.head), self.env_id, self.eval_targets,
                                  episodes=self.eval_episodes, seed=self.eval_seed, sample=self.sample)
        means = result.mean_returns()
        return {**{f"return_{t:g}": m for t, m in means.items()}, "return": means[max(means)]}

    def batch_size(self, batch: Any) -> int:
        return int(batch["states"].shape[0])


class ImageAudioMatch(Objective):
    """"Same digit?" from one sequence holding an image segment and an audio segment
    (`ImageAudioPairsDataModule` batches: ``pixel_values``, ``features``, ``feature_lengths``,
    ``labels`` 1 for the same digit). The classifier reads the image's class token, which
    attends to the audio: only attention across the two segments can solve it. Metric:
    accuracy."""

    def __init__(self, image: str = "image", audio: str = "audio", patch_size: int = 8, max_frames: int = 512,
                 subsampling_channels: int | None = 32, loss_weight: float = 1.0, sampling_weight: float = 1.0) -> None:
        super().__init__(loss_weight, sampling_weight)
        self.image_segment, self.audio_segment = image, audio
        self.patch_size, self.max_frames, self.subsampling_channels = patch_size, max_frames, subsampling_channels

    def bind(self, name: str, data: Any) -> None:
        super().bind(name, data)
        self.image = ImageModality(image_size=tuple(data.image_size), patch_size=self.patch_size,
                                   channels=data.channels, mean=tuple(data.mean), std=tuple(data.std))
        spectrogram = data.spectrogram_config
        self.audio = AudioModality(n_mels=spectrogram.n_mels, max_frames=self.max_frames,
                                   subsampling_channels=self.subsampling_channels, spectrogram=spectrogram.to_dict())

    def modalities(self) -> dict[str, Any]:
        return {self.image_segment: self.image, self.audio_segment: self.audio}

    def heads(self) -> dict[str, Any]:
        return {self.head: ClassifierHeadConfig(segment=self.image_segment, num_classes=2, pool="cls",
                                                class_names=("different", "same"))}

    def inputs(self, batch: dict[str, Tensor]) -> dict[str, Any]:
        return {self.image_segment: batch["pixel_values"],
                self.audio_segment: audio_tokens(batch["features"], batch["feature_lengths"])}

    def loss(self, out: MultimodalOutput, batch: dict[str, Tensor]) -> Tensor:
        return F.cross_entropy(out.heads[self.head].float(), batch["labels"])

    def make_metrics(self) -> dict[str, Metric]:
        return {"acc": MulticlassAccuracy(2, average="micro")}

    def update(self, metrics: nn.ModuleDict, out: MultimodalOutput, batch: Any, loss: Tensor) -> None:
        metrics["acc"].update(out.heads[self.head], batch["labels"])

    def predict(self, out: MultimodalOutput, batch: Any, model: MultimodalTransformer, data: Any) -> list[Record]:
        """The head's class ("different" / "same") with its probability; the truth as ``target``."""
        return class_records(out.heads[self.head], model.config.heads[self.head].class_names, batch.get("labels"))


def audio_tokens(features: Tensor, lengths: Tensor) -> Tokens:
    """(B, N, F) right-padded frames and (B,) frame counts -> audio `Tokens` with their mask."""
    mask = (torch.arange(features.shape[1], device=features.device)[None, :] < lengths[:, None]).long()
    return Tokens(features=features, attention_mask=mask, modality="audio")
