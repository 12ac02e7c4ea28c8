"""Data for T5: span-corruption pretraining windows and text-to-text examples with task prefixes.

Both modules use one kind of tokenizer: byte-level BPE with T5's special tokens — ``<pad>``
(id 0, also the decoder's start token), ``</s>`` (id 1) and the sentinels ``<extra_id_0>`` … —
trained on the same corpus and cached, so a text-to-text run reads a span-corruption
checkpoint's vocabulary (or points ``tokenizer`` at its exported folder).

Built-in text-to-text tasks, read off the Python standard library with `ast`:

- ``name: <first line of a function's docstring>`` → the function's name;
- ``identifiers: <one line of code>`` → the names in it, in order (keywords left out);
- ``params: <a def line>`` → its parameter names, in order;
- ``statement: <one line of code>`` → what kind of statement it is (``assignment``,
  ``return``, ``import from``, …: a classification, written as text the way T5 does).

Held-out examples come from held-out files (chosen by a hash of the file's path), so no
validation example shares a file with a training one; test examples come from the
standard-library files after ``builtin_max_bytes`` (`tasks.data.text.stdlib_test_files`), which
neither the tokenizer nor training nor validation reads, less any pair seen in those splits.
"""

from __future__ import annotations

import ast
import hashlib
import io
import json
import keyword
import os
import sysconfig
import tokenize
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from torch import Tensor
from torch.utils.data import DataLoader

from tasks.data.base import Split, SplitDataModule, default_cache_dir, refuse_repeated_files
from tasks.data.docstrings import source_lines
from tasks.data.span_corruption import (
    IGNORE,
    SpanCorruptionCollator,
    check_noise_rates,
    noise_span_counts,
    sentinel_ids,
    sentinel_tokens,
)
from tasks.data.text import TextDataModule, read_texts, stdlib_source_files, stdlib_test_files
from tasks.predictions import prompt_loader
from tokenizers_mm import BPETokenizer, collate
from tokenizers_mm.checks import check_int

PAD_TOKEN = "<pad>"
EOS_TOKEN = "</s>"


# --------------------------------------------------------------------------- tokenizer
def t5_special_tokens(num_sentinels: int = 100) -> list[str]:
    """``<pad>`` (id 0), ``</s>`` (id 1), then ``<extra_id_0>`` … ``<extra_id_{n-1}>``."""
    return [PAD_TOKEN, EOS_TOKEN, *sentinel_tokens(num_sentinels)]


def train_t5_tokenizer(texts: Iterable[str], vocab_size: int = 4096, num_sentinels: int = 100) -> BPETokenizer:
    """A byte-level BPE with T5's special tokens (pad, EOS, sentinels), trained on ``texts``."""
    return BPETokenizer.train(iterator=texts, vocab_size=vocab_size, special_tokens=t5_special_tokens(num_sentinels),
                              eos_token=EOS_TOKEN, pad_token=PAD_TOKEN)


def _files_key(files: Sequence[Path], *parts: object) -> str:
    h = hashlib.sha1()
    for f in files:
        stat = f.stat()
        h.update(f"{f.resolve()}|{stat.st_size}|{stat.st_mtime_ns}\n".encode())
    h.update("|".join(map(str, parts)).encode())
    return h.hexdigest()[:16]


def cached_t5_tokenizer(files: Sequence[Path], vocab_size: int, num_sentinels: int, cache_dir: str | Path) -> Path:
    """Train `train_t5_tokenizer` on ``files`` once and keep it under ``cache_dir``; returns
    the folder (`BPETokenizer.load` reads it). Same files and sizes → the same folder."""
    folder = Path(cache_dir) / f"t5-tokenizer-{_files_key(files, vocab_size, num_sentinels)}"
    if not (folder / "tokenizer_config.json").is_file():
        tok = train_t5_tokenizer(iter(read_texts(files)), vocab_size, num_sentinels)
        tmp = folder.with_name(f"{folder.name}.{os.getpid()}.tmp")  # several processes may build it
        tok.save(tmp)
        try:
            tmp.replace(folder)
        except OSError:  # another process finished first: use theirs
            for f in tmp.iterdir():
                f.unlink()
            tmp.rmdir()
    return folder


