"""Any tokens, one transformer: `MultimodalTransformer` embeds each named segment of a batch with
its modality's embedder, adds a learned modality embedding, packs the segments into one
sequence with one mask (`unitok.packing`), runs the **one** `Backbone` once, and hands each
named head the hidden states of its segment (Gato, VATT's modality-agnostic encoder,
Meta-Transformer; see MULTIMODAL.md).

A batch is a mapping ``name -> tokens``: ``{"image": Tokens, "audio": Tokens}`` puts a digit scan
and a spoken digit into one sequence; ``{"text": Tokens}`` alone is a GPT, ``{"image": Tokens}``
alone a ViT (tested equal to both with copied weights and the modality embedding zeroed).

Axis legend: B batch, N packed tokens, n tokens of one segment, D width, K classes or steps,
V vocabulary, E embedding width.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor, nn

from tokenizers_mm import ImagePreprocessConfig, Processor, SpectrogramConfig, Tokens, patchify
from tokenizers_mm.checks import check_int, check_number
from tokenizers_mm.trajectory import TOKENIZER_FIELDS, TrajectoryTokenizer, TrajectoryWindows
from unitok.backbone import Backbone, BackboneConfig, init_weights
from unitok.checks import check_dtype, check_finite, deferred_checks
from unitok.config import Config
from unitok.embed.modalities import AudioEmbedder, ImageEmbedder, TextEmbedder, TrajectoryEmbedder
from unitok.heads import (
    ActionHead,
    ClassificationHead,
    CTCHead,
    LMHead,
    Pooling,
    ProjectionHead,
    pool_tokens,
)
from unitok.layers.activations import Activation
from unitok.layers.attention import Kernel, check_padding_mask
from unitok.models.base import PretrainedModel, load_state_dict_strict
from unitok.packing import Segment, SegmentSpan, pack_segments

# --------------------------------------------------------------------------- modalities


@dataclass(frozen=True)
class TextModality(Config):
    """Token ids with 1-D positions. ``causal``: the segment is autoregressive (an LM head
    predicts each next token); it then sees every earlier segment but no later one."""

    kind: Literal["text"] = "text"
    vocab_size: int = 4096
    max_positions: int = 256
    positions: Literal["learned", "sinusoidal"] = "learned"
    causal: bool = True

    def __post_init__(self) -> None:
        _check_kind(self, "text")
        if self.vocab_size < 1 or self.max_positions < 1:
            raise ValueError(f"need vocab_size ≥ 1 and max_positions ≥ 1, got {self.vocab_size}, {self.max_positions}")


@dataclass(frozen=True)
class ImageModality(Config):
    """Image patches with 2-D positions and (optionally) a class token first; the pixel
    normalisation travels with the model so raw images can be read (``image_tokenizer``)."""

    kind: Literal["image"] = "image"
    image_size: tuple[int, int] = (32, 32)
    patch_size: int = 8
    channels: int = 1
    mean: tuple[float, ...] = (0.5,)
    std: tuple[float, ...] = (0.5,)
    class_token: bool = True
    positions: Literal["learned", "sincos", "none"] = "learned"
    positions_cover_prefix: bool = True
    patch_bias: bool = True
    causal: bool = False

    def __post_init__(self) -> None:
        _check_kind(self, "image")
        if isinstance(self.image_size, int):
            object.__setattr__(self, "image_size", (self.image_size, self.image_size))
        for name in ("image_size", "mean", "std"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        H, W = self.image_size
        if self.patch_size < 1 or H % self.patch_size or W % self.patch_size:
            raise ValueError(f"image_size {H}×{W} is not divisible by patch_size {self.patch_size}")
        if len(self.mean) != self.channels or len(self.std) != self.channels:
            raise ValueError(f"mean and std need one value per channel ({self.channels}), got {self.mean}, {self.std}")

    @property
    def grid(self) -> tuple[int, int]:
        return self.image_size[0] // self.patch_size, self.image_size[1] // self.patch_size


@dataclass(frozen=True)
class AudioModality(Config):
    """Log-mel frames through the ×4 convolutional front end, with time positions;
    ``spectrogram`` holds the `SpectrogramConfig` fields that turn raw audio into its frames
    (given in part, stored whole at this ``n_mels``; empty: the defaults)."""

    kind: Literal["audio"] = "audio"
    n_mels: int = 80
    max_frames: int = 512
    subsampling_channels: int | None = None
    positions: Literal["sinusoidal", "learned"] = "sinusoidal"
    spectrogram: dict[str, Any] = field(default_factory=dict)
    causal: bool = False

    def __post_init__(self) -> None:
        _check_kind(self, "audio")
        check_int("subsampling_channels", self.subsampling_channels, or_none=True)  # 0 would read as "d_model"
        if self.n_mels < 7 or self.max_frames < 1:
            raise ValueError(f"need n_mels ≥ 7 (×4 subsampling) and max_frames ≥ 1, got {self.n_mels}, "
                             f"{self.max_frames}")
        object.__setattr__(self, "spectrogram", SpectrogramConfig.stored(self.spectrogram, self.n_mels))


@dataclass(frozen=True)
class TrajectoryModality(Config):
    """Decision-Transformer steps: (return-to-go, state, action) tokens with a timestep
    embedding, causal; the `TrajectoryTokenizer` statistics travel with the model."""

    kind: Literal["trajectory"] = "trajectory"
    state_dim: int = 4
    act_dim: int = 2
    discrete: bool = True
    action_tanh: bool = True
    context_length: int = 10
    max_ep_len: int = 1024
    condition_on_returns: bool = True
    embed_norm_eps: float = 1e-5
    state_mean: tuple[float, ...] | None = None
    state_std: tuple[float, ...] | None = None
    return_scale: float = 1.0
    action_low: tuple[float, ...] | None = None
    action_high: tuple[float, ...] | None = None
    causal: bool = True

    def __post_init__(self) -> None:
        _check_kind(self, "trajectory")
        for name in ("state_mean", "state_std", "action_low", "action_high"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, tuple(float(v) for v in value))
        for name in ("state_dim", "act_dim", "context_length", "max_ep_len"):
            value = getattr(self, name)
            check_int(name, value)
        check_number("embed_norm_eps", self.embed_norm_eps, 0, low_open=True)  # ≤ 0: NaN embeddings, as norm_eps
        self.tokenizer()  # validates the statistics against the dimensions

    @property
    def tokens_per_step(self) -> int:
        return 3 if self.condition_on_returns else 2

    def tokenizer(self) -> TrajectoryTokenizer:
        """The `TrajectoryTokenizer` with this segment's statistics (raw episodes -> windows)."""
        return TrajectoryTokenizer(**{name: getattr(self, name) for name in TOKENIZER_FIELDS})

    @classmethod
    def from_tokenizer(cls, tokenizer: TrajectoryTokenizer, **fields: Any) -> TrajectoryModality:
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in tokenizer.to_dict().items()}
        return cls(**{**values, **fields})


