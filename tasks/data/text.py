"""Text data: users' files or the built-in corpus, tokenized once into a memory-mapped token file."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sysconfig
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from tasks.data.base import Split, SplitDataModule, default_cache_dir, refuse_repeated_files
from tasks.data.docstrings import docstring_key, extract_docstrings, package_of, without_docstrings
from tasks.predictions import prompt_loader
from tokenizers_mm import BPETokenizer
from tokenizers_mm.checks import check_int
from tokenizers_mm.text import CONFIG_FILE, TOKENIZER_FILE

# Parts of the standard library that are tests, vendored code or generated tables, not prose-like code.
_SKIP_PARTS = {"site-packages", "dist-packages", "test", "tests", "idlelib", "lib2to3", "__pycache__", "encodings"}


@functools.cache
def _stdlib_files(first: tuple[str, ...] = ()) -> tuple[Path, ...]:
    """Every corpus file of the standard library: those of the ``first`` top-level packages (in
    that order), then the rest, each group sorted (scanned once per process)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        p for p in root.rglob("*.py")
        if not _SKIP_PARTS.intersection(p.relative_to(root).parts) and p.is_file()
    )
    if not files:
        raise FileNotFoundError(f"no Python source files under the standard library at {root}")
    if first:
        rank = {name: i for i, name in enumerate(first)}
        missing = sorted(set(first) - {package_of(p)[0] for p in files})
        if missing:
            raise ValueError(f"no standard-library source for {missing}; choose packages such as "
                             "['asyncio', 'email', 'logging', 'tkinter']")
        files.sort(key=lambda p: rank.get(package_of(p)[0], len(rank)))  # stable: each group stays sorted
    return tuple(files)


def stdlib_source_files(max_bytes: int | None = None, first: Sequence[str] = ()) -> list[Path]:
    """The Python standard library's own ``.py`` files (found through `sysconfig`), in a fixed
    order — the ``first`` packages' files, then the rest — up to ``max_bytes`` in total: the
    built-in text corpus, on every Python install."""
    chosen, total = [], 0
    for path in _stdlib_files(tuple(first)):
        size = path.stat().st_size
        if max_bytes is not None and total + size > max_bytes and chosen:
            break
        chosen.append(path)
        total += size
    return chosen


def stdlib_test_files(max_bytes: int | None, test_bytes: int, first: Sequence[str] = ()) -> list[Path]:
    """The built-in corpus's test files: of the standard-library files that follow the first
    ``max_bytes`` of them (`stdlib_source_files`), in order, each (non-empty) one that still fits
    in ``test_bytes`` — never read for training or validation. Empty when ``max_bytes`` is None
    (every file is read already)."""
    if max_bytes is None or test_bytes <= 0:
        return []
    files = _stdlib_files(tuple(first))
    chosen, total = [], 0
    for path in files[len(stdlib_source_files(max_bytes, first)):]:
        size = path.stat().st_size
        if 0 < size <= test_bytes - total:
            chosen.append(path)
            total += size
    return chosen


def stdlib_package_files(packages: Sequence[str]) -> list[Path]:
    """The standard library's source files of the given top-level packages (or modules)."""
    wanted = set(packages)
    files = [p for p in _stdlib_files() if package_of(p)[0] in wanted]
    missing = sorted(wanted - {package_of(p)[0] for p in files})
    if missing:
        raise ValueError(f"no standard-library source for {missing}; choose packages such as "
                         "['asyncio', 'email', 'logging', 'tkinter']")
    return files


def without_labelled_docstrings(files: Sequence[Path], packages: Sequence[str], cache_dir: Path) -> list[Path]:
    """``files`` with every docstring that holds one of the ``packages``' labelled docstrings
    (those `tasks.data.labelled_text.DocstringDataModule` draws its examples from, wherever
    in the corpus they are repeated) cut out (`tasks.data.docstrings.without_docstrings`)."""
    if not packages:
        return list(files)
    return without_docstrings(files, _labelled_keys(tuple(sorted(set(packages)))), cache_dir)


