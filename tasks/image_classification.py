"""Image classification for ViT, DeiT (with hard or soft distillation) and MLP-Mixer.

Axis legend: B batch, K classes, C/H/W image channels/height/width.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn
from torchmetrics.classification import MulticlassAccuracy, MulticlassConfusionMatrix

from tasks.data.base import SplitDataModule
from tasks.data.sampling import mix_seed, run_seed
from tasks.optim import adamw_warmup_cosine
from tasks.predictions import Record, class_records
from tasks.recorded import record_model_config
from tasks.run_folder import log_dir
from tasks.teachers import TRAIN_CNN, accuracy, freeze, load_teacher, mix_up, train_cnn_teacher
from tokenizers_mm.checks import check_int, check_number
from unitok.models import DeiT, MixerConfig, MLPMixer, ViT, ViTConfig
from unitok.models.vision import ImageModel
from unitok.outputs import ImageClassifierOutput

Family = Literal["vit", "deit", "mixer"]
Distillation = Literal["none", "hard", "soft"]
FAMILIES: dict[str, tuple[type[ImageModel], type[ViTConfig] | type[MixerConfig]]] = {
    "vit": (ViT, ViTConfig), "deit": (DeiT, ViTConfig), "mixer": (MLPMixer, MixerConfig),
}
DEFAULT_PRESETS = {"vit": "vit-digits", "deit": "deit-digits", "mixer": "mixer-digits"}
_MIXUP = 3  # the first word of the mixup draws' seeds (the samplers' streams use 0–2)


def hard_distillation_loss(logits_cls: Tensor, logits_dist: Tensor, labels: Tensor, teacher_logits: Tensor,
                           label_smoothing: float = 0.0) -> Tensor:
    """DeiT's hard distillation: ½·CE(class head, labels) + ½·CE(distillation head, teacher's argmax).

    Label smoothing applies to the true labels only. (B, K), (B, K), (B,) class indices or (B, K)
    probabilities (mixup's), (B, K) -> scalar.
    """
    base = F.cross_entropy(logits_cls, labels, label_smoothing=label_smoothing)
    return 0.5 * base + 0.5 * F.cross_entropy(logits_dist, teacher_logits.argmax(dim=-1))


def soft_distillation_loss(logits_cls: Tensor, logits_dist: Tensor, labels: Tensor, teacher_logits: Tensor,
                           alpha: float = 0.5, tau: float = 3.0, label_smoothing: float = 0.0) -> Tensor:
    """DeiT's soft distillation: (1 − α)·CE(class head, labels) + α·τ²·KL(p_teacher ‖ p_student).

    p = softmax(logits / τ), the student's from the distillation head. The teacher's distribution
    is the target (as in DeiT's and Hinton et al.'s code; the paper writes KL(ψ(Z_s/τ), ψ(Z_t/τ))):
    Σ_k p_t,k (log p_t,k − log p_s,k), averaged over the batch (timm divides by B·K instead).
    ``labels``: (B,) class indices or (B, K) probabilities (mixup's).
    """
    base = F.cross_entropy(logits_cls, labels, label_smoothing=label_smoothing)
    log_student = F.log_softmax(logits_dist / tau, dim=-1)
    log_teacher = F.log_softmax(teacher_logits / tau, dim=-1)
    kl = F.kl_div(log_student, log_teacher, reduction="batchmean", log_target=True)
    return (1.0 - alpha) * base + alpha * tau * tau * kl


class ImageClassificationTask(L.LightningModule):
    """Trains a ViT, DeiT or MLP-Mixer classifier on ``{"pixel_values", "labels"}`` batches.

    Logs ``train_loss``, ``val_loss``, ``val_acc`` (top-1), ``val_top5`` (top-k, k = min(5, K)),
    ``test_loss`` and ``test_acc`` (and, distilling, ``teacher_val_acc``: the teacher's top-1 on the
    validation split, printed before training); after ``test`` it saves ``confusion_matrix.png`` into the
    log dir (and keeps the counts in ``confusion_matrix``); ``predict`` returns class indices.
    Validation and test score the model's ``logits`` (for DeiT, the two heads' average).

    Args:
        family / preset: the model (``preset`` defaults to the family's ``*-digits`` preset).
        num_classes / image_size / channels / d_model / n_layers / n_heads / dropout: override
            the preset when given (num_classes, channels must match the data module).
        pretrained: a ``save_pretrained`` folder to start from (of this family); only
            ``num_classes`` (a new head), ``image_size`` (ViT/DeiT) and ``dropout`` (a training
            choice, as for BERT and GPT fine-tuning) may then be overridden.
        model_config: the model's config as a dict, as ``preset`` or ``pretrained`` and the
            options above gave it and the data completed it (normalisation, resizing filter;
            set automatically, so a checkpoint rebuilds its model without ``pretrained``'s
            folder; wins over ``preset``, ``pretrained`` and the options above).
        learning_rate / weight_decay / betas / warmup_steps / min_lr_ratio: AdamW (no decay
            on biases and norm gains), linear warm-up then cosine decay.
        label_smoothing: on the cross-entropy with the true labels.
        mixup: α > 0 trains the student on mixup batches (a Beta(α, α) mixing weight; 0: none):
            each batch blended with a shuffled copy of itself, the labels alike, and a teacher
            reads the same blended images (its predictions on them are the targets: Beyer et
            al., 2022's "consistent teacher"). Drawn from the run's seed and the batch.
        distillation: "none", "hard" or "soft" (DeiT only) with ``distill_alpha`` /
            ``distill_tau`` (soft); see `hard_distillation_loss`, `soft_distillation_loss`.
        teacher: ``"cnn:train"`` (train a `SmallCNN` on the training split for ``teacher_steps``
            before fitting, with mixup at ``teacher_mixup`` (a Beta(α, α) mixing weight; 0: none),
            seeded by the run's seed; its state dict is saved as
            ``teacher_cnn.pt`` in the log dir), a ``.pt`` SmallCNN
            state dict, or a ``save_pretrained`` folder of a unitok image model.
        teacher_module: a ready teacher ``nn.Module`` (from Python) instead of ``teacher``.
            Teachers are frozen, in eval mode, never saved in the task's checkpoints.
    """

    def __init__(
        self,
        family: Family = "vit",
        preset: str | None = None,
        num_classes: int | None = None,
        image_size: int | tuple[int, int] | None = None,
        channels: int | None = None,
        d_model: int | None = None,
        n_layers: int | None = None,
        n_heads: int | None = None,
        dropout: float | None = None,
        pretrained: str | None = None,
        model_config: dict[str, Any] | None = None,
        learning_rate: float = 1e-3,
        weight_decay: float = 0.05,
        betas: tuple[float, float] = (0.9, 0.999),
        warmup_steps: int = 50,
        min_lr_ratio: float = 0.01,
        label_smoothing: float = 0.0,
        mixup: float = 0.0,
        distillation: Distillation = "none",
        distill_alpha: float = 0.5,
        distill_tau: float = 3.0,
        teacher: str | None = None,
        teacher_steps: int = 200,
        teacher_mixup: float = 0.0,
        teacher_module: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["teacher_module"])
        if family not in FAMILIES:
            raise ValueError(f"family must be one of {', '.join(FAMILIES)}, got {family!r}")
        if distillation not in ("none", "hard", "soft"):
            raise ValueError(f"distillation must be 'none', 'hard' or 'soft', got {distillation!r}")
        if distillation != "none" and family != "deit":
            raise ValueError(f"distillation={distillation!r} needs family='deit' (a distillation token)")
        if distillation == "none" and (teacher is not None or teacher_module is not None):
            raise ValueError("a teacher was given but distillation='none'; choose 'hard' or 'soft'")
        if not mixup >= 0:  # NaN too
            raise ValueError(f"mixup must be ≥ 0 (a Beta(α, α) mixing weight; 0: no mixup), got {mixup}")
        if not teacher_mixup >= 0:  # NaN too
            raise ValueError(f"teacher_mixup must be ≥ 0 (a Beta(α, α) mixing weight; 0: no mixup), got {teacher_mixup}")
        if teacher_mixup > 0 and teacher is not None and teacher != TRAIN_CNN:  # no teacher: unused, as teacher_steps
            raise ValueError(f"teacher_mixup trains the {TRAIN_CNN!r} teacher; teacher={teacher!r} is not trained here")
        check_number("distill_alpha", distill_alpha, 0.0, 1.0)
        check_number("distill_tau", distill_tau, 0.0, low_open=True)
        check_number("label_smoothing", label_smoothing, 0.0, 1.0)
        check_int("teacher_steps", teacher_steps)
        self.model = self._build_model()
        record_model_config(self, self.model.config)  # again once the data has completed it (`setup`)
        K = self.model.config.num_classes
        if K < 2:
            raise ValueError(f"classification needs num_classes ≥ 2, got {K}")
        self.top_k = min(5, K)
        self.val_acc = MulticlassAccuracy(K, top_k=1, average="micro")
        self.val_topk = MulticlassAccuracy(K, top_k=self.top_k, average="micro")
        self.test_acc = MulticlassAccuracy(K, top_k=1, average="micro")
        self.test_confusion = MulticlassConfusionMatrix(K)
        self.confusion_matrix: Tensor | None = None  # (K, K) after `test`: rows true, columns predicted
        # Not a submodule: the teacher stays out of checkpoints, optimisers and device moves.
        self.__dict__["teacher_model"] = freeze(teacher_module) if teacher_module is not None else None
        self.teacher_val_acc: float | None = None  # the teacher's validation accuracy, set in setup("fit")

    # ------------------------------------------------------------------ model
    def _build_model(self) -> ImageModel:
        h = self.hparams
        model_class, config_class = FAMILIES[h.family]
        if h.model_config is not None:  # a checkpoint's: its weights follow, the starting folder is not read
            return model_class(config_class.from_dict(dict(h.model_config)))
        shape = {k: v for k, v in dict(d_model=h.d_model, n_layers=h.n_layers, n_heads=h.n_heads,
                                       dropout=h.dropout, channels=h.channels).items() if v is not None}
        if h.family == "mixer" and "n_heads" in shape:
            raise ValueError("MLP-Mixer has no attention heads; leave n_heads unset")
        image_size = tuple(h.image_size) if isinstance(h.image_size, (list, tuple)) else h.image_size
        if isinstance(image_size, int):  # configs hold (height, width)
            image_size = (image_size, image_size)
        if h.pretrained is not None:
            architecture = [k for k in shape if k != "dropout"]  # dropout: fine-tuning's
            if architecture:
                raise ValueError(f"a pretrained model's {', '.join(architecture)} cannot be overridden")
            model = model_class.from_pretrained(h.pretrained).train()  # loading gives eval mode
            if h.dropout is not None and h.dropout != model.config.dropout:
                # the config's dropout, as a fresh model's override sets it: on the embeddings and
                # residual branches, and on a ViT's (DeiT's) attention weights too
                model = model.rebuilt(model.config.replace(dropout=h.dropout))
            if h.num_classes is not None and h.num_classes != model.config.num_classes:
                model.reset_classifier(h.num_classes)
            if image_size is not None:
                if not isinstance(model, ViT):
                    raise ValueError("MLP-Mixer mixes a fixed number of patches; its image_size cannot change")
                model.set_image_size(image_size)
            return model
        overrides = dict(shape)
        if h.num_classes is not None:
            overrides["num_classes"] = h.num_classes
        if image_size is not None:
            overrides["image_size"] = image_size
        preset = h.preset or DEFAULT_PRESETS[h.family]
        if h.channels is not None and len(config_class.from_name(preset).mean) != h.channels:
            # Normalisation has one value per channel; the data module's replaces this in `setup`.
            overrides.update(mean=(0.5,) * h.channels, std=(0.5,) * h.channels)
        return model_class(config_class.from_name(preset, **overrides))

    def forward(self, pixel_values: Tensor, **kwargs: Any) -> ImageClassifierOutput:
        return self.model(pixel_values, **kwargs)

    def _classify(self, pixel_values: Tensor) -> ImageClassifierOutput:
        """The model's logits, a class-token ViT / DeiT computing only its class tokens in the
        last block (the same logits, less work)."""
        model = self.model
        if isinstance(model, ViT) and model.reads_class_tokens:
            return model(pixel_values, class_tokens_only=True)
        return model(pixel_values)

    def setup(self, stage: str) -> None:
        """Check the data against the model, adopt its normalisation, and ready the teacher."""
        datamodule = getattr(self.trainer, "datamodule", None)
        if datamodule is not None:
            self._check_data(datamodule)
        if stage == "fit" and self.hparams.distillation != "none":
            if self.teacher_model is None:
                self.__dict__["teacher_model"] = self._resolve_teacher(datamodule)
            if datamodule is not None:
                self._score_teacher(datamodule)

    def _score_teacher(self, datamodule: L.LightningDataModule) -> None:
        # A teacher no better than its student has little to teach it: say how good it is.
        if isinstance(datamodule, SplitDataModule) and datamodule.dataset("val") is None:
            return
        loader, device = datamodule.val_dataloader(), self.trainer.strategy.root_device
        self.teacher_val_acc = accuracy(self.teacher_model.to(device), loader, device)
        rank_zero_info(f"the teacher's validation accuracy: {self.teacher_val_acc:.2%} "
                       f"({len(loader.dataset)} held-out images)")

    def on_train_start(self) -> None:
        if self.teacher_val_acc is not None:
            self.log("teacher_val_acc", self.teacher_val_acc, on_epoch=True)

    def _check_data(self, datamodule: L.LightningDataModule) -> None:
        c = self.model.config
        for name in ("num_classes", "channels"):
            data_value = getattr(datamodule, name, None)
            if data_value is not None and data_value != getattr(c, name):
                raise ValueError(f"the data has {name}={data_value} but the model {getattr(c, name)}; "
                                 f"set the model's {name}: {data_value}")
        size = getattr(datamodule, "image_size", None)
        if size is not None and tuple(size) != tuple(c.image_size):
            # the export says which size it reads: a model trained on other images would be
            # exported as reading this size, and answer wrongly there
            raise ValueError(f"the data's images are {size[0]}×{size[1]} but the model's image_size is "
                             f"{c.image_size[0]}×{c.image_size[1]}; set the model's image_size: {list(size)}")
        # Stored with the model, so `model.predict` and the pipelines read raw images as training
        # did: the same normalisation, the same resizing filter, and no crop where the data
        # resizes plainly (a timm model's crop_pct would crop what training squashed).
        changes: dict[str, Any] = {}
        mean, std = getattr(datamodule, "mean", None), getattr(datamodule, "std", None)
        if mean is not None and std is not None and (tuple(mean), tuple(std)) != (c.mean, c.std):
            changes.update(mean=tuple(mean), std=tuple(std))
        interpolation = getattr(datamodule, "interpolation", None)
        if interpolation is not None and interpolation != c.interpolation:
            changes["interpolation"] = interpolation
        if hasattr(datamodule, "crop_pct") and datamodule.crop_pct != c.crop_pct:
            changes["crop_pct"] = datamodule.crop_pct
        if changes:
            self.model.config = c.replace(**changes)
            record_model_config(self, self.model.config)  # the config its weights are trained in

    def _resolve_teacher(self, datamodule: L.LightningDataModule | None) -> nn.Module:
        # Resolved when fitting, not in __init__: a distilled checkpoint loads for test/predict
        # without its teacher.
        h, c = self.hparams, self.model.config
        if h.teacher is None:
            raise ValueError(f"distillation={h.distillation!r} needs a teacher: a path, {TRAIN_CNN!r}, "
                             "or a teacher_module")
        if h.teacher != TRAIN_CNN:
            return load_teacher(h.teacher, c.channels, c.num_classes, c.mean, c.std, c.image_size)
        if datamodule is None:
            raise ValueError(f"teacher={TRAIN_CNN!r} trains on the data module; fit with datamodule=…")
        rank_zero_info(f"training a SmallCNN teacher for {h.teacher_steps} steps (seed {run_seed()})")
        teacher = train_cnn_teacher(datamodule, steps=h.teacher_steps, seed=run_seed(), mixup=h.teacher_mixup,
                                    device=self.trainer.strategy.root_device)
        if self.trainer.logger is not None and self.trainer.is_global_zero:
            path = log_dir(self.trainer) / "teacher_cnn.pt"
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save(teacher.state_dict(), path)
            rank_zero_info(f"saved the teacher to {path} (pass it as teacher: {path} to reuse it)")
        return teacher

    # ------------------------------------------------------------------ losses
    @torch.no_grad()
    def _teacher_logits(self, pixel_values: Tensor) -> Tensor:
        teacher = self.teacher_model
        if teacher is None:
            raise RuntimeError("no teacher: distillation needs a teacher (resolved in setup('fit'))")
        teacher.to(pixel_values.device).eval()
        out = teacher(pixel_values)
        logits = (out.logits if isinstance(out, ImageClassifierOutput) else out).float()
        if logits.shape[-1] != self.model.config.num_classes:  # hard labels beyond the student's classes
            raise ValueError(f"the teacher gives {logits.shape[-1]} class scores; the student has "
                             f"{self.model.config.num_classes} classes")
        return logits

    def training_loss(self, batch: dict[str, Tensor], mixup_seed: int | None = None) -> Tensor:
        """Cross-entropy (both heads for DeiT, averaged), or DeiT's hard / soft distillation; on a
        mixup batch (``mixup`` > 0, drawn from ``mixup_seed``) against the blended labels."""
        h = self.hparams
        pixels, labels = batch["pixel_values"], batch["labels"]
        if h.mixup > 0:
            pixels, labels = mix_up(pixels, labels, self.model.config.num_classes, h.mixup, mixup_seed)
        out = self._classify(pixels)
        if out.logits_dist is None:
            return F.cross_entropy(out.logits.float(), labels, label_smoothing=h.label_smoothing)
        cls, dist = out.logits_cls.float(), out.logits_dist.float()
        if h.distillation == "none":
            return 0.5 * (F.cross_entropy(cls, labels, label_smoothing=h.label_smoothing)
                          + F.cross_entropy(dist, labels, label_smoothing=h.label_smoothing))
        teacher_logits = self._teacher_logits(pixels)  # the teacher reads what the student reads
        if h.distillation == "hard":
            return hard_distillation_loss(cls, dist, labels, teacher_logits, h.label_smoothing)
        return soft_distillation_loss(cls, dist, labels, teacher_logits, h.distill_alpha, h.distill_tau,
                                      h.label_smoothing)

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        # mixup's draw: one per batch of the run, the same again when a resumed run redoes it
        seed = mix_seed(_MIXUP, run_seed(), self.trainer.current_epoch, batch_idx) if self.hparams.mixup > 0 else None
        loss = self.training_loss(batch, seed)
        self.log("train_loss", loss, prog_bar=True, batch_size=batch["labels"].shape[0])
        self.log("lr", self.optimizers().param_groups[0]["lr"], prog_bar=False)  # type: ignore[union-attr]
        return loss

    def _eval_logits(self, batch: dict[str, Tensor], stage: str) -> Tensor:
        logits = self._classify(batch["pixel_values"]).logits.float()  # DeiT: the two heads' average
        loss = F.cross_entropy(logits, batch["labels"])
        self.log(f"{stage}_loss", loss, prog_bar=True, batch_size=batch["labels"].shape[0])
        return logits

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        logits = self._eval_logits(batch, "val")
        self.val_acc(logits, batch["labels"])
        self.val_topk(logits, batch["labels"])
        self.log("val_acc", self.val_acc, prog_bar=True)
        self.log("val_top5", self.val_topk)  # top-k with k = min(5, K)

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        logits = self._eval_logits(batch, "test")
        self.test_acc(logits, batch["labels"])
        self.test_confusion.update(logits, batch["labels"])
        self.log("test_acc", self.test_acc)

    def on_test_epoch_end(self) -> None:
        self.confusion_matrix = self.test_confusion.compute().cpu()
        self.test_confusion.reset()
        folder = log_dir(self.trainer)
        if self.trainer.is_global_zero:
            names = getattr(self.trainer.datamodule, "class_names", None)
            path = save_confusion_matrix(self.confusion_matrix, folder / "confusion_matrix.png", names)
            rank_zero_info(f"saved the confusion matrix to {path}")

    @torch.no_grad()
    def predict_step(self, batch: dict[str, Tensor] | Tensor, batch_idx: int) -> list[Record]:
        """Records (`tasks.predictions`) for a batch of normalised pixels (or a data batch): the
        predicted class — its name from the data module's ``class_names``, else its index — with
        its probability (DeiT: of the two heads' averaged logits) and the true class as ``target``."""
        pixels = batch["pixel_values"] if isinstance(batch, dict) else batch
        logits = self._classify(pixels).logits
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        names = getattr(datamodule, "class_names", None)
        names = names if names is not None and len(names) == logits.shape[-1] else None
        return class_records(logits, names, batch.get("labels") if isinstance(batch, dict) else None)

    def configure_optimizers(self):
        return adamw_warmup_cosine(self.model, self.trainer, self.hparams)


def save_confusion_matrix(matrix: Tensor, path: Path, class_names: list[str] | None = None) -> Path:
    """Plot a (K, K) confusion matrix (rows: true class, columns: predicted) as a PNG."""
    from matplotlib.figure import Figure  # no pyplot: no global state, no display backend

    K = matrix.shape[0]
    names = class_names if class_names is not None and len(class_names) == K else [str(k) for k in range(K)]
    size = min(12.0, 2.0 + 0.5 * K)
    fig = Figure(figsize=(size, size))
    ax = fig.add_subplot()
    counts = matrix.numpy()
    image = ax.imshow(counts, cmap="Blues")
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    ax.set(xticks=range(K), yticks=range(K), xticklabels=names, yticklabels=names,
           xlabel="predicted", ylabel="true", title=f"confusion matrix (accuracy {counts.trace() / max(1, counts.sum()):.1%})")
    if K <= 30:
        threshold = counts.max() / 2
        for i in range(K):
            for j in range(K):
                ax.text(j, i, int(counts[i, j]), ha="center", va="center", fontsize=8,
                        color="white" if counts[i, j] > threshold else "black")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    return path
