"""T5's span corruption: drop random spans of a token sequence, mark each with a sentinel,
and ask the decoder for the dropped spans.

The lectures' example, with the words as tokens and noise on "for inviting" and "last"::

    original  Thank you for inviting me to your party last week.
    inputs    Thank you <X> me to your party <Y> week.
    targets   <X> for inviting <Y> last <Z>

Sentinels are the tokenizer's special tokens ``<extra_id_0>``, ``<extra_id_1>``, … (T5's
names; ``<X>``, ``<Y>``, ``<Z>`` above). The noise mask follows T5's
``random_spans_noise_mask``: ``round(density · L)`` noise tokens in
``round(noise / mean_span_length)`` spans whose lengths come from a random segmentation.

Axis legend: B batch, N tokens (raw window), I input tokens, T target tokens.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any, TypeVar

import numpy as np
import torch
from torch import Tensor

from tokenizers_mm import BPETokenizer, collate

IGNORE = -100
SENTINEL_FORMAT = "<extra_id_{}>"

T = TypeVar("T", bound=Hashable)


def sentinel_tokens(n: int) -> list[str]:
    """T5's sentinel names ``<extra_id_0>`` … ``<extra_id_{n-1}>``, to add as special tokens."""
    if n < 1:
        raise ValueError(f"need at least one sentinel token, got n={n}")
    return [SENTINEL_FORMAT.format(i) for i in range(n)]


def sentinel_ids(tokenizer: BPETokenizer) -> list[int]:
    """Ids of ``<extra_id_0>``, ``<extra_id_1>``, … in order, as many as the tokenizer has."""
    ids: list[int] = []
    while True:
        token = SENTINEL_FORMAT.format(len(ids))
        try:
            ids.append(tokenizer.token_to_id(token))
        except KeyError:
            break
    if not ids:
        raise ValueError(
            f"the tokenizer has no sentinel tokens ({SENTINEL_FORMAT.format(0)}, {SENTINEL_FORMAT.format(1)}, …); "
            "train it with special_tokens=(..., *sentinel_tokens(100)) — SpanCorruptionDataModule does"
        )
    return ids


def check_noise_rates(noise_density: float, mean_noise_span_length: float) -> None:
    """Refuse a noise density outside (0, 1) or a mean span length below 1."""
    if not 0.0 < noise_density < 1.0:
        raise ValueError(f"noise_density must be in (0, 1), got {noise_density}")
    if mean_noise_span_length < 1.0:
        raise ValueError(f"mean_noise_span_length must be ≥ 1, got {mean_noise_span_length}")


def noise_span_counts(length: int, noise_density: float = 0.15,
                      mean_noise_span_length: float = 3.0) -> tuple[int, int]:
    """(noise tokens, noise spans) for a sequence of ``length`` tokens, as T5 counts them:
    ``round(density · length)`` noise tokens (at least 1, at most length − 1) in
    ``round(noise / mean_span_length)`` spans (at least 1)."""
    check_noise_rates(noise_density, mean_noise_span_length)
    if length < 2:
        raise ValueError(f"a sequence of {length} token(s) is too short for span corruption: "
                         "need at least 2 (one noise and one kept token)")
    num_noise = min(max(int(round(length * noise_density)), 1), length - 1)
    # Each noise span needs a kept span between it and the next, hence the min (as in T5).
    num_spans = max(int(round(min(num_noise, length - num_noise) / mean_noise_span_length)), 1)
    return num_noise, num_spans


def _random_segmentation(num_items: int, num_segments: int, rng: np.random.Generator) -> np.ndarray:
    """Split ``num_items`` into ``num_segments`` non-empty parts, uniformly at random."""
    first_in_segment = np.zeros(num_items, dtype=bool)
    cuts = rng.choice(num_items - 1, size=num_segments - 1, replace=False) + 1
    first_in_segment[cuts] = True
    segment_id = np.cumsum(first_in_segment)
    return np.bincount(segment_id, minlength=num_segments)


def random_spans_noise_mask(
    length: int,
    noise_density: float = 0.15,
    mean_noise_span_length: float = 3.0,
    rng: np.random.Generator | None = None,
    random_roll: bool = True,
) -> np.ndarray:
    """A (length,) bool mask, True on noise tokens, in spans (see `noise_span_counts`).

    Kept and noise spans alternate, starting with a kept span, as in T5. T5's default then
    always ends on a noise span; ``random_roll`` (T5's option, on here) rotates the mask by a
    random offset so spans fall anywhere — a span may then wrap around into two pieces.
    """
    rng = rng if rng is not None else np.random.default_rng()
    num_noise, num_spans = noise_span_counts(length, noise_density, mean_noise_span_length)
    noise_lengths = _random_segmentation(num_noise, num_spans, rng)
    kept_lengths = _random_segmentation(length - num_noise, num_spans, rng)
    interleaved = np.stack([kept_lengths, noise_lengths], axis=1).reshape(-1)  # kept, noise, kept, …
    span_starts = np.cumsum(interleaved)[:-1]
    start_indicator = np.zeros(length, dtype=np.int64)
    start_indicator[span_starts] = 1
    mask = np.cumsum(start_indicator) % 2 == 1
    if random_roll:
        mask = np.roll(mask, int(rng.integers(length)))
    return mask


