"""Activation functions by config name (a registry, so configs stay plain strings)."""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from unitok.checks import func_transforms_active
from unitok.layers.plain_linear import unhooked

Activation = Literal["gelu", "gelu_tanh", "relu", "silu", "quick_gelu"]

_SQRT_2_PI = math.sqrt(2.0 / math.pi)
_CUBIC = 0.044715  # GPT-2's tanh approximation: u = √(2/π)·(x + 0.044715·x³)


class QuickGELU(nn.Module):
    """x·σ(1.702x): the GELU approximation of the original CLIP weights."""

    def forward(self, x: Tensor) -> Tensor:
        return x * F.sigmoid(1.702 * x)


class TanhGELU(nn.Module):
    """GPT-2's GELU, ½·x·(1 + tanh u) with u = √(2/π)·(x + 0.044715·x³) ("gelu_new").

    PyTorch's CPU tanh is several times slower than its sigmoid (one Zen 4 thread, 1 M floats:
    2.8 ms against 0.43), and ½·(1 + tanh u) = σ(2u): so on the CPU this computes x·σ(2u) in
    float32, the same function rounded differently (within 5e-7 of ``F.gelu(x, approximate="tanh")``;
    bf16 and fp16 inputs are computed in float32 and rounded back, as PyTorch's kernel does).
    One thread, 8 × 128 × 1,024 values: float32 forward 2.2× faster, forward + backward 2× with
    freed memory kept for reuse (`unitok.cpu_memory`, as ``unitok fit`` runs), 1.1× with glibc's
    default; bf16 forward + backward 1.5×. Training keeps σ(2u) for backward beside a float32 x
    (one buffer more than PyTorch's kernel keeps); a bf16 or fp16 x is kept alone and σ(2u)
    computed again. Elsewhere (GPU, float64, compiled graphs, ``torch.func`` transforms, and tensors
    below `MIN_SIGMOID_VALUES`, where one pass costs less than five) it is
    ``F.gelu(x, approximate="tanh")``."""

    def forward(self, x: Tensor) -> Tensor:
        if not _sigmoid_path(x):
            return F.gelu(x, approximate="tanh")
        if x.requires_grad and torch.is_grad_enabled():
            return _TanhGELUFunction.apply(x)
        if x.dtype != torch.float32:
            return _tanh_gelu(x.float(), out=None).to(x.dtype)
        return _tanh_gelu(x, out=None)

    def forward_(self, x: Tensor) -> Tensor:
        """The same, overwriting ``x`` (no gradient through it)."""
        if not _sigmoid_path(x):
            return torch.ops.aten.gelu_(x, approximate="tanh")
        if x.dtype != torch.float32:
            return x.copy_(_tanh_gelu(x.float(), out=None))
        return _tanh_gelu(x, out=x)


_SIGMOID_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Values from which the sigmoid form's five passes beat the one tanh pass (one Zen 4 thread:
# 16,384 values 22 µs against 30; 5,120, a beam search's 5 rows of 1,024, 14 against 11;
# 1,024, one decoding row, 11 against 4).
MIN_SIGMOID_VALUES = 16384


def _sigmoid_path(x: Tensor) -> bool:
    # (torch.func's transforms need rules _TanhGELUFunction lacks: there F.gelu, which has them)
    return (x.device.type == "cpu" and x.dtype in _SIGMOID_DTYPES and x.numel() >= MIN_SIGMOID_VALUES
            and not torch.compiler.is_compiling() and not func_transforms_active())


def _tanh_gelu(x: Tensor, out: Tensor | None) -> Tensor:
    """x·σ(2u) for a float32 x, written into ``out`` (x itself) or, with None, into the gate's
    new buffer."""
    gate = _gate(x)
    return gate.mul_(x) if out is None else out.mul_(gate)


def _gate(x: Tensor) -> Tensor:
    """σ(2u) = ½·(1 + tanh u) of a float32 x, a new tensor."""
    gate = x * x
    return gate.mul_(2 * _SQRT_2_PI * _CUBIC).add_(2 * _SQRT_2_PI).mul_(x).sigmoid_()


class _TanhGELUFunction(torch.autograd.Function):
    """x·s, s = σ(2u): d/dx = s + x·s·(1 − s)·2u' = s·(1 + x·(1 − s)·2u'),
    2u' = 2·√(2/π)·(1 + 3·0.044715·x²), in float32 (a half-precision x is upcast)."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:  # type: ignore[override]
        wide = x if x.dtype in (torch.float32, torch.float64) else x.float()  # float64: gradcheck
        gate = _gate(wide)
        if wide is x:
            ctx.save_for_backward(x, gate)
            return x * gate
        ctx.save_for_backward(x)  # half precision: keep the small x, recompute the gate
        return gate.mul_(wide).to(x.dtype)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:  # type: ignore[override]
        x, *kept = ctx.saved_tensors
        wide = x if x.dtype in (torch.float32, torch.float64) else x.float()
        gate = kept[0] if kept else _gate(wide)
        slope = wide * wide  # one new buffer, which becomes the gradient
        slope.mul_(2 * _SQRT_2_PI * 3 * _CUBIC).add_(2 * _SQRT_2_PI).mul_(wide)  # x·2u'
        slope.addcmul_(slope, gate, value=-1.0)  # x·(1 − s)·2u'
        return slope.add_(1).mul_(gate).mul_(grad).to(x.dtype)


# The module `make_activation` builds for each name (a kernel computing the name stands in only for it)
_MODULE_TYPES: dict[str, type[nn.Module]] = {
    "gelu": nn.GELU, "gelu_tanh": TanhGELU, "relu": nn.ReLU, "silu": nn.SiLU, "quick_gelu": QuickGELU}


def computes(act: nn.Module, name: Activation | None) -> bool:
    """Whether another kernel may compute activation ``name`` in place of calling ``act``: ``act`` is
    the module `make_activation` (``name``) builds (not a replacement, nor nn.GELU of the other
    approximation) and no hook watches it run."""
    return (type(act) is _MODULE_TYPES.get(name) and unhooked(act)
            and (name != "gelu" or act.approximate == "none"))


def make_activation(name: Activation) -> nn.Module:
    table = {
        "gelu": lambda: nn.GELU(),
        "gelu_tanh": lambda: TanhGELU(),  # GPT-2's "gelu_new"
        "relu": lambda: nn.ReLU(),
        "silu": lambda: nn.SiLU(),
        "quick_gelu": lambda: QuickGELU(),
    }
    if name not in table:
        raise ValueError(f"unknown activation {name!r}; expected one of {sorted(table)}")
    return table[name]()


def activate_fresh(act: nn.Module, h: Tensor) -> Tensor:
    """``act(h)`` for an ``h`` just computed and used nowhere else: overwritten in place when
    nothing needs its gradient (inference), saving the allocation and a pass over a buffer of
    h's size; otherwise out of place, as autograd needs h, and where a hook watches ``act`` (it
    must see the call)."""
    if (h.requires_grad and torch.is_grad_enabled()) or not unhooked(act):
        return act(h)
    if type(act) is nn.GELU:
        return torch.ops.aten.gelu_(h, approximate=act.approximate)
    if type(act) is TanhGELU:
        return act.forward_(h)
    if type(act) is nn.ReLU:
        return F.relu_(h)
    if type(act) is nn.SiLU:
        return F.silu(h, inplace=True)
    return act(h)