@functools.cache
def _labelled_keys(packages: tuple[str, ...]) -> frozenset[str]:
    return frozenset(docstring_key(d.text) for d in extract_docstrings(stdlib_package_files(packages)))


def split_test_files(
    files: Sequence[Path] | None, builtin_max_bytes: int | None, test_fraction: float,
    test_files: Sequence[Path] | None = None, builtin_first: Sequence[str] = (),
) -> tuple[list[Path], list[Path]]:
    """(training-and-validation files, test files) of a text corpus, disjoint by file.

    ``test_files`` given: those are the test set and ``files`` stay whole. The built-in corpus
    (``files`` None; its ``builtin_first`` packages first, `stdlib_source_files`): the
    `stdlib_test_files` after ``builtin_max_bytes``, ``test_fraction`` of that many bytes — the
    training and validation text is the same with or without them.
    Users' ``files``: the last of them, as many as hold at most ``test_fraction`` of the bytes
    (none when even the last file holds more, and never all of them). An empty test list means
    no test split (``unitok test`` then scores the validation split). A file listed twice is
    an error (`refuse_repeated_files`).
    """
    if not 0.0 <= test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in [0, 1), got {test_fraction}")
    refuse_repeated_files({"files": files or []})
    refuse_repeated_files({"test_files": test_files or []})
    if files is None:
        source = stdlib_source_files(builtin_max_bytes, builtin_first)
        if test_files is None:
            budget = int(test_fraction * builtin_max_bytes) if builtin_max_bytes is not None else 0
            return source, stdlib_test_files(builtin_max_bytes, budget, builtin_first)
    elif test_files is not None:
        source = list(files)
    else:
        sizes = [f.stat().st_size for f in files]
        budget, held, n_test = test_fraction * sum(sizes), 0, 0
        while n_test < len(files) - 1 and held + sizes[-n_test - 1] <= budget:
            held += sizes[-n_test - 1]
            n_test += 1
        return list(files[: len(files) - n_test]), list(files[len(files) - n_test:])
    shared = {f.resolve() for f in source} & {Path(f).resolve() for f in test_files}
    if shared:
        raise ValueError(f"test_files must not be training or validation files too: {sorted(map(str, shared))[:5]}")
    return source, list(test_files)


def text_file_paths(files: Sequence[str | Path] | None,
                    test_files: Sequence[str | Path] | None) -> tuple[list[Path] | None, list[Path] | None]:
    """``files`` and ``test_files`` as paths (None stays None), every one an existing file,
    none listed twice."""
    paths = [Path(f) for f in files] if files is not None else None
    tests = [Path(f) for f in test_files] if test_files is not None else None
    missing = [str(f) for f in paths or [] if not f.is_file()]
    if missing:
        raise FileNotFoundError(f"text files not found: {missing[:5]}")
    missing = [str(f) for f in tests or [] if not f.is_file()]
    if missing or tests == []:
        raise FileNotFoundError(f"test files not found: {missing[:5]}" if missing else
                                "test_files is an empty list; leave it unset for the default test split")
    refuse_repeated_files({"files": paths or []})
    refuse_repeated_files({"test_files": tests or []})
    return paths, tests


def read_texts(files: Sequence[Path]) -> list[str]:
    return [p.read_text(encoding="utf-8", errors="replace") for p in files]


def check_train_samples(train_samples: int, batch_size: int, drop_last: bool) -> None:
    """``train_samples`` a whole number ≥ 1, and where the training loader drops its last partial
    batch, ≥ ``batch_size``: fewer would make epochs of no batch at all."""
    check_int("train_samples", train_samples)
    if drop_last and train_samples < batch_size:
        raise ValueError(f"train_samples={train_samples} is fewer than batch_size={batch_size}: the training "
                         "loader drops the last partial batch, so an epoch would have no batch; raise "
                         "train_samples or lower batch_size")


