"""Text tokenizers: byte-level BPE (GPT-2 style) wrapping the Hugging Face `tokenizers` library."""

from __future__ import annotations

import itertools
import json
import numbers
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from torch import Tensor

from tokenizers_mm.checks import check_int
from tokenizers_mm.pairs import (
    Truncation,
    encode_pair_ids,
    pad_pairs,
    pair_lengths,
    resolve_truncation,
)
from tokenizers_mm.tiktoken_engine import DeferredEncoding, TiktokenEngine
from tokenizers_mm.tokens import Tokens

DEFAULT_SPECIAL_TOKENS = ("<|endoftext|>",)
TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
ROLES = ("eos_token", "pad_token", "bos_token")
# transformers classes whose save_pretrained folder `BPETokenizer.load` reads: GPT-2's byte-level BPE.
GPT2_CLASSES = ("GPT2Tokenizer", "GPT2TokenizerFast")


class TextEncoding:
    """One encoded string: ``ids`` (N,) long tensor; the token strings and character offsets
    are read from the underlying encoding only when asked for (most callers need ids only)."""

    __slots__ = ("ids", "_encoding", "_bos", "_eos", "_end", "_tokens", "_offsets")

    def __init__(self, ids: Tensor, encoding: Any, bos: str | None = None, eos: str | None = None,
                 end: int = 0) -> None:
        self.ids, self._encoding, self._bos, self._eos, self._end = ids, encoding, bos, eos, end
        self._tokens: list[str] | None = None
        self._offsets: list[tuple[int, int]] | None = None

    @property
    def tokens(self) -> list[str]:
        """The token strings (byte-level symbols), special tokens included."""
        if self._tokens is None:
            self._tokens = ([self._bos] if self._bos else []) + list(self._encoding.tokens) + (
                [self._eos] if self._eos else [])
        return self._tokens

    @property
    def offsets(self) -> list[tuple[int, int]]:
        """Each token's (start, end) character span; empty spans for added BOS / EOS."""
        if self._offsets is None:
            self._offsets = ([(0, 0)] if self._bos else []) + list(self._encoding.offsets) + (
                [(self._end, self._end)] if self._eos else [])
        return self._offsets

    def __repr__(self) -> str:
        return f"TextEncoding(ids={self.ids.tolist()})"


