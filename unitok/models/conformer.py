"""Conformer + CTC (Gulati et al., 2020; Graves et al., 2006): log-mel frames -> ×4 convolutional
subsampling -> Conformer blocks of the one backbone -> a linear CTC head over characters.

A Conformer block is the shared Block with sublayers ("half_mlp", "attn", "conv", "half_mlp")
and a per-block LayerNorm (``block_norm``). The vocabulary (characters, blank = 0) and the
spectrogram settings are stored in the config, so a saved model transcribes audio on its own.

Axis legend: B batch, N frames in, N' frames after subsampling, F mel bins, D width, V = 1 + characters.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor, nn

from tokenizers_mm import CharacterVocabulary, Processor, SpectrogramConfig, Tokens
from unitok.backbone import Backbone, BackboneConfig, init_weights
from unitok.checks import check_dtype
from unitok.config import Config
from unitok.embed.frames import ConvSubsampling
from unitok.layers.activations import Activation
from unitok.layers.attention import check_padding_mask
from unitok.layers.conv_module import ConvNorm
from unitok.losses import ctc_loss
from unitok.models.base import PretrainedModel
from unitok.outputs import CTCOutput


@dataclass(frozen=True)
class ConformerConfig(Config):
    """A Conformer encoder with a CTC head.

    Args:
        n_mels: F, features per input frame. subsampling: "conv2d4" (×4, ESPnet/NeMo style) or
            "none" (frames are already D wide, as torchaudio's Conformer expects).
        d_model / n_layers / n_heads / d_ff / activation / norm_eps / dropout: the backbone.
        conv_kernel_size / conv_norm / conv_mask_padding: the convolution module.
        convolution_first: the conv module before attention (torchaudio's option).
        vocabulary: the output characters (ids 1..; 0 is the CTC blank). vocab_size: V, at
            least 1 + len(vocabulary) (0: no head, an encoder only).
        spectrogram: `tokenizers_mm.SpectrogramConfig` fields used by ``transcribe`` (given in
            part, stored whole at this ``n_mels``; empty: the defaults).
    """

    n_mels: int = 80
    subsampling: Literal["conv2d4", "none"] = "conv2d4"
    d_model: int = 144
    n_layers: int = 16
    n_heads: int = 4
    d_ff: int | None = None
    activation: Activation = "silu"
    norm_eps: float = 1e-5
    dropout: float = 0.1
    conv_kernel_size: int = 31
    conv_norm: ConvNorm = "batchnorm"
    conv_mask_padding: bool = True
    convolution_first: bool = False
    vocabulary: tuple[str, ...] = ()
    vocab_size: int | None = None
    spectrogram: dict[str, Any] = field(default_factory=dict)

    presets = {
        # Conformer-S/M/L encoders of the paper (CTC heads sized by the vocabulary).
        "conformer-s": dict(d_model=144, n_layers=16, n_heads=4),
        "conformer-m": dict(d_model=256, n_layers=16, n_heads=4),
        "conformer-l": dict(d_model=512, n_layers=17, n_heads=8),
        # CPU-sized, for the built-in spoken digits.
        "conformer-digits": dict(d_model=96, n_layers=4, n_heads=4, conv_kernel_size=15, dropout=0.1),
    }

    def __post_init__(self) -> None:
        object.__setattr__(self, "vocabulary", tuple(self.vocabulary))
        object.__setattr__(self, "spectrogram", SpectrogramConfig.stored(self.spectrogram, self.n_mels))
        if self.subsampling == "none" and self.n_mels != self.d_model:
            raise ValueError(f"subsampling='none' reads frames as they are: n_mels ({self.n_mels}) must equal "
                             f"d_model ({self.d_model})")
        if len(set(self.vocabulary)) != len(self.vocabulary):
            raise ValueError("vocabulary has repeated entries")
        if self.vocab_size is not None and self.vocab_size and self.vocab_size < 1 + len(self.vocabulary):
            raise ValueError(f"vocab_size={self.vocab_size} is smaller than 1 (blank) + {len(self.vocabulary)} "
                             "characters")
        self.backbone_config()

    @property
    def output_size(self) -> int:
        return self.vocab_size if self.vocab_size is not None else 1 + len(self.vocabulary)

    def backbone_config(self) -> BackboneConfig:
        block = ("half_mlp", "conv", "attn", "half_mlp") if self.convolution_first else (
            "half_mlp", "attn", "conv", "half_mlp")
        return BackboneConfig(
            d_model=self.d_model, n_layers=self.n_layers, n_heads=self.n_heads, d_ff=self.d_ff, block=block,
            norm="layernorm", norm_position="pre", norm_eps=self.norm_eps, bias=True, activation=self.activation,
            causal=False, dropout=self.dropout, attn_dropout=self.dropout, mlp_dropout=self.dropout, final_norm=False,
            block_norm=True,
            conv_kernel_size=self.conv_kernel_size, conv_norm=self.conv_norm,
            conv_mask_padding=self.conv_mask_padding,
        )


class ConformerCTC(PretrainedModel):
    """Speech recogniser: frames (or audio `Tokens`) -> per-frame character logits for CTC."""

    config_class = ConformerConfig
    blank_id: int = 0  # the CTC blank: output id 0, characters are 1..

    def __init__(self, config: ConformerConfig) -> None:
        super().__init__()
        self.config = config
        self.frontend = ConvSubsampling(config.n_mels, config.d_model) if config.subsampling == "conv2d4" else None
        self.drop = nn.Dropout(config.dropout)
        self.backbone = Backbone(config.backbone_config())
        V = config.output_size
        self.ctc_head = nn.Linear(config.d_model, V) if V > 0 else None
        init_weights(self.backbone, std=0.02)

    def forward(self, features: Tensor | Tokens, lengths: Tensor | None = None,
                output_hidden_states: bool = False, labels: Tensor | None = None,
                label_lengths: Tensor | None = None) -> CTCOutput:
        """(B, N, F) frames and (B,) valid lengths (or audio `Tokens`) -> `CTCOutput`.

        ``labels`` (B, U) padded character ids (1..; ``label_lengths`` (B,) says how many are real,
        by default those that are neither -100 nor the blank) give ``loss``: CTC with the blank
        ``blank_id``, reduced as torch's default ``reduction="mean"`` (each utterance's loss
        divided by its target length, then the batch mean; no ``zero_infinity``).
        """
        if labels is None and label_lengths is not None:
            raise ValueError("label_lengths given without labels")
        if labels is not None and self.ctc_head is None:
            raise ValueError("labels given, but this model has no CTC head (vocab_size=0)")
        if isinstance(features, Tokens):
            if features.features is None:
                raise ValueError("ConformerCTC reads audio Tokens (frame features), got token ids")
            if lengths is None and features.attention_mask is not None:  # its sum: each utterance's frames
                check_padding_mask(features.attention_mask, tuple(features.features.shape[:2]), "audio attention_mask")
                lengths = features.attention_mask.sum(dim=1)
            features = features.features
        if not isinstance(features, Tensor) or features.dim() != 3:
            shape = tuple(features.shape) if isinstance(features, Tensor) else type(features).__name__
            raise ValueError(f"features must be (batch, frames, {self.config.n_mels}), got {shape}")
        if features.shape[-1] != self.config.n_mels:
            raise ValueError(f"expected {self.config.n_mels} features per frame, got {features.shape[-1]}")
        check_dtype(features, next(self.parameters()), "features")
        if not bool(torch.isfinite(features).all()):
            raise ValueError(f"features contain {int((~torch.isfinite(features)).sum())} NaN/inf values")
        B, N, _ = features.shape
        if lengths is None:
            lengths = torch.full((B,), N, dtype=torch.long, device=features.device)
        lengths = torch.as_tensor(lengths)  # a list of frame counts will do
        if lengths.is_floating_point() and not bool((lengths == lengths.round()).all()):
            raise ValueError(f"lengths must be whole frame counts, got {lengths.tolist()}")  # not cut to one
        lengths = lengths.to(features.device).long()
        if lengths.shape != (B,) or bool((lengths < 1).any()) or bool((lengths > N).any()):
            raise ValueError(f"lengths must be (batch,) values in [1, {N}], got {lengths.tolist()}")
        if self.frontend is not None:
            x, lengths = self.frontend(features, lengths)
        else:
            x = features
        mask = torch.arange(x.shape[1], device=x.device)[None, :] < lengths[:, None]  # (B, N')
        out = self.backbone(self.drop(x), mask.long(), output_hidden_states=output_hidden_states)
        h = out.last_hidden_state
        logits = self.ctc_head(self.drop(h)) if self.ctc_head is not None else None
        loss = None
        if logits is not None and labels is not None:
            loss = ctc_loss(logits, lengths, labels, label_lengths, self.blank_id)
        return CTCOutput(logits=logits, lengths=lengths, last_hidden_state=h, hidden_states=out.hidden_states,
                         loss=loss)

    def default_processor(self) -> Processor:
        """Audio -> the stored log-mel settings; the CTC head's characters."""
        vocabulary = CharacterVocabulary.from_list(list(self.config.vocabulary)) if self.config.vocabulary else None
        return Processor(audio=SpectrogramConfig.for_model(self.config.spectrogram, self.config.n_mels),
                         characters=vocabulary)

    @torch.no_grad()
    def transcribe(self, audio: Any, decoder: Literal["greedy", "beam"] = "greedy", beam_size: int = 8,
                   sample_rate: int | None = None, lexicon: Sequence[str] | None = None) -> list[str]:
        """Audio files, or waveforms with their ``sample_rate`` (required: no rate is assumed),
        -> text, with the stored spectrogram settings and vocabulary; CTC greedy decoding or
        prefix beam search (``beam_size``), which ``lexicon`` (words, e.g. the ten digit names)
        holds to those words. A clip with no speech in it gives ""."""
        from tokenizers_mm import CharacterVocabulary, SpectrogramConfig, SpectrogramTokenizer
        from unitok.ctc import Lexicon, check_decoder, ctc_decode

        if not self.config.vocabulary or self.ctc_head is None:
            raise ValueError("this model has no character vocabulary / CTC head to transcribe with")
        check_decoder(decoder, lexicon)
        vocab = CharacterVocabulary.from_list(list(self.config.vocabulary))
        words = Lexicon.from_words(lexicon, vocab) if lexicon is not None else None
        tokenizer = SpectrogramTokenizer(SpectrogramConfig.for_model(self.config.spectrogram, self.config.n_mels))
        items = audio if isinstance(audio, (list, tuple)) else [audio]
        tokens = tokenizer.encode(list(items), sample_rate=sample_rate)
        was_training = self.training
        self.eval()
        try:
            param = next(self.parameters())
            out = self(tokens.features.to(param.device, param.dtype), tokens.attention_mask.sum(dim=1))
        finally:
            self.train(was_training)
        paths = ctc_decode(out.logits.float().log_softmax(dim=-1), out.lengths, decoder, beam_size, words)
        return [vocab.decode(p) for p in paths]
