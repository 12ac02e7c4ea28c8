"""What every data module shares: one dataset per split, served by the same kind of loader.

A subclass says what its splits hold (`SplitDataModule.dataset`) and how items become a batch
(`SplitDataModule.collate_fn`); this base builds the `DataLoader`s — shuffled with the last
partial batch dropped for training, in order for validation and test — so the built-in and
users' data modules, and `MultiTaskDataModule` combining them, all read the same way.

Training loaders resume exactly (`tasks.data.sampling`): their order and each batch's random
numbers depend on (the run's seed, epoch, batch) only, and the data module's state in a
checkpoint says where training stood, so a resumed run reads on from that batch.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from tasks.data.sampling import (
    ResumableBatchSampler,
    ResumePoint,
    SeededRandomSampler,
    held_out_generator,
    resumable_loader,
    run_seed,
    training_position,
)
from tokenizers_mm import BPETokenizer, CLIPTokenizer, Processor, WordPieceTokenizer
from tokenizers_mm.checks import check_int

Split = Literal["train", "val", "test"]

CACHE_ENV = "UNITOK_CACHE_DIR"


def default_cache_dir() -> Path:
    """Where data modules given no ``cache_dir`` keep what they build once (tokenizers, token
    files, synthesised corpora, recorded episodes): ``$UNITOK_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/unitok`` (``~/.cache/unitok``).
    ``unitok fit`` passes ``<run root>/cache`` instead, unless ``$UNITOK_CACHE_DIR`` is set."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "unitok"


T = TypeVar("T")


def content_key(*parts: object) -> str:
    """A key of ``parts``' content (the first 16 hex digits of a SHA-1), the same in every process
    and on every machine: texts, numbers, None, bytes and paths, lists / tuples (alike) and dicts
    of them, NumPy arrays and torch tensors (dtype, shape and values). What a data module's
    `SplitDataModule.data_key` is made of; anything else is a TypeError naming its type."""
    h = hashlib.sha1()
    _feed(h, list(parts))
    return h.hexdigest()[:16]


def _feed(h: Any, value: object) -> None:
    """Add ``value`` to ``h``, each block tagged and length-prefixed so no two values read alike.
    Plain data goes in whole as canonical JSON (C-fast for thousands of examples); containers
    holding arrays are walked."""
    def block(tag: bytes, data: bytes | memoryview) -> None:
        h.update(tag + len(data).to_bytes(8, "little"))
        h.update(data)

    if isinstance(value, torch.Tensor):
        flat = value.detach().cpu().contiguous().reshape(-1)
        block(b"T", json.dumps([str(value.dtype), list(value.shape)]).encode())
        block(b"t", flat.view(torch.uint8).numpy().data if flat.numel() else b"")
    elif isinstance(value, (np.ndarray, np.generic)):
        array = np.ascontiguousarray(value)
        if array.dtype.hasobject:
            raise TypeError(f"content_key reads arrays of numbers, not of Python objects (dtype {array.dtype})")
        block(b"A", json.dumps([array.dtype.str, list(array.shape)]).encode())
        block(b"a", array.reshape(-1).view(np.uint8).data if array.size else b"")
    elif isinstance(value, (bytes, bytearray)):
        block(b"B", bytes(value))
    elif isinstance(value, Path):
        block(b"P", value.as_posix().encode())
    elif value is None or isinstance(value, (str, int, float)):
        block(b"J", json.dumps(value).encode())
    elif isinstance(value, (list, tuple, dict)):
        try:  # plain data: one JSON text, keys sorted
            block(b"J", json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode())
            return
        except TypeError:  # it holds arrays (or keys of mixed types): walked
            pass
        if isinstance(value, dict):
            items = sorted(value.items(), key=lambda kv: (type(kv[0]).__name__, str(kv[0])))
            block(b"D", str(len(items)).encode())
            for k, v in items:
                _feed(h, k)
                _feed(h, v)
        else:
            block(b"L", str(len(value)).encode())
            for v in value:
                _feed(h, v)
    else:
        raise TypeError(f"content_key reads texts, numbers, bytes, paths, lists, dicts, arrays and tensors; "
                        f"got a {type(value).__name__}")


