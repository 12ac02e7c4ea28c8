"""Several data modules as one, for multi-task training: Lightning's `CombinedLoader` serves a
``{task: batch}`` dict per training step; validation and test run every task's held-out loader
in turn (``dataloader_idx`` follows the task order)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Literal

import lightning as L
from lightning.pytorch.utilities import CombinedLoader

from tasks.data.sampling import mix_seed, run_seed
from tokenizers_mm import Processor

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

    def processor(self) -> Processor | None:
        """The tasks' text tokenizer (class names are per task, so none are kept); one model
        reads one text vocabulary, so two tasks with different tokenizers are an error."""
        texts = {name: p.text for name, d in self.tasks.items()
                 if (p := getattr(d, "processor", lambda: None)()) is not None and p.text is not None}
        if not texts:
            return None
        (first, text), *others = texts.items()
        differ = [name for name, other in others if other != text]
        if differ:
            raise ValueError(f"tasks {differ} read text with another tokenizer than task {first!r} "
                             f"({', '.join(f'{n}: {type(t).__name__} of {t.vocab_size} tokens' for n, t in texts.items())}); "
                             "one model reads one vocabulary: give every task the same tokenizer")
        return Processor(text=text)

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
        """Every task's training loader; each task draws its order and random numbers from its
        own seed (derived from the run's)."""
        seed = run_seed()
        for i, data in enumerate(self.tasks.values()):
            if hasattr(data, "shuffle_seed") and data.shuffle_seed is None:
                data.shuffle_seed = mix_seed(seed, i)
        loaders = {name: data.train_dataloader() for name, data in self.tasks.items()}
        for name, loader in loaders.items():  # else "max_size_cycle" and "min_size" train nothing, "max_size" skips it
            if hasattr(loader, "__len__") and len(loader) == 0:
                raise ValueError(f"task {name!r} has no training batch: {len(loader.dataset)} items for batch_size "
                                 f"{loader.batch_sampler.batch_size} (the last partial batch is dropped)")
        return CombinedLoader(loaders, self.mode)

    def state_dict(self) -> dict[str, Any]:
        """Every task's data state (training seed and position) for checkpoints."""
        return {name: data.state_dict() for name, data in self.tasks.items()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for name, data in self.tasks.items():
            data.load_state_dict(state_dict.get(name, {}))
            point = getattr(data, "resume_point", None)
            if point is not None and self.mode == "max_size":  # an exhausted loader waits for the next epoch
                data.resume_point = replace(point, cycle=False)

    def teardown(self, stage: str) -> None:
        for data in self.tasks.values():
            data.teardown(stage)

    def val_dataloader(self) -> list[Any]:
        """One held-out loader per task, in task order (``dataloader_idx`` tells them apart)."""
        return [data.val_dataloader() for data in self.tasks.values()]

    def test_dataloader(self) -> list[Any]:
        return [data.test_dataloader() for data in self.tasks.values()]

    def predict_dataloader(self) -> list[Any]:
        """Every task's held-out (test) loader in task order, as in ``test``: ``unitok predict``
        names each record's task by its ``dataloader_idx``."""
        return [data.test_dataloader() for data in self.tasks.values()]
