"""CLIP's text tokenizer: open_clip's byte-pair encoding (49,408 ids, ``<start_of_text>`` /
``<end_of_text>``, lower-cased), wrapped so it yields `Tokens` and refuses bad input.

The BPE itself is open_clip's ``SimpleTokenizer`` (imported on first use: open_clip pulls in
timm and torchvision); this module adds the batch layout, truncation policy and checks.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Sequence
from typing import Any, Literal

import torch
from torch import Tensor

from tokenizers_mm.checks import check_int
from tokenizers_mm.text import batch_rows, checked_ids
from tokenizers_mm.tokens import Tokens

Truncation = Literal["error", "warn", "silent"]
DEFAULT_CONTEXT_LENGTH = 77  # every released CLIP model


class CLIPTokenizer:
    """Text -> ``[<start_of_text>, BPE ids…, <end_of_text>]``, padded with 0.

    ``batch_encode`` pads to the longest caption (what unitok's text tower needs); calling the
    tokenizer like open_clip's (``tok(texts)``) pads to ``context_length`` and returns a plain
    (B, context_length) tensor, the same ids as ``open_clip.tokenize``.

    Args:
        context_length: the most ids one caption may have, start and end included.
        truncation: a caption longer than the context is an error ("error"), cut with a
            warning ("warn"), or cut quietly ("silent", open_clip's behaviour). A cut caption
            keeps ``<end_of_text>`` as its last id, as open_clip does.
    """

    pad_id = 0

    def __init__(self, context_length: int = DEFAULT_CONTEXT_LENGTH, truncation: Truncation = "error") -> None:
        check_context_length(context_length)
        if truncation not in ("error", "warn", "silent"):
            raise ValueError(f"truncation must be 'error', 'warn' or 'silent', got {truncation!r}")
        from open_clip.tokenizer import SimpleTokenizer

        self._bpe = SimpleTokenizer(context_length=context_length)
        self.context_length = context_length
        self.truncation: Truncation = truncation

    def __getstate__(self) -> dict[str, Any]:  # picklable for data-loader workers: rebuild the BPE
        return {"context_length": self.context_length, "truncation": self.truncation}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)  # type: ignore[misc]

    def __eq__(self, other: object) -> bool:  # one vocabulary (open_clip's): the context and its cut decide
        return isinstance(other, CLIPTokenizer) and self.__getstate__() == other.__getstate__()

    def __hash__(self) -> int:
        return hash((self.context_length, self.truncation))

    @property
    def vocab_size(self) -> int:
        return len(self._bpe.encoder)

    @property
    def sot_id(self) -> int:
        return self._bpe.sot_token_id

    @property
    def eot_id(self) -> int:
        return self._bpe.eot_token_id

    def encode(self, text: str, context_length: int | None = None) -> Tensor:
        """One caption -> (N,) ids with start and end tokens (N ≤ ``context_length``, by default
        the tokenizer's). A caption with no words once cleaned (as ``"&nbsp;"``) is refused."""
        return torch.tensor(self._ids(text, context_length), dtype=torch.long)

    def _ids(self, text: str, context_length: int | None) -> list[int]:
        """`encode`'s ids as a list (a batch makes one tensor of its rows, not one a caption)."""
        if not isinstance(text, str):
            raise TypeError(f"captions must be str, got {type(text).__name__}")
        limit = self.context_length if context_length is None else check_context_length(context_length)
        words = self._bpe.encode(text)  # cleans the text first (ftfy, HTML entities, whitespace)
        if not words:
            raise ValueError(f"cannot encode empty text {text!r}: a caption needs at least one word")
        ids = [self.sot_id, *words, self.eot_id]
        if len(ids) > limit:
            if self.truncation == "error":
                raise ValueError(
                    f"caption {text[:60]!r} has {len(ids)} tokens, more than context_length="
                    f"{limit}; shorten it or build the tokenizer with truncation='warn'"
                )
            if self.truncation == "warn":
                warnings.warn(f"caption {text[:60]!r} has {len(ids)} tokens; cut to {limit}", stacklevel=3)
            ids = [*ids[: limit - 1], self.eot_id]
        return ids

    def batch_encode(self, texts: Sequence[str], pad_to: int | None = None,
                     context_length: int | None = None) -> Tokens:
        """Captions (each at most ``context_length`` ids, by default the tokenizer's) -> `Tokens`
        (B, N) padded with 0 to the longest (or to ``pad_to``)."""
        if isinstance(texts, str):
            raise TypeError("batch_encode takes a list of captions; use encode for one")
        if len(texts) == 0:
            raise ValueError("batch_encode needs at least one caption, got an empty list")
        check_int("pad_to", pad_to, or_none=True)
        rows = [self._ids(t, context_length) for t in texts]
        longest = max(len(r) for r in rows)
        width = longest if pad_to is None else pad_to
        if width < longest:
            raise ValueError(f"pad_to={pad_to} is shorter than the longest caption ({longest})")
        # the rows' ids as one flat tensor scattered under the mask: per-row tensors and writes (or a
        # tensor of the padded lists) cost more than the BPE itself once its cache is warm
        mask = torch.arange(width) < torch.tensor([len(r) for r in rows])[:, None]
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        ids[mask] = torch.tensor(list(itertools.chain.from_iterable(rows)), dtype=torch.long)
        return Tokens(ids=ids, attention_mask=mask.long(), modality="text")

    def __call__(self, texts: str | Sequence[str], context_length: int | None = None) -> Tensor:
        """open_clip's calling convention: (B, context_length) ids, zero-padded; a caption is cut
        to ``context_length`` (by the truncation policy), as ``open_clip.tokenize`` cuts it."""
        texts = [texts] if isinstance(texts, str) else texts
        n = self.context_length if context_length is None else check_context_length(context_length)
        return self.batch_encode(texts, pad_to=n, context_length=n).ids

    def decode(self, ids: Tensor | Sequence[int], skip_special_tokens: bool = True) -> str:
        """Ids -> text (lower-cased, as the BPE stores it); padding is dropped. With
        ``skip_special_tokens`` the text ends before ``<end_of_text>`` and has no start token; without,
        both stay and only the padding after ``<end_of_text>`` goes (id 0 is also "!", a real token
        where no end token precedes it)."""
        if isinstance(ids, Tensor) and ids.dim() != 1:
            raise ValueError(f"decode takes one caption's ids (N,), got shape {tuple(ids.shape)}; use batch_decode")
        ids = checked_ids(ids, self.vocab_size)
        if self.eot_id in ids:
            end = ids.index(self.eot_id)
            if skip_special_tokens:
                ids = ids[:end]
            else:  # keep what follows the end token except trailing padding
                n = len(ids)
                while n > end + 1 and ids[n - 1] == self.pad_id:
                    n -= 1
                ids = ids[:n]
        if skip_special_tokens:
            ids = [i for i in ids if i not in (self.sot_id, self.eot_id)]
        return self._bpe.decode(ids).strip()

    def batch_decode(self, ids: Tensor | Sequence[Sequence[int]], skip_special_tokens: bool = True) -> list[str]:
        """Decode each row of a (B, N) batch, as `__call__` and `batch_encode` give them."""
        return [self.decode(row, skip_special_tokens=skip_special_tokens) for row in batch_rows(ids)]


def check_context_length(context_length: int) -> int:
    """A context holds at least the start token, one word and the end token."""
    return check_int("context_length", context_length, at_least=3, note="(start, one token, end)")
