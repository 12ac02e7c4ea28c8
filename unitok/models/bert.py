"""BERT: token + position + segment embeddings -> post-norm bidirectional backbone -> heads.

The heads a model carries are data (``BERTConfig.heads``): the [CLS] pooler, the masked-LM
head (tied to the token embedding), next-sentence prediction, ELECTRA's replaced-token
detector, sequence / token classification and extractive-QA spans. Fine-tuning swaps heads
on the same body (`BERT.for_sequence_classification` and friends).

Axis legend: B batch, N tokens, D model width, E embedding width, V vocabulary,
S segment (token-type) ids, K labels, L layers, F feature width.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from tokenizers_mm import Tokens
from tokenizers_mm.checks import check_int
from unitok.backbone import Backbone, BackboneConfig, init_weights
from unitok.checks import deferred_checks, host_values
from unitok.config import Config
from unitok.embed import LearnedPositions, TokenEmbedding
from unitok.heads import ClassificationHead, MLMHead, Pooler, ReplacedTokenHead, ScalarMix, SpanHead
from unitok.layers.activations import Activation
from unitok.layers.attention import Kernel
from unitok.losses import cross_entropy, sequence_classification_loss
from unitok.models.base import PretrainedModel

HEADS = ("pooler", "mlm", "nsp", "rtd", "classifier", "token_classifier", "span")
LayerChoice = Literal["last", "last4", "all", "embeddings"] | int | Sequence[int]
Combine = Literal["sum", "mean", "concat"]


@dataclass(frozen=True)
class BERTConfig(Config):
    """A BERT-family encoder and the heads it carries.

    Args:
        vocab_size: V. context_length: the most positions (``max_position_embeddings``).
        type_vocab_size: segment ids (2: sentence A / B).
        d_model / n_layers / n_heads / d_ff: the backbone's shape (d_ff defaults to 4·D).
        embedding_size: E, the token-embedding width; None means D. When E ≠ D a linear map
            takes embeddings to D (ELECTRA's factorised embeddings).
        activation: of the MLPs and the MLM / replaced-token transforms ("gelu" is exact GELU).
        norm_eps: every LayerNorm's epsilon. dropout / attn_dropout: on embeddings and
            residual branches / on attention weights.
        classifier_dropout: before classification heads (None: ``dropout``).
        pad_token_id: the padding id (its embedding row gets no gradient, as in BERT).
        heads: which heads exist, from "pooler", "mlm", "nsp", "rtd", "classifier",
            "token_classifier", "span". "nsp" and "classifier" read the pooler.
        num_labels: K for "classifier" (1 = regression) / "token_classifier" (K ≥ 2).
        classifier_layers: the feature-based approach — the "classifier" / "token_classifier"
            reads a learned weighted sum (`ScalarMix`) of these hidden states (0 = embeddings
            … L = last) instead of the last layer; the classifier mean-pools it over real
            tokens instead of reading the pooler. Empty: the usual heads.
    """

    vocab_size: int = 30522
    context_length: int = 512
    type_vocab_size: int = 2
    d_model: int = 768
    n_layers: int = 12
    n_heads: int = 12
    d_ff: int | None = None
    embedding_size: int | None = None
    activation: Activation = "gelu"
    norm_eps: float = 1e-12
    dropout: float = 0.1
    attn_dropout: float = 0.1
    classifier_dropout: float | None = None
    pad_token_id: int | None = 0
    heads: tuple[str, ...] = ("pooler", "mlm", "nsp")
    num_labels: int = 0
    classifier_layers: tuple[int, ...] = ()

    presets = {
        # Devlin et al. (2019), with the uncased WordPiece vocabulary of 30,522 tokens.
        "bert-base-uncased": dict(d_model=768, n_layers=12, n_heads=12),
        "bert-large-uncased": dict(d_model=1024, n_layers=24, n_heads=16),
        # sentence-transformers' all-MiniLM-L6-v2 (a 6-layer, width-384 BERT; encoder + pooler only).
        "all-MiniLM-L6-v2": dict(d_model=384, n_layers=6, n_heads=12, d_ff=1536, heads=("pooler",)),
        # Small models that train on a laptop CPU (vocabulary and context set by the data).
        "bert-nano": dict(vocab_size=4096, context_length=128, d_model=64, n_layers=2, n_heads=2),
        "bert-micro": dict(vocab_size=4096, context_length=128, d_model=128, n_layers=4, n_heads=4),
        "bert-mini": dict(vocab_size=8192, context_length=256, d_model=256, n_layers=4, n_heads=4),
    }

    def __post_init__(self) -> None:
        for name in ("vocab_size", "context_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be ≥ 1, got {getattr(self, name)}")
        if self.type_vocab_size < 0:
            raise ValueError(f"type_vocab_size must be ≥ 0, got {self.type_vocab_size}")
        if self.embedding_size is not None and self.embedding_size < 1:
            raise ValueError(f"embedding_size must be ≥ 1 or None, got {self.embedding_size}")
        if self.pad_token_id is not None and not 0 <= self.pad_token_id < self.vocab_size:
            raise ValueError(f"pad_token_id={self.pad_token_id} is outside the vocabulary [0, {self.vocab_size})")
        unknown = [h for h in self.heads if h not in HEADS]
        if unknown or len(set(self.heads)) != len(self.heads):
            raise ValueError(f"heads={self.heads}: unknown or repeated head(s) {unknown}; known: {HEADS}")
        for head in ("nsp", "classifier"):
            if head in self.heads and "pooler" not in self.heads and not (head == "classifier" and self.classifier_layers):
                raise ValueError(f"the {head!r} head reads the pooled [CLS] state: add 'pooler' to heads")
        labelled = [h for h in ("classifier", "token_classifier") if h in self.heads]
        if len(labelled) > 1:
            raise ValueError("heads may hold 'classifier' or 'token_classifier', not both (one num_labels)")
        # One score a token cannot learn: its cross-entropy is 0 whatever the label (no token regression).
        least, note = (2, " classes (no regression per token)") if labelled == ["token_classifier"] else (1, "")
        if labelled and self.num_labels < least:
            raise ValueError(f"the {labelled[0]!r} head needs num_labels ≥ {least}{note}, got {self.num_labels}")
        if not labelled and self.num_labels != 0:
            raise ValueError(f"num_labels={self.num_labels} given but no 'classifier' / 'token_classifier' head")
        if self.classifier_layers:
            if not labelled:
                raise ValueError(f"classifier_layers={self.classifier_layers} given but no 'classifier' / "
                                 "'token_classifier' head reads them")
            bad = [i for i in self.classifier_layers if not 0 <= i <= self.n_layers]
            if bad or len(set(self.classifier_layers)) != len(self.classifier_layers):
                raise ValueError(f"classifier_layers={self.classifier_layers}: expected distinct hidden-state indices "
                                 f"0 (embeddings) … {self.n_layers} (the last layer)")
        if self.classifier_dropout is not None and not 0.0 <= self.classifier_dropout < 1.0:
            raise ValueError(f"classifier_dropout must be in [0, 1), got {self.classifier_dropout}")
        self.backbone_config()  # validates the shape fields

    @property
    def embed_dim(self) -> int:
        """E: the width of the token, position and segment embeddings."""
        return self.embedding_size if self.embedding_size is not None else self.d_model

    def backbone_config(self) -> BackboneConfig:
        return BackboneConfig(
            d_model=self.d_model, n_layers=self.n_layers, n_heads=self.n_heads, d_ff=self.d_ff,
            block=("attn", "mlp"), norm="layernorm", norm_position="post", norm_eps=self.norm_eps,
            bias=True, activation=self.activation, causal=False, dropout=self.dropout,
            attn_dropout=self.attn_dropout, final_norm=False,
        )


@dataclass
class BERTOutput:
    """What `BERT` returns; a field is None when its head is absent (or heads were skipped).

    ``last_hidden_state`` (B, N, D); ``pooled`` (B, D) the pooler's tanh([CLS]);
    ``mlm_logits`` (B, N, V); ``nsp_logits`` (B, 2) (index 0 = "B follows A", as in BERT);
    ``rtd_logits`` (B, N) replaced-token scores; ``logits`` (B, K) sequence or (B, N, K)
    token classification; ``start_logits`` / ``end_logits`` (B, N) QA spans;
    ``hidden_states``: embeddings then each layer, L + 1 in all; ``attentions``: L × (B, H, N, N);
    ``loss`` when ``labels`` / ``next_sentence_label`` were given (see `BERT.forward`), else None.
    """

    last_hidden_state: Tensor
    pooled: Tensor | None = None
    mlm_logits: Tensor | None = None
    nsp_logits: Tensor | None = None
    rtd_logits: Tensor | None = None
    logits: Tensor | None = None
    start_logits: Tensor | None = None
    end_logits: Tensor | None = None
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None
    loss: Tensor | None = None


class BERTEmbeddings(nn.Module):
    """Token + learned position + segment embeddings, LayerNorm, dropout (then E -> D if E ≠ D)."""

    def __init__(self, config: BERTConfig) -> None:
        super().__init__()
        E = config.embed_dim
        self.tok_embed = TokenEmbedding(config.vocab_size, E, padding_idx=config.pad_token_id)
        self.pos_embed = LearnedPositions(config.context_length, E)
        self.seg_embed = nn.Embedding(config.type_vocab_size, E) if config.type_vocab_size else None
        self.norm = nn.LayerNorm(E, eps=config.norm_eps)
        self.drop = nn.Dropout(config.dropout)
        self.proj = nn.Linear(E, config.d_model) if E != config.d_model else None

    def forward(self, ids: Tensor, segments: Tensor | None = None, positions: Tensor | None = None) -> Tensor:
        """(B, N) ids [, (B, N) segment ids, (B, N) position ids] -> (B, N, D)."""
        x = self.tok_embed(ids)
        if self.seg_embed is not None:
            if segments is None:
                x = x + self.seg_embed.weight[0]  # every token in segment A
            else:
                n_types = self.seg_embed.num_embeddings
                values = host_values(segments)  # under torch.func.vmap: every sample's
                lo, hi = torch.aminmax(values) if values.numel() else (0, 0)
                if int(lo) < 0 or int(hi) >= n_types:
                    bad = values[(values < 0) | (values >= n_types)].unique()[:5].tolist()
                    raise ValueError(f"segment ids {bad} are outside [0, {n_types}) (type_vocab_size)")
                x = x + self.seg_embed(segments)
        elif segments is not None and bool(host_values(segments).any()):
            raise ValueError("segment ids given, but this model has no segment embeddings (type_vocab_size=0)")
        x = x + (self.pos_embed.span(0, ids.shape[1]) if positions is None else self.pos_embed(positions))
        x = self.norm(x)
        if self.training and self.drop.p > 0:
            x = self.drop(x)
        return self.proj(x) if self.proj is not None else x


def mean_pool(hidden: Tensor, attention_mask: Tensor | None = None) -> Tensor:
    """Average of the real (unpadded) token states: (B, N, D), (B, N) -> (B, D). Sentence
    embeddings as sentence-transformers computes them."""
    if attention_mask is None:
        return hidden.mean(dim=1)
    mask = attention_mask.to(hidden.dtype).unsqueeze(-1)  # (B, N, 1)
    return (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)


class BERT(PretrainedModel):
    """Bidirectional encoder on the shared backbone in post-norm (BERT, and ELECTRA's networks).

    ``forward`` takes a `Tokens` batch (ids, padding mask, segments, positions) or tensors
    and returns a `BERTOutput`. ``features`` gives hidden states of any layers for the
    feature-based approach; ``for_sequence_classification`` / ``for_token_classification`` /
    ``for_question_answering`` put a new head on the same body, frozen or not.
    """

    config_class = BERTConfig

    def __init__(self, config: BERTConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        self.embeddings = BERTEmbeddings(c)
        self.backbone = Backbone(c.backbone_config())
        self.pooler = Pooler(c.d_model) if "pooler" in c.heads else None
        self.mlm_head = MLMHead(c.d_model, c.embed_dim, c.vocab_size, c.activation, c.norm_eps) \
            if "mlm" in c.heads else None
        self.nsp_head = nn.Linear(c.d_model, 2) if "nsp" in c.heads else None
        self.rtd_head = ReplacedTokenHead(c.d_model, c.activation) if "rtd" in c.heads else None
        drop = c.dropout if c.classifier_dropout is None else c.classifier_dropout
        self.classifier = ClassificationHead(c.d_model, c.num_labels, drop) if "classifier" in c.heads else None
        self.token_classifier = ClassificationHead(c.d_model, c.num_labels, drop) \
            if "token_classifier" in c.heads else None
        self.span_head = SpanHead(c.d_model) if "span" in c.heads else None
        self.layer_mix = ScalarMix(len(c.classifier_layers)) if c.classifier_layers else None
        init_weights(self, std=0.02)  # BERT's init: N(0, 0.02) weights, zero biases, unit norms
        if c.pad_token_id is not None:
            with torch.no_grad():
                self.embeddings.tok_embed.weight[c.pad_token_id].zero_()
        if self.mlm_head is not None:
            nn.init.zeros_(self.mlm_head.decoder.bias)
            self.mlm_head.decoder.weight = self.embeddings.tok_embed.weight
        self.frozen_body = False

    @property
    def tied_keys(self) -> tuple[str, ...]:
        return ("mlm_head.decoder.weight",) if self.mlm_head is not None else ()

    def class_count(self) -> int | None:
        return self.config.num_labels or None  # the classifier's or the token classifier's

    # ------------------------------------------------------------------ forward
    @deferred_checks()  # on a GPU, input checks' verdicts are read as the forward ends: no host sync
    def forward(
        self,
        input_ids: Tensor | Tokens,
        attention_mask: Tensor | None = None,
        segment_ids: Tensor | None = None,
        position_ids: Tensor | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        compute_heads: bool = True,
        kernel: Kernel = "sdpa",
        token_type_ids: Tensor | None = None,
        labels: Tensor | None = None,
        next_sentence_label: Tensor | None = None,
    ) -> BERTOutput:
        """Encode a batch and run the heads (and the loss when labels are given).

        Args:
            input_ids: (B, N) ids, or a `Tokens` batch (its mask, segments, positions are used).
            attention_mask: (B, N) 1 for real tokens, 0 for padding.
            segment_ids: (B, N) 0 for sentence A, 1 for sentence B (default all 0).
                ``token_type_ids`` is the same thing under Hugging Face's name (give one of them).
            position_ids: (B, N); default 0 … N-1 (padding goes on the right).
            compute_heads: False skips the token-level heads (MLM, replaced-token, token
                classification, spans) and NSP/classifier, e.g. to score masked positions only
                (``model.mlm_head(hidden[masked])``); the pooler still runs.
            labels: scored by the model's labelled head, as the matching Hugging Face class does:
                "classifier": (B,) class ids (cross-entropy), (B,) floats when num_labels = 1
                (MSE) or (B, K) floats (multi-label BCE); "token_classifier": (B, N) ids;
                "mlm": (B, N) ids. -100 marks positions that are not scored.
            next_sentence_label: (B,) NSP targets (0 = "B follows A"); its cross-entropy is
                added to the MLM loss when ``labels`` are given too (``BertForPreTraining``).
        """
        if token_type_ids is not None:
            if segment_ids is not None:
                raise ValueError("give segment_ids or token_type_ids (Hugging Face's name for them), not both")
            segment_ids = token_type_ids
        if (labels is not None or next_sentence_label is not None) and not compute_heads:
            raise ValueError("labels are scored by the heads: compute_heads=False skips them")
        ids, attention_mask, segment_ids, position_ids = self._inputs(
            input_ids, attention_mask, segment_ids, position_ids)
        x = self.embeddings(ids, segment_ids, position_ids)
        mixing = compute_heads and self.layer_mix is not None
        out = self.backbone(x, attention_mask, output_hidden_states=output_hidden_states or mixing,
                            output_attentions=output_attentions, kernel=kernel)
        h = out.last_hidden_state
        result = BERTOutput(last_hidden_state=h, pooled=self.pooler(h) if self.pooler is not None else None,
                            hidden_states=out.hidden_states if output_hidden_states else None,
                            attentions=out.attentions)
        if not compute_heads:
            return result
        # the classifiers read the layer mix (the feature-based approach); every other head the last layer
        read = self.layer_mix([out.hidden_states[i] for i in self.config.classifier_layers]) if mixing else h  # type: ignore[misc,index]
        if self.mlm_head is not None:
            result.mlm_logits = self.mlm_head(h)
        if self.nsp_head is not None:
            result.nsp_logits = self.nsp_head(result.pooled)
        if self.rtd_head is not None:
            result.rtd_logits = self.rtd_head(h)
        if self.classifier is not None:
            result.logits = self.classifier(mean_pool(read, attention_mask) if mixing else result.pooled)
        if self.token_classifier is not None:
            result.logits = self.token_classifier(read)
        if self.span_head is not None:
            result.start_logits, result.end_logits = self.span_head(h)
        if labels is not None or next_sentence_label is not None:
            result.loss = self._loss(result, labels, next_sentence_label)
        return result

    def _loss(self, out: BERTOutput, labels: Tensor | None, next_sentence_label: Tensor | None) -> Tensor:
        """The loss of `forward`'s ``labels`` (on the labelled head) plus ``next_sentence_label`` (NSP)."""
        losses = []
        if labels is not None:
            scored = [h for h in ("mlm", "classifier", "token_classifier") if h in self.config.heads]
            if not scored:
                raise ValueError(f"labels given, but this model's heads {self.config.heads} include none that "
                                 "labels score ('mlm', 'classifier', 'token_classifier')")
            if len(scored) > 1:
                raise ValueError(f"labels are ambiguous: this model has both {scored[0]!r} and {scored[1]!r} "
                                 "heads; compute each loss from its logits")
            if scored[0] == "classifier":
                losses.append(sequence_classification_loss(out.logits, labels))  # type: ignore[arg-type]
            elif scored[0] == "token_classifier":
                losses.append(cross_entropy(out.logits, labels))  # type: ignore[arg-type]
            else:
                losses.append(cross_entropy(out.mlm_logits, labels))  # type: ignore[arg-type]
        if next_sentence_label is not None:
            if out.nsp_logits is None:
                raise ValueError(f"next_sentence_label given, but this model (heads {self.config.heads}) "
                                 "has no 'nsp' head")
            losses.append(cross_entropy(out.nsp_logits, next_sentence_label, "next_sentence_label"))
        return losses[0] if len(losses) == 1 else losses[0] + losses[1]

    def _inputs(self, input_ids, attention_mask, segment_ids, position_ids):
        if isinstance(input_ids, Tokens):
            if input_ids.ids is None:
                raise ValueError("BERT reads token ids; this Tokens batch holds features")
            attention_mask = input_ids.attention_mask if attention_mask is None else attention_mask
            segment_ids = input_ids.segments if segment_ids is None else segment_ids
            position_ids = input_ids.positions if position_ids is None else position_ids
            input_ids = input_ids.ids
        if not isinstance(input_ids, Tensor) or input_ids.dim() != 2:
            shape = tuple(input_ids.shape) if isinstance(input_ids, Tensor) else type(input_ids).__name__
            raise ValueError(f"input_ids must be a (batch, tokens) tensor, got {shape}")
        B, N = input_ids.shape
        if N == 0:
            raise ValueError("input_ids is empty: give at least one token")
        if N > self.config.context_length:
            raise ValueError(f"sequence of {N} tokens is longer than the context length "
                             f"{self.config.context_length}; truncate it (e.g. max_length in the tokenizer)")
        for name, value in (("attention_mask", attention_mask), ("segment_ids", segment_ids),
                            ("position_ids", position_ids)):
            if value is not None and tuple(value.shape) != (B, N):
                raise ValueError(f"{name} must have the shape of input_ids {(B, N)}, got {tuple(value.shape)}")
        return input_ids, attention_mask, segment_ids, position_ids

    # ------------------------------------------------------------------ feature-based use
    def features(
        self,
        input_ids: Tensor | Tokens,
        layers: LayerChoice = "last4",
        combine: Combine = "sum",
        attention_mask: Tensor | None = None,
        segment_ids: Tensor | None = None,
    ) -> Tensor:
        """Contextual token features from chosen layers: (B, N, D), or (B, N, k·D) for "concat".

        ``layers``: "last", "last4", "all" (every layer, embeddings excluded), "embeddings",
        one index or a list of indices into the L + 1 hidden states (0 = embeddings,
        L = last; negative counts from the end). ``combine``: "sum", "mean" or "concat"
        (BERT's feature-based NER table: concatenating the last four layers scores best).
        """
        out = self(input_ids, attention_mask, segment_ids, output_hidden_states=True, compute_heads=False)
        chosen = [out.hidden_states[i] for i in self.layer_indices(layers)]  # type: ignore[index]
        if combine == "sum":
            return torch.stack(chosen).sum(0)
        if combine == "mean":
            return torch.stack(chosen).mean(0)
        if combine == "concat":
            return torch.cat(chosen, dim=-1)
        raise ValueError(f"combine must be 'sum', 'mean' or 'concat', got {combine!r}")

    def layer_indices(self, layers: LayerChoice) -> list[int]:
        """Resolve a layer choice to indices into the L + 1 hidden states."""
        L = self.config.n_layers
        named = {"last": [L], "last4": list(range(max(1, L - 3), L + 1)), "all": list(range(1, L + 1)),
                 "embeddings": [0]}
        if isinstance(layers, str):
            if layers not in named:
                raise ValueError(f"layers={layers!r}: expected one of {sorted(named)}, an int or a list of ints")
            return named[layers]
        wanted = [layers] if isinstance(layers, int) else list(layers)
        if not wanted:
            raise ValueError("layers is an empty list: choose at least one layer")
        resolved = []
        for i in wanted:
            if not isinstance(i, int) or not -(L + 1) <= i <= L:
                raise ValueError(f"layer {i!r} is out of range: hidden states are 0 (embeddings) … {L}, "
                                 f"or -{L + 1} … -1")
            resolved.append(i % (L + 1))
        return resolved

    @torch.no_grad()
    def embed_sentences(self, tokens: Tokens, pooling: Literal["mean", "cls", "pooler"] = "mean",
                        normalize: bool = True) -> Tensor:
        """(B, D) sentence embeddings: mean of real token states (sentence-transformers), the
        [CLS] state or the pooler's output; L2-normalised by default."""
        out = self(tokens, compute_heads=False)
        if pooling == "mean":
            emb = mean_pool(out.last_hidden_state, tokens.attention_mask)
        elif pooling == "cls":
            emb = out.last_hidden_state[:, 0]
        elif pooling == "pooler":
            if out.pooled is None:
                raise ValueError("pooling='pooler' but this model has no pooler head")
            emb = out.pooled
        else:
            raise ValueError(f"pooling must be 'mean', 'cls' or 'pooler', got {pooling!r}")
        return nn.functional.normalize(emb, dim=-1) if normalize else emb

    # ------------------------------------------------------------------ fine-tuning
    def with_heads(self, heads: Sequence[str], num_labels: int = 0, freeze_backbone: bool = False,
                   classifier_dropout: float | None = None, dropout: float | None = None,
                   classifier_layers: LayerChoice | None = None) -> BERT:
        """A new BERT with this body's weights (embeddings, backbone, pooler if kept) and
        freshly initialised ``heads``; the body frozen if asked. ``dropout`` replaces the
        body's (embeddings, residual branches, attention weights) when given;
        ``classifier_layers`` (see `features`' ``layers``) makes the classifiers read a learned
        mix of those layers (`BERTConfig.classifier_layers`). The new model keeps this one's
        processor (its tokenizer; the class names only while they still number one a class of
        the new head). This model is left as it is."""
        heads = tuple(heads)
        changes = {} if dropout is None else {"dropout": dropout, "attn_dropout": dropout}
        mixed = () if classifier_layers is None else tuple(self.layer_indices(classifier_layers))
        config = self.config.replace(heads=heads, num_labels=num_labels, classifier_dropout=classifier_dropout,
                                     classifier_layers=mixed, **changes)
        ref = self.embeddings.tok_embed.weight
        model = type(self)(config).to(device=ref.device, dtype=ref.dtype)
        keep_pooler = self.pooler is not None and model.pooler is not None
        prefixes = ("embeddings.", "backbone.") + (("pooler.",) if keep_pooler else ())
        body = {k: v for k, v in self.state_dict().items() if k.startswith(prefixes)}
        result = model.load_state_dict(body, strict=False)
        missing_body = [k for k in result.missing_keys if k.startswith(prefixes)]
        if missing_body or result.unexpected_keys:
            raise RuntimeError(f"body weights did not transfer: missing {missing_body}, "
                               f"unexpected {result.unexpected_keys}")
        model._processor = self._processor  # the same tokenizer reads the new model's text
        model._drop_stale_class_names()
        if freeze_backbone:
            model.freeze_body(include_pooler=keep_pooler)
        return model

    @classmethod
    def for_sequence_classification(cls, bert: BERT, num_labels: int, freeze_backbone: bool = False,
                                    classifier_dropout: float | None = None, dropout: float | None = None,
                                    classifier_layers: LayerChoice | None = None) -> BERT:
        """[CLS] -> pooler -> dropout -> K scores (K = 1: regression). Sentence pairs go in as
        one sequence with segment ids. A body without a pooler (ELECTRA) gets a new one.
        ``classifier_layers`` (the feature-based approach): a learned mix of those layers,
        mean-pooled over real tokens, instead of the pooler."""
        check_int("num_labels", num_labels, note="(1 = regression)")
        heads = ("classifier",) if classifier_layers is not None else ("pooler", "classifier")
        return bert.with_heads(heads, num_labels, freeze_backbone, classifier_dropout, dropout, classifier_layers)

    @classmethod
    def for_token_classification(cls, bert: BERT, num_labels: int, freeze_backbone: bool = False,
                                 classifier_dropout: float | None = None, dropout: float | None = None,
                                 classifier_layers: LayerChoice | None = None) -> BERT:
        """K ≥ 2 scores for every token (word labels go on each word's first sub-token), from the
        last layer or a learned mix of ``classifier_layers``."""
        check_int("num_labels", num_labels, at_least=2, note="(classes; a token classifier has no regression)")
        return bert.with_heads(("token_classifier",), num_labels, freeze_backbone, classifier_dropout, dropout,
                               classifier_layers)

    @classmethod
    def for_question_answering(cls, bert: BERT, freeze_backbone: bool = False, dropout: float | None = None) -> BERT:
        """Extractive QA: a start and an end score per token ([CLS] question [SEP] context [SEP])."""
        return bert.with_heads(("span",), 0, freeze_backbone, dropout=dropout)

    def freeze_body(self, include_pooler: bool = True) -> None:
        """Stop gradients into embeddings and backbone (and the pooler): "a new head on a
        frozen body". Frozen parts also stay in eval mode (no dropout) while training."""
        parts = [self.embeddings, self.backbone] + ([self.pooler] if include_pooler and self.pooler else [])
        for part in parts:
            part.requires_grad_(False)
            part.eval()
        self._frozen_parts = parts
        self.frozen_body = True

    def train(self, mode: bool = True) -> BERT:
        super().train(mode)
        for part in getattr(self, "_frozen_parts", ()):
            part.eval()
        return self


def span_from_logits(start_logits: Tensor, end_logits: Tensor, allowed: Tensor | None = None,
                     max_answer_length: int = 30) -> tuple[Tensor, Tensor]:
    """Best (start, end) token span per row with start ≤ end < start + max_answer_length:
    (B, N), (B, N) [, (B, N) bool positions a span may use] -> (B,), (B,)."""
    check_int("max_answer_length", max_answer_length)  # ≤ 0 would leave no span: (0, 0) for every row
    B, N = start_logits.shape
    scores = start_logits[:, :, None] + end_logits[:, None, :]  # (B, N_start, N_end)
    i = torch.arange(N, device=start_logits.device)
    valid = (i[None, :] >= i[:, None]) & (i[None, :] < i[:, None] + max_answer_length)  # (N, N)
    valid = valid[None].expand(B, N, N)
    if allowed is not None:
        valid = valid & allowed[:, :, None].bool() & allowed[:, None, :].bool()
    flat = scores.masked_fill(~valid, float("-inf")).flatten(1).argmax(-1)
    return flat // N, flat % N
