"""tiktoken as a faster engine for `BPETokenizer`'s byte-level BPE, used only where it gives the
very same ids as the Hugging Face `tokenizers` engine it stands in for.

tiktoken merges the adjacent pair whose *concatenation* has the lowest id (rank); Hugging Face
merges the pair with the lowest *merge rank*, and only pairs on its merge list. They can agree
only on a vocabulary whose ids follow its merge order and in which every token is reached, from
its own bytes, by exactly its own merge under tiktoken's order — which `build_encoding` checks
token by token, refusing with `NotRepresentable` otherwise (merges out of id order, a token BPE
cannot reach, a prefix space, another pre-tokenizer, a normalizer, dropout, truncation, ...).
These checks are necessary, not a proof: the tests compare both engines' ids on the standard
library's source, edge cases and random Unicode (every vocabulary `BPETokenizer.train` made
there, 300 to 22k tokens, passed the checks and gave identical ids).

`TiktokenEngine` is what `BPETokenizer.encode` / ``batch_encode`` ask first: it builds the
encoding once, on first use, and answers None where there is none (tiktoken not installed, a
vocabulary it cannot represent), and the Hugging Face engine answers instead.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from typing import Any

try:
    import tiktoken
except ImportError:  # optional at run time: BPETokenizer falls back to Hugging Face
    tiktoken = None

# The GPT-2 split that Hugging Face's ``pre_tokenizers.ByteLevel(use_regex=True)`` applies.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


class NotRepresentable(ValueError):
    """The Hugging Face tokenizer has no tiktoken equivalent with identical ids."""


@lru_cache(maxsize=1)
def byte_alphabet() -> dict[str, int]:
    """GPT-2's printable stand-in character for each byte (as Hugging Face's ByteLevel writes
    tokens), mapped back to the byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def _check_pipeline(spec: dict[str, Any]) -> None:
    """Everything around the BPE model must be what tiktoken does: a GPT-2 byte-level split and
    nothing that changes ids."""
    pre = spec.get("pre_tokenizer")
    if not (pre and pre.get("type") == "ByteLevel" and pre.get("use_regex", True)):
        raise NotRepresentable(f"pre-tokenizer {pre} is not ByteLevel(use_regex=True)")
    if pre.get("add_prefix_space"):
        raise NotRepresentable("ByteLevel(add_prefix_space=True) has no tiktoken equivalent")
    if spec.get("normalizer") is not None:
        raise NotRepresentable(f"normalizer {spec['normalizer'].get('type')} has no tiktoken equivalent")
    post = spec.get("post_processor")
    if post is not None and post.get("type") != "ByteLevel":  # ByteLevel only trims offsets
        raise NotRepresentable(f"post-processor {post.get('type')} may add tokens")
    for setting in ("truncation", "padding"):
        if spec.get(setting) is not None:
            raise NotRepresentable(f"the Hugging Face tokenizer has {setting} enabled")
    model = spec["model"]
    if model.get("type") != "BPE":
        raise NotRepresentable(f"model {model.get('type')} is not BPE")
    for key in ("dropout", "continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(key):
            raise NotRepresentable(f"BPE with {key}={model[key]!r} has no tiktoken equivalent")
    if model.get("byte_fallback") or model.get("ignore_merges"):
        raise NotRepresentable("BPE with byte_fallback or ignore_merges has no tiktoken equivalent")


def _special_tokens(spec: dict[str, Any]) -> dict[str, int]:
    """Added tokens, all of which must be plain special tokens (split out of the text as is)."""
    specials = {}
    for added in spec.get("added_tokens", []):
        content = added["content"]
        if not added.get("special") or added.get("single_word") or added.get("lstrip") or added.get("rstrip"):
            raise NotRepresentable(f"added token {content!r} is not a plain special token")
        specials[content] = added["id"]
    ordered = sorted(specials)
    for a, b in zip(ordered, ordered[1:]):
        if b.startswith(a):  # Hugging Face takes the longest match, tiktoken the first alternative
            raise NotRepresentable(f"special token {a!r} is a prefix of {b!r}")
    return specials


def _lowest_rank_merge(piece: bytes, ranks: dict[bytes, int], below: int) -> list[bytes]:
    """tiktoken's merge loop on ``piece`` using only tokens of rank < ``below``."""
    parts = [piece[i:i + 1] for i in range(len(piece))]
    while len(parts) > 1:
        best, at = below, -1
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1], below)
            if rank < best:
                best, at = rank, i
        if at < 0:
            break
        parts[at:at + 2] = [parts[at] + parts[at + 1]]
    return parts


