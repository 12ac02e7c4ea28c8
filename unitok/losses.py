"""The losses behind ``labels=``: what Hugging Face users expect in ``output.loss``, written once.

Every family's ``forward(..., labels=...)`` calls one of these, and each equals what the
reference computes: the mean cross-entropy over labelled positions (``IGNORE_INDEX`` = -100
marks positions that are not scored), the next-token shift done inside for causal LMs
(``GPT2LMHeadModel``), Hugging Face's regression / single- / multi-label rule for sequence
classification, and torch's ``ctc_loss`` with its default ``reduction="mean"``. Training
objectives with more to them (distillation, span corruption, label smoothing) stay in `tasks`.

Axis legend: B batch, N positions, V classes (vocabulary or labels), T output frames, U targets.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

IGNORE_INDEX = -100


def check_class_labels(labels: Tensor, shape: tuple[int, ...], num_classes: int, name: str = "labels") -> None:
    """Refuse class labels of the wrong shape, dtype or range (``IGNORE_INDEX`` is allowed)."""
    if not isinstance(labels, Tensor):
        raise TypeError(f"{name} must be a tensor of class ids, got {type(labels).__name__}")
    if tuple(labels.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)} (one class id per scored position), "
                         f"got {tuple(labels.shape)}")
    if labels.dtype.is_floating_point or labels.dtype == torch.bool or labels.is_complex():
        raise TypeError(f"{name} must hold integer class ids, got {labels.dtype}")
    bad = (labels != IGNORE_INDEX) & ((labels < 0) | (labels >= num_classes))
    if bool(bad.any()):
        values = labels[bad].unique()[:5].tolist()
        raise ValueError(f"{name} {values} are outside [0, {num_classes}); use {IGNORE_INDEX} for positions "
                         "that are not scored")


def cross_entropy(logits: Tensor, labels: Tensor, name: str = "labels") -> Tensor:
    """(…, V) logits, (…) class ids -> mean cross-entropy over the labels ≠ -100 (in float32)."""
    check_class_labels(labels, logits.shape[:-1], logits.shape[-1], name)
    return _cross_entropy(logits, labels)


def _cross_entropy(logits: Tensor, labels: Tensor) -> Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1).to(logits.device),
                           ignore_index=IGNORE_INDEX)


def causal_lm_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """(B, N, V) logits, (B, N) labels aligned with the inputs -> next-token loss: position t is
    scored on ``labels[:, t + 1]`` (the shift happens here, as in ``GPT2LMHeadModel``)."""
    check_class_labels(labels, logits.shape[:-1], logits.shape[-1])
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
    labels = labels.to(logits.device)
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
