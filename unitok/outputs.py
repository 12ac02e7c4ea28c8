"""Typed model outputs: the same shape of answer every time, optional fields None when not asked."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from unitok.layers.kv_cache import KVCache


@dataclass
class BackboneOutput:
    """``last_hidden_state`` (B, N, D); ``hidden_states``: embeddings, then each block's output
    (the last one after the final norm, as Hugging Face counts them), L + 1 in all;
    ``attentions``: one (B, H, N, T) weight tensor per attention sublayer; ``attention_mask``
    (B, N) of the states, set by encoders whose input length changes (subsampled audio)."""

    last_hidden_state: Tensor
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None
    cache: KVCache | None = None
    attention_mask: Tensor | None = None


@dataclass
class CausalLMOutput:
    """``logits`` (B, N, V) for the next token at every position (None when the forward was asked
    not to return them), plus what the backbone returned;
    ``loss`` the mean next-token cross-entropy when ``labels`` were given (else None);
    ``class_logits`` (B, K) of a sequence-classification head, when the model has one."""

    logits: Tensor | None
    last_hidden_state: Tensor
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None
    cache: KVCache | None = None
    loss: Tensor | None = None
    class_logits: Tensor | None = None


@dataclass
class ImageClassifierOutput:
    """``logits`` (B, K); ``pooled`` (B, D) features the head read; ``last_hidden_state``
    (B, prefix + N, D); ``grid`` the (rows, columns) of patches. Distilled models also give
    ``logits_cls`` and ``logits_dist`` (``logits`` is their average). ``loss``: the
    cross-entropy against ``labels`` when they were given (else None)."""

    logits: Tensor | None
    pooled: Tensor
    last_hidden_state: Tensor
    grid: tuple[int, int]
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None
    logits_cls: Tensor | None = None
    logits_dist: Tensor | None = None
    loss: Tensor | None = None


@dataclass
class CLIPOutput:
    """``image_embeds`` (B_i, E) and ``text_embeds`` (B_t, E), L2-normalised; ``logits_per_image``
    (B_i, B_t) = exp(logit_scale)·cosine similarity, ``logits_per_text`` its transpose;
    ``logit_scale`` the (unclamped) exponent of the temperature."""

    image_embeds: Tensor
    text_embeds: Tensor
    logits_per_image: Tensor
    logits_per_text: Tensor
    logit_scale: Tensor


@dataclass
class Seq2SeqLMOutput:
    """Encoder–decoder output: ``logits`` (B, N_dec, V) for the next target token at every decoder
    position (None when the forward was asked not to return them); the encoder's and decoder's
    last states; the KV cache when decoding incrementally; ``loss`` the mean cross-entropy
    against ``labels`` when they were given (else None)."""

    logits: Tensor | None
    encoder_last_hidden_state: Tensor
    decoder_last_hidden_state: Tensor
    encoder_hidden_states: tuple[Tensor, ...] | None = None
    decoder_hidden_states: tuple[Tensor, ...] | None = None
    cache: KVCache | None = None
    loss: Tensor | None = None


@dataclass
class CTCOutput:
    """``logits`` (B, N', V) per output frame (blank = 0; None without a head), ``lengths`` (B,)
    valid output frames, ``last_hidden_state`` (B, N', D); ``loss`` the CTC loss against
    ``labels`` when they were given (else None)."""

    logits: Tensor | None
    lengths: Tensor
    last_hidden_state: Tensor
    hidden_states: tuple[Tensor, ...] | None = None
    loss: Tensor | None = None
