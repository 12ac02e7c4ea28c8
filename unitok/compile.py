"""torch.compile for unitok models: the transformer stacks compiled, the input checks eager.

A model's forward checks its input (ids in range, finite pixels, lengths), which needs the
values on the host: under torch.compile each check would be a graph break. So what is
compiled is every `Backbone` (the blocks, where the time goes), each as one graph, while the
embedders and checks around it stay eager. ``training_only`` keeps evaluation and
generation (a growing KV cache: a new shape every token) on the eager path; decoding compiles its
own shape-stable step instead (`generate(..., compile=True)`, over a `StaticKVCache`). The LM
head fused with its loss (`unitok.losses.linear_cross_entropy`) stays outside the stacks' graphs
(its chunks are a Python loop), but each chunk's softmax and gradient compile too: what a model
that trains with it reads from `loss_backend`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from unitok.backbone import Backbone


def compile_backbones(model: nn.Module, training_only: bool = True, **options: Any) -> int:
    """Compile every `Backbone` inside ``model`` in place (weights and state-dict keys
    unchanged), and the fused LM-head loss of the modules in it (`loss_backend`); ``options`` go
    to `torch.compile` (backend, mode, dynamic, …), the loss takes the backend (a name or a
    callable) alone. -> how many
    stacks were compiled. Calling it again on a compiled model changes nothing."""
    loss_setting = (options.get("backend") or "inductor", training_only)
    for module in model.modules():
        if not hasattr(module, "_unitok_loss_compile"):
            module._unitok_loss_compile = loss_setting  # type: ignore[attr-defined]
    count = 0
    for module in model.modules():
        if not isinstance(module, Backbone) or getattr(module, "_unitok_compiled", False):
            continue
        eager = module.forward
        compiled = torch.compile(eager, **options)

        def forward(*args: Any, _module: Backbone = module, _eager: Any = eager, _compiled: Any = compiled,
                    **kwargs: Any) -> Any:
            use = _compiled if _module.training or not training_only else _eager
            return use(*args, **kwargs)

        module.forward = forward  # type: ignore[method-assign]
        module._unitok_compiled = True  # type: ignore[attr-defined]
        count += 1
    return count


def loss_backend(module: nn.Module) -> bool | str | Callable[..., Any]:
    """The `torch.compile` backend for ``module``'s LM head fused with its loss (the ``compile``
    argument of `unitok.losses.linear_cross_entropy`): the one `compile_backbones` was given, while
    the module trains (or always, if it compiled more than training); False otherwise."""
    setting = getattr(module, "_unitok_loss_compile", None)
    if setting is None:
        return False
    backend, training_only = setting
    return backend if module.training or not training_only else False
