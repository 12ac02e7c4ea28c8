"""What every data module shares: one dataset per split, served by the same kind of loader.

A subclass says what its splits hold (`SplitDataModule.dataset`) and how items become a batch
(`SplitDataModule.collate_fn`); this base builds the `DataLoader`s — shuffled with the last
partial batch dropped for training, in order for validation and test — so the built-in and
users' data modules, and `MultiTaskDataModule` combining them, all read the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeVar

import lightning as L
import numpy as np
from torch.utils.data import DataLoader, Dataset

Split = Literal["train", "val", "test"]
T = TypeVar("T")


def hold_out(items: Sequence[T], fraction: float, seed: int) -> tuple[list[T], list[T]]:
    """Split users' items into (train, val) at random (seeded), ``fraction`` of them held out;
    both keep the items' order. Errors when the fraction or the items cannot give both splits."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {fraction}")
    order = np.random.default_rng(seed).permutation(len(items))
    n_val = max(1, round(fraction * len(order)))
    if n_val >= len(order):
        raise ValueError(f"only {len(order)} pairs: too few to hold out a validation split")
    return [items[i] for i in sorted(order[n_val:])], [items[i] for i in sorted(order[:n_val])]


class SplitDataModule(L.LightningDataModule):
    """Loaders for ``dataset(split)`` with ``batch_size`` and ``num_workers``.

    Subclasses fill ``train_set`` / ``val_set`` (and ``test_set``) in ``setup`` — or override
    `dataset` — and may override `collate_fn` (per split) or `loader` (a batch sampler, a
    seeded generator). Without test data the held-out "val" split is the test set too (most
    built-in data has no third split).

    Class attribute ``drop_last_train``: drop the last partial training batch (default True).
    """

    drop_last_train: bool = True

    def __init__(self, batch_size: int, num_workers: int = 0) -> None:
        super().__init__()
        if batch_size < 1 or num_workers < 0:
            raise ValueError(f"need batch_size ≥ 1 and num_workers ≥ 0, got {batch_size}, {num_workers}")
        self.batch_size, self.num_workers = batch_size, num_workers
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None
        self.test_set: Dataset | None = None

    def dataset(self, split: Split) -> Dataset | None:
        """The items of ``split`` ("train", "val" or "test"; None: no such split), set up on first use."""
        if self.train_set is None:
            self.setup("fit")
        return {"train": self.train_set, "val": self.val_set, "test": self.test_set}[split]

    def collate_fn(self, split: Split) -> Callable[[Any], Any] | None:
        """How ``split``'s items become a batch (None: PyTorch's default collation)."""
        return None

    def loader(self, split: Split) -> DataLoader:
        data = self.dataset(split)
        if data is None and split == "test":
            split, data = "val", self.dataset("val")
        if data is None:
            raise ValueError(f"{type(self).__name__} has no {split} split")
        train = split == "train"
        return DataLoader(data, batch_size=self.batch_size, shuffle=train, drop_last=train and self.drop_last_train,
                          num_workers=self.num_workers, persistent_workers=self.num_workers > 0,
                          collate_fn=self.collate_fn(split))

    def train_dataloader(self) -> DataLoader:
        return self.loader("train")

    def val_dataloader(self) -> DataLoader:
        return self.loader("val")

    def test_dataloader(self) -> DataLoader:
        """The test split, or the held-out (validation) split where there is no third one."""
        return self.loader("test")