def mergeable_ranks(spec: dict[str, Any], specials: dict[str, int]) -> dict[bytes, int]:
    """Each non-special token's bytes -> its id, after checking that tiktoken's rank-of-result
    merging rebuilds every merge exactly as Hugging Face's merge list does."""
    alphabet = byte_alphabet()
    model = spec["model"]
    special_ids = set(specials.values())
    ranks: dict[bytes, int] = {}
    for token, index in model["vocab"].items():
        if specials.get(token) == index:
            continue
        if index in special_ids:
            raise NotRepresentable(f"id {index} is both {token!r} and a special token")
        try:
            piece = bytes(alphabet[c] for c in token)
        except KeyError:
            raise NotRepresentable(f"token {token!r} is not written in the byte-level alphabet") from None
        if piece in ranks:
            raise NotRepresentable(f"two tokens of the vocabulary are the bytes {piece!r}")
        ranks[piece] = index
    if not all(bytes([b]) in ranks for b in range(256)):
        raise NotRepresentable("the vocabulary lacks some of the 256 single bytes")
    merged: dict[bytes, tuple[bytes, bytes]] = {}
    previous = -1
    for pair in model["merges"]:
        left, right = pair.split(" ") if isinstance(pair, str) else pair
        a, b = (bytes(alphabet[c] for c in s) for s in (left, right))
        token = a + b
        if token not in ranks or token in merged:
            raise NotRepresentable(f"merge {left!r} + {right!r} does not make one new token")
        if ranks[token] <= previous:
            raise NotRepresentable(f"merge {left!r} + {right!r} is out of id order: tiktoken ranks "
                                   "merges by the id of their result")
        previous = ranks[token]
        merged[token] = (a, b)
    for token, index in ranks.items():
        if len(token) == 1:
            continue
        if token not in merged:
            raise NotRepresentable(f"token {token!r} (id {index}) is made by no merge")
        if _lowest_rank_merge(token, ranks, index) != list(merged[token]):
            raise NotRepresentable(f"token {token!r} (id {index}) is reached by another split under "
                                   "tiktoken's merge order than by its merge")
    return ranks


def build_encoding(tokenizer: Any) -> Any:
    """A `tiktoken.Encoding` giving the same ids as the Hugging Face ``tokenizer`` (a
    `tokenizers.Tokenizer`), or `NotRepresentable` saying why there is none."""
    if tiktoken is None:
        raise NotRepresentable("tiktoken is not installed")
    spec = json.loads(tokenizer.to_str())
    _check_pipeline(spec)
    specials = _special_tokens(spec)
    ranks = mergeable_ranks(spec, specials)
    return tiktoken.Encoding("unitok-bpe", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens=specials)


