"""Freed CPU memory kept for reuse, as PyTorch's CUDA caching allocator keeps GPU memory.

glibc's malloc serves every request above its mmap threshold (32 MiB at most: a GPT's logits
and their gradient, a ViT's attention scores) with fresh pages from the kernel and hands them
back the moment the tensor is freed, so every training step faults the same buffers in again
and the kernel zeroes each page first. On the 2-core development VM that is 10-15 % of a small
GPT's training step. Turning mmap off and raising the trim threshold keeps freed buffers in the
heap, where the next step's allocation of the same size finds them. The setting is for the
whole process, so the `unitok` command applies it (``UNITOK_MALLOC=default`` opts out); a
script or notebook calls `keep_freed_memory` itself.
"""

from __future__ import annotations

import ctypes
import os
import sys

from tokenizers_mm.checks import check_int

OPT_OUT_ENV = "UNITOK_MALLOC"  # "default": leave the C library's allocator as it is
M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_MAX = -4
TRIM_THRESHOLD = 1 << 30  # free heap memory above this much is returned to the kernel


def keep_freed_memory(trim_threshold: int = TRIM_THRESHOLD) -> bool:
    """Make glibc keep freed memory (up to ``trim_threshold`` bytes of it unused) for reuse
    instead of unmapping it. -> True when glibc took the settings; False where the C library
    is not glibc (macOS, Windows, musl), which is left as it is."""
    # a whole number of bytes (True is not 1 byte; ctypes refuses a float only inside mallopt)
    trim_threshold = check_int("trim_threshold", trim_threshold, note="(bytes, below 2**31)")
    if trim_threshold >= 2**31:  # mallopt takes a C int
        raise ValueError(f"trim_threshold must be in (0, 2**31) bytes, got {trim_threshold}")
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)  # the C library this process already runs on
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    if not hasattr(libc, "gnu_get_libc_version"):  # not glibc: musl's mallopt is a stub
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    # mallopt returns 1 on success. Large requests then grow the heap instead of being mmapped.
    return mallopt(M_MMAP_MAX, 0) == 1 and mallopt(M_TRIM_THRESHOLD, trim_threshold) == 1


def keep_freed_memory_unless_opted_out() -> bool:
    """`keep_freed_memory` unless ``UNITOK_MALLOC=default`` is set (any other value is an
    error, named). -> whether the settings were applied."""
    choice = os.environ.get(OPT_OUT_ENV, "keep")
    if choice not in ("keep", "default"):
        raise ValueError(f"{OPT_OUT_ENV}={choice!r}: expected 'keep' (the default) or 'default' "
                         "(leave the C library's allocator as it is)")
    return choice == "keep" and keep_freed_memory()
