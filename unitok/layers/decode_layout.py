"""Input-major weights while one or two rows decode on the CPU: the same products, read faster.

A decode step multiplies a row by every weight. ``F.linear`` reads an (out, in) weight as ``out``
short dot products; stored input-major (its transpose contiguous, strides (1, out)) the same
product is a sweep over contiguous rows, which the CPU streams far better once the weights no
longer sit in cache. One Zen 4 thread, one row, cold cache: 256 -> 8,192 (a GPT head) 2.4x
faster, 256 -> 768 1.55x, 768 -> 3,072 1.7x, and at 2 rows 1.7-3.1x; narrowing layers (out < in)
are read faster as they are (1,024 -> 256: 0.7x) and keep their layout. Beyond 2 rows it stops
paying (a 4-beam GPT search, 5 rows a step, with its head input-major: 1.01x at width 256, 0.88x
at 128), and a training step on input-major weights is 25 % slower. So `input_major_weights`
lends the layout for a block and gives the original tensors back (no copy) when it ends, even
on an error.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

# Below this many new tokens the one-off copy costs more than the faster steps save (a 21 MB
# model: ~12 ms of copies against ~1 ms saved a token).
MIN_NEW_TOKENS = 16
ALL_WIDENING_ROWS = 2  # up to this many rows a step, every widening layer gains; beyond, none does
# The automatic choice copies at most this much: a GPT-124M-sized model (~380 MB of widening
# weights) gained only 1.05x over 32 new tokens, for that much memory more while decoding.
MAX_COPY_BYTES = 64 * 2**20


def widening_linears(model: nn.Module, rows: int | None = None) -> list[nn.Linear]:
    """The plain ``nn.Linear`` layers of ``model`` (contiguous float32 CPU weights, out ≥ in) whose
    products with ``rows`` rows gain from the input-major layout: none beyond `ALL_WIDENING_ROWS`
    rows; ``rows`` None: all of them."""
    if rows is not None and rows > ALL_WIDENING_ROWS:
        return []
    return [m for m in model.modules()
            if type(m) is nn.Linear and m.out_features >= m.in_features and m.weight.device.type == "cpu"
            and m.weight.dtype == torch.float32 and m.weight.is_contiguous()]


def _weights(model: nn.Module, rows: int | None) -> dict[int, nn.Parameter]:
    """The `widening_linears` weights by identity: a tied weight once."""
    return {id(m.weight): m.weight for m in widening_linears(model, rows)}


def copy_bytes(model: nn.Module, rows: int | None = None) -> int:
    """The memory `input_major_weights` (``model``, ``rows``) would copy, in bytes (a tied weight once)."""
    return sum(p.numel() * p.element_size() for p in _weights(model, rows).values())


@contextlib.contextmanager
def input_major_weights(model: nn.Module, rows: int | None = None) -> Iterator[int]:
    """Within the block, each `widening_linears` (``model``, ``rows``) weight holds an input-major copy of
    its values (same parameter, same values, strides (1, out)); afterwards the original tensors
    are put back as they were. Yields how many weights were laid out. A tied weight (a GPT head
    sharing the embedding) is laid out once. Inference only: the copies are made without
    gradient tracking, and the originals stay alive meanwhile (the weights' memory once more)."""
    params = _weights(model, rows)
    originals = {key: param.data for key, param in params.items()}
    try:
        with torch.no_grad():
            for param in params.values():
                param.data = param.data.t().contiguous().t()
        yield len(params)
    finally:
        for key, param in params.items():
            param.data = originals[key]


__all__ = ["ALL_WIDENING_ROWS", "MAX_COPY_BYTES", "MIN_NEW_TOKENS", "copy_bytes", "input_major_weights",
           "widening_linears"]
