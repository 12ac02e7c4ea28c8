"""WordPiece for BERT-family models, wrapping the Hugging Face `tokenizers` library (Rust).

Loads a checkpoint's ``tokenizer.json`` or ``vocab.txt``, or trains a new vocabulary; encodes
single texts and sentence pairs (``[CLS] A [SEP] B [SEP]`` with segment ids), with the pair
truncation strategies of `tokenizers_mm.pairs`; keeps the word index of every sub-token so
word-level labels can go on each word's first sub-token.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch
from tokenizers import (
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)
from torch import Tensor

from tokenizers_mm.checks import check_int
from tokenizers_mm.pairs import (
    Truncation,
    encode_pair_ids,
    join_pair,
    pad_pairs,
    pair_lengths,
    resolve_truncation,
    special_count,
)
from tokenizers_mm.text import batch_rows, check_unicode, checked_ids
from tokenizers_mm.tokens import Tokens

BERT_SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
TOKENIZER_FILE = "tokenizer.json"
VOCAB_FILE = "vocab.txt"
CONFIG_FILE = "tokenizer_config.json"
# tokenizer_config.json's names (as transformers' BertTokenizer writes them) -> BertNormalizer's.
NORMALIZER_SETTINGS = {"do_lower_case": "lowercase", "strip_accents": "strip_accents",
                       "tokenize_chinese_chars": "handle_chinese_chars"}


class PairEncoding(NamedTuple):
    """One encoded text or pair.

    ``ids`` and ``segments`` (N,) long tensors; ``tokens`` the sub-word strings; ``word_ids``
    the index of the word each token came from (None for [CLS]/[SEP]); ``sequence_ids`` 0 for
    A, 1 for B, None for special tokens; ``offsets`` (start, end) characters in its own text.
    """

    ids: Tensor
    segments: Tensor
    tokens: list[str]
    word_ids: list[int | None]
    sequence_ids: list[int | None]
    offsets: list[tuple[int, int]]


def align_word_labels(word_ids: Sequence[int | None], word_labels: Sequence[int],
                      ignore_index: int = -100) -> list[int]:
    """Word-level labels -> one label per token by the first-sub-token rule: a word's label
    goes on its first sub-token; later sub-tokens and special tokens get ``ignore_index``."""
    labels, previous = [], None
    for w in word_ids:
        if w is None or w == previous:
            labels.append(ignore_index)
        else:
            if not 0 <= w < len(word_labels):
                raise ValueError(f"token of word {w}, but only {len(word_labels)} word labels were given")
            labels.append(int(word_labels[w]))
        previous = w
    return labels


class WordPieceTokenizer:
    """BERT's WordPiece tokenizer (normaliser, punctuation splitting, ``##`` continuations).

    Args:
        tokenizer: a `tokenizers.Tokenizer` with a WordPiece model.
        cls_token / sep_token / pad_token / mask_token / unk_token: the special tokens;
            each must be in the vocabulary.
    """

    def __init__(self, tokenizer: Tokenizer, cls_token: str = "[CLS]", sep_token: str = "[SEP]",
                 pad_token: str = "[PAD]", mask_token: str = "[MASK]", unk_token: str = "[UNK]") -> None:
        if type(tokenizer.model).__name__ != "WordPiece":
            raise ValueError(f"WordPieceTokenizer needs a WordPiece model, got {type(tokenizer.model).__name__}")
        # Padding and truncation are ours to do (a checkpoint's tokenizer.json may enable both).
        tokenizer.no_padding()
        tokenizer.no_truncation()
        self._tok = tokenizer
        # The largest id + 1, not the number of tokens: a vocab.txt that lists a token twice keeps its
        # last line's id (as BertTokenizer does), and the first line's id holds no token.
        self._vocab_size = max(tokenizer.get_vocab(with_added_tokens=True).values(), default=-1) + 1
        self.cls_token, self.sep_token, self.pad_token = cls_token, sep_token, pad_token
        self.mask_token, self.unk_token = mask_token, unk_token
        for role in ("cls", "sep", "pad", "mask", "unk"):
            token = getattr(self, f"{role}_token")
            if tokenizer.token_to_id(token) is None:
                raise ValueError(f"{role}_token {token!r} is not in the vocabulary")

    # ----------------------------------------------------------------- building
    @classmethod
    def train(
        cls,
        files: Sequence[str | Path] | None = None,
        iterator: Iterable[str] | None = None,
        vocab_size: int = 8192,
        min_frequency: int = 2,
        lowercase: bool = False,
        special_tokens: Sequence[str] = BERT_SPECIAL_TOKENS,
        limit_alphabet: int = 1000,
    ) -> WordPieceTokenizer:
        """Train a WordPiece vocabulary on text files or an iterator of strings.

        ``special_tokens`` must include [PAD] [UNK] [CLS] [SEP] [MASK]; they get the first ids.
        The same text always gives the same vocabulary and ids: Hugging Face's trainer runs
        twice (below), so an ``iterator`` is read into memory once.
        """
        if (files is None) == (iterator is None):
            raise ValueError("WordPieceTokenizer.train needs exactly one of `files` or `iterator`")
        missing = [t for t in BERT_SPECIAL_TOKENS if t not in special_tokens]
        if missing:
            raise ValueError(f"special_tokens={list(special_tokens)} lacks {missing}")
        if vocab_size <= len(special_tokens):
            raise ValueError(f"vocab_size={vocab_size} leaves no room beside {len(special_tokens)} special tokens")
        if files is not None:
            paths = [str(f) for f in files]
            if not paths:
                raise ValueError("WordPieceTokenizer.train got an empty list of files")
            absent = [p for p in paths if not Path(p).is_file()]
            if absent:
                raise FileNotFoundError(f"training files not found: {absent[:5]}")
        else:
            lines = list(iterator)  # type: ignore[arg-type]  # read twice, below

        def blank() -> Tokenizer:
            tok = Tokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=100))
            tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                        strip_accents=lowercase, lowercase=lowercase)
            tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
            tok.decoder = decoders.WordPiece(prefix="##")
            return tok

        def fit(named_first: Sequence[str]) -> dict[str, int]:
            tok = blank()
            trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                                special_tokens=[*special_tokens, *named_first],
                                                limit_alphabet=limit_alphabet, continuing_subword_prefix="##",
                                                show_progress=False)
            if files is not None:
                tok.train(paths, trainer)
            else:
                tok.train_from_iterator(lines, trainer)
            return tok.get_vocab(with_added_tokens=False)

        # Hugging Face's trainer numbers the one-character continuation pieces ("##e") in hash-map
        # order, which changes from run to run, and breaks ties between equally frequent merges
        # by those numbers: the same corpus could give a different vocabulary
        # (huggingface/tokenizers#1794). Which such pieces exist is fixed by the corpus, so a
        # first pass finds them and the second names them up front, in sorted order: every id,
        # and so every tie, is then the same in every run.
        continuing = sorted(t for t in fit(()) if t.startswith("##") and len(t) == 3)
        learned = fit(continuing)
        # WordPiece matching does not depend on ids: number them canonically (special tokens
        # first, then sorted), as a checkpoint's vocab.txt lists them.
        ordered = [t for t in special_tokens if t in learned] + sorted(t for t in learned if t not in special_tokens)
        tok = blank()
        tok.model = models.WordPiece({t: i for i, t in enumerate(ordered)}, unk_token="[UNK]",
                                     max_input_chars_per_word=100)
        tok.add_special_tokens(list(special_tokens))
        cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
        # The standard BERT post-processor, so the saved tokenizer.json works in other libraries too.
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)])
        return cls(tok)

    @classmethod
    def from_vocab(cls, vocab_file: str | Path, lowercase: bool = True, strip_accents: bool | None = None,
                   handle_chinese_chars: bool = True, **special: str) -> WordPieceTokenizer:
        """Build from a ``vocab.txt`` (one token per line, the line number is its id) with
        BERT's normaliser and pre-tokenizer: ``lowercase`` for uncased checkpoints,
        ``strip_accents`` (None: when lower-casing), ``handle_chinese_chars`` (each CJK character
        a word). Read as Hugging Face reads it: trailing whitespace is not part of a token, and a
        token listed twice has its last line's id."""
        if not Path(vocab_file).is_file():
            raise FileNotFoundError(f"no vocabulary file at {vocab_file}")
        vocab = models.WordPiece.read_file(str(vocab_file))  # BertTokenizer's reader, so its ids
        unk = special.get("unk_token", "[UNK]")
        tok = Tokenizer(models.WordPiece(vocab, unk_token=unk, max_input_chars_per_word=100))
        tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=handle_chinese_chars,
                                                    strip_accents=strip_accents, lowercase=lowercase)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece(prefix="##")
        # As transformers' BertTokenizer treats them: never split ("[MASK]" in text is the mask
        # token) and skipped when decoding; they keep their vocab.txt ids.
        roles = {"cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]", "mask_token": "[MASK]",
                 "unk_token": "[UNK]"}
        tok.add_special_tokens([t for t in (special.get(r, d) for r, d in roles.items()) if t in vocab])
        return cls(tok, **special)

    @classmethod
    def load(cls, path: str | Path, lowercase: bool | None = None) -> WordPieceTokenizer:
        """Load a BERT-family tokenizer: a folder (``tokenizer.json`` preferred, else
        ``vocab.txt``), or either file itself. Special tokens and the normaliser's settings
        (``do_lower_case``, ``strip_accents``, ``tokenize_chinese_chars``) are read from
        ``tokenizer_config.json`` next to it when present, as transformers' BertTokenizer reads
        them; ``lowercase`` overrides ``do_lower_case``. A setting the config leaves out is
        uncased BERT's for a ``vocab.txt``, and what a ``tokenizer.json``'s own normaliser says."""
        path = Path(path)
        if path.is_dir():
            file = path / TOKENIZER_FILE if (path / TOKENIZER_FILE).is_file() else path / VOCAB_FILE
        else:
            file = path
        if not file.is_file():
            raise FileNotFoundError(f"no {TOKENIZER_FILE} or {VOCAB_FILE} at {path}")
        config_file = file.parent / CONFIG_FILE
        config = json.loads(config_file.read_text()) if config_file.is_file() else {}
        if config.get("type", "wordpiece") != "wordpiece":
            raise ValueError(f"{file.parent} holds a {config['type']!r} tokenizer; WordPieceTokenizer.load "
                             "expected type 'wordpiece'" + (" (use BPETokenizer.load)" if config["type"] == "bpe" else ""))
        special = {k: v for k, v in config.items()
                   if k in ("cls_token", "sep_token", "pad_token", "mask_token", "unk_token") and isinstance(v, str)}
        settings = normalizer_settings(config, config_file)
        if lowercase is not None:
            settings["lowercase"] = lowercase
        if file.suffix == ".json":
            tok = Tokenizer.from_file(str(file))
            apply_normalizer_settings(tok, settings)
            return cls(tok, **special)
        return cls.from_vocab(file, **settings, **special)

    def save(self, directory: str | Path) -> Path:
        """Write ``tokenizer.json``, ``vocab.txt`` and ``tokenizer_config.json`` into ``directory``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self._tok.save(str(directory / TOKENIZER_FILE))
        (directory / VOCAB_FILE).write_text("".join(f"{token}\n" for token in self._vocab_lines()), encoding="utf-8")
        normalizer = json.loads(self._tok.to_str()).get("normalizer") or {}
        config = {"type": "wordpiece", "cls_token": self.cls_token, "sep_token": self.sep_token,
                  "pad_token": self.pad_token, "mask_token": self.mask_token, "unk_token": self.unk_token,
                  "do_lower_case": bool(normalizer.get("lowercase", False))}
        if normalizer.get("type") == "BertNormalizer":
            config.update(strip_accents=normalizer.get("strip_accents"),
                          tokenize_chinese_chars=bool(normalizer.get("handle_chinese_chars", True)))
        (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2))
        return directory

    def _vocab_lines(self) -> list[str]:
        """``vocab.txt``'s lines, line number = id. An id that holds no token (the first line of a
        token listed twice) gets the next token's line again: that token keeps its later id, as
        the last line of a token wins, so the file reads back to the very same ids."""
        by_id = {i: token for token, i in self._tok.get_vocab(with_added_tokens=True).items()}
        lines, later = [], ""
        for i in reversed(range(self.vocab_size)):
            later = by_id.get(i, later)  # the largest id holds a token, so a gap always has a later one
            lines.append(later)
        return lines[::-1]

    def __eq__(self, other: object) -> bool:
        """Equal tokenizers give every text the same ids: the same vocabulary, normalisation and
        special tokens."""
        roles = ("cls_token", "sep_token", "pad_token", "mask_token", "unk_token")
        return (isinstance(other, WordPieceTokenizer) and all(getattr(self, r) == getattr(other, r) for r in roles)
                and self._tok.to_str() == other._tok.to_str())

    def __hash__(self) -> int:
        return hash((self.cls_token, self.sep_token, self.pad_token, self.vocab_size))

    # ----------------------------------------------------------------- vocabulary
    @property
    def vocab_size(self) -> int:
        """The number of ids, 0 to the largest (an embedding table's rows)."""
        return self._vocab_size

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
            if 0 <= index < self.vocab_size:
                raise KeyError(f"id {index} holds no token (its vocab.txt line names a token listed again later)")
            raise KeyError(f"id {index} is outside the vocabulary of size {self.vocab_size}")
        return token

    @property
    def cls_id(self) -> int:
        return self.token_to_id(self.cls_token)

    @property
    def sep_id(self) -> int:
        return self.token_to_id(self.sep_token)

    @property
    def pad_id(self) -> int:
        return self.token_to_id(self.pad_token)

    @property
    def mask_id(self) -> int:
        return self.token_to_id(self.mask_token)

    @property
    def unk_id(self) -> int:
        return self.token_to_id(self.unk_token)

    @property
    def special_ids(self) -> list[int]:
        """Ids that masking and random replacement must never touch or produce."""
        return sorted({self.cls_id, self.sep_id, self.pad_id, self.mask_id, self.unk_id})

    def continuation_mask(self) -> Tensor:
        """(V,) bool: True for ``##`` pieces that continue a word (for whole-word masking)."""
        mask = torch.zeros(self.vocab_size, dtype=torch.bool)
        for token, index in self._tok.get_vocab(with_added_tokens=True).items():
            mask[index] = token.startswith("##")
        return mask

    # ----------------------------------------------------------------- encode / decode
    def _pieces(self, text: str | Sequence[str], role: str):
        if isinstance(text, str):
            if text == "":
                raise ValueError(f"cannot encode empty {role}: give at least one character")
            try:
                return self._tok.encode(text, add_special_tokens=False)
            except TypeError:  # what Hugging Face says of a lone surrogate; say which
                check_unicode(text, role)
                raise
        if not isinstance(text, Sequence) or not text:
            raise TypeError(f"{role} must be a str or a non-empty list of words (str), got {type(text).__name__}"
                            + (" (empty)" if isinstance(text, Sequence) else ""))
        words = list(text)
        for i, word in enumerate(words):
            if not isinstance(word, str):
                raise TypeError(f"{role} word {i} is a {type(word).__name__}, expected str")
        try:
            return self._tok.encode(words, is_pretokenized=True, add_special_tokens=False)
        except TypeError:
            for i, word in enumerate(words):
                check_unicode(word, f"{role} word {i}")
            raise

    def _encode_batch(self, texts: Sequence[str], role: str) -> list[Any]:
        """Hugging Face's parallel batch encoding (no special tokens) of strings already checked."""
        try:
            return self._tok.encode_batch(list(texts), add_special_tokens=False)
        except TypeError:  # a lone surrogate: say which text holds it
            for i, text in enumerate(texts):
                check_unicode(text, f"{role} {i}")
            raise

    def encode_ids(self, text: str) -> list[int]:
        """Sub-word ids of one text, no special tokens (for building training data)."""
        return list(self._pieces(text, "text").ids)

    def encode_batch_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Sub-word ids of many texts in parallel, no special tokens; empty texts give []."""
        if isinstance(texts, str):  # would be read as one text per character
            raise TypeError("encode_batch_ids takes a list of strings; use encode_ids for one string")
        texts = list(texts)
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"text {i} is a {type(text).__name__}, expected str")
        return [list(e.ids) for e in self._encode_batch(texts, "text")]

    def encode(
        self,
        text: str | Sequence[str],
        text_pair: str | Sequence[str] | None = None,
        max_length: int | None = None,
        truncation: Truncation | bool = "off",
    ) -> PairEncoding:
        """``[CLS] A [SEP]`` or ``[CLS] A [SEP] B [SEP]`` with segment ids.

        A list of strings is taken as pre-split words (``word_ids`` index that list).
        ``max_length`` counts the special tokens; a longer input is an error unless
        ``truncation`` is "longest_first", "only_first" or "only_second" (or True).
        """
        truncation = resolve_truncation(truncation)
        check_int("max_length", max_length, or_none=True)  # True is no budget of 1, 2.5 no slice end
        a = self._pieces(text, "text")
        b = self._pieces(text_pair, "text_pair") if text_pair is not None else None
        for role, given, pieces in (("text", text, a), ("text_pair", text_pair, b)):
            if pieces is not None and not pieces.ids:  # only spaces: refused, as batch_encode does
                raise ValueError(f"{role} {given!r} encodes to no tokens: give at least one character")
        n_a, n_b = len(a.ids), (len(b.ids) if b is not None else None)
        if max_length is not None:
            n_a, kept_b = pair_lengths(n_a, n_b, max_length - special_count(b is not None), truncation)
            n_b = kept_b if b is not None else None

        def part(enc, n, field):
            return list(getattr(enc, field))[:n] if enc is not None else None

        ids, segments = join_pair(part(a, n_a, "ids"), part(b, n_b, "ids"), self.cls_id, self.sep_id)
        tokens, _ = join_pair(part(a, n_a, "tokens"), part(b, n_b, "tokens"), self.cls_token, self.sep_token)
        word_ids, _ = join_pair(part(a, n_a, "word_ids"), part(b, n_b, "word_ids"), None, None)
        offsets, _ = join_pair(part(a, n_a, "offsets"), part(b, n_b, "offsets"), (0, 0), (0, 0))
        sequence_ids, _ = join_pair([0] * n_a, [1] * n_b if b is not None else None, None, None)  # type: ignore[operator]
        return PairEncoding(torch.tensor(ids, dtype=torch.long), torch.tensor(segments, dtype=torch.long),
                            tokens, word_ids, sequence_ids, [tuple(o) for o in offsets])

    def batch_encode(
        self,
        texts: Sequence[str],
        text_pairs: Sequence[str] | None = None,
        max_length: int | None = None,
        truncation: Truncation | bool = "off",
        padding_side: str = "right",
        pad_to: int | None = None,
    ) -> Tokens:
        """Encode (pairs of) texts and pad them into `Tokens` with ``segments``."""
        if isinstance(texts, str):
            raise TypeError("batch_encode takes a list of strings; use encode for one string")
        if isinstance(text_pairs, str):
            raise TypeError("batch_encode takes a list of text_pairs (one str per text); use encode for one pair")
        if text_pairs is not None and len(text_pairs) != len(texts):
            raise ValueError(f"{len(texts)} texts but {len(text_pairs)} text_pairs; give one pair per text")
        for role, items in (("text", texts), ("text_pair", text_pairs or ())):
            for i, item in enumerate(items):
                if not isinstance(item, str):
                    raise TypeError(f"{role} {i} is a {type(item).__name__}, expected str")
        check_int("max_length", max_length, or_none=True)  # here, not as "text 0: max_length ..."
        check_int("pad_to", pad_to, or_none=True)
        resolve_truncation(truncation)
        encoded_a = self._encode_batch(texts, "text")
        encoded_b = self._encode_batch(text_pairs, "text_pair") if text_pairs else None
        rows = []
        for i, a in enumerate(encoded_a):
            b = encoded_b[i] if encoded_b is not None else None
            if not a.ids:
                raise ValueError(f"text {i} encodes to no tokens: give at least one character")
            if b is not None and not b.ids:
                raise ValueError(f"text_pair {i} encodes to no tokens: give at least one character")
            try:
                rows.append(encode_pair_ids(a.ids, b.ids if b is not None else None, self.cls_id, self.sep_id,
                                            max_length, truncation))
            except ValueError as err:
                raise ValueError(f"text {i}: {err}") from None
        return pad_pairs(rows, self.pad_id, padding_side, pad_to)

    def decode(self, ids: Tensor | Sequence[int], skip_special_tokens: bool = True) -> str:
        """Ids back to text (``##`` pieces joined; lower-cased if the normaliser lower-cases)."""
        return self._tok.decode(checked_ids(ids, self.vocab_size), skip_special_tokens=skip_special_tokens)

    def batch_decode(self, ids: Tensor | Sequence[Sequence[int]], skip_special_tokens: bool = True) -> list[str]:
        """Decode each row; with a `Tokens`-style padded tensor, padding is dropped as a special token."""
        return [self.decode(row, skip_special_tokens=skip_special_tokens) for row in batch_rows(ids)]


def normalizer_settings(config: dict[str, Any], config_file: Path) -> dict[str, Any]:
    """BertNormalizer's settings that a ``tokenizer_config.json`` gives (by transformers' names),
    each checked: ``do_lower_case`` and ``tokenize_chinese_chars`` true or false, ``strip_accents``
    true, false or null (null: strip when lower-casing)."""
    settings = {}
    for key, name in NORMALIZER_SETTINGS.items():
        if key in config:
            value = config[key]
            if not (isinstance(value, bool) or (key == "strip_accents" and value is None)):
                allowed = "true, false or null" if key == "strip_accents" else "true or false"
                raise ValueError(f"{config_file}: {key} must be {allowed}, got {value!r}")
            settings[name] = value
    return settings


def apply_normalizer_settings(tokenizer: Tokenizer, settings: dict[str, Any]) -> None:
    """Set a tokenizer.json's BertNormalizer as ``settings`` say (what its tokenizer_config.json gives
    wins, as transformers' BertTokenizer reads the folder); another normaliser is left as it is."""
    if not settings or tokenizer.normalizer is None:
        return
    state = json.loads(tokenizer.normalizer.__getstate__())
    if state.get("type") != "BertNormalizer":
        return
    wanted = {name: state.get(name) for name in NORMALIZER_SETTINGS.values()} | settings
    if any(state.get(name) != value for name, value in wanted.items()):
        tokenizer.normalizer = normalizers.BertNormalizer(clean_text=state.get("clean_text", True), **wanted)
