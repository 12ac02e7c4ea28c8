"""Exact resume: a run stopped at any step and resumed from its checkpoint (``--ckpt_path``)
trains on as the uninterrupted run would have, loss for loss.

Lightning restores the weights, optimiser, LR schedule and loop counters. The data modules
restore where training stood in the data (`tasks.data.sampling`: the order and each batch's
random numbers are functions of the run's seed, epoch and batch). `ResumableRNG` restores the
rest: the global random generators the training steps draw from (dropout and the like).
`ResumedBest` keeps the stopped run's best monitored score, so ``best.ckpt`` stays the curve's best.
`ResumedLogStep` keeps the logged step numbers the uninterrupted run's. `RecordSettings` writes
the run's model, data and seed settings into each checkpoint, so that a resume with other
settings (another learning rate, batch size or seed: another curve, recorded as this one) is
refused by name (`changed_settings`).
"""

from __future__ import annotations

import importlib
import inspect
import os
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch

from tasks.plain import plain

RNG_KEY = "rng_states"


def rng_states() -> dict[str, Any]:
    """Torch's (CPU and every CUDA device's), numpy's and Python's global generator states, as
    tensors and plain types (a checkpoint loads with ``weights_only=True``)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()  # type: ignore[misc]
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "gauss": float(gauss)},
        "python": random.getstate(),
    }


def set_rng_states(states: dict[str, Any]) -> None:
    """Put back what `rng_states` returned (CUDA states for the devices there are)."""
    torch.set_rng_state(states["torch"])
    if states["cuda"] and torch.cuda.is_available():
        for device, state in enumerate(states["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(state, device)
    n = states["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    version, internal, gauss_next = states["python"]
    random.setstate((version, tuple(internal), gauss_next))


class ResumableRNG(L.Callback):
    """Saves the global random generators in checkpoints and restores them when a resumed run
    starts training, so its dropout (and any other draw of a training step) continues the
    uninterrupted run's stream.

    Validation (and the sanity check) draws from a copy: whether and when it ran does not move
    the training stream, so a checkpoint written just before or after a validation resumes alike.
    Under DDP the states of rank 0 (which writes the checkpoint) are restored on every rank.
    """

    def __init__(self) -> None:
        self._training_states: dict[str, Any] | None = None  # the training stream, while validating
        self._to_restore: dict[str, Any] | None = None

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        checkpoint[RNG_KEY] = self._training_states or rng_states()

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        self._to_restore = checkpoint.get(RNG_KEY)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # The last moment before the first resumed step: setup, the sanity check and the first
        # batch's prefetch (which draws nothing from the global generators) are behind.
        if self._to_restore is not None:
            set_rng_states(self._to_restore)
            self._to_restore = None

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._training_states = rng_states()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._training_states is not None:
            set_rng_states(self._training_states)
            self._training_states = None


class ResumedBest(L.Callback):
    """A run resumed into a folder of its own keeps the best monitored score of the run it goes on
    from, so its ``best.ckpt`` is written only when it beats that run's best (else the best stays
    the earlier run's, where ``--ckpt_path best`` finds it).

    Lightning's `ModelCheckpoint` restores only ``best_model_path`` when the checkpoint was written
    from another folder (and warns "the dirpath has changed"): the resumed run's first validation
    then writes ``best.ckpt`` however bad it is. Here the scores are restored too, and a checkpoint
    of the earlier run that the resumed one outdoes is left where it is, not deleted. A run that
    only reads a checkpoint (validate, test, predict) writes none, and restores the same quietly."""

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        states = checkpoint.get("callbacks") or {}
        for callback in trainer.checkpoint_callbacks:
            state = states.get(callback.state_key)  # type: ignore[attr-defined]
            own = callback.dirpath  # type: ignore[attr-defined]
            if state is None or own is None or state.get("dirpath") in (None, own):
                continue
            state["dirpath"] = own  # `ModelCheckpoint.load_state_dict` restores the scores as its own
            callback._remove_checkpoint = _only_under(own, callback._remove_checkpoint)  # type: ignore[attr-defined]


def _only_under(folder: str, remove: Any) -> Any:
    """``remove`` (a `ModelCheckpoint`'s) for files under ``folder`` only: another run's stay."""
    own = os.path.realpath(folder)

    def remove_own(trainer: L.Trainer, filepath: str) -> None:
        if os.path.commonpath([own, os.path.realpath(filepath)]) == own:
            remove(trainer, filepath)
    return remove_own


class ResumedLogStep(L.Callback):
    """The step a resumed run logs at is the step it trains: Lightning keeps a logging counter of
    its own (``_batches_that_stepped``) that a checkpoint written in a stop can hold one behind
    or ahead (a checkpoint written mid-validation or by another stop than `StopOnSignal`'s),
    and every loss after the resume was then logged one step off the uninterrupted run's."""

    def __init__(self) -> None:
        self._first = False

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._first = True

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        # at the first batch: the loops' own restart bookkeeping (which moves the counter) is done
        loop = trainer.fit_loop.epoch_loop
        if self._first and pl_module.automatic_optimization and hasattr(loop, "_batches_that_stepped"):
            loop._batches_that_stepped = trainer.global_step  # as in any uninterrupted run, at a batch's start
        self._first = False


SETTINGS_KEY = "unitok_settings"
# Settings that change how fast a run goes or where it caches, not its curve.
NEUTRAL_SETTINGS = ("num_workers", "cache_dir", "persistent_workers", "pin_memory")


def plain_settings(node: Any, prefix: str = "") -> dict[str, Any]:
    """A config (nested dicts / namespaces) -> ``{"model.init_args.learning_rate": 0.002, ...}``,
    leaves as JSON's types (others as their text), so a checkpoint holding them loads with
    ``weights_only=True``."""
    if hasattr(node, "as_dict"):
        node = node.as_dict()
    if isinstance(node, Mapping):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(plain_settings(value, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): plain(node)}


class RecordSettings(L.Callback):
    """Writes the run's settings (`plain_settings` of its model, data and seed) into every
    checkpoint, for `changed_settings` to compare a resumed run's with."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.settings = settings

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        checkpoint[SETTINGS_KEY] = self.settings


def recorded_settings(path: str | Path) -> dict[str, Any] | None:
    """The settings `RecordSettings` wrote into a checkpoint (None: an older one, or another tool's)."""
    import torch

    try:
        checkpoint = torch.load(path, weights_only=True, map_location="cpu", mmap=True)
    except Exception:  # not ours to judge here: Lightning's own load names the problem
        return None
    settings = checkpoint.get(SETTINGS_KEY) if isinstance(checkpoint, dict) else None
    return settings if isinstance(settings, dict) else None


def option_defaults(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The default of each constructor option of the classes ``settings`` name
    (``model.class_path: tasks.ImageClassificationTask`` -> ``{"model.init_args.mixup": 0.0, …}``),
    as plain values; a class that cannot be imported gives none."""
    defaults: dict[str, Any] = {}
    for key, path in settings.items():
        if key.rsplit(".", 1)[-1] != "class_path" or not isinstance(path, str) or "." not in path:
            continue
        module, _, name = path.rpartition(".")
        try:
            parameters = inspect.signature(getattr(importlib.import_module(module), name).__init__).parameters
        except (ImportError, AttributeError, TypeError, ValueError):
            continue
        prefix = key[: -len("class_path")]
        defaults.update({f"{prefix}init_args.{option}": plain(p.default) for option, p in parameters.items()
                         if p.default is not inspect.Parameter.empty})
    return defaults


def changed_settings(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """``key: before → now`` for every setting that differs (`NEUTRAL_SETTINGS` aside). An option
    the checkpoint's run did not have yet (added to its class since) is unchanged while it keeps
    its default: the run had that behaviour."""
    defaults, missing = option_defaults(current), object()

    def changed(key: str) -> bool:
        if key not in recorded and defaults.get(key, missing) == current.get(key):
            return False
        return key.rsplit(".", 1)[-1] not in NEUTRAL_SETTINGS and recorded.get(key) != current.get(key)

    return [f"{key}: {recorded.get(key)!r} → {current.get(key)!r}" for key in sorted(set(recorded) | set(current))
            if changed(key)]


def resume_callbacks() -> list[L.Callback]:
    """The callbacks a run needs to resume exactly (the CLI adds them to every run)."""
    return [ResumableRNG(), ResumedBest(), ResumedLogStep()]
