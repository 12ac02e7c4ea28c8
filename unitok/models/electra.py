"""ELECTRA: a small MLM generator and a discriminator trained jointly on replaced-token
detection (Clark et al., 2020). Both are `BERT` networks; they share the embeddings (token,
position, segment, their LayerNorm), and afterwards the discriminator alone is the model to
fine-tune: ``electra.discriminator`` is a plain `BERT`.

Axis legend: B batch, N tokens, M masked positions in the batch, V vocabulary,
D / Dg discriminator / generator width, E shared embedding width.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from tokenizers_mm import Tokens
from unitok.config import Config
from unitok.layers.activations import Activation
from unitok.models.base import PretrainedModel
from unitok.models.bert import BERT, BERTConfig

SHARED_EMBEDDINGS = ("tok_embed", "pos_embed", "seg_embed", "norm")


@dataclass(frozen=True)
class ELECTRAConfig(Config):
    """The generator / discriminator pair.

    Args:
        vocab_size / context_length / type_vocab_size / pad_token_id: shared by both networks.
        embedding_size: E, the shared embedding width (each network projects E to its width).
        d_model / n_layers / n_heads / d_ff: the discriminator's backbone.
        generator_d_model / generator_n_layers / generator_n_heads / generator_d_ff: the
            generator's (the paper: ¼ to ½ of the discriminator's width works best).
        activation / norm_eps / dropout / attn_dropout: as in `BERTConfig`.
    """

    vocab_size: int = 30522
    context_length: int = 512
    type_vocab_size: int = 2
    pad_token_id: int | None = 0
    embedding_size: int = 128
    d_model: int = 256
    n_layers: int = 12
    n_heads: int = 4
    d_ff: int | None = 1024
    generator_d_model: int = 64
    generator_n_layers: int = 12
    generator_n_heads: int = 1
    generator_d_ff: int | None = 256
    activation: Activation = "gelu"
    norm_eps: float = 1e-12
    dropout: float = 0.1
    attn_dropout: float = 0.1

    presets = {
        # ELECTRA-Small (Clark et al., 2020): generator ¼ of the discriminator's width.
        "electra-small": dict(),
        # CPU-sized: trains on the built-in corpus in minutes. At this size a narrower generator
        # stays at the unigram plateau for thousands of steps, so it matches the discriminator.
        "electra-nano": dict(vocab_size=4096, context_length=128, embedding_size=64, d_model=64, n_layers=2,
                             n_heads=2, d_ff=256, generator_d_model=64, generator_n_layers=2,
                             generator_n_heads=2, generator_d_ff=256),
        "electra-micro": dict(vocab_size=4096, context_length=128, embedding_size=128, d_model=128, n_layers=4,
                              n_heads=4, d_ff=512, generator_d_model=64, generator_n_layers=4,
                              generator_n_heads=2, generator_d_ff=256),
    }

    def __post_init__(self) -> None:
        self.discriminator_config()  # both validate their fields
        self.generator_config()

    def _network(self, **shape) -> BERTConfig:
        return BERTConfig(vocab_size=self.vocab_size, context_length=self.context_length,
                          type_vocab_size=self.type_vocab_size, pad_token_id=self.pad_token_id,
                          embedding_size=self.embedding_size, activation=self.activation,
                          norm_eps=self.norm_eps, dropout=self.dropout, attn_dropout=self.attn_dropout, **shape)

    def discriminator_config(self) -> BERTConfig:
        return self._network(d_model=self.d_model, n_layers=self.n_layers, n_heads=self.n_heads,
                             d_ff=self.d_ff, heads=("rtd",))

    def generator_config(self) -> BERTConfig:
        return self._network(d_model=self.generator_d_model, n_layers=self.generator_n_layers,
                             n_heads=self.generator_n_heads, d_ff=self.generator_d_ff, heads=("mlm",))


@dataclass
class ELECTRAOutput:
    """``generator_logits`` (M, V) at the masked positions; ``corrupted_ids`` (B, N) the
    discriminator's input (masked positions filled with generator samples); ``replaced``
    (B, N) bool, the discriminator's targets (a sample equal to the original is "not
    replaced"); ``discriminator_logits`` (B, N); ``masked`` (B, N) bool, where labels were."""

    generator_logits: Tensor
    corrupted_ids: Tensor
    replaced: Tensor
    discriminator_logits: Tensor
    masked: Tensor


