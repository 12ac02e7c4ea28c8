"""torch.compile for unitok models: the transformer stacks compiled, the input checks eager.

A model's forward checks its input (ids in range, finite pixels, lengths), which needs the
values on the host: under torch.compile each check would be a graph break. So what is
compiled is every `Backbone` (the blocks, where the time goes), each as one graph, while the
embedders and checks around it stay eager — the stack's own padding-mask checks included
(`Backbone.checked_masks`, run before its graph). ``training_only`` keeps evaluation and
generation (a growing KV cache: a new shape every token) on the eager path; decoding compiles its
own shape-stable step instead (`generate(..., compile=True)`, over a `StaticKVCache`). The LM
head fused with its loss (`unitok.losses.linear_cross_entropy`) stays outside the stacks' graphs
(its chunks are a Python loop), but each chunk's softmax and gradient compile too: what a model
that trains with it reads from `loss_backend`.
"""

from __future__ import annotations

import importlib.util
import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from unitok.backbone import Backbone


class _OwnMark:
    """A value `compile_backbones` leaves on a module about that module alone: a copy of it
    (`copy.deepcopy`, pickling) gets None instead, as PyTorch drops the compiled call itself from
    a copy (``nn.Module.__getstate__``: the call is bound to the original and its weights)."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __reduce__(self) -> tuple[type, tuple[()]]:
        return type(None), ()


# Backends Dynamo registers whatever is installed, whose package it imports only when it first compiles.
BACKEND_PACKAGES = {"tvm": "tvm", "openxla": "torch_xla", "openxla_eval": "torch_xla"}


def check_backend(name: str, backend: Any, callables: bool = True, also: str | None = None) -> None:
    """Refuse a ``backend`` that `torch.compile` would refuse only at compile time: not a
    registered name (`torch._dynamo.list_backends`, the debugging ones such as ``eager`` and
    ``aot_eager`` included) nor, if ``callables``, a callable. ``name`` names the option in the
    error, ``also`` what else it takes (its own check's business)."""
    if backend == "inductor" or (callables and callable(backend)):  # inductor: without importing Dynamo
        return
    from torch._dynamo import list_backends  # (a second's import: only for another backend)

    names = list_backends(exclude_tags=())
    if not isinstance(backend, str) or backend not in names:
        takes = [*([also] if also else []), *(["a callable"] if callables else []), "the name of a torch.compile backend"]
        raise ValueError(f"{name} must be {' or '.join(takes)} ({', '.join(names)}), got {backend!r}")
    package = BACKEND_PACKAGES.get(backend)
    if package is not None and importlib.util.find_spec(package) is None:
        raise ValueError(f"{name}={backend!r} needs the {package!r} package, which is not installed")


_FORWARD = inspect.signature(Backbone.forward)


def compile_backbones(model: nn.Module, training_only: bool = True, **options: Any) -> int:
    """Compile every `Backbone` inside ``model`` in place (weights and state-dict keys
    unchanged), and the fused LM-head loss of the modules in it (`loss_backend`); ``options`` go
    to `torch.compile` (backend, mode, dynamic, …), the loss takes the backend (a name or a
    callable) alone. -> how many stacks were compiled. Calling it again on a compiled model changes
    nothing. A copy of a compiled model (`copy.deepcopy`, pickling: an EMA or teacher copy, a
    ``torch.save``) runs eagerly on its own weights until it is compiled in turn."""
    if "backend" in options:  # refused here, not at the first compiled call
        check_backend("backend", options["backend"] or "inductor")
    loss_setting = _OwnMark((options.get("backend") or "inductor", training_only))
    for module in model.modules():
        if getattr(module, "_unitok_loss_compile", None) is None:
            module._unitok_loss_compile = loss_setting  # type: ignore[attr-defined]
    count = 0
    for module in model.modules():
        if not isinstance(module, Backbone) or module._compiled_call_impl is not None:
            continue
        # What `nn.Module.compile` does (the call, hooks included, compiled; `__call__` runs it), but
        # eager while evaluating if ``training_only``. The compiled call is the module's own
        # attribute, which PyTorch leaves out of copies (``nn.Module.__getstate__``).
        graph = torch.compile(module._call_impl, **options)

        def compiled(*args: Any, _module: Backbone = module, _graph: Any = graph, **kwargs: Any) -> Any:
            # The padding masks are checked (and an all-real one dropped) here, eagerly: inside the
            # graph those host reads would break it in three.
            bound = _FORWARD.bind(_module, *args, **kwargs)
            given = bound.arguments
            given["attention_mask"], given["encoder_attention_mask"] = _module.checked_masks(
                given["x"], given.get("attention_mask"), given.get("cache"), given.get("encoder_hidden_states"),
                given.get("encoder_attention_mask"))
            return _graph(*bound.args[1:], **bound.kwargs, _masks_checked=True)

        if training_only:
            def call(*args: Any, _module: Backbone = module, _compiled: Any = compiled, **kwargs: Any) -> Any:
                return (_compiled if _module.training else _module._call_impl)(*args, **kwargs)

            module._compiled_call_impl = call
        else:
            module._compiled_call_impl = compiled
        module._unitok_compiled = _OwnMark(True)  # type: ignore[attr-defined]
        count += 1
    return count


def loss_backend(module: nn.Module) -> bool | str | Callable[..., Any]:
    """The `torch.compile` backend for ``module``'s LM head fused with its loss (the ``compile``
    argument of `unitok.losses.linear_cross_entropy`): the one `compile_backbones` was given, while
    the module trains (or always, if it compiled more than training); False otherwise."""
    setting = getattr(module, "_unitok_loss_compile", None)
    if setting is None:  # never compiled, or a copy of a compiled model
        return False
    backend, training_only = setting.value
    return backend if module.training or not training_only else False
