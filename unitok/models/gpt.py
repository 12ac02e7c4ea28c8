"""GPT: token + position embedding -> causal backbone -> tied LM head (and, for fine-tuning
as GPT-1 did, a classifier on the last real token's state).

Axis legend: B batch, N new tokens, T tokens seen (cache + new), D width, V vocabulary, K labels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn

from tokenizers_mm import Tokens
from tokenizers_mm.checks import check_int
from unitok.backbone import Backbone, BackboneConfig, init_weights
from unitok.checks import deferred_checks
from unitok.compile import loss_backend
from unitok.config import Config
from unitok.embed import TokenEmbedding, make_positions, positions_from_mask
from unitok.generate import GenerationConfig, check_prompt_tensors, generate
from unitok.heads import ClassificationHead, pool_tokens
from unitok.layers.activations import Activation
from unitok.layers.attention import Kernel
from unitok.layers.decode_layout import head_logits
from unitok.layers.fused_linear import linear
from unitok.layers.kv_cache import KVCache, StaticKVCache, static_capacity
from unitok.losses import causal_lm_loss, linear_cross_entropy
from unitok.models.base import PretrainedModel
from unitok.outputs import CausalLMOutput


@dataclass(frozen=True)
class GPTConfig(Config):
    """A decoder-only language model.

    Args:
        vocab_size: V. context_length: the most positions one sequence may have.
        d_model / n_layers / n_heads / d_ff: the backbone's shape (d_ff defaults to 4·D).
        activation, norm_eps, bias: as in `BackboneConfig`.
        dropout: on embeddings, residual branches and attention weights.
        positions: "learned" (GPT-2) or "sinusoidal" (the original Transformer).
        tie_embeddings: the LM head reuses the token embedding matrix.
        eos_token_id / pad_token_id: defaults for generation.
        num_labels: K > 0 adds a sequence-classification head on the last real token's state
            (GPT-1's fine-tuning: that token has read the whole text); 0: none.
    """

    vocab_size: int = 50257
    context_length: int = 1024
    d_model: int = 768
    n_layers: int = 12
    n_heads: int = 12
    d_ff: int | None = None
    activation: Activation = "gelu_tanh"
    norm_eps: float = 1e-5
    bias: bool = True
    dropout: float = 0.0
    positions: Literal["learned", "sinusoidal"] = "learned"
    tie_embeddings: bool = True
    eos_token_id: int | None = None
    pad_token_id: int | None = None
    num_labels: int = 0

    presets = {
        # The four GPT-2 sizes (Radford et al., 2019), with GPT-2's tokenizer size and EOS id.
        "gpt2-small": dict(d_model=768, n_layers=12, n_heads=12, eos_token_id=50256),
        "gpt2-medium": dict(d_model=1024, n_layers=24, n_heads=16, eos_token_id=50256),
        "gpt2-large": dict(d_model=1280, n_layers=36, n_heads=20, eos_token_id=50256),
        "gpt2-xl": dict(d_model=1600, n_layers=48, n_heads=25, eos_token_id=50256),
        # Small models that train on a laptop CPU (vocabulary and context set by the data).
        "gpt-nano": dict(vocab_size=4096, context_length=128, d_model=64, n_layers=2, n_heads=2),
        "gpt-micro": dict(vocab_size=4096, context_length=128, d_model=128, n_layers=4, n_heads=4),
        "gpt-mini": dict(vocab_size=8192, context_length=256, d_model=192, n_layers=6, n_heads=6),
    }

    def __post_init__(self) -> None:
        if self.vocab_size < 1:
            raise ValueError(f"vocab_size must be ≥ 1, got {self.vocab_size}")
        if self.context_length < 1:
            raise ValueError(f"context_length must be ≥ 1, got {self.context_length}")
        if self.num_labels < 0:
            raise ValueError(f"num_labels must be an int ≥ 0 (0: no classifier), got {self.num_labels!r}")
        for name in ("eos_token_id", "pad_token_id"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < self.vocab_size:
                raise ValueError(f"{name}={value} is outside the vocabulary [0, {self.vocab_size})")
        self.backbone_config()  # validates the shape fields

    def backbone_config(self) -> BackboneConfig:
        return BackboneConfig(
            d_model=self.d_model, n_layers=self.n_layers, n_heads=self.n_heads, d_ff=self.d_ff,
            block=("attn", "mlp"), norm="layernorm", norm_position="pre", norm_eps=self.norm_eps,
            bias=self.bias, activation=self.activation, causal=True, dropout=self.dropout,
            attn_dropout=self.dropout, final_norm=True,
        )


class GPT(PretrainedModel):
    """Decoder-only transformer LM on the shared backbone (GPT-2 when built from its presets)."""

    config_class = GPTConfig

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_embed = TokenEmbedding(config.vocab_size, config.d_model)
        self.pos_embed = make_positions(config.positions, config.context_length, config.d_model)
        self.drop = nn.Dropout(config.dropout)
        self.backbone = Backbone(config.backbone_config())
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.classifier = ClassificationHead(config.d_model, config.num_labels, config.dropout) \
            if config.num_labels else None
        # GPT-2 init; residual projections scaled by 1/sqrt(2L) so the residual stream stays O(1).
        init_weights(self, std=0.02, residual_std=0.02 / math.sqrt(2 * config.n_layers))
        if config.tie_embeddings:
            self.lm_head.weight = self.tok_embed.weight

    @property
    def tied_keys(self) -> tuple[str, ...]:
        return ("lm_head.weight",) if self.config.tie_embeddings else ()

    def class_count(self) -> int | None:
        return self.config.num_labels or None

    # ------------------------------------------------------------------ forward
    @deferred_checks()  # on a GPU, input checks' verdicts are read as the forward ends: no host sync
    def forward(
        self,
        input_ids: Tensor | Tokens,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        cache: KVCache | None = None,
        use_cache: bool = False,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        kernel: Kernel = "sdpa",
        labels: Tensor | None = None,
        return_logits: bool = True,
    ) -> CausalLMOutput:
        """Next-token logits for every position (and ``loss`` when ``labels`` are given).

        Args:
            input_ids: (B, N) ids, or a `Tokens` batch (its mask and positions are used).
            attention_mask: (B, T) 1 for real tokens; with a cache it covers cache + new tokens.
            position_ids: (B, N) (or (1, N) for every row) within 0..context_length-1; by default
                counted from the first real token of each row, so left padding does not shift positions.
            cache / use_cache: continue from a `KVCache`, or start one (returned in ``.cache``).
            labels: (B, N) targets aligned with the inputs (usually the input ids themselves);
                shifted inside, as in Hugging Face's ``GPT2LMHeadModel``: ``.loss`` is the mean
                cross-entropy of position t's logits against ``labels[:, t + 1]``, -100 ignored.
            return_logits: False leaves out the (B, N, V) logits (``.logits`` is None), a training
                step's largest tensor; ``labels`` are then scored by the LM head fused with the
                loss (`unitok.losses.linear_cross_entropy`: the same loss, the logits never whole).

        With a classifier (``num_labels`` > 0), ``.class_logits`` (B, K) score each row from its
        last real token (right padding: the last one the mask keeps).
        """
        hidden = self._run_backbone(input_ids, attention_mask, position_ids, cache, use_cache,
                                    output_hidden_states, output_attentions, kernel)
        h = hidden.last_hidden_state
        logits = linear(h, self.lm_head) if return_logits else None
        if labels is None:
            loss = None
        elif logits is not None:
            loss = causal_lm_loss(logits, labels)
        else:  # the shift of causal_lm_loss: position t is scored on labels[:, t + 1]
            if tuple(labels.shape) != tuple(h.shape[:2]):
                raise ValueError(f"labels must be (batch, tokens) = {tuple(h.shape[:2])}, got {tuple(labels.shape)}")
            loss = linear_cross_entropy(h[:, :-1], self.lm_head.weight, labels[:, 1:], self.lm_head.bias,
                                        compile=loss_backend(self))
        class_logits = None
        if self.classifier is not None:
            h = hidden.last_hidden_state  # (B, N, D)
            mask = attention_mask[:, -h.shape[1]:] if attention_mask is not None else None  # the new tokens'
            class_logits = self.classifier(pool_tokens(h, mask, "last"))  # (B, K)
        return CausalLMOutput(
            logits=logits,
            last_hidden_state=hidden.last_hidden_state,
            hidden_states=hidden.hidden_states,
            attentions=hidden.attentions,
            cache=hidden.cache,
            loss=loss,
            class_logits=class_logits,
        )

    def _run_backbone(self, input_ids, attention_mask, position_ids, cache, use_cache,
                      output_hidden_states=False, output_attentions=False, kernel: Kernel = "sdpa",
                      check_ids: bool = True):
        if isinstance(input_ids, Tokens):
            if input_ids.ids is None:
                raise ValueError("GPT reads token ids; this Tokens batch holds features")
            attention_mask = input_ids.attention_mask if attention_mask is None else attention_mask
            position_ids = input_ids.positions if position_ids is None else position_ids
            input_ids = input_ids.ids
        if not isinstance(input_ids, Tensor) or input_ids.dim() != 2:
            shape = tuple(input_ids.shape) if isinstance(input_ids, Tensor) else type(input_ids).__name__
            raise ValueError(f"input_ids must be a (batch, tokens) tensor, got {shape}")
        if input_ids.shape[1] == 0:
            raise ValueError("input_ids is empty: give at least one token")
        if use_cache and cache is None:
            cache = self.new_cache()
        past = cache.seq_len if cache is not None else 0
        n_total = past + input_ids.shape[1]
        if n_total > self.config.context_length:
            raise ValueError(
                f"sequence of {n_total} tokens is longer than the context length "
                f"{self.config.context_length}; truncate or use a model with a longer context"
            )
        if attention_mask is not None and attention_mask.shape != (input_ids.shape[0], n_total):
            raise ValueError(
                f"attention_mask must be (batch, cached + new) = {(input_ids.shape[0], n_total)}, "
                f"got {tuple(attention_mask.shape)}"
            )
        B, N = input_ids.shape
        if position_ids is not None and (position_ids.dim() != 2 or position_ids.shape[0] not in (1, B)
                                         or position_ids.shape[1] != N):
            raise ValueError(f"position_ids must be ({B}|1, {N}), one per new token, got {tuple(position_ids.shape)}")
        x = self.tok_embed(input_ids, check=check_ids)
        if self.pos_embed is not None:
            if position_ids is None and attention_mask is None:
                x = x + self.pos_embed.span(past, N)  # (N, D) broadcast over the batch
            elif position_ids is None:  # counted from the mask: within 0..T-1, T within the context
                x = x + self.pos_embed(self._positions(input_ids, attention_mask, past), check=False)
            else:
                x = x + self.pos_embed(position_ids)
        if self.training and self.drop.p > 0:
            x = self.drop(x)
        return self.backbone(x, attention_mask, cache, output_hidden_states, output_attentions, kernel)

    @staticmethod
    def _positions(input_ids: Tensor, attention_mask: Tensor, past: int) -> Tensor:
        """Position ids counted from each row's first real token (left padding does not shift them)."""
        return positions_from_mask(attention_mask)[:, -input_ids.shape[1]:]

    # ------------------------------------------------------------------ fine-tuning
    @classmethod
    def for_sequence_classification(cls, gpt: GPT, num_labels: int, dropout: float | None = None) -> GPT:
        """A new GPT with ``gpt``'s weights (embeddings, backbone, LM head) and a fresh classifier
        of ``num_labels`` on the last real token (GPT-1); ``dropout`` replaces the body's when
        given. The LM head stays, for GPT-1's auxiliary language-modelling loss. The new model
        keeps ``gpt``'s processor (its tokenizer; class names only while they still number one a
        class). ``gpt`` is left as it is; the new model is in ``gpt``'s mode (eval for a loaded one)."""
        check_int("num_labels", num_labels)
        changes = {"num_labels": num_labels} | ({} if dropout is None else {"dropout": dropout})
        ref = gpt.tok_embed.weight
        model = cls(gpt.config.replace(**changes)).to(device=ref.device, dtype=ref.dtype)
        body = {k: v for k, v in gpt.state_dict().items() if not k.startswith("classifier.")}
        result = model.load_state_dict(body, strict=False)
        missing = [k for k in result.missing_keys if not k.startswith("classifier.")]
        if missing or result.unexpected_keys:
            raise RuntimeError(f"body weights did not transfer: missing {missing}, unexpected {result.unexpected_keys}")
        model._processor = gpt._processor  # the same tokenizer reads the new model's text
        model._drop_stale_class_names()
        return model.train(gpt.training)  # the mode of the model it came from (a loaded one: eval)

    # ------------------------------------------------------------------ generation
    def new_cache(self, capacity: int = 0) -> KVCache:
        return self.backbone.new_cache(capacity)

    def next_token_logits(self, new_ids: Tensor, attention_mask: Tensor | None, cache: KVCache) -> Tensor:
        """(B, n) new ids -> (B, V) logits of the token after the last one; extends ``cache``."""
        # Ids after the prompt come from the model's own argmax/sampling: no range check needed.
        hidden = self._run_backbone(new_ids, attention_mask, None, cache, True,
                                    check_ids=cache.seq_len == 0).last_hidden_state
        return head_logits(hidden[:, -1], self.lm_head)

    def new_static_cache(self, capacity: int) -> StaticKVCache:
        """A fixed-capacity cache for `decode_step` holding at least ``capacity`` positions (prompt +
        every new token), rounded up within the context length (`static_capacity`): prompts of
        nearby lengths then reuse one compiled step instead of compiling their own."""
        if not 1 <= capacity <= self.config.context_length:
            raise ValueError(f"a static cache of {capacity} positions does not fit the context length "
                             f"{self.config.context_length}")
        return StaticKVCache(self.config.n_layers, static_capacity(capacity, self.config.context_length))

    def decode_step(self, new_ids: Tensor, positions: Tensor, mask: Tensor, cache: StaticKVCache,
                    check: bool = False) -> Tensor:
        """One shape-stable decoding step over a `StaticKVCache` (what ``generate(compile=...)``
        compiles): (B, N) ids at (B, N) positions, written at ``cache.index``, each query seeing
        the keys ``mask`` (B, 1, N, capacity) allows -> (B, V) logits after the last id. No host
        syncs; ``check`` range-checks the ids and positions (the prompt's, not the model's own tokens)."""
        x = self.tok_embed(new_ids, check=check)
        if self.pos_embed is not None:
            x = x + self.pos_embed(positions, check=check)
        hidden = self.backbone(x, cache=cache, mask=mask).last_hidden_state
        return self.lm_head(hidden[:, -1])

    @torch.no_grad()
    def generate(
        self,
        input_ids: Tensor | Tokens,
        attention_mask: Tensor | None = None,
        max_new_tokens: int = 32,
        strategy: Literal["greedy", "sample", "beam"] = "greedy",
        generator: torch.Generator | None = None,
        **options: Any,
    ) -> Tensor:
        """Continue prompts; returns (B, S + new) ids including the prompt.

        ``strategy``: "greedy", "sample" (``temperature``, ``top_k``, ``top_p``) or "beam"
        (``num_beams``, ``length_penalty``, ``early_stopping``); ``compile=True`` (any strategy)
        decodes through a compiled, shape-stable step (`GenerationConfig`). Batched prompts must be left
        padded (``BPETokenizer.batch_encode(..., padding_side="left")``). Generation stops at
        ``eos_token_id`` (default: the config's).
        """
        if isinstance(input_ids, Tokens):
            attention_mask = input_ids.attention_mask if attention_mask is None else attention_mask
            input_ids = input_ids.ids  # type: ignore[assignment]
        check_prompt_tensors(input_ids, attention_mask, self.lm_head.weight.device, generator=generator)
        options.setdefault("eos_token_id", self.config.eos_token_id)
        options.setdefault("pad_token_id", self.config.pad_token_id)
        cfg = GenerationConfig.from_dict({"max_new_tokens": max_new_tokens, "strategy": strategy, **options})
        cfg.check_vocabulary(self.config.vocab_size)
        total = input_ids.shape[-1] + max_new_tokens  # type: ignore[union-attr]
        if total > self.config.context_length:
            raise ValueError(
                f"prompt ({input_ids.shape[-1]}) + max_new_tokens ({max_new_tokens}) = {total} exceeds "  # type: ignore[union-attr]
                f"the context length {self.config.context_length}"
            )
        was_training = self.training
        self.eval()
        try:
            return generate(self, input_ids, cfg, attention_mask, generator)  # type: ignore[arg-type]
        finally:
            self.train(was_training)
