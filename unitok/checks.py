"""Input checks shared by the models: refuse bad input up front with a message that names it.

A check of a tensor on a GPU has to bring its verdict to the host, and reading it there waits
for everything queued before it: a training step whose checks run first drains the GPU's queue
once per check. Inside `deferred_checks` (the models' forwards and the fused loss open one) a
GPU check instead queues its verdict as a non-blocking copy and the scope reads every verdict
as it ends, when the GPU has long passed them; the error is the same and is raised before the
scope's results are returned. Until then a deferred check's caller makes bad values harmless
(out-of-range ids clamped), so a gather cannot fault on them first. CPU tensors are checked at once.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from contextlib import ContextDecorator
from typing import Any

import torch
import torch.utils._python_dispatch
from torch import Tensor

_state = threading.local()  # .pending: the open scope's queued verdicts, or None outside a scope
_DEFERRING_DEVICES = frozenset({"cuda"})  # where reading a verdict at once would drain a queue


class deferred_checks(ContextDecorator):  # noqa: N801 (used as a context manager and decorator)
    """Scope (``with deferred_checks():`` or ``@deferred_checks()``) in which checks of GPU tensors
    read their verdicts at the end rather than at once. Nested scopes join the outermost one; a
    scope left by an exception drops its verdicts (that error goes first)."""

    def _recreate_cm(self) -> deferred_checks:  # as a decorator: a fresh scope per call (reentrant, thread-safe)
        return type(self)()

    def __enter__(self) -> deferred_checks:
        self._outermost = getattr(_state, "pending", None) is None
        if self._outermost:
            _state.pending = []
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if not self._outermost:
            return
        pending, _state.pending = _state.pending, None
        if exc_type is None:
            for verdict, done, fail, bad in pending:
                if done is not None:
                    done.synchronize()  # long passed in a scope that queued real work after the check
                if bad(verdict):
                    fail()


def defers(values: Tensor) -> bool:
    """Whether a check of ``values`` is deferred here (a CUDA tensor inside `deferred_checks`)."""
    return getattr(_state, "pending", None) is not None and values.device.type in _DEFERRING_DEVICES


# Whether torch.func's transforms (grad, vmap, jacrev) are running: ops without their rules
# (oneDNN's call, the fused LM-head loss) step aside there for PyTorch's own
func_transforms_active: Callable[[], bool] = getattr(torch._C, "_are_functorch_transforms_active", lambda: False)


def dispatch_mode_active() -> bool:
    """Whether a Python dispatch mode sees every op (``FakeTensorMode``, ``FlopCounterMode``, ...):
    no timing of kernels there (they would be counted, or be fake), and PyTorch's own ops, which
    such modes know."""
    return torch.utils._python_dispatch.is_in_torch_dispatch_mode()


def host_values(values: Tensor) -> Tensor:
    """``values`` as a check reads them on the host: out of ``torch.func``'s wrappers, where under
    ``vmap`` one sample's view cannot be read (its checks judge every sample's values at once);
    other tensors as they are."""
    if torch.compiler.is_compiling():  # a traced graph never holds torch.func's wrappers
        return values
    functorch = torch._C._functorch
    while functorch.is_functorch_wrapped_tensor(values):
        values = functorch.get_unwrapped(values)
    return values


def raise_if(value: Tensor, fail: Callable[[], None], deferred: bool,
             bad: Callable[[Tensor], bool] = bool) -> None:
    """Call ``fail`` (which raises the error; it runs only for bad input, so it may read tensors)
    when ``bad`` says the 0-dim ``value`` shows bad input (default: ``value`` is True), read on
    the host at once, or (``deferred``, see `defers`) as the scope ends."""
    if not deferred:
        if bad(value):
            fail()
        return
    verdict = value.to("cpu", non_blocking=True)  # into pinned memory: the copy does not block the host
    done = None
    if value.device.type == "cuda":
        done = torch.cuda.Event()
        done.record()
    _state.pending.append((verdict, done, fail, bad))


_AUTOCAST_DTYPES = frozenset({torch.float32, torch.float16, torch.bfloat16})  # what autocast casts


def check_dtype(values: Tensor, like: Tensor, name: str) -> None:
    """Float input of another precision than the weights (float64 from numpy, half pixels into a
    float32 model) would fail deep inside the first layer: raise a TypeError naming both dtypes and
    the fix. Under autocast on the input's device, float32 / float16 / bfloat16 mix freely (autocast
    casts them; float64 it leaves, and the layer would fail)."""
    if values.dtype == like.dtype:
        return
    if (values.dtype in _AUTOCAST_DTYPES and like.dtype in _AUTOCAST_DTYPES
            and torch.is_autocast_enabled(values.device.type)):
        return
    raise TypeError(f"{name} are {values.dtype} but the model's weights are {like.dtype}: convert them with "
                    f".to({like.dtype}), or the model with model.to({values.dtype})")


def check_finite(values: Tensor, name: str) -> None:
    """NaN or inf input would silently turn every output into NaN: raise, naming ``name`` and
    the count of bad values (integer tensors always pass)."""
    if not values.dtype.is_floating_point:
        return
    values = host_values(values)

    def fail() -> None:
        bad = int((~torch.isfinite(values)).sum())
        if bad:
            raise ValueError(f"{name} contain {bad} NaN/inf values")

    # One reduction: a NaN or inf anywhere makes the sum non-finite (and NaN harms nothing while
    # a deferred verdict waits). The sum is judged on the host, where torch.isfinite would add
    # four kernels on a GPU; only a non-finite sum counts the bad values (a sum can also
    # overflow from finite values, which then pass).
    raise_if(values.sum(), fail, defers(values), bad=lambda total: not math.isfinite(total))


def checked_indices(ids: Tensor, n: int, what: str, allowed: str) -> Tensor:
    """Integer ``ids`` that index a table of ``n`` rows (token ids, position ids): a TypeError for
    other dtypes, a ValueError naming the ids outside 0..n-1 as ``what`` and the ``allowed`` range
    (not the gather's bare IndexError, nor a device assert on a GPU). On a GPU inside
    `deferred_checks` the verdict is read as the scope ends, and the returned ids, which the
    gather reads meanwhile, are clamped into range; elsewhere ``ids`` are returned as they are."""
    if ids.dtype not in (torch.int64, torch.int32):  # what the gather takes: not float, bool, uint8, int16
        raise TypeError(f"{what} must be integers (torch.long or torch.int32), got {ids.dtype}; "
                        "convert them with .long()")
    if not ids.numel():
        return ids
    values = host_values(ids)  # under torch.func.vmap: every sample's

    def fail() -> None:
        bad = values[(values < 0) | (values >= n)].unique()[:5].tolist()
        raise ValueError(f"{what} {bad} are outside {allowed}")

    if defers(ids) and values is ids:
        safe = ids.clamp(0, n - 1)
        raise_if((safe != ids).any(), fail, deferred=True)
        return safe
    lo, hi = torch.aminmax(values)  # one reduction instead of min() and max()
    if int(lo) < 0 or int(hi) >= n:
        fail()
    return ids