class BPETokenizer:
    """Byte-level BPE: any Unicode string encodes, and ``decode(encode(s).ids) == s`` exactly.

    Args:
        tokenizer: a trained `tokenizers.Tokenizer` with byte-level pre-tokenizer and decoder.
        eos_token: end-of-text token (also the padding token unless ``pad_token`` is given).
        pad_token: padding token; defaults to ``eos_token`` as in GPT-2.
        bos_token: optional begin-of-text token.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        eos_token: str = "<|endoftext|>",
        pad_token: str | None = None,
        bos_token: str | None = None,
    ) -> None:
        self._tok = tokenizer
        self._fast = TiktokenEngine()  # encode/batch_encode's engine where its ids are identical
        self.eos_token = eos_token
        self.pad_token = pad_token or eos_token
        self.bos_token = bos_token
        for role, token in (("eos", eos_token), ("pad", self.pad_token), ("bos", bos_token)):
            if token is not None and tokenizer.token_to_id(token) is None:
                raise ValueError(f"{role}_token {token!r} is not in the vocabulary")

    def __eq__(self, other: object) -> bool:
        """Equal tokenizers give every text the same ids: the same vocabulary, merges, normalisation
        and special tokens."""
        return (isinstance(other, BPETokenizer) and (self.eos_token, self.pad_token, self.bos_token)
                == (other.eos_token, other.pad_token, other.bos_token) and self._tok.to_str() == other._tok.to_str())

    def __hash__(self) -> int:
        return hash((self.eos_token, self.pad_token, self.bos_token, self.vocab_size))

    # ----------------------------------------------------------------- building
    @classmethod
    def train(
        cls,
        files: Sequence[str | Path] | None = None,
        iterator: Iterable[str] | None = None,
        vocab_size: int = 8192,
        min_frequency: int = 2,
        special_tokens: Sequence[str] = DEFAULT_SPECIAL_TOKENS,
        eos_token: str = "<|endoftext|>",
        pad_token: str | None = None,
        bos_token: str | None = None,
    ) -> BPETokenizer:
        """Train a byte-level BPE on text files or an iterator of strings."""
        if (files is None) == (iterator is None):
            raise ValueError("BPETokenizer.train needs exactly one of `files` or `iterator`")
        alphabet = pre_tokenizers.ByteLevel.alphabet()
        minimum = len(alphabet) + len(special_tokens)
        if vocab_size < minimum:
            raise ValueError(
                f"vocab_size={vocab_size} is too small: byte-level BPE needs at least {minimum} "
                f"(256 bytes + {len(special_tokens)} special tokens)"
            )
        for token in (eos_token, pad_token, bos_token):
            if token is not None and token not in special_tokens:
                raise ValueError(f"{token!r} must be listed in special_tokens={list(special_tokens)}")
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            special_tokens=list(special_tokens),
            initial_alphabet=alphabet,
            show_progress=False,
        )
        if files is not None:
            paths = [str(f) for f in files]
            missing = [p for p in paths if not Path(p).is_file()]
            if missing:
                raise FileNotFoundError(f"training files not found: {missing[:5]}")
            if not paths:
                raise ValueError("BPETokenizer.train got an empty list of files")
            tok.train(paths, trainer)
        else:
            tok.train_from_iterator(iterator, trainer)  # type: ignore[arg-type]
        return cls(tok, eos_token=eos_token, pad_token=pad_token, bos_token=bos_token)

    def save(self, directory: str | Path) -> Path:
        """Write ``tokenizer.json`` and ``tokenizer_config.json`` into ``directory``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self._tok.save(str(directory / TOKENIZER_FILE))
        config = {"type": "bpe", "eos_token": self.eos_token, "pad_token": self.pad_token,
                  "bos_token": self.bos_token}
        (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2))
        return directory

    @classmethod
    def load(cls, path: str | Path) -> BPETokenizer:
        """Load from a directory written by `save` or by transformers' ``GPT2Tokenizer(Fast).save_pretrained``
        (the same ids), or from a ``tokenizer.json`` file; a folder of another tokenizer is refused."""
        path = Path(path)
        file = path / TOKENIZER_FILE if path.is_dir() else path
        if not file.is_file():
            raise FileNotFoundError(f"no {TOKENIZER_FILE} at {path}")
        config_file = file.parent / CONFIG_FILE
        roles = bpe_roles(json.loads(config_file.read_text()), config_file) if config_file.is_file() else {}
        tokenizer = Tokenizer.from_file(str(file))
        model = type(tokenizer.model).__name__
        if model != "BPE":
            raise ValueError(f"{file} holds a {model} model; BPETokenizer.load expected a byte-level BPE"
                             + (" (use WordPieceTokenizer.load)" if model == "WordPiece" else ""))
        return cls(tokenizer, **roles)

    # ----------------------------------------------------------------- vocabulary
    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def __len__(self) -> int:
        return self.vocab_size

    def token_to_id(self, token: str) -> int:
        index = self._tok.token_to_id(token)
        if index is None:
            raise KeyError(f"token {token!r} is not in the vocabulary")
        return index

    def id_to_token(self, index: int) -> str:
        token = self._tok.id_to_token(index)
        if token is None:
            raise KeyError(f"id {index} is outside the vocabulary of size {self.vocab_size}")
        return token

    @property
    def eos_id(self) -> int:
        return self.token_to_id(self.eos_token)

    @property
    def pad_id(self) -> int:
        return self.token_to_id(self.pad_token)

    @property
    def bos_id(self) -> int | None:
        return None if self.bos_token is None else self.token_to_id(self.bos_token)

    # ----------------------------------------------------------------- encode / decode
    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> TextEncoding:
        """Encode one string. Empty text is an error: a model cannot start from nothing."""
        if not isinstance(text, str):
            raise TypeError(f"encode takes a str, got {type(text).__name__}")
        if text == "":
            raise ValueError("cannot encode empty text: give at least one character")
        if add_bos and self.bos_token is None:
            raise ValueError("add_bos=True but this tokenizer has no bos_token")
        ids = self._fast.encode(self._tok, text)  # tiktoken, or None: use Hugging Face
        if ids is None:
            try:
                enc = self._tok.encode(text, add_special_tokens=False)
            except TypeError:  # what Hugging Face says of a lone surrogate; say which
                check_unicode(text)
                raise
            ids = enc.ids
        else:  # token strings and offsets, if asked for, come from Hugging Face
            enc = DeferredEncoding(self._tok, text)
        if add_bos or add_eos:
            ids = [*([self.bos_id] if add_bos else []), *ids, *([self.eos_id] if add_eos else [])]
        return TextEncoding(torch.from_numpy(np.array(ids, dtype=np.int64)), enc,  # faster than torch.tensor
                            self.bos_token if add_bos else None, self.eos_token if add_eos else None, len(text))

    def decode(self, ids: Tensor | Sequence[int], skip_special_tokens: bool = False) -> str:
        """Decode one sequence of ids back to text."""
        return self._tok.decode(checked_ids(ids, self.vocab_size), skip_special_tokens=skip_special_tokens)

    def batch_decode(self, ids: Tensor | Sequence[Sequence[int]], skip_special_tokens: bool = True) -> list[str]:
        """Decode each row of a (B, N) batch."""
        return [self.decode(row, skip_special_tokens=skip_special_tokens) for row in batch_rows(ids)]

    def batch_encode(
        self,
        texts: Sequence[str],
        max_length: int | None = None,
        truncation: Truncation | bool = False,
        truncation_side: str = "right",
        padding_side: str = "right",
        add_bos: bool = False,
        add_eos: bool = False,
    ) -> Tokens:
        """Encode and pad a batch into `Tokens`.

        A text longer than ``max_length`` (a positive int, BOS / EOS included) is an error unless
        ``truncation`` is True (or "longest_first" / "only_first", as `WordPieceTokenizer` takes it;
        False and "off" refuse), which cuts the text and keeps BOS / EOS; use ``padding_side="left"``
        for batched generation.
        """
        if isinstance(texts, str):
            raise TypeError("batch_encode takes a list of strings; use encode for one string")
        strategy = resolve_truncation(truncation)  # "off" is a str, so never `if not truncation`
        if truncation_side not in ("left", "right"):
            raise ValueError(f"truncation_side must be 'left' or 'right', got {truncation_side!r}")
        if padding_side not in ("left", "right"):
            raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
        check_int("max_length", max_length, or_none=True)
        texts = list(texts)
        if not texts:
            raise ValueError("batch_encode needs at least one text, got an empty list")
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"text {i} is a {type(text).__name__}, expected str")
            if text == "":
                raise ValueError(f"text {i} is empty text: every text needs at least one character")
        if add_bos and self.bos_token is None:
            raise ValueError("add_bos=True but this tokenizer has no bos_token")
        # tiktoken where its ids are identical, else one call into Hugging Face's Rust batch
        # encoder (parallel over texts), without offsets or token strings.
        rows = self._fast.encode_batch(self._tok, texts)
        if rows is None:
            encode = getattr(self._tok, "encode_batch_fast", self._tok.encode_batch)
            try:
                rows = [enc.ids for enc in encode(texts, add_special_tokens=False)]
            except TypeError:  # a lone surrogate: say which text holds it
                for i, text in enumerate(texts):
                    check_unicode(text, f"text {i}")
                raise
        prefix = [self.bos_id] if add_bos else []
        suffix = [self.eos_id] if add_eos else []
        if max_length is not None:  # cut the text, never the BOS / EOS (as Hugging Face does)
            n_special = len(prefix) + len(suffix)
            room = max_length - n_special
            for i, ids in enumerate(rows):
                if len(ids) > room:
                    if strategy == "off":
                        raise ValueError(f"text {i} has {len(ids) + n_special} tokens, more than "
                                         f"max_length={max_length}; pass truncation=True to cut it")
                    if strategy == "only_second":
                        raise ValueError("truncation='only_second' needs a sentence pair; batch_encode "
                                         "encodes single texts")
                    if room < 1:
                        raise ValueError(f"max_length={max_length} leaves no room for text besides the "
                                         f"{n_special} special tokens (BOS / EOS)")
                    rows[i] = ids[:room] if truncation_side == "right" else ids[-room:]
        if prefix or suffix:
            rows = [[*prefix, *ids, *suffix] for ids in rows]
        return pad_ids(rows, self.pad_id, padding_side)

    def iter_ids(self, texts: Iterable[str], add_eos: bool = True, chunk: int = 256) -> Iterator[list[int]]:
        """Stream token ids for many texts (to build token files), each followed by EOS when
        ``add_eos``; empty texts are skipped. Encodes ``chunk`` texts at a time, through tiktoken
        where its ids are identical (as `batch_encode` does), else Hugging Face's parallel batch."""
        check_int("chunk", chunk)
        pending: list[str] = []
        where: list[int] = []  # each pending text's index in ``texts``, to name a bad one
        eos = [self.eos_id] if add_eos else []

        def flush() -> Iterator[list[int]]:
            rows = self._fast.encode_batch(self._tok, pending)
            if rows is None:
                try:
                    rows = [enc.ids for enc in self._tok.encode_batch(pending, add_special_tokens=False)]
                except TypeError:  # a lone surrogate: say which text holds it
                    for i, text in zip(where, pending, strict=True):
                        check_unicode(text, f"text {i}")
                    raise
            for ids in rows:
                yield [*ids, *eos]
            pending.clear()
            where.clear()

        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"text {i} is a {type(text).__name__}, expected str")
            if text:
                pending.append(text)
                where.append(i)
                if len(pending) == chunk:
                    yield from flush()
        yield from flush()

    # ----------------------------------------------------------------- a classifier's input (GPT-1)
    def encode_for_classifier(self, text: str, text_pair: str | None = None, max_length: int | None = None,
                              truncation: Truncation | bool = True) -> tuple[Tensor, Tensor]:
        """GPT-1's input for a classifier on the last token: ``text <eos>`` (``text <eos> pair
        <eos>``), the longer text cut first to fit ``max_length`` (``truncation`` True or
        "longest_first"; "only_first" / "only_second" cut that text; False or "off": an input
        longer than that is an error); ids and segment ids, each (N,)."""
        check_int("max_length", max_length, or_none=True)
        strategy = resolve_truncation(truncation)
        a = self.encode(text).ids.tolist()
        b = self.encode(text_pair).ids.tolist() if text_pair is not None else None
        n_special = 1 if b is None else 2
        total = len(a) + len(b or ()) + n_special
        if strategy == "off" and max_length is not None and total > max_length:
            raise ValueError(f"the input encodes to {total} tokens (with its <eos>), more than max_length="
                             f"{max_length}; shorten it or pass truncation=True to cut the longer text")
        budget = (len(a) + len(b or ())) if max_length is None else max_length - n_special
        keep_a, keep_b = pair_lengths(len(a), None if b is None else len(b), budget, strategy)
        ids = [*a[:keep_a], self.eos_id] + ([] if b is None else [*b[:keep_b], self.eos_id])
        segments = [0] * (keep_a + 1) + ([] if b is None else [1] * (keep_b + 1))
        return torch.tensor(ids, dtype=torch.long), torch.tensor(segments, dtype=torch.long)

    # ----------------------------------------------------------------- sentence pairs (BERT-style)
    def encode_pair(
        self,
        text: str,
        text_pair: str | None = None,
        max_length: int | None = None,
        truncation: Truncation | bool = "off",
        cls_token: str = "[CLS]",
        sep_token: str = "[SEP]",
    ) -> tuple[Tensor, Tensor]:
        """``[CLS] A [SEP] (B [SEP])`` ids and segment ids, each (N,), for a BERT-style encoder
        reading BPE tokens. [CLS] and [SEP] must be special tokens of this vocabulary (train
        with ``special_tokens=(..., "[CLS]", "[SEP]", "[MASK]", "[PAD]")``)."""
        a = self.encode(text).ids.tolist()
        b = self.encode(text_pair).ids.tolist() if text_pair is not None else None
        ids, segments = encode_pair_ids(a, b, self.token_to_id(cls_token), self.token_to_id(sep_token),
                                        max_length, truncation)
        return torch.tensor(ids, dtype=torch.long), torch.tensor(segments, dtype=torch.long)

    def batch_encode_pairs(
        self,
        texts: Sequence[str],
        text_pairs: Sequence[str] | None = None,
        max_length: int | None = None,
        truncation: Truncation | bool = "off",
        cls_token: str = "[CLS]",
        sep_token: str = "[SEP]",
    ) -> Tokens:
        """`encode_pair` for a batch, right-padded with ``pad_token`` into `Tokens` with segments."""
        if isinstance(texts, str):
            raise TypeError("batch_encode_pairs takes a list of strings; use encode_pair for one string")
        if text_pairs is not None and len(text_pairs) != len(texts):
            raise ValueError(f"{len(texts)} texts but {len(text_pairs)} text_pairs; give one pair per text")
        check_int("max_length", max_length, or_none=True)  # here, not as "text 0: max_length ..."
        rows = []
        for i, text in enumerate(texts):
            try:
                ids, segments = self.encode_pair(text, text_pairs[i] if text_pairs is not None else None,
                                                 max_length, truncation, cls_token, sep_token)
            except ValueError as err:
                raise ValueError(f"text {i}: {err}") from None
            rows.append((ids.tolist(), segments.tolist()))
        return pad_pairs(rows, self.pad_id)


