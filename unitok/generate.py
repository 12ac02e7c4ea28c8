"""Decoding: greedy, sampling (temperature / top-k / top-p) and beam search, all with a KV cache.

A model plugs in through the `Decoder` protocol: ``new_cache(capacity)`` and
``next_token_logits(new_ids, attention_mask, cache)``. Encoder–decoder models implement the
same two methods (their cache also holds the encoder's keys/values), so one loop serves all.

Axis legend: B batch, W beams, V vocabulary, S prompt length, T total length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

import torch
from torch import Tensor

from unitok.config import Config
from unitok.layers.kv_cache import KVCache

Strategy = Literal["greedy", "sample", "beam"]


class Decoder(Protocol):
    def new_cache(self, capacity: int) -> KVCache: ...

    def next_token_logits(self, new_ids: Tensor, attention_mask: Tensor | None, cache: KVCache) -> Tensor:
        """(B, n) new ids, (B, T) mask of cache + new (None: nothing padded) -> (B, V) logits
        after the last new id."""
        ...


@dataclass(frozen=True)
class GenerationConfig(Config):
    """How to decode. ``length_penalty`` divides a finished beam's log-probability by
    (generated length) ** length_penalty; ``early_stopping`` ends a beam search as soon as
    ``num_beams`` hypotheses are finished (the Hugging Face convention)."""

    max_new_tokens: int = 32
    strategy: Strategy = "greedy"
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    num_beams: int = 4
    length_penalty: float = 1.0
    early_stopping: bool = False
    eos_token_id: int | None = None
    pad_token_id: int | None = None

    def __post_init__(self) -> None:
        if self.strategy not in ("greedy", "sample", "beam"):
            raise ValueError(f"unknown strategy {self.strategy!r}; expected 'greedy', 'sample' or 'beam'")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be ≥ 1, got {self.max_new_tokens}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be ≥ 1, got {self.top_k}")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.num_beams < 1:
            raise ValueError(f"num_beams must be ≥ 1, got {self.num_beams}")


# --------------------------------------------------------------------------- logits filters
def filter_top_k(logits: Tensor, k: int) -> Tensor:
    """Keep the k largest logits of each row (ties with the k-th kept), the rest to -inf."""
    k = min(k, logits.shape[-1])
    threshold = logits.topk(k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < threshold, float("-inf"))


def filter_top_p(logits: Tensor, p: float) -> Tensor:
    """Nucleus filter: keep the smallest set of most likely tokens whose probability reaches p."""
    sorted_logits, order = logits.sort(dim=-1, descending=False)
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    drop_sorted = cumulative <= 1.0 - p  # the unlikely tail whose total mass is ≤ 1 - p
    drop_sorted[..., -1] = False  # always keep the most likely token
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def sample_next(logits: Tensor, cfg: GenerationConfig, generator: torch.Generator | None = None) -> Tensor:
    """(B, V) logits -> (B,) sampled ids after temperature, top-k and top-p."""
    logits = logits / cfg.temperature
    if cfg.top_k is not None:
        logits = filter_top_k(logits, cfg.top_k)
    if cfg.top_p is not None and cfg.top_p < 1.0:
        logits = filter_top_p(logits, cfg.top_p)
    return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator).squeeze(1)


# --------------------------------------------------------------------------- loops
def _check_prompt(input_ids: Tensor, attention_mask: Tensor | None) -> Tensor:
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be (batch, tokens), got shape {tuple(input_ids.shape)}")
    if input_ids.shape[1] == 0:
        raise ValueError("cannot generate from an empty prompt: give at least one token")
    if attention_mask is None:
        return torch.ones_like(input_ids)
    if attention_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask shape {tuple(attention_mask.shape)} != input_ids shape {tuple(input_ids.shape)}")
    if not bool(attention_mask[:, -1].all()):
        raise ValueError("batched generation needs left padding: the last prompt position is padding in some row")
    if not bool(attention_mask.any(dim=1).all()):
        raise ValueError("a prompt in the batch is empty (all padding)")
    return attention_mask.long()


@torch.no_grad()
def generate(
    model: Decoder, input_ids: Tensor, cfg: GenerationConfig, attention_mask: Tensor | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Continue each (left-padded) prompt; returns (B, S + new) ids, prompt included.

    Rows that reach EOS are filled with ``pad_token_id`` (default: EOS) until all rows end.
    """
    mask = _check_prompt(input_ids, attention_mask)
    if cfg.strategy == "beam":
        return _beam_search(model, input_ids, mask, cfg)
    pad = cfg.pad_token_id if cfg.pad_token_id is not None else cfg.eos_token_id
    B, S = input_ids.shape
    cache = model.new_cache(S + cfg.max_new_tokens)
    # Without padding the model needs no mask: no per-step concatenation, and the backbone
    # takes its fused causal / single-query path directly.
    step_mask: Tensor | None = None if bool(mask.all()) else mask
    ids = input_ids
    new = input_ids
    running = torch.ones(B, dtype=torch.bool, device=ids.device)
    for _ in range(cfg.max_new_tokens):
        logits = model.next_token_logits(new, step_mask, cache).float()
        if cfg.strategy == "greedy":
            token = logits.argmax(dim=-1)
        else:
            token = sample_next(logits, cfg, generator)
        if cfg.eos_token_id is not None:
            token = torch.where(running, token, torch.full_like(token, pad))
            running = running & (token != cfg.eos_token_id)
        ids = torch.cat([ids, token[:, None]], dim=1)
        if cfg.eos_token_id is not None and not bool(running.any()):
            break
        new = token[:, None]
        if step_mask is not None:
            step_mask = torch.cat([step_mask, step_mask.new_ones(B, 1)], dim=1)
    return ids


