"""Argument checks every package shares (here because `tokenizers_mm` is the one all three import)."""

from __future__ import annotations

import numbers
from typing import Any


def check_int(name: str, value: Any, at_least: int = 1, *, or_none: bool = False, note: str = "") -> int | None:
    """``value`` as a Python int if it is a whole number ≥ ``at_least`` (numpy integers welcome),
    else a ValueError naming ``name``: a count given as 2.5, True or "8" is refused, not rounded,
    and 0 or a negative size never reaches a slice that would read it as "from the end".
    ``or_none``: None passes (an optional count); ``note`` adds what a value means, e.g. "(1: no beam search)"."""
    if value is None and or_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < at_least:
        expected = f"an integer ≥ {at_least}" + (" or None" if or_none else "") + (f" {note}" if note else "")
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    return int(value)
