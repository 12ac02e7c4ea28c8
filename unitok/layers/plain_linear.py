"""Whether an ``nn.Linear`` call may be computed by another kernel than its own forward.

Two CPU inference paths replace ``fc(x)`` with the same product computed another way: oneDNN's
fused linear (`unitok.layers.fused_linear`) and decoding's output-major products
(`unitok.layers.decode_layout`). Both may do so only where nobody can tell the difference but
by speed: the module is a plain ``nn.Linear`` (a subclass — parametrised, quantised, an adapter —
owns its forward), no hook expects to see it run, nothing needs a gradient (neither kernel has a
derivative), autocast would not have changed the dtype, and no compiled graph is being traced
(inductor fuses on its own, and shape tests would become guards).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn.modules import module as _module


def replaceable(x: Tensor, fc: nn.Module) -> bool:
    """True where ``fc(x)`` may be computed by another kernel (see the module's docstring)."""
    return (
        type(fc) is nn.Linear
        and not torch.compiler.is_compiling()
        and not torch.is_autocast_enabled("cpu")
        and not (torch.is_grad_enabled() and (x.requires_grad or fc.weight.requires_grad
                                              or (fc.bias is not None and fc.bias.requires_grad)))
        and not (fc._forward_hooks or fc._forward_pre_hooks
                 or _module._global_forward_hooks or _module._global_forward_pre_hooks)
    )


__all__ = ["replaceable"]
