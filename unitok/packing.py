"""Packing named segments of different modalities into one sequence with one attention mask.

A batch of a multimodal model is a mapping ``name -> tokens``; each segment is embedded on its
own (B, n_s, D) and the segments are concatenated in the mapping's order. Who may attend to
whom (MULTIMODAL.md, decision 2):

* inside a segment: every real token of a bidirectional segment; the tokens up to itself in a
  causal (autoregressive) segment;
* an earlier segment: all of it (it is complete before this one starts: prefix-LM);
* a later segment: only within a run of adjacent bidirectional segments (image then audio see
  each other). Nothing reads across a causal segment into the future: were a bidirectional
  segment before a causal one to read one after it, which reads the causal one in full, the
  causal tokens would see their own future through it in the next layer.

Padding keys are never visible. The mask is built once per batch; where it reduces to "see
everything" or to plain causal attention over the whole sequence with nothing padded, no mask
is built and the fused attention kernel keeps its fast path.

Axis legend: B batch, N packed tokens, n_s tokens of segment s, D width.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Segment:
    """One embedded segment: (B, n, D) ``embeddings``, (B, n) boolean ``mask`` (True: real
    token), and whether it is ``causal``."""

    name: str
    embeddings: Tensor
    mask: Tensor
    causal: bool = False


@dataclass(frozen=True)
class SegmentSpan:
    """Where a segment lies in the packed sequence: positions ``start`` … ``stop`` − 1, its
    (B, n) boolean ``mask`` and whether it is causal."""

    name: str
    start: int
    stop: int
    mask: Tensor
    causal: bool

    @property
    def length(self) -> int:
        return self.stop - self.start

    def select(self, hidden: Tensor) -> Tensor:
        """(B, N, …) packed states -> (B, n, …) this segment's."""
        return hidden[:, self.start:self.stop]


@dataclass(frozen=True)
class PackedSequence:
    """The backbone's input: (B, N, D) ``embeddings``; (B, N) long ``attention_mask`` (1 real,
    0 padding), None when nothing is padded; ``mask`` the (B, 1, N, N) boolean attention mask,
    None when attention is plain (then ``is_causal`` says which plain kind); ``spans`` by name."""

    embeddings: Tensor
    attention_mask: Tensor | None
    mask: Tensor | None
    is_causal: bool
    spans: dict[str, SegmentSpan]


def pack_segments(segments: Sequence[Segment]) -> PackedSequence:
    """Concatenate segments (in order) and build the one mask that composes them."""
    if not segments:
        raise ValueError("nothing to pack: give at least one segment")
    batch = {s.name: s.embeddings.shape[0] for s in segments}
    if len(set(batch.values())) != 1:
        raise ValueError(f"every segment needs the same batch size, got {batch}")
    names = [s.name for s in segments]
    if len(set(names)) != len(names):
        raise ValueError(f"segment names repeat: {names}")
    spans, start = {}, 0
    for s in segments:
        n = s.embeddings.shape[1]
        if tuple(s.mask.shape) != tuple(s.embeddings.shape[:2]):
            raise ValueError(f"segment {s.name!r}: mask {tuple(s.mask.shape)} does not match its tokens "
                             f"{tuple(s.embeddings.shape[:2])}")
        spans[s.name] = SegmentSpan(s.name, start, start + n, s.mask.bool(), s.causal)
        start += n
    x = torch.cat([s.embeddings for s in segments], dim=1) if len(segments) > 1 else segments[0].embeddings
    real = torch.cat([span.mask for span in spans.values()], dim=1)  # (B, N)
    padded = not bool(real.all())
    attention_mask = real.long() if padded else None
    causal = [s.causal for s in segments]
    if not padded and not any(causal):
        return PackedSequence(x, None, None, False, spans)
    if not padded and all(causal):
        # Every segment causal: "earlier segments fully, own causally" is causal over the whole.
        return PackedSequence(x, None, None, True, spans)
    return PackedSequence(x, attention_mask, segment_attention_mask(list(spans.values()), real), False, spans)


def segment_attention_mask(spans: Sequence[SegmentSpan], real: Tensor) -> Tensor:
    """(B, 1, N, N) boolean: query i may attend to key j (see the module docstring); padding
    keys hidden, and every query sees at least itself (a padding query's output is unused but
    must not be NaN)."""
    device = real.device
    runs, run, previous_causal = [], 0, True
    for s in spans:  # a run: adjacent bidirectional segments; each causal segment is a run of its own
        run += int(s.causal or previous_causal)
        runs.append(run)
        previous_causal = s.causal
    per_token = lambda values: torch.cat([torch.full((s.length,), v, device=device)  # noqa: E731
                                          for s, v in zip(spans, values)])
    segment, run_of, causal = per_token(range(len(spans))), per_token(runs), per_token([s.causal for s in spans])
    N = segment.numel()
    position = torch.arange(N, device=device)
    within = (segment[:, None] == segment[None, :]) & (~causal[:, None] | (position[None, :] <= position[:, None]))
    earlier = segment[None, :] < segment[:, None]
    same_run = (run_of[:, None] == run_of[None, :]) & ~causal[:, None]  # later segments of the same bidirectional run
    structure = within | earlier | same_run  # (N, N)
    mask = structure[None] & real[:, None, :]  # (B, N, N): hide padding keys
    mask = mask | torch.eye(N, dtype=torch.bool, device=device)[None]
    return mask[:, None]
