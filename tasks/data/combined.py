"""Several data modules as one, for multi-task training: Lightning's `CombinedLoader` serves a
``{task: batch}`` dict per training step; validation and test run every task's held-out loader
in turn (``dataloader_idx`` follows the task order)."""

from __future__ import annotations

from typing import Any, Literal

import lightning as L
from lightning.pytorch.utilities import CombinedLoader

CombineMode = Literal["max_size_cycle", "min_size", "max_size"]


class MultiTaskDataModule(L.LightningDataModule):
    """Several data modules as one, by task name.

    Args:
        tasks: task name -> its data module (the names match `MultiTaskTask`'s objectives).
        mode: how training loaders of different lengths combine (`CombinedLoader`):
            "max_size_cycle" (shorter ones restart until the longest ends), "min_size" (stop
            with the shortest) or "max_size" (missing batches are None).
    """

    def __init__(self, tasks: dict[str, L.LightningDataModule], mode: CombineMode = "max_size_cycle") -> None:
        super().__init__()
        if not tasks:
            raise ValueError("MultiTaskDataModule needs at least one task: tasks: {name: data module}")
        if mode not in ("max_size_cycle", "min_size", "max_size"):
            raise ValueError(f"mode must be 'max_size_cycle', 'min_size' or 'max_size', got {mode!r}")
        self.tasks, self.mode = dict(tasks), mode

    @property
    def names(self) -> list[str]:
        return list(self.tasks)

    def __str__(self) -> str:  # Lightning's would build every loader to describe them
        return f"MultiTaskDataModule({', '.join(f'{n}: {type(d).__name__}' for n, d in self.tasks.items())})"

    def prepare_data(self) -> None:
        for data in self.tasks.values():
            data.prepare_data()

    def setup(self, stage: str | None = None) -> None:
        for data in self.tasks.values():
            data.trainer = self.trainer
            data.setup(stage)

    def train_dataloader(self) -> CombinedLoader:
        return CombinedLoader({name: data.train_dataloader() for name, data in self.tasks.items()}, self.mode)

    def val_dataloader(self) -> list[Any]:
        """One held-out loader per task, in task order (``dataloader_idx`` tells them apart)."""
        return [data.val_dataloader() for data in self.tasks.values()]

    def test_dataloader(self) -> list[Any]:
        return [data.test_dataloader() for data in self.tasks.values()]
