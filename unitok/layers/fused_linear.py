"""Linear layers (with their activation) through oneDNN's fused kernel for CPU inference, and
through oneDNN with their gradients for CPU training where it is preferred (`unitok.layers.onednn_gemm`).

PyTorch's ``F.linear`` on a CPU runs ``addmm``: the bias is first copied into every output row,
then the GEMM adds to it, and the activation is another pass over the result. oneDNN's
``mkldnn::_linear_pointwise`` (the kernel inductor's CPU fusions emit) applies bias and
activation inside the GEMM, and its blocking is faster at inference sizes: a Mixer-S forward
(batch 8) runs 1.12-1.16x faster. A product with no activation to fuse is oneDNN's only where
oneDNN's products are preferred (`unitok.layers.onednn_gemm.preferred`, timed): on an AMX Xeon MKL
runs them 1.0-1.2x faster (a 1,024 x 256 -> 8,192 LM head 1.12-1.21x), while fusing an exact GELU
still gains (1,568 x 512 -> 2,048, a Mixer-S MLP's first layer, 1.41x: the separate GELU pass is
slow there). It has no derivative, so the fused path is taken only when
nothing needs a gradient (``torch.no_grad``, ``inference_mode``, frozen weights on detached
input); autocast, compiled graphs (inductor fuses on its own) and small products, where
oneDNN's call overhead loses (measured crossover, ``MIN_ROWS`` / ``MIN_FEATURES``), keep
``F.linear``. A product that needs gradients (training) runs unfused through
`unitok.layers.onednn_gemm.linear` where oneDNN is timed faster (AVX-512 CPUs only; on a Zen 5
oneDNN's float32 GEMMs outrun MKL's 1.6-2.2x, forward and backward; on an AMX Xeon MKL's win),
else ``F.linear``; the activation is then a pass of its own (its gradient needs the product
before it). ``torch.backends.mkldnn.flags(enabled=False)``
turns both off.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn.modules import module as _module

from unitok.checks import dispatch_mode_active
from unitok.layers import onednn_gemm
from unitok.layers.activations import Activation, activate_fresh, computes
from unitok.layers.decode_layout import decode_linear
from unitok.layers.plain_linear import replaceable, unhooked

# config name -> (oneDNN post-op, its algorithm). Activations missing here (quick_gelu) run unfused.
ONEDNN_POST_OPS: dict[str | None, tuple[str, str]] = {
    None: ("none", ""),
    "gelu": ("gelu", "none"),
    "gelu_tanh": ("gelu", "tanh"),
    "relu": ("relu", ""),
    "silu": ("swish", ""),
}
# Below these, F.linear is as fast or faster (timed one thread on AVX-512: e.g. 1,024 x 64 -> 256
# with GELU 3.0x faster fused, but 256 rows x 256 -> 64 0.75x; 1 to 64 rows mostly slower).
MIN_ROWS = 256
MIN_FEATURES = 128

_ONEDNN_AVAILABLE = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def uses_onednn(x: Tensor, fc: nn.Linear, activation: Activation | None = None) -> bool:
    """Whether `linear` would run ``fc`` (and ``activation``) on ``x`` as one oneDNN call."""
    # cheap and often failing first: a decode step (a row or a few) leaves at once
    return (
        _ONEDNN_AVAILABLE
        and not torch.compiler.is_compiling()  # first: no shape guards in a traced graph
        and x.numel() >= MIN_ROWS * fc.in_features
        and x.shape[-1] == fc.in_features  # a wrong width goes to F.linear, whose error names both shapes
        and min(fc.in_features, fc.out_features) >= MIN_FEATURES
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and activation in ONEDNN_POST_OPS
        and fc.weight.dtype == torch.float32
        and (fc.bias is None or fc.bias.is_contiguous())  # oneDNN misreads a strided bias
        and torch.backends.mkldnn.enabled
        and replaceable(x, fc)
        and not dispatch_mode_active()  # FakeTensorMode, FlopCounterMode: they know F.linear, not oneDNN's call
        and (activation is not None or onednn_gemm.preferred())  # last: timed once, where nothing else said no
    )


def trains_onednn(x: Tensor, fc: nn.Linear) -> bool:
    """Whether `linear` runs ``fc`` on ``x`` as `unitok.layers.onednn_gemm.linear` (a product that
    needs gradients, of a plain ``nn.Linear`` no hook watches, where oneDNN is preferred)."""
    return (
        torch.is_grad_enabled()
        and type(fc) is nn.Linear
        and (x.requires_grad or fc.weight.requires_grad or (fc.bias is not None and fc.bias.requires_grad))
        and unhooked(fc)
        and onednn_gemm.onednn_products(x, fc.weight, fc.bias)  # oneDNN preferred here (timed once)
    )


def linear(x: Tensor, fc: nn.Linear, activation: Activation | None = None,
           act: nn.Module | None = None) -> Tensor:
    """``act(fc(x))`` (``fc(x)`` when ``act`` is None): one fused oneDNN call where `uses_onednn`
    says so and ``act`` is the unhooked module built for ``activation`` (`computes`), else the
    module and ``act`` (whatever module the layer holds now)."""
    if act is None and activation is not None:
        raise ValueError(f"activation={activation!r} needs its module as act= (the unfused path runs it)")
    if uses_onednn(x, fc, activation) and (act is None or computes(act, activation)):
        post_op, algorithm = ONEDNN_POST_OPS[activation]
        return torch.ops.mkldnn._linear_pointwise(x, fc.weight, fc.bias, post_op, [], algorithm)
    y = decode_linear(x, fc)  # a few-row decoding step of a model out of cache: packed or output-major
    if y is None and trains_onednn(x, fc):
        y = onednn_gemm.linear(x, fc.weight, fc.bias)  # training: the product and its gradients
    if y is None:
        y = fc(x)
    if act is None:
        return y
    # a hook may have kept y: then it must not be overwritten
    return act(y) if fc._forward_hooks or _module._global_forward_hooks else activate_fresh(act, y)


__all__ = ["MIN_FEATURES", "MIN_ROWS", "ONEDNN_POST_OPS", "linear", "trains_onednn", "uses_onednn"]
