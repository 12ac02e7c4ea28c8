"""Decoding: greedy, sampling (temperature / top-k / top-p) and beam search, all with a KV cache.

A model plugs in through the `Decoder` protocol: ``new_cache(capacity)`` and
``next_token_logits(new_ids, attention_mask, cache)``. Encoder–decoder models implement the
same two methods (their cache also holds the encoder's keys/values), so one loop serves all.

Axis legend: B batch, W beams, V vocabulary, S prompt length, T total length.
"""

from __future__ import annotations

import contextlib
import numbers
import threading
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch
from torch import Tensor, nn

from tokenizers_mm.checks import check_int, check_number
from unitok.checks import dispatch_mode_active
from unitok.compile import check_backend
from unitok.config import Config
from unitok.embed.positions import positions_from_mask
from unitok.layers.attention import build_attention_mask, check_padding_mask
from unitok.layers.decode_layout import (
    ALL_WIDENING_ROWS,
    FEW_ROWS,
    MAX_COPY_BYTES,
    MIN_COLD_BYTES,
    MIN_NEW_TOKENS,
    PACKED_ROWS,
    can_pack,
    copy_bytes,
    weight_bytes,
    widening_linears,
)
from unitok.layers.kv_cache import KVCache, StaticKVCache
from unitok.layers.layout_timing import Layouts, fastest_layouts, lent

Strategy = Literal["greedy", "sample", "beam"]


class StaticDecoder(Protocol):
    """What ``compile=`` decoding needs of a model (GPT has it; T5's decoding session too)."""

    def new_static_cache(self, capacity: int) -> StaticKVCache: ...

    def decode_step(self, new_ids: Tensor, positions: Tensor, mask: Tensor, cache: StaticKVCache,
                    check: bool = False) -> Tensor:
        """(B, N) ids at (B, N) positions, written at ``cache.index``, each query seeing the keys
        ``mask`` (B, 1, N, capacity) allows -> (B, V) logits after the last id."""
        ...


class Decoder(Protocol):
    """A model, or a session over one (T5's over its encoded sources); a session that is not an
    ``nn.Module`` may name the module its steps read as ``weights`` (for `GenerationConfig.input_major`)."""

    def new_cache(self, capacity: int) -> KVCache: ...

    def next_token_logits(self, new_ids: Tensor, attention_mask: Tensor | None, cache: KVCache) -> Tensor:
        """(B, n) new ids, (B, T) mask of cache + new (None: nothing padded) -> (B, V) logits
        after the last new id."""
        ...


