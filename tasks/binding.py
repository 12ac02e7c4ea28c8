"""One embedding space for image, text and speech (ImageBind, Girdhar et al., 2023): a CLIP with an
audio tower trained on two kinds of pairs only — (image, caption) and (audio, image). Speech
never meets text in training, yet text prompts classify it ("emergent" zero-shot), because
both are aligned with the same images.

The loss sums two symmetric InfoNCE terms, each with its own learnable temperature, both
DDP-correct (`tasks.contrastive.contrastive_loss`). Validation and test report image
zero-shot accuracy (class names as words and as numerals, prompt templates never used as
captions), audio zero-shot accuracy (text prompts -> held-out voices), and audio→image /
image→audio recall@1 on held-out pairs (the nearest item of the other modality shows the
same digit).

Axis legend: B batch, E embedding width, K classes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics.classification import MulticlassAccuracy

from tasks.contrastive import MAX_LOGIT_SCALE, ContrastiveTask, contrastive_loss
from tasks.data.image import DigitsDataModule
from tasks.predictions import Record, class_records
from tasks.recorded import record_model_config
from tokenizers_mm.checks import check_number
from unitok.zero_shot import ZeroShotClassifier


def recall_at_1(queries: Tensor, keys: Tensor, query_labels: Tensor, key_labels: Tensor) -> float:
    """Share of queries whose most similar key (cosine) has the query's label."""
    nearest = (F.normalize(queries.float(), dim=-1) @ F.normalize(keys.float(), dim=-1).T).argmax(dim=1)
    return float((key_labels[nearest] == query_labels).float().mean())


