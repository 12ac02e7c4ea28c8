"""Decoding steps' products on the CPU, read faster: input-major weights for one or two rows,
output-major products for a few, weights packed for the step's row count from four rows up.

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

A few rows at a time (a beam search's W + 1, a small batch) the widening products have the
opposite problem: ``F.linear`` gives MKL's GEMM the 3-10 rows as its M dimension, a shape it
neither blocks nor threads well once the weight is out of cache. `output_major_products` has
them computed as (weight @ xᵀ)ᵀ instead — the output features as M — for as long as a decoding
loop runs: one Zen 4 thread, cold cache, 4-5 rows, an 8,192 x 256 head 1.6-2.0x faster (GPT-2's
50,304 x 768: 1.7-2.0x), 256 -> 768 or 1,024 1.7x, and two threads split the product (2.4-3.7x).
It is proposed only where the decoding weights outgrow the cache (`MIN_COLD_BYTES`): a model that
stays cached (a 5 MB one) runs the same products 0.6-0.9x as fast that way.

A single row goes output-major too, as two (itself twice), where no input-major copy is lent
(a model whose copy would pass `MAX_COPY_BYTES`, or ``input_major=False``): MKL multiplies one
column through a matrix-vector kernel that streams the weight slowly and two through its fast
small-product kernel (one thread, cold cache, the 8,192 x 256 head 0.41 against 0.92 ms, 768 ->
3,072 0.47 against 0.70, 768 -> 2,304 0.37 against 0.53). A GPT-124M-sized model decodes 1.24x
faster that way (one row, 24-32 new tokens). The copy stays ahead for one row on one thread only
(a D=256 GPT: 139 against 160 ms for 64 new tokens); at two rows output-major is 1.21x faster on
one thread, and one row on two threads 1.01-1.17x. Narrowing layers keep
``F.linear`` (768 x 3,072 -> 768 at two rows output-major: 0.83 against 0.48 ms).

From four rows up, the fastest product is oneDNN's with the weight packed for that many rows
(``mkldnn::_reorder_linear_weight``, the blocked layout inductor freezes weights into), whichever
way the layer goes: one Zen 4 thread, cold cache, 5 rows, the 8,192 x 256 head 0.64-0.66 ms
against 0.86-1.18 output-major and 1.8-2.0 ``F.linear``; at 10 rows 1024 x 256 0.11-0.17 against
0.18-0.29, the narrowing 256 x 1,024 0.10-0.15 against 0.17-0.23 (F.linear's); GPT-2's 50,304 x
768 head at 5 rows 8.5 against 22 ms; at 64 rows 1.2-1.9x, at 96-255 rows 1.05-1.27x the better of F.linear
and oneDNN's call on the weight as stored (which takes over from 256 rows). The packed copy is made where a
step first multiplies by the weight and lives until the block ends (`packed_products`; a step's
exact row count only, so a one-off product — a prompt, cross-attention's keys of the source —
runs as before). Weights that stay in cache run their layers faster as they are (a 5 MB model's
1 MB layers: 0.6-0.9x packed), so packing is proposed where `MIN_COLD_BYTES` says the weights are
out of cache and the copy is at most `MAX_COPY_BYTES`.

These numbers are a Zen 4's. Which layout wins depends on the CPU (an AMX Xeon with 480 MB of L3
runs the D=256 GPT fastest on its weights as stored), so `generate` lends a proposed layout only
where timing it on this CPU finds it faster (`unitok.layers.layout_timing`).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import numpy as np
import torch
from torch import Tensor, nn

from unitok.layers.plain_linear import replaceable

# Below this many new tokens the one-off copy costs more than the faster steps save (a 21 MB
# model: ~12 ms of copies against ~1 ms saved a token).
MIN_NEW_TOKENS = 16
ALL_WIDENING_ROWS = 2  # up to this many rows a step, every widening layer gains; beyond, none does
# The automatic choice copies at most this much: a GPT-124M-sized model (~380 MB of widening
# weights) gained only 1.05x over 32 new tokens, for that much memory more while decoding.
MAX_COPY_BYTES = 64 * 2**20
# Output-major products take steps of this many rows, up to a limit that falls as the layers widen
# (one thread, cold cache, output-major against F.linear: 256 inputs still 1.06-1.19x at 10 rows
# (a T5 D=256 search of two sources, 4 beams: 1.18-1.21x Hugging Face against 1.12-1.16x with 6);
# 512 inputs 1.08-1.37x at 8, 0.75-0.91x at 10; 768 inputs 0.95-1.22x at 6, 0.70-0.93x at 8),
# of models whose decoding weights are at least `MIN_COLD_BYTES`: a D=256 GPT's 21 MB ran its
# 5-row steps at cold-cache speed on this 32 MB-L3 CPU (1 MB layers at ~6 GB/s), a D=128 one's
# 5 MB did not.
FEW_ROWS = (1, 10)  # one row runs as two (see the module's docstring)
ROWS_BY_INPUTS = ((256, 10), (512, 8))  # (in_features up to, most rows); wider layers: 6
MIN_COLD_BYTES = 8 * 2**20
# Steps of this many rows run packed where `packed_products` is lent (at 3 rows packed and output-major
# trade places layer by layer; at 255 packed is still 1.05-1.14x the better of F.linear and oneDNN's call
# on the weight as stored, which `unitok.layers.fused_linear` takes from 256 rows).
PACKED_ROWS = (4, 255)
_OUTPUT_MAJOR: contextvars.ContextVar[bool] = contextvars.ContextVar("output_major", default=False)
# (the rows lent, {id(layer): (its weight's storage address, its version, the packed copy)}); None: not lent
_PACKED: contextvars.ContextVar[tuple[int, dict[int, tuple[int, int, Tensor]]] | None] = contextvars.ContextVar(
    "packed", default=None)
_mkldnn = torch.ops.mkldnn  # oneDNN's operators: packing a weight, and the product on it
_CAN_PACK = (torch.backends.mkldnn.is_available() and hasattr(_mkldnn, "_reorder_linear_weight")
             and hasattr(_mkldnn, "_linear_pointwise"))


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


def weight_bytes(model: nn.Module) -> int:
    """The bytes of ``model``'s parameters (a tied one once): what a decoding step reads."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