def _beam_search(model: Decoder, input_ids: Tensor, mask: Tensor, cfg: GenerationConfig) -> Tensor:
    """Beam search with the Hugging Face semantics, so outputs match theirs token for token.

    Each step takes the top 2W continuations over W beams × V tokens; those ending in EOS
    (or at the length limit) among the top W are scored logp / len ** length_penalty and
    offered to the pool of W finished hypotheses; the best W unfinished continue. A batch item
    stops when its pool is full and no running beam could still beat the pool's worst entry.
    """
    B, S = input_ids.shape
    W = cfg.num_beams
    eos = cfg.eos_token_id
    pad = cfg.pad_token_id if cfg.pad_token_id is not None else (eos if eos is not None else 0)
    max_len = S + cfg.max_new_tokens
    device = input_ids.device
    keep = 2 * W  # enough candidates that W stay unfinished even if W of them end in EOS
    neg = -1.0e9

    seqs = torch.full((B, W, max_len), pad, dtype=torch.long, device=device)
    seqs[:, :, :S] = input_ids[:, None, :]
    # Only beam 0 is live at first, so the first step does not pick W copies of one token.
    scores = torch.full((B, W), neg, device=device)
    scores[:, 0] = 0.0
    done_seqs = torch.full((B, W, max_len), pad, dtype=torch.long, device=device)
    done_scores = torch.full((B, W), neg, device=device)
    done_lens = torch.zeros((B, W), dtype=torch.long, device=device)
    done_flag = torch.zeros((B, W), dtype=torch.bool, device=device)
    open_ = torch.ones((B, 1), dtype=torch.bool, device=device)  # can this item still improve?

    cache = model.new_cache(max_len)
    flat_mask = mask.repeat_interleave(W, dim=0)  # (B·W, S)
    new = input_ids.repeat_interleave(W, dim=0)
    batch_base = (torch.arange(B, device=device) * W)[:, None]
    top_w = torch.arange(keep, device=device)[None, :] < W
    for cur in range(S, max_len):
        logits = model.next_token_logits(new, flat_mask, cache).float()  # (B·W, V)
        V = logits.shape[-1]
        logp = logits.log_softmax(dim=-1).view(B, W, V) + scores[:, :, None]
        cand_scores, cand_index = logp.view(B, W * V).topk(keep, dim=-1)  # (B, 2W)
        cand_beam, cand_token = cand_index // V, cand_index % V
        cand_seqs = seqs.gather(1, cand_beam[:, :, None].expand(-1, -1, max_len)).clone()
        cand_seqs[:, :, cur] = cand_token
        finished = torch.zeros_like(cand_token, dtype=torch.bool) if eos is None else cand_token == eos
        if cur + 1 >= max_len:
            finished = torch.ones_like(finished)

        # Running beams for the next step: the best W candidates that did not finish.
        running_scores = cand_scores + finished.float() * neg
        next_scores, pick = running_scores.topk(W, dim=-1)
        seqs = cand_seqs.gather(1, pick[:, :, None].expand(-1, -1, max_len))
        beam_origin = cand_beam.gather(1, pick)

        # Finished pool: offer the newly finished among the top W candidates.
        length = cur + 1 - S
        offered = cand_scores / (length ** cfg.length_penalty)
        pool_full = done_flag.all(dim=1, keepdim=True) & cfg.early_stopping
        offered = offered + (pool_full | ~open_).float() * neg
        newly = finished & top_w
        offered = offered + (~newly).float() * neg
        merged_scores = torch.cat([done_scores, offered], dim=1)
        merged_seqs = torch.cat([done_seqs, cand_seqs], dim=1)
        merged_lens = torch.cat([done_lens, torch.full_like(cand_token, cur + 1)], dim=1)
        merged_flag = torch.cat([done_flag, newly], dim=1)
        best = merged_scores.topk(W, dim=-1).indices
        done_scores = merged_scores.gather(1, best)
        done_seqs = merged_seqs.gather(1, best[:, :, None].expand(-1, -1, max_len))
        done_lens = merged_lens.gather(1, best)
        done_flag = merged_flag.gather(1, best)
        scores = next_scores

        # Could the best running beam still beat the worst finished hypothesis?
        best_running = scores[:, :1] / (max(length, 1) ** cfg.length_penalty)
        worst_done = torch.where(done_flag, done_scores.min(dim=1, keepdim=True).values, torch.full_like(done_scores, neg))
        open_ = open_ & (best_running > worst_done).any(dim=-1, keepdim=True)
        all_hit = bool(finished.all())
        if not bool(open_.any()) or (cfg.early_stopping and bool(done_flag.all())) or all_hit:
            break
        cache.reorder((beam_origin + batch_base).view(-1), cross=False)  # beams of one input share its encoder states
        new = seqs[:, :, cur].reshape(B * W, 1)
        flat_mask = torch.cat([flat_mask, flat_mask.new_ones(B * W, 1)], dim=1)
    # Like Hugging Face, crop to the longest returned hypothesis; shorter ones end in padding.
    return done_seqs[:, 0, : int(done_lens[:, 0].max())]
