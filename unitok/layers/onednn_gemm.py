"""Training's float32 CPU matrix products through oneDNN, on CPUs where it outruns PyTorch's BLAS.

PyTorch multiplies float32 CPU matrices (``F.linear``, ``mm``, ``addmm`` and their gradients)
through MKL. oneDNN's JIT kernels (``mkldnn::_linear_pointwise``, the call inductor's CPU fusions
emit) compute the same products, rounded in another order (within 1e-6 relative). On an AMD Zen 5
CPU (full-width AVX-512; MKL 2024.2, oneDNN 3.12, one thread) they run every training shape of the
families 1.6-2.2x faster, forward and both gradient products alike: a 1,024 x 256 -> 768 layer's
forward 210 against 80 GFLOP/s, its input gradient 236 against 92, its weight gradient 238
against 94; 3,840 x 512 -> 128 (the Decision Transformer's MLP) forward and backward 8.9 against
19.2 ms. Earlier measurements on another AVX-512 CPU (the README's "Zen 4", whose AVX-512 units
are half width) found oneDNN level with MKL (0.9-1.3x forward, no faster backward), and on an
Intel Xeon with AMX MKL is the faster (oneDNN 0.89x forward, 0.81x the weight gradient at that
shape; 0.59x for a GPT head's weight gradient): a GPT step read 1.10x Hugging Face's through oneDNN
there against 1.22x through MKL, T5's 0.95x against 1.06x. So where oneDNN runs at all (AVX-512
CPUs; others keep PyTorch's path) the choice is timed once, at the first product that could take
it (`preferred`: a training step's, or an inference product that calls `linear` directly, the
Conformer's convolution module, the fused loss in validation): a layer's three products at three
shapes, each way, oneDNN taken where it is `MIN_GAIN` faster. The decision goes into the
environment (`ENV`), so every process started afterwards (DDP workers, subprocesses) multiplies
the same way rather than timing again and perhaps deciding otherwise (rounding-level differences
between ranks); setting it fixes the choice.

`linear` is ``F.linear`` with its gradients through oneDNN (twice differentiable: its backward
is built from itself), `mm` is ``a @ b``; both fall back to PyTorch's kernels wherever
`onednn_products` says no: not a float32 CPU product, not an AVX-512 CPU, oneDNN timed slower
here, oneDNN turned off (``torch.backends.mkldnn.flags(enabled=False)``), under autocast (its
low-precision GEMMs are oneDNN's already), a strided bias (which oneDNN misreads), inside
``torch.func`` transforms, while dynamo traces a graph (inductor chooses its own kernels) or where
a Python dispatch mode sees every op (``FakeTensorMode``, ``FlopCounterMode``: they know PyTorch's
ops, not oneDNN's call).
"""

from __future__ import annotations

import os
import time

import torch
import torch.nn.functional as F
from torch import Tensor

from unitok.checks import dispatch_mode_active, func_transforms_active

_mkldnn = torch.ops.mkldnn
_AVAILABLE = torch.backends.mkldnn.is_available() and hasattr(_mkldnn, "_linear_pointwise")
# Whether oneDNN's float32 kernels are preferred: False on CPUs without AVX-512 (or without oneDNN);
# None: decided at the first use (`preferred`); True / False set it (as tests do).
PREFERRED: bool | None = None if _AVAILABLE and torch.backends.cpu.get_cpu_capability().startswith("AVX512") else False
MIN_GAIN = 1.05  # oneDNN must be this much faster than MKL (timing noise is a few per cent)
# (rows, in, out) of the layers timed: a widening and a narrowing layer of a width-256 model and a
# (smaller) LM head, whose weight gradient is where the two differ most (Xeon: oneDNN 0.59x)
TIMED_SHAPES = ((1024, 256, 768), (1024, 768, 256), (256, 256, 4096))
# "1": oneDNN's products, "0": PyTorch's. The first timing writes it, so the processes started after
# it (DDP workers, a CLI's subprocesses) inherit the decision and multiply alike; a user may set it.
ENV = "UNITOK_ONEDNN"


def _training_products_seconds() -> tuple[float, float]:
    """(MKL's, oneDNN's) seconds for the forward, input-gradient and weight-gradient products of
    `TIMED_SHAPES`' layers: the fastest of three repetitions each, after one to warm up, the two
    alternating (a drift of the machine hits both alike)."""
    g = torch.Generator().manual_seed(0)  # not the global generator: training draws as it would
    operands = []
    for rows, inputs, outputs in TIMED_SHAPES:
        x, w, grad = (torch.randn(shape, generator=g) for shape in ((rows, inputs), (outputs, inputs), (rows, outputs)))
        operands += [(x, w), (grad, w.t()), (grad.t(), x.t())]  # y = x wᵀ; dx = grad w; dw = gradᵀ x
    best = {False: float("inf"), True: float("inf")}
    with torch.no_grad(), torch.autocast("cpu", enabled=False):  # float32 products, whatever the caller's context
        for i in range(4):
            for onednn in (False, True):
                start = time.perf_counter()
                for a, b in operands:
                    _product(a, b, None) if onednn else F.linear(a, b)
                if i:
                    best[onednn] = min(best[onednn], time.perf_counter() - start)
    return best[False], best[True]