def bpe_roles(config: Any, config_file: Path) -> dict[str, str | None]:
    """`BPETokenizer`'s special tokens from a ``tokenizer_config.json``: one `BPETokenizer.save` wrote
    (``"type": "bpe"``) or transformers' GPT-2 tokenizer did; any other tokenizer's is refused by name."""
    folder = config_file.parent
    if not isinstance(config, dict):
        raise ValueError(f"{config_file} must hold a JSON object, got {type(config).__name__}")
    if "type" in config:  # written by unitok's own save
        if config["type"] != "bpe":
            hint = " (use WordPieceTokenizer.load)" if config["type"] == "wordpiece" else ""
            raise ValueError(f"{folder} holds a {config['type']!r} tokenizer; BPETokenizer.load expected "
                             f"type 'bpe'{hint}")
        unknown = sorted(set(config) - {"type", *ROLES})
        if unknown:
            raise ValueError(f"{config_file} has settings BPETokenizer does not take: {unknown}")
        return {role: config[role] for role in ROLES if role in config}
    kind = config.get("tokenizer_class")
    if kind is None:
        raise ValueError(f"{config_file} names no tokenizer type (neither 'type' nor 'tokenizer_class'); "
                         "BPETokenizer.load expected a folder from BPETokenizer.save or GPT2Tokenizer.save_pretrained")
    if kind not in GPT2_CLASSES:
        raise ValueError(f"{folder} was saved by transformers' {kind}; BPETokenizer.load expected a BPETokenizer "
                         f"folder (type 'bpe') or one of {list(GPT2_CLASSES)}")
    # GPT-2's settings that would change its ids, where ours encode the text as given.
    for setting, fix in (("add_prefix_space", "BPETokenizer encodes text as given (prepend the space to the text)"),
                         ("add_bos_token", "BPETokenizer adds BOS only when asked (add_bos=True)"),
                         ("add_eos_token", "BPETokenizer adds EOS only when asked (add_eos=True)")):
        if config.get(setting):
            raise ValueError(f"{folder}: {kind} with {setting}=True gives other ids than BPETokenizer; {fix}, "
                             f"or save it again with {setting}=False")

    def content(token: Any) -> str | None:  # older transformers write AddedToken objects
        return token.get("content") if isinstance(token, dict) else token

    return {role: content(config[role]) for role in ROLES if role in config}


