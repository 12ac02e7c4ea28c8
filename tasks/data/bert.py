"""Pretraining data for BERT and ELECTRA: sentence pairs for next-sentence prediction and the
masking collator (15 % of tokens; of those 80 % [MASK], 10 % random, 10 % unchanged).

Text comes from users' files or the built-in corpus (the Python standard library's source):
a document is a file, a "sentence" a non-blank line. A WordPiece vocabulary is trained (or
loaded) and every line tokenized once, cached under ``cache_dir``.

Axis legend: B batch, N tokens, V vocabulary.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from tasks.data.base import Split, SplitDataModule, default_cache_dir
from tasks.data.text import (
    check_train_samples,
    read_texts,
    split_test_files,
    text_file_paths,
    tokenizer_key,
    without_labelled_docstrings,
)
from tasks.predictions import prompt_loader
from tokenizers_mm import WordPieceTokenizer, encode_pair_ids, pad_pairs
from tokenizers_mm.checks import check_int
from tokenizers_mm.pairs import pair_lengths
from tokenizers_mm.wordpiece import VOCAB_FILE

IGNORE = -100


# --------------------------------------------------------------------------- masking
def check_masking_rates(mlm_probability: float, mask_ratio: float, random_ratio: float) -> None:
    """Refuse rates that are not probabilities (the three rates of BERT's masking)."""
    if not 0.0 < mlm_probability < 1.0:
        raise ValueError(f"mlm_probability must be in (0, 1), got {mlm_probability}")
    for name, value in (("mask_ratio", mask_ratio), ("random_ratio", random_ratio)):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {value}")
    if mask_ratio + random_ratio > 1.0 + 1e-9:
        raise ValueError(f"mask_ratio + random_ratio = {mask_ratio + random_ratio} exceeds 1 "
                         "(the rest of the selected tokens stay unchanged)")


def mask_tokens(
    ids: Tensor,
    attention_mask: Tensor | None,
    special_ids: Sequence[int],
    mask_id: int,
    vocab_size: int,
    mlm_probability: float = 0.15,
    mask_ratio: float = 0.8,
    random_ratio: float = 0.1,
    continuation: Tensor | None = None,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """BERT's masked-LM corruption: (B, N) ids -> (masked ids, labels).

    Each real, non-special token is selected with probability ``mlm_probability``; a
    selected token becomes [MASK] with probability ``mask_ratio``, a random non-special
    token with ``random_ratio``, and stays as it is otherwise. ``labels`` hold the original
    id at selected positions and -100 elsewhere. With ``continuation`` ((V,) bool, True for
    "##" pieces) whole words are selected together (whole-word masking); the 80/10/10
    choice is still made per token, as in BERT's whole-word-masking release.
    """
    check_masking_rates(mlm_probability, mask_ratio, random_ratio)
    special = torch.zeros(vocab_size, dtype=torch.bool)
    special[torch.as_tensor(list(special_ids), dtype=torch.long)] = True
    eligible = ~special[ids]
    if attention_mask is not None:
        eligible &= attention_mask.bool()
    draw = torch.rand(ids.shape, generator=generator)
    if continuation is not None:
        if continuation.shape != (vocab_size,):
            raise ValueError(f"continuation must be a ({vocab_size},) bool table, got {tuple(continuation.shape)}")
        # Every piece takes the draw of its word's first piece, so words are chosen whole.
        starts = ~(continuation[ids] & eligible)
        position = torch.arange(ids.shape[1]).expand_as(ids)
        first_piece = torch.where(starts, position, torch.zeros_like(position)).cummax(dim=1).values
        draw = draw.gather(1, first_piece)
    selected = eligible & (draw < mlm_probability)
    choice = torch.rand(ids.shape, generator=generator)
    to_mask = selected & (choice < mask_ratio)
    to_random = selected & (choice >= mask_ratio) & (choice < mask_ratio + random_ratio)
    labels = torch.where(selected, ids, torch.full_like(ids, IGNORE))
    masked = ids.masked_fill(to_mask, mask_id)
    n_random = int(to_random.sum())
    if n_random:
        allowed = (~special).nonzero().squeeze(1)  # random replacements are ordinary tokens
        pick = torch.randint(len(allowed), (n_random,), generator=generator)
        masked[to_random] = allowed[pick]
    return masked, labels


class MaskingCollator:
    """Pads ``{"input_ids", "segment_ids"[, "nsp_label"]}`` items and masks them for MLM.

    Returns ``input_ids`` (masked), ``attention_mask``, ``segment_ids``, ``labels`` (-100 where
    not selected) and ``nsp_labels`` when the items carry them. Padding and the special
    tokens ([CLS], [SEP], [PAD], [MASK], [UNK]) are never selected. With ``seed`` the masks
    depend only on the batch's content (validation); without, on torch's global random state.
    Picklable (data-loader workers).
    """

    def __init__(self, vocab_size: int, mask_id: int, pad_id: int, special_ids: Sequence[int],
                 mlm_probability: float = 0.15, mask_ratio: float = 0.8, random_ratio: float = 0.1,
                 continuation: Tensor | None = None, seed: int | None = None) -> None:
        check_masking_rates(mlm_probability, mask_ratio, random_ratio)
        self.vocab_size, self.mask_id, self.pad_id = vocab_size, mask_id, pad_id
        self.special_ids = sorted(set(special_ids) | {mask_id, pad_id})
        self.mlm_probability, self.mask_ratio, self.random_ratio = mlm_probability, mask_ratio, random_ratio
        self.continuation = continuation
        self.seed = seed

    def __call__(self, items: Sequence[dict[str, Any]]) -> dict[str, Tensor]:
        batch = pad_pairs([(item["input_ids"], item["segment_ids"]) for item in items], self.pad_id)
        generator = None
        if self.seed is not None:  # fixed masks: the same batch is masked the same way every time
            content = int((batch.ids * torch.arange(1, batch.ids.shape[1] + 1)).sum())
            generator = torch.Generator().manual_seed((self.seed * 1_000_003 + content) % (2**63))
        masked, labels = mask_tokens(
            batch.ids, batch.attention_mask, self.special_ids, self.mask_id, self.vocab_size,  # type: ignore[arg-type]
            self.mlm_probability, self.mask_ratio, self.random_ratio, self.continuation, generator)
        out = {"input_ids": masked, "attention_mask": batch.attention_mask, "segment_ids": batch.segments,
               "labels": labels}
        if "nsp_label" in items[0]:
            out["nsp_labels"] = torch.tensor([item["nsp_label"] for item in items], dtype=torch.long)
        return out  # type: ignore[return-value]


# --------------------------------------------------------------------------- corpus
def text_lines(text: str) -> list[str]:
    """A document's sentences: its non-blank lines, stripped."""
    return [s for s in (line.strip() for line in text.splitlines()) if s]


class LineCorpus:
    """Tokenized lines grouped into documents: flat ``tokens``, ``line_starts`` (n_lines + 1)
    offsets into them and ``doc_starts`` (n_docs + 1) offsets into the lines."""

    def __init__(self, tokens: np.ndarray, line_starts: np.ndarray, doc_starts: np.ndarray) -> None:
        self.tokens, self.line_starts, self.doc_starts = tokens, line_starts, doc_starts

    @property
    def n_docs(self) -> int:
        return len(self.doc_starts) - 1

    def line_length(self, line: int) -> int:
        return int(self.line_starts[line + 1] - self.line_starts[line])

    def span(self, first_line: int, stop_line: int) -> np.ndarray:
        """Tokens of consecutive lines [first_line, stop_line)."""
        return self.tokens[self.line_starts[first_line]:self.line_starts[stop_line]]

    def doc_of(self, line: int) -> int:
        return int(np.searchsorted(self.doc_starts, line, side="right") - 1)

    def save(self, folder: Path) -> None:
        for name in ("tokens", "line_starts", "doc_starts"):
            tmp = folder / f"{name}.{os.getpid()}.tmp.npy"
            np.save(tmp, getattr(self, name))
            tmp.replace(folder / f"{name}.npy")

    @classmethod
    def load(cls, folder: Path) -> LineCorpus:
        return cls(*(np.load(folder / f"{name}.npy", mmap_mode="r") for name in ("tokens", "line_starts", "doc_starts")))

    @classmethod
    def build(cls, texts: Sequence[str], tokenizer: WordPieceTokenizer) -> LineCorpus:
        lengths, pieces, doc_starts = [], [], [0]
        for text in texts:
            lines = text_lines(text)
            encoded = [ids for ids in tokenizer.encode_batch_ids(lines) if ids]
            pieces.extend(encoded)
            lengths.extend(len(ids) for ids in encoded)
            if encoded:
                doc_starts.append(doc_starts[-1] + len(encoded))
        if not lengths:
            raise ValueError("the corpus holds no text")
        tokens = np.fromiter((i for ids in pieces for i in ids), dtype=np.int32, count=sum(lengths))
        line_starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        return cls(tokens, line_starts, np.asarray(doc_starts, dtype=np.int64))


def corpus_cache_key(files: Sequence[Path], *parts: object) -> str:
    """A cache folder's name: ``files`` (path, size, modification time) and ``parts``."""
    h = hashlib.sha1()
    for f in files:
        stat = f.stat()
        h.update(f"{f.resolve()}|{stat.st_size}|{stat.st_mtime_ns}\n".encode())
    h.update("|".join(map(str, parts)).encode())
    return h.hexdigest()[:16]


def wordpiece_key(path: str | Path | None) -> str | None:
    """A saved BERT-family tokenizer's contents as a hash: every file `WordPieceTokenizer.load`
    may read from ``path`` (``tokenizer.json``, else ``vocab.txt``; ``tokenizer_config.json``),
    so a tokenizer replaced in the same folder gets its own cache; None: none."""
    if path is None:
        return None
    path = Path(path)
    if not path.is_dir():
        return tokenizer_key(path)
    return f"{tokenizer_key(path)}+{tokenizer_key(path / VOCAB_FILE)}"


def prepare_wordpiece_corpus(files: Sequence[Path], cache_dir: Path, tokenizer: str | None = None,
                             vocab_size: int = 4096, lowercase: bool = False) -> tuple[WordPieceTokenizer, LineCorpus]:
    """Train (or load) a WordPiece tokenizer and tokenize every line of ``files``, cached (by the
    tokenizer's contents, not its path)."""
    folder = cache_dir / f"wordpiece-{corpus_cache_key(files, vocab_size, lowercase, wordpiece_key(tokenizer))}"
    if (folder / "meta.json").is_file():
        return WordPieceTokenizer.load(folder), LineCorpus.load(folder)
    folder.mkdir(parents=True, exist_ok=True)
    texts = read_texts(files)
    if tokenizer is not None:
        tok = WordPieceTokenizer.load(tokenizer)
    else:
        tok = WordPieceTokenizer.train(iterator=(line for text in texts for line in text_lines(text)),
                                       vocab_size=vocab_size, lowercase=lowercase)
    corpus = LineCorpus.build(texts, tok)
    corpus.save(folder)
    tok.save(folder)
    meta_tmp = folder / f"meta.json.{os.getpid()}.tmp"  # written last: its presence means complete
    meta_tmp.write_text(json.dumps({"files": len(files), "lines": len(corpus.line_starts) - 1,
                                    "tokens": int(corpus.line_starts[-1])}))
    meta_tmp.replace(folder / "meta.json")
    return tok, corpus


# --------------------------------------------------------------------------- sentence pairs
class SentencePairs(Dataset):
    """BERT pretraining examples from a range of documents.

    With ``nsp``: ``[CLS] A [SEP] B [SEP]`` where A is a run of consecutive lines; with
    probability ``random_next`` B is text from another document (``nsp_label`` 1, "not
    next"), otherwise the lines that really follow A (``nsp_label`` 0, "is next"), as in
    BERT. Without ``nsp``: one run of lines
    filling ``context_length`` (RoBERTa / ELECTRA style). Example ``i`` is the same every
    time it is drawn (seeded by ``(seed, i)``), so a run is reproducible.
    """

    def __init__(self, corpus: LineCorpus, first_doc: int, stop_doc: int, context_length: int, cls_id: int,
                 sep_id: int, num_samples: int, nsp: bool = True, random_next: float = 0.5, seed: int = 0) -> None:
        if stop_doc - first_doc < (2 if nsp else 1):
            raise ValueError(f"need at least {2 if nsp else 1} documents for this split, got {stop_doc - first_doc}")
        if context_length < 8:
            raise ValueError(f"context_length={context_length} is too short for sentence pairs (need ≥ 8)")
        if not 0.0 <= random_next <= 1.0:
            raise ValueError(f"random_next must be in [0, 1], got {random_next}")
        self.corpus, self.first_doc, self.stop_doc = corpus, first_doc, stop_doc
        self.first_line = int(corpus.doc_starts[first_doc])
        self.stop_line = int(corpus.doc_starts[stop_doc])
        self.context_length, self.cls_id, self.sep_id = context_length, cls_id, sep_id
        self.num_samples, self.nsp, self.random_next, self.seed = num_samples, nsp, random_next, seed

    def __len__(self) -> int:
        return self.num_samples

    def _run(self, start: int, budget: int) -> list[int]:
        """Line indices from ``start`` to the end of its document, until ``budget`` tokens."""
        doc_end = int(self.corpus.doc_starts[self.corpus.doc_of(start) + 1])
        lines, total = [], 0
        for line in range(start, doc_end):
            lines.append(line)
            total += self.corpus.line_length(line)
            if total >= budget:
                break
        return lines

    def _tokens(self, lines: list[int]) -> list[int]:
        return self.corpus.span(lines[0], lines[-1] + 1).tolist() if lines else []

    def __getitem__(self, index: int) -> dict[str, Any]:
        rng = np.random.default_rng((self.seed, index))
        if not self.nsp:
            budget = self.context_length - 2
            lines = self._run(int(rng.integers(self.first_line, self.stop_line)), budget)
            ids, segments = encode_pair_ids(self._tokens(lines), None, self.cls_id, self.sep_id,
                                            self.context_length, "longest_first")
            return {"input_ids": ids, "segment_ids": segments}
        budget = self.context_length - 3
        is_random = bool(rng.random() < self.random_next)
        for _ in range(100):  # a real "next" needs a run of at least two lines
            lines = self._run(int(rng.integers(self.first_line, self.stop_line)), budget)
            if is_random or len(lines) >= 2:
                break
        else:
            raise ValueError("the corpus has no document with two consecutive lines; NSP needs them")
        if is_random:
            cut = int(rng.integers(1, len(lines) + 1))
            first = lines[:cut]
            own_doc = self.corpus.doc_of(first[0])
            # BERT's ten tries, kept so that a pair they find another document for draws as it
            # always did; when all ten land on A's own document (likely only in a split of two or
            # three documents) B is drawn among the others: a "not next" B is never A's text.
            for _ in range(10):
                doc = int(rng.integers(self.first_doc, self.stop_doc))
                if doc != own_doc:
                    break
            else:
                doc = int(rng.integers(self.first_doc, self.stop_doc - 1))
                doc += doc >= own_doc
            lo, hi = int(self.corpus.doc_starts[doc]), int(self.corpus.doc_starts[doc + 1])
            a_len = len(self._tokens(first))
            second = self._run(int(rng.integers(lo, hi)), max(1, budget - a_len))
        else:
            cut = int(rng.integers(1, len(lines)))
            first, second = lines[:cut], lines[cut:]
        a, b = self._tokens(first), self._tokens(second)
        keep_a, keep_b = pair_lengths(len(a), len(b), budget, "longest_first")
        # A loses its start and B its end, so a real pair stays contiguous across the [SEP].
        ids, segments = encode_pair_ids(a[len(a) - keep_a:], b[:keep_b], self.cls_id, self.sep_id)
        return {"input_ids": ids, "segment_ids": segments, "nsp_label": int(is_random)}


# --------------------------------------------------------------------------- data module
class BERTDataModule(SplitDataModule):
    """Masked-LM (+ NSP) batches from text files, or the built-in corpus when none are given.

    Args:
        files: users' text files; None means the Python standard library's source.
        builtin_max_bytes: how much of the standard library to read.
        builtin_first / held_out_docstrings: packages the built-in corpus reads first, and
            packages whose labelled docstrings are cut out of the text (as in `TextDataModule`).
        tokenizer: a saved BERT-family tokenizer (folder, ``tokenizer.json`` or ``vocab.txt``);
            None trains a WordPiece vocabulary of ``vocab_size`` (``lowercase`` or cased).
        context_length: tokens per example, special tokens included.
        nsp: sentence pairs with next-sentence labels; False gives single segments (ELECTRA).
        random_next: share of pairs whose B is a random other document's text.
        mlm_probability / mask_ratio / random_ratio: masking rates (15 %, 80 %, 10 %).
        whole_word_masking: select whole words (all their "##" pieces) together.
        batch_size / num_workers / train_samples / val_samples: loading and epoch sizes
            (``train_samples`` ≥ ``batch_size``: the last partial training batch is dropped).
        val_fraction: the last documents held out for validation.
        test_fraction / test_files: the test documents, whole files outside the training and
            validation ones (see `tasks.data.text.split_test_files`; 0: no test split, test =
            validation), tokenized with the same vocabulary.
        predict_texts: texts with [MASK] tokens that ``unitok predict`` fills in.
        predict_file: a text file whose non-empty lines are the texts instead (ids ``file:line``).
    """

    def __init__(
        self,
        files: list[str] | None = None,
        builtin_max_bytes: int = 2_000_000,
        builtin_first: list[str] | None = None,
        held_out_docstrings: list[str] | None = None,
        tokenizer: str | None = None,
        vocab_size: int = 4096,
        lowercase: bool = False,
        context_length: int = 128,
        nsp: bool = True,
        random_next: float = 0.5,
        mlm_probability: float = 0.15,
        mask_ratio: float = 0.8,
        random_ratio: float = 0.1,
        whole_word_masking: bool = False,
        batch_size: int = 32,
        num_workers: int = 0,
        train_samples: int = 20_000,
        val_samples: int = 512,
        val_fraction: float = 0.05,
        test_fraction: float = 0.1,
        test_files: list[str] | None = None,
        cache_dir: str | None = None,
        seed: int = 0,
        predict_texts: list[str] | None = None,
        predict_file: str | None = None,
    ) -> None:
        super().__init__(batch_size, num_workers)
        check_masking_rates(mlm_probability, mask_ratio, random_ratio)
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
        if not 0.0 <= test_fraction < 1.0:
            raise ValueError(f"test_fraction must be in [0, 1), got {test_fraction}")
        check_train_samples(train_samples, batch_size, self.drop_last_train)
        check_int("val_samples", val_samples)
        if files is not None and len(files) == 0:
            raise ValueError("files is an empty list; leave it unset to use the built-in corpus")
        self.files, self.test_files = text_file_paths(files, test_files)
        self.test_fraction = test_fraction
        self.builtin_max_bytes, self.tokenizer_path = builtin_max_bytes, tokenizer
        self.builtin_first, self.held_out_docstrings = tuple(builtin_first or ()), tuple(held_out_docstrings or ())
        self.requested_vocab_size, self.lowercase = vocab_size, lowercase
        self.context_length, self.nsp, self.random_next = context_length, nsp, random_next
        self.mlm_probability, self.mask_ratio, self.random_ratio = mlm_probability, mask_ratio, random_ratio
        self.whole_word_masking = whole_word_masking
        self.train_samples, self.val_samples, self.val_fraction = train_samples, val_samples, val_fraction
        self.cache_dir, self.seed = Path(cache_dir) if cache_dir is not None else default_cache_dir(), seed
        self.predict_texts = predict_texts or ["def [MASK](self, other):", "import [MASK]",
                                               "for key, value in [MASK].items():"]
        self.predict_file = predict_file
        self._tokenizer: WordPieceTokenizer | None = None
        self._corpus: LineCorpus | None = None
        self._test_corpus: LineCorpus | None = None

    def source_files(self) -> list[Path]:
        """The training and validation documents' files (the vocabulary's text too), without
        the ``held_out_docstrings``."""
        files = split_test_files(self.files, self.builtin_max_bytes, self.test_fraction, self.test_files,
                                 self.builtin_first)[0]
        return without_labelled_docstrings(files, self.held_out_docstrings, self.cache_dir)

    def test_source_files(self) -> list[Path]:
        """The test documents' files, disjoint from `source_files` (empty: no test split)."""
        return split_test_files(self.files, self.builtin_max_bytes, self.test_fraction, self.test_files,
                                self.builtin_first)[1]

    def _prepare(self) -> None:
        self._tokenizer, self._corpus = prepare_wordpiece_corpus(
            self.source_files(), self.cache_dir, self.tokenizer_path, self.requested_vocab_size, self.lowercase)

    def prepare_data(self) -> None:
        self._prepare()

    @property
    def tokenizer(self) -> WordPieceTokenizer:
        if self._tokenizer is None:
            self._prepare()
        return self._tokenizer  # type: ignore[return-value]

    @property
    def corpus(self) -> LineCorpus:
        if self._corpus is None:
            self._prepare()
        return self._corpus  # type: ignore[return-value]

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    @property
    def pad_token_id(self) -> int:
        return self.tokenizer.pad_id

    def collator(self, seed: int | None = None) -> MaskingCollator:
        tok = self.tokenizer
        return MaskingCollator(tok.vocab_size, tok.mask_id, tok.pad_id, tok.special_ids, self.mlm_probability,
                               self.mask_ratio, self.random_ratio,
                               tok.continuation_mask() if self.whole_word_masking else None, seed)

    def _split_docs(self) -> tuple[int, int]:
        n = self.corpus.n_docs
        n_val = max(2 if self.nsp else 1, int(round(n * self.val_fraction)))
        if n - n_val < (2 if self.nsp else 1):
            raise ValueError(f"the corpus has {n} documents: too few to hold {n_val} out for validation")
        return n - n_val, n

    def data_key(self) -> str:
        """A hash of the training documents as tokenized: their token ids and where their lines
        and documents start (what `SentencePairs` draws from; the memory-mapped arrays are read
        once, not at every checkpoint)."""
        corpus = self.corpus

        def training_part() -> tuple[np.ndarray, ...]:
            cut, _ = self._split_docs()
            lines = int(corpus.doc_starts[cut])
            return corpus.doc_starts[:cut + 1], corpus.line_starts[:lines + 1], corpus.span(0, lines)

        return self._content_key_of(corpus, training_part)

    def _dataset(self, train: bool) -> SentencePairs:
        cut, end = self._split_docs()
        first, stop = (0, cut) if train else (cut, end)
        tok = self.tokenizer
        return SentencePairs(self.corpus, first, stop, self.context_length, tok.cls_id, tok.sep_id,
                             self.train_samples if train else self.val_samples, self.nsp, self.random_next,
                             seed=self.seed if train else self.seed + 1)

    def train_dataset(self) -> SentencePairs:
        return self._dataset(train=True)

    def val_dataset(self) -> SentencePairs:
        return self._dataset(train=False)

    def test_dataset(self) -> SentencePairs | None:
        """``val_samples`` examples from the test files' documents, drawn as validation's are."""
        files = self.test_source_files()
        if not files:
            return None
        if self._test_corpus is None:  # a few hundred kB: tokenized in memory, not cached
            self._test_corpus = LineCorpus.build(read_texts(files), self.tokenizer)
        tok = self.tokenizer
        return SentencePairs(self._test_corpus, 0, self._test_corpus.n_docs, self.context_length, tok.cls_id,
                             tok.sep_id, self.val_samples, self.nsp, self.random_next, seed=self.seed + 1)

    def dataset(self, split: Split) -> SentencePairs | None:
        return {"train": self.train_dataset, "val": self.val_dataset, "test": self.test_dataset}[split]()

    def collate_fn(self, split: Split) -> MaskingCollator:
        # Validation masks the same positions every time: scores are comparable across epochs.
        return self.collator() if split == "train" else self.collator(seed=self.seed + 2)

    def predict_dataloader(self) -> DataLoader:
        """The predict texts (or the predict file's lines), as lists of strings."""
        return prompt_loader(self.predict_texts, self.predict_file, self.batch_size)
