"""Training batches that a resumed run reads on from, exactly.

The order of a pass over the training set, and the random numbers spent making each batch
(augmentation, SpecAugment, masking collators), are functions of (seed, epoch, pass, batch)
only — not of torch's global generator, nor of the worker that happens to fetch a batch:

- `SeededRandomSampler`: the shuffle of a pass, drawn from (seed, epoch, pass). Lightning calls
  its ``set_epoch`` each epoch; the pass counts restarts within an epoch (`CombinedLoader`
  cycles shorter loaders).
- `ResumableBatchSampler`: batches of its sampler, each a `SeededBatch` carrying its own seed;
  built with a `ResumePoint`, its first pass starts at that batch (the ones before are never loaded).
- `SeededFetch`: fetches and collates a batch under the batch's seed (torch's CPU, numpy's and
  Python's generators seeded for it, then put back), in the main process or in a worker alike.

Where a run stands (`training_position`) is saved by the data module in checkpoints
(`SplitDataModule.state_dict`); a resumed run builds its training loader at that point.
Under DDP Lightning puts a `DistributedSampler` (seeded by the run's seed, epoch set by
Lightning) in the batch sampler's place of `SeededRandomSampler`; skipping and seeding still apply.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator, Sequence, Sized
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    RandomSampler,
    Sampler,
    default_collate,
)

# The first word of every seed's entropy: which stream it seeds.
_ORDER, _PASS, _BATCH = 0, 1, 2


def mix_seed(*words: int) -> int:
    """One 64-bit seed from several integers (the run's seed, an epoch, a batch index, …)."""
    state = np.random.SeedSequence([int(w) % 2**64 for w in words]).generate_state(2, np.uint32)
    return int(state[0]) << 32 | int(state[1])


def run_seed() -> int:
    """The run's seed: `seed_everything`'s (``PL_GLOBAL_SEED``), else torch's initial seed."""
    seed = os.environ.get("PL_GLOBAL_SEED")
    return int(seed) if seed is not None else torch.initial_seed()


def held_out_generator() -> torch.Generator:
    """For evaluation loaders: a fixed generator for their worker seeds, so that starting one
    takes no number from the global generator (training's dropout and the like)."""
    return torch.Generator().manual_seed(0)


def training_position(trainer: Any) -> tuple[int, int]:
    """(epoch, batches of it already trained on) at which a run resumed from a checkpoint saved
    now goes on: the next epoch's start once every batch of this one was processed."""
    epoch = trainer.current_epoch
    done = trainer.fit_loop.epoch_loop.batch_progress.current.processed
    if done >= trainer.num_training_batches:
        return epoch + 1, 0
    return epoch, done


@dataclass(frozen=True)
class ResumePoint:
    """Where a resumed run's training loader starts: ``batches`` into epoch ``epoch``.

    ``cycle``: a loader shorter than the epoch restarts within it (`CombinedLoader`'s
    "max_size_cycle" and "min_size"), so ``batches`` past its length fall in a later pass;
    without (``"max_size"``) it is exhausted for the rest of the epoch.
    """

    epoch: int
    batches: int
    cycle: bool = True

    def locate(self, length: int) -> tuple[int, int]:
        """(pass within the epoch, batches of that pass to skip) for a loader of ``length`` batches."""
        if self.batches < length or length == 0:
            return 0, min(self.batches, length)
        return divmod(self.batches, length) if self.cycle else (0, length)


class SeededRandomSampler(RandomSampler):
    """A `RandomSampler` (so Lightning knows the loader shuffles) whose order of each pass is a
    function of (seed, epoch, pass) alone: the same in a resumed run as in an uninterrupted one.

    Args:
        data_source: the dataset (only its length is used).
        seed: the run's seed.
    """

    def __init__(self, data_source: Sized, seed: int = 0) -> None:
        super().__init__(data_source)  # type: ignore[arg-type]
        self.seed, self.epoch, self.cycle = seed, 0, 0

    def set_epoch(self, epoch: int) -> None:
        """Called by Lightning at the start of every epoch."""
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(mix_seed(_ORDER, self.seed, self.epoch, self.cycle))
        yield from torch.randperm(len(self.data_source), generator=generator).tolist()


class SeededBatch(list):
    """A batch's indices and the seed of the random numbers spent making that batch."""

    def __init__(self, indices: Sequence[int], seed: int) -> None:
        super().__init__(indices)
        self.seed = seed


class ResumableBatchSampler(BatchSampler):
    """Batches of ``sampler``'s indices, each a `SeededBatch` seeded by (seed, epoch, pass,
    rank, batch index); with ``resume``, the first pass starts at that point.

    The epoch is the sampler's (``sampler.epoch``, which Lightning sets); a pass is one iteration,
    counted from 0 within each epoch. Subclasses regroup indices into batches in `pass_batches`.

    Args:
        sampler / batch_size / drop_last: as for `BatchSampler`.
        seed: the run's seed.
        resume: where the first pass starts (a resumed run); None: at the start.
    """

    def __init__(self, sampler: Sampler[int] | Sequence[int], batch_size: int, drop_last: bool, seed: int = 0,
                 resume: ResumePoint | None = None) -> None:
        super().__init__(sampler, batch_size, drop_last)
        self.seed, self.resume = seed, resume
        self._epoch: int | None = None
        self._cycle = 0

    def pass_batches(self, generator: torch.Generator) -> Iterator[list[int]]:
        """One pass's batches; ``generator``: this pass's own random numbers."""
        yield from super().__iter__()

    def _start_pass(self) -> tuple[int, int, int]:
        """(epoch, pass, batches to skip) of the pass about to start."""
        if self.resume is not None:
            point, self.resume = self.resume, None
            epoch, (cycle, skip) = point.epoch, point.locate(len(self))
            if getattr(self.sampler, "epoch", epoch) != epoch:  # a sampler Lightning put in after building
                self.sampler.set_epoch(epoch)  # type: ignore[union-attr]
        else:
            epoch = getattr(self.sampler, "epoch", 0)
            cycle, skip = (self._cycle if epoch == self._epoch else 0), 0
        self._epoch, self._cycle = epoch, cycle + 1
        if hasattr(self.sampler, "cycle"):
            self.sampler.cycle = cycle  # type: ignore[union-attr]
        return epoch, cycle, skip

    def __iter__(self) -> Iterator[list[int]]:
        epoch, cycle, skip = self._start_pass()
        rank = getattr(self.sampler, "rank", 0)
        generator = torch.Generator().manual_seed(mix_seed(_PASS, self.seed, epoch, cycle, rank))
        for i, batch in enumerate(self.pass_batches(generator)):
            if i >= skip:
                yield SeededBatch(batch, mix_seed(_BATCH, self.seed, epoch, cycle, rank, i))


@contextmanager
def seeded_rng(seed: int) -> Iterator[None]:
    """Torch's CPU, numpy's and Python's global generators seeded with ``seed`` inside, and put
    back as they were on leaving."""
    states = torch.get_rng_state(), np.random.get_state(), random.getstate()
    torch.default_generator.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)
    try:
        yield
    finally:
        torch.set_rng_state(states[0])
        np.random.set_state(states[1])
        random.setstate(states[2])


