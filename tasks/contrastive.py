"""Contrastive image–text pretraining (CLIP): symmetric InfoNCE with a learnable temperature,
correct across devices, and zero-shot accuracy as the validation / test metric.

Axis legend: B local batch, G global batch (all devices), E embedding width, K classes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor
from torchmetrics.classification import MulticlassAccuracy

from tasks.optim import adamw_warmup_cosine
from tasks.predictions import Record, class_records
from tasks.recorded import record_model_config
from unitok.models import CLIP, CLIPConfig, ViT
from unitok.zero_shot import ZeroShotClassifier

MAX_LOGIT_SCALE = math.log(100.0)  # CLIP clips the temperature so logits are scaled by at most 100


def gather_with_grad(x: Tensor) -> Tensor:
    """All devices' (B, E) rows -> (G, E) in rank order; gradients flow back to every rank's
    rows (``torch.distributed.nn.all_gather``), so each device's loss trains the others' towers."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return x
    from torch.distributed.nn.functional import all_gather

    return torch.cat(all_gather(x), dim=0)


def contrastive_loss(image_embeds: Tensor, text_embeds: Tensor, logit_scale: Tensor, gather: bool = True) -> Tensor:
    """Symmetric InfoNCE over matched (image, caption) rows, the CLIP loss.

    ``(CE(s·I·Tᵀ, diag) + CE(s·T·Iᵀ, diag)) / 2`` with s = exp(logit_scale) and normalised
    (B, E) embeddings. Under data parallelism each device scores its B rows against all G
    rows of the other modality (open_clip's "local loss" with gathered features); the mean of
    the devices' losses — what DDP's gradient averaging optimises — is then the single-device
    loss on the global batch.
    """
    if image_embeds.shape != text_embeds.shape or image_embeds.dim() != 2:
        raise ValueError(f"need matching (batch, dim) embeddings, got {tuple(image_embeds.shape)} "
                         f"and {tuple(text_embeds.shape)}")
    image_embeds, text_embeds = F.normalize(image_embeds.float(), dim=-1), F.normalize(text_embeds.float(), dim=-1)
    all_images = gather_with_grad(image_embeds) if gather else image_embeds
    all_texts = gather_with_grad(text_embeds) if gather else text_embeds
    B = image_embeds.shape[0]
    rank = dist.get_rank() if gather and dist.is_available() and dist.is_initialized() else 0
    labels = torch.arange(B, device=image_embeds.device) + rank * B  # row i matches global column rank·B + i
    scale = logit_scale.float().exp()
    logits_per_image = scale * image_embeds @ all_texts.T  # (B, G)
    logits_per_text = scale * text_embeds @ all_images.T  # (B, G)
    return 0.5 * (F.cross_entropy(logits_per_image, labels) + F.cross_entropy(logits_per_text, labels))


