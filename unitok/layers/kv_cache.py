"""Key/value cache for incremental decoding.

Axis legend: B batch (× beams), H heads, T cached positions, K head width.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tokenizers_mm.checks import check_int


def check_continues(buffer: Tensor | None, keys: Tensor, values: Tensor) -> None:
    """Refuse (B, H, N, K) keys/values that do not continue a cache holding ``buffer`` (its rows,
    heads and width), before anything is written: a one-row step into a two-row cache would be
    broadcast into every row, the cache corrupted without an error."""
    if values.shape != keys.shape:
        raise ValueError(f"keys {tuple(keys.shape)} and values {tuple(values.shape)} must have one shape")
    if buffer is not None and (keys.shape[0], keys.shape[1], keys.shape[3]) != (
            buffer.shape[0], buffer.shape[1], buffer.shape[3]):
        raise ValueError(f"new keys of shape {tuple(keys.shape)} (batch, heads, tokens, width) do not continue this "
                         f"cache of {buffer.shape[0]} rows, {buffer.shape[1]} heads and width {buffer.shape[3]}: "
                         "continue a cache with the batch that filled it (or reorder it first)")


def static_capacity(needed: int, limit: int) -> int:
    """A static cache's capacity for ``needed`` positions: rounded up so that prompts of nearby
    lengths share one compiled decode step (each capacity compiles its own), by steps of 16
    positions below 256 and of an eighth of the power of two at or below ``needed`` above (256
    -> 32, 1,024 -> 128): at most 16 positions or an eighth more memory than ``needed``, where
    multiples of 64 held up to 2.2x (29 -> 64) at decoding's usual lengths. At most ``limit``
    (the model's context), which must hold ``needed``."""
    check_int("needed", needed, at_least=1)
    check_int("limit", limit, at_least=1)
    if needed > limit:
        raise ValueError(f"a static cache of {needed} positions does not fit the limit of {limit}")
    step = max(16, 1 << max(needed.bit_length() - 4, 0))  # 2 ** floor(log2(needed)) / 8, at least 16
    return min(limit, -(-needed // step) * step)


def select_rows(buffer: Tensor | None, index: Tensor, end: int) -> Tensor | None:
    """A (B, H, T, K) cache buffer's batch rows ``index``. The same number of rows, permuted: only
    the first ``end`` (filled) positions gathered and written back in place, the preallocated buffer
    (prompt + every token still to come) kept; another number of rows: a new buffer."""
    if buffer is None:
        return None
    if index.numel() != buffer.shape[0]:
        return buffer.index_select(0, index)
    buffer[:, :, :end] = buffer[:, :, :end].index_select(0, index)
    return buffer


class KVCache:
    """Per-layer keys and values kept in buffers that grow geometrically.

    Writing into a preallocated buffer instead of concatenating at every step keeps decoding
    linear in the number of new tokens. ``capacity`` may be given up front (generation knows
    prompt + max_new_tokens).
    """

    def __init__(self, n_layers: int, capacity: int = 0) -> None:
        self.n_layers = n_layers
        self.capacity = capacity
        self._keys: list[Tensor | None] = [None] * n_layers
        self._values: list[Tensor | None] = [None] * n_layers
        self._lengths = [0] * n_layers
        # Cross-attention keys/values per layer: computed once from the encoder output.
        self.cross: dict[int, tuple[Tensor, Tensor]] = {}

    def __len__(self) -> int:
        """Number of cached positions (of layer 0, which every forward updates first)."""
        return self._lengths[0]

    @property
    def seq_len(self) -> int:
        return self._lengths[0]

    def key_length(self, n_new: int) -> int:
        """How many keys attention sees once ``n_new`` tokens are added: cached + new."""
        return self._lengths[0] + n_new

    def update(self, layer: int, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        """Append (B, H, T_new, K) keys/values for ``layer``; return all cached (B, H, T, K)."""
        start = self._lengths[layer]
        end = start + keys.shape[2]
        buf_k, buf_v = self._keys[layer], self._values[layer]
        check_continues(buf_k, keys, values)
        if buf_k is None or buf_k.shape[2] < end:
            size = max(end, self.capacity, 2 * (buf_k.shape[2] if buf_k is not None else 0))
            new_k = keys.new_empty(keys.shape[0], keys.shape[1], size, keys.shape[3])
            new_v = values.new_empty(values.shape[0], values.shape[1], size, values.shape[3])
            if buf_k is not None:
                new_k[:, :, :start] = buf_k[:, :, :start]
                new_v[:, :, :start] = buf_v[:, :, :start]  # type: ignore[index]
            buf_k, buf_v = new_k, new_v
            self._keys[layer], self._values[layer] = buf_k, buf_v
        buf_k.narrow(2, start, end - start).copy_(keys)
        buf_v.narrow(2, start, end - start).copy_(values)  # type: ignore[union-attr]
        self._lengths[layer] = end
        return buf_k.narrow(2, 0, end), buf_v.narrow(2, 0, end)  # type: ignore[union-attr]

    def reorder(self, index: Tensor, cross: bool = True) -> None:
        """Select batch rows (beam search keeps the cache of the surviving beams).

        ``cross=False`` leaves the cross-attention entries alone: beam search only moves rows
        among the beams of one input, which share the same encoder output.
        """
        if cross:
            self.cross = {i: (k.index_select(0, index), v.index_select(0, index)) for i, (k, v) in self.cross.items()}
        for layer in range(self.n_layers):
            self._keys[layer] = select_rows(self._keys[layer], index, self._lengths[layer])
            self._values[layer] = select_rows(self._values[layer], index, self._lengths[layer])

    def layer(self, layer: int) -> tuple[Tensor, Tensor]:
        """The cached (B, H, T, K) keys and values of one layer."""
        end = self._lengths[layer]
        if self._keys[layer] is None:
            raise IndexError(f"layer {layer} has nothing cached")
        return self._keys[layer][:, :, :end], self._values[layer][:, :, :end]  # type: ignore[index]

    @torch.no_grad()
    def to(self, device: torch.device | str) -> KVCache:
        self._keys = [k.to(device) if k is not None else None for k in self._keys]
        self._values = [v.to(device) if v is not None else None for v in self._values]
        self.cross = {i: (k.to(device), v.to(device)) for i, (k, v) in self.cross.items()}
        return self


class StaticKVCache:
    """Keys and values in buffers of one fixed capacity, written where ``index`` says.

    Every decode step then has the same shapes — attention reads the whole buffer, a mask
    hides the positions not written yet — which is what a compiled decode step (or a CUDA
    graph) needs: nothing grows, no shape changes from one token to the next. ``index`` is a
    (N,) tensor of the positions the next N tokens are written to, set by the caller (the
    decoding loop advances it in place, without a host sync); ``seq_len`` counts filled
    positions on the host. Buffers are made at the first write (their batch, heads and width
    come from the keys).
    """

    def __init__(self, n_layers: int, capacity: int) -> None:
        check_int("capacity", capacity)
        self.n_layers = n_layers
        self.capacity = capacity
        self._index: Tensor | None = None
        self.length = 0
        self._keys: list[Tensor | None] = [None] * n_layers
        self._values: list[Tensor | None] = [None] * n_layers
        self.cross: dict[int, tuple[Tensor, Tensor]] = {}

    def __len__(self) -> int:
        return self.length

    @property
    def index(self) -> Tensor | None:
        """(N,) long positions the next N tokens are written to."""
        return self._index

    @index.setter
    def index(self, positions: Tensor | None) -> None:
        # Checked where it is set (once a prompt, once for the step's index the loop then advances
        # in place), not in the compiled step: two tokens at one position would lose one's keys.
        if positions is not None:
            if not isinstance(positions, Tensor) or positions.dtype != torch.long or positions.dim() != 1:
                what = f"{positions.dtype} {tuple(positions.shape)}" if isinstance(positions, Tensor) else \
                    type(positions).__name__
                raise ValueError(f"StaticKVCache.index must be a (N,) long tensor of positions, got {what}")
            ordered = positions.sort().values
            if len(ordered) and bool((ordered[0] < 0) | (ordered[-1] >= self.capacity)
                                     | (ordered[1:] == ordered[:-1]).any()):  # one host sync, not three
                raise ValueError(f"StaticKVCache.index must hold distinct positions within 0..{self.capacity - 1}, "
                                 f"got {positions.tolist()}")
        self._index = positions

    @property
    def seq_len(self) -> int:
        return self.length

    def key_length(self, n_new: int) -> int:
        """Attention always reads the whole buffer (masked past what is written)."""
        return self.capacity

    def reorder(self, index: Tensor, cross: bool = True, written: int | None = None) -> None:
        """Select batch rows (beam search keeps the cache of the surviving beams). The same number of
        rows: gathered and written back in place, so that the buffers a compiled step (or a captured
        CUDA graph) reads stay the same tensors; another number (a prompt's row copied out to its
        beams): new buffers. ``written``: how many leading positions hold keys, the only ones moved
        (a decoding knows: its ``length``); None: the whole buffer. ``cross=False`` leaves the
        cross-attention entries alone, as `KVCache.reorder` does."""
        end = self.capacity if written is None else check_int("written", written, at_least=0)
        if end > self.capacity:  # a slice would clamp it, and "written" would say more than the buffer holds
            raise ValueError(f"written must be within 0..{self.capacity} (the cache's capacity), got {written}")
        if cross:
            self.cross = {i: (k.index_select(0, index), v.index_select(0, index)) for i, (k, v) in self.cross.items()}
        for layer in range(self.n_layers):
            self._keys[layer] = select_rows(self._keys[layer], index, end)
            self._values[layer] = select_rows(self._values[layer], index, end)

    def update(self, layer: int, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        """Write (B, H, N, K) keys/values at ``index``; return the whole (B, H, capacity, K) buffers."""
        if self.index is None or self.index.shape != (keys.shape[2],):
            shape = None if self.index is None else tuple(self.index.shape)
            raise ValueError(f"set StaticKVCache.index to the {keys.shape[2]} positions being written, got {shape}")
        check_continues(self._keys[layer], keys, values)
        if self._keys[layer] is None:
            size = (keys.shape[0], keys.shape[1], self.capacity, keys.shape[3])
            self._keys[layer] = keys.new_zeros(size)
            self._values[layer] = values.new_zeros(size)
        buf_k, buf_v = self._keys[layer], self._values[layer]
        buf_k.index_copy_(2, self.index, keys)  # type: ignore[union-attr]
        buf_v.index_copy_(2, self.index, values)  # type: ignore[union-attr]
        return buf_k, buf_v  # type: ignore[return-value]
