"""CTC decoding in pure PyTorch: greedy (best path) and prefix beam search, optionally held to
a lexicon of words.

Both take per-frame log-probabilities ``log_probs`` (B, T, V) with the blank at id ``blank``
and the (B,) valid frame counts, and return one list of label ids per utterance (repeats
collapsed, blanks removed). No C++ decoder or language model is needed; `ctc_decode` picks
the decoder by name (what models, tasks and pipelines call).

Axis legend: B batch, T frames, V labels (blank included).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Literal

import torch
from torch import Tensor

from tokenizers_mm.checks import check_int

NEG_INF = float("-inf")
Decoder = Literal["greedy", "beam"]


class Lexicon:
    """The words a transcript may consist of, as label-id sequences, and the label between words
    (a space): beam search then extends a prefix only into a lexicon word, puts a delimiter only
    after a whole word, and returns a prefix that ends on a whole word (as lexicon-constrained
    decoders such as torchaudio's ``ctc_decoder(lexicon=...)`` do, without a language model).
    Characters the acoustic model half-hears ("foue") resolve to the likeliest word instead.
    """

    def __init__(self, words: Iterable[Sequence[int]], delimiter: int) -> None:
        entries = {tuple(int(i) for i in w) for w in words}
        if not entries:
            raise ValueError("a lexicon needs at least one word")
        bad = [w for w in entries if not w or delimiter in w]
        if bad:
            raise ValueError(f"lexicon words must be non-empty and free of the delimiter {delimiter}, got {bad[:3]}")
        self.words, self.delimiter = frozenset(entries), int(delimiter)
        self.starts = frozenset(w[:i] for w in entries for i in range(len(w) + 1))

    @classmethod
    def from_words(cls, words: Iterable[str], vocabulary, delimiter: str = " ") -> Lexicon:
        """Words as text, spelled with a `CharacterVocabulary`'s characters (an unknown one is an
        error naming it), separated in transcripts by ``delimiter``."""
        if isinstance(words, str):
            raise TypeError(f"lexicon must be a list of words (strings), got the string {words!r}")
        words = list(words)
        if not all(isinstance(w, str) for w in words):
            raise TypeError(f"lexicon must be a list of words (strings), got {words!r}")
        if not isinstance(delimiter, str) or len(delimiter) != 1:
            raise ValueError(f"delimiter must be one character of the vocabulary, got {delimiter!r}")
        spaced = [w for w in words if delimiter in w]
        if spaced:
            raise ValueError(f"lexicon words must not contain the delimiter {delimiter!r}, got {spaced[:3]}")
        return cls((vocabulary.encode(w).tolist() for w in words), int(vocabulary.encode(delimiter)[0]))

    def _partial(self, prefix: tuple[int, ...]) -> tuple[int, ...]:
        """The word being spelled at the end of ``prefix`` (after its last delimiter)."""
        i = len(prefix)
        while i > 0 and prefix[i - 1] != self.delimiter:
            i -= 1
        return prefix[i:]

    def allows(self, prefix: tuple[int, ...], label: int) -> bool:
        """Whether ``prefix`` may grow by ``label``: a delimiter after a whole word, else a letter
        that keeps the current word a lexicon word's start."""
        partial = self._partial(prefix)
        if label == self.delimiter:
            return partial in self.words
        return partial + (label,) in self.starts

    def complete(self, prefix: tuple[int, ...]) -> bool:
        """Whether ``prefix`` is empty or ends on a whole word."""
        return not prefix or self._partial(prefix) in self.words

    def whole_words(self, prefix: tuple[int, ...]) -> tuple[int, ...]:
        """``prefix`` without an unfinished word (and the delimiter before it) at its end."""
        if self.complete(prefix):
            return prefix
        cut = prefix[: len(prefix) - len(self._partial(prefix))]
        return cut[:-1] if cut and cut[-1] == self.delimiter else cut


def _check(log_probs: Tensor, lengths: Tensor | None, blank: int) -> Tensor:
    if log_probs.dim() != 3:
        raise ValueError(f"log_probs must be (batch, frames, labels), got shape {tuple(log_probs.shape)}")
    B, T, V = log_probs.shape
    if not 0 <= blank < V:
        raise ValueError(f"blank={blank} is not a label id in 0..{V - 1}")
    bad = int((~torch.isfinite(log_probs) & (log_probs != NEG_INF)).sum())  # -inf: a label ruled out
    if bad:
        raise ValueError(f"log_probs contain {bad} NaN / +inf values")
    if lengths is None:
        return torch.full((B,), T, dtype=torch.long)
    given = torch.as_tensor(lengths).cpu()
    if given.is_floating_point() and not bool((given == given.round()).all()):
        raise ValueError(f"lengths must be whole frame counts, got {given.tolist()}")
    lengths = given.long()
    if lengths.shape != (B,) or bool((lengths < 0).any()) or bool((lengths > T).any()):
        raise ValueError(f"lengths must be (batch,) values in [0, {T}], got {lengths.tolist()}")
    return lengths


def ctc_greedy_decode(log_probs: Tensor, lengths: Tensor | None = None, blank: int = 0) -> list[list[int]]:
    """Best path: the most likely label per frame, repeats collapsed, blanks dropped."""
    lengths = _check(log_probs, lengths, blank)
    best = log_probs.argmax(dim=-1).cpu()  # (B, T)
    paths = []
    for row, n in zip(best.tolist(), lengths.tolist()):
        path, previous = [], None
        for label in row[:n]:
            if label != previous and label != blank:
                path.append(label)
            previous = label
        paths.append(path)
    return paths