class TiktokenEngine:
    """A tiktoken stand-in for one Hugging Face tokenizer, built on first use (or found not to
    exist, then every call answers None: use Hugging Face). Pickles empty and is rebuilt after
    unpickling, so DataLoader workers do not ship the whole rank table. It is built from the
    tokenizer as it is then: tokens added to the Hugging Face tokenizer later are not seen."""

    def __init__(self) -> None:
        self._built = False
        self._core: Any = None  # the Rust encoder inside the tiktoken.Encoding
        self._specials: frozenset[str] = frozenset()
        self._special_list: tuple[str, ...] = ()
        self.reason: str | None = None  # why there is no engine, once looked at

    def __getstate__(self) -> dict[str, Any]:
        return {"rebuild": True}  # not empty: pickle skips __setstate__ for a false state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()

    def available(self, tokenizer: Any) -> bool:
        """Whether this engine stands in for ``tokenizer`` (built on the first call; if not,
        ``reason`` says why)."""
        if not self._built:
            self._built = True
            try:
                encoding = build_encoding(tokenizer)
            except NotRepresentable as err:
                self.reason = str(err)
                return False
            # The Rust encoder itself: the public `Encoding.encode` replaces lone surrogates,
            # which Hugging Face refuses, and spends more than the encoding on short texts.
            self._core = getattr(encoding, "_core_bpe", None)
            if self._core is None:
                self.reason = f"tiktoken {tiktoken.__version__} has no Encoding._core_bpe"
            self._specials = frozenset(encoding.special_tokens_set)
            self._special_list = tuple(self._specials)
        return self._core is not None

    def _encode(self, text: str) -> list[int]:
        if any(map(text.__contains__, self._special_list)):  # split special tokens out
            return self._core.encode(text, self._specials)
        return self._core.encode_ordinary(text)  # the same ids, without looking for them

    def encode(self, tokenizer: Any, text: str) -> list[int] | None:
        """``text``'s ids (special tokens in it split out, as Hugging Face does), or None:
        use Hugging Face."""
        if not self.available(tokenizer):
            return None
        try:
            return self._encode(text)
        except UnicodeEncodeError:  # lone surrogates: Hugging Face raises its own error
            return None

    def encode_batch(self, tokenizer: Any, texts: Sequence[str]) -> list[list[int]] | None:
        """`encode` for each text, on as many threads as the Hugging Face engine would use
        (``RAYON_NUM_THREADS``, else every core) where that gains: see `parallel_parts`."""
        if not self.available(tokenizer):
            return None
        threads = int(os.environ.get("RAYON_NUM_THREADS") or os.cpu_count() or 1)
        try:
            parts = parallel_parts(texts, threads)
            if parts is None:
                return [self._encode(text) for text in texts]
            with ThreadPoolExecutor(threads) as pool:  # the encoder releases the GIL
                return [ids for part in pool.map(self._encode_all, parts) for ids in part]
        except UnicodeEncodeError:
            return None

    def _encode_all(self, texts: Sequence[str]) -> list[list[int]]:
        return [self._encode(text) for text in texts]


# Threads gain only on a large batch of long texts. The encoder releases the GIL for each text, and
# a short one is over before another thread has taken it: two threads on lines of source (~40
# characters) ran 0.6-0.8x a loop, and one task a text 0.1-0.25x; texts of 400 characters and
# more, in a few tasks a thread, 1.1-1.6x (2 threads, 256k-1M characters).
_PARALLEL_CHARS = 1 << 17
_PARALLEL_MEAN_CHARS = 256
_TASKS_PER_THREAD = 4  # contiguous runs of texts, balanced by characters: uneven texts still share out


def parallel_parts(texts: Sequence[str], threads: int) -> list[Sequence[str]] | None:
    """``texts`` cut into contiguous runs of about equal characters, a few for each of ``threads``,
    where encoding them on threads gains (at least `_PARALLEL_CHARS` characters in all, texts of
    `_PARALLEL_MEAN_CHARS` on average); None where a loop is faster."""
    total = sum(map(len, texts))
    if threads < 2 or total < _PARALLEL_CHARS or total < _PARALLEL_MEAN_CHARS * len(texts):
        return None
    count = min(len(texts), threads * _TASKS_PER_THREAD)
    parts, start, seen = [], 0, 0
    for i, text in enumerate(texts):
        seen += len(text)
        if seen * count >= total * (len(parts) + 1) and len(parts) < count - 1 and i < len(texts) - 1:
            parts.append(texts[start : i + 1])
            start = i + 1
    parts.append(texts[start:])
    return parts


class DeferredEncoding:
    """Token strings and character offsets for a text the fast engine encoded, read from the
    Hugging Face engine only when asked for (as `TextEncoding` does), so they stay identical."""

    __slots__ = ("_tokenizer", "_text", "_encoding")

    def __init__(self, tokenizer: Any, text: str) -> None:
        self._tokenizer, self._text, self._encoding = tokenizer, text, None

    def _get(self) -> Any:
        if self._encoding is None:
            self._encoding = self._tokenizer.encode(self._text, add_special_tokens=False)
        return self._encoding

    @property
    def tokens(self) -> list[str]:
        return self._get().tokens

    @property
    def offsets(self) -> list[tuple[int, int]]:
        return self._get().offsets
