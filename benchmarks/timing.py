"""Timing helpers shared by the benchmarks: device sync, one timed call, interleaved repetitions."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any], device: str) -> float:
    """Seconds one call of ``fn`` takes (device work included)."""
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


def alternate(
    runs: dict[str, Callable[[], Any]], repeats: int, warmup: int, device: str
) -> dict[str, list[float]]:
    """Time each callable ``repeats`` times, interleaved (order flips every round) so slow
    drifts of a shared machine hit every contender alike."""
    names = list(runs)
    for _ in range(warmup):
        for name in names:
            runs[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        for name in names if r % 2 == 0 else reversed(names):
            times[name].append(timed(runs[name], device))
    return times