def _logaddexp(a: float, b: float) -> float:
    if a == NEG_INF:
        return b
    if b == NEG_INF:
        return a
    hi, lo = (a, b) if a > b else (b, a)
    return hi + math.log1p(math.exp(lo - hi))


def ctc_prefix_beam_search(log_probs: Tensor, lengths: Tensor | None = None, beam_size: int = 8,
                           blank: int = 0, prune: float | None = None,
                           lexicon: Lexicon | None = None) -> list[list[int]]:
    """CTC prefix beam search: the ``beam_size`` most likely label prefixes, each scored by the
    total probability of every alignment that collapses to it (split into paths ending in a
    blank and paths ending in the prefix's last label), in log space.

    Unlike greedy decoding, which follows the single best frame-by-frame path, this sums over
    alignments, so a label sequence spread over many moderately likely paths can win.
    ``prune``: skip labels whose log-probability at a frame is below it (None: keep all).
    ``lexicon``: grow prefixes only into its words and return the likeliest prefix that ends on
    a whole word (if no beam does, the likeliest one's whole words).
    """
    lengths = _check(log_probs, lengths, blank)
    check_int("beam_size", beam_size)
    if prune is not None and not (math.isfinite(prune) and prune <= 0):
        raise ValueError(f"prune must be a finite log-probability ≤ 0 (or None), got {prune}")
    V = log_probs.shape[-1]
    if lexicon is not None:
        ids = {i for w in lexicon.words for i in w} | {lexicon.delimiter}
        bad_ids = sorted(i for i in ids if not 0 <= i < V or i == blank)
        if bad_ids:
            raise ValueError(f"the lexicon spells with ids {bad_ids}, which are the blank ({blank}) or outside the "
                             f"model's {V} labels")
    table = log_probs.detach().float().cpu()
    results = []
    for b in range(table.shape[0]):
        frames = table[b, : int(lengths[b])].tolist()
        # prefix -> (log P(prefix, ending in blank), log P(prefix, ending in its last label))
        beams: dict[tuple[int, ...], tuple[float, float]] = {(): (0.0, NEG_INF)}
        for row in frames:
            # a frame keeps its best label whatever the threshold: a prefix always has somewhere to go
            labels = (range(len(row)) if prune is None else
                      [v for v, p in enumerate(row) if p >= prune] or [max(range(len(row)), key=row.__getitem__)])
            nxt: dict[tuple[int, ...], list[float]] = defaultdict(lambda: [NEG_INF, NEG_INF])
            for prefix, (p_blank, p_label) in beams.items():
                p_total = _logaddexp(p_blank, p_label)
                last = prefix[-1] if prefix else None
                for v in labels:
                    p = row[v]
                    if v == blank:  # the prefix is unchanged and now ends in a blank
                        entry = nxt[prefix]
                        entry[0] = _logaddexp(entry[0], p_total + p)
                    elif v == last:
                        # A repeat without a blank between collapses into the same prefix;
                        # after a blank it is a new occurrence of the label.
                        entry = nxt[prefix]
                        entry[1] = _logaddexp(entry[1], p_label + p)
                        if lexicon is None or lexicon.allows(prefix, v):
                            extended = nxt[prefix + (v,)]
                            extended[1] = _logaddexp(extended[1], p_blank + p)
                    elif lexicon is None or lexicon.allows(prefix, v):
                        extended = nxt[prefix + (v,)]
                        extended[1] = _logaddexp(extended[1], p_total + p)
            ranked = sorted(nxt.items(), key=lambda kv: _logaddexp(*kv[1]), reverse=True)
            beams = {prefix: (probs[0], probs[1]) for prefix, probs in ranked[:beam_size]}
        finished = [kv for kv in beams.items() if lexicon is None or lexicon.complete(kv[0])]
        best = max(finished or beams.items(), key=lambda kv: _logaddexp(*kv[1]))[0]
        results.append(list(best if lexicon is None else lexicon.whole_words(best)))
    return results


def check_decoder(decoder: str, lexicon: object | None = None) -> None:
    """Refuse an unknown decoder, or a lexicon (words or a `Lexicon`) without beam search —
    before any audio is read."""
    if decoder not in ("greedy", "beam"):
        raise ValueError(f"decoder must be 'greedy' or 'beam', got {decoder!r}")
    if lexicon is not None and decoder != "beam":
        raise ValueError(f"a lexicon needs decoder='beam' (greedy decoding follows the best frame path), "
                         f"got decoder={decoder!r}")


def ctc_decode(log_probs: Tensor, lengths: Tensor | None = None, decoder: Decoder = "greedy", beam_size: int = 8,
               lexicon: Lexicon | None = None, blank: int = 0) -> list[list[int]]:
    """Decode by name: "greedy" (`ctc_greedy_decode`) or "beam" (`ctc_prefix_beam_search`,
    with ``beam_size`` and an optional ``lexicon``, which greedy decoding cannot follow)."""
    check_decoder(decoder, lexicon)
    if decoder == "greedy":
        return ctc_greedy_decode(log_probs, lengths, blank)
    return ctc_prefix_beam_search(log_probs, lengths, beam_size=beam_size, blank=blank, lexicon=lexicon)
