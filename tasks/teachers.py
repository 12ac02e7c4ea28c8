"""Teachers for distillation: a small CNN trained on the fly, or a saved model loaded frozen.

A DeiT student learns from a convolutional teacher's predictions (Touvron et al., 2021); the
CNN's locality is the inductive bias a ViT lacks on small data. ``load_teacher`` accepts:

* ``"cnn:train"``: train a `SmallCNN` on the data module before fitting (`train_cnn_teacher`);
* a ``.pt`` file: a `SmallCNN` state dict (``torch.save(cnn.state_dict(), path)``);
* a folder written by ``save_pretrained`` of a unitok image model (ViT, DeiT, MLP-Mixer).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader

from tasks.data.base import SplitDataModule
from tasks.data.sampling import (
    ResumableBatchSampler,
    SeededRandomSampler,
    resumable_loader,
    run_seed,
)
from tasks.optim import warmup_cosine, weight_decay_groups
from unitok.models import DeiT, MLPMixer, ViT
from unitok.models.base import CONFIG_FILE
from unitok.models.vision import ImageModel
from unitok.outputs import ImageClassifierOutput

TRAIN_CNN = "cnn:train"
IMAGE_FAMILIES: dict[str, type[ImageModel]] = {cls.__name__: cls for cls in (ViT, DeiT, MLPMixer)}


class SmallCNN(nn.Module):
    """Three 3×3 conv–BatchNorm–ReLU stages (two 2×2 max-pools between), global average pool,
    linear head: (B, C, H, W) normalised pixels -> (B, K) logits, any H, W ≥ 4.

    Args:
        channels: C of the input. num_classes: K. width: channels of the first stage
            (doubled at each later stage).
    """

    def __init__(self, channels: int = 1, num_classes: int = 10, width: int = 16) -> None:
        super().__init__()
        self.config = {"channels": channels, "num_classes": num_classes, "width": width}
        widths = (channels, width, 2 * width, 4 * width)
        layers: list[nn.Module] = []
        for i in range(3):
            layers += [nn.Conv2d(widths[i], widths[i + 1], 3, padding=1, bias=False),
                       nn.BatchNorm2d(widths[i + 1]), nn.ReLU(inplace=True)]
            if i < 2:
                layers.append(nn.MaxPool2d(2))
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(widths[-1], num_classes)

    def forward(self, pixel_values: Tensor) -> Tensor:
        x = self.features(pixel_values)  # (B, 4·width, H/4, W/4)
        return self.head(x.mean(dim=(2, 3)))


def train_cnn_teacher(
    datamodule,
    steps: int = 300,
    seed: int | None = None,
    learning_rate: float = 3e-3,
    width: int = 16,
    device: str | torch.device = "cpu",
    mixup: float = 0.0,
) -> SmallCNN:
    """Train a `SmallCNN` on ``datamodule``'s training split for ``steps`` AdamW steps
    (warm-up + cosine), and return it frozen in eval mode.

    ``mixup`` = α > 0 trains on mixup batches (Zhang et al., 2018): each batch blended with a
    shuffled copy of itself by a weight λ ~ Beta(α, α), the targets blended alike. On a few
    scans a class it makes a much stronger teacher (10 a digit: ≈ 97 % instead of ≈ 95 %).

    ``seed`` (None: the run's, `seed_everything`'s) fixes the CNN's initial weights, its data
    order and its batches' augmentation. It runs under a forked random state and its own
    loader, so it neither depends on nor disturbs the global generator or the data module's
    training loader (a student trained after it sees the same data as without it). It sees
    the training split only: never a validation or test scan. About 300 steps of 64 digits
    reach ≈ 97 % held-out accuracy on the full training split, ≈ 95 % on 10 scans a class.
    """
    if not mixup >= 0:
        raise ValueError(f"mixup must be ≥ 0 (a Beta(α, α) mixing weight; 0: no mixup), got {mixup}")
    seed = run_seed() if seed is None else int(seed)
    datamodule.setup("fit")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = SmallCNN(datamodule.channels, datamodule.num_classes, width).to(device)
        optimizer = torch.optim.AdamW(weight_decay_groups(model, 1e-4), lr=learning_rate)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(steps // 10, steps, 0.0))
        model.train()
        step, loader = 0, training_loader(datamodule, seed)  # one loader: a new order every pass
        while step < steps:
            for batch in loader:
                pixels, targets = batch["pixel_values"].to(device), batch["labels"].to(device)
                if mixup > 0:
                    pixels, targets = mix_up(pixels, targets, datamodule.num_classes, mixup)
                loss = F.cross_entropy(model(pixels), targets)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                schedule.step()
                step += 1
                if step == steps:
                    break
    return freeze(model)


def mix_up(pixels: Tensor, labels: Tensor, num_classes: int, alpha: float,
           seed: int | None = None) -> tuple[Tensor, Tensor]:
    """Mixup (Zhang et al., 2018): (B, C, H, W) images and (B,) labels -> λ·x + (1 − λ)·x[π] and
    the (B, K) targets blended alike, λ ~ Beta(α, α) and π a random permutation: drawn from
    ``seed`` (a NumPy generator of its own), or from torch's global generator when it is None."""
    if seed is None:
        lam = float(torch.distributions.Beta(alpha, alpha).sample())
        perm = torch.randperm(len(pixels)).to(pixels.device)
    else:
        rng = np.random.default_rng(seed)
        lam = float(rng.beta(alpha, alpha))
        perm = torch.from_numpy(rng.permutation(len(pixels))).to(pixels.device)
    one_hot = F.one_hot(labels, num_classes).float()
    return lam * pixels + (1 - lam) * pixels[perm], lam * one_hot + (1 - lam) * one_hot[perm]