ModalityConfig = TextModality | ImageModality | AudioModality | TrajectoryModality
MODALITIES: dict[str, type[Config]] = {"text": TextModality, "image": ImageModality, "audio": AudioModality,
                                       "trajectory": TrajectoryModality}

# --------------------------------------------------------------------------- heads


@dataclass(frozen=True)
class ClassifierHeadConfig(Config):
    """Class scores from one segment pooled (``segment`` None: all real tokens of the sequence,
    mean-pooled). ``class_names``: the label of each class (id2label)."""

    kind: Literal["classifier"] = "classifier"
    segment: str | None = None
    num_classes: int = 2
    pool: Pooling = "cls"
    dropout: float = 0.0
    class_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _check_kind(self, "classifier")
        object.__setattr__(self, "class_names", tuple(self.class_names))
        if self.num_classes < 1:
            raise ValueError(f"a classifier needs num_classes ≥ 1, got {self.num_classes}")
        if self.class_names and len(self.class_names) != self.num_classes:
            raise ValueError(f"{len(self.class_names)} class_names for num_classes={self.num_classes}")
        if self.segment is None and self.pool == "cls":
            object.__setattr__(self, "pool", "mean")  # the whole sequence has no one class token


@dataclass(frozen=True)
class LMHeadConfig(Config):
    """Next-token logits at every position of a causal text segment, tied to its embedding."""

    kind: Literal["lm"] = "lm"
    segment: str = "text"
    tie_embeddings: bool = True

    def __post_init__(self) -> None:
        _check_kind(self, "lm")


@dataclass(frozen=True)
class CTCHeadConfig(Config):
    """Per-frame character scores over an audio segment (blank = 0, ``vocabulary`` ids 1..)."""

    kind: Literal["ctc"] = "ctc"
    segment: str = "audio"
    vocabulary: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _check_kind(self, "ctc")
        object.__setattr__(self, "vocabulary", tuple(self.vocabulary))
        if not self.vocabulary or len(set(self.vocabulary)) != len(self.vocabulary):
            raise ValueError(f"a CTC head needs a vocabulary of distinct characters, got {self.vocabulary}")


@dataclass(frozen=True)
class ActionHeadConfig(Config):
    """The action at every step of a trajectory segment, read at its state token."""

    kind: Literal["action"] = "action"
    segment: str = "trajectory"

    def __post_init__(self) -> None:
        _check_kind(self, "action")


@dataclass(frozen=True)
class ProjectionHeadConfig(Config):
    """A pooled segment projected into a joint embedding space of width ``embed_dim``."""

    kind: Literal["projection"] = "projection"
    segment: str | None = None
    embed_dim: int = 64
    pool: Pooling = "cls"

    def __post_init__(self) -> None:
        _check_kind(self, "projection")
        if self.embed_dim < 1:
            raise ValueError(f"embed_dim must be ≥ 1, got {self.embed_dim}")
        if self.segment is None and self.pool == "cls":
            object.__setattr__(self, "pool", "mean")


HeadConfig = ClassifierHeadConfig | LMHeadConfig | CTCHeadConfig | ActionHeadConfig | ProjectionHeadConfig
HEADS: dict[str, type[Config]] = {"classifier": ClassifierHeadConfig, "lm": LMHeadConfig, "ctc": CTCHeadConfig,
                                  "action": ActionHeadConfig, "projection": ProjectionHeadConfig}


def _check_kind(config: Any, kind: str) -> None:
    if config.kind != kind:
        raise ValueError(f"{type(config).__name__}.kind is {kind!r}, got {config.kind!r}")


def _typed(value: Any, registry: dict[str, type[Config]], what: str, name: str) -> Any:
    """A config object, or a dict with a ``kind`` key -> the config of that kind."""
    if isinstance(value, tuple(registry.values())):
        return value
    if not isinstance(value, Mapping) or "kind" not in value:
        raise ValueError(f"{what} {name!r} must be a config or a dict with a 'kind' "
                         f"({', '.join(registry)}), got {value!r}")
    if value["kind"] not in registry:
        raise ValueError(f"{what} {name!r} has unknown kind {value['kind']!r}; known: {', '.join(registry)}")
    return registry[value["kind"]].from_dict(dict(value))


