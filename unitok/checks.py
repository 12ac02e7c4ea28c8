"""Input checks shared by the models: refuse bad input up front with a message that names it."""

from __future__ import annotations

import torch
from torch import Tensor


def check_finite(values: Tensor, name: str) -> None:
    """NaN or inf input would silently turn every output into NaN: raise, naming ``name`` and
    the count of bad values (integer tensors always pass)."""
    # One reduction pass: a NaN or inf anywhere makes the sum non-finite. Only then count the
    # bad values (a sum can also overflow from finite values, which then pass).
    if values.dtype.is_floating_point and not bool(torch.isfinite(values.sum())):
        bad = int((~torch.isfinite(values)).sum())
        if bad:
            raise ValueError(f"{name} contain {bad} NaN/inf values")