@dataclass(frozen=True)
class GenerationConfig(Config):
    """How to decode. Sampling divides the logits by ``temperature``, keeps the ``top_k`` likeliest
    tokens (50 by default, as Hugging Face's `GenerationConfig`; 0 or None: no top-k filter) and
    then the ``top_p`` nucleus, in Hugging Face's order. Beam search scores a finished hypothesis by its log-probability divided by
    (generated length, EOS included) ** ``length_penalty`` (0: the plain log-likelihood; 1, the
    default: the mean log-probability per token), and returns the best-scoring one — never one
    that scores below the greedy answer's (``greedy_floor``: one more row per input follows the
    greedy path; False: Hugging Face's search exactly, W rows, a fifth less work at W=4). ``early_stopping`` ends a beam search as soon as
    ``num_beams`` hypotheses are finished (the Hugging Face convention). ``compile`` (for models with
    a ``decode_step``) decodes over a `StaticKVCache` with the step compiled by `torch.compile`
    (True: inductor; or a backend's name): the same tokens, every step one shape, no host sync
    in greedy and sampled decoding but the end-of-sequence check (beam search reorders the cache's
    rows between steps, in place, and keeps its bookkeeping eager); on a CUDA device the compiled
    step is also captured once as a CUDA graph and replayed for each token (``cuda_graph``; a
    one-row step is hundreds of small kernels whose launches cost more than their work).
    The CPU decoding layouts of `unitok.layers.decode_layout` (the same tokens, each a copy of the
    weights or a way of multiplying while decoding): ``input_major`` lays out the widening layers'
    weights input-major after the prompt (steps of up to `ALL_WIDENING_ROWS` rows; greedy and
    sampling); ``output_major`` computes widening products of `FEW_ROWS` rows (a beam search's
    W + 1, a small batch; one row runs as two) output-major; ``packed`` multiplies steps of
    `PACKED_ROWS` rows through oneDNN on weights packed for them. Each: True lends it (CPU float32
    weights, its rows; ``input_major`` True: any rows), False never; None, the default, proposes it
    where its rules allow — at least `MIN_NEW_TOKENS` new tokens and a copy of at most
    `MAX_COPY_BYTES` for a copy; decoding weights of at least `MIN_COLD_BYTES` for output-major and
    packed products (below that no CPU measured ran them faster) — and the proposals are timed
    against the layouts lent without them on this CPU, once per shape and thread count
    (`unitok.layers.layout_timing`): the fastest for the tokens asked for is lent (rules measured
    on one CPU lose on another: an AMX Xeon's 480 MB of L3 holds a D=256 GPT's weights, which
    then run fastest as they are). The compiled path (``compile``) takes the input-major copy
    alone, for one or two rows, timed on the pass alone for any number of tokens (its graph is
    traced for the weights' strides: one layout, one graph)."""

    max_new_tokens: int = 32
    strategy: Strategy = "greedy"
    temperature: float = 1.0
    top_k: int | None = 50
    top_p: float | None = None
    num_beams: int = 4
    length_penalty: float = 1.0
    early_stopping: bool = False
    greedy_floor: bool = True
    eos_token_id: int | None = None
    pad_token_id: int | None = None
    compile: bool | str = False
    cuda_graph: bool = True
    input_major: bool | None = None
    output_major: bool | None = None
    packed: bool | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.compile, (bool, str)) or self.compile == "":
            raise ValueError(f"compile must be True/False or a torch.compile backend name, got {self.compile!r}")
        if isinstance(self.compile, str):  # refused here, not at the first compiled step
            check_backend("compile", self.compile, callables=False, also="True/False")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be ≥ 1, got {self.max_new_tokens}")
        check_number("temperature", self.temperature, 0.0, low_open=True)  # NaN would reach the sampler
        check_number("length_penalty", self.length_penalty)
        check_int("top_k", self.top_k, at_least=0, or_none=True, note="(0 or None: no top-k filter)")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.num_beams < 1:
            raise ValueError(f"num_beams must be ≥ 1, got {self.num_beams}")

    def check_vocabulary(self, vocab_size: int) -> None:
        """Refuse an EOS or pad id outside [0, vocab_size): a pad id is fed back to the model once a
        row ends (on a GPU an out-of-range gather is a device-side assert), an EOS id there never stops."""
        for name in ("eos_token_id", "pad_token_id"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, numbers.Integral) and not isinstance(value, bool)
                                          and 0 <= value < vocab_size):
                raise ValueError(f"{name}={value!r} is not a token id of the vocabulary [0, {vocab_size})")


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
    if cfg.top_k:  # 0 / None: off
        logits = filter_top_k(logits, cfg.top_k)
    if cfg.top_p is not None and cfg.top_p < 1.0:
        logits = filter_top_p(logits, cfg.top_p)
    return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator).squeeze(1)


# --------------------------------------------------------------------------- loops
def check_prompt_tensors(input_ids: Any, attention_mask: Any, device: torch.device, name: str = "input_ids",
                         frames: bool = False, generator: torch.Generator | None = None) -> None:
    """Refuse prompts that are not (batch, tokens) tensors on the model's device, before any
    shape is read: a list, an empty batch, or CPU ids for a model on a GPU (PyTorch would only
    say that "all tensors" must be on one device). ``frames``: (batch, frames, features) float
    sources are welcome too (T5 reading spectrogram frames)."""
    if not isinstance(input_ids, Tensor):
        raise TypeError(f"{name} must be a (batch, tokens) tensor of token ids, got {type(input_ids).__name__} "
                        "(torch.tensor(ids) makes one)")
    if input_ids.dim() != 2 and not (frames and input_ids.dim() == 3 and input_ids.is_floating_point()):
        raise ValueError(f"{name} must be (batch, tokens), got shape {tuple(input_ids.shape)}")
    if input_ids.shape[0] == 0:
        raise ValueError(f"{name} has no rows (a batch of 0 prompts)")
    if attention_mask is not None and not isinstance(attention_mask, Tensor):
        raise TypeError(f"attention_mask must be a (batch, tokens) tensor of 1s and 0s, got "
                        f"{type(attention_mask).__name__} (torch.tensor(mask) makes one)")
    for what, tensor in ((name, input_ids), ("attention_mask", attention_mask)):
        if isinstance(tensor, Tensor) and tensor.device != device:
            raise ValueError(f"{what} is on {tensor.device} but the model is on {device}: "
                             f"move it with .to({str(device)!r})")
    if generator is not None and generator.device.type != device.type:
        raise ValueError(f"the generator is on {generator.device} but the model is on {device}: "
                         f"make it with torch.Generator({device.type!r})")


