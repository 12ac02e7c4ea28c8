"""JSON's plain types from what a run holds: for prediction records and for the settings a
checkpoint records (which must load with ``weights_only=True``)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from torch import Tensor


def plain(value: Any) -> Any:
    """Tensors, NumPy values, paths, namespaces (``as_dict``), mappings and tuples -> JSON types:
    NaN / ±inf -> None, anything else that is not a JSON scalar -> its text."""
    if isinstance(value, Tensor):
        value = value.detach().cpu().tolist()
    elif isinstance(value, np.generic | np.ndarray):
        value = value.tolist()
    elif hasattr(value, "as_dict"):  # a jsonargparse Namespace
        value = value.as_dict()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if value is None or isinstance(value, bool | int | str):
        return value
    return str(value)  # a Path, an enum, …


__all__ = ["plain"]