class SeededFetch(Dataset):
    """``dataset`` whose batches (`SeededBatch`) are fetched and collated under their own seed.

    A `DataLoader` calls `__getitems__` with each batch and ``collate_fn=collated`` (the batch
    comes collated). Other attributes are the wrapped dataset's.
    """

    def __init__(self, dataset: Dataset, collate_fn: Callable[[list[Any]], Any] | None = None) -> None:
        self.dataset, self.collate_fn = dataset, collate_fn or default_collate

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index]

    def __getattr__(self, name: str) -> Any:
        if name in ("dataset", "collate_fn") or name.startswith("__"):
            raise AttributeError(name)  # not set yet (unpickling)
        return getattr(self.dataset, name)

    def _fetch(self, indices: list[int]) -> Any:
        many = getattr(self.dataset, "__getitems__", None)
        return self.collate_fn(many(indices) if many else [self.dataset[i] for i in indices])

    def __getitems__(self, indices: list[int]) -> Any:
        seed = getattr(indices, "seed", None)
        if seed is None:
            return self._fetch(indices)
        with seeded_rng(seed):
            return self._fetch(list(indices))


def collated(batch: Any) -> Any:
    """The collate function of a loader over `SeededFetch`: its batches come collated."""
    return batch


class ResumableDataLoader(DataLoader):
    """A `DataLoader` over `SeededFetch` with a `ResumableBatchSampler`.

    A resumed run builds it at its `ResumePoint` (from the data module's state in the checkpoint,
    see `SplitDataModule.state_dict`), so the loader itself has no state to save; its
    ``state_dict`` / ``load_state_dict`` tell Lightning it resumes (else Lightning warns that a
    mid-epoch resume restarts the data).
    """

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        pass


def resumable_loader(dataset: Dataset, batches: ResumableBatchSampler, collate_fn: Callable[[list[Any]], Any] | None,
                     num_workers: int = 0) -> ResumableDataLoader:
    """A training loader whose order and per-batch random numbers come from ``batches``."""
    return ResumableDataLoader(SeededFetch(dataset, collate_fn), batch_sampler=batches, collate_fn=collated,
                               num_workers=num_workers, persistent_workers=num_workers > 0,
                               # worker seeds from the run's seed, not a draw from the global generator
                               generator=torch.Generator().manual_seed(batches.seed % 2**63))