# --------------------------------------------------------------------------- model config


def _has_first_token_summary(modality: Any) -> bool:
    """Whether a segment's first token summarises it: a bidirectional image's class token, or a
    bidirectional text segment's first token (BERT's [CLS]); not audio, trajectories, or a causal
    segment, whose first token sees only itself."""
    if modality.causal:
        return False
    return bool(modality.class_token) if modality.kind == "image" else modality.kind == "text"


@dataclass(frozen=True)
class MultimodalConfig(Config):
    """One backbone, one embedder per named modality, heads by name.

    Args:
        modalities: segment name -> `TextModality` / `ImageModality` / `AudioModality` /
            `TrajectoryModality` (or a dict with its ``kind``). A batch's segments are packed
            in the order the batch gives them.
        heads: head name -> `ClassifierHeadConfig` / `LMHeadConfig` / `CTCHeadConfig` /
            `ActionHeadConfig` / `ProjectionHeadConfig` (or a dict with its ``kind``), each
            reading the segment it names.
        d_model / n_layers / n_heads / d_ff / activation / norm_eps / dropout: the one
            pre-norm backbone ("attn", "mlp" blocks, final LayerNorm).
        modality_embedding: add a learned vector per modality to each of its tokens.
    """

    modalities: dict[str, Any] = field(default_factory=dict)
    heads: dict[str, Any] = field(default_factory=dict)
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    d_ff: int | None = None
    activation: Activation = "gelu"
    norm_eps: float = 1e-5
    dropout: float = 0.0
    modality_embedding: bool = True

    presets = {
        # Backbone sizes; modalities and heads come from the data (tasks.MultiTaskTask) or the caller.
        "mm-tiny": dict(d_model=64, n_layers=2, n_heads=4),
        "mm-small": dict(d_model=128, n_layers=4, n_heads=4),
        "mm-medium": dict(d_model=192, n_layers=4, n_heads=6),  # the four-task recipe: room for two sequence tasks
        "mm-base": dict(d_model=256, n_layers=6, n_heads=8),
    }

    def __post_init__(self) -> None:
        modalities = {name: _typed(m, MODALITIES, "modality", name) for name, m in dict(self.modalities).items()}
        heads = {name: _typed(h, HEADS, "head", name) for name, h in dict(self.heads).items()}
        object.__setattr__(self, "modalities", modalities)
        object.__setattr__(self, "heads", heads)
        if not modalities:
            raise ValueError("a MultimodalConfig needs at least one modality")
        for what, names in (("modality", modalities), ("head", heads)):
            for name in names:  # each is a submodule's name: PyTorch refuses "" and dots only when building
                if not isinstance(name, str) or not name or "." in name:
                    raise ValueError(f"{what} names must be non-empty strings without a '.', got {name!r}")
        for name, head in heads.items():
            if head.segment is not None and head.segment not in modalities:
                raise ValueError(f"head {name!r} reads segment {head.segment!r}, which is not a modality "
                                 f"({', '.join(modalities)})")
            if head.segment is None and head.kind in ("lm", "ctc", "action"):
                raise ValueError(f"a {head.kind} head reads one segment: set segment for head {name!r}")
            if head.segment is not None:
                need = {"lm": "text", "ctc": "audio", "action": "trajectory"}.get(head.kind)
                have = modalities[head.segment].kind
                if need is not None and have != need:
                    raise ValueError(f"head {name!r} ({head.kind}) reads a {need} segment, but {head.segment!r} "
                                     f"is {have}")
                if head.kind == "lm" and not modalities[head.segment].causal:
                    raise ValueError(f"LM head {name!r} predicts next tokens: segment {head.segment!r} must be causal")
                if head.kind == "action" and not modalities[head.segment].causal:
                    # each step's state token would attend to the action it predicts
                    raise ValueError(f"action head {name!r} predicts each step's action from what came before: "
                                     f"segment {head.segment!r} must be causal")
                if getattr(head, "pool", None) == "cls" and not _has_first_token_summary(modalities[head.segment]):
                    # "cls" reads the segment's first token: a summary only where it is a class token
                    # (an image's, a bidirectional text's [CLS]); elsewhere it would see one token
                    raise ValueError(f"head {name!r} pools segment {head.segment!r} by its first token (pool='cls'), "
                                     f"which has no class token there; use pool='mean' or 'last'")
        self.backbone_config()

    def backbone_config(self) -> BackboneConfig:
        # Causality comes from the segments (the packed mask), not from the backbone.
        return BackboneConfig(
            d_model=self.d_model, n_layers=self.n_layers, n_heads=self.n_heads, d_ff=self.d_ff,
            norm_eps=self.norm_eps, activation=self.activation, causal=False, dropout=self.dropout,
            attn_dropout=self.dropout,
        )  # otherwise the defaults: pre-LN blocks of attention + MLP, biases, a final LayerNorm

    def to_dict(self) -> dict[str, Any]:
        data = super().to_dict()
        data["modalities"] = {k: v.to_dict() for k, v in self.modalities.items()}
        data["heads"] = {k: v.to_dict() for k, v in self.heads.items()}
        return data


# --------------------------------------------------------------------------- outputs


@dataclass
class SegmentOutput:
    """One segment's share of the packed output: ``hidden`` (B, n, D), ``mask`` (B, n) boolean
    (True: real token), and where it lies in the packed sequence (``start`` … ``stop`` − 1)."""

    hidden: Tensor
    mask: Tensor
    start: int
    stop: int

    @property
    def lengths(self) -> Tensor:
        """(B,) real tokens per row (audio: frames after subsampling)."""
        return self.mask.sum(dim=1)


