"""What a task records in its hyperparameters so that its checkpoint stands on its own: the
model's config (``model_config``, from which the checkpoint rebuilds its model) and the
tokenizer the model was trained with (``trained_tokenizer``, against which the data's
tokenizer is checked when the checkpoint is tested, validated, predicted with or resumed)."""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning as L

from unitok.config import Config

TOKENIZER_KEY = "trained_tokenizer"


def record_model_config(module: L.LightningModule, config: Config) -> None:
    """``config`` as the module's ``model_config`` hyperparameter, in JSON types (lists, not
    tuples), so that it round-trips through YAML and `load_from_checkpoint` (or ``unitok test
    --ckpt_path``) rebuilds the model from it alone, whatever became of a starting folder."""
    module.hparams["model_config"] = json.loads(json.dumps(config.to_dict()))


def tokenizer_fingerprint(tokenizer: Any) -> str | None:
    """A hash of the files ``tokenizer.save`` writes — a text tokenizer's vocabulary, merges,
    normalisation and special tokens, what its ``==`` compares — or None for one that saves none.
    Two tokenizers of one size give different ones when their ids mean other pieces."""
    save = getattr(tokenizer, "save", None)
    if not callable(save):
        return None
    h = hashlib.sha1()
    with tempfile.TemporaryDirectory() as folder:
        save(folder)
        for file in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
            h.update(f"{file.relative_to(folder)}\n".encode())
            h.update(hashlib.sha1(file.read_bytes()).digest())
    return h.hexdigest()


def _data_tokenizer(datamodule: Any) -> tuple[Any, str | None]:
    """The data module's tokenizer and where it was read from (None: trained by the data module).
    Of a `MultiTaskDataModule` (``tasks``): the text tokenizer its tasks share (its ``processor``
    refuses two), from the first task that reads text."""
    tasks = getattr(datamodule, "tasks", None) if datamodule is not None else None
    if isinstance(tasks, Mapping):
        for task in tasks.values():
            processor = getattr(task, "processor", None)
            text = processor().text if callable(processor) and processor() is not None else None
            if text is not None:
                source = getattr(task, "tokenizer_path", None)
                return text, str(source) if source is not None else None
        return None, None
    tokenizer = getattr(datamodule, "tokenizer", None) if datamodule is not None else None
    source = getattr(datamodule, "tokenizer_path", None)
    return tokenizer, str(source) if source is not None else None


def _compare(recorded: dict[str, Any], tokenizer: Any, source: str | None) -> None:
    fingerprint = tokenizer_fingerprint(tokenizer)
    if fingerprint is None or fingerprint == recorded.get("sha1"):
        return
    data = f"from {source}" if source is not None else "trained by the data module"
    trained = recorded.get("source")
    had = f"from {trained}" if trained is not None else "trained by its run's data module"
    if trained is not None and trained == source:
        had += ", written again since"
    fix = (f"set data.init_args.tokenizer: {trained}" if trained is not None and trained != source else
           "give the data module the tokenizer exported with the model (its run's pretrained/ folder)")
    raise ValueError(f"the data module's tokenizer ({data}) differs from the one the checkpoint's model was trained "
                     f"with ({had}): the same ids would mean other pieces; {fix}")


def check_pretrained_tokenizer(model: Any, pretrained: str | None, datamodule: Any) -> None:
    """In ``setup``: a model loaded from a ``pretrained`` folder reads the data with the tokenizer
    saved with it; another of the same size passes every id check, but each id would mean another
    piece. (A model rebuilt from a checkpoint's ``model_config`` carries none: the tokenizer its
    run recorded is checked instead, `check_trained_tokenizer`.)"""
    processor = getattr(model, "processor", None) if pretrained is not None else None
    saved = getattr(processor, "text", None)
    tokenizer, source = _data_tokenizer(datamodule)
    if saved is None or tokenizer is None or saved == tokenizer:
        return
    data = f"from {source}" if source is not None else "trained by the data module"
    raise ValueError(f"the data module's tokenizer ({data}) differs from the one saved with the pretrained "
                     f"model ({pretrained}): the same ids would mean other pieces; set "
                     f"data.init_args.tokenizer: {pretrained}")


def check_trained_tokenizer(module: L.LightningModule, datamodule: Any, stage: str) -> None:
    """In ``setup``: the data's tokenizer checked against the one the module's model was trained
    with, when it is recorded (a model rebuilt from a checkpoint carries no tokenizer of its own);
    when fitting without a record, the data's tokenizer is recorded, so that the checkpoints
    carry it."""
    tokenizer, source = _data_tokenizer(datamodule)
    if tokenizer is None:
        return
    recorded = module.hparams.get(TOKENIZER_KEY)
    if isinstance(recorded, dict):
        _compare(recorded, tokenizer, source)
    elif stage == "fit":
        fingerprint = tokenizer_fingerprint(tokenizer)
        if fingerprint is not None:
            module.hparams[TOKENIZER_KEY] = {"sha1": fingerprint, "source": source}


def take_trained_tokenizer(module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
    """In ``on_load_checkpoint``: the checkpoint's record of its tokenizer becomes the module's
    (so that later checkpoints carry it) and the data's tokenizer, when a trainer's data module
    gives one, is checked against it. A checkpoint without the record (written before it
    existed) is taken as it is."""
    recorded = (checkpoint.get("hyper_parameters") or {}).get(TOKENIZER_KEY)
    if not isinstance(recorded, dict):
        return
    module.hparams[TOKENIZER_KEY] = recorded
    trainer = module._trainer
    if trainer is not None:
        tokenizer, source = _data_tokenizer(getattr(trainer, "datamodule", None))
        if tokenizer is not None:
            _compare(recorded, tokenizer, source)


__all__ = ["TOKENIZER_KEY", "check_pretrained_tokenizer", "check_trained_tokenizer", "record_model_config", "take_trained_tokenizer",
           "tokenizer_fingerprint"]