class TokenWindows(Dataset):
    """(input_ids, labels) windows of ``context_length`` tokens from a flat token file.

    Random windows (training: ``num_samples`` offsets drawn from a seeded generator) or
    consecutive non-overlapping ones (validation). The memmap is opened lazily, so the dataset
    pickles cheaply into data-loader workers.
    """

    def __init__(self, path: Path, dtype: str, start: int, stop: int, context_length: int,
                 num_samples: int | None = None, seed: int = 0) -> None:
        if stop - start < context_length + 1:
            raise ValueError(
                f"split has {stop - start} tokens, fewer than context_length + 1 = {context_length + 1}; "
                "use more text or a shorter context"
            )
        self.path, self.dtype, self.start, self.stop = path, dtype, start, stop
        self.context_length = context_length
        self.random = num_samples is not None
        span = stop - start - context_length - 1
        if self.random:
            rng = np.random.default_rng(seed)
            self.offsets = start + rng.integers(0, span + 1, size=num_samples)
        else:
            self.offsets = start + np.arange(0, span + 1, context_length)
        self._tokens: np.memmap | None = None

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if self._tokens is None:
            self._tokens = np.memmap(self.path, dtype=self.dtype, mode="r")
        o = int(self.offsets[index])
        chunk = torch.from_numpy(self._tokens[o : o + self.context_length + 1].astype(np.int64))
        return {"input_ids": chunk[:-1], "labels": chunk[1:]}

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_tokens": None}


def tokenizer_key(path: str | Path | None) -> str | None:
    """A saved tokenizer's contents as a hash (of the files `BPETokenizer.load` reads from
    ``path``), so a tokenizer replaced in the same folder gets its own token cache; None: none."""
    if path is None:
        return None
    path = Path(path)
    file = path / TOKENIZER_FILE if path.is_dir() else path
    h = hashlib.sha1()
    for part in (file, file.parent / CONFIG_FILE):
        h.update(hashlib.sha1(part.read_bytes()).digest() if part.is_file() else b"-")  # missing: fails on loading
    return h.hexdigest()


