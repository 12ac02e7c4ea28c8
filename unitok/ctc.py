"""CTC decoding in pure PyTorch: greedy (best path) and prefix beam search.

Both take per-frame log-probabilities ``log_probs`` (B, T, V) with the blank at id ``blank``
and the (B,) valid frame counts, and return one list of label ids per utterance (repeats
collapsed, blanks removed). No C++ decoder or language model is needed.

Axis legend: B batch, T frames, V labels (blank included).
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch
from torch import Tensor

NEG_INF = float("-inf")


def _check(log_probs: Tensor, lengths: Tensor | None, blank: int) -> Tensor:
    if log_probs.dim() != 3:
        raise ValueError(f"log_probs must be (batch, frames, labels), got shape {tuple(log_probs.shape)}")
    B, T, V = log_probs.shape
    if not 0 <= blank < V:
        raise ValueError(f"blank={blank} is not a label id in 0..{V - 1}")
    if lengths is None:
        return torch.full((B,), T, dtype=torch.long)
    lengths = torch.as_tensor(lengths).long().cpu()
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
                           blank: int = 0, prune: float | None = None) -> list[list[int]]:
    """CTC prefix beam search: the ``beam_size`` most likely label prefixes, each scored by the
    total probability of every alignment that collapses to it (split into paths ending in a
    blank and paths ending in the prefix's last label), in log space.

    Unlike greedy decoding, which follows the single best frame-by-frame path, this sums over
    alignments, so a label sequence spread over many moderately likely paths can win.
    ``prune``: skip labels whose log-probability at a frame is below it (None: keep all).
    """
    lengths = _check(log_probs, lengths, blank)
    if beam_size < 1:
        raise ValueError(f"beam_size must be ≥ 1, got {beam_size}")
    table = log_probs.detach().float().cpu()
    results = []
    for b in range(table.shape[0]):
        frames = table[b, : int(lengths[b])].tolist()
        # prefix -> (log P(prefix, ending in blank), log P(prefix, ending in its last label))
        beams: dict[tuple[int, ...], tuple[float, float]] = {(): (0.0, NEG_INF)}
        for row in frames:
            labels = range(len(row)) if prune is None else [v for v, p in enumerate(row) if p >= prune]
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
                        extended = nxt[prefix + (v,)]
                        extended[1] = _logaddexp(extended[1], p_blank + p)
                    else:
                        extended = nxt[prefix + (v,)]
                        extended[1] = _logaddexp(extended[1], p_total + p)
            ranked = sorted(nxt.items(), key=lambda kv: _logaddexp(*kv[1]), reverse=True)
            beams = {prefix: (probs[0], probs[1]) for prefix, probs in ranked[:beam_size]}
        best = max(beams.items(), key=lambda kv: _logaddexp(*kv[1]))[0]
        results.append(list(best))
    return results
