"""Whether an ``nn.Linear`` call may be computed by another kernel than its own forward.

Two CPU inference paths replace ``fc(x)`` with the same product computed another way: oneDNN's
fused linear (`unitok.layers.fused_linear`) and decoding's output-major products
(`unitok.layers.decode_layout`). Both may do so only where nobody can tell the difference but
by speed: the module is a plain ``nn.Linear`` (a subclass — parametrised, quantised, an adapter —
owns its forward), no hook expects to see it run (`unhooked`), nothing needs a gradient or a
forward-mode tangent (`forward_derivatives`: neither kernel has a derivative), autocast would not
have changed the dtype, and no compiled graph is being traced (inductor fuses on its own, and
shape tests would become guards).
"""

from __future__ import annotations

import torch
import torch.autograd.forward_ad as fwAD
from torch import Tensor, nn
from torch.nn.modules import module as _module

from unitok.checks import func_transforms_active


def unhooked(module: nn.Module) -> bool:
    """True where no hook watches ``module`` run: none of its own (forward, forward-pre, backward,
    backward-pre) and no global module hook. A kernel that computes the module's output without
    calling it may then stand in for it."""
    return not (module._forward_hooks or module._forward_pre_hooks
                or module._backward_hooks or module._backward_pre_hooks
                or _module._global_forward_hooks or _module._global_forward_pre_hooks
                or _module._global_backward_hooks or _module._global_backward_pre_hooks)


def forward_derivatives(*tensors: Tensor | None) -> bool:
    """Whether these tensors (None: absent) are differentiated in ways a kernel without derivative
    rules would drop: inside a ``torch.func`` transform (``grad``, ``vmap``, ``jvp``...), or with a
    forward-mode tangent (``torch.autograd.forward_ad``)."""
    if func_transforms_active():
        return True
    # (no dual level entered: no tensor can carry a tangent, and the check is one attribute read)
    return getattr(fwAD, "_current_level", 0) >= 0 and any(
        t is not None and fwAD.unpack_dual(t).tangent is not None for t in tensors)


def replaceable(x: Tensor, fc: nn.Module) -> bool:
    """True where ``fc(x)`` may be computed by another kernel (see the module's docstring)."""
    return (
        type(fc) is nn.Linear
        and not torch.compiler.is_compiling()
        and not torch.is_autocast_enabled("cpu")
        and not (torch.is_grad_enabled() and (x.requires_grad or fc.weight.requires_grad
                                              or (fc.bias is not None and fc.bias.requires_grad)))
        and unhooked(fc)
        and not forward_derivatives(x, fc.weight, fc.bias)
    )


__all__ = ["forward_derivatives", "replaceable", "unhooked"]