def hold_out(items: Sequence[T], fraction: float, seed: int, key: Callable[[T], Hashable] | None = None,
             what: str = "pairs") -> tuple[list[T], list[T]]:
    """Split users' items into (train, val) at random (seeded), ``fraction`` of them held out;
    both keep the items' order. ``key``: items with the same key (captions of one image) go to
    the same split, ``fraction`` of the keys held out (``what`` names them in errors). Errors
    when the fraction or the items cannot give both splits."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {fraction}")
    keys = list(dict.fromkeys(key(item) for item in items)) if key is not None else range(len(items))
    order = np.random.default_rng(seed).permutation(len(keys))
    n_val = max(1, round(fraction * len(order)))
    if n_val >= len(order):
        raise ValueError(f"only {len(order)} {what}: too few to hold out a validation split")
    if key is None:
        return [items[i] for i in sorted(order[n_val:])], [items[i] for i in sorted(order[:n_val])]
    held = {keys[i] for i in order[:n_val]}
    return [x for x in items if key(x) not in held], [x for x in items if key(x) in held]


class DisjointSets:
    """Union–find: items joined directly, or through others, share one root (`root`). What keeps
    held-out data apart when items are linked (pairs sharing a file, near-copy texts)."""

    def __init__(self) -> None:
        self.parent: dict[Hashable, Hashable] = {}

    def root(self, item: Hashable) -> Hashable:
        self.parent.setdefault(item, item)
        while self.parent[item] != item:
            self.parent[item] = self.parent[self.parent[item]]  # path halving
            item = self.parent[item]
        return item

    def join(self, keep: Hashable, other: Hashable) -> None:
        """One set of the two; ``keep``'s root stays its root."""
        a, b = self.root(keep), self.root(other)
        if a != b:
            self.parent[b] = a


def refuse_repeated_files(files: Mapping[str, Sequence[str | Path]]) -> None:
    """A ValueError naming a file listed twice in ``files`` (argument name → paths, compared
    resolved: ``a.txt`` and ``./a.txt`` are one file): in two of the arguments, or twice in one —
    it would be read twice, or land in two splits."""
    given: dict[Path, str] = {}
    for name, paths in files.items():
        for path in paths:
            resolved = Path(path).resolve()
            if resolved in given:
                where = f"twice in {name}" if given[resolved] == name else f"in both {given[resolved]} and {name}"
                raise ValueError(f"{path} is given {where}; give each file once, for one split")
            given[resolved] = name


def check_disjoint(splits: Mapping[str, Sequence[T] | None], key: Callable[[T], Hashable], what: str) -> None:
    """Refuse data whose splits share a ``what`` (an image, an audio file): held-out data must share
    nothing with training, nor validation with test. ``splits``: each split's items by the
    name the user gave them (None: not given)."""
    seen: list[tuple[str, set[Hashable]]] = []
    for name, items in splits.items():
        keys = {key(x) for x in items or ()}
        for other, earlier in seen:
            if shared := keys & earlier:
                raise ValueError(f"{len(shared)} {what}(s) of {name} are also in {other} (e.g. "
                                 f"{min(map(str, shared))}): splits must share nothing (give files that do not overlap)")
        seen.append((name, keys))