def preferred() -> bool:
    """Whether training's float32 products go through oneDNN on this CPU: `PREFERRED` where set;
    else `ENV` where the environment holds it (inherited from the process that timed it, or the
    user's); else timed once (oneDNN where `MIN_GAIN` times faster than MKL, at this thread count)
    and the decision kept in both, for this process and those it starts."""
    global PREFERRED
    if PREFERRED is None:
        told = os.environ.get(ENV)
        if told is not None and told not in ("0", "1"):
            raise ValueError(f"{ENV}={told!r}: expected 1 (oneDNN's products) or 0 (PyTorch's own)")
        if told is None:
            mkl, onednn = _training_products_seconds()
            told = os.environ[ENV] = "1" if onednn * MIN_GAIN <= mkl else "0"
        PREFERRED = told == "1"
    return PREFERRED


def onednn_products(*tensors: Tensor | None) -> bool:
    """Whether products of these tensors (None: absent, e.g. no bias) go through oneDNN here."""
    if torch.compiler.is_compiling() or PREFERRED is False:  # first: a traced graph leaves at once
        return False
    # (torch.func's transforms need every op they see to have their rules; oneDNN's call has none)
    return (torch.backends.mkldnn.enabled and not torch.is_autocast_enabled("cpu") and not func_transforms_active()
            and not dispatch_mode_active()
            # (oneDNN refuses empty operands: an empty batch runs PyTorch's ops; it reads a 1-D operand,
            # a bias, as contiguous whatever its stride: a strided one runs PyTorch's ops too)
            and all(t is None or (t.device.type == "cpu" and t.dtype == torch.float32 and t.numel() > 0
                                  and (t.dim() != 1 or t.is_contiguous()))
                    for t in tensors)
            and preferred())  # last: timed (once) only where a product would otherwise go through oneDNN


def _product(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """(rows, in) x, (out, in) weight (any strides) -> (rows, out): oneDNN's linear, no gradient."""
    return _mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


class _OneDNNLinear(torch.autograd.Function):
    """``F.linear`` on 2-D input through oneDNN: the input gradient is ``grad @ weight`` (a linear
    with the weight's transpose, a view) and the weight's ``gradᵀ @ x`` (a linear of the
    transposed views), each through this Function again, so a graph built in backward
    (``create_graph=True``) can be differentiated once more."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.save_for_forward(x, weight)
        ctx.has_bias = bias is not None
        return _product(x, weight, bias)

    @staticmethod
    def jvp(ctx, x_t: Tensor | None, weight_t: Tensor | None, bias_t: Tensor | None) -> Tensor:
        """Forward-mode AD (``torch.autograd.forward_ad``): x_t Wᵀ + x W_tᵀ + b_t."""
        x, weight = ctx.saved_tensors
        parts = [_product(x_t, weight, None) if x_t is not None else None,
                 _product(x, weight_t, None) if weight_t is not None else None]
        out = sum(part for part in parts if part is not None)
        if bias_t is not None:
            out = bias_t.expand(x.shape[0], weight.shape[0]) + out
        return out

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        x, weight = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad
        grad_x = _OneDNNLinear.apply(grad, weight.t(), None) if need_x else None
        grad_w = _OneDNNLinear.apply(grad.t(), x.t(), None) if need_w else None
        grad_b = grad.sum(0) if ctx.has_bias and need_b else None
        return grad_x, grad_w, grad_b


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, weight, bias)``, its gradients included, through oneDNN where `onednn_products`
    says so (x (…, in), weight (out, in), bias (out,) or None); else ``F.linear`` itself: also for
    a width or bias that does not match (its error names the shapes) or a bias it broadcasts."""
    if (x.dim() == 0 or weight.dim() != 2 or x.shape[-1] != weight.shape[1]
            or (bias is not None and tuple(bias.shape) != (weight.shape[0],))
            or not onednn_products(x, weight, bias)):
        return F.linear(x, weight, bias)
    out = _OneDNNLinear.apply(x.reshape(-1, x.shape[-1]), weight, bias)
    return out.view(*x.shape[:-1], weight.shape[0])


def mm(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` for (M, K) ``a`` and (K, N) ``b``, through oneDNN where `onednn_products` says so
    (as the linear of ``a`` with ``bᵀ``, a view: no copy), else ``torch.mm``. No gradient."""
    if onednn_products(a, b):
        return _product(a, b.t(), None)
    return torch.mm(a, b)


__all__ = ["ENV", "MIN_GAIN", "PREFERRED", "TIMED_SHAPES", "linear", "mm", "onednn_products", "preferred"]
