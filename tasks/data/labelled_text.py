"""Built-in labelled text for fine-tuning demos and tests — real labels, read off the Python
standard library (no downloads, no random labels):

- ``DocstringDataModule(task="package")``: which package a docstring comes from
  (sequence classification);
- ``DocstringDataModule(task="match")``: does this docstring belong to this ``def`` line?
  (sentence-pair classification through segment ids);
- ``CodeTokensDataModule``: the lexical category of every token of a source line, as
  Python's own `tokenize` module reads it (token classification, word labels on sub-words);
- ``DocstringQADataModule``: given a docstring and the ``def`` lines of its module, point at
  the name of the function it documents (extractive QA, start/end span).

Each needs a BERT-family tokenizer: a pretrained checkpoint's (``tokenizer`` folder) or one
trained on the corpus. ``DocstringDataModule`` also reads with a GPT's byte-level BPE
(``text <eos>``, GPT-1's input for a classifier on the last token).
"""

from __future__ import annotations

import builtins
import hashlib
import io
import json
import keyword
import os
import tokenize
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader

from tasks.data.base import DisjointSets, Split, SplitDataModule, default_cache_dir
from tasks.data.bert import prepare_wordpiece_corpus
from tasks.data.docstrings import Docstring, docstring_key, extract_docstrings
from tasks.data.text import stdlib_package_files
from tokenizers_mm import BPETokenizer, WordPieceTokenizer, align_word_labels, pad_pairs
from tokenizers_mm.checks import check_int

DEFAULT_PACKAGES = ("asyncio", "email", "logging", "tkinter")
TOKEN_CLASSES = ("keyword", "builtin", "name", "operator", "number", "string", "comment")
SPLITS = ("train", "val", "test")


def near_copy_families(keys: Sequence[str]) -> dict[str, str]:
    """Each docstring key -> its family's first key: texts of four words or more one word apart
    (a word replaced, added or dropped) are near-copies, and families are their transitive
    closure — templated docstrings such as "construct a ttk {button | label} with parent master"
    or "log a message with severity {debug | info} on the root logger" form one family.
    Word-deletion signatures find them in linear time (two texts one edit apart share one)."""
    order: dict[str, int] = {}  # first appearance: a family is named by its earliest member
    sets = DisjointSets()
    owner: dict[str, str] = {}
    for key in keys:
        if key in order:
            continue
        order[key] = len(order)
        words = key.split()
        signatures = [key]
        if len(words) >= 4:
            signatures += [" ".join(words[:i] + ["\0"] + words[i + 1:]) for i in range(len(words))]  # replaced
            signatures += [" ".join(words[:i] + words[i + 1:]) for i in range(len(words))]  # one fewer word
        for signature in signatures:
            if signature in owner:
                first, later = sorted((sets.root(key), sets.root(owner[signature])), key=order.__getitem__)
                sets.join(first, later)
            else:
                owner[signature] = key
    return {key: sets.root(key) for key in order}  # type: ignore[misc]


def distinct_docstrings(docs: Sequence[Docstring]) -> list[Docstring]:
    """One docstring per family of near-copies (`near_copy_families`: the same words, whitespace,
    case and punctuation aside, or one word apart): the first is kept, the rest dropped, and a
    family found in two packages is dropped altogether (its label would be ambiguous). So no
    text, and no near-copy of one, is in two of the splits drawn from them."""
    family = near_copy_families([docstring_key(d.text) for d in docs])
    packages: dict[str, set[str]] = {}
    for d in docs:
        packages.setdefault(family[docstring_key(d.text)], set()).add(d.package)
    seen: set[str] = set()
    kept = []
    for d in docs:
        key = family[docstring_key(d.text)]
        if len(packages[key]) == 1 and key not in seen:
            seen.add(key)
            kept.append(d)
    return kept


def load_text_tokenizer(path: str | Path) -> WordPieceTokenizer | BPETokenizer:
    """A saved tokenizer folder (a run's export, say): byte-level BPE (a GPT's) or WordPiece
    (a BERT's), as its ``tokenizer_config.json`` says."""
    config = Path(path) / "tokenizer_config.json"
    kind = json.loads(config.read_text()).get("type") if config.is_file() else None
    return BPETokenizer.load(path) if kind == "bpe" else WordPieceTokenizer.load(path)