def training_loader(datamodule, seed: int) -> DataLoader:
    """The teacher's own pass over ``datamodule``'s training split, shuffled and augmented as the
    data module's training loader would be but from ``seed`` (a `SplitDataModule`; any other
    data module: its ``train_dataloader()``)."""
    if not isinstance(datamodule, SplitDataModule):
        return datamodule.train_dataloader()
    data = datamodule.dataset("train")
    batches = ResumableBatchSampler(SeededRandomSampler(data, seed), datamodule.batch_size,
                                    datamodule.drop_last_train, seed)
    if len(batches) == 0:
        raise ValueError(f"the training split ({len(data)} items) is smaller than one batch "
                         f"({datamodule.batch_size}); lower the batch size")
    return resumable_loader(data, batches, datamodule.collate_fn("train"), datamodule.num_workers)


@torch.no_grad()
def accuracy(model: nn.Module, loader: Iterable[dict[str, Tensor]], device: str | torch.device = "cpu") -> float:
    """Top-1 accuracy (a fraction) of an image classifier (a `SmallCNN` or a unitok image model)
    on ``{"pixel_values", "labels"}`` batches."""
    was_training = model.training
    model.eval()
    correct = total = 0
    for batch in loader:
        out = model(batch["pixel_values"].to(device))
        logits = out.logits if isinstance(out, ImageClassifierOutput) else out
        correct += int((logits.argmax(dim=-1).cpu() == batch["labels"]).sum())
        total += len(batch["labels"])
    model.train(was_training)
    if total == 0:
        raise ValueError("no batches to score")
    return correct / total


def freeze(model: nn.Module) -> nn.Module:
    """Eval mode, no gradients: how a teacher is used."""
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def load_image_model(folder: str | Path) -> ImageModel:
    """A unitok image model from a ``save_pretrained`` folder, whichever family it holds."""
    folder = Path(folder)
    config_file = folder / CONFIG_FILE
    if not config_file.is_file():
        raise FileNotFoundError(f"{folder} has no {CONFIG_FILE}; expected a folder written by save_pretrained")
    family = json.loads(config_file.read_text()).get("family")
    if family not in IMAGE_FAMILIES:
        raise ValueError(f"{folder} holds a {family} model; image teachers are {', '.join(IMAGE_FAMILIES)}")
    return IMAGE_FAMILIES[family].from_pretrained(folder)


class Renormalised(nn.Module):
    """A teacher fed the student's pixels in its own normalisation: x · s/t_std + (m − t_mean)/t_std
    per channel, the student's (mean m, std s) undone and the teacher's applied."""

    def __init__(self, teacher: nn.Module, student: tuple[Sequence[float], Sequence[float]],
                 own: tuple[Sequence[float], Sequence[float]]) -> None:
        super().__init__()
        self.teacher = teacher
        (m, s), (tm, ts) = ([torch.tensor(v, dtype=torch.float32)[:, None, None] for v in pair]
                            for pair in (student, own))
        self.register_buffer("scale", s / ts)
        self.register_buffer("shift", (m - tm) / ts)

    def forward(self, pixel_values: Tensor) -> Any:
        return self.teacher(pixel_values * self.scale + self.shift)


def load_teacher(spec: str, channels: int, num_classes: int, mean: Sequence[float] | None = None,
                 std: Sequence[float] | None = None, image_size: Sequence[int] | None = None) -> nn.Module:
    """A frozen teacher from a ``.pt`` `SmallCNN` state dict or a ``save_pretrained`` folder.

    A folder's model reads its own image size (another is refused, as for the student) and its
    own normalisation: given the student's ``mean`` / ``std``, pixels are converted to it.
    (``"cnn:train"`` needs data, so the task trains that one itself with `train_cnn_teacher`.)
    """
    path = Path(spec)
    if path.is_dir():
        model = load_image_model(path)
        have = (model.config.channels, model.config.num_classes)
        if have != (channels, num_classes):  # hard labels beyond the student's classes, or a shape error mid-step
            raise ValueError(f"teacher {path} reads {have[0]} channels into {have[1]} classes; the student "
                             f"{channels} channels into {num_classes} classes")
        if image_size is not None and tuple(model.config.image_size) != tuple(image_size):
            raise ValueError(f"teacher {path} reads {model.config.image_size[0]}×{model.config.image_size[1]} images; "
                             f"the student {image_size[0]}×{image_size[1]}")
        model = freeze(model)
        if mean is not None and std is not None and (tuple(mean), tuple(std)) != (model.config.mean, model.config.std):
            return freeze(Renormalised(model, (mean, std), (model.config.mean, model.config.std)))
        return model
    if path.suffix == ".pt":
        if not path.is_file():
            raise FileNotFoundError(f"teacher state dict {path} does not exist")
        state = torch.load(path, map_location="cpu", weights_only=True)
        width = state["features.0.weight"].shape[0] if "features.0.weight" in state else 16
        model = SmallCNN(channels, num_classes, width)
        model.load_state_dict(state)
        return freeze(model)
    raise ValueError(
        f"teacher {spec!r} is neither {TRAIN_CNN!r}, a SmallCNN state dict (.pt) nor a save_pretrained folder"
    )
