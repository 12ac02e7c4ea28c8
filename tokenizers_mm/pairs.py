"""Sentence-pair inputs for BERT-style encoders, shared by every text tokenizer:
``[CLS] A [SEP] B [SEP]`` with segment ids 0 for A (and its markers) and 1 for B, plus the
truncation strategies that make a pair fit a maximum length.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, TypeVar

import torch
from torch import Tensor

from tokenizers_mm.checks import check_int
from tokenizers_mm.tokens import Tokens

Truncation = Literal["off", "longest_first", "only_first", "only_second"]
TRUNCATIONS = ("off", "longest_first", "only_first", "only_second")
T = TypeVar("T")


def resolve_truncation(truncation: Truncation | bool) -> Truncation:
    """``True`` means "longest_first", ``False`` means "off"; strings are checked."""
    if truncation is True:
        return "longest_first"
    if truncation is False:
        return "off"
    if truncation not in TRUNCATIONS:
        raise ValueError(f"truncation={truncation!r}: expected one of {TRUNCATIONS} (or True / False)")
    return truncation


def special_count(pair: bool) -> int:
    """Markers added around one sequence ([CLS] A [SEP]) or a pair ([CLS] A [SEP] B [SEP])."""
    return 3 if pair else 2


def pair_lengths(n_first: int, n_second: int | None, budget: int, truncation: Truncation | bool) -> tuple[int, int]:
    """How many tokens of A and of B to keep so that they fit ``budget`` (special tokens excluded).

    "longest_first" trims the longer sequence until both fit (ties leave B one token more,
    as the `tokenizers` library does); "only_first" / "only_second" trim one side only;
    "off" refuses. Raises ``ValueError`` naming the lengths when the pair cannot fit.
    """
    strategy = resolve_truncation(truncation)
    second = n_second or 0
    if budget < 0:
        raise ValueError(f"max_length leaves no room for the special tokens (budget {budget})")
    if n_first + second <= budget:
        return n_first, second
    what = f"{n_first} + {second} tokens" if n_second is not None else f"{n_first} tokens"
    if strategy == "off":
        raise ValueError(f"input of {what} does not fit max_length (room for {budget} besides the special "
                         "tokens) and truncation is off; pass truncation='longest_first', 'only_first' or "
                         "'only_second', or a larger max_length")
    if strategy == "only_second" and n_second is None:
        raise ValueError("truncation='only_second' needs a sentence pair; this input is a single sequence")
    if strategy == "only_first" or n_second is None:
        if second >= budget:  # the trimmed side keeps at least one token (as `tokenizers` does)
            raise ValueError(f"cannot fit {what} into {budget} by trimming the first sequence: "
                             f"the second alone has {second}")
        return budget - second, second
    if strategy == "only_second":
        if n_first >= budget:
            raise ValueError(f"cannot fit {what} into {budget} by trimming the second sequence: "
                             f"the first alone has {n_first}")
        return n_first, budget - n_first
    # longest_first: the shorter side keeps everything if it fits in half the budget.
    short, long_ = sorted((n_first, second))
    if short <= budget // 2:
        keep_short, keep_long = short, budget - short
    else:
        keep_short, keep_long = budget // 2, budget - budget // 2
    if n_first <= second:
        return keep_short, keep_long
    return keep_long, keep_short


def join_pair(first: Sequence[T], second: Sequence[T] | None, cls: T, sep: T) -> tuple[list[T], list[int]]:
    """``[cls] first [sep] (second [sep])`` and the matching segment ids."""
    items = [cls, *first, sep]
    segments = [0] * len(items)
    if second is not None:
        items += [*second, sep]
        segments += [1] * (len(second) + 1)
    return items, segments


def encode_pair_ids(
    first: Sequence[int], second: Sequence[int] | None, cls_id: int, sep_id: int,
    max_length: int | None = None, truncation: Truncation | bool = "off",
) -> tuple[list[int], list[int]]:
    """Token ids of A (and B) -> (ids, segment ids) of ``[CLS] A [SEP] (B [SEP])``, truncated
    to ``max_length`` (special tokens included) by ``truncation``."""
    check_int("max_length", max_length, or_none=True)  # True is no budget of 1, 2.5 no slice end
    if max_length is not None:
        budget = max_length - special_count(second is not None)
        n_a, n_b = pair_lengths(len(first), None if second is None else len(second), budget, truncation)
        first = first[:n_a]
        second = None if second is None else second[:n_b]
    else:
        resolve_truncation(truncation)
    return join_pair(list(first), None if second is None else list(second), cls_id, sep_id)


def pad_pairs(rows: Sequence[tuple[Sequence[int], Sequence[int]]], pad_id: int,
              padding_side: str = "right", pad_to: int | None = None) -> Tokens:
    """(ids, segment ids) rows -> one `Tokens` batch with padding mask and segments."""
    if padding_side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
    if not rows:
        raise ValueError("pad_pairs needs at least one row, got none")
    check_int("pad_to", pad_to, or_none=True)
    longest = max(len(ids) for ids, _ in rows)
    if pad_to is not None:
        if pad_to < longest:
            raise ValueError(f"pad_to={pad_to} is shorter than the longest row ({longest} tokens)")
        longest = pad_to
    B = len(rows)
    ids = torch.full((B, longest), pad_id, dtype=torch.long)
    segments = torch.zeros((B, longest), dtype=torch.long)
    mask = torch.zeros((B, longest), dtype=torch.long)
    for i, (row, seg) in enumerate(rows):
        n = len(row)
        span = slice(0, n) if padding_side == "right" else slice(longest - n, longest)
        ids[i, span] = torch.as_tensor(row, dtype=torch.long)
        segments[i, span] = torch.as_tensor(seg, dtype=torch.long)
        mask[i, span] = 1
    return Tokens(ids=ids, attention_mask=mask, segments=segments, modality="text")


def as_tensor_row(values: Sequence[int]) -> Tensor:
    return torch.tensor(list(values), dtype=torch.long)