def check_unicode(text: str, name: str = "text") -> None:
    """A ValueError naming ``name``'s first lone surrogate (U+D800-U+DFFF, as ``open(errors="surrogateescape")``
    leaves for bad bytes) and its position: no encoder can read it. Cheap enough for error paths only."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(f"{name} has a lone surrogate {text[err.start]!r} at position {err.start}: lone "
                         "surrogates cannot be encoded; read the bytes with errors='replace' or remove them") from None


def checked_ids(ids: Tensor | Sequence[int], vocab_size: int) -> list[int]:
    """One sequence of ids (N,) as a list for ``decode``: each an integer in [0, ``vocab_size``)
    (a bool or a float is refused, not read as id 1 or rounded)."""
    if isinstance(ids, Tensor):
        if ids.dim() != 1:
            raise ValueError(f"decode takes one sequence (N,), got shape {tuple(ids.shape)}; use batch_decode")
        ids = ids.tolist()
    ids = list(ids)
    odd = [i for i in ids if isinstance(i, bool) or not isinstance(i, numbers.Integral)]
    if odd:  # True would read as id 1
        raise TypeError(f"ids must be integers, got {odd[:3]!r}")
    bad = [i for i in ids if not 0 <= i < vocab_size]
    if bad:
        raise ValueError(f"ids {bad[:5]} are outside the vocabulary [0, {vocab_size})")
    return ids


def batch_rows(ids: Tensor | Sequence[Sequence[int]]) -> list:
    """The rows of a (B, N) batch of ids for ``batch_decode``; one sequence is refused, as it is `decode`'s."""
    if isinstance(ids, Tensor) and ids.dim() != 2:
        raise ValueError(f"batch_decode takes a batch of rows (B, N), got shape {tuple(ids.shape)}; "
                         "use decode for one sequence")
    rows = ids.tolist() if isinstance(ids, Tensor) else list(ids)
    if any(isinstance(row, numbers.Number) for row in rows):
        raise ValueError("batch_decode takes a batch of rows (a list of id lists), got one sequence of ids; "
                         "use decode for one sequence")
    return rows


def pad_ids(rows: Sequence[Sequence[int]], pad_id: int, padding_side: str = "right") -> Tokens:
    """Id lists -> one padded text `Tokens` batch (ids and attention mask), in one vectorised fill."""
    lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    longest = int(lengths.max())
    keep = np.arange(longest)[None, :] < lengths[:, None]  # (B, N): True on real tokens
    if padding_side == "left":
        keep = keep[:, ::-1]
    ids = np.full((len(rows), longest), pad_id, dtype=np.int64)
    ids[keep] = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int64, count=int(lengths.sum()))
    return Tokens(ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(keep.astype(np.int64)), modality="text")
