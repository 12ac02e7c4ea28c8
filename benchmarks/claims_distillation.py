"""Claim (b): a DeiT distilled from a convolutional teacher beats the same DeiT without one,
where data is scarce.

The recipe `configs/deit/digits_few.yaml` trains the CPU-sized DeiT (deit-digits) on a
data-poor slice of the built-in digits: ``train_per_class`` scans of each digit, the same
scans in every run, none of them a validation or test scan. Its teacher is a `SmallCNN`
trained first on those same scans only (``teacher: cnn:train``), seeded by the run's seed;
the CNN's locality and pooling are the inductive bias the ViT lacks on little data. Each seed
trains two students with the same initial weights, batches and steps:

* **distilled**: the recipe as shipped, soft distillation through the distillation token;
* **no teacher**: the same recipe with ``--model.distillation none`` (both heads learn the labels).

Both are scored on the 180 test scans with their last step's weights (the two heads'
averaged logits, as DeiT predicts). The teacher's accuracy on the same test scans is printed
beside them: a teacher is only worth distilling from if it beats its students. So is each arm's
accuracy on every scan no run trained or validated on (the test scans and the training split's
unused scans, 1,517 in all): eight times the resolution of the 180 (one scan there is 0.56 points).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from claim import Claim, finite, fit_recipe, not_a_script
from torch.utils.data import DataLoader

RECIPE = "deit/digits_few"
NO_TEACHER = ["--model.distillation", "none", "--model.teacher", "null"]


def unseen_scans(data: Any) -> DataLoader:
    """Every scan of a `DigitsDataModule` that neither its training nor its validation split holds
    (the test scans and the training split's unused ones), normalised as the test scans are."""
    from torchvision.transforms import v2

    from tasks.data.image import ImageTensors

    images, labels = data.images()
    keep = torch.from_numpy(np.setdiff1d(np.arange(len(labels)), np.concatenate([data.train_indices, data.val_indices])))
    return DataLoader(ImageTensors(images[keep], labels[keep], v2.Normalize(data.mean, data.std)), batch_size=256)


def run(seed: int) -> dict[str, float]:
    from tasks.teachers import accuracy

    cli, distilled = fit_recipe(RECIPE, seed=seed)
    task, data = cli.model, cli.datamodule
    teacher_test = accuracy(task.teacher_model, data.test_dataloader())
    unseen = unseen_scans(data)
    distilled_unseen = accuracy(task.model, unseen)
    alone_cli, alone = fit_recipe(RECIPE, NO_TEACHER, seed=seed)
    return finite({"distilled": 100 * distilled["test_acc"], "no teacher": 100 * alone["test_acc"],
                   "teacher (CNN)": 100 * teacher_test, "teacher's val acc": 100 * task.teacher_val_acc,
                   "distilled, unseen scans": 100 * distilled_unseen,
                   "no teacher, unseen scans": 100 * accuracy(alone_cli.model.model, unseen)})


CLAIMS = [
    Claim(key="b", title="DeiT distilled from a CNN beats the same DeiT without a teacher, on little data",
          metric="accuracy (%), 180 test scans", better="distilled", baseline="no teacher", run=run,
          higher_is_better=True, min_gap=2.0,
          extra=("teacher (CNN)", "teacher's val acc", "distilled, unseen scans", "no teacher, unseen scans"),
          data="configs/deit/digits_few.yaml: the same scans of each digit for training in every run, the "
               "CNN teacher trained on those only; 180 test scans no step trained on"),
]


if __name__ == "__main__":
    not_a_script(CLAIMS)