@contextlib.contextmanager
def output_major_products() -> Iterator[None]:
    """Within the block, `output_major_linear` computes a few rows' widening products output-major."""
    token = _OUTPUT_MAJOR.set(True)
    try:
        yield
    finally:
        _OUTPUT_MAJOR.reset(token)


def most_rows(in_features: int) -> int:
    """The most rows a step may have for a layer of ``in_features`` inputs to run output-major."""
    return next((rows for width, rows in ROWS_BY_INPUTS if in_features <= width), 6)


def output_major_linear(x: Tensor, fc: nn.Linear) -> Tensor | None:
    """``fc(x)`` computed as (weight @ xᵀ)ᵀ where `output_major_products` is on and ``x`` holds
    1 (run as 2) to `most_rows` rows for a widening (out ≥ in) plain float32 CPU layer, its weight as stored,
    nothing needing a gradient and no hook to run: the same values, rounded in another order
    (within 1e-6 relative); None where not (the caller runs ``fc``)."""
    # cheap and usually false: ordinary forwards (and traced graphs, before any shape test) leave at once
    if torch.compiler.is_compiling() or not _OUTPUT_MAJOR.get():
        return None
    weight = fc.weight
    if x.dim() == 0 or x.shape[-1] != fc.in_features:  # a wrong width: F.linear raises, naming both
        return None
    rows = x.numel() // fc.in_features
    if not (FEW_ROWS[0] <= rows <= most_rows(fc.in_features) and fc.out_features >= fc.in_features
            and weight.device.type == "cpu" and weight.dtype == torch.float32
            and x.dtype == torch.float32 and weight.is_contiguous() and replaceable(x, fc)):
        return None
    flat = x.reshape(rows, fc.in_features)
    if rows == 1:  # two columns take MKL's fast kernel, one its slow matrix-vector product
        flat = torch.cat([flat, flat])
    flat = flat.t()
    out = weight @ flat if fc.bias is None else torch.addmm(fc.bias[:, None], weight, flat)  # (out, rows)
    if rows == 1:
        return out[:, 0].contiguous().view(*x.shape[:-1], fc.out_features)
    # back to (rows, out): numpy's transposing copy takes a quarter of ``out.t().contiguous()``'s time
    # here (13 against 53 us for 8,192 x 5), a tenth of the head's product saved again
    rows_first = torch.from_numpy(np.ascontiguousarray(out.numpy().T))
    return rows_first.view(*x.shape[:-1], fc.out_features)


