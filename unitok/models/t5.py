"""T5 (Raffel et al., 2020): an encoder and a decoder, both the one backbone, sharing a token
embedding. T5's specifics are backbone config fields: RMSNorm without bias, no biases, no
1/√d score scaling, a bucketed relative position bias shared by the layers of each stack,
ReLU (v1.0) or gated-GELU (v1.1) MLPs; decoder blocks add a "cross_attn" sublayer.

Whisper-style speech recognition is the same model with ``n_mels`` set: the encoder reads
log-mel frames through the ×4 convolutional front end of the Conformer instead of token ids.

Axis legend: B batch, S source (encoder) tokens, N target (decoder) tokens, D width, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn

from tokenizers_mm import Tokens
from unitok.backbone import Backbone, BackboneConfig
from unitok.checks import check_dtype, deferred_checks
from unitok.compile import loss_backend
from unitok.config import Config
from unitok.embed import RelativePositionBias, TokenEmbedding
from unitok.embed.frames import ConvSubsampling
from unitok.generate import GenerationConfig, check_prompt_tensors, generate
from unitok.layers.activations import Activation
from unitok.layers.attention import CrossAttention, Kernel, SelfAttention, check_padding_mask
from unitok.layers.decode_layout import head_logits
from unitok.layers.fused_linear import linear
from unitok.layers.kv_cache import KVCache, StaticKVCache, static_capacity
from unitok.losses import cross_entropy, linear_cross_entropy
from unitok.models.base import PretrainedModel
from unitok.outputs import BackboneOutput, Seq2SeqLMOutput


@dataclass(frozen=True)
class T5Config(Config):
    """An encoder–decoder Transformer in T5's style.

    Args:
        vocab_size: V. d_model: D. d_kv: per-head width (H·d_kv may differ from D).
        n_layers / n_decoder_layers: encoder and decoder depth (decoder default: n_layers).
        n_heads / d_ff: heads and MLP width. activation / gated: the MLP (v1.0: relu, not
            gated; v1.1: gelu_tanh, gated).
        relative_buckets / relative_max_distance: the relative position bias.
        dropout: on embeddings, sublayer outputs, attention weights and the stacks' outputs.
        norm_eps: RMSNorm epsilon. tie_embeddings: the LM head is the token embedding.
        scale_output: multiply decoder states by D^-0.5 before the LM head (default: when tied).
        max_decoder_length: the longest target the decoder accepts (a guard, not a position table).
        pad_token_id / eos_token_id / decoder_start_token_id: T5 starts decoding from pad.
        n_mels: 0 for text sources; F > 0 makes the encoder read (B, N, F) spectrogram frames
            (×4 convolutional subsampling), Whisper-style.
    """

    vocab_size: int = 32128
    d_model: int = 512
    d_kv: int = 64
    n_layers: int = 6
    n_decoder_layers: int | None = None
    n_heads: int = 8
    d_ff: int = 2048
    activation: Activation = "relu"
    gated: bool = False
    relative_buckets: int = 32
    relative_max_distance: int = 128
    dropout: float = 0.1
    norm_eps: float = 1e-6
    tie_embeddings: bool = True
    scale_output: bool | None = None
    max_decoder_length: int = 512
    pad_token_id: int = 0
    eos_token_id: int = 1
    decoder_start_token_id: int = 0
    n_mels: int = 0

    presets = {
        # The released T5 shapes (v1.0: ReLU, tied head; v1.1: gated-GELU, untied head).
        "t5-small": dict(d_model=512, d_kv=64, n_layers=6, n_heads=8, d_ff=2048),
        "t5-base": dict(d_model=768, d_kv=64, n_layers=12, n_heads=12, d_ff=3072),
        "t5-large": dict(d_model=1024, d_kv=64, n_layers=24, n_heads=16, d_ff=4096),
        "t5-v1_1-small": dict(d_model=512, d_kv=64, n_layers=8, n_heads=6, d_ff=1024, activation="gelu_tanh",
                              gated=True, tie_embeddings=False, vocab_size=32128),
        "t5-v1_1-base": dict(d_model=768, d_kv=64, n_layers=12, n_heads=12, d_ff=2048, activation="gelu_tanh",
                             gated=True, tie_embeddings=False),
        # CPU-sized for the built-in tasks (vocabulary set by the tokenizer).
        "t5-tiny": dict(vocab_size=4096, d_model=64, d_kv=16, n_layers=2, n_heads=4, d_ff=256),
        "t5-mini": dict(vocab_size=8192, d_model=128, d_kv=32, n_layers=4, n_heads=4, d_ff=512),
        # Whisper-style: 80 log-mel bins in, characters or BPE out.
        "t5-speech-tiny": dict(vocab_size=64, d_model=96, d_kv=24, n_layers=4, n_decoder_layers=2, n_heads=4,
                               d_ff=384, n_mels=80),
    }

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "d_kv", "n_layers", "n_heads", "d_ff", "max_decoder_length"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("pad_token_id", "eos_token_id", "decoder_start_token_id"):
            if not 0 <= getattr(self, name) < self.vocab_size:
                raise ValueError(f"{name}={getattr(self, name)} is outside the vocabulary [0, {self.vocab_size})")
        self.backbone_config(decoder=True)

    @property
    def decoder_layers(self) -> int:
        return self.n_decoder_layers if self.n_decoder_layers is not None else self.n_layers

    @property
    def scales_output(self) -> bool:
        return self.tie_embeddings if self.scale_output is None else self.scale_output

    def backbone_config(self, decoder: bool) -> BackboneConfig:
        return BackboneConfig(
            d_model=self.d_model, n_layers=self.decoder_layers if decoder else self.n_layers, n_heads=self.n_heads,
            d_ff=self.d_ff, head_dim=self.d_kv, block=("attn", "cross_attn", "mlp") if decoder else ("attn", "mlp"),
            norm="rmsnorm", norm_position="pre", norm_eps=self.norm_eps, bias=False, activation=self.activation,
            mlp_gated=self.gated, causal=decoder, dropout=self.dropout, attn_dropout=self.dropout,
            mlp_dropout=self.dropout, final_norm=True,
            attn_scale=1.0,  # T5 folds the scale into its initialisation: no 1/√d on the scores
            relative_buckets=self.relative_buckets, relative_max_distance=self.relative_max_distance,
        )


def _init_t5(model: nn.Module, d_model: int, d_kv: int) -> None:
    """T5's initialisation (Mesh TensorFlow): linears normal with std 1/√fan-in, embeddings std 1,
    and queries std 1/√(D·d_kv) — the scale T5 leaves out of its attention scores lives here."""
    for module in model.modules():
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=module.in_features**-0.5)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=1.0)
        elif isinstance(module, RelativePositionBias):
            nn.init.normal_(module.weight, std=d_model**-0.5)
    query_std = (d_model * d_kv) ** -0.5
    for module in model.modules():
        if isinstance(module, SelfAttention):
            nn.init.normal_(module.qkv.weight[: module.inner], std=query_std)  # the q rows of fused q·k·v
        elif isinstance(module, CrossAttention):
            nn.init.normal_(module.q.weight, std=query_std)


def _ids_and_mask(input_ids: Tensor | Tokens, attention_mask: Tensor | None) -> tuple[Tensor, Tensor | None]:
    if isinstance(input_ids, Tokens):
        attention_mask = input_ids.attention_mask if attention_mask is None else attention_mask
        input_ids = input_ids.ids  # type: ignore[assignment]
    if not isinstance(input_ids, Tensor) or input_ids.dim() != 2:
        shape = tuple(input_ids.shape) if isinstance(input_ids, Tensor) else type(input_ids).__name__
        raise ValueError(f"input_ids must be a (batch, tokens) tensor, got {shape}")
    if input_ids.shape[1] == 0:
        raise ValueError("input_ids is empty: give at least one token")
    if attention_mask is not None and attention_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask shape {tuple(attention_mask.shape)} != input_ids shape "
                         f"{tuple(input_ids.shape)}")
    return input_ids, attention_mask


class T5Encoder(PretrainedModel):
    """The encoder alone (Hugging Face's ``T5EncoderModel``): ids -> (B, S, D) states."""

    config_class = T5Config

    def __init__(self, config: T5Config) -> None:
        super().__init__()
        self.config = config
        self.shared = TokenEmbedding(config.vocab_size, config.d_model)
        self.frontend = ConvSubsampling(config.n_mels, config.d_model) if config.n_mels else None
        self.encoder = Backbone(config.backbone_config(decoder=False))
        self.drop = nn.Dropout(config.dropout)
        _init_t5(self, config.d_model, config.d_kv)

    def embed_source(self, inputs: Tensor | Tokens, attention_mask: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """Source ids, or (B, N, F) frames when ``n_mels`` is set -> (B, S, D) vectors and their mask."""
        if self.frontend is None:
            ids, mask = _ids_and_mask(inputs, attention_mask)
            return self.shared(ids), mask
        if isinstance(inputs, Tokens):
            attention_mask = inputs.attention_mask if attention_mask is None else attention_mask
            inputs = inputs.features  # type: ignore[assignment]
        if not isinstance(inputs, Tensor) or inputs.dim() != 3 or not inputs.dtype.is_floating_point:
            shape = tuple(inputs.shape) if isinstance(inputs, Tensor) else type(inputs).__name__
            raise ValueError(f"this T5 reads spectrogram frames (batch, frames, {self.config.n_mels}), got {shape}")
        check_dtype(inputs, next(self.frontend.parameters()), "spectrogram frames")
        if not bool(torch.isfinite(inputs).all()):
            raise ValueError("spectrogram frames contain NaN/inf values")
        B, N, _ = inputs.shape
        if attention_mask is not None:  # its sum is each source's frame count: 1 and 0 only
            check_padding_mask(attention_mask, (B, N))
        lengths = (attention_mask.sum(dim=1) if attention_mask is not None
                   else torch.full((B,), N, device=inputs.device)).long()
        x, lengths = self.frontend(inputs, lengths)
        return x, (torch.arange(x.shape[1], device=x.device)[None, :] < lengths[:, None]).long()

    def encode(self, input_ids: Tensor | Tokens, attention_mask: Tensor | None = None,
               output_hidden_states: bool = False, kernel: Kernel = "sdpa") -> BackboneOutput:
        """Sources -> encoder states; ``attention_mask`` of the output says which are real."""
        x, mask = self.embed_source(input_ids, attention_mask)
        out = self.encoder(self.drop(x), mask, output_hidden_states=output_hidden_states, kernel=kernel)
        out.last_hidden_state = self.drop(out.last_hidden_state)
        out.attention_mask = mask
        return out

    def forward(self, input_ids: Tensor | Tokens, attention_mask: Tensor | None = None,
                output_hidden_states: bool = False) -> BackboneOutput:
        return self.encode(input_ids, attention_mask, output_hidden_states)


class T5(T5Encoder):
    """Encoder–decoder language model: ``forward`` scores targets (teacher forcing), ``generate``
    decodes with the same greedy / sampling / beam search as GPT, the encoder run once."""

    def __init__(self, config: T5Config) -> None:
        super().__init__(config)
        self.decoder = Backbone(config.backbone_config(decoder=True))
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        _init_t5(self.decoder, config.d_model, config.d_kv)
        nn.init.normal_(self.lm_head.weight, std=1.0)
        if config.tie_embeddings:
            self.lm_head.weight = self.shared.weight

    @property
    def tied_keys(self) -> tuple[str, ...]:
        return ("lm_head.weight",) if self.config.tie_embeddings else ()

    def shift_right(self, labels: Tensor) -> Tensor:
        """(B, N) targets (-100 = ignored) -> decoder inputs: the start token, then targets[:-1]."""
        start = torch.full_like(labels[:, :1], self.config.decoder_start_token_id)
        shifted = torch.cat([start, labels[:, :-1]], dim=1)
        return shifted.masked_fill(shifted == -100, self.config.pad_token_id)

    def decode(
        self, decoder_input_ids: Tensor, encoder_hidden_states: Tensor, encoder_attention_mask: Tensor | None = None,
        decoder_attention_mask: Tensor | None = None, cache: KVCache | None = None,
        output_hidden_states: bool = False, kernel: Kernel = "sdpa",
    ) -> tuple[Tensor, BackboneOutput]:
        """Decoder states for target ids given the encoder's states -> ((B, N, V) logits, states)."""
        h, out = self._head_input(decoder_input_ids, encoder_hidden_states, encoder_attention_mask,
                                  decoder_attention_mask, cache, output_hidden_states, kernel)
        return linear(h, self.lm_head), out

    def _head_input(
        self, decoder_input_ids: Tensor, encoder_hidden_states: Tensor, encoder_attention_mask: Tensor | None,
        decoder_attention_mask: Tensor | None, cache: KVCache | None, output_hidden_states: bool, kernel: Kernel,
    ) -> tuple[Tensor, BackboneOutput]:
        """What the LM head reads (the decoder's last states, dropout, the tied head's scale) and the states."""
        past = cache.seq_len if cache is not None else 0
        n = past + decoder_input_ids.shape[1]
        if n > self.config.max_decoder_length:
            raise ValueError(f"the target has {n} tokens, more than max_decoder_length="
                             f"{self.config.max_decoder_length}; shorten it or raise the limit in T5Config")
        x = self.drop(self.shared(decoder_input_ids, check=past == 0))
        out = self.decoder(x, decoder_attention_mask, cache, output_hidden_states=output_hidden_states,
                           kernel=kernel, encoder_hidden_states=encoder_hidden_states,
                           encoder_attention_mask=encoder_attention_mask)
        h = self.drop(out.last_hidden_state)
        if self.config.scales_output:
            h = h * self.config.d_model**-0.5  # tied head: rescale so logits stay O(1) (Mesh TensorFlow)
        return h, out

    @deferred_checks()  # on a GPU, input checks' verdicts are read as the forward ends: no host sync
    def forward(
        self,
        input_ids: Tensor | Tokens,
        attention_mask: Tensor | None = None,
        decoder_input_ids: Tensor | None = None,
        decoder_attention_mask: Tensor | None = None,
        labels: Tensor | None = None,
        encoder_outputs: BackboneOutput | None = None,
        output_hidden_states: bool = False,
        kernel: Kernel = "sdpa",
        return_logits: bool = True,
    ) -> Seq2SeqLMOutput:
        """Source ids (or `Tokens`) and target inputs -> next-token logits at every target position.

        Give ``decoder_input_ids`` or ``labels`` (then the inputs are ``shift_right(labels)``, as in
        Hugging Face's ``T5ForConditionalGeneration``). With ``labels`` (B, N) the output's ``loss``
        is the mean cross-entropy of the logits against them, -100 ignored. With ``n_mels`` set the
        sources are (B, N, F) spectrogram frames (or audio `Tokens`) and ``attention_mask`` marks
        real frames. ``return_logits=False`` leaves out the (B, N, V) logits (``.logits`` is None);
        ``labels`` are then scored by the LM head fused with the loss
        (`unitok.losses.linear_cross_entropy`: the same loss, the logits never whole) — for training.
        """
        if labels is not None and (not isinstance(labels, Tensor) or labels.dim() != 2):
            shape = tuple(labels.shape) if isinstance(labels, Tensor) else type(labels).__name__
            raise ValueError(f"labels must be (batch, tokens) target ids, got {shape}; one example's targets "
                             "need a batch axis (labels[None])")
        if decoder_input_ids is None:
            if labels is None:
                raise ValueError("give decoder_input_ids or labels (the targets) to run the decoder")
            decoder_input_ids = self.shift_right(labels)
        enc = encoder_outputs or self.encode(input_ids, attention_mask, output_hidden_states, kernel)
        h, dec = self._head_input(decoder_input_ids, enc.last_hidden_state, enc.attention_mask, decoder_attention_mask,
                                  None, output_hidden_states, kernel)
        logits = linear(h, self.lm_head) if return_logits else None
        if labels is None:
            loss = None
        elif logits is not None:
            loss = cross_entropy(logits, labels)
        else:
            loss = linear_cross_entropy(h, self.lm_head.weight, labels, self.lm_head.bias, compile=loss_backend(self))
        return Seq2SeqLMOutput(logits=logits, encoder_last_hidden_state=enc.last_hidden_state,
                               decoder_last_hidden_state=dec.last_hidden_state,
                               encoder_hidden_states=enc.hidden_states, decoder_hidden_states=dec.hidden_states,
                               loss=loss)

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
        """Sources -> (B, 1 + new) target ids, starting with ``decoder_start_token_id`` and padded
        after EOS (as Hugging Face returns them). Same options as ``GPT.generate``; the encoder
        runs once and the decoder caches its own and the cross-attention keys/values."""
        if not isinstance(input_ids, Tokens):
            check_prompt_tensors(input_ids, attention_mask, self.lm_head.weight.device, frames=True,
                                 generator=generator)
        options.setdefault("eos_token_id", self.config.eos_token_id)
        options.setdefault("pad_token_id", self.config.pad_token_id)
        cfg = GenerationConfig.from_dict({"max_new_tokens": max_new_tokens, "strategy": strategy, **options})
        cfg.check_vocabulary(self.config.vocab_size)
        if 1 + max_new_tokens > self.config.max_decoder_length:
            raise ValueError(f"1 + max_new_tokens = {1 + max_new_tokens} exceeds max_decoder_length="
                             f"{self.config.max_decoder_length}")
        was_training = self.training
        self.eval()
        try:
            enc = self.encode(input_ids, attention_mask)
            if enc.attention_mask is not None:
                empty = (~enc.attention_mask.bool().any(dim=1)).nonzero()[:, 0].tolist()
                if empty:  # the decoder would answer from no source at all
                    raise ValueError(f"source row(s) {empty} are empty (all padding): give each row at least one token")
            memory = enc.last_hidden_state
            session = _DecodingSession(self, memory, enc.attention_mask)
            start = torch.full((memory.shape[0], 1), self.config.decoder_start_token_id, dtype=torch.long,
                               device=memory.device)
            return generate(session, start, cfg, None, generator)
        finally:
            self.train(was_training)


class _DecodingSession:
    """The `Decoder` protocol for one batch of encoded sources. Beam search asks for W rows per
    source (adjacent); the encoder states stay one row per source, and each cross-attention
    reads its source's keys and values once for all W rows' queries (`CrossAttention`)."""

    def __init__(self, model: T5, memory: Tensor, memory_mask: Tensor | None) -> None:
        self.model, self.memory, self.memory_mask = model, memory, memory_mask
        # as the decoder's mask checks leave it for the eager steps (its values were checked as the
        # encoder read it): None where nothing is padded, for the compiled step, which skips them
        self.checked_memory_mask = None if memory_mask is None or bool(memory_mask.bool().all()) else memory_mask
        # what the decoding steps read (the layouts of `unitok.layers.decode_layout` serve these, and
        # their timing runs them): the decoder's layers and the head, not the encoder, nor
        # cross-attention's keys and values (computed once from the source)
        self.weights = nn.ModuleList([m for name, m in model.decoder.named_modules()
                                      if not list(m.children()) and not name.endswith("cross_attn.kv")]
                                     + [model.lm_head])

    def new_cache(self, capacity: int) -> KVCache:
        return self.model.decoder.new_cache(capacity)

    def next_token_logits(self, new_ids: Tensor, attention_mask: Tensor | None, cache: KVCache) -> Tensor:
        h, _ = self.model._head_input(new_ids, self.memory, self.memory_mask, attention_mask, cache, False, "sdpa")
        return head_logits(h[:, -1], self.model.lm_head)  # the last position's only

    def new_static_cache(self, capacity: int) -> StaticKVCache:
        """A fixed-capacity cache of the decoder's self-attention for `decode_step` (the start token and
        every new one), rounded up within ``max_decoder_length`` as GPT's is (`static_capacity`):
        nearby lengths then reuse one compiled step. Cross-attention's keys and values join it at the first step."""
        limit = self.model.config.max_decoder_length
        if not 1 <= capacity <= limit:
            raise ValueError(f"a static cache of {capacity} positions does not fit max_decoder_length={limit}")
        return StaticKVCache(self.model.config.decoder_layers, static_capacity(capacity, limit))

    def decode_step(self, new_ids: Tensor, positions: Tensor, mask: Tensor, cache: StaticKVCache,
                    check: bool = False) -> Tensor:
        """One shape-stable decoding step over a `StaticKVCache` (what ``generate(compile=...)``
        compiles): (B, N) ids written at ``cache.index`` (the relative bias reads the queries'
        positions there; ``positions`` is unused: T5 has no absolute ones), each query seeing the
        keys ``mask`` (B, 1, N, capacity) allows and the sources -> (B, V) logits after the last id.
        No host syncs: the sources' mask was checked once (``checked_memory_mask``)."""
        x = self.model.shared(new_ids, check=check)
        out = self.model.decoder(x, cache=cache, mask=mask, encoder_hidden_states=self.memory,
                                 encoder_attention_mask=self.checked_memory_mask, _masks_checked=True)
        h = out.last_hidden_state[:, -1]
        if self.model.config.scales_output:
            h = h * self.model.config.d_model**-0.5  # as `T5._head_input`
        return self.model.lm_head(h)
