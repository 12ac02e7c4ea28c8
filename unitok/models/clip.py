"""CLIP (Radford et al., 2021): an image tower and a text tower over the one backbone, each
followed by a linear projection into a shared embedding space, plus a learnable temperature.

The image tower is unitok's `ViT` (class-token pooling, CLIP's ``ln_pre``, no patch bias);
the text tower is token + learned positions -> causal backbone -> the features at the
end-of-text token. An optional audio tower (log-mel frames -> ×4 convolutional front end +
time positions -> bidirectional backbone -> mean of the frames) binds speech into the same
space, ImageBind-style: trained on (audio, image) pairs only, it becomes classifiable by
text prompts it never met. With ``shared_backbone=True`` every tower runs the same Backbone
(causal for text, bidirectional for images and audio: VATT's modality-agnostic encoder).
Losses live in ``tasks/contrastive.py`` and ``tasks/binding.py``.

Axis legend: B batch, N tokens, D tower width, E joint embedding width.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tokenizers_mm import CLIPTokenizer, PatchTokenizer, Processor, SpectrogramConfig, Tokens
from tokenizers_mm.checks import check_int
from unitok.backbone import Backbone, BackboneConfig, init_weights
from unitok.checks import check_dtype, check_finite, deferred_checks, defers, host_values, raise_if
from unitok.config import Config
from unitok.embed import TokenEmbedding
from unitok.embed.modalities import AudioEmbedder
from unitok.heads.pooling import pool_tokens
from unitok.layers.activations import Activation
from unitok.layers.attention import check_padding_mask
from unitok.models.base import PretrainedModel, load_state_dict_strict
from unitok.models.vit import ViT, ViTConfig
from unitok.outputs import CLIPOutput

OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)

# What a CLIP image tower is, on top of ViTConfig's defaults: no classifier, ln_pre, no
# patch bias, LayerNorm eps 1e-5, OpenAI's normalisation, resize + centre crop of the full side.
CLIP_VISION_DEFAULTS: dict[str, Any] = dict(
    num_classes=0, pre_norm=True, patch_bias=False, norm_eps=1e-5, mean=OPENAI_MEAN, std=OPENAI_STD,
    crop_pct=1.0,
)


@dataclass(frozen=True)
class CLIPTextConfig(Config):
    """CLIP's text tower.

    Args:
        vocab_size / context_length: CLIP's BPE (49,408 ids) and the most ids per caption.
        d_model / n_layers / n_heads / d_ff / activation / norm_eps / dropout: the causal backbone.
        eot_token_id: the end-of-text id whose features become the caption's embedding.
    """

    vocab_size: int = 49408
    context_length: int = 77
    d_model: int = 512
    n_layers: int = 12
    n_heads: int = 8
    d_ff: int | None = None
    activation: Activation = "gelu"
    norm_eps: float = 1e-5
    dropout: float = 0.0
    eot_token_id: int = 49407

    def __post_init__(self) -> None:
        if not 0 <= self.eot_token_id < self.vocab_size:
            raise ValueError(f"eot_token_id={self.eot_token_id} is outside the vocabulary [0, {self.vocab_size})")
        if self.context_length < 2:
            raise ValueError(f"context_length must be ≥ 2, got {self.context_length}")
        self.backbone_config()

    def backbone_config(self) -> BackboneConfig:
        return BackboneConfig(
            d_model=self.d_model, n_layers=self.n_layers, n_heads=self.n_heads, d_ff=self.d_ff,
            norm_eps=self.norm_eps, activation=self.activation, causal=True, dropout=self.dropout,
            attn_dropout=self.dropout,
        )  # otherwise the defaults: pre-LN blocks of attention + MLP, biases, a final LayerNorm


@dataclass(frozen=True)
class CLIPAudioConfig(Config):
    """CLIP's optional audio tower.

    Args:
        n_mels: mel bins per input frame. max_frames: positions after the ×4 subsampling
            (512 ≈ 20 s at a 10 ms hop). subsampling_channels: the front end's width (default D).
        d_model / n_layers / n_heads / d_ff / activation / norm_eps / dropout: the bidirectional backbone.
        pool: the utterance's features: the mean of its frames, or a class token's.
        spectrogram: `tokenizers_mm.SpectrogramConfig` fields that turn raw audio into frames
            (given in part, stored whole at this ``n_mels``; empty: the defaults).
    """

    n_mels: int = 80
    max_frames: int = 512
    subsampling_channels: int | None = None
    d_model: int = 512
    n_layers: int = 12
    n_heads: int = 8
    d_ff: int | None = None
    activation: Activation = "gelu"
    norm_eps: float = 1e-5
    dropout: float = 0.0
    pool: Literal["mean", "cls"] = "mean"
    spectrogram: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "spectrogram", SpectrogramConfig.stored(self.spectrogram, self.n_mels))
        check_int("subsampling_channels", self.subsampling_channels, or_none=True)  # 0 would read as "d_model"
        self.backbone_config()

    def backbone_config(self) -> BackboneConfig:
        return BackboneConfig(
            d_model=self.d_model, n_layers=self.n_layers, n_heads=self.n_heads, d_ff=self.d_ff,
            norm_eps=self.norm_eps, activation=self.activation, causal=False, dropout=self.dropout,
            attn_dropout=self.dropout,
        )  # otherwise the defaults: pre-LN blocks of attention + MLP, biases, a final LayerNorm


def _vision(**fields: Any) -> ViTConfig:
    return ViTConfig.from_dict({**CLIP_VISION_DEFAULTS, **fields})


@dataclass(frozen=True)
class CLIPConfig(Config):
    """Two towers and a joint embedding.

    Args:
        embed_dim: E, the width both projections map into.
        vision: the image tower, a `ViTConfig` (or a dict of its fields over CLIP's defaults:
            no classifier, ln_pre, no patch bias, eps 1e-5, OpenAI mean/std).
        text: the text tower, a `CLIPTextConfig` (or a dict of its fields).
        audio: an optional audio tower, a `CLIPAudioConfig` (or a dict of its fields); it has
            its own projection and temperature (``logit_scale_audio``, for audio–image pairs).
        shared_backbone: every tower runs one Backbone (one set of transformer weights); the
            towers' widths, depths, heads and activations must then agree.
        projection_bias: biases in the two projections (open_clip's ``proj_bias``).
        init_logit_scale: the temperature's log-inverse at init, log(1/0.07).
    """

    embed_dim: int = 512
    vision: ViTConfig = field(default_factory=_vision)
    text: CLIPTextConfig = field(default_factory=CLIPTextConfig)
    audio: CLIPAudioConfig | None = None
    shared_backbone: bool = False
    projection_bias: bool = False
    init_logit_scale: float = math.log(1 / 0.07)

    presets = {
        # open_clip's model configs (model_configs/*.json), the same names.
        "ViT-B-32": dict(embed_dim=512, vision=dict(patch_size=32, d_model=768, n_layers=12, n_heads=12)),
        "ViT-B-16": dict(embed_dim=512, vision=dict(patch_size=16, d_model=768, n_layers=12, n_heads=12)),
        "ViT-L-14": dict(embed_dim=768, vision=dict(patch_size=14, d_model=1024, n_layers=24, n_heads=16),
                         text=dict(d_model=768, n_heads=12)),
        # CPU-sized, for the built-in captioned digits (32×32 one-channel scans, 4×4 patches of 8×8).
        "clip-digits": dict(
            embed_dim=64,
            vision=dict(image_size=(32, 32), patch_size=8, channels=1, d_model=64, n_layers=4, n_heads=4,
                        mean=(0.5,), std=(0.5,), crop_pct=None),
            text=dict(d_model=64, n_layers=2, n_heads=4),
        ),
        "clip-digits-shared": dict(
            embed_dim=64, shared_backbone=True,
            vision=dict(image_size=(32, 32), patch_size=8, channels=1, d_model=64, n_layers=4, n_heads=4,
                        mean=(0.5,), std=(0.5,), crop_pct=None),
            text=dict(d_model=64, n_layers=4, n_heads=4),
        ),
        # Image, text and speech in one space: clip-digits plus an audio tower (spoken digits).
        "clip-digits-audio": dict(
            embed_dim=64,
            vision=dict(image_size=(32, 32), patch_size=8, channels=1, d_model=64, n_layers=4, n_heads=4,
                        mean=(0.5,), std=(0.5,), crop_pct=None),
            text=dict(d_model=64, n_layers=2, n_heads=4),
            audio=dict(n_mels=80, subsampling_channels=32, d_model=64, n_layers=4, n_heads=4),
        ),
        "clip-digits-audio-shared": dict(
            embed_dim=64, shared_backbone=True,
            vision=dict(image_size=(32, 32), patch_size=8, channels=1, d_model=64, n_layers=4, n_heads=4,
                        mean=(0.5,), std=(0.5,), crop_pct=None),
            text=dict(d_model=64, n_layers=4, n_heads=4),
            audio=dict(n_mels=80, subsampling_channels=32, d_model=64, n_layers=4, n_heads=4),
        ),
    }

    def __post_init__(self) -> None:
        if isinstance(self.vision, dict):
            object.__setattr__(self, "vision", _vision(**self.vision))
        if isinstance(self.text, dict):
            object.__setattr__(self, "text", CLIPTextConfig.from_dict(self.text))
        if isinstance(self.audio, dict):
            object.__setattr__(self, "audio", CLIPAudioConfig.from_dict(self.audio))
        if not isinstance(self.vision, ViTConfig) or not isinstance(self.text, CLIPTextConfig):
            raise TypeError("vision must be a ViTConfig (or dict) and text a CLIPTextConfig (or dict)")
        if self.audio is not None and not isinstance(self.audio, CLIPAudioConfig):
            raise TypeError("audio must be a CLIPAudioConfig (or dict), or None")
        if self.embed_dim <= 0:
            raise ValueError(f"embed_dim must be positive, got {self.embed_dim}")
        v, t = self.vision, self.text
        if v.num_classes:
            raise ValueError(f"a CLIP image tower has no classifier: vision.num_classes must be 0, got {v.num_classes}")
        if v.pool != "cls" or v.distill_token:
            raise ValueError("CLIP's image tower reads its class token: vision needs pool='cls' and no distill_token")
        if self.shared_backbone:
            towers = {"text": t, **({"audio": self.audio} if self.audio is not None else {})}
            for tower_name, tower in towers.items():
                for name in ("d_model", "n_layers", "n_heads", "activation", "norm_eps", "dropout"):
                    if getattr(v, name) != getattr(tower, name):
                        raise ValueError(f"shared_backbone needs equal towers: vision.{name}={getattr(v, name)!r} "
                                         f"but {tower_name}.{name}={getattr(tower, name)!r}")
                if v.backbone_config().hidden_dim != tower.backbone_config().hidden_dim:
                    raise ValueError(f"shared_backbone needs equal MLP widths (d_ff) in the vision and {tower_name} "
                                     "towers")


class TextTower(nn.Module):
    """Caption ids -> (B, D) features at the end-of-text token (after the final LayerNorm)."""

    def __init__(self, config: CLIPTextConfig) -> None:
        super().__init__()
        self.config = config
        self.token_embed = TokenEmbedding(config.vocab_size, config.d_model)
        self.pos_embed = nn.Parameter(torch.empty(config.context_length, config.d_model))
        self.backbone = Backbone(config.backbone_config())
        init_weights(self.backbone, std=0.02)
        nn.init.normal_(self.token_embed.weight, std=0.02)
        nn.init.normal_(self.pos_embed, std=0.01)

    def end_positions(self, ids: Tensor) -> Tensor:
        """(B, N) ids -> (B,) index of each caption's first end-of-text token (an error if absent)."""
        is_end = ids == self.config.eot_token_id
        missing = ~is_end.any(dim=1)
        if bool(missing.any()):
            rows = missing.nonzero().flatten()[:5].tolist()
            raise ValueError(f"captions {rows} have no end-of-text token (id {self.config.eot_token_id}); "
                             "encode them with the model's CLIPTokenizer")
        return is_end.int().argmax(dim=1)

    def forward(self, ids: Tensor, backbone: Backbone | None = None) -> Tensor:
        if ids.dim() != 2:
            raise ValueError(f"caption ids must be (batch, tokens), got shape {tuple(ids.shape)}")
        if ids.shape[1] > self.config.context_length:
            raise ValueError(f"captions have {ids.shape[1]} tokens, more than context_length="
                             f"{self.config.context_length}")
        end = self.end_positions(ids)
        # Causal attention: nothing after the last end token can reach any end token, so the
        # padding behind it need not be computed at all (open_clip always runs the full context).
        n = int(end.max()) + 1
        ids = ids[:, :n]
        x = self.token_embed(ids) + self.pos_embed[:n]
        h = (backbone or self.backbone)(x, causal=True).last_hidden_state  # (B, n, D)
        return h[torch.arange(h.shape[0], device=h.device), end]


class AudioTower(nn.Module):
    """(B, N, F) log-mel frames and (B,) lengths -> (B, D) utterance features: the ×4 front end
    with time positions, a bidirectional backbone, then the mean of the real frames (or a
    class token's state)."""

    def __init__(self, config: CLIPAudioConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = AudioEmbedder(config.n_mels, config.d_model, config.max_frames, config.subsampling_channels,
                                   positions="sinusoidal")
        self.cls_token = nn.Parameter(torch.zeros(1, 1, config.d_model)) if config.pool == "cls" else None
        self.backbone = Backbone(config.backbone_config())
        init_weights(self.backbone, std=0.02)

    def forward(self, frames: Tensor, lengths: Tensor, backbone: Backbone | None = None) -> Tensor:
        x, lengths = self.embed(frames, lengths)  # (B, n, D), (B,)
        mask = torch.arange(x.shape[1], device=x.device)[None, :] < lengths[:, None]
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
            mask = torch.cat([torch.ones_like(mask[:, :1]), mask], dim=1)
        h = (backbone or self.backbone)(x, mask.long(), causal=False).last_hidden_state
        return h[:, 0] if self.cls_token is not None else pool_tokens(h, mask, "mean")


def _check_audio_lengths(lengths: Tensor, B: int, N: int) -> None:
    """``lengths`` must give each of the B utterances its count of real frames, 1 to N: a wrong
    shape would broadcast one count to every utterance, a count past N names frames not given."""
    if not isinstance(lengths, Tensor) or lengths.dtype == torch.bool or lengths.is_floating_point() \
            or lengths.is_complex():
        got = f"a {lengths.dtype} tensor" if isinstance(lengths, Tensor) else type(lengths).__name__
        raise TypeError(f"audio lengths must be an integer tensor of frame counts, got {got}")
    if lengths.shape != (B,):
        raise ValueError(f"audio lengths must be ({B},), one frame count per utterance, got shape "
                         f"{tuple(lengths.shape)}")
    values = host_values(lengths)

    def fail() -> None:
        raise ValueError(f"audio lengths must be frame counts in [1, {N}] (the frames given), got {values.tolist()}")

    raise_if(((values < 1) | (values > N)).any(), fail, defers(values))


class CLIP(PretrainedModel):
    """Contrastive image–text model: ``encode_image`` and ``encode_text`` into one space.

    The method names follow open_clip (``encode_image``, ``encode_text``, ``logit_scale``), so
    code written for open_clip models — `unitok.zero_shot.ZeroShotClassifier` among it — takes
    unitok CLIP models as they are.
    """

    config_class = CLIPConfig

    def __init__(self, config: CLIPConfig) -> None:
        super().__init__()
        self.config = config
        self.visual = ViT(config.vision)
        self.visual_proj = nn.Linear(config.vision.d_model, config.embed_dim, bias=config.projection_bias)
        self.text = TextTower(config.text)
        if config.shared_backbone:
            self.text.backbone = self.visual.backbone  # one set of weights, registered under both names
        self.text_proj = nn.Linear(config.text.d_model, config.embed_dim, bias=config.projection_bias)
        self.logit_scale = nn.Parameter(torch.tensor(float(config.init_logit_scale)))
        projections = [(self.visual_proj, config.vision.d_model), (self.text_proj, config.text.d_model)]
        if config.audio is not None:
            self.audio = AudioTower(config.audio)
            if config.shared_backbone:
                self.audio.backbone = self.visual.backbone
            self.audio_proj = nn.Linear(config.audio.d_model, config.embed_dim, bias=config.projection_bias)
            # audio–image pairs get a temperature of their own
            self.logit_scale_audio = nn.Parameter(torch.tensor(float(config.init_logit_scale)))
            projections.append((self.audio_proj, config.audio.d_model))
        for proj, width in projections:
            nn.init.normal_(proj.weight, std=width**-0.5)
            if proj.bias is not None:
                nn.init.zeros_(proj.bias)

    def no_weight_decay(self) -> set[str]:
        """Parameters AdamW should not decay, as open_clip's training excludes them (every tensor of
        fewer than 2 dimensions): the image tower's class token, a (D,) vector there (positions,
        2-D there, decay)."""
        return {"visual.cls_token"} if self.visual.cls_token is not None else set()

    @property
    def tied_keys(self) -> tuple[str, ...]:
        if not self.config.shared_backbone:
            return ()
        towers = ("text", "audio") if self.config.audio is not None else ("text",)
        return tuple(f"{tower}.backbone.{k}" for tower in towers for k in self.visual.backbone.state_dict())

    @classmethod
    def from_vit(cls, vit: ViT, text: CLIPTextConfig | None = None, embed_dim: int = 512,
                 **overrides: Any) -> CLIP:
        """A CLIP whose image tower starts from a trained `ViT` (its classifier head dropped),
        e.g. ``ViT.from_pretrained("runs/vit_digits/latest/pretrained")``; LiT locks it afterwards."""
        vision = vit.config.replace(num_classes=0)
        if vision.pool != "cls":
            raise ValueError(f"the ViT pools with {vision.pool!r}; a CLIP image tower reads the class token")
        if vision.distill_token:
            raise ValueError("a DeiT (distillation token) cannot be a CLIP image tower; use a plain ViT")
        config = CLIPConfig(embed_dim=embed_dim, vision=vision, text=text or CLIPTextConfig(), **overrides)
        model = cls(config)
        state = {k: v for k, v in vit.state_dict().items() if not k.startswith(("head.", "head_dist."))}
        load_state_dict_strict(model.visual, state)
        return model.eval()

    # ------------------------------------------------------------------ towers
    def default_processor(self) -> Processor:
        """CLIP's BPE at the text context, images as the image tower expects, audio settings."""
        audio = None
        if self.config.audio is not None:
            audio = SpectrogramConfig.for_model(self.config.audio.spectrogram, self.config.audio.n_mels)
        return Processor(text=self.text_tokenizer(), image=self.visual.config.preprocess_config(), audio=audio)

    def image_tokenizer(self, resize: bool = False) -> PatchTokenizer:
        """Raw images -> patch `Tokens`, with the normalisation stored in the config."""
        return self.visual.image_tokenizer(resize)

    def text_tokenizer(self, truncation: str = "error") -> CLIPTokenizer:
        """CLIP's BPE with this model's context length (``truncation``: "error", "warn", "silent")."""
        return CLIPTokenizer(self.config.text.context_length, truncation=truncation)  # type: ignore[arg-type]

    def encode_image(self, pixel_values: Tensor | Tokens, normalize: bool = False) -> Tensor:
        """Normalised (B, C, H, W) pixels at the configured size, or image `Tokens`, -> (B, E)."""
        expected = self.config.vision.image_size
        size = pixel_values.shape[-2:] if isinstance(pixel_values, Tensor) and pixel_values.dim() == 4 else None
        grid = pixel_values.grid if isinstance(pixel_values, Tokens) else None
        if (size is not None and tuple(size) != tuple(expected)) or (grid is not None and grid != self.visual.grid):
            got = tuple(size) if size is not None else f"a {grid} patch grid"
            raise ValueError(f"CLIP's image tower takes {expected[0]}×{expected[1]} images, got {got}; "
                             "resize them first (image_tokenizer(resize=True) or ZeroShotClassifier(resize=True))")
        # A class-token tower's last block computes the class token alone (`ViT`'s
        # class_tokens_only): the same embedding, a layer's worth less work on the patches.
        features = self.visual(pixel_values, class_tokens_only=self.visual.reads_class_tokens).pooled  # (B, D)
        x = self.visual_proj(features)
        return F.normalize(x, dim=-1) if normalize else x

    def encode_text(self, text: Tensor | Tokens | str | Sequence[str], normalize: bool = False) -> Tensor:
        """(B, N) caption ids from `CLIPTokenizer` (or its `Tokens`), or strings -> (B, E)."""
        if isinstance(text, str) or (isinstance(text, Sequence) and text and isinstance(text[0], str)):
            text = self.text_tokenizer().batch_encode([text] if isinstance(text, str) else list(text))
            text = text.to(self.logit_scale.device)
        ids = text.ids if isinstance(text, Tokens) else text
        if ids is None or not isinstance(ids, Tensor):
            raise ValueError(f"encode_text reads token ids or strings, got {type(text).__name__}")
        backbone = self.visual.backbone if self.config.shared_backbone else None
        x = self.text_proj(self.text(ids, backbone))
        return F.normalize(x, dim=-1) if normalize else x

    def audio_tokenizer(self) -> Any:
        """The `SpectrogramTokenizer` with this model's stored settings (raw audio -> frames)."""
        from tokenizers_mm import SpectrogramConfig, SpectrogramTokenizer

        audio = self._audio_config()
        return SpectrogramTokenizer(SpectrogramConfig.for_model(audio.spectrogram, audio.n_mels))

    def _audio_config(self) -> CLIPAudioConfig:
        if self.config.audio is None:
            raise ValueError("this CLIP has no audio tower (an image–text model); build one with audio=... "
                             "(e.g. the clip-digits-audio preset)")
        return self.config.audio

    def encode_audio(self, audio: Tensor | Tokens, lengths: Tensor | None = None, normalize: bool = False) -> Tensor:
        """(B, N, F) log-mel frames with (B,) integer lengths in [1, N] (default: all N), or audio
        `Tokens` from `audio_tokenizer`, -> (B, E)."""
        config = self._audio_config()
        if isinstance(audio, Tokens):
            if audio.features is None or audio.grid is not None:
                raise ValueError("encode_audio reads audio Tokens of log-mel frames, got ids or image patches")
            if lengths is None and audio.attention_mask is not None:  # its sum: each utterance's frames
                check_padding_mask(audio.attention_mask, tuple(audio.features.shape[:2]), "audio attention_mask")
                lengths = audio.attention_mask.long().sum(dim=1)
            audio = audio.features
        if not isinstance(audio, Tensor) or audio.dim() != 3 or audio.shape[-1] != config.n_mels:
            shape = tuple(audio.shape) if isinstance(audio, Tensor) else type(audio).__name__
            raise ValueError(f"audio frames must be (batch, frames, {config.n_mels}), got {shape}; raw audio goes "
                             "through model.encode(..., modality='audio') or model.audio_tokenizer()")
        check_dtype(audio, next(self.audio.parameters()), "audio frames")
        check_finite(audio, "audio frames")
        if lengths is None:
            lengths = torch.full((audio.shape[0],), audio.shape[1], dtype=torch.long, device=audio.device)
        _check_audio_lengths(lengths, *audio.shape[:2])
        backbone = self.visual.backbone if self.config.shared_backbone else None
        x = self.audio_proj(self.audio(audio, lengths.to(audio.device), backbone))
        return F.normalize(x, dim=-1) if normalize else x

    def encode(self, inputs: Any, modality: Literal["image", "text", "audio"] = "image", normalize: bool = True,
               sample_rate: int | None = None, resize: bool = False) -> Tensor:
        """Embed any modality into the joint space, raw or tokenized -> (B, E).

        image: PIL images, uint8 or [0, 1] float tensors (``resize`` to the configured size), or
        patch Tokens (already normalised pixels go to ``encode_image``). text: strings, or ids.
        audio: file paths, or waveforms with their ``sample_rate`` (required: nothing is
        assumed), or audio Tokens.
        """
        if modality == "text":
            return self.encode_text(inputs, normalize=normalize)
        if modality == "image":
            tokens = inputs if isinstance(inputs, Tokens) else self.image_tokenizer(resize).encode(inputs)
            return self.encode_image(tokens.to(self.visual_proj.weight.device), normalize=normalize)
        if modality == "audio":
            tokens = inputs if isinstance(inputs, Tokens) else encode_raw_audio(self.audio_tokenizer(), inputs,
                                                                               sample_rate)
            return self.encode_audio(tokens.to(self.audio_proj.weight.device), normalize=normalize)
        raise ValueError(f"modality must be 'image', 'text' or 'audio', got {modality!r}")

    @deferred_checks()  # on a GPU, input checks' verdicts are read as the forward ends: no host sync
    def forward(self, pixel_values: Tensor | Tokens, text: Tensor | Tokens) -> CLIPOutput:
        """Images and captions -> normalised embeddings and their scaled similarities."""
        image = self.encode_image(pixel_values, normalize=True)
        caption = self.encode_text(text, normalize=True)
        scale = self.logit_scale.exp()
        logits = scale * image @ caption.T  # (B_i, B_t)
        return CLIPOutput(image_embeds=image, text_embeds=caption, logits_per_image=logits,
                          logits_per_text=logits.T, logit_scale=self.logit_scale)

    # ------------------------------------------------------------------ transfer
    def lock_image_tower(self) -> None:
        """LiT (Zhai et al., 2022): freeze the image tower and its projection; text learns to match it.
        A shared backbone cannot be locked for one tower only."""
        if self.config.shared_backbone:
            raise ValueError("the backbone is shared with the text tower; lock_image_tower needs separate towers")
        for module in (self.visual, self.visual_proj):
            module.requires_grad_(False)
            module.eval()

    def lock_audio_tower(self) -> None:
        """Freeze the audio tower and its projection."""
        if self.config.shared_backbone:
            raise ValueError("the backbone is shared with the other towers; lock_audio_tower needs separate towers")
        self._audio_config()
        for module in (self.audio, self.audio_proj):
            module.requires_grad_(False)
            module.eval()

    def lock_text_tower(self) -> None:
        """Freeze the text tower and its projection."""
        if self.config.shared_backbone:
            raise ValueError("the backbone is shared with the image tower; lock_text_tower needs separate towers")
        for module in (self.text, self.text_proj):
            module.requires_grad_(False)
            module.eval()

    def locked_towers(self) -> Sequence[nn.Module]:
        """Modules frozen by ``lock_*_tower`` (kept in eval mode when the model trains)."""
        towers = [self.visual, self.visual_proj, self.text, self.text_proj]
        if self.config.audio is not None:
            towers += [self.audio, self.audio_proj]
        return [m for m in towers if not any(p.requires_grad for p in m.parameters())]

    def train(self, mode: bool = True) -> CLIP:
        super().train(mode)
        for module in self.locked_towers():
            module.eval()  # a locked tower stays deterministic (no dropout) while the rest trains
        return self


def encode_raw_audio(tokenizer: Any, audio: Any, sample_rate: int | None) -> Tokens:
    """Files or waveforms -> audio `Tokens`. A bare waveform (tensor or array) must come with its
    ``sample_rate``: a wrong rate would silently change pitch and speed. Empty or all-silent
    audio is refused (nothing to embed)."""
    import numpy as np

    items = list(audio) if isinstance(audio, (list, tuple)) else [audio]
    if not items:
        raise ValueError("got an empty list of audio")
    if sample_rate is not None and (isinstance(sample_rate, bool) or not isinstance(sample_rate, (int, np.integer))
                                    or not 1000 <= sample_rate <= 384_000):
        raise ValueError(f"sample_rate must be a whole number of Hz between 1000 and 384000, got {sample_rate!r}")
    for i, item in enumerate(items):
        if isinstance(item, (Tensor, np.ndarray)):
            if sample_rate is None:
                raise ValueError(f"audio item {i} is a bare waveform: give its sample_rate= (Hz); the model's "
                                 f"frames are computed at {tokenizer.config.sample_rate} Hz and other rates are "
                                 "resampled, never assumed")
            if torch.as_tensor(item).numel() == 0:
                raise ValueError(f"audio item {i} is empty (0 samples)")
        elif not isinstance(item, (str, Path)):
            raise TypeError(f"audio item {i} is a {type(item).__name__}; give file paths or waveforms with "
                            "sample_rate=")
    refuse_silent_waves(items)
    tokens = tokenizer.encode(items, sample_rate=sample_rate)
    refuse_silent_frames(tokens)
    return tokens


def refuse_silent_waves(items: Sequence[Any]) -> None:
    """Waveforms (files pass) whose every sample is 0 hold nothing to embed: refused, naming the item."""
    for i, item in enumerate(items):
        if not isinstance(item, (str, Path)):
            wave = torch.as_tensor(item)
            if wave.numel() and bool(torch.isfinite(wave.float()).all()) and not bool(wave.any()):
                raise ValueError(f"audio item {i} is all silence (every sample is 0): nothing to embed")


def refuse_silent_frames(tokens: Tokens) -> None:
    """Audio whose frames read as nothing (a silent file) is refused, naming the items."""
    silent = [i for i, row in enumerate(tokens.features) if float(row.abs().max()) == 0.0]
    if silent:
        raise ValueError(f"audio items {silent} are all silence: nothing to embed")
