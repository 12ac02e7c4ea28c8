"""What `unitok predict` writes: one JSON object a line per input, for every recipe.

Each task's ``predict_step`` returns a list of records, one per input of the batch — dicts with
the same shape of answer in every family::

    {"id": 17, "prediction": "7", "score": 0.93, "target": "7"}
    {"id": "photos/val/cat/003.jpg", "prediction": "cat", "score": 0.81, "target": "cat"}
    {"id": 2, "prediction": "(self, name):", "score": -1.9, "input": "def main"}
    {"id": 4, "task": "speech", "prediction": "three one", "score": -0.6, "target": "three one"}

and `PredictionWriter` (a Lightning `BasePredictionWriter`: it acts in ``predict`` only, never
while fitting) writes them to ``<output dir>/predictions.jsonl``.

Fields:
    id: the input's index in the predict set — its loader's dataset, as Lightning's sampler
        drew it, so indices stay right under DDP and in length-bucketed loaders — or, where the
        dataset names its items (``item_id(index)``), the input itself: the image or audio file
        (image folders, caption files, speech manifests, the spoken-digits corpus) or
        ``"file:line"`` for the lines of a text file of prompts.
    task: the task's name, for runs over several tasks (`MultiTaskDataModule`: each task's
        held-out set is predicted in turn).
    dataloader: the predict loader's index, where there are several and the records name no
        task (a module of one's own): ids restart at 0 in each loader, so ``id`` alone repeats.
    prediction: a class name where the data knows them (else the class index); generated or
        transcribed text; a CLIP zero-shot class (or, without classes, the best-matching
        held-out caption); the Decision Transformer's action at a window's last step (an id,
        or a list of floats in the environment's units); ``[word, tag]`` pairs for token
        classification; ``[token, replaced]`` pairs for ELECTRA; the answer span's text for QA.
    score: a finite number, per family —
        * classification, zero-shot (CLIP, audio via text prompts), caption retrieval, ELECTRA
          and token tags, discrete actions: the probability of the prediction (softmax; for
          tags and ELECTRA's flags the mean over the words / tokens), in [0, 1];
        * QA: p(start) · p(end) of the chosen span;
        * generated text (GPT, T5, the multi-task LM): the mean log-probability of the
          generated tokens (up to and including EOS), ≤ 0;
        * masked LM: the mean log-probability of the tokens put in the [MASK]s (0 with none);
        * speech (CTC): log P(transcript | audio), summed over every alignment, ≤ 0;
        * continuous actions: −(mean squared error) against the logged action (model units,
          [-1, 1]), ≤ 0; regression: the predicted value.
    input / target and others: what the prediction was made from (a prompt, a held-out text)
        and the held-out answer where the data has one; some families add context (a Decision
        Transformer window's ``step`` and ``return_to_go``, ELECTRA's ``filled`` text).

Records are written in predict-set order, task by task. Under DDP each rank predicts its
share; at the end every rank's records are gathered (``torch.distributed.all_gather_object``)
and global rank 0 writes the one file, so no shared file system is needed.
"""

from __future__ import annotations

import atexit
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import BasePredictionWriter
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from tasks.callbacks import StoppedBySignal
from tasks.plain import plain
from tasks.run_folder import log_dir

Record = dict[str, Any]
FILENAME = "predictions.jsonl"
FIRST_FIELDS = ("id", "task", "dataloader", "prediction", "score")


# --------------------------------------------------------------------------- records
def records(prediction: Sequence[Any], score: Sequence[float] | Tensor, **fields: Sequence[Any] | None) -> list[Record]:
    """Columns -> one record per row: ``prediction``, ``score`` and any other given fields
    (None columns are left out)."""
    scores = score.tolist() if isinstance(score, Tensor) else list(score)
    if len(scores) != len(prediction):
        raise ValueError(f"{len(prediction)} predictions but {len(scores)} scores")
    columns = {name: list(values) for name, values in fields.items() if values is not None}
    for name, values in columns.items():
        if len(values) != len(prediction):
            raise ValueError(f"{len(prediction)} predictions but {len(values)} values of {name!r}")
    return [{"prediction": p, "score": s, **{name: values[i] for name, values in columns.items()}}
            for i, (p, s) in enumerate(zip(prediction, scores))]


def class_records(logits: Tensor, class_names: Sequence[str] | None = None, labels: Tensor | None = None,
                  **fields: Sequence[Any] | None) -> list[Record]:
    """(B, K) logits -> records of the most likely class (its name when ``class_names`` are
    given, else its index) with its softmax probability; ``labels`` (B,) become the ``target``
    (negative labels, "unknown", give None)."""
    probs = logits.detach().float().softmax(dim=-1)
    score, index = probs.max(dim=-1)
    names = list(class_names) if class_names else None

    def name(k: int) -> Any:
        return names[k] if names is not None and 0 <= k < len(names) else k

    targets = None
    if labels is not None:
        targets = [name(int(y)) if int(y) >= 0 else None for y in labels.reshape(-1).tolist()]
    return records([name(k) for k in index.tolist()], score, target=targets, **fields)