def span_corrupt(
    tokens: Sequence[T],
    noise_mask: Sequence[bool] | np.ndarray,
    sentinels: Sequence[T],
    eos: T | None = None,
) -> tuple[list[T], list[T]]:
    """(inputs, targets): each noise span replaced by the next sentinel in ``inputs``;
    ``targets`` = sentinel + span for every span, then one more sentinel, as in the lectures.
    ``eos`` (when given) ends both. Works on ids or on any tokens (words in the tests)."""
    if len(tokens) != len(noise_mask):
        raise ValueError(f"{len(tokens)} tokens but a noise mask of {len(noise_mask)}; give one flag per token")
    inputs: list[T] = []
    targets: list[T] = []
    span = -1
    previous = False
    for token, noisy in zip(tokens, noise_mask):
        noisy = bool(noisy)
        if noisy and not previous:
            span += 1
            if span + 1 >= len(sentinels):  # this span's sentinel and the final one
                raise ValueError(
                    f"the noise mask has at least {span + 1} spans, which with the closing sentinel need "
                    f"{span + 2} sentinels, but only {len(sentinels)} were given — add sentinel tokens or "
                    "shorten the sequence"
                )
            inputs.append(sentinels[span])
            targets.append(sentinels[span])
        (targets if noisy else inputs).append(token)
        previous = noisy
    targets.append(sentinels[span + 1])
    if eos is not None:
        inputs.append(eos)
        targets.append(eos)
    return inputs, targets


def restore_spans(
    inputs: Sequence[T], targets: Sequence[T], sentinels: Sequence[T], eos: T | None = None
) -> list[T]:
    """Undo `span_corrupt`: put each sentinel's span from ``targets`` back into ``inputs``."""
    def strip(seq: Sequence[T]) -> list[T]:
        seq = list(seq)
        return seq[:-1] if eos is not None and seq and seq[-1] == eos else seq

    index = {s: i for i, s in enumerate(sentinels)}
    spans: dict[int, list[T]] = {}
    current: int | None = None
    for token in strip(targets):
        if token in index:
            current = index[token]
            spans[current] = []
        elif current is None:
            raise ValueError(f"targets must start with a sentinel, got {token!r}")
        else:
            spans[current].append(token)
    restored: list[T] = []
    for token in strip(inputs):
        if token in index:
            if index[token] not in spans:
                raise ValueError(f"sentinel {token!r} is in the inputs but not in the targets")
            restored.extend(spans[index[token]])
        else:
            restored.append(token)
    return restored


class SpanCorruptionCollator:
    """Span-corrupts raw token windows and pads them into a batch.

    Items are ``{"input_ids": (N,) ids}`` (as `TokenWindows` yields) or bare id sequences.
    Returns ``input_ids`` (B, I) and ``attention_mask`` (B, I), padded with ``pad_id``, and
    ``labels`` (B, T) padded with -100. With ``seed`` the masks depend only on each window's
    content (validation); without, on torch's random state (seeded per data-loader worker).
    Picklable (data-loader workers).

    Args:
        sentinel_ids: ids of ``<extra_id_0>``, ``<extra_id_1>``, … (see `sentinel_ids`).
        eos_id / pad_id: end-of-sequence (appended to inputs and targets) and padding ids.
        noise_density / mean_noise_span_length: T5's 0.15 and 3 by default.
    """

    def __init__(self, sentinel_ids: Sequence[int], eos_id: int, pad_id: int, noise_density: float = 0.15,
                 mean_noise_span_length: float = 3.0, random_roll: bool = True, seed: int | None = None) -> None:
        check_noise_rates(noise_density, mean_noise_span_length)
        if len(sentinel_ids) < 2:
            raise ValueError(f"span corruption needs at least 2 sentinel ids (one span and the closing one), "
                             f"got {list(sentinel_ids)}")
        self.sentinel_ids = [int(i) for i in sentinel_ids]
        self.eos_id, self.pad_id = int(eos_id), int(pad_id)
        self.noise_density, self.mean_noise_span_length = noise_density, mean_noise_span_length
        self.random_roll, self.seed = random_roll, seed

    @classmethod
    def from_tokenizer(cls, tokenizer: BPETokenizer, **options: Any) -> SpanCorruptionCollator:
        """A collator using the tokenizer's sentinels, EOS and padding tokens."""
        return cls(sentinel_ids(tokenizer), tokenizer.eos_id, tokenizer.pad_id, **options)

    def corrupt(self, ids: Sequence[int], rng: np.random.Generator) -> tuple[list[int], list[int]]:
        """(input ids, target ids) of one window, both ending with EOS."""
        mask = random_spans_noise_mask(len(ids), self.noise_density, self.mean_noise_span_length, rng,
                                       self.random_roll)
        return span_corrupt(list(ids), mask, self.sentinel_ids, self.eos_id)

    def __call__(self, items: Sequence[dict[str, Any] | Sequence[int] | Tensor]) -> dict[str, Tensor]:
        if len(items) == 0:
            raise ValueError("SpanCorruptionCollator got an empty batch")
        inputs, targets = [], []
        for i, item in enumerate(items):
            ids = item["input_ids"] if isinstance(item, dict) else item
            ids = ids.tolist() if isinstance(ids, Tensor) else [int(x) for x in ids]
            if self.seed is not None:  # the same window is always corrupted the same way
                content = sum((k + 1) * x for k, x in enumerate(ids))
                rng = np.random.default_rng([self.seed, content % (2**63), len(ids)])
            else:
                rng = np.random.default_rng(int(torch.randint(0, 2**62, ())))
            try:
                source, target = self.corrupt(ids, rng)
            except ValueError as err:
                raise ValueError(f"item {i}: {err}") from None
            inputs.append(source)
            targets.append(target)
        enc = collate(inputs, pad_id=self.pad_id)
        dec = collate(targets, pad_id=self.pad_id)
        labels = dec.ids.masked_fill(dec.attention_mask == 0, IGNORE)  # type: ignore[union-attr]
        return {"input_ids": enc.ids, "attention_mask": enc.attention_mask, "labels": labels}  # type: ignore[dict-item]