@dataclass
class MultimodalOutput:
    """``heads``: each computed head's output by name — classifier (B, K) logits, lm (B, n, V)
    next-token logits, ctc (B, n, V) per-frame logits, action (B, K, A) predictions, projection
    (B, E) embeddings; ``segments``: the hidden states split back per segment; the packed
    ``last_hidden_state`` (B, N, D) and ``attention_mask`` (B, N) (1: real token); per-layer
    states and attention weights when asked."""

    heads: dict[str, Tensor]
    segments: dict[str, SegmentOutput]
    last_hidden_state: Tensor
    attention_mask: Tensor
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None


# --------------------------------------------------------------------------- model


def _embedder(modality: Any, d_model: int) -> nn.Module:
    if modality.kind == "text":
        return TextEmbedder(modality.vocab_size, modality.max_positions, d_model, modality.positions)
    if modality.kind == "image":
        return ImageEmbedder(modality.channels, modality.patch_size, modality.grid, d_model, modality.class_token,
                             modality.positions, modality.positions_cover_prefix, modality.patch_bias)
    if modality.kind == "audio":
        return AudioEmbedder(modality.n_mels, d_model, modality.max_frames, modality.subsampling_channels,
                             modality.positions)
    return TrajectoryEmbedder(modality.state_dim, modality.act_dim, modality.discrete, modality.max_ep_len, d_model,
                              modality.condition_on_returns, modality.embed_norm_eps)


# BackboneConfig fields a copied stack may differ in: the segments' mask sets causality, and
# dropout acts in training only; every other field changes what the stack computes.
_PER_MODEL_FIELDS = ("causal", "dropout", "attn_dropout", "mlp_dropout")


def _stack_function(config: BackboneConfig) -> dict[str, Any]:
    """The fields that decide what a stack computes (those of sublayers it lacks left out)."""
    values = {k: v for k, v in config.to_dict().items() if k not in _PER_MODEL_FIELDS}
    unused = {"token_mlp": ("n_tokens", "token_mlp_dim"), "conv": ("conv_kernel_size", "conv_norm", "conv_mask_padding")}
    for sublayer, names in unused.items():
        if sublayer not in config.block:
            for name in names:
                del values[name]
    if not config.relative_buckets:
        del values["relative_max_distance"]
    return values


# fields whose None stands for a value: None and that value spelled out are the same stack
_DEFAULTED = {"d_ff": lambda c: c.hidden_dim, "head_dim": lambda c: c.head_width,
              "attn_scale": lambda c: c.attn_scale if c.attn_scale is not None else c.head_width ** -0.5}


def _check_same_stack(ours: BackboneConfig, theirs: BackboneConfig) -> None:
    """Refuse a backbone built differently from this model's: its weights would load (same
    names and shapes) into a stack that computes something else (another activation, norm
    placement or epsilon, attention scale, head count…)."""
    mine, given = _stack_function(ours), _stack_function(theirs)
    differ = [k for k in sorted(mine.keys() | given.keys()) if mine.get(k) != given.get(k)
              and not (k in _DEFAULTED and _DEFAULTED[k](ours) == _DEFAULTED[k](theirs))]
    if differ:
        detail = ", ".join(f"{k}={given.get(k)!r} (this model: {mine.get(k)!r})" for k in differ)
        raise ValueError(f"this backbone was built differently from the multimodal model's: {detail}; build the "
                         "MultimodalConfig with the same settings (its d_model / n_layers / n_heads / d_ff / "
                         "activation / norm_eps; the multimodal stack is pre-norm LayerNorm with biases)")


def _carried(model: Any, part: str) -> Processor | None:
    """The ``part`` ("text": a GPT's tokenizer, "labels": a classifier's class names) of ``model``'s
    processor, as a processor of its own (None: it has none), for the one-segment model built from
    it (`MultimodalTransformer.from_gpt` / `from_vit`): saved with it, it still reads raw input."""
    value = getattr(getattr(model, "processor", None), part, None)
    return Processor(**{part: value}) if value is not None else None