class BindTask(ContrastiveTask):
    """Trains a `CLIP` with an audio tower on a `MultiTaskDataModule` of two pair types.

    Args:
        preset: a `CLIPConfig` preset with an audio tower (``clip-digits-audio``, or
            ``clip-digits-audio-shared``: one backbone for all three modalities).
        image_text / audio_image: the data's task names of the (image, caption) pairs (a
            caption data module) and of the (audio, image) pairs (``pixel_values``,
            ``features``, ``feature_lengths``; ``audio_digits`` / ``image_digits`` for scoring),
            every row a matched pair (``same_fraction: 1.0``). Both read images as the image
            tower does, and built-in digits split the scans alike in both.
        audio_weight: the audio–image term's weight in the sum.
        The rest: as `ContrastiveTask`.
    """

    def __init__(
        self,
        preset: str = "clip-digits-audio",
        embed_dim: int | None = None,
        shared_backbone: bool | None = None,
        dropout: float | None = None,
        pretrained: str | None = None,
        image_tower: str | None = None,
        model_config: dict[str, Any] | None = None,
        lock_image_tower: bool = False,
        image_text: str = "image_text",
        audio_image: str = "audio_image",
        audio_weight: float = 1.0,
        learning_rate: float = 1e-3,
        weight_decay: float = 0.1,
        betas: tuple[float, float] = (0.9, 0.98),
        warmup_steps: int = 50,
        min_lr_ratio: float = 0.01,
        zero_shot_templates: Sequence[str] | None = None,
    ) -> None:
        super().__init__(preset=preset, embed_dim=embed_dim, shared_backbone=shared_backbone, dropout=dropout,
                         pretrained=pretrained, image_tower=image_tower, model_config=model_config,
                         lock_image_tower=lock_image_tower, learning_rate=learning_rate, weight_decay=weight_decay,
                         betas=betas, warmup_steps=warmup_steps, min_lr_ratio=min_lr_ratio,
                         zero_shot_templates=zero_shot_templates)
        if self.model.config.audio is None:
            raise ValueError(f"preset {preset!r} has no audio tower; use clip-digits-audio (or a CLIP with audio=...)")
        check_number("audio_weight", audio_weight, 0.0)  # NaN would make every loss NaN
        self.classifiers: dict[str, ZeroShotClassifier] = {}
        self._held: dict[str, list[Tensor]] = {}

    # ------------------------------------------------------------------ data
    def _tasks(self) -> dict[str, Any]:
        data = getattr(self.trainer, "datamodule", None)
        tasks = getattr(data, "tasks", None)
        h = self.hparams
        if tasks is None or set(tasks) != {h.image_text, h.audio_image}:
            raise ValueError(f"BindTask trains with a MultiTaskDataModule of two tasks, {h.image_text!r} (image, "
                             f"caption) and {h.audio_image!r} (audio, image); got "
                             f"{sorted(tasks) if tasks is not None else type(data).__name__}")
        return tasks

    def caption_data(self) -> Any:
        return self._tasks()[self.hparams.image_text]

    def image_data(self) -> dict[str, Any]:
        """Both pair types' data: one image tower reads their images, so they must agree."""
        return {f"the {name!r} data": data for name, data in self._tasks().items()}

    def _check_pairs(self, tasks: dict[str, Any], stage: str) -> None:
        """Refuse data that would train on what it should not: rows that are no pairs, scans held
        out by one pair type but trained on by the other, a pair type without a batch."""
        h = self.hparams
        if stage == "fit" and getattr(self.trainer.datamodule, "mode", None) == "max_size":
            raise ValueError("BindTask trains both pair types every step, which the data's mode 'max_size' leaves "
                             "without a batch once the shorter loader ends; use mode 'max_size_cycle' or 'min_size'")
        same_fraction = getattr(tasks[h.audio_image], "same_fraction", 1.0)
        if same_fraction != 1.0:
            raise ValueError(f"the {h.audio_image!r} data has same_fraction={same_fraction}: that share of its rows "
                             "show the same digit, the rest another, yet BindTask trains every row as a matched "
                             "(audio, image) pair; set same_fraction: 1.0")
        splits = {name: {key: getattr(task.digits, key) for key in ("test_fraction", "val_share", "split_seed")}
                  for name, task in tasks.items() if isinstance(getattr(task, "digits", None), DigitsDataModule)}
        if len(splits) == 2 and splits[h.image_text] != splits[h.audio_image]:
            # else scans that one pair type holds out (to score zero-shot) the other trains on
            raise ValueError(f"the two pair types split the digit scans differently ({h.image_text!r}: "
                             f"{splits[h.image_text]}, {h.audio_image!r}: {splits[h.audio_image]}): give them the "
                             "same test_fraction, val_share and split_seed")

    def setup(self, stage: str) -> None:
        tasks = self._tasks()
        self._check_pairs(tasks, stage)
        super().setup(stage)
        self.pair_names = list(tasks)  # validation's dataloader_idx follows the data's order
        audio_data = tasks[self.hparams.audio_image]
        spectrogram = getattr(audio_data, "spectrogram_config", None)
        audio = self.model.config.audio
        if spectrogram is not None:
            if spectrogram.n_mels != audio.n_mels:
                raise ValueError(f"the audio data has {spectrogram.n_mels} mel bins, the audio tower {audio.n_mels}")
            if not audio.spectrogram:  # stored with the model: raw audio is read as in training
                self.model.config = self.model.config.replace(audio=audio.replace(spectrogram=spectrogram.to_dict()))
                self.model.audio.config = self.model.config.audio
                record_model_config(self, self.model.config)  # with the data's spectrogram settings
            elif audio.spectrogram != spectrogram.to_dict():
                raise ValueError(f"the audio data's spectrogram settings {spectrogram.to_dict()} differ from the "
                                 f"model's {audio.spectrogram}")
        numerals = getattr(self.caption_data(), "class_numerals", None)
        self.zero_shot_numerals = list(numerals) if numerals else None
        K = len(self.zero_shot_names) if self.val_acc is not None else 0
        if K:
            self.accuracy = torch.nn.ModuleDict({name: MulticlassAccuracy(K, average="micro")
                                                 for name in ("image", "image_numerals", "audio")}).to(self.device)

    # ------------------------------------------------------------------ steps
    def _image_text_loss(self, batch: dict[str, Tensor], gather: bool = True) -> tuple[Tensor, Tensor]:
        image = self.model.encode_image(batch["pixel_values"])
        text = self.model.encode_text(batch["input_ids"])
        return contrastive_loss(image, text, self.model.logit_scale, gather=gather), image

    def _audio_image_loss(self, batch: dict[str, Tensor], gather: bool = True) -> tuple[Tensor, Tensor, Tensor]:
        audio = self.model.encode_audio(batch["features"], batch["feature_lengths"])
        image = self.model.encode_image(batch["pixel_values"])
        return contrastive_loss(audio, image, self.model.logit_scale_audio, gather=gather), audio, image

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        h = self.hparams
        image_text, _ = self._image_text_loss(batch[h.image_text])
        audio_image, _, _ = self._audio_image_loss(batch[h.audio_image])
        loss = image_text + h.audio_weight * audio_image
        B = batch[h.image_text]["input_ids"].shape[0]
        self.log("train_image_text_loss", image_text, batch_size=B)
        self.log("train_audio_image_loss", audio_image, batch_size=B)
        self.log("train_loss", loss, prog_bar=True, batch_size=B)
        self.log("logit_scale", self.model.logit_scale.detach().exp(), batch_size=B)
        self.log("logit_scale_audio", self.model.logit_scale_audio.detach().exp(), batch_size=B)
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        with torch.no_grad():  # as CLIP: each temperature keeps its scale in [1, 100]
            self.model.logit_scale.clamp_(0.0, MAX_LOGIT_SCALE)
            self.model.logit_scale_audio.clamp_(0.0, MAX_LOGIT_SCALE)

    def _build_classifier(self) -> None:
        if self.val_acc is None:
            return
        self.classifiers = {"words": ZeroShotClassifier(self.model, self.zero_shot_names, self.zero_shot_prompts)}
        if self.zero_shot_numerals:
            self.classifiers["numerals"] = ZeroShotClassifier(self.model, self.zero_shot_numerals,
                                                              self.zero_shot_prompts)
        for classifier in self.classifiers.values():
            classifier.class_embeddings  # noqa: B018 — build now, once per evaluation
        self._held = {"audio": [], "image": [], "audio_digits": [], "image_digits": []}

    def _eval_step(self, batch: dict[str, Any], stage: str, dataloader_idx: int) -> None:  # type: ignore[override]
        name = self.pair_names[dataloader_idx]
        if name == self.hparams.image_text:
            loss, image = self._image_text_loss(batch, gather=False)
            self.log(f"{stage}_image_text_loss", loss, batch_size=len(image), add_dataloader_idx=False, sync_dist=True)
            if self.classifiers:
                self.accuracy["image"].update(self.classifiers["words"].logits_from_features(image), batch["labels"])
                if "numerals" in self.classifiers:
                    self.accuracy["image_numerals"].update(self.classifiers["numerals"].logits_from_features(image),
                                                           batch["labels"])
            return
        loss, audio, image = self._audio_image_loss(batch, gather=False)
        self.log(f"{stage}_audio_image_loss", loss, batch_size=len(audio), add_dataloader_idx=False, sync_dist=True)
        if self.classifiers and "audio_digits" in batch:
            self.accuracy["audio"].update(self.classifiers["words"].logits_from_features(audio), batch["audio_digits"])
            for key, value in (("audio", audio), ("image", image), ("audio_digits", batch["audio_digits"]),
                               ("image_digits", batch["image_digits"])):
                self._held[key].append(value.detach())

    def validation_step(self, batch: dict[str, Any], batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_step(batch, "val", dataloader_idx)

    def test_step(self, batch: dict[str, Any], batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_step(batch, "test", dataloader_idx)

    def _epoch_end(self, stage: str) -> dict[str, float]:
        if not self.classifiers:
            return {}
        values = {f"{stage}_image_zero_shot_acc": float(self.accuracy["image"].compute()),
                  f"{stage}_audio_zero_shot_acc": float(self.accuracy["audio"].compute())}
        if "numerals" in self.classifiers:
            values[f"{stage}_image_zero_shot_acc_numerals"] = float(self.accuracy["image_numerals"].compute())
        if self._held["audio"]:
            held = {k: torch.cat(v) for k, v in self._held.items()}
            values[f"{stage}_audio_to_image_r1"] = recall_at_1(held["audio"], held["image"], held["audio_digits"],
                                                               held["image_digits"])
            values[f"{stage}_image_to_audio_r1"] = recall_at_1(held["image"], held["audio"], held["image_digits"],
                                                               held["audio_digits"])
        for metric in self.accuracy.values():
            metric.reset()
        for key, value in values.items():
            self.log(key, value, prog_bar=key.endswith("zero_shot_acc"), sync_dist=True)
        return values

    def on_validation_epoch_end(self) -> None:
        self._epoch_end("val")

    def on_predict_epoch_start(self) -> None:
        self._build_classifier()
        if not self.classifiers:
            raise ValueError("predict classifies zero-shot: the caption data needs class names and prompts")

    @torch.no_grad()
    def predict_step(  # type: ignore[override]
            self, batch: dict[str, Any], batch_idx: int, dataloader_idx: int = 0) -> list[Record]:
        """Records (`tasks.predictions`) with the pair type as ``task``: a scan's zero-shot class
        (image_text) or a spoken digit's (audio_image: text prompts classify speech never paired
        with text), its softmax probability over the classes, the true digit as ``target``."""
        name = self.pair_names[dataloader_idx]
        classifier = self.classifiers["words"]
        if name == self.hparams.image_text:
            embeds, labels = self.model.encode_image(batch["pixel_values"]), batch.get("labels")
        else:
            embeds = self.model.encode_audio(batch["features"], batch["feature_lengths"])
            labels = batch.get("audio_digits")
        found = class_records(classifier.logits_from_features(embeds), classifier.classnames, labels)
        return [{"task": name, **record} for record in found]

    def on_test_epoch_end(self) -> None:
        values = self._epoch_end("test")
        if values and self.trainer.is_global_zero:
            print("\n".join([
                f"image zero-shot accuracy (held-out scans, unseen templates): {values['test_image_zero_shot_acc']:.1%} "
                "with class names as words"
                + (f", {values['test_image_zero_shot_acc_numerals']:.1%} as numerals"
                   if "test_image_zero_shot_acc_numerals" in values else ""),
                f"audio zero-shot accuracy (held-out voices, never paired with text): "
                f"{values['test_audio_zero_shot_acc']:.1%}",
                f"recall@1 audio→image {values.get('test_audio_to_image_r1', float('nan')):.1%}, "
                f"image→audio {values.get('test_image_to_audio_r1', float('nan')):.1%}",
            ]))
