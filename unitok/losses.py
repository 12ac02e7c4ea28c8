"""The losses behind ``labels=``: what Hugging Face users expect in ``output.loss``, written once.

Every family's ``forward(..., labels=...)`` calls one of these, and each equals what the
reference computes: the mean cross-entropy over labelled positions (``IGNORE_INDEX`` = -100
marks positions that are not scored), the next-token shift done inside for causal LMs
(``GPT2LMHeadModel``), Hugging Face's regression / single- / multi-label rule for sequence
classification, and torch's ``ctc_loss`` with its default ``reduction="mean"``. Training
objectives with more to them (distillation, span corruption, label smoothing) stay in `tasks`.
`linear_cross_entropy` is the LM head fused with the cross-entropy: what GPT and T5 compute for
``labels=`` with ``return_logits=False``, and what their tasks train with.

Axis legend: B batch, N positions, V classes (vocabulary or labels), T output frames, U targets.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from unitok.checks import deferred_checks, defers, host_values, raise_if
from unitok.layers import onednn_gemm
from unitok.layers.plain_linear import forward_derivatives

IGNORE_INDEX = -100


def check_class_labels(labels: Tensor, shape: tuple[int, ...], num_classes: int, name: str = "labels") -> Tensor:
    """Refuse class labels of the wrong shape, dtype (bool, floating, complex) or range
    (``IGNORE_INDEX`` is allowed). Returns the labels to score with, as int64 whatever integer
    dtype they came in (torch's cross-entropy takes int64 and uint8, its gather int64 and int32:
    one dtype for every path): themselves when already int64, or where the range check is
    deferred (a GPU tensor in `unitok.checks.deferred_checks`) a copy with bad ids set to 0, so
    no gather faults before the error is raised."""
    if not isinstance(labels, Tensor):
        raise TypeError(f"{name} must be a tensor of class ids, got {type(labels).__name__}")
    if tuple(labels.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)} (one class id per scored position), "
                         f"got {tuple(labels.shape)}")
    if labels.dtype.is_floating_point or labels.dtype == torch.bool or labels.is_complex():
        raise TypeError(f"{name} must hold integer class ids, got {labels.dtype}")
    values = host_values(labels)  # under torch.func.vmap: every sample's labels, judged at once
    bad = (values != IGNORE_INDEX) & ((values < 0) | (values >= num_classes))

    def fail() -> None:
        shown = values[bad].unique()[:5].tolist()
        raise ValueError(f"{name} {shown} are outside [0, {num_classes}); use {IGNORE_INDEX} for positions "
                         "that are not scored")

    deferred = defers(labels) and values is labels  # (under torch.func: judged at once)
    raise_if(bad.any(), fail, deferred)
    return (labels.masked_fill(bad, 0) if deferred else labels).long()


def cross_entropy(logits: Tensor, labels: Tensor, name: str = "labels") -> Tensor:
    """(…, V) logits, (…) class ids -> mean cross-entropy over the labels ≠ -100 (in float32)."""
    labels = check_class_labels(labels, logits.shape[:-1], logits.shape[-1], name)
    return _cross_entropy(logits, labels)


def _cross_entropy(logits: Tensor, labels: Tensor) -> Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1).to(logits.device),
                           ignore_index=IGNORE_INDEX)


# Rows of hidden states per chunk of `linear_cross_entropy`: enough that a chunk's logits hold
# about 2**25 values (128 MiB in float32), never fewer than the hidden width, so the chunk's three
# GEMMs stay large (the weight gradient is read and written once a chunk). Timed on 2 CPU threads,
# forward + backward: V=50,304, D=768, 4,096 rows 0.90x the unfused pair's time; D=256, 1,020 rows
# 1.01x (0.97x unchunked, 1.06x at 2**23 values a chunk, 1.13x at 2**21).
CHUNK_VALUES = 1 << 25
# A GPU's chunks are four times larger: each chunk adds its (V, D) weight gradient to the float32
# sum (a bf16 product, cast, added: 0.2 ms a chunk for GPT-2's head on an H100), and the memory
# is there (GPT-124M at batch 16 x 1,024: 7 chunks, not 25).
GPU_CHUNK_VALUES = 1 << 27
# Values per block of a chunk's softmax passes on the CPU: 2 MiB of float32, which stays in cache
# between the passes (log-softmax, exp, the one-hot, the scaling and cast back). A GPU takes the
# whole chunk as one block: there each pass is a kernel launch, and blocks of ten rows (V=50,304)
# made the fused loss 2.2x slower than Hugging Face's whole GPT-124M step on an H100.
BLOCK_VALUES = 1 << 19
# torch.mm / addmm with ``out_dtype``: bf16 / fp16 products written in float32 (CUDA only)
_CUDA_FLOAT32_OUT_GEMMS = all("dtype_out" in op.overloads() for op in (torch.ops.aten.mm, torch.ops.aten.addmm))


@deferred_checks()  # on a GPU the labels' verdict is read after the chunks are queued
def linear_cross_entropy(hidden: Tensor, weight: Tensor, labels: Tensor, bias: Tensor | None = None, *,
                         compile: bool | str | Callable[..., Any] = False) -> Tensor:
    """``cross_entropy(F.linear(hidden, weight, bias), labels)`` — the mean over labels ≠ -100, in
    float32 — with the LM head and the loss fused: the (…, V) logits are made a chunk of rows at a
    time and turned into their gradient (softmax − one-hot) at once, so neither the logits nor
    their log-softmax and its gradient are ever held whole (a GPT's largest tensors), and three
    passes over them are saved. The same value and gradients as the unfused pair (float32: to
    rounding), under autocast too (its GEMMs in the autocast dtype, the softmax in float32). The
    gradients of the inputs that need one are computed in the forward pass (backward only scales
    them), so the loss cannot be differentiated twice; under ``no_grad`` only the loss is computed.
    Inside ``torch.func`` transforms (``grad``, ``vmap``) or with forward-mode tangents, whose rules
    the fused computation lacks, and in float16 (whose range a loss scale must widen before the
    gradient is formed), it runs as the unfused pair.

    ``compile`` (True: inductor, or a `torch.compile` backend: its name or callable) computes each chunk's
    softmax, log p(target) and gradient as one compiled function (`softmax_gradient`), which
    inductor fuses into a few kernels over the logits instead of one pass per operation; the GEMMs
    stay as they are. `unitok.compile.compile_backbones` turns it on for the models it compiles.

    hidden (…, D), weight (V, D), labels (…) class ids, bias (V,) or None.
    """
    if hidden.dim() < 1 or weight.dim() != 2 or hidden.shape[-1] != weight.shape[1]:
        raise ValueError(f"hidden (…, D) and weight (V, D) must share D, got {tuple(hidden.shape)} and "
                         f"{tuple(weight.shape)}")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"bias must be ({weight.shape[0]},), one per class, got {tuple(bias.shape)}")
    device = hidden.device.type
    if not torch.is_autocast_enabled(device) and any(t is not None and t.dtype != hidden.dtype for t in (weight, bias)):
        # F.linear refuses mixed dtypes outside autocast; casting here would hide the mistake
        raise ValueError(f"hidden is {hidden.dtype} but the weight / bias are {weight.dtype} / "
                         f"{bias.dtype if bias is not None else None}: give them one dtype, or run under autocast")
    if not (isinstance(compile, (bool, str)) or callable(compile)) or compile == "":
        raise ValueError(f"compile must be True/False or a torch.compile backend (a name or a callable), "
                         f"got {compile!r}")
    labels = check_class_labels(labels, hidden.shape[:-1], weight.shape[0])
    gemm_dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype
    # float16: the fused path forms the logits' gradient ((softmax − one-hot) / count, ~1e-8 for a
    # big batch) in the forward pass, before a GradScaler's scale reaches it, and float16 flushes
    # such values to zero; the unfused pair's backward sees the scaled loss (bfloat16 has the range)
    if _needs_plain_ops(hidden, weight, bias) or gemm_dtype == torch.float16:
        return _cross_entropy(F.linear(hidden, weight, bias), labels)
    softmax_grad = _compiled_softmax_gradient("inductor" if compile is True else compile) if compile else None
    return _LinearCrossEntropy.apply(hidden.reshape(-1, hidden.shape[-1]), weight, bias,
                                     labels.reshape(-1).to(hidden.device), softmax_grad)


def _needs_plain_ops(*tensors: Tensor | None) -> bool:
    """Whether `linear_cross_entropy` must run as F.linear then cross-entropy: inside a
    ``torch.func`` transform, or with a forward-mode tangent on an input — rules the fused
    Function lacks (it computes its gradients in the forward pass)."""
    if torch.compiler.is_compiling():  # a traced graph keeps the fused Function, as before
        return False
    return forward_derivatives(*tensors)


def softmax_gradient(logits: Tensor, targets: Tensor, row_weight: Tensor, need_grad: bool,
                     need_bias: bool) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """One chunk of `linear_cross_entropy` after its logits GEMM, written for torch.compile to
    fuse: (rows, V) logits, (rows, 1) targets, (rows, 1) row weights (1 / count on scored rows, 0
    elsewhere) -> log p(target) (rows,) in float32; with ``need_grad`` the logits' gradient
    (softmax − one-hot) · row weight in the logits' dtype, and with ``need_bias`` its column sums
    in float32. The one-hot is a comparison, not a scatter, so it fuses with the rest."""
    log_p = torch.log_softmax(logits.float(), dim=-1)
    picked = log_p.gather(1, targets).squeeze(1)
    if not need_grad:
        return picked, None, None
    one_hot = torch.arange(logits.shape[1], device=logits.device) == targets
    grad = (log_p.exp() - one_hot.float()) * row_weight
    return picked, grad.to(logits.dtype), grad.sum(0) if need_bias else None


@functools.cache
def _compiled_softmax_gradient(backend: str | Callable[..., Any]) -> Callable[..., tuple[Tensor, Tensor | None, Tensor | None]]:
    # traced for the first block's shape, then once more with the row count dynamic (the last
    # chunk's or block's rows change with the batch): never a recompilation a step
    return torch.compile(softmax_gradient, backend=backend, fullgraph=True)


# Below this probability a float32 softmax has lost digits to underflow (its smallest normal is
# 1.2e-38): a target that unlikely has its log-probability computed again from its row's logits.
SOFTMAX_FLOOR = 1e-30


def _log_picked(probs: Tensor, targets: Tensor, out: Tensor, scored: Tensor, hidden: Tensor, weight: Tensor,
                bias: Tensor | None) -> None:
    """log p(target) of each row of (rows, V) ``probs`` into ``out`` (rows,). On the CPU the
    softmax is one pass where log-softmax then exp are two, and PyTorch's CPU exp is slow (a GPT
    step's loss blocks 2.2× faster); the log of the gathered probability is as exact, but where
    it underflows: those scored rows' logits are computed again from ``hidden`` and read through
    log-softmax."""
    picked = probs.gather(1, targets)[:, 0]
    torch.log(picked, out=out)
    tiny = (picked < SOFTMAX_FLOOR) & scored  # NaN rows stay NaN, as log-softmax leaves them
    if bool(tiny.any()):  # the CPU: no device to wait for
        rows = tiny.nonzero()[:, 0]
        h = hidden[rows]
        logits = h @ weight.t() if bias is None else torch.addmm(bias, h, weight.t())
        out[rows] = torch.log_softmax(logits.float(), dim=-1).gather(1, targets[rows])[:, 0]


class _LinearCrossEntropy(torch.autograd.Function):
    """Forward computes the loss and, where inputs need them, its gradients chunk by chunk;
    backward only scales them by the incoming gradient."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, bias: Tensor | None, labels: Tensor,
                softmax_grad: Callable[..., tuple[Tensor, Tensor | None, Tensor | None]] | None) -> Tensor:
        device = hidden.device.type
        # autocast's rule for F.linear: GEMMs in the autocast dtype; cross-entropy in float32
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        with torch.autocast(device, enabled=False):
            w = weight.to(dtype)
            b = bias.to(dtype) if bias is not None else None
            scored = labels != IGNORE_INDEX
            count = scored.sum().to(torch.float32)  # a tensor: no host sync; 0 gives NaN, as torch's mean does
            targets = labels.clamp(min=0)[:, None]  # ignored rows read class 0, then count for nothing
            grad_h = torch.empty_like(hidden) if need_h else None
            grad_w = grad_b = None  # the first chunk's gradients, then the others' added
            need_grad = need_h or need_w or need_b
            # d(mean loss)/d(logits) = (softmax − one-hot) / count on scored rows, 0 elsewhere
            row_weight = scored.to(torch.float32).div_(count.clamp(min=1))[:, None]  # (rows, 1); none scored: 0
            picked = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)  # log p(target)
            V = weight.shape[0]
            on_cpu = hidden.device.type == "cpu"
            chunk_values = CHUNK_VALUES if on_cpu else GPU_CHUNK_VALUES
            rows = max(1, min(hidden.shape[0], max(hidden.shape[1], chunk_values // max(V, 1))))
            block = max(1, min(rows, BLOCK_VALUES // max(V, 1))) if on_cpu else rows
            # One logits buffer serves every chunk, and the softmax and its gradient are made in
            # place a cache-sized block of rows at a time (under autocast in one small float32
            # buffer): a fresh buffer this large is faulted in and zeroed page by page by the kernel
            # (glibc unmaps blocks above 32 MiB when they are freed), and each pass over it would
            # come from memory — together a third of a bf16 GPT step.
            # float32 CPU GEMMs through oneDNN where it outruns MKL (`unitok.layers.onednn_gemm`): its
            # product comes in a buffer of its own, which the chunk then turns into its gradient
            onednn = onednn_gemm.onednn_products(hidden, w, b)
            logits_buf = None if onednn else hidden.new_empty((rows, V), dtype=dtype)
            block_buf = None
            minus_one = hidden.new_full((1, 1), -1.0, dtype=torch.float32)  # the one-hot's scatter source
            if dtype != torch.float32 and softmax_grad is None:
                block_buf = hidden.new_empty((block, V), dtype=torch.float32)
            for start in range(0, hidden.shape[0], rows):
                h = hidden[start:start + rows].to(dtype)
                if onednn:
                    logits = onednn_gemm.linear(h, w, b)
                else:
                    logits = logits_buf[:h.shape[0]]
                    if b is None:
                        torch.mm(h, w.t(), out=logits)
                    else:
                        torch.addmm(b, h, w.t(), out=logits)
                chunk = slice(start, start + h.shape[0])
                g = logits  # becomes the logits' gradient, in place
                for first in range(0, h.shape[0], block):
                    part = logits[first:first + block]
                    rows_in = slice(start + first, start + first + part.shape[0])
                    if softmax_grad is not None:
                        picked[rows_in], grad, part_b = softmax_grad(part, targets[rows_in], row_weight[rows_in],
                                                                     need_grad, need_b)
                        if need_b:
                            grad_b = part_b if grad_b is None else grad_b.add_(part_b)
                        if grad is not None and part.shape[0] == h.shape[0]:
                            g = grad  # the chunk in one block (a GPU): no copy back
                        elif grad is not None:
                            part.copy_(grad)  # a cache-sized block (the CPU)
                    else:
                        t = targets[rows_in]
                        # float32 logits: the softmax in place; bf16 / fp16 logits read and the float32
                        # result written in one pass. On the CPU, the softmax itself (its exp is slow).
                        out = part if block_buf is None else block_buf[:part.shape[0]]
                        if on_cpu:
                            p = torch.softmax(part, dim=-1, dtype=torch.float32, out=out)
                            _log_picked(p, t, picked[rows_in], scored[rows_in], h[first:first + part.shape[0]], w, b)
                        else:
                            p = torch.log_softmax(part, dim=-1, dtype=torch.float32, out=out)
                            torch.gather(p, 1, t, out=picked[rows_in, None])
                            if need_grad:
                                p.exp_()
                        if need_grad:
                            # (softmax − one-hot) · row weight, the scaling fused with the cast back
                            p.scatter_add_(1, t, minus_one.expand(t.shape))
                            if need_b:
                                part_b = p.t() @ row_weight[rows_in, 0]
                                grad_b = part_b if grad_b is None else grad_b.add_(part_b)
                            torch.mul(p, row_weight[rows_in], out=part)
                if not need_grad:
                    continue
                # bf16 / fp16 products are summed in float32 across chunks; cuBLAS writes them
                # there itself (no low-precision product to cast and add: 2 ms a GPT-124M step)
                to_float32 = dtype != torch.float32 and hidden.is_cuda and _CUDA_FLOAT32_OUT_GEMMS
                if need_h:
                    if to_float32 and grad_h.dtype == torch.float32:  # float32 hidden states under autocast
                        torch.mm(g, w, out_dtype=torch.float32, out=grad_h[chunk])
                    else:
                        grad_h[chunk] = onednn_gemm.mm(g, w) if onednn else g @ w
                if need_w:
                    if to_float32:
                        grad_w = (torch.mm(g.t(), h, out_dtype=torch.float32) if grad_w is None else
                                  torch.addmm(grad_w, g.t(), h, out_dtype=torch.float32, out=grad_w))
                    elif onednn:
                        part_w = onednn_gemm.mm(g.t(), h)
                        grad_w = part_w if grad_w is None else grad_w.add_(part_w)
                    elif grad_w is None:
                        grad_w = (g.t() @ h).to(torch.float32)
                    elif dtype == torch.float32:
                        grad_w.addmm_(g.t(), h)
                    else:
                        grad_w += (g.t() @ h).float()
            total = -picked.where(scored, 0.0).sum()
            if need_w and grad_w is None:  # no rows at all
                grad_w = torch.zeros_like(weight, dtype=torch.float32)
            if need_b and grad_b is None:
                grad_b = torch.zeros_like(bias, dtype=torch.float32)
        ctx.save_for_backward(grad_h, grad_w, grad_b)
        ctx.dtypes = (weight.dtype, bias.dtype if bias is not None else None)
        return total / count

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_loss: Tensor):
        grad_h, grad_w, grad_b = ctx.saved_tensors
        w_dtype, b_dtype = ctx.dtypes
        return (grad_h * grad_loss.to(grad_h.dtype) if grad_h is not None else None,
                (grad_w * grad_loss).to(w_dtype) if grad_w is not None else None,
                (grad_b * grad_loss).to(b_dtype) if grad_b is not None else None,
                None, None)


def causal_lm_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """(B, N, V) logits, (B, N) labels aligned with the inputs -> next-token loss: position t is
    scored on ``labels[:, t + 1]`` (the shift happens here, as in ``GPT2LMHeadModel``)."""
    labels = check_class_labels(labels, logits.shape[:-1], logits.shape[-1])
    return _cross_entropy(logits[:, :-1], labels[:, 1:])


def sequence_classification_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """(B, K) scores -> Hugging Face's ``BertForSequenceClassification`` loss: K = 1 is regression
    (MSE against (B,) floats); integer (B,) labels are single-label cross-entropy; float (B, K)
    labels are multi-label (binary cross-entropy with logits)."""
    B, K = logits.shape
    if K == 1:
        if labels.numel() != B:
            raise ValueError(f"regression labels must hold one value per row ({B}), got shape {tuple(labels.shape)}")
        return F.mse_loss(logits.reshape(B).float(), labels.reshape(B).to(logits.device, torch.float32))
    if labels.dtype.is_floating_point:
        if tuple(labels.shape) != (B, K):
            raise ValueError(f"multi-label targets must be (batch, num_labels) = {(B, K)} floats, "
                             f"got {tuple(labels.shape)}")
        return F.binary_cross_entropy_with_logits(logits.float(), labels.to(logits.device, torch.float32))
    return cross_entropy(logits, labels)


def check_ctc_targets(targets: Tensor, num_classes: int, blank: int = 0) -> None:
    """Refuse CTC targets outside [0, V) or equal to the blank: torch's CPU ``ctc_loss`` does not
    check them and reads and writes out of bounds (a corrupted heap, not an error)."""
    bad = (targets < 0) | (targets >= num_classes) | (targets == blank)
    if bool(bad.any()):
        values = targets[bad].unique()[:5].tolist()
        raise ValueError(f"CTC targets {values} are not label ids in [0, {num_classes}) other than the blank ({blank})")


def ctc_loss(logits: Tensor, lengths: Tensor, labels: Tensor, label_lengths: Tensor | None = None,
             blank: int = 0) -> Tensor:
    """CTC loss from (B, T, V) logits with (B,) valid frames and (B, U) padded targets.

    ``label_lengths`` (B,) counts each row's targets; by default the entries that are neither
    -100 nor ``blank`` (the padding Hugging Face's CTC models expect). Reduction is torch's
    default ``"mean"``: each utterance's loss divided by its target length, then the batch mean;
    an impossible alignment (fewer frames than the target needs) gives inf, as in torch.
    """
    B, T, V = logits.shape
    if labels.dim() != 2 or labels.shape[0] != B:
        raise ValueError(f"labels must be (batch, max_target_length) with batch {B}, got {tuple(labels.shape)}")
    if labels.dtype.is_floating_point or labels.dtype.is_complex or labels.dtype == torch.bool:
        # torch's ctc_loss would score 2.7 (or True) as some label id without a word
        raise TypeError(f"labels must hold integer label ids (any integer dtype), got {labels.dtype}")
    labels = labels.to(logits.device)
    for name, counts in (("lengths", lengths), ("label_lengths", label_lengths)):
        # .long() would truncate 9.9 frames to 9 (or read True as 1) without a word
        if isinstance(counts, Tensor) and (counts.dtype.is_floating_point or counts.dtype.is_complex
                                           or counts.dtype == torch.bool):
            raise ValueError(f"{name} must hold integer counts, got {counts.dtype} {counts.tolist()}")
    if label_lengths is None:
        label_lengths = ((labels != IGNORE_INDEX) & (labels != blank)).sum(dim=1)
    label_lengths = label_lengths.to(logits.device).long()
    if tuple(label_lengths.shape) != (B,) or bool((label_lengths < 0).any()) \
            or bool((label_lengths > labels.shape[1]).any()):
        raise ValueError(f"label_lengths must be (batch,) values in [0, {labels.shape[1]}], "
                         f"got {label_lengths.tolist()}")
    within = torch.arange(labels.shape[1], device=labels.device)[None, :] < label_lengths[:, None]  # (B, U)
    targets = labels[within]
    check_ctc_targets(targets, V, blank)
    log_probs = logits.float().log_softmax(dim=-1).transpose(0, 1)  # (T, B, V)
    return F.ctc_loss(log_probs, targets, lengths.to(logits.device).long(), label_lengths, blank=blank,
                      reduction="mean")