def _cached(cache_dir: Path, name: str, key: str, build) -> Any:
    """JSON-cache ``build()`` under ``cache_dir/name-key.json`` (written atomically)."""
    file = cache_dir / f"{name}-{hashlib.sha1(key.encode()).hexdigest()[:16]}.json"
    if file.is_file():
        return json.loads(file.read_text())
    value = build()
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = file.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(value))
    tmp.replace(file)
    return value


def _files_key(files: Sequence[Path]) -> str:
    return "|".join(f"{f}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in files)


class _LabelledTextModule(SplitDataModule):
    """Tokenizer handling, splits and loaders shared by the built-in labelled data modules."""

    drop_last_train = False  # a label budget of a few examples per class: every one trains
    reads_bpe = False  # whether `_encode` also takes a GPT's byte-level BPE tokenizer

    def __init__(self, tokenizer: str | None, vocab_size: int, context_length: int, batch_size: int,
                 num_workers: int, train_per_class: int | None, val_per_class: int, seed: int,
                 cache_dir: str | None, test_per_class: int | None = None) -> None:
        super().__init__(batch_size, num_workers)
        check_int("context_length", context_length, at_least=8)
        check_int("val_per_class", val_per_class)
        check_int("train_per_class", train_per_class, or_none=True, note="(None: all)")
        check_int("test_per_class", test_per_class, at_least=0, or_none=True, note="(None: as many as val_per_class)")
        self.tokenizer_path, self.requested_vocab_size = tokenizer, vocab_size
        self.context_length = context_length
        self.train_per_class, self.val_per_class, self.seed = train_per_class, val_per_class, seed
        self.test_per_class = val_per_class if test_per_class is None else test_per_class
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self._tokenizer: WordPieceTokenizer | BPETokenizer | None = None
        self._splits: dict[str, list[dict[str, Any]]] | None = None

    # -- to implement: labelled examples as dicts with "label" and the text fields
    label_names: tuple[str, ...] = ()

    def _examples(self) -> list[dict[str, Any]]:
        raise NotImplementedError

    def _encode(self, example: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def _source_files(self) -> list[Path]:
        raise NotImplementedError

    def _complete(self, split: Split, examples: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``split``'s examples as trained on, made from that split's drawn ``examples`` only
        (default: as they are)."""
        return examples

    def _stratum(self, label: int) -> str:
        """How errors name the examples of one ``label`` (a class, by default)."""
        return f"class {self.label_names[label]!r}"

    @property
    def num_labels(self) -> int:
        return len(self.label_names)

    @property
    def tokenizer(self) -> WordPieceTokenizer | BPETokenizer:
        if self._tokenizer is None:
            if self.tokenizer_path is not None:
                self._tokenizer = load_text_tokenizer(self.tokenizer_path)
                if isinstance(self._tokenizer, BPETokenizer) and not self.reads_bpe:
                    raise ValueError(f"{type(self).__name__} needs a WordPiece (BERT-family) tokenizer; "
                                     f"{self.tokenizer_path} holds a byte-level BPE one")
            else:  # a vocabulary of the same source files, cached like the pretraining corpus
                self._tokenizer, _ = prepare_wordpiece_corpus(self._source_files(), self.cache_dir,
                                                              vocab_size=self.requested_vocab_size)
        return self._tokenizer

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    @property
    def pad_token_id(self) -> int:
        return self.tokenizer.pad_id

    def prepare_data(self) -> None:
        self.splits()

    def splits(self) -> dict[str, list[dict[str, Any]]]:
        """{"train", "val", "test"}: per class, a seeded shuffle; the first ``val_per_class``
        examples validate, the next ``train_per_class`` (default: all the rest but the test
        ones) train — a label budget — and the last ``test_per_class`` test, from those that
        neither validation nor the budget took (fewer when a class runs short). The training
        examples are the same with or without a test split, unless ``train_per_class`` is None;
        the test examples are the same whatever the budget, while the class has room. No test
        example at all (``test_per_class=0``): no "test" split (the test loader serves "val").
        Each split is then completed from its own examples only (`_complete`)."""
        if self._splits is None:
            examples = self._examples()
            by_class: dict[int, list[dict[str, Any]]] = {}
            for ex in examples:
                by_class.setdefault(ex["label"], []).append(ex)
            rng = np.random.default_rng(self.seed)
            train, val, test = [], [], []
            n_val, n_test = self.val_per_class, self.test_per_class
            for label in sorted(by_class):
                group = by_class[label]
                order = rng.permutation(len(group))
                if self.train_per_class is None and len(group) <= n_val + n_test:
                    raise ValueError(f"{self._stratum(label)}: {len(group)} examples, not more than "
                                     f"val_per_class={n_val} + test_per_class={n_test}")
                if len(group) <= n_val:
                    raise ValueError(f"{self._stratum(label)}: {len(group)} examples, not more than "
                                     f"val_per_class={n_val}")
                val += [group[i] for i in order[:n_val]]
                rest = order[n_val:]
                if self.train_per_class is None:
                    kept, left = rest[: len(rest) - n_test], rest[len(rest) - n_test:]
                else:
                    kept, left = rest[: self.train_per_class], rest[self.train_per_class:]
                train += [group[i] for i in kept]
                test += [group[i] for i in left[len(left) - min(n_test, len(left)):]]
            drawn = {"train": train, "val": val, "test": test}
            self._splits = {name: self._complete(name, rows) for name, rows in drawn.items()  # type: ignore[arg-type]
                            if rows or name != "test"}
        return self._splits

    def data_key(self) -> str:
        """A hash of the training examples as drawn (texts or words, and their labels): they are
        read off the standard library of the Python that runs, which another version changes."""
        train = self.splits()["train"]
        return self._content_key_of(train)

    def collate(self, items: Sequence[dict[str, Any]]) -> dict[str, Tensor]:
        encoded = [self._encode(item) for item in items]
        batch = pad_pairs([(e["input_ids"], e["segment_ids"]) for e in encoded], self.tokenizer.pad_id)
        out = {"input_ids": batch.ids, "attention_mask": batch.attention_mask, "segment_ids": batch.segments}
        if isinstance(encoded[0]["labels"], list):  # token labels: pad with -100
            width = batch.ids.shape[1]
            out["labels"] = torch.tensor([e["labels"] + [-100] * (width - len(e["labels"])) for e in encoded])
        else:
            out["labels"] = torch.tensor([e["labels"] for e in encoded])
        for key in ("start_positions", "end_positions"):
            if key in encoded[0]:
                out[key] = torch.tensor([e[key] for e in encoded])
        return out  # type: ignore[return-value]

    def dataset(self, split: Split) -> list[dict[str, Any]] | None:
        return self.splits().get(split)

    def collate_fn(self, split: Split) -> Any:
        return self.collate

    def predict_collate(self, items: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """A held-out batch that also carries its raw ``examples`` (texts, words) for the records."""
        return {**self.collate(items), "examples": list(items)}

    def predict_dataloader(self) -> DataLoader:
        """The test examples (the validation ones when there are none), in order, each batch
        with its ``examples``."""
        splits = self.splits()
        return DataLoader(splits.get("test") or splits["val"], batch_size=self.batch_size,
                          num_workers=self.num_workers, collate_fn=self.predict_collate)


class DocstringDataModule(_LabelledTextModule):
    """Docstrings of standard-library packages, labelled by their source.

    Args:
        task: "package" — which of ``packages`` a docstring comes from (one text, K classes);
            "match" — ``[CLS] def-line [SEP] docstring [SEP]``: does the docstring document
            that definition (1) or another one of the same package (0)?
        packages: top-level standard-library packages used as classes / sources.
        tokenizer: a saved tokenizer (use the pretrained checkpoint's): WordPiece gives
            ``[CLS] text [SEP]`` (BERT), byte-level BPE ``text <eos>`` (``text <eos> pair <eos>``;
            GPT-1's input, the classifier reads the last token); None trains a WordPiece
            vocabulary of ``vocab_size`` on the packages' source.
        context_length: tokens per example, special tokens included (longer ones are cut).
        train_per_class: labelled training examples per class (the label budget); None = all
            but the validation and test ones.
        val_per_class: validation examples per class (checkpoint selection).
        test_per_class: test examples per class (``unitok test``), shared with neither
            training nor validation (`_LabelledTextModule.splits`); None: as many as
            ``val_per_class``; 0: no test split.

    Each docstring text is used once (`distinct_docstrings`: repeats dropped, whitespace, case
    and punctuation aside), so no text is in two splits. For "match" the splits are drawn from
    the docstrings, every other one a negative, and a negative's docstring is drawn afterwards
    from its own split's (`_complete`): a docstring is one definition's positive and another's
    negative within one split only.
    """

    reads_bpe = True

    def __init__(
        self,
        task: Literal["package", "match"] = "package",
        packages: list[str] | tuple[str, ...] = DEFAULT_PACKAGES,
        tokenizer: str | None = None,
        vocab_size: int = 4096,
        context_length: int = 128,
        batch_size: int = 32,
        num_workers: int = 0,
        train_per_class: int | None = None,
        val_per_class: int = 50,
        seed: int = 0,
        cache_dir: str | None = None,
        test_per_class: int | None = None,
    ) -> None:
        super().__init__(tokenizer, vocab_size, context_length, batch_size, num_workers, train_per_class,
                         val_per_class, seed, cache_dir, test_per_class)
        if task not in ("package", "match"):
            raise ValueError(f"task must be 'package' or 'match', got {task!r}")
        if len(set(packages)) < (2 if task == "package" else 1):
            raise ValueError(f"task='package' needs at least two distinct packages, got {list(packages)}")
        self.task, self.packages = task, tuple(packages)
        self.label_names = self.packages if task == "package" else ("other", "match")

    def _source_files(self) -> list[Path]:
        return stdlib_package_files(self.packages)

    def docstrings(self) -> list[Docstring]:
        """The packages' docstrings, each text once (`distinct_docstrings`)."""
        files = self._source_files()
        rows = _cached(self.cache_dir, "docstrings", _files_key(files),
                       lambda: [asdict(d) for d in extract_docstrings(files)])
        return distinct_docstrings([Docstring(**row) for row in rows])

    def _examples(self) -> list[dict[str, Any]]:
        """"package": the docstrings, labelled. "match": one per docstring, every other one a
        negative, still without its ``pair`` (`_complete` draws it within the split)."""
        docs = self.docstrings()
        if self.task == "package":
            return [{"text": d.text, "label": self.packages.index(d.package)} for d in docs]
        return [{"text": d.signature, "docstring": d.text, "package": d.package, "name": d.name, "label": 1 - i % 2}
                for i, d in enumerate(docs)]

    def _complete(self, split: Split, examples: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """"match": a positive reads its own docstring, a negative another definition's of the
        same package drawn from this split's docstrings (seeded per split; dropped when the
        split has none), so no docstring is read in two splits."""
        if self.task != "match":
            return examples
        rng = np.random.default_rng([self.seed, 7, SPLITS.index(split)])
        by_package: dict[str, list[dict[str, Any]]] = {}
        for ex in examples:
            by_package.setdefault(ex["package"], []).append(ex)
        completed = []
        for ex in examples:
            if ex["label"] == 1:
                pair = ex["docstring"]
            else:
                others = [o["docstring"] for o in by_package[ex["package"]] if o["name"] != ex["name"]]
                if not others:
                    continue
                pair = others[int(rng.integers(len(others)))]
            completed.append({"text": ex["text"], "pair": pair, "label": ex["label"]})
        return completed

    def _encode(self, example: dict[str, Any]) -> dict[str, Any]:
        tok = self.tokenizer
        if isinstance(tok, BPETokenizer):  # GPT-1: text <eos> (pair <eos>)
            ids, segments = tok.encode_for_classifier(example["text"], example.get("pair"), self.context_length)
            return {"input_ids": ids.tolist(), "segment_ids": segments.tolist(), "labels": example["label"]}
        enc = tok.encode(example["text"], example.get("pair"), max_length=self.context_length,
                         truncation="longest_first")
        return {"input_ids": enc.ids.tolist(), "segment_ids": enc.segments.tolist(), "labels": example["label"]}


def classify_token(tok: tokenize.TokenInfo) -> int | None:
    """Python's lexical category of a token, as an index into `TOKEN_CLASSES` (None: skip)."""
    if tok.type == tokenize.NAME:
        if keyword.iskeyword(tok.string) or keyword.issoftkeyword(tok.string):
            return TOKEN_CLASSES.index("keyword")
        return TOKEN_CLASSES.index("builtin" if hasattr(builtins, tok.string) else "name")
    table = {tokenize.OP: "operator", tokenize.NUMBER: "number", tokenize.STRING: "string",
             tokenize.COMMENT: "comment"}
    name = table.get(tok.type)
    return TOKEN_CLASSES.index(name) if name else None


def tagged_lines(files: Sequence[Path], min_tokens: int = 3, max_lines: int | None = None) -> list[dict[str, Any]]:
    """Source lines as (words, word labels) from Python's tokenizer; multi-line tokens skipped."""
    rows: list[dict[str, Any]] = []
    for path in files:
        source = path.read_text(encoding="utf-8", errors="replace")
        per_line: dict[int, list[tuple[str, int]]] = {}
        try:
            for tok in tokenize.generate_tokens(io.StringIO(source).readline):
                label = classify_token(tok)
                if label is not None and tok.start[0] == tok.end[0] and tok.string.strip():
                    per_line.setdefault(tok.start[0], []).append((tok.string, label))
        except (tokenize.TokenError, SyntaxError):
            continue
        for _, pairs in sorted(per_line.items()):
            if len(pairs) >= min_tokens:
                rows.append({"words": [w for w, _ in pairs], "word_labels": [y for _, y in pairs]})
        if max_lines is not None and len(rows) >= max_lines:
            return rows[:max_lines]
    return rows


class CodeTokensDataModule(_LabelledTextModule):
    """Token classification: every token of a source line gets Python's lexical category
    (keyword, builtin, name, operator, number, string, comment). Words are split into
    WordPiece sub-tokens; each word's label sits on its first sub-token, the rest are -100.

    ``train_per_class`` / ``val_per_class`` / ``test_per_class`` count lines here (one "class"
    holds them all; the splits as in `DocstringDataModule`); ``packages`` choose the source files,
    of which the first ``max_lines`` tagged lines are read. A line repeated in the source
    (``def __repr__(self):``) is one example, so no line is in two splits.
    """

    def __init__(
        self,
        packages: list[str] | tuple[str, ...] = DEFAULT_PACKAGES,
        tokenizer: str | None = None,
        vocab_size: int = 4096,
        context_length: int = 64,
        batch_size: int = 32,
        num_workers: int = 0,
        train_per_class: int | None = 2000,
        val_per_class: int = 200,
        max_lines: int = 20_000,
        seed: int = 0,
        cache_dir: str | None = None,
        test_per_class: int | None = None,
    ) -> None:
        super().__init__(tokenizer, vocab_size, context_length, batch_size, num_workers, train_per_class,
                         val_per_class, seed, cache_dir, test_per_class)
        self.packages, self.max_lines = tuple(packages), check_int("max_lines", max_lines)
        self.label_names = TOKEN_CLASSES

    def _source_files(self) -> list[Path]:
        return stdlib_package_files(self.packages)

    def _examples(self) -> list[dict[str, Any]]:
        files = self._source_files()
        rows = _cached(self.cache_dir, "tagged-lines", _files_key(files) + f"|{self.max_lines}",
                       lambda: tagged_lines(files, max_lines=self.max_lines))
        seen: set[tuple[str, ...]] = set()
        examples = []
        for row in rows:  # each distinct line once: its words are what the model reads
            if tuple(row["words"]) not in seen:
                seen.add(tuple(row["words"]))
                examples.append({**row, "label": 0})  # one stratum: lines are split, not classes
        return examples

    def _stratum(self, label: int) -> str:
        return f"the distinct source lines of the first max_lines={self.max_lines}"

    @property
    def num_labels(self) -> int:
        return len(TOKEN_CLASSES)

    def _encode(self, example: dict[str, Any]) -> dict[str, Any]:
        enc = self.tokenizer.encode(example["words"], max_length=self.context_length, truncation=True)
        return {"input_ids": enc.ids.tolist(), "segment_ids": enc.segments.tolist(),
                "labels": align_word_labels(enc.word_ids, example["word_labels"])}


class DocstringQADataModule(_LabelledTextModule):
    """Extractive QA: ``[CLS] docstring [SEP] def a(...): def b(...): … [SEP]`` — the answer
    is the span of the documented function's name among ``n_candidates`` definitions of the
    same module. Labels are token positions (``start_positions``, ``end_positions``);
    ``labels`` holds the index of the right candidate. ``train_per_class`` /
    ``val_per_class`` / ``test_per_class`` count questions (one "class"; the splits as in
    `DocstringDataModule`). Each docstring asks one question (`distinct_docstrings`), so no
    question is in two splits."""

    def __init__(
        self,
        packages: list[str] | tuple[str, ...] = DEFAULT_PACKAGES,
        tokenizer: str | None = None,
        vocab_size: int = 4096,
        context_length: int = 128,
        n_candidates: int = 4,
        batch_size: int = 32,
        num_workers: int = 0,
        train_per_class: int | None = None,
        val_per_class: int = 200,
        seed: int = 0,
        cache_dir: str | None = None,
        test_per_class: int | None = None,
    ) -> None:
        super().__init__(tokenizer, vocab_size, context_length, batch_size, num_workers, train_per_class,
                         val_per_class, seed, cache_dir, test_per_class)
        if n_candidates < 2:
            raise ValueError(f"n_candidates must be ≥ 2, got {n_candidates}")
        self.packages, self.n_candidates = tuple(packages), n_candidates
        self.label_names = ("span",)

    def _source_files(self) -> list[Path]:
        return stdlib_package_files(self.packages)

    def _examples(self) -> list[dict[str, Any]]:
        files = self._source_files()
        rows = _cached(self.cache_dir, "docstrings", _files_key(files),
                       lambda: [asdict(d) for d in extract_docstrings(files)])
        docs = [Docstring(**row) for row in rows if row["signature"].startswith(("def ", "async def ", "class "))]
        by_module: dict[str, list[Docstring]] = {}
        for d in docs:
            by_module.setdefault(d.module, []).append(d)
        rng = np.random.default_rng(self.seed + 11)
        examples = []
        for d in distinct_docstrings(docs):  # questions: each text once; candidates: any definition
            others = [o for o in by_module[d.module] if o.name != d.name]
            if len(others) < self.n_candidates - 1:
                continue
            picks = [others[i] for i in rng.choice(len(others), self.n_candidates - 1, replace=False)]
            candidates = [*picks, d]
            order = rng.permutation(len(candidates))
            signatures = [candidates[i].signature for i in order]
            answer = int(np.where(order == len(candidates) - 1)[0][0])
            examples.append({"question": d.text, "signatures": signatures, "answer": answer, "name": d.name,
                             "label": 0})
        return examples

    def _stratum(self, label: int) -> str:
        return "the questions (distinct docstrings)"

    def _encode(self, example: dict[str, Any]) -> dict[str, Any]:
        # The context is given as words: each signature's, "(" split off so a name is a word.
        context_words: list[str] = []
        answer_word = -1
        for i, signature in enumerate(example["signatures"]):
            words = signature.replace("(", " ( ").replace(":", " : ").split()
            if i == example["answer"] and example["name"] in words:
                answer_word = len(context_words) + words.index(example["name"])
            context_words += words
        enc = self.tokenizer.encode(example["question"], context_words, max_length=self.context_length,
                                    truncation="longest_first")
        pieces = [j for j, (w, s) in enumerate(zip(enc.word_ids, enc.sequence_ids)) if s == 1 and w == answer_word]
        start, end = (pieces[0], pieces[-1]) if pieces else (0, 0)  # answer cut off: point at [CLS]
        return {"input_ids": enc.ids.tolist(), "segment_ids": enc.segments.tolist(), "labels": example["answer"],
                "start_positions": start, "end_positions": end}