def mean_log_likelihood(logits: Tensor, targets: Tensor, mask: Tensor) -> Tensor:
    """(B, N, V) logits, (B, N) target ids, (B, N) mask -> (B,) mean log-probability of the
    targets at the masked positions (0 for a row with none)."""
    log_probs = logits.float().log_softmax(dim=-1).gather(-1, targets.clamp(min=0)[..., None]).squeeze(-1)
    mask = mask.to(log_probs.dtype)
    return (log_probs * mask).sum(-1) / mask.sum(-1).clamp(min=1)


def until_eos(generated: Tensor, eos_token_id: int | None) -> Tensor:
    """(B, T) generated ids -> (B, T) bool: the tokens up to and including each row's first EOS."""
    if eos_token_id is None:
        return torch.ones_like(generated, dtype=torch.bool)
    is_eos = (generated == eos_token_id).long()
    before = is_eos.cumsum(dim=1) - is_eos  # EOS tokens strictly before each position
    return before == 0


# --------------------------------------------------------------------------- prompts
class PromptSet(Dataset):
    """Inputs for text models' ``predict``: the recipe's prompts (each one non-blank text), or the
    non-empty lines of a text file (then each item is named ``"file:line"``). Items are strings."""

    def __init__(self, prompts: Sequence[str] | None = None, file: str | Path | None = None) -> None:
        if file is not None:
            path = Path(file)
            if not path.is_file():
                raise FileNotFoundError(f"predict file {path} does not exist")
            lines = [(n, line) for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
                     if line.strip()]
            if not lines:
                raise ValueError(f"predict file {path} has no non-empty line")
            self.texts = [line for _, line in lines]
            self.names: list[Any] | None = [f"{path}:{n}" for n, _ in lines]
        else:
            if not prompts:
                raise ValueError("no prompts to predict: give prompts or a predict file")
            # every prompt now, before any batch is predicted (not as the batch that holds it runs)
            for index, text in enumerate(prompts):
                if not isinstance(text, str):
                    raise TypeError(f"prompt {index} is a {type(text).__name__} ({text!r}), expected text")
                if not text.strip():
                    raise ValueError(f"prompt {index} is {text!r}: a prompt needs text to continue or answer, "
                                     "not an empty or blank string")
            self.texts, self.names = list(prompts), None

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, index: int) -> str:
        return self.texts[index]

    def item_id(self, index: int) -> Any:
        return self.names[index] if self.names is not None else index


def prompt_loader(prompts: Sequence[str] | None, file: str | Path | None = None, batch_size: int = 32) -> DataLoader:
    """A loader of `PromptSet` batches (lists of strings)."""
    return DataLoader(PromptSet(prompts, file), batch_size=batch_size, collate_fn=list)


# --------------------------------------------------------------------------- writer
def _ordered(record: Record) -> Record:
    first = {k: record[k] for k in FIRST_FIELDS if k in record}
    return {**first, **{k: v for k, v in record.items() if k not in first}}


_gloo_exit_hook_registered = False


def _destroy_gloo_group_at_exit() -> None:
    """Destroy a gloo process group when this process exits. Lightning does so for NCCL only; a
    ``ddp_spawn`` worker that exits with gloo's group alive sometimes aborts in its threads'
    teardown ("terminate called without an active exception", SIGABRT: one run in twelve of the
    DDP prediction test under load), failing a run whose predictions were written."""
    global _gloo_exit_hook_registered
    if _gloo_exit_hook_registered or dist.get_backend() != "gloo":
        return
    _gloo_exit_hook_registered = True
    atexit.register(_destroy_process_group)


def _destroy_process_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