class TextDataModule(SplitDataModule):
    """Language-modelling windows from text files, or from the built-in corpus when none are given.

    Three splits: training windows and the validation tail come from one token stream; the test
    split is whole files outside that stream (`split_test_files`: the standard-library files
    after ``builtin_max_bytes``, or the last of users' files, or ``test_files``), tokenized with
    the same tokenizer — ``unitok test`` scores text the run never trained or validated on.

    The tokenizer (trained here, or loaded from ``tokenizer``) and the token file are cached
    under ``cache_dir`` by a hash of the inputs, so a second run starts at once.

    Args:
        files: users' text files; None means the Python standard library's source.
        builtin_max_bytes: how much of the standard library to read.
        builtin_first: standard-library packages the built-in corpus reads first (a fine-tuning
            domain), the rest following in order up to ``builtin_max_bytes``.
        held_out_docstrings: packages whose labelled docstrings (`DocstringDataModule`'s
            examples) are cut out of the training and validation text, with their repeats
            anywhere in it (`without_labelled_docstrings`): a corpus that covers the fine-tuning
            domain, never its labelled examples.
        tokenizer: a saved `BPETokenizer` folder; None trains one with ``vocab_size``.
        vocab_size: BPE vocabulary to train. context_length: tokens per window.
        batch_size / num_workers: data loading.
        val_fraction: the tail of the token stream held out for validation.
        test_fraction: the test files' share (see `split_test_files`; 0: no test split, test =
            validation). test_files: users' test files instead (then ``files`` stay whole).
        train_samples: random windows per training epoch, at least ``batch_size`` (the last
            partial training batch is dropped).
        cache_dir: where tokenizer and token files are kept. seed: window sampling seed.
        predict_prompts: prompts continued by ``unitok predict``.
        predict_file: a text file whose non-empty lines are the prompts instead (ids ``file:line``).
    """

    def __init__(
        self,
        files: list[str] | None = None,
        builtin_max_bytes: int = 2_000_000,
        builtin_first: list[str] | None = None,
        held_out_docstrings: list[str] | None = None,
        tokenizer: str | None = None,
        vocab_size: int = 4096,
        context_length: int = 128,
        batch_size: int = 32,
        num_workers: int = 0,
        val_fraction: float = 0.05,
        test_fraction: float = 0.1,
        test_files: list[str] | None = None,
        train_samples: int = 20_000,
        cache_dir: str | None = None,
        seed: int = 0,
        predict_prompts: list[str] | None = None,
        predict_file: str | None = None,
    ) -> None:
        super().__init__(batch_size, num_workers)
        if not 0.0 <= test_fraction < 1.0:
            raise ValueError(f"test_fraction must be in [0, 1), got {test_fraction}")
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
        check_int("context_length", context_length)
        check_train_samples(train_samples, batch_size, self.drop_last_train)
        if files is not None and len(files) == 0:
            raise ValueError("files is an empty list; leave it unset to use the built-in corpus")
        self.files, self.test_files = text_file_paths(files, test_files)
        self.builtin_max_bytes = builtin_max_bytes
        self.builtin_first, self.held_out_docstrings = tuple(builtin_first or ()), tuple(held_out_docstrings or ())
        self.test_fraction = test_fraction
        self.tokenizer_path = tokenizer
        self.requested_vocab_size = vocab_size
        self.context_length = context_length
        self.val_fraction = val_fraction
        self.train_samples = train_samples
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.seed = seed
        self.predict_prompts = predict_prompts or ["def ", "class ", "import "]
        self.predict_file = predict_file
        self._tokenizer: BPETokenizer | None = None
        self._token_file: Path | None = None
        self._dtype = "uint16"
        self._n_tokens = 0
        self._data_key: tuple[Path | None, int, str] | None = None  # (token file, cut, its key), see `data_key`

    # ------------------------------------------------------------------ sources and cache
    def source_files(self) -> list[Path]:
        """The files of the training and validation token stream (the tokenizer's text too),
        without the ``held_out_docstrings``."""
        files = split_test_files(self.files, self.builtin_max_bytes, self.test_fraction, self.test_files,
                                 self.builtin_first)[0]
        return without_labelled_docstrings(files, self.held_out_docstrings, self.cache_dir)

    def test_source_files(self) -> list[Path]:
        """The held-out test files, disjoint from `source_files` (empty: no test split)."""
        return split_test_files(self.files, self.builtin_max_bytes, self.test_fraction, self.test_files,
                                self.builtin_first)[1]

    def _cache_key(self, files: list[Path]) -> str:
        h = hashlib.sha1()
        for f in files:
            stat = f.stat()
            h.update(f"{f.resolve()}|{stat.st_size}|{stat.st_mtime_ns}\n".encode())
        h.update(f"vocab={self.requested_vocab_size}|tok={tokenizer_key(self.tokenizer_path)}".encode())
        return h.hexdigest()[:16]

    @property
    def tokenizer(self) -> BPETokenizer:
        """The tokenizer, trained (or loaded) and cached on first use."""
        if self._tokenizer is None:
            self._prepare()
        return self._tokenizer  # type: ignore[return-value]

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    @property
    def eos_token_id(self) -> int:
        return self.tokenizer.eos_id

    def _prepare(self) -> None:
        files = self.source_files()
        folder = self.cache_dir / self._cache_key(files)
        meta_file = folder / "meta.json"
        if meta_file.is_file():
            meta = json.loads(meta_file.read_text())
            self._tokenizer = BPETokenizer.load(folder)
            self._token_file, self._dtype, self._n_tokens = folder / "tokens.bin", meta["dtype"], meta["n_tokens"]
            return
        folder.mkdir(parents=True, exist_ok=True)
        texts = read_texts(files)
        if self.tokenizer_path is not None:
            tok = BPETokenizer.load(self.tokenizer_path)
        else:
            tok = BPETokenizer.train(iterator=iter(texts), vocab_size=self.requested_vocab_size)
        dtype = "uint16" if tok.vocab_size <= np.iinfo(np.uint16).max + 1 else "uint32"
        ids = np.fromiter((i for row in tok.iter_ids(texts) for i in row), dtype=dtype)
        if ids.size == 0:
            raise ValueError(f"the text files {[str(f) for f in files[:5]]} hold no text")
        tmp = folder / f"tokens.bin.{os.getpid()}.tmp"  # several processes may build the same cache
        ids.tofile(tmp)
        tmp.replace(folder / "tokens.bin")
        tok.save(folder)
        # meta.json last, atomically: its presence means the folder is complete.
        meta_tmp = folder / f"meta.json.{os.getpid()}.tmp"
        meta_tmp.write_text(json.dumps({"dtype": dtype, "n_tokens": int(ids.size),
                                        "files": [str(f) for f in files]}))
        meta_tmp.replace(meta_file)
        self._tokenizer, self._token_file, self._dtype, self._n_tokens = tok, folder / "tokens.bin", dtype, int(ids.size)

    def prepare_data(self) -> None:
        self._prepare()

    # ------------------------------------------------------------------ splits
    def _split(self) -> tuple[int, int]:
        self.tokenizer  # noqa: B018  (ensures the token file exists)
        n_val = max(self.context_length + 1, int(self._n_tokens * self.val_fraction))
        return self._n_tokens - n_val, self._n_tokens

    def data_key(self) -> str:
        """A hash of the training part of the token stream: the ids training windows are cut from
        (read once a token file, in chunks: every checkpoint records it)."""
        cut, _ = self._split()
        if self._data_key is None or self._data_key[:2] != (self._token_file, cut):
            h, left = hashlib.sha1(), cut * np.dtype(self._dtype).itemsize
            with open(self._token_file, "rb") as f:  # type: ignore[arg-type]
                while left and (chunk := f.read(min(left, 1 << 24))):
                    h.update(chunk)
                    left -= len(chunk)
            self._data_key = (self._token_file, cut, h.hexdigest()[:16])
        return self._data_key[2]

    def train_dataset(self) -> TokenWindows:
        cut, _ = self._split()
        return TokenWindows(self._token_file, self._dtype, 0, cut, self.context_length,  # type: ignore[arg-type]
                            num_samples=self.train_samples, seed=self.seed)

    def val_dataset(self) -> TokenWindows:
        cut, end = self._split()
        return TokenWindows(self._token_file, self._dtype, cut, end, self.context_length)  # type: ignore[arg-type]

    def test_dataset(self) -> TokenWindows | None:
        """Consecutive windows of the test files, tokenized once and cached beside the token
        file (None without test files)."""
        files = self.test_source_files()
        if not files:
            return None
        self.tokenizer  # noqa: B018  (the training stream's tokenizer and cache folder)
        path = self._token_file.with_name(f"test-{self._cache_key(files)}.bin")  # type: ignore[union-attr]
        if not path.is_file():
            ids = np.fromiter((i for row in self.tokenizer.iter_ids(read_texts(files)) for i in row), dtype=self._dtype)
            tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # several processes may build it
            ids.tofile(tmp)
            tmp.replace(path)
        n_tokens = path.stat().st_size // np.dtype(self._dtype).itemsize
        if n_tokens < self.context_length + 1:
            raise ValueError(f"the test files {[str(f) for f in files[:5]]} hold {n_tokens} tokens, fewer than "
                             f"context_length + 1 = {self.context_length + 1}; pass test_files or test_fraction")
        return TokenWindows(path, self._dtype, 0, n_tokens, self.context_length)

    def dataset(self, split: Split) -> TokenWindows | None:
        """Random training windows, consecutive windows of the validation tail and of the test files."""
        return {"train": self.train_dataset, "val": self.val_dataset, "test": self.test_dataset}[split]()

    def predict_dataloader(self) -> DataLoader:
        """The prompts (or the predict file's lines), as lists of strings."""
        return prompt_loader(self.predict_prompts, self.predict_file, self.batch_size)
