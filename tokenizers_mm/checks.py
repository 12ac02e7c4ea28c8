"""Argument checks every package shares (here because `tokenizers_mm` is the one all three import)."""

from __future__ import annotations

import math
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


def number_bounds(low: float = -math.inf, high: float = math.inf, *, low_open: bool = False,
                  high_open: bool = False) -> str:
    """How a message states [low, high] ("" unbounded, " > 0", " ≥ 0", " in [0, 1)")."""
    if math.isinf(low) and math.isinf(high):
        return ""
    if math.isinf(high):
        return f" {'>' if low_open else '≥'} {low:g}"
    if math.isinf(low):
        return f" {'<' if high_open else '≤'} {high:g}"
    return f" in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"


def check_number(name: str, value: Any, low: float = -math.inf, high: float = math.inf, *, low_open: bool = False,
                 high_open: bool = False) -> float:
    """``value`` as a float if it is a finite real number within [low, high] (``low_open`` /
    ``high_open``: that end excluded), else a ValueError naming ``name``. NaN fails every
    comparison, so a bare ``value < 0`` check lets it through: a weight, rate or temperature of
    NaN would reach a loss or a sampler."""
    ok = (not isinstance(value, bool) and isinstance(value, numbers.Real) and math.isfinite(value)
          and (value > low if low_open else value >= low) and (value < high if high_open else value <= high))
    if not ok:
        raise ValueError(f"{name} must be a finite number{number_bounds(low, high, low_open=low_open, high_open=high_open)}"
                         f", got {value!r}")
    return float(value)