class PredictionWriter(BasePredictionWriter):
    """Writes every ``predict_step`` record as one JSON line (see this module's docstring for
    the fields) to ``<output dir>/predictions.jsonl``.

    Args:
        output_path: the file to write, or a folder to write ``predictions.jsonl`` into (a path
            with no suffix that is not a file); relative to the run's log folder
            (e.g. ``runs/vit_digits/version_3``, with or without a logger), so that each run
            keeps its own; default: that folder.

    Records are collected per rank, put in predict-set order (by loader, then by index) and
    written by global rank 0 once prediction ends (gathered from every rank under DDP). A path
    that cannot be written (a file where a folder is meant) is refused before anything is predicted.
    A run stopped by SIGTERM / SIGINT writes the records of the batches it finished.
    """

    def __init__(self, output_path: str | None = None) -> None:
        super().__init__(write_interval="batch")
        self.output_path = output_path
        self.path: Path | None = None
        self._rows: list[tuple[int, int, Record]] = []
        self._seen: dict[int, int] = {}

    def resolve_path(self, trainer: L.Trainer) -> Path:
        """Where the records go; a ValueError for a path that could not be written."""
        folder = log_dir(trainer)
        if self.output_path is None:
            return folder / FILENAME
        given = Path(self.output_path)
        path = folder / given  # (an absolute path stays as it is)
        if path.is_file() and path.suffix == "":
            raise ValueError(f"PredictionWriter output_path {self.output_path!r} is an existing file ({path}) without "
                             f"a suffix, where a folder is meant: give a folder to write {FILENAME} into, or a file "
                             f"name with a suffix (e.g. {given.name}.jsonl)")
        if path.is_dir() or path.suffix == "":
            path = path / FILENAME
        blocking = next((p for p in path.parents if p.exists()), None)
        if blocking is not None and not blocking.is_dir():
            raise ValueError(f"PredictionWriter output_path {self.output_path!r}: {blocking} is a file, not a folder, "
                             f"so {path} cannot be written")
        return path

    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.path = self.resolve_path(trainer)
        self._rows, self._seen = [], {}

    def write_on_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, prediction: Any,
                           batch_indices: Sequence[int] | None, batch: Any, batch_idx: int,
                           dataloader_idx: int) -> None:
        if not isinstance(prediction, list | tuple) or not all(isinstance(r, dict) for r in prediction):
            raise TypeError(f"{type(pl_module).__name__}.predict_step must return a list of records (dicts with "
                            f"'prediction' and 'score') for PredictionWriter, got {type(prediction).__name__}")
        if batch_indices is None:
            start = self._seen.get(dataloader_idx, 0)  # a loader Lightning cannot index: count
            batch_indices = list(range(start, start + len(prediction)))
        elif len(batch_indices) != len(prediction):  # numbering by count would pin records on the wrong items
            raise ValueError(f"{type(pl_module).__name__}.predict_step returned {len(prediction)} records for a batch "
                             f"of {len(batch_indices)} items (dataloader {dataloader_idx}, batch {batch_idx}); "
                             "PredictionWriter writes one record an item")
        self._seen[dataloader_idx] = self._seen.get(dataloader_idx, 0) + len(prediction)
        dataset = _dataset(trainer, dataloader_idx)
        name = getattr(dataset, "item_id", None)
        several = len(_loaders(trainer)) > 1
        for index, record in zip(batch_indices, prediction):
            record = dict(record)
            if "id" not in record:
                record["id"] = name(index) if callable(name) else int(index)
            if several and "task" not in record:
                record.setdefault("dataloader", dataloader_idx)
            self._rows.append((dataloader_idx, int(index), _ordered(plain(record))))

    def on_predict_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._write_collected(trainer)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        """A predict run stopped by a signal keeps what it predicted (the run still exits non-zero,
        so the file is not taken for a finished one). Under DDP each rank leaves through here or
        through `on_predict_epoch_end`, so its one gather pairs up with the other ranks' either way."""
        if isinstance(exception, StoppedBySignal) and trainer.state.fn == TrainerFn.PREDICTING:
            self._write_collected(trainer)

    def _write_collected(self, trainer: L.Trainer) -> None:
        rows = self._rows
        distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        if distributed:
            gathered: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, rows)
            rows = [row for part in gathered for row in part]
        self._rows = []
        if trainer.is_global_zero:
            self.write(sorted(rows, key=lambda row: row[:2]))
        if distributed:  # every rank leaves once the file is written: none tears down mid-write
            dist.barrier()
            _destroy_gloo_group_at_exit()

    def write(self, rows: Sequence[tuple[int, int, Record]]) -> Path:
        path = self.path or Path(FILENAME)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        with tmp.open("w", encoding="utf-8") as f:
            for _, _, record in rows:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
        tmp.replace(path)
        rank_zero_info(f"wrote {len(rows)} predictions to {path}")
        return path


def _loaders(trainer: L.Trainer) -> list[Any]:
    loaders = trainer.predict_dataloaders
    if loaders is None:
        return []
    return list(loaders) if isinstance(loaders, list | tuple) else [loaders]


def _dataset(trainer: L.Trainer, dataloader_idx: int) -> Any:
    loaders = _loaders(trainer)
    return getattr(loaders[dataloader_idx], "dataset", None) if dataloader_idx < len(loaders) else None


__all__ = ["FILENAME", "PredictionWriter", "PromptSet", "Record", "class_records", "mean_log_likelihood",
           "prompt_loader", "records", "until_eos"]