class ELECTRA(PretrainedModel):
    """Generator (MLM) + discriminator (replaced-token detection) sharing their embeddings."""

    config_class = ELECTRAConfig

    def __init__(self, config: ELECTRAConfig) -> None:
        super().__init__()
        self.config = config
        self.discriminator = BERT(config.discriminator_config())
        self.generator = BERT(config.generator_config())
        for name in SHARED_EMBEDDINGS:
            setattr(self.generator.embeddings, name, getattr(self.discriminator.embeddings, name))
        self.generator.mlm_head.decoder.weight = self.discriminator.embeddings.tok_embed.weight  # type: ignore[union-attr]

    @property
    def tied_keys(self) -> tuple[str, ...]:
        shared = [k for k in self.generator.state_dict()
                  if k.startswith(tuple(f"embeddings.{n}." for n in SHARED_EMBEDDINGS))]
        return tuple(f"generator.{k}" for k in shared) + ("generator.mlm_head.decoder.weight",)

    def forward(
        self,
        input_ids: Tensor | Tokens,
        labels: Tensor,
        attention_mask: Tensor | None = None,
        segment_ids: Tensor | None = None,
        temperature: float = 1.0,
        generator: torch.Generator | None = None,
    ) -> ELECTRAOutput:
        """One joint step's predictions.

        Args:
            input_ids: (B, N) masked ids (or `Tokens`), as a masking collator makes them.
            labels: (B, N) the original id at masked positions, -100 elsewhere.
            temperature: of the generator's sampling distribution.
            generator: random source for sampling replacements (reproducible runs).
        Sampling is not differentiated through: the generator learns from its MLM loss only.
        """
        if isinstance(input_ids, Tokens):
            attention_mask = input_ids.attention_mask if attention_mask is None else attention_mask
            segment_ids = input_ids.segments if segment_ids is None else segment_ids
            input_ids = input_ids.ids  # type: ignore[assignment]
        if labels.shape != input_ids.shape:  # type: ignore[union-attr]
            raise ValueError(f"labels {tuple(labels.shape)} must match input_ids {tuple(input_ids.shape)}")  # type: ignore[union-attr]
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        masked = labels != -100  # (B, N)
        hidden = self.generator(input_ids, attention_mask, segment_ids, compute_heads=False).last_hidden_state
        gen_logits = self.generator.mlm_head(hidden[masked])  # type: ignore[misc]  # (M, V)
        with torch.no_grad():
            probs = (gen_logits.float() / temperature).softmax(-1)
            sampled = torch.multinomial(probs, 1, generator=generator).squeeze(-1) if len(probs) else \
                labels[masked]
        corrupted = input_ids.clone()  # type: ignore[union-attr]
        corrupted[masked] = sampled
        original = torch.where(masked, labels, input_ids)  # type: ignore[arg-type]
        replaced = corrupted != original
        disc = self.discriminator(corrupted, attention_mask, segment_ids).rtd_logits
        return ELECTRAOutput(generator_logits=gen_logits, corrupted_ids=corrupted, replaced=replaced,
                             discriminator_logits=disc, masked=masked)  # type: ignore[arg-type]

    def discriminator_as_bert(self) -> BERT:
        """The discriminator (a `BERT` with a replaced-token head): the network to fine-tune,
        e.g. ``BERT.for_sequence_classification(electra.discriminator_as_bert(), 2)``. It
        carries this model's processor (the tokenizer both networks read)."""
        if self._processor is not None:
            self.discriminator._processor = self._processor
            self.discriminator._drop_stale_class_names()
        return self.discriminator