# --------------------------------------------------------------------------- span corruption
class SpanCorruptionDataModule(TextDataModule):
    """T5 pretraining batches: raw windows of ``context_length`` tokens from users' text files
    or the built-in corpus, span-corrupted by `SpanCorruptionCollator` (fresh masks every
    batch in training, fixed per window in validation).

    Takes `TextDataModule`'s arguments (``files``, ``builtin_max_bytes``, ``vocab_size``,
    ``context_length``, ``batch_size``, ``train_samples``, ``cache_dir``, ``test_fraction`` /
    ``test_files`` for the held-out test files, …), plus:

    Args:
        tokenizer: a saved `BPETokenizer` folder with ``<extra_id_*>`` sentinels; None trains
            one with T5's special tokens (``<pad>`` = 0, ``</s>`` = 1) and caches it.
        num_sentinels: sentinels added when training the tokenizer (T5: 100).
        noise_density / mean_noise_span_length: T5's 0.15 and 3.
        predict_prompts: texts with sentinels for ``unitok predict`` to fill in.
        predict_file: a text file whose non-empty lines are the prompts instead (ids ``file:line``).
    """

    def __init__(
        self,
        files: list[str] | None = None,
        builtin_max_bytes: int = 2_000_000,
        tokenizer: str | None = None,
        vocab_size: int = 4096,
        num_sentinels: int = 100,
        context_length: int = 128,
        noise_density: float = 0.15,
        mean_noise_span_length: float = 3.0,
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
        super().__init__(files=files, builtin_max_bytes=builtin_max_bytes, tokenizer=tokenizer,
                         vocab_size=vocab_size, context_length=context_length, batch_size=batch_size,
                         num_workers=num_workers, val_fraction=val_fraction, test_fraction=test_fraction,
                         test_files=test_files, train_samples=train_samples,
                         cache_dir=cache_dir, seed=seed,
                         predict_prompts=predict_prompts or ["def <extra_id_0>(self, name):\n    self.<extra_id_1> = name\n",
                                                             "import <extra_id_0>\n"],
                         predict_file=predict_file)
        check_noise_rates(noise_density, mean_noise_span_length)  # now, not after building the tokenizer
        if context_length < 2:
            raise ValueError(f"context_length={context_length} is too short for span corruption: need at least 2")
        if num_sentinels < 2:
            raise ValueError(f"num_sentinels must be ≥ 2 (one span and the closing sentinel), got {num_sentinels}")
        self.num_sentinels = num_sentinels
        self.noise_density, self.mean_noise_span_length = noise_density, mean_noise_span_length

    def _prepare(self) -> None:
        if self.tokenizer_path is None:  # T5's special tokens: train our own (cached)
            self.tokenizer_path = str(cached_t5_tokenizer(self.source_files(), self.requested_vocab_size,
                                                          self.num_sentinels, self.cache_dir))
        super()._prepare()
        have = len(sentinel_ids(self._tokenizer))  # type: ignore[arg-type]  # none at all: a clear error now
        # A window's spans, one more where a rolled span wraps around, and the closing sentinel.
        need = noise_span_counts(self.context_length, self.noise_density, self.mean_noise_span_length)[1] + 2
        if have < need:
            raise ValueError(f"windows of context_length={self.context_length} need up to {need} sentinels but the "
                             f"tokenizer has {have}; add sentinels (num_sentinels) or shorten the windows")

    @property
    def pad_token_id(self) -> int:
        return self.tokenizer.pad_id

    def collator(self, seed: int | None = None) -> SpanCorruptionCollator:
        return SpanCorruptionCollator.from_tokenizer(self.tokenizer, noise_density=self.noise_density,
                                                     mean_noise_span_length=self.mean_noise_span_length, seed=seed)

    def collate_fn(self, split: Split) -> SpanCorruptionCollator:
        """Fresh noise every training batch; the same spans in every validation and test pass."""
        return self.collator() if split == "train" else self.collator(seed=self.seed)


# --------------------------------------------------------------------------- built-in text-to-text tasks
Example = dict[str, Any]  # {"input": "prefix: …", "target": "…", "source": where it came from, "builtin": bool}


def _code_names(code: str) -> list[str] | None:
    """The NAME tokens of one line of code that are not keywords, in order (None: unreadable)."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return None
    return [t.string for t in tokens if t.type == tokenize.NAME and not keyword.iskeyword(t.string)]


def _name_examples(tree: ast.AST, lines: list[str], max_chars: int) -> list[tuple[str, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node)
            first = doc.strip().splitlines()[0].strip() if doc and doc.strip() else ""
            if 10 <= len(first) <= max_chars:
                found.append((first, node.name))
    return found


def _one_line_code(lines: list[str], node: ast.stmt) -> str:
    """A one-line statement's source, stripped: ast's columns count UTF-8 bytes, not characters."""
    line = lines[node.lineno - 1].encode("utf-8")
    return line[node.col_offset:node.end_col_offset].decode("utf-8").strip()


_SIMPLE_STATEMENTS = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Return, ast.Expr, ast.Raise, ast.Assert,
                      ast.Import, ast.ImportFrom, ast.Delete)


def _identifier_examples(tree: ast.AST, lines: list[str], max_chars: int) -> list[tuple[str, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, _SIMPLE_STATEMENTS) and node.lineno == node.end_lineno:
            code = _one_line_code(lines, node)
            if not code or len(code) > max_chars or isinstance(getattr(node, "value", None), ast.Constant):
                continue  # docstrings and bare constants hold no names
            names = _code_names(code)
            if names:
                found.append((code, " ".join(names)))
    return found


_STATEMENT_KINDS = {ast.Assign: "assignment", ast.AugAssign: "augmented assignment",
                    ast.AnnAssign: "annotated assignment", ast.Return: "return", ast.Expr: "expression",
                    ast.Raise: "raise", ast.Assert: "assert", ast.Import: "import", ast.ImportFrom: "import from",
                    ast.Delete: "delete"}


def _statement_examples(tree: ast.AST, lines: list[str], max_chars: int) -> list[tuple[str, str]]:
    found = []
    for node in ast.walk(tree):
        kind = _STATEMENT_KINDS.get(type(node))
        if kind is not None and node.lineno == node.end_lineno:
            code = _one_line_code(lines, node)
            if code and len(code) <= max_chars and not isinstance(getattr(node, "value", None), ast.Constant):
                found.append((code, kind))
    return found


def _params_examples(tree: ast.AST, lines: list[str], max_chars: int) -> list[tuple[str, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            line = lines[node.lineno - 1].strip()
            a = node.args
            params = [p.arg for p in [*a.posonlyargs, *a.args, *([a.vararg] if a.vararg else []), *a.kwonlyargs,
                                      *([a.kwarg] if a.kwarg else [])]]
            # Only one-line signatures, so the input holds every parameter.
            if params and line.startswith(("def ", "async def ")) and line.endswith(":") and len(line) <= max_chars:
                found.append((line, " ".join(params)))
    return found


BUILTIN_TASKS: dict[str, Callable[[ast.AST, list[str], int], list[tuple[str, str]]]] = {
    "name": _name_examples,
    "identifiers": _identifier_examples,
    "params": _params_examples,
    "statement": _statement_examples,
}


def prefix_of(text: str, allowed: Sequence[str] | None = None) -> str | None:
    """The task prefix of an input: one word before ``": "`` (``"name: …"`` → ``"name"``), or the
    longest of ``allowed`` it starts with (T5's ``"translate English to German: …"``); None
    when it has none."""
    known = [p for p in allowed or () if text.startswith(f"{p}: ")]
    if known:
        return max(known, key=len)
    head, sep, _ = text.partition(": ")
    return head if sep and head and " " not in head else None


def _hash_unit(key: str) -> float:
    """A stable number in [0, 1) for ``key``: which split a file or a user's example falls in."""
    return int(hashlib.sha1(key.encode()).hexdigest()[:8], 16) / 16**8


def held_out_files(files: Sequence[Path], val_fraction: float = 0.1) -> set[Path]:
    """The ``val_fraction`` of ``files`` (at least one) with the smallest hash of their path
    (relative to the standard library): the same files are held out on every machine."""
    if len(files) < 2:
        raise ValueError(f"need at least 2 source files to hold some out, got {len(files)}; read more of the "
                         "standard library (builtin_max_bytes)")
    root = Path(sysconfig.get_paths()["stdlib"])
    keys = {f: str(f.relative_to(root)) if f.is_relative_to(root) else f.name for f in files}
    ranked = sorted(files, key=lambda f: _hash_unit(keys[f]))
    return set(ranked[: min(len(files) - 1, max(1, round(val_fraction * len(files))))])


def builtin_text_to_text_examples(
    files: Sequence[Path], tasks: Sequence[str] = tuple(BUILTIN_TASKS), max_chars: int = 80,
    val_fraction: float = 0.1, test_files: Sequence[Path] = (),
) -> dict[str, list[Example]]:
    """{"train", "val", "test"} built-in examples of ``tasks``: train and val from ``files``, split
    by file (see `held_out_files`), test from ``test_files`` (none without them), each
    ``{"input": "<task>: …", "target": …, "source": "path:line"}``. An input is kept in the split
    of the first file it occurs in (``files`` in order, then ``test_files``), with every target
    it has there, so no held-out input was trained on, even with another answer
    (``name: Wait.`` → ``wait`` in one file, ``_wait`` in another)."""
    unknown = [t for t in tasks if t not in BUILTIN_TASKS]
    if unknown:
        raise ValueError(f"unknown built-in tasks {unknown}; expected some of {list(BUILTIN_TASKS)}")
    root = Path(sysconfig.get_paths()["stdlib"])
    val_files = held_out_files(files, val_fraction)
    test_set = set(test_files)
    if test_set & set(files):
        raise ValueError(f"test files are training or validation files too: {sorted(map(str, test_set & set(files)))[:5]}")
    splits: dict[str, list[Example]] = {"train": [], "val": [], "test": []}
    seen: set[tuple[str, str]] = set()  # each pair once
    home: dict[str, str] = {}  # input -> the split it was first seen in
    for path in [*files, *test_files]:
        source = path.read_text(encoding="utf-8", errors="replace")
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            continue
        lines = source_lines(source)  # numbered as ast numbers them
        relative = str(path.relative_to(root)) if path.is_relative_to(root) else str(path)
        split = "test" if path in test_set else "val" if path in val_files else "train"
        for task in tasks:
            for text, target in BUILTIN_TASKS[task](tree, lines, max_chars):
                pair = (f"{task}: {text}", target)
                if pair not in seen and home.setdefault(pair[0], split) == split:
                    seen.add(pair)
                    splits[split].append({"input": pair[0], "target": target, "source": relative, "builtin": True})
    return splits


def load_jsonl_examples(paths: Sequence[str | Path]) -> list[Example]:
    """Users' examples: one ``{"input": …, "target": …}`` JSON object per line (blank lines
    skipped); a bad line is an error naming its file and line number."""
    examples: list[Example] = []
    for path in paths:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"JSONL file not found: {path}")
        # JSONL rows end at "\n" only: a JSON string may hold U+2028 or U+0085 as they are
        for number, line in enumerate(path.read_text(encoding="utf-8").split("\n"), start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{where} is not valid JSON ({err.msg}); expected {{\"input\": …, \"target\": …}}") from None
            if not isinstance(row, dict) or not all(isinstance(row.get(k), str) and row[k].strip()
                                                    for k in ("input", "target")):
                raise ValueError(f"{where}: expected an object with non-empty string fields \"input\" and "
                                 f"\"target\", got {line[:120]!r}")
            examples.append({"input": row["input"], "target": row["target"], "source": where, "builtin": False})
    return examples


def check_disjoint_inputs(splits: dict[str, list[Example]]) -> None:
    """A ValueError, with a count and an example, when an input is in more than one split: the
    model would be scored on what it trained or was selected on. The same input twice within
    one split is fine. Built-in examples never share an input (`builtin_text_to_text_examples`),
    so a shared input involves a user's example."""
    where: dict[str, dict[str, str]] = {}  # input -> split -> the first example's source there
    for split, rows in splits.items():
        for ex in rows:
            where.setdefault(ex["input"], {}).setdefault(split, ex["source"])
    shared = [(text, places) for text, places in where.items() if len(places) > 1]
    if shared:
        text, places = shared[0]
        found = ", ".join(f"{split} ({source})" for split, source in places.items())
        raise ValueError(f"{len(shared)} input(s) are in more than one split, e.g. {text[:80]!r} in {found}; keep each "
                         "input in one of jsonl, val_jsonl and test_jsonl (and out of the built-in tasks' splits)")


def _json_cache(folder: Path, name: str, build: Callable[[], Any]) -> Any:
    file = folder / f"{name}.json"
    if file.is_file():
        return json.loads(file.read_text())
    value = build()
    folder.mkdir(parents=True, exist_ok=True)
    tmp = file.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(value))
    tmp.replace(file)
    return value


class TextToTextCollator:
    """Pads encoded examples ``{"input_ids", "labels", "prefix"}`` into ``input_ids``,
    ``attention_mask`` (pad id), ``labels`` (-100) and ``prefix`` (a list of task names, for
    per-task metrics). Picklable."""

    def __init__(self, pad_id: int) -> None:
        self.pad_id = pad_id

    def __call__(self, items: Sequence[dict[str, Any]]) -> dict[str, Any]:
        enc = collate([item["input_ids"] for item in items], pad_id=self.pad_id)
        dec = collate([item["labels"] for item in items], pad_id=self.pad_id)
        labels = dec.ids.masked_fill(dec.attention_mask == 0, IGNORE)  # type: ignore[union-attr]
        return {"input_ids": enc.ids, "attention_mask": enc.attention_mask, "labels": labels,
                "prefix": [item["prefix"] or "" for item in items]}


class TextToTextDataModule(SplitDataModule):
    """Text-to-text fine-tuning: ``"<task>: input"`` → ``"target"`` pairs, several tasks mixed
    in one run and told apart by their prefix (see the module docstring for the built-in ones).

    Args:
        tasks: built-in tasks to mix (``name``, ``identifiers``, ``params``, ``statement``); None = all,
            or none when ``jsonl`` is given.
        jsonl / val_jsonl: users' JSONL files (``{"input": …, "target": …}`` per line); without
            ``val_jsonl`` a ``val_fraction`` of them is held out by a hash of the input (rows
            with the same input stay together).
        test_jsonl: users' test examples (same format), scored by ``unitok test``. A file given
            twice (for two splits, or twice for one) is an error, and so is an input that
            is in two splits (`check_disjoint_inputs`): no example is tested on what trained it.
        test_fraction: built-in test examples come from the standard-library files after
            ``builtin_max_bytes``, ``test_fraction`` of that many bytes (0, or
            ``builtin_max_bytes`` None: none). Without any test example ``unitok test``
            scores the validation split.
        allowed_prefixes: when given, every example's prefix must be one of them (else an error);
            one may have several words (``"translate English to German"``).
        builtin_max_bytes: how much of the standard library to read (built-in tasks and tokenizer).
        tokenizer: a saved BPE folder with T5's specials (a span-corruption run's ``pretrained``
            folder); None trains (or reuses) the one `SpanCorruptionDataModule` trains.
        vocab_size / num_sentinels: for that tokenizer.
        max_input_length / max_target_length: tokens, EOS included. A user's example that is
            longer is an error naming it unless ``truncation``; built-in ones are left out.
        max_chars: longest built-in input text (characters, ≥ 1).
        train_per_task / val_per_task: examples per task after a seeded shuffle (None = all);
            the test split takes ``val_per_task`` too.
        predict_inputs: inputs answered by ``unitok predict``.
        predict_file: a text file whose non-empty lines are the inputs instead (ids ``file:line``).
    """

    drop_last_train = False  # every example trains, the last batch too

    def __init__(
        self,
        tasks: list[str] | None = None,
        jsonl: list[str] | None = None,
        val_jsonl: list[str] | None = None,
        test_jsonl: list[str] | None = None,
        allowed_prefixes: list[str] | None = None,
        builtin_max_bytes: int | None = 2_000_000,
        tokenizer: str | None = None,
        vocab_size: int = 4096,
        num_sentinels: int = 100,
        max_input_length: int = 64,
        max_target_length: int = 32,
        truncation: bool = False,
        max_chars: int = 80,
        train_per_task: int | None = None,
        val_per_task: int | None = 100,
        val_fraction: float = 0.1,
        test_fraction: float = 0.1,
        batch_size: int = 32,
        num_workers: int = 0,
        seed: int = 0,
        cache_dir: str | None = None,
        predict_inputs: list[str] | None = None,
        predict_file: str | None = None,
    ) -> None:
        super().__init__(batch_size, num_workers)
        if tasks is None:
            tasks = [] if jsonl else list(BUILTIN_TASKS)
        unknown = [t for t in tasks if t not in BUILTIN_TASKS]
        if unknown:
            raise ValueError(f"unknown built-in tasks {unknown}; expected some of {list(BUILTIN_TASKS)}")
        if not tasks and not jsonl:
            raise ValueError("no examples: give built-in `tasks` or users' `jsonl` files")
        if val_jsonl and not jsonl:
            raise ValueError("val_jsonl is given without jsonl training files")
        if allowed_prefixes is not None:
            blocked = [t for t in tasks if t not in allowed_prefixes]
            if blocked:
                raise ValueError(f"built-in tasks {blocked} have prefixes outside allowed_prefixes="
                                 f"{list(allowed_prefixes)}")
        if max_input_length < 2 or max_target_length < 2:
            raise ValueError(f"max_input_length and max_target_length must be ≥ 2 (a token and EOS), got "
                             f"{max_input_length}, {max_target_length}")
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
        if not 0.0 <= test_fraction < 1.0:
            raise ValueError(f"test_fraction must be in [0, 1), got {test_fraction}")
        for name, value in (("train_per_task", train_per_task), ("val_per_task", val_per_task)):
            check_int(name, value, or_none=True, note="(None: all)")
        check_int("max_chars", max_chars)
        refuse_repeated_files({"jsonl": jsonl or [], "val_jsonl": val_jsonl or [], "test_jsonl": test_jsonl or []})
        self.tasks, self.jsonl, self.val_jsonl = list(tasks), list(jsonl or []), list(val_jsonl or [])
        self.test_jsonl, self.test_fraction = list(test_jsonl or []), test_fraction
        self.allowed_prefixes = list(allowed_prefixes) if allowed_prefixes is not None else None
        self.builtin_max_bytes, self.tokenizer_path = builtin_max_bytes, tokenizer
        self.requested_vocab_size, self.num_sentinels = vocab_size, num_sentinels
        self.max_input_length, self.max_target_length, self.truncation = max_input_length, max_target_length, truncation
        self.max_chars, self.train_per_task, self.val_per_task = max_chars, train_per_task, val_per_task
        self.val_fraction, self.seed = val_fraction, seed
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.predict_inputs = predict_inputs or [
            "name: Return the number of items in the queue.",
            "identifiers: self.assertEqual(result, expected)",
            "params: def send(self, data, flags=0):",
        ]
        self.predict_file = predict_file
        self._tokenizer: BPETokenizer | None = None
        self._examples: dict[str, list[Example]] | None = None
        self._encoded: dict[str, list[dict[str, Any]]] = {}

    # ------------------------------------------------------------------ tokenizer
    def _corpus_files(self) -> list[Path]:
        return stdlib_source_files(self.builtin_max_bytes)

    def _test_files(self) -> list[Path]:
        """The standard-library files the built-in test examples come from (see `stdlib_test_files`)."""
        budget = int(self.test_fraction * self.builtin_max_bytes) if self.builtin_max_bytes is not None else 0
        return stdlib_test_files(self.builtin_max_bytes, budget)

    @property
    def tokenizer(self) -> BPETokenizer:
        if self._tokenizer is None:
            path = self.tokenizer_path or cached_t5_tokenizer(self._corpus_files(), self.requested_vocab_size,
                                                              self.num_sentinels, self.cache_dir)
            self._tokenizer = BPETokenizer.load(path)
        return self._tokenizer

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    @property
    def pad_token_id(self) -> int:
        return self.tokenizer.pad_id

    @property
    def eos_token_id(self) -> int:
        return self.tokenizer.eos_id

    # ------------------------------------------------------------------ examples
    def task_prefix(self, text: str) -> str | None:
        """The text's task prefix (`prefix_of`; ``allowed_prefixes`` may have several words)."""
        return prefix_of(text, self.allowed_prefixes)

    def check_prefix(self, text: str, where: str = "input") -> str | None:
        """The text's prefix; an error when ``allowed_prefixes`` is set and it is not one of them."""
        prefix = self.task_prefix(text)
        if self.allowed_prefixes is not None and prefix not in self.allowed_prefixes:
            head, sep, _ = text.partition(": ")
            shown = f"prefix {prefix or head!r}" if prefix or (sep and head) else "no 'prefix: ' at its start"
            raise ValueError(f"{where} has {shown}; allowed_prefixes={self.allowed_prefixes} "
                             f"(input {text[:80]!r})")
        return prefix

    def examples(self) -> dict[str, list[Example]]:
        """{"train", "val", "test"} examples (texts; test may be empty), built once and cached
        under ``cache_dir``."""
        if self._examples is None:
            splits: dict[str, list[Example]] = {"train": [], "val": [], "test": []}
            if self.tasks:
                files, test_files = self._corpus_files(), self._test_files()
                key = _files_key([*files, *test_files], len(files), sorted(self.tasks), self.max_chars,
                                 self.val_fraction, "v4")
                built = _json_cache(self.cache_dir, f"text-to-text-{key}",
                                    lambda: builtin_text_to_text_examples(files, self.tasks, self.max_chars,
                                                                          self.val_fraction, test_files))
                for split in splits:
                    splits[split] += built[split]
            if self.jsonl:
                users = load_jsonl_examples(self.jsonl)
                if self.val_jsonl:
                    splits["train"] += users
                    splits["val"] += load_jsonl_examples(self.val_jsonl)
                else:
                    for ex in users:
                        splits["val" if _hash_unit(ex["input"]) < self.val_fraction else "train"].append(ex)
            splits["test"] += load_jsonl_examples(self.test_jsonl)
            check_disjoint_inputs(splits)
            for split in splits:
                for ex in splits[split]:
                    self.check_prefix(ex["input"], f"example {ex['source']}")
            splits = {split: self._per_task(rows, self.train_per_task if split == "train" else self.val_per_task)
                      for split, rows in splits.items()}
            for split in ("train", "val"):
                if not splits[split]:
                    raise ValueError(f"the {split} split has no examples; use more data or a larger val_fraction")
            self._examples = splits
        return self._examples

    def _per_task(self, rows: list[Example], limit: int | None) -> list[Example]:
        """A seeded shuffle, then at most ``limit`` examples of each prefix."""
        order = np.random.default_rng(self.seed).permutation(len(rows))
        counts: dict[str | None, int] = {}
        kept = []
        for i in order:
            prefix = self.task_prefix(rows[i]["input"])
            if limit is None or counts.get(prefix, 0) < limit:
                counts[prefix] = counts.get(prefix, 0) + 1
                kept.append(rows[i])
        return kept

    def _fit(self, ids: list[int], limit: int, ex: Example, field: str) -> list[int] | None:
        """ids (EOS included) within ``limit``: cut (keeping EOS) with ``truncation``; built-in
        examples that do not fit are dropped (None); a user's is an error naming it."""
        if len(ids) <= limit:
            return ids
        if self.truncation:
            return [*ids[: limit - 1], ids[-1]]
        if ex["builtin"]:
            return None
        name = "max_input_length" if field == "input" else "max_target_length"
        raise ValueError(f"example {ex['source']}: the {field} has {len(ids)} tokens (EOS included), more than "
                         f"{name}={limit}; raise {name} or pass truncation=True (input {ex['input'][:60]!r})")

    def encoded(self, split: str) -> list[dict[str, Any]]:
        """The ``split``'s examples as ids (``input_ids``, ``labels``, both ending in EOS) and prefix."""
        if split not in self._encoded:
            rows = self.examples()[split]
            tok = self.tokenizer
            inputs = list(tok.iter_ids(ex["input"] for ex in rows))
            targets = list(tok.iter_ids(ex["target"] for ex in rows))
            out = []
            for ex, src, tgt in zip(rows, inputs, targets):
                src = self._fit(src, self.max_input_length, ex, "input")
                tgt = self._fit(tgt, self.max_target_length, ex, "target")
                if src is not None and tgt is not None:
                    out.append({"input_ids": src, "labels": tgt, "prefix": self.task_prefix(ex["input"]),
                                "input": ex["input"], "target": ex["target"]})
            if not out:
                raise ValueError(f"no {split} example fits max_input_length={self.max_input_length} and "
                                 f"max_target_length={self.max_target_length}")
            self._encoded[split] = out
        return self._encoded[split]

    def data_key(self) -> str:
        """A hash of the training examples as trained on (texts and their ids): the built-in ones
        are read off the standard library of the Python that runs, which another version changes.
        (`SpanCorruptionDataModule` has `TextDataModule`'s: its token stream's.)"""
        return self._content_key_of(self.encoded("train"))

    @property
    def prefixes(self) -> list[str]:
        """The task prefixes in the training data."""
        return sorted({p for p in (self.task_prefix(ex["input"]) for ex in self.examples()["train"]) if p})

    # ------------------------------------------------------------------ Lightning
    def prepare_data(self) -> None:
        self.encoded("train")
        self.encoded("val")

    def dataset(self, split: Split) -> list[dict[str, Any]] | None:
        """The split's encoded examples (test: None when there are no test examples)."""
        return self.encoded(split) if split != "test" or self.examples()["test"] else None

    def collate_fn(self, split: Split) -> TextToTextCollator:
        return TextToTextCollator(self.pad_token_id)

    def predict_dataloader(self) -> DataLoader:
        """The predict inputs (or the predict file's lines), as lists of strings; prefixes checked."""
        loader = prompt_loader(self.predict_inputs, self.predict_file, self.batch_size)
        for i, text in enumerate(loader.dataset.texts):  # type: ignore[attr-defined]
            self.check_prefix(text, f"predict input {loader.dataset.item_id(i)}")  # type: ignore[attr-defined]
        return loader


def encode_inputs(tokenizer: BPETokenizer, texts: Sequence[str]) -> dict[str, Tensor]:
    """Encoder inputs for ``generate``: each text + EOS, right-padded (``input_ids``, ``attention_mask``)."""
    empty = [i for i, text in enumerate(texts) if not text]
    if empty:
        raise ValueError(f"texts {empty[:5]} are empty; every input needs at least one character")
    batch = collate(list(tokenizer.iter_ids(texts)), pad_id=tokenizer.pad_id)
    return {"input_ids": batch.ids, "attention_mask": batch.attention_mask}  # type: ignore[dict-item]


__all__ = ["BUILTIN_TASKS", "SpanCorruptionDataModule", "TextToTextCollator", "TextToTextDataModule",
           "builtin_text_to_text_examples", "cached_t5_tokenizer", "check_disjoint_inputs", "encode_inputs",
           "held_out_files", "load_jsonl_examples", "prefix_of", "t5_special_tokens",
           "train_t5_tokenizer"]