def can_pack() -> bool:
    """Whether this PyTorch build (and ``torch.backends.mkldnn.enabled``) offers oneDNN's packed linear."""
    return _CAN_PACK and torch.backends.mkldnn.enabled


@contextlib.contextmanager
def packed_products(rows: int) -> Iterator[None]:
    """Within the block, `packed_linear` computes products of exactly ``rows`` rows through oneDNN on
    weights packed for them, each packed at its first such product; the copies go when it ends.
    A weight changed in place within the block is packed again — but not one written through
    ``weight.data`` (a tensor with a version counter of its own, so the change goes unseen): update
    weights between blocks, or through the parameter itself (``with torch.no_grad(): w.copy_(...)``,
    as ``load_state_dict`` does). `generate` packs within one call and is not affected."""
    if not PACKED_ROWS[0] <= rows <= PACKED_ROWS[1]:
        raise ValueError(f"packed products serve steps of {PACKED_ROWS[0]} to {PACKED_ROWS[1]} rows, got {rows}")
    token = _PACKED.set((rows, {}))
    try:
        yield
    finally:
        _PACKED.reset(token)


def packed_linear(x: Tensor, fc: nn.Linear) -> Tensor | None:
    """``fc(x)`` through oneDNN on ``fc``'s weight packed for ``x``'s rows, where `packed_products` is
    lent for that many rows and ``fc`` is a plain float32 CPU layer (its weight contiguous, nothing
    needing a gradient, no hook to run): the same values, rounded in another order (within 1e-6
    relative); None where not (the caller runs another product). A weight changed in place since
    it was packed is packed again."""
    # cheap and usually false: ordinary forwards (and traced graphs, before any shape test) leave at once;
    # a traced graph leaves before reading the context variable, which older dynamo (torch 2.11) cannot trace
    if torch.compiler.is_compiling():
        return None
    lent = _PACKED.get()
    if lent is None:
        return None
    rows, packed = lent
    weight = fc.weight
    # (oneDNN reads a bias as contiguous whatever its stride: a strided one is left to the caller)
    if (x.dim() == 0 or x.shape[-1] != fc.in_features or x.numel() != rows * fc.in_features
            or weight.device.type != "cpu" or weight.dtype != torch.float32 or x.dtype != torch.float32
            or not weight.is_contiguous() or (fc.bias is not None and not fc.bias.is_contiguous())
            or not can_pack() or not replaceable(x, fc)):
        return None
    stamp = (weight.data_ptr(), weight._version)
    entry = packed.get(id(fc))
    if entry is None or entry[:2] != stamp:
        entry = packed[id(fc)] = (*stamp, _mkldnn._reorder_linear_weight(weight.detach(), rows))
    return _mkldnn._linear_pointwise(x, entry[2], fc.bias, "none", [], "")


def decode_linear(x: Tensor, fc: nn.Linear) -> Tensor | None:
    """A decoding step's ``fc(x)`` the fastest lent way — packed (`packed_linear`), else output-major
    (`output_major_linear`) — or None where neither applies (the caller runs ``fc``)."""
    out = packed_linear(x, fc)
    return output_major_linear(x, fc) if out is None else out


def head_logits(hidden: Tensor, head: nn.Linear) -> Tensor:
    """``head(hidden)``, packed or output-major where `decode_linear` takes it (a decode step's LM head)."""
    out = decode_linear(hidden, head)
    return head(hidden) if out is None else out


__all__ = ["ALL_WIDENING_ROWS", "FEW_ROWS", "MAX_COPY_BYTES", "MIN_COLD_BYTES", "MIN_NEW_TOKENS", "PACKED_ROWS",
           "ROWS_BY_INPUTS", "can_pack", "copy_bytes", "decode_linear", "head_logits", "input_major_weights",
           "most_rows", "output_major_linear", "output_major_products", "packed_linear", "packed_products",
           "weight_bytes", "widening_linears"]