class MultimodalTransformer(PretrainedModel):
    """One set of transformer weights for every modality; see the module docstring.

    ``model({"image": image_tokens, "audio": audio_tokens})`` -> `MultimodalOutput`; heads by
    name in ``out.heads``, per-segment states in ``out.segments``.
    """

    config_class = MultimodalConfig

    def __init__(self, config: MultimodalConfig) -> None:
        super().__init__()
        self.config = config
        D = config.d_model
        self.embedders = nn.ModuleDict({name: _embedder(m, D) for name, m in config.modalities.items()})
        # Rows by sorted name: the order of a JSON object is not kept (config.json sorts its keys).
        self.modality_index = {name: i for i, name in enumerate(sorted(config.modalities))}
        self.modality_embed = nn.Embedding(len(config.modalities), D) if config.modality_embedding else None
        self.drop = nn.Dropout(config.dropout)
        self.backbone = Backbone(config.backbone_config())
        self.heads = nn.ModuleDict({name: self._head(h) for name, h in config.heads.items()})
        # GPT-2's init for the stack (residual projections scaled by 1/√(2L)), 0.02 for embeddings.
        init_weights(self.backbone, std=0.02, residual_std=0.02 / math.sqrt(2 * config.n_layers))
        for embedder in self.embedders.values():
            for m in embedder.modules():
                if isinstance(m, nn.Embedding):
                    nn.init.normal_(m.weight, std=0.02)
        if self.modality_embed is not None:
            nn.init.normal_(self.modality_embed.weight, std=0.02)
        for name, head in config.heads.items():
            if head.kind == "lm" and head.tie_embeddings:
                self.heads[name].weight = self.embedders[head.segment].tok_embed.weight

    def _head(self, head: Any) -> nn.Module:
        D = self.config.d_model
        if head.kind == "classifier":
            module = ClassificationHead(D, head.num_classes, head.dropout)
            nn.init.normal_(module.out.weight, std=0.02)
            nn.init.zeros_(module.out.bias)
            return module
        if head.kind == "lm":
            return LMHead(D, self.config.modalities[head.segment].vocab_size)
        if head.kind == "ctc":
            return CTCHead(D, 1 + len(head.vocabulary))
        if head.kind == "action":
            m = self.config.modalities[head.segment]
            return ActionHead(D, m.act_dim, tanh=not m.discrete and m.action_tanh)
        return ProjectionHead(D, head.embed_dim)

    def default_processor(self) -> Processor | None:
        """Images, audio and episodes as the first segment of each kind by name stores them (a text
        segment's tokenizer comes from its data and is saved with the model). By name, not by the
        config's order: a saved config.json lists the segments sorted, and the processor saved beside
        it must be the one its loader builds."""
        parts: dict[str, Any] = {}
        for _, m in sorted(self.config.modalities.items()):
            if m.kind == "image" and "image" not in parts:
                parts["image"] = ImagePreprocessConfig(patch_size=m.patch_size, channels=m.channels, mean=m.mean,
                                                       std=m.std, image_size=m.image_size)
            elif m.kind == "audio" and "audio" not in parts:
                parts["audio"] = SpectrogramConfig.for_model(m.spectrogram, m.n_mels)
            elif m.kind == "trajectory" and "trajectory" not in parts:
                parts["trajectory"] = m.tokenizer()
        return Processor(**parts) if parts else None

    @property
    def tied_keys(self) -> tuple[str, ...]:
        return tuple(f"heads.{name}.weight" for name, h in self.config.heads.items()
                     if h.kind == "lm" and h.tie_embeddings)

    # ------------------------------------------------------------------ from single-modality families
    @classmethod
    def from_gpt(cls, gpt: Any, segment: str = "text", head: str = "lm") -> MultimodalTransformer:
        """A GPT's weights as a one-modality model: text segment ``segment`` (causal) with an LM
        head; the modality embedding is zero, so the logits equal the GPT's. Add modalities by
        loading this backbone into a larger config (`load_backbone`)."""
        c = gpt.config
        if not c.bias:
            raise ValueError("the multimodal backbone has biases; this GPT has bias=False")
        config = MultimodalConfig(
            modalities={segment: TextModality(vocab_size=c.vocab_size, max_positions=c.context_length,
                                              positions=c.positions, causal=True)},
            heads={head: LMHeadConfig(segment=segment, tie_embeddings=c.tie_embeddings)},
            d_model=c.d_model, n_layers=c.n_layers, n_heads=c.n_heads, d_ff=c.d_ff, activation=c.activation,
            norm_eps=c.norm_eps, dropout=c.dropout)
        state = {f"embedders.{segment}.tok_embed.weight": gpt.tok_embed.weight}
        if c.positions == "learned":
            state[f"embedders.{segment}.pos_embed.weight"] = gpt.pos_embed.weight
        if not c.tie_embeddings:
            state[f"heads.{head}.weight"] = gpt.lm_head.weight
        return cls._from_state(config, state, gpt.backbone, _carried(gpt, "text"))

    @classmethod
    def from_vit(cls, vit: Any, segment: str = "image", head: str = "classifier") -> MultimodalTransformer:
        """A class-token ViT's weights as a one-modality model (image segment, classifier head
        on the class token); the logits equal the ViT's."""
        c = vit.config
        unsupported = {"distill_token": c.distill_token, "num_registers": c.num_registers, "pool='avg'": c.pool == "avg",
                       "pre_norm": c.pre_norm, "fc_norm": c.use_fc_norm, "bias=False": not c.bias}
        refused = [k for k, v in unsupported.items() if v]
        if refused:
            raise ValueError(f"an image segment has one class token, no pre/fc norm and biases; this ViT has "
                             f"{', '.join(refused)}")
        config = MultimodalConfig(
            modalities={segment: ImageModality(image_size=c.image_size, patch_size=c.patch_size, channels=c.channels,
                                               mean=c.mean, std=c.std, class_token=c.class_token,
                                               positions=c.positions, positions_cover_prefix=c.positions_cover_prefix,
                                               patch_bias=c.patch_bias)},
            heads={head: ClassifierHeadConfig(segment=segment, num_classes=c.num_classes, pool="cls")} if c.num_classes
            else {},
            d_model=c.d_model, n_layers=c.n_layers, n_heads=c.n_heads, d_ff=c.d_ff, activation=c.activation,
            norm_eps=c.norm_eps, dropout=c.dropout)
        state = {f"embedders.{segment}.{k}": v for k, v in vit.state_dict().items()
                 if k.startswith(("patch_embed.", "cls_token", "pos_embed"))}
        if c.num_classes:
            state.update({f"heads.{head}.out.weight": vit.head.weight, f"heads.{head}.out.bias": vit.head.bias})
        return cls._from_state(config, state, vit.backbone, _carried(vit, "labels") if c.num_classes else None)

    @classmethod
    def from_decision_transformer(cls, dt: Any, segment: str = "trajectory", head: str = "action") -> MultimodalTransformer:
        """A Decision Transformer's weights as a one-modality model (trajectory segment, action
        head); the action predictions equal the DT's."""
        c = dt.config
        fields = {name: getattr(c, name) for name in TOKENIZER_FIELDS}
        config = MultimodalConfig(
            modalities={segment: TrajectoryModality(**fields, action_tanh=c.action_tanh, max_ep_len=c.max_ep_len,
                                                    condition_on_returns=c.condition_on_returns,
                                                    embed_norm_eps=c.embed_norm_eps)},
            heads={head: ActionHeadConfig(segment=segment)},
            d_model=c.d_model, n_layers=c.n_layers, n_heads=c.n_heads, d_ff=c.d_ff, activation=c.activation,
            norm_eps=c.norm_eps, dropout=c.dropout)
        state = {f"embedders.{segment}.{k}": v for k, v in dt.state_dict().items() if k.startswith("embed_")}
        state.update({f"heads.{head}.{k}": v for k, v in dt.action_head.state_dict().items()})
        return cls._from_state(config, state, dt.backbone)

    @classmethod
    def _from_state(cls, config: MultimodalConfig, state: dict[str, Tensor], backbone: Backbone,
                    processor: Processor | None = None) -> MultimodalTransformer:
        model = cls(config)
        model.processor = processor  # what the source model read raw input with that no config stores
        _check_same_stack(model.backbone.config, backbone.config)
        state = {**state, **{f"backbone.{k}": v for k, v in backbone.state_dict().items()}}
        ignore = (*model.tied_keys, "modality_embed.weight")
        load_state_dict_strict(model, {k: v.detach().clone() for k, v in state.items()}, ignore=ignore)
        if model.modality_embed is not None:
            nn.init.zeros_(model.modality_embed.weight)
        return model.eval()

    def load_backbone(self, source: nn.Module | Backbone) -> None:
        """Copy a trained backbone (a `Backbone`, or any family's ``.backbone``) into this model,
        e.g. an image-trained ViT's stack to read audio or trajectories through new embedders.
        The two must be built alike (width, heads, activation, norm epsilon…; causality and
        dropout aside): build this model's config with the source's settings."""
        backbone = source if isinstance(source, Backbone) else getattr(source, "backbone", None)
        if not isinstance(backbone, Backbone):
            raise TypeError(f"load_backbone takes a Backbone or a model with .backbone, got {type(source).__name__}")
        _check_same_stack(self.backbone.config, backbone.config)
        load_state_dict_strict(self.backbone, backbone.state_dict())

    def policy(self, segment: str = "trajectory", head: str = "action") -> TrajectoryPolicy:
        """The trajectory segment ``segment`` with its action head ``head`` as a policy for
        `unitok.rollouts.evaluate_returns` (return-conditioned rollouts in gymnasium)."""
        return TrajectoryPolicy(self, segment, head)

    def freeze_backbone(self) -> None:
        """Meta-Transformer's recipe: keep a trained backbone fixed; only embedders and heads learn."""
        self.backbone.requires_grad_(False)

    # ------------------------------------------------------------------ embedding
    def embed_segment(self, name: str, value: Any) -> Segment:
        """One segment's input -> its `Segment` (embeddings with the modality embedding, mask)."""
        if name not in self.embedders:
            raise ValueError(f"unknown modality {name!r}; this model reads {', '.join(self.embedders)}")
        modality = self.config.modalities[name]
        embedder = self.embedders[name]
        kind = modality.kind
        if kind == "text":
            x, mask = self._embed_text(name, embedder, value)
        elif kind == "image":
            x, mask = self._embed_image(name, modality, embedder, value)
        elif kind == "audio":
            x, mask = self._embed_audio(name, modality, embedder, value)
        else:
            x, mask = self._embed_trajectory(name, modality, embedder, value)
        if self.modality_embed is not None:
            x = x + self.modality_embed.weight[self.modality_index[name]]
        return Segment(name, x, mask, modality.causal)

    @staticmethod
    def _embed_text(name: str, embedder: TextEmbedder, value: Any) -> tuple[Tensor, Tensor]:
        if isinstance(value, Tensor):
            value = Tokens(ids=value)
        if not isinstance(value, Tokens) or value.ids is None:
            raise ValueError(f"segment {name!r} is text: it reads Tokens with ids, got {_describe(value)}")
        if value.seq_len == 0:
            raise ValueError(f"segment {name!r} is empty")
        if value.attention_mask is None:
            mask = _ones(value.ids)
        else:  # a 0/2 or an additive mask would be read as something else (positions count the mask)
            check_padding_mask(value.attention_mask, tuple(value.ids.shape), f"segment {name!r} attention_mask")
            mask = value.attention_mask.bool()
        return embedder(value.ids, value.attention_mask, value.positions), mask

    @staticmethod
    def _embed_image(name: str, modality: ImageModality, embedder: ImageEmbedder, value: Any) -> tuple[Tensor, Tensor]:
        if isinstance(value, Tensor):
            if value.dim() != 4 or not value.dtype.is_floating_point:
                raise ValueError(f"segment {name!r} is image: pixels must be normalised (batch, channels, height, "
                                 f"width) floats, got {value.dtype} {tuple(value.shape)}")
            if value.shape[1] != modality.channels:
                raise ValueError(f"segment {name!r} expects {modality.channels} channels, got {value.shape[1]}")
            H, W = value.shape[-2:]
            P = modality.patch_size
            if H % P or W % P:
                raise ValueError(f"segment {name!r}: image size {H}×{W} is not divisible by the patch size {P}")
            check_dtype(value, next(embedder.parameters()), f"segment {name!r} pixels")
            check_finite(value, f"segment {name!r} pixels")
            patches, grid, given = patchify(value, P), (H // P, W // P), None
        elif isinstance(value, Tokens) and value.features is not None and value.grid is not None:
            check_dtype(value.features, next(embedder.parameters()), f"segment {name!r} patch features")
            check_finite(value.features, f"segment {name!r} patch features")
            patches, grid, given = value.features, value.grid, value.attention_mask
            if given is not None:
                check_padding_mask(given, tuple(patches.shape[:2]), f"segment {name!r} attention_mask")
        else:
            raise ValueError(f"segment {name!r} is image: it reads patch Tokens (features with a grid, from "
                             f"PatchTokenizer) or pixel tensors, got {_describe(value)}")
        x = embedder(patches, grid)
        mask = _ones(x[..., 0])
        if given is not None:  # patch padding (rare): the class token stays real
            mask[:, x.shape[1] - given.shape[1]:] = given.bool()
        return x, mask

    @staticmethod
    def _embed_audio(name: str, modality: AudioModality, embedder: AudioEmbedder, value: Any) -> tuple[Tensor, Tensor]:
        if not isinstance(value, Tokens) or value.features is None or value.grid is not None:
            raise ValueError(f"segment {name!r} is audio: it reads Tokens of log-mel frames (from "
                             f"SpectrogramTokenizer), got {_describe(value)}")
        frames = value.features
        if frames.shape[-1] != modality.n_mels:
            raise ValueError(f"segment {name!r} expects {modality.n_mels} mel bins per frame, got {frames.shape[-1]}")
        check_dtype(frames, next(embedder.parameters()), f"segment {name!r} frames")
        check_finite(frames, f"segment {name!r} frames")
        if value.attention_mask is None:
            lengths = torch.full((frames.shape[0],), frames.shape[1], dtype=torch.long, device=frames.device)
        else:
            check_padding_mask(value.attention_mask, tuple(frames.shape[:2]), f"segment {name!r} attention_mask")
            mask = value.attention_mask.bool()
            lengths = mask.long().sum(dim=1)
            # the convolutional front end reads each utterance's first `lengths` frames
            right = torch.arange(mask.shape[1], device=mask.device)[None, :] < lengths[:, None]
            if not bool((mask == right).all()):
                raise ValueError(f"segment {name!r} must be right-padded (real frames first, as collate's default "
                                 "padding_side='right' gives them); got padding before real frames")
        try:
            x, lengths = embedder(frames, lengths)
        except ValueError as error:  # the front end's checks (too-short rows), named by segment
            raise ValueError(f"segment {name!r}: {error}") from None
        mask = torch.arange(x.shape[1], device=x.device)[None, :] < lengths[:, None]
        return x, mask

    @staticmethod
    def _embed_trajectory(name: str, modality: TrajectoryModality, embedder: TrajectoryEmbedder,
                          value: Any) -> tuple[Tensor, Tensor]:
        if not isinstance(value, TrajectoryWindows):
            raise ValueError(f"segment {name!r} is a trajectory: it reads TrajectoryWindows (from "
                             f"TrajectoryTokenizer), got {_describe(value)}")
        if value.context_length > modality.context_length:
            raise ValueError(f"segment {name!r} has windows of {value.context_length} steps, more than its "
                             f"context_length={modality.context_length}")
        if value.context_length == 0:
            raise ValueError(f"segment {name!r} is empty (windows of 0 steps)")
        if value.timesteps.is_floating_point():
            raise TypeError(f"segment {name!r} timesteps must be integers, got {value.timesteps.dtype}")
        weight = next(embedder.parameters())
        check_dtype(value.states, weight, f"segment {name!r} states")
        actions, (B, K) = value.actions, value.states.shape[:2]
        if actions.is_floating_point():  # continuous actions, or discrete ones one-hot
            check_dtype(actions, weight, f"segment {name!r} actions")
            check_finite(actions, f"segment {name!r} actions")
        elif not modality.discrete:
            raise TypeError(f"segment {name!r} has continuous actions: floats of shape (B, K, {modality.act_dim}), "
                            f"got {actions.dtype}")
        elif tuple(actions.shape) != (B, K):
            raise ValueError(f"segment {name!r} reads discrete action ids of shape (B, K) = {(B, K)}, got "
                             f"{tuple(actions.shape)}")
        check_padding_mask(value.attention_mask, (B, K), f"segment {name!r} attention_mask")
        if value.returns_to_go is not None:
            if tuple(value.returns_to_go.shape) not in ((B, K), (B, K, 1)):
                raise ValueError(f"segment {name!r} returns_to_go must be (batch, steps) or (batch, steps, 1) = "
                                 f"{(B, K)} or {(B, K, 1)}, got {tuple(value.returns_to_go.shape)}")
            check_finite(value.returns_to_go, f"segment {name!r} returns_to_go")
        try:
            x = embedder(value.states, actions, value.returns_to_go, value.timesteps)
        except ValueError as error:
            raise ValueError(f"segment {name!r}: {error}") from None
        mask = value.attention_mask.bool().repeat_interleave(embedder.tokens_per_step, dim=1)
        return x, mask

    # ------------------------------------------------------------------ forward
    @deferred_checks()  # on a GPU, input checks' verdicts are read as the forward ends: no host sync
    def forward(
        self,
        inputs: Mapping[str, Any],
        heads: Sequence[str] | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        kernel: Kernel = "sdpa",
    ) -> MultimodalOutput:
        """Embed each segment, pack them (in ``inputs``' order), run the backbone once, apply heads.

        Args:
            inputs: segment name -> `Tokens` (text ids; image patches or a pixel tensor; audio
                frames) or `TrajectoryWindows`.
            heads: the heads to compute; None: every head whose segment is in ``inputs``.
        """
        if not isinstance(inputs, Mapping) or not inputs:
            raise ValueError("inputs must be a non-empty mapping of segment name -> tokens, e.g. {'image': tokens}")
        unknown = [n for n in inputs if n not in self.embedders]
        if unknown:
            raise ValueError(f"unknown modality {unknown[0]!r}; this model reads {', '.join(self.embedders)}")
        sizes = {n: _batch_size(v) for n, v in inputs.items()}
        if len(set(sizes.values())) != 1:
            raise ValueError(f"every segment needs the same batch size, got {sizes}")
        chosen = self._chosen_heads(heads, inputs)
        packed = pack_segments([self.embed_segment(name, value) for name, value in inputs.items()])
        x = packed.embeddings
        if self.training and self.drop.p > 0:
            x = self.drop(x)
        out = self.backbone(x, packed.attention_mask, mask=packed.mask, causal=packed.is_causal,
                            output_hidden_states=output_hidden_states, output_attentions=output_attentions,
                            kernel=kernel)
        h = out.last_hidden_state
        segments = {name: SegmentOutput(span.select(h), span.mask, span.start, span.stop)
                    for name, span in packed.spans.items()}
        real = torch.cat([s.mask for s in segments.values()], dim=1)
        results = {name: self._apply_head(name, h, real, segments, packed.spans) for name in chosen}
        return MultimodalOutput(heads=results, segments=segments, last_hidden_state=h, attention_mask=real.long(),
                                hidden_states=out.hidden_states, attentions=out.attentions)

    def _chosen_heads(self, heads: Sequence[str] | None, inputs: Mapping[str, Any]) -> list[str]:
        config = self.config.heads
        if heads is None:
            return [n for n, h in config.items() if h.segment is None or h.segment in inputs]
        if isinstance(heads, str):  # its letters are not head names
            raise TypeError(f"heads must be a list of head names, got the string {heads!r} (for one: [{heads!r}])")
        for name in heads:
            if name not in config:
                raise ValueError(f"unknown head {name!r}; this model has {', '.join(config) or 'no heads'}")
            segment = config[name].segment
            if segment is not None and segment not in inputs:
                raise ValueError(f"head {name!r} reads segment {segment!r}, which this batch does not have "
                                 f"(it has {', '.join(inputs)})")
        return list(heads)

    def _apply_head(self, name: str, hidden: Tensor, real: Tensor, segments: dict[str, SegmentOutput],
                    spans: dict[str, SegmentSpan]) -> Tensor:
        head, module = self.config.heads[name], self.heads[name]
        if head.segment is None:
            states, mask = hidden, real
        else:
            states, mask = segments[head.segment].hidden, segments[head.segment].mask
        if head.kind in ("classifier", "projection"):
            return module(pool_tokens(states, mask, head.pool))
        if head.kind in ("lm", "ctc"):
            return module(states)
        # action: read each step's state token (the second to last of its G tokens)
        G = self.embedders[head.segment].tokens_per_step
        B, n, D = states.shape
        return module(states.reshape(B, n // G, G, D)[:, :, G - 2])


class TrajectoryPolicy(nn.Module):
    """A trajectory segment of a `MultimodalTransformer` and its action head, seen as a Decision
    Transformer: ``policy(states, actions, returns_to_go, timesteps)`` returns an object with
    ``action_preds``, and ``config`` / ``tokenizer()`` describe the segment, so
    `unitok.rollouts.evaluate_returns` plays it in gymnasium."""

    def __init__(self, model: MultimodalTransformer, segment: str, head: str) -> None:
        super().__init__()
        if head not in model.config.heads or model.config.heads[head].kind != "action":
            raise ValueError(f"{head!r} is not an action head of this model")
        if model.config.heads[head].segment != segment:
            raise ValueError(f"action head {head!r} reads segment {model.config.heads[head].segment!r}, not {segment!r}")
        self.model, self.segment, self.head = model, segment, head
        self.config = model.config.modalities[segment]

    def tokenizer(self) -> TrajectoryTokenizer:
        return self.config.tokenizer()

    def forward(self, states: Tensor, actions: Tensor, returns_to_go: Tensor, timesteps: Tensor,
                attention_mask: Tensor | None = None) -> Any:
        from types import SimpleNamespace

        B, K = states.shape[:2]
        mask = attention_mask if attention_mask is not None else torch.ones(B, K, dtype=torch.long,
                                                                          device=states.device)
        zeros = torch.zeros(B, K, device=states.device)
        windows = TrajectoryWindows(states=states, actions=actions, returns_to_go=returns_to_go, timesteps=timesteps,
                                    attention_mask=mask, rewards=zeros, terminals=zeros.long())
        return SimpleNamespace(action_preds=self.model({self.segment: windows}, heads=[self.head]).heads[self.head])


def _ones(like: Tensor) -> Tensor:
    return torch.ones(like.shape[:2], dtype=torch.bool, device=like.device)


def _batch_size(value: Any) -> int:
    if isinstance(value, (Tokens, TrajectoryWindows)):
        return value.batch_size
    if isinstance(value, Tensor) and value.dim() >= 2:
        return value.shape[0]
    raise ValueError(f"a segment must be Tokens, TrajectoryWindows or a batched tensor, got {_describe(value)}")


def _describe(value: Any) -> str:
    if isinstance(value, Tokens):
        what = "ids" if value.ids is not None else ("patch features" if value.grid is not None else "features")
        return f"{value.modality} Tokens holding {what} of shape {value.shape}"
    if isinstance(value, Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    return type(value).__name__