class ContrastiveTask(L.LightningModule):
    """Trains a unitok `CLIP` on ``{"pixel_values", "input_ids", "labels"}`` batches.

    Logs ``train_loss``, ``logit_scale``, ``val_loss`` and — when the data module has
    ``class_names`` and ``zero_shot_templates`` — ``val_zero_shot_acc`` / ``test_zero_shot_acc``:
    held-out images classified by a `ZeroShotClassifier` built from the prompts.

    Args:
        preset: a `CLIPConfig` preset. embed_dim / shared_backbone / dropout: override it.
        pretrained: a CLIP ``save_pretrained`` folder to start from; it keeps its own shape
            (``embed_dim`` and ``shared_backbone`` given with it are errors), ``dropout`` (a
            training choice, as for BERT and GPT fine-tuning) sets its image and text towers'.
        image_tower: a ViT ``save_pretrained`` folder (e.g. from ``configs/vit/digits.yaml``)
            to start the image tower from; its classifier is dropped.
        model_config: the CLIP's config as a dict, as the options above gave it and the data
            completed it (normalisation; set automatically, so a checkpoint rebuilds its model
            without the ``pretrained`` or ``image_tower`` folder; wins over the options above).
        lock_image_tower: LiT — freeze the image tower and its projection.
        learning_rate / weight_decay / betas / warmup_steps / min_lr_ratio: AdamW, warm-up + cosine.
        zero_shot_templates: override the data module's prompts for the zero-shot metric.
    """

    def __init__(
        self,
        preset: str = "clip-digits",
        embed_dim: int | None = None,
        shared_backbone: bool | None = None,
        dropout: float | None = None,
        pretrained: str | None = None,
        image_tower: str | None = None,
        model_config: dict[str, Any] | None = None,
        lock_image_tower: bool = False,
        learning_rate: float = 1e-3,
        weight_decay: float = 0.1,
        betas: tuple[float, float] = (0.9, 0.98),
        warmup_steps: int = 50,
        min_lr_ratio: float = 0.01,
        zero_shot_templates: Sequence[str] | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        if isinstance(zero_shot_templates, str):  # its characters would be the templates
            raise TypeError(f"zero_shot_templates must be a list of templates, got the string {zero_shot_templates!r} "
                            f"(for one: [{zero_shot_templates!r}])")
        if image_tower is not None and dropout is not None:
            raise ValueError("dropout sets the towers built here; an image_tower brings its own (only the text "
                             "tower's would change): leave dropout out, or set it in the ViT's recipe")
        self.model = self._build_model()
        record_model_config(self, self.model.config)  # again once the data has completed it (`setup`)
        if lock_image_tower:
            self.model.lock_image_tower()
        self.classifier: ZeroShotClassifier | None = None
        self.val_acc: MulticlassAccuracy | None = None
        self.test_acc: MulticlassAccuracy | None = None

    def _build_model(self) -> CLIP:
        h = self.hparams
        if h.model_config is not None:  # a checkpoint's: its weights follow, no starting folder is read
            return CLIP(CLIPConfig.from_dict(dict(h.model_config)))
        overrides: dict[str, Any] = {k: v for k, v in dict(embed_dim=h.embed_dim, shared_backbone=h.shared_backbone)
                                     .items() if v is not None}
        if h.pretrained is not None:
            if overrides or h.image_tower is not None:
                raise ValueError("a pretrained CLIP's shape and image tower cannot be overridden")
            model = CLIP.from_pretrained(h.pretrained).train()  # loaded in eval mode; Lightning keeps modes
            if h.dropout is not None and (h.dropout, h.dropout) != (model.config.vision.dropout,
                                                                    model.config.text.dropout):
                c = model.config  # dropout in the image and text towers, as a fresh model's sets them
                model = model.rebuilt(c.replace(vision=c.vision.replace(dropout=h.dropout),
                                                text=c.text.replace(dropout=h.dropout)))
            return model
        config = CLIPConfig.from_name(h.preset, **overrides)
        if h.dropout is not None:
            config = config.replace(vision=config.vision.replace(dropout=h.dropout),
                                    text=config.text.replace(dropout=h.dropout))
        if h.image_tower is None:
            return CLIP(config)
        vit = ViT.from_pretrained(h.image_tower)
        return CLIP.from_vit(vit, text=config.text, embed_dim=config.embed_dim, shared_backbone=config.shared_backbone,
                             audio=config.audio).train()

    def forward(self, pixel_values: Tensor, input_ids: Tensor) -> Any:
        return self.model(pixel_values, input_ids)

    # ------------------------------------------------------------------ setup
    def caption_data(self) -> Any:
        """The data module of (image, caption) pairs (None outside a trainer)."""
        return getattr(self.trainer, "datamodule", None)

    def image_data(self) -> dict[str, Any]:
        """Every data module whose images the image tower reads, by the name errors give it."""
        datamodule = self.caption_data()
        return {} if datamodule is None else {"the data": datamodule}

    def setup(self, stage: str) -> None:
        datamodule = self.caption_data()
        if datamodule is None:
            return
        c = self.model.config
        images = self.image_data()
        for what, data in images.items():
            for name in ("channels", "image_size"):
                data_value = getattr(data, name, None)
                model_value = getattr(c.vision, name)
                if data_value is not None and tuple(_pair(data_value)) != tuple(_pair(model_value)):
                    raise ValueError(f"{what} has {name}={data_value} but the image tower {model_value}; "
                                     f"match them (the data's {name})")
        context = getattr(datamodule, "context_length", None)
        if context is not None and context > c.text.context_length:
            raise ValueError(f"the data tokenizes captions up to {context} tokens but the text tower has "
                             f"context_length={c.text.context_length}; set --data.context_length {c.text.context_length}")
        stats = {what: (tuple(data.mean), tuple(data.std)) for what, data in images.items()
                 if getattr(data, "mean", None) is not None and getattr(data, "std", None) is not None}
        if len(set(stats.values())) > 1:  # one tower would learn to read one scan normalised two ways
            given = "; ".join(f"{what} mean {mean}, std {std}" for what, (mean, std) in stats.items())
            raise ValueError(f"the image tower reads pixels normalised one way, but the data differ: {given}; "
                             "give them the same mean and std")
        mean, std = next(iter(stats.values()), (c.vision.mean, c.vision.std))
        if (mean, std) != (c.vision.mean, c.vision.std):
            if self.hparams.lock_image_tower:  # frozen, it cannot learn to read pixels normalised otherwise
                raise ValueError(f"the locked image tower reads pixels normalised with mean {c.vision.mean}, std "
                                 f"{c.vision.std}; the data gives mean {mean}, std {std}: set the data's "
                                 "mean and std to the tower's")
            # Stored with the model, so zero-shot on raw images normalises as in training.
            self.model.config = c.replace(vision=c.vision.replace(mean=mean, std=std))
            self.model.visual.config = self.model.config.vision
            record_model_config(self, self.model.config)  # the config its weights are trained in
        names = getattr(datamodule, "class_names", None)
        templates = self.hparams.zero_shot_templates or getattr(datamodule, "zero_shot_templates", None)
        if names and templates:
            self.zero_shot_names, self.zero_shot_prompts = list(names), list(templates)
            K = len(names)
            self.val_acc = MulticlassAccuracy(K, average="micro").to(self.device)
            self.test_acc = MulticlassAccuracy(K, average="micro").to(self.device)

    def _build_classifier(self) -> None:
        if self.val_acc is None:
            return
        self.classifier = ZeroShotClassifier(self.model, self.zero_shot_names, self.zero_shot_prompts)
        self.classifier.class_embeddings  # noqa: B018 — build now, once per evaluation

    # ------------------------------------------------------------------ steps
    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        image = self.model.encode_image(batch["pixel_values"])
        text = self.model.encode_text(batch["input_ids"])
        loss = contrastive_loss(image, text, self.model.logit_scale)
        B = batch["input_ids"].shape[0]
        self.log("train_loss", loss, prog_bar=True, batch_size=B)
        self.log("logit_scale", self.model.logit_scale.detach().exp(), batch_size=B)
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        with torch.no_grad():  # as CLIP: keep exp(logit_scale) in [1, 100]
            self.model.logit_scale.clamp_(0.0, MAX_LOGIT_SCALE)

    def _eval_step(self, batch: dict[str, Tensor], stage: str, metric: MulticlassAccuracy | None) -> None:
        image = self.model.encode_image(batch["pixel_values"])
        text = self.model.encode_text(batch["input_ids"])
        B = batch["input_ids"].shape[0]
        self.log(f"{stage}_loss", contrastive_loss(image, text, self.model.logit_scale, gather=False),
                 prog_bar=True, batch_size=B, sync_dist=True)
        if metric is not None and self.classifier is not None:
            metric(self.classifier.logits_from_features(image), batch["labels"])
            self.log(f"{stage}_zero_shot_acc", metric, prog_bar=True)

    def on_validation_epoch_start(self) -> None:
        self._build_classifier()

    def on_test_epoch_start(self) -> None:
        self._build_classifier()

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._eval_step(batch, "val", self.val_acc)

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._eval_step(batch, "test", self.test_acc)

    def on_test_epoch_end(self) -> None:
        if self.test_acc is not None and self.trainer.is_global_zero:
            rank_zero_info(f"zero-shot accuracy on held-out images: {float(self.test_acc.compute()):.1%}")

    # ------------------------------------------------------------------ predict
    def on_predict_epoch_start(self) -> None:
        """The candidates each image is matched with: the data's classes (zero-shot, with its
        prompts) or, for data without classes, the predict set's distinct captions (retrieval)."""
        if self.val_acc is not None:
            self.candidates = list(self.zero_shot_names)
            self.classifier = ZeroShotClassifier(self.model, self.candidates, self.zero_shot_prompts)
        else:
            self.candidates = list(dict.fromkeys(self._predict_captions()))
            self.classifier = ZeroShotClassifier(self.model, self.candidates, ["{}"])

    def _predict_captions(self) -> list[str]:
        loaders = self.trainer.predict_dataloaders
        dataset = getattr(loaders[0] if isinstance(loaders, list | tuple) else loaders, "dataset", None)
        caption = getattr(dataset, "caption", None)
        if caption is None:
            raise ValueError("predict needs the data's class names and zero-shot prompts, or captions to match "
                             f"the images with; {type(dataset).__name__} has neither")
        return [caption(i) for i in range(len(dataset))]

    @torch.no_grad()
    def predict_step(self, batch: dict[str, Tensor], batch_idx: int) -> list[Record]:
        """Records (`tasks.predictions`): each image's zero-shot class (or best-matching
        caption) with its softmax probability over the candidates, the true class as ``target``."""
        image = self.model.encode_image(batch["pixel_values"])
        labels = batch.get("labels") if self.val_acc is not None else None
        logits = self.classifier.logits_from_features(image)  # type: ignore[union-attr]
        return class_records(logits, self.candidates, labels)

    def configure_optimizers(self):
        return adamw_warmup_cosine(self.model, self.trainer, self.hparams)


def _pair(value: Any) -> tuple[int, ...]:
    return (value, value) if isinstance(value, int) else tuple(value)
