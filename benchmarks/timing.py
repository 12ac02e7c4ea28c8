"""Timing helpers shared by the benchmarks: device sync, one timed call, interleaved repetitions."""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from unitok.cpu_memory import keep_freed_memory

PRECISIONS = ("fp32", "bf16")
MALLOC_CHOICES = ("default", "keep")


def _int_in_range(text: str, low: int, high: int | None = None) -> int:
    """``text`` as an integer in ``low`` … ``high`` (no upper end when None), else an argparse error
    that argparse prefixes with the flag ("argument --threads: expected …")."""
    expected = f"an integer >= {low}" if high is None else f"an integer from {low} to {high}"
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
    if value < low or (high is not None and value > high):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {value}")
    return value


def positive_int(text: str) -> int:
    """An argparse type for counts (repetitions, steps, threads, batch sizes): an integer ≥ 1, else
    a clear error (zero repetitions would leave nothing to divide by)."""
    return _int_in_range(text, 1)


def non_negative_int(text: str) -> int:
    """An argparse type for counts that may be zero (untimed warm-up repetitions, profile rows)."""
    return _int_in_range(text, 0)


SEED_MAX = 2**32 - 1  # numpy's seeds (and so Lightning's seed_everything) run from 0 to this


def seed_int(text: str) -> int:
    """An argparse type for seeds: an integer numpy accepts, 0 … 2**32 − 1."""
    return _int_in_range(text, 0, SEED_MAX)


def device_name(text: str) -> str:
    """An argparse type for ``--device``: a name torch reads as a device ("cpu", "cuda", "cuda:1"),
    returned as given; whether CUDA is there is `prepare_process`'s check."""
    try:
        torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"expected a torch device such as cpu or cuda, got {text!r}") from None
    return text


def add_side_by_side_options(parser: argparse.ArgumentParser) -> None:
    """The options every side-by-side benchmark takes alike: ``--precision`` and ``--malloc``."""
    add_precision_option(parser)
    add_malloc_option(parser)


def add_precision_option(parser: argparse.ArgumentParser) -> None:
    """``--precision``: fp32, or bf16 (both sides' training forward and loss under autocast)."""
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32",
                        help="bf16: both sides' training forward and loss under torch.autocast(bfloat16), "
                             "as --trainer.precision bf16-mixed trains (weights, gradients and AdamW in fp32)")


def add_malloc_option(parser: argparse.ArgumentParser) -> None:
    """``--malloc``: glibc's allocator as it is, or tuned to keep freed memory as `unitok fit` runs."""
    parser.add_argument("--malloc", choices=MALLOC_CHOICES, default="default",
                        help="keep: glibc keeps freed CPU memory for reuse (unitok.cpu_memory, what the "
                             "unitok command does), for both sides alike; default: glibc as it is")


def prepare_process(args: argparse.Namespace) -> None:
    """What every side-by-side benchmark does first: ``--malloc``, ``--threads`` (torch's choice
    when None), a clear exit when ``--device cuda`` is asked for without CUDA, and on CUDA no
    TF32 (plain fp32 matmuls and convolutions)."""
    apply_malloc(args.malloc)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda asked for, but CUDA is not available")
    if args.device.startswith("cuda"):
        # fp32 means fp32 on both sides: cuDNN's convolutions default to TF32 (10-bit mantissas),
        # which moved the Conformer's outputs 1e-4 from torchaudio's on an H100 (9.5e-7 without)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


def apply_malloc(choice: str) -> None:
    """Apply ``--malloc`` to this process (both sides of a benchmark run in it)."""
    if choice not in MALLOC_CHOICES:
        raise ValueError(f"malloc must be one of {MALLOC_CHOICES}, got {choice!r}")
    if choice == "keep" and not keep_freed_memory():
        raise SystemExit("--malloc keep needs glibc (Linux); this C library is not it")


def autocast(device: str, precision: str) -> contextlib.AbstractContextManager:
    """The context a training forward and loss run in at ``precision``: nothing for fp32,
    ``torch.autocast`` to bfloat16 for bf16 (what Lightning's bf16-mixed does)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)


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


class Timings(dict):
    """{contender: [seconds of each repetition]}, with ``peak_mb``: {contender: the peak memory
    (MiB) one call adds on top of what was allocated before it}."""

    peak_mb: dict[str, float]


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def peak_memory_mb(fn: Callable[[], Any], device: str) -> float:
    """MiB of memory one call of ``fn`` needs at its peak, above what is held before it.

    CUDA: the allocator's peak (``max_memory_allocated``). CPU: the process's resident-set
    high-water mark, reset just before the call (Linux ``/proc/self/clear_refs``) after
    returning freed heap to the system, so memory cached by earlier calls is not counted as
    free. NaN where neither is available."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 2**20
    try:
        gc.collect()
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        base = _rss_kib("VmRSS")
        fn()
        return (_rss_kib("VmHWM") - base) / 1024
    except (OSError, RuntimeError):
        return math.nan


# Peak memory of every labelled workload timed in this process: {label: {contender: MiB}}
# (the summary table of `benchmarks/summary.py` reads it).
MEMORY: dict[str, dict[str, float]] = {}


def alternate(
    runs: dict[str, Callable[[], Any]], repeats: int, warmup: int, device: str, memory: bool = True,
    label: str = "",
) -> Timings:
    """Time each callable ``repeats`` times, interleaved (order flips every round) so slow
    drifts of a shared machine hit every contender alike; then (``memory``) one more call
    each to measure its peak memory (``.peak_mb``), printed and kept in `MEMORY` under
    ``label`` when one is given."""
    names = list(runs)
    for _ in range(warmup):
        for name in names:
            runs[name]()
    times = Timings({name: [] for name in names})
    for r in range(repeats):
        for name in names if r % 2 == 0 else reversed(names):
            times[name].append(timed(runs[name], device))
    times.peak_mb = {name: peak_memory_mb(runs[name], device) if memory else math.nan for name in names}
    if label and memory:
        MEMORY[label] = times.peak_mb
        print(memory_row(label, times.peak_mb))
    return times


def memory_row(label: str, peak_mb: dict[str, float]) -> str:
    """One printed line: each contender's peak MiB and ours / theirs (< 1: unitok needs less)."""
    names = list(peak_mb)
    ours, theirs = peak_mb[names[0]], peak_mb[names[-1]]
    ratio = ours / theirs if theirs and not math.isnan(theirs) else math.nan
    return (f"peak memory, {label}: " + ", ".join(f"{n} {v:.0f} MiB" for n, v in peak_mb.items())
            + f" ({ratio:.2f}× of {names[-1]})")