class SplitDataModule(L.LightningDataModule):
    """Loaders for ``dataset(split)`` with ``batch_size`` and ``num_workers``.

    Subclasses fill ``train_set`` / ``val_set`` (and ``test_set``) in ``setup`` — or override
    `dataset` — and may override `collate_fn` (per split) or `loader` (a batch sampler, a
    seeded generator). Every built-in module has a third, disjoint test split; without test
    data (a user's data given no test file) the held-out "val" split is the test set too.

    Class attribute ``drop_last_train``: drop the last partial training batch (default True).
    """

    drop_last_train: bool = True

    def __init__(self, batch_size: int, num_workers: int = 0) -> None:
        super().__init__()
        check_int("batch_size", batch_size)
        check_int("num_workers", num_workers, at_least=0)
        self.batch_size, self.num_workers = batch_size, num_workers
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None
        self.test_set: Dataset | None = None
        self.shuffle_seed: int | None = None  # see `train_seed`
        self.resume_point: ResumePoint | None = None  # set from a checkpoint (`load_state_dict`)
        self._content_key: tuple[object, str] | None = None  # (source, its key), see `_content_key_of`

    def dataset(self, split: Split) -> Dataset | None:
        """The items of ``split`` ("train", "val" or "test"; None: no such split), set up on first use."""
        if self.train_set is None:
            self.setup("fit")
        return {"train": self.train_set, "val": self.val_set, "test": self.test_set}[split]

    def processor(self) -> Processor | None:
        """What a model trained on this data needs besides its config to read raw input: the
        data's text tokenizer and class names (saved with the model by `tasks.ExportPretrained`)."""
        parts: dict[str, Any] = {}
        tokenizer = getattr(self, "tokenizer", None)
        if isinstance(tokenizer, (BPETokenizer, WordPieceTokenizer, CLIPTokenizer)):
            parts["text"] = tokenizer
        names = getattr(self, "class_names", None) or getattr(self, "label_names", None)
        if names:
            parts["labels"] = tuple(str(name) for name in names)
        return Processor(**parts) if parts else None

    def collate_fn(self, split: Split) -> Callable[[Any], Any] | None:
        """How ``split``'s items become a batch (None: PyTorch's default collation)."""
        return None

    def loader(self, split: Split) -> DataLoader:
        data = self.dataset(split)
        if data is None and split == "test":
            split, data = "val", self.dataset("val")
        if data is None:
            raise ValueError(f"{type(self).__name__} has no {split} split")
        if split == "train":
            batches = ResumableBatchSampler(SeededRandomSampler(data, self.train_seed()), self.batch_size,  # type: ignore[arg-type]
                                            self.drop_last_train, self.train_seed(), self.take_resume_point())
            return resumable_loader(data, batches, self.collate_fn(split), self.num_workers)
        return DataLoader(data, batch_size=self.batch_size, num_workers=self.num_workers,
                          persistent_workers=self.num_workers > 0, collate_fn=self.collate_fn(split),
                          generator=held_out_generator())

    def train_seed(self) -> int:
        """The seed of the training order and of each training batch's random numbers: the run's
        (`seed_everything`), fixed by the first training loader and kept in checkpoints."""
        if self.shuffle_seed is None:
            self.shuffle_seed = run_seed()
        return self.shuffle_seed

    def take_resume_point(self) -> ResumePoint | None:
        """Where the next training loader starts: the checkpoint's point for the first one built
        after loading it (the loader a resumed run trains on), the start for any other."""
        point, self.resume_point = self.resume_point, None
        return point

    def data_key(self) -> str | None:
        """What identifies the data this module trains on, for the built-in corpora whose content
        is made by code that may change (a synthesised corpus's spec and synthesis version, a
        token stream's hash); None where the settings alone identify it. Recorded in checkpoints:
        a resumed run whose training data is no longer the checkpoint's is refused."""
        return None

    def _content_key_of(self, source: object, parts: Callable[[], Any] | None = None) -> str:
        """`content_key` of ``parts()`` (default: ``source`` itself), the training content read
        from ``source`` (a split's examples, a corpus): hashed once, and again only when
        ``source`` is another object — every checkpoint save asks for the `data_key`."""
        if self._content_key is None or self._content_key[0] is not source:
            self._content_key = (source, content_key(parts() if parts is not None else source))
        return self._content_key[1]

    def state_dict(self) -> dict[str, Any]:
        """Saved in checkpoints: the training seed and where training stands in the data (epoch,
        batches of it done), from which a resumed run's training loader starts; the `data_key`."""
        trainer = self.trainer
        if trainer is None or self.shuffle_seed is None or trainer.state.fn != "fit":
            return {}
        epoch, batches = training_position(trainer)
        key = self.data_key()
        return {"seed": self.shuffle_seed, "epoch": epoch, "batches": batches} | ({"data": key} if key else {})

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict:
            self._check_same_data(state_dict.get("data"))
            self.shuffle_seed = int(state_dict["seed"])
            self.resume_point = ResumePoint(int(state_dict["epoch"]), int(state_dict["batches"]))

    def _check_same_data(self, recorded: str | None) -> None:
        """A resumed fit trains on the checkpoint's data or not at all: the same settings over a
        corpus made otherwise since (another version of the code that synthesises or cuts it)
        would go on along another curve, recorded as the checkpoint's."""
        trainer = self.trainer
        if recorded is None or trainer is None or trainer.state.fn != "fit":
            return
        now = self.data_key()
        if now is not None and now != recorded:
            raise ValueError(f"{type(self).__name__}'s training data is not the checkpoint's (data key {recorded} → "
                             f"{now}: the same settings make another corpus since); a resumed run would go on "
                             "along another curve: start a new run (fit without --ckpt_path)")

    def teardown(self, stage: str) -> None:
        """A later ``fit`` draws its own seed (or a checkpoint's)."""
        if stage == "fit":
            self.shuffle_seed, self.resume_point = None, None

    def train_dataloader(self) -> DataLoader:
        return self.loader("train")

    def val_dataloader(self) -> DataLoader:
        return self.loader("val")

    def test_dataloader(self) -> DataLoader:
        """The test split, or the held-out (validation) split where there is no third one."""
        return self.loader("test")

    def predict_dataloader(self) -> DataLoader:
        """What ``unitok predict`` runs on: the test split (or the held-out one), in order."""
        return self.loader("test")