def _check_prompt(input_ids: Tensor, attention_mask: Tensor | None) -> Tensor:
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be (batch, tokens), got shape {tuple(input_ids.shape)}")
    if input_ids.shape[1] == 0:
        raise ValueError("cannot generate from an empty prompt: give at least one token")
    if attention_mask is None:
        return torch.ones_like(input_ids)
    if attention_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask shape {tuple(attention_mask.shape)} != input_ids shape {tuple(input_ids.shape)}")
    # 1 and 0 only (every path reads it so, the compiled one's included), and no empty row
    _, empty = check_padding_mask(attention_mask, tuple(input_ids.shape))
    if empty:
        raise ValueError(f"prompt row(s) {empty} are empty (all padding): give each row at least one token")
    right = (~attention_mask[:, -1].bool()).nonzero()[:, 0].tolist()
    if right:
        raise ValueError(f"batched generation needs left padding: the last prompt position is padding in row(s) "
                         f"{right} (encode with padding_side='left')")
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
    if cfg.compile:
        return _static_generate(model, input_ids, mask, cfg, generator)
    return _decode(model, input_ids, mask, cfg, generator)


def _next_tokens(logits: Tensor, running: Tensor, cfg: GenerationConfig,
                 generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
    """(B, V) logits -> each row's next token (argmax or sampled; a row past its EOS gets the pad
    id) and which rows still run after it."""
    logits = logits.float()
    token = logits.argmax(dim=-1) if cfg.strategy == "greedy" else sample_next(logits, cfg, generator)
    if cfg.eos_token_id is None:
        return token, running
    pad = cfg.pad_token_id if cfg.pad_token_id is not None else cfg.eos_token_id
    token = torch.where(running, token, torch.full_like(token, pad))
    return token, running & (token != cfg.eos_token_id)


class _Steps:
    """A decoding's model calls: the prompt's logits, then one step a token (`step`), rows copied out
    from the prompt's (`expand`) or permuted (`reorder`) between them, and the layouts lent to its
    steps (`lend`). A context manager: what it lent ends with it."""

    def __init__(self, model: Decoder, input_ids: Tensor, cfg: GenerationConfig) -> None:
        self.model, self.input_ids, self.cfg = model, input_ids, cfg
        self.device = input_ids.device
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> _Steps:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def lend(self, rows: int, layouts: Layouts, input_major_rows: int | None) -> None:
        """Lend ``layouts`` to the steps of ``rows`` rows until the decoding ends."""
        _lend(self._stack, self.model, rows, layouts, input_major_rows)


class _GrowingSteps(_Steps):
    """Steps over a growing `KVCache`, eagerly (any `Decoder`). Without padding the model needs no
    mask: no per-step concatenation, and the backbone takes its fused causal / single-query path
    directly. With padding, the mask of every length to come is made once; each step reads a
    longer view."""

    def __init__(self, model: Decoder, input_ids: Tensor, mask: Tensor, cfg: GenerationConfig) -> None:
        super().__init__(model, input_ids, cfg)
        B, S = input_ids.shape
        self.cache = model.new_cache(S + cfg.max_new_tokens)
        self.full_mask = None if bool(mask.all()) else torch.cat([mask, mask.new_ones(B, cfg.max_new_tokens)], dim=1)

    def _mask(self, n_new: int) -> Tensor | None:
        return None if self.full_mask is None else self.full_mask[:, : self.cache.seq_len + n_new]

    def prompt(self) -> Tensor:
        """The prompt's (B, V) next-token logits."""
        return self.model.next_token_logits(self.input_ids, self._mask(self.input_ids.shape[1]), self.cache)

    def expand(self, rows: Tensor) -> None:
        """Each input's prompt row copied out to its rows (``rows``: the prompt row of each); an
        encoder-decoder's rows of one source share its encoder states."""
        self.cache.reorder(rows, cross=False)
        self.full_mask = None if self.full_mask is None else self.full_mask[rows]

    def reorder(self, rows: Tensor) -> None:
        """The cache of row ``rows[i]`` becomes row i's (rows of one input: its mask is theirs)."""
        self.cache.reorder(rows, cross=False)

    def step(self, new_ids: Tensor) -> Tensor:
        """(rows, 1) ids -> (rows, V) logits; the cache grows a position."""
        return self.model.next_token_logits(new_ids, self._mask(new_ids.shape[1]), self.cache)


def _decode(model: Decoder, input_ids: Tensor, mask: Tensor, cfg: GenerationConfig,
            generator: torch.Generator | None) -> Tensor:
    """Greedy or sampled decoding over a growing `KVCache`."""
    B = input_ids.shape[0]
    ids = input_ids
    running = torch.ones(B, dtype=torch.bool, device=ids.device)
    layouts, input_major_rows = _decode_layouts(model, B, ids.device, cfg)
    new = input_ids
    with _GrowingSteps(model, input_ids, mask, cfg) as steps:
        steps.lend(B, layouts - {"input_major"}, input_major_rows)
        for t in range(cfg.max_new_tokens):
            logits = steps.prompt() if t == 0 else steps.step(new)
            token, running = _next_tokens(logits, running, cfg, generator)
            ids = torch.cat([ids, token[:, None]], dim=1)
            if cfg.eos_token_id is not None and not bool(running.any()):
                break
            new = token[:, None]
            if t == 0:  # the prompt ran as the weights are; from here a step is B rows
                steps.lend(B, layouts & {"input_major"}, input_major_rows)
    return ids


def _decoding_weights(model: Decoder) -> nn.Module | None:
    """The module whose weights decoding steps read (an encoder-decoder's ``weights``: its decoder)."""
    module = model if isinstance(model, nn.Module) else getattr(model, "weights", None)
    return module if isinstance(module, nn.Module) else None


def _decode_layouts(model: Decoder, rows: int, device: torch.device, cfg: GenerationConfig,
                    compiled: bool = False) -> tuple[Layouts, int | None]:
    """The layouts (`unitok.layers.layout_timing.LAYOUTS`) decoding steps of ``rows`` rows run in,
    and the rows the input-major copy is made for (None: every widening layer): those the config
    lends (True), and the fastest of those it leaves to the rules (None) on this CPU. ``compiled``:
    for the compiled step, which takes the input-major copy alone, chosen for any number of new
    tokens (its graph is traced for the weights' strides: one layout, one graph for every length)."""
    module = _decoding_weights(model)
    if module is None or device.type != "cpu":
        return frozenset(), rows
    timeable = not dispatch_mode_active()  # (a mode that sees every op would count, or fake, the timing)
    forced: set[str] = set()
    proposals: list[str] = []
    few, packable = FEW_ROWS[0] <= rows <= FEW_ROWS[1], can_pack() and PACKED_ROWS[0] <= rows <= PACKED_ROWS[1]
    # a proposal needs steps to run (one new token comes from the prompt's logits) and layers that take it
    enough_tokens = cfg.max_new_tokens >= MIN_NEW_TOKENS or (compiled and cfg.max_new_tokens > 1)
    cold = (cfg.max_new_tokens > 1 and weight_bytes(module) >= MIN_COLD_BYTES
            and bool(widening_linears(module)))  # float32 layers to take output-major or packed products
    if cfg.strategy != "beam":  # (beam search's W + 1 rows gained nothing from the copy)
        if cfg.input_major:
            forced.add("input_major")
        elif (cfg.input_major is None and rows <= ALL_WIDENING_ROWS and enough_tokens
              and 0 < copy_bytes(module, rows) <= MAX_COPY_BYTES):
            proposals.append("input_major")
    if compiled:
        few = packable = False  # (a traced step multiplies as F.linear does: no output-major or packed products)
    if cfg.output_major and few:
        forced.add("output_major")
    elif cfg.output_major is None and few and cold:
        proposals.append("output_major")
    if cfg.packed and packable:
        forced.add("packed")
    elif cfg.packed is None and packable and cold and enough_tokens and weight_bytes(module) <= MAX_COPY_BYTES:
        proposals.append("packed")
    input_major_rows = None if cfg.input_major else rows
    baseline = frozenset(forced)
    if not proposals or not timeable:
        return baseline, input_major_rows
    return fastest_layouts(module, rows, None if compiled else cfg.max_new_tokens, baseline,
                           [baseline | {name} for name in proposals], input_major_rows), input_major_rows


def _lend(layout: contextlib.ExitStack, model: Decoder, rows: int, layouts: Layouts,
          input_major_rows: int | None) -> None:
    """Lend ``layouts`` to ``model``'s decoding steps of ``rows`` rows until ``layout`` closes."""
    module = _decoding_weights(model)
    if module is not None and layouts:
        layout.enter_context(lent(module, rows, layouts, input_major_rows))


def _static_step(model: StaticDecoder, new_ids: Tensor, positions: Tensor, keys: Tensor, index: Tensor,
                 cache: StaticKVCache) -> Tensor:
    """One token a row, written at ``index`` (1,), seeing the written (``keys`` (B, T), up to
    ``index``) positions -> (B, V) logits. Shape-stable: what `torch.compile` traces once."""
    written = torch.arange(keys.shape[1], device=keys.device) <= index  # (T,)
    return model.decode_step(new_ids, positions, (keys & written)[:, None, None, :], cache)


_compiled_steps: dict[tuple, Callable[..., Tensor]] = {}


def _compile_step(backend: str, device_type: str) -> Callable[..., Tensor]:
    """`_static_step` compiled for ``backend``, as a copy with a code object of its own: Dynamo keeps
    its graphs, and counts them against its recompile limit (8; then, under ``fullgraph``, an error),
    per code object. On the CPU, inductor's graph runs through its C++ wrapper: one call into
    compiled code a token instead of a Python function calling each kernel (a one-row step is
    dozens of small kernels; D=256 GPT on a Xeon, one thread: 1.94 against 2.17 ms a token)."""
    code = _static_step.__code__.replace(co_name=f"_static_step_{len(_compiled_steps)}")
    function = types.FunctionType(code, _static_step.__globals__, code.co_name)
    options = {"cpp_wrapper": True} if backend == "inductor" and device_type == "cpu" else None
    return torch.compile(function, backend=backend, fullgraph=True, dynamic=False, options=options)


def _compiled_step(backend: str, device: torch.device, shapes: tuple) -> Callable[..., Tensor]:
    """The compiled step for ``backend`` and steps of these ``shapes`` (rows, the cache's capacity,
    cross-attention's keys: each a graph of its own), kept for the process. One copy per shapes,
    so that batch sizes, beam widths, cache sizes and source lengths do not share a recompile
    limit; and where a copy's graphs are all taken (a ninth model of those shapes), a fresh copy
    replaces it: the limit is met before anything runs, so the step is simply taken again."""
    key = (backend, device.type, shapes)

    def step(*args: Any) -> Tensor:
        if key not in _compiled_steps:
            _compiled_steps[key] = _compile_step(backend, device.type)
        try:
            return _compiled_steps[key](*args)
        except torch._dynamo.exc.FailOnRecompileLimitHit:
            _compiled_steps[key] = _compile_step(backend, device.type)
            return _compiled_steps[key](*args)

    return step


class _StaticSteps(_Steps):
    """Steps over a `StaticKVCache`, each through the compiled step (``compile=``): the prompt fills
    positions 0..S-1 in one eager pass (its own shape); then every step writes one token a row at
    ``index`` and attends over the whole buffer, the unwritten positions masked. After the first
    step Dynamo evaluates only the guards that tell graphs apart (`_steady_guards`)."""

    def __init__(self, model: Decoder, input_ids: Tensor, mask: Tensor, cfg: GenerationConfig) -> None:
        if not all(hasattr(model, name) for name in ("decode_step", "new_static_cache")):
            raise ValueError(f"compile needs a model with a decode_step and a new_static_cache (GPT and T5 have "
                             f"them); {type(model).__name__} decodes with compile=False")
        super().__init__(model, input_ids, cfg)
        self.mask = mask
        B, S = input_ids.shape
        device = self.device
        self.backend = "inductor" if cfg.compile is True else str(cfg.compile)
        self.step_fn: Callable[..., Tensor] | None = None  # compiled for the steps' rows, at the first
        # The last new token comes from the last step's logits and is never written: S + max_new_tokens - 1
        # positions (eager decoding fits the context the same way)
        self.cache: StaticKVCache = model.new_static_cache(S + cfg.max_new_tokens - 1)  # type: ignore[attr-defined]
        T = self.cache.capacity  # ≥ that (a model may round it up, to share one compiled step)
        self.keys = torch.ones(B, T, dtype=torch.bool, device=device)  # which positions hold real tokens
        self.keys[:, :S] = mask.bool()
        self.positions = positions_from_mask(mask)  # (B, S), as the growing-cache path counts them
        self.index = torch.full((1,), S, dtype=torch.long, device=device)
        self.position = self.positions[:, -1:] + 1  # (B, 1): the first step's
        self.steps = 0

    def prompt(self) -> Tensor:
        """The prompt's (B, V) next-token logits, its keys and values written at 0..S-1."""
        B, S = self.input_ids.shape
        # The prompt's causal + padding mask over its own S keys; the rest of the buffer is not written yet.
        prompt_mask = torch.zeros(B, 1, S, self.cache.capacity, dtype=torch.bool, device=self.device)
        prompt_mask[..., :S] = build_attention_mask(S, S, True, self.mask, self.device)
        self.cache.index = torch.arange(S, device=self.device)
        logits = self.model.decode_step(self.input_ids, self.positions, prompt_mask,  # type: ignore[attr-defined]
                                        self.cache, check=True)
        self.cache.length = S
        self.cache.index = self.index
        return logits

    def expand(self, rows: Tensor) -> None:
        """Each input's prompt row copied out to its rows of the search (``rows``: the prompt row of each);
        an encoder-decoder's rows of one source share its encoder states."""
        self.cache.reorder(rows, cross=False, written=self.cache.length)
        self.keys, self.position = self.keys[rows], self.position[rows]

    def reorder(self, rows: Tensor) -> None:
        """The cache of row ``rows[i]`` becomes row i's (rows of one input: its keys and positions are theirs)."""
        self.cache.reorder(rows, cross=False, written=self.cache.length)

    def step(self, new_ids: Tensor) -> Tensor:
        """(rows, 1) ids, one a row -> (rows, V) logits; the cache advances a position."""
        if self.step_fn is None:
            shapes = (new_ids.shape[0], self.cache.capacity, *(tuple(k.shape) for k, _ in self.cache.cross.values()))
            self.step_fn = _compiled_step(self.backend, self.device, shapes)
            if self.device.type == "cuda" and self.cfg.cuda_graph and self.cfg.max_new_tokens > 1:
                self.step_fn = _cuda_graph_step(self.step_fn, self.model, self.position, self.keys, self.index,
                                                self.cache)
        # copied where strided: a view into the search's sequences has their length as its stride,
        # which the graph would be specialised for (one graph per length, then the recompile limit);
        # a (1, 1) view counts as contiguous whatever its strides, so `contiguous` would keep it
        if new_ids.stride() != (1, 1):
            new_ids = new_ids.clone(memory_format=torch.contiguous_format)
        logits = self.step_fn(self.model, new_ids, self.position, self.keys, self.index, self.cache)
        if self.steps == 0:
            self._stack.enter_context(_steady_guards())
        self.steps += 1
        self.cache.length += 1
        self.index += 1  # in place: the cache (and a captured graph) reads the same tensor
        self.position = self.position + 1
        return logits


def _static_generate(model: Decoder, input_ids: Tensor, mask: Tensor, cfg: GenerationConfig,
                     generator: torch.Generator | None) -> Tensor:
    """Greedy or sampled decoding over a `StaticKVCache`, each new token through the compiled step."""
    B = input_ids.shape[0]
    ids = input_ids
    running = torch.ones(B, dtype=torch.bool, device=input_ids.device)
    with _StaticSteps(model, input_ids, mask, cfg) as steps:
        logits = steps.prompt()
        # The prompt ran as the weights are; the steps read them input-major where this CPU runs them
        # faster so (timed: a Zen 4's 32 MB of L3, GPT D=256, 1.97-2.16x Hugging Face's eager decoding
        # against 1.26-1.30x as stored; an AMX Xeon's 480 MB hold them, and there as stored is the
        # faster). One new token comes from the prompt's logits: no step runs.
        if cfg.max_new_tokens > 1:
            steps.lend(B, *_decode_layouts(model, B, input_ids.device, cfg, compiled=True))
        for t in range(cfg.max_new_tokens):
            token, running = _next_tokens(logits, running, cfg, generator)
            ids = torch.cat([ids, token[:, None]], dim=1)
            if t + 1 == cfg.max_new_tokens or (cfg.eos_token_id is not None and not bool(running.any())):
                break
            logits = steps.step(token[:, None])
    return ids


def _only_thread() -> bool:
    """Whether no other thread could run compiled code meanwhile: none is alive but this one and
    tqdm's monitor (which only refreshes progress bars; libraries start it along the way)."""
    current = threading.current_thread()
    return all(thread is current or type(thread).__name__ == "TMonitor" for thread in threading.enumerate())


@contextlib.contextmanager
def _steady_guards() -> Iterator[None]:
    """Dynamo evaluates only the guards that tell its compiled graphs apart, until the block ends.

    Every step of one decoding has the first's shapes, dtypes, model and cache: that step ran
    every guard (a recompile, had anything changed, would have happened there), and the later ones
    would only pass them again — 0.13 ms a token on a Xeon, 7 % of a D=256 GPT's compiled step.
    Left as it is under another stance (``force_eager``, a forced backend), inside a trace, and
    wherever another thread runs: the stance is the process's, and another thread's compiled code
    would skip its guards too (a wrong graph reused without a word)."""
    stance = getattr(torch._dynamo.eval_frame, "_stance", None)
    if (torch.compiler.is_compiling() or stance is None or stance.stance != "default"
            or stance.backend is not None or stance.skip_guard_eval_unsafe or not _only_thread()):
        yield
        return
    with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
        yield


_capture_streams: dict[torch.device, torch.cuda.Stream] = {}


def _capture_stream(device: torch.device) -> torch.cuda.Stream:
    """The side stream decode steps are warmed up and captured on, one per device for the process:
    PyTorch keeps a cuBLAS workspace for every stream a product ran on, for the process, so a fresh
    stream a call (its pool hands out 32 in turn) held 33 MiB more after each call on an H200
    (GPT-124M: 33, 66, 99 MiB ... after 1, 2, 3 calls; one kept stream: nothing), and warming up on
    one stream but capturing on another would hold two."""
    if device not in _capture_streams:
        _capture_streams[device] = torch.cuda.Stream(device)
    return _capture_streams[device]


def _cuda_graph_step(step: Callable[..., Tensor], model: StaticDecoder, position: Tensor, keys: Tensor,
                     index: Tensor, cache: StaticKVCache) -> Callable[..., Tensor]:
    """``step`` captured once as a CUDA graph over this decoding's buffers: each call copies the
    (B, 1) token and position into the graph's inputs and replays every kernel in one launch.
    ``keys``, ``index`` and the cache are read where they lie (the loop advances ``index`` in
    place); the logits come back in the graph's one output buffer, overwritten by the next call."""
    token_in = torch.zeros_like(position)
    position_in = position.clone()
    # Warm-up outside the graph (compiled kernels, cuBLAS workspaces, the allocator's pools); it
    # writes keys and values at ``index``, which the first real step overwrites before reading.
    side = _capture_stream(position.device)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step(model, token_in, position_in, keys, index, cache)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        logits_out = step(model, token_in, position_in, keys, index, cache)

    def replay(_model: StaticDecoder, token: Tensor, position: Tensor, *_: object) -> Tensor:
        token_in.copy_(token)
        position_in.copy_(position)
        graph.replay()
        return logits_out

    return replay


def _beam_search(model: Decoder, input_ids: Tensor, mask: Tensor, cfg: GenerationConfig) -> Tensor:
    """Beam search with the Hugging Face semantics, so outputs match theirs token for token —
    except where theirs would score below the greedy answer.

    Each step takes the top 2W continuations over W beams × V tokens; those ending in EOS
    (or at the length limit) among the top W are scored logp / len ** length_penalty and
    offered to the pool of W finished hypotheses; the best W unfinished continue. A batch item
    stops when its pool is full and no running beam could still beat the pool's worst entry.

    A beam of width W can lose the greedy path (it falls out of the top W, then turns out
    better than every hypothesis kept), and Hugging Face's search then returns an answer that
    scores below greedy's on its own score. So one more row per input follows the greedy path
    in the same forward passes (W + 1 rows instead of W), runs on after the search only while
    its answer could still beat the best found, and is returned wherever it scores higher
    (``cfg.greedy_floor``; without it the search is Hugging Face's, W rows).
    """
    B, S = input_ids.shape
    W = cfg.num_beams
    track = W > 1 and cfg.greedy_floor  # a beam of one is greedy already
    R = W + 1 if track else W  # rows per input: W beams, then the greedy row
    eos, penalty = cfg.eos_token_id, cfg.length_penalty
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
    greedy_seqs = seqs[:, 0].clone()  # (B, T)
    greedy_logp = torch.zeros(B, device=device)
    greedy_len = torch.zeros(B, dtype=torch.long, device=device)  # new tokens, EOS included
    greedy_running = torch.ones(B, dtype=torch.bool, device=device)

    # The prompt runs once per input, its cache and logits then shared out to the input's R rows
    # (Hugging Face runs it R times: R·S rows of work where S do); each later step is B·R rows.
    steps = (_StaticSteps if cfg.compile else _GrowingSteps)(model, input_ids, mask, cfg)
    new = input_ids
    prompt_rows = torch.arange(B, device=device).repeat_interleave(R)
    batch_base = (torch.arange(B, device=device) * R)[:, None]
    top_w = torch.arange(keep, device=device)[None, :] < W
    searching = True
    pooled = False  # has any hypothesis finished yet?
    with steps:
        steps.lend(B * R, *_decode_layouts(model, B * R, device, cfg, compiled=bool(cfg.compile)))
        for cur in range(S, max_len):
            logits = (steps.prompt() if cur == S else steps.step(new)).float()  # (B·R, V)
            if cur == S:  # the prompt's: one row per input
                steps.expand(prompt_rows)
                logits = logits.repeat_interleave(R, dim=0)
            V = logits.shape[-1]
            all_logp = logits.log_softmax(dim=-1).view(B, R, V)
            length = cur + 1 - S
            if track:  # the greedy row: its argmax, until EOS
                token = all_logp[:, W].argmax(dim=-1)
                step_logp = all_logp[:, W].gather(1, token[:, None])[:, 0]
                greedy_logp = greedy_logp + torch.where(greedy_running, step_logp, torch.zeros_like(step_logp))
                greedy_len = greedy_len + greedy_running.long()
                token = torch.where(greedy_running, token, torch.full_like(token, pad))
                greedy_seqs[:, cur] = token
                if eos is not None:
                    greedy_running = greedy_running & (token != eos)
            if searching:
                logp = all_logp[:, :W] + scores[:, :, None]
                cand_scores, cand_index = logp.reshape(B, W * V).topk(keep, dim=-1)  # (B, 2W)
                cand_beam, cand_token = cand_index // V, cand_index % V
                last = cur + 1 >= max_len
                if last:
                    finished = torch.ones_like(cand_token, dtype=torch.bool)
                elif eos is not None:
                    finished = cand_token == eos
                else:
                    finished = None  # nothing can finish before the length limit

                # Running beams for the next step: the best W candidates that did not finish.
                running_scores = cand_scores if finished is None else cand_scores + finished.float() * neg
                next_scores, pick = running_scores.topk(W, dim=-1)
                beam_origin = cand_beam.gather(1, pick)

                # Finished pool: offer the newly finished among the top W candidates. Most steps
                # finish none, and then neither the pool nor whether the search can end changes
                # (that needs a full pool), so their bookkeeping is skipped.
                newly = None if finished is None else finished & top_w
                if newly is not None and bool(newly.any()):
                    cand_seqs = seqs.gather(1, cand_beam[:, :, None].expand(-1, -1, max_len))
                    cand_seqs[:, :, cur] = cand_token
                    offered = cand_scores / (length**penalty)
                    pool_full = done_flag.all(dim=1, keepdim=True) & cfg.early_stopping
                    offered = offered + (pool_full | ~open_).float() * neg
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
                    pooled = True
                seqs = seqs.gather(1, beam_origin[:, :, None].expand(-1, -1, max_len))
                seqs[:, :, cur] = cand_token.gather(1, pick)
                scores = next_scores

                if pooled:  # could the best running beam still beat the worst finished hypothesis?
                    best_running = scores[:, :1] / (max(length, 1) ** penalty)
                    worst_done = torch.where(done_flag, done_scores.min(dim=1, keepdim=True).values,
                                             torch.full_like(done_scores, neg))
                    open_ = open_ & (best_running > worst_done).any(dim=-1, keepdim=True)
                    searching = bool(open_.any()) and not (cfg.early_stopping and bool(done_flag.all()))
                if last or (finished is not None and bool(finished.all())):
                    searching = False
            if cur + 1 >= max_len:
                break
            if not searching:
                # The search is over; the greedy row goes on only while its answer could still beat the
                # best found: log-probabilities only fall, so the best it can reach is its log-probability
                # so far over the largest (penalty > 0) or current (penalty ≤ 0) length.
                longest = torch.full_like(greedy_len, cfg.max_new_tokens) if penalty > 0 else greedy_len.clamp(min=1)
                reach = greedy_logp / longest.float() ** penalty
                if not track or not bool((greedy_running & (reach > done_scores[:, 0])).any()):
                    break
                beam_origin = torch.arange(W, device=device).expand(B, W)  # frozen beams: rows stay
            rows = beam_origin + batch_base
            next_ids = seqs[:, :, cur]
            if track:
                rows = torch.cat([rows, batch_base + W], dim=1)
                next_ids = torch.cat([next_ids, greedy_seqs[:, cur, None]], dim=1)
            steps.reorder(rows.reshape(-1))  # rows move among the beams of one input
            new = next_ids.reshape(B * R, 1)
    best, best_len = done_seqs[:, 0], done_lens[:, 0]
    if track:
        # An answer cut by the length limit is finished too, as in the beams' pool.
        complete = ~greedy_running | (S + greedy_len >= max_len)
        greedy_score = greedy_logp / greedy_len.clamp(min=1).float() ** penalty
        wins = complete & (greedy_score > done_scores[:, 0] + 1e-5)  # a margin: rounding never swaps ties
        best = torch.where(wins[:, None], greedy_seqs, best)
        best_len = torch.where(wins, S + greedy_len, best_len)
    # Like Hugging Face, crop to the longest returned hypothesis; shorter ones end in padding.
    return best[:, : int(best_len.max())]
