"""unitok's own training step in bf16-mixed against fp32, at the side-by-side benchmarks' configs.

The same model (a copy each), batch and AdamW (PyTorch's fused kernel, as unitok's tasks step); one side runs forward and loss under
``torch.autocast(bfloat16)`` — what ``--trainer.precision bf16-mixed`` does, weights, gradients
and optimizer state staying fp32 — the other in plain fp32. Repetitions alternate; reported: the
medians' ratio bf16 / fp32 (> 1: bf16 faster) and both first losses. bf16 is fast only where the
CPU has bf16 matrix instructions (AVX-512 BF16 or AMX; printed) or on a GPU.

Run (``make bench`` calls it)::

    python benchmarks/bf16_vs_fp32.py --threads 1
    python benchmarks/bf16_vs_fp32.py --device cuda
"""

from __future__ import annotations

import argparse
import copy
import functools
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: find the benchmarks
import gpt_vs_hf  # noqa: E402
import vision_vs_timm  # noqa: E402
from timing import (  # noqa: E402
    add_malloc_option,
    alternate,
    autocast,
    device_name,
    non_negative_int,
    positive_int,
    prepare_process,
)

MODELS = ("gpt", "vit")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    p.add_argument("--repeats", type=positive_int, default=5)
    p.add_argument("--warmup", type=non_negative_int, default=1)
    p.add_argument("--threads", type=positive_int, default=None)
    p.add_argument("--device", type=device_name, default="cpu")
    add_malloc_option(p)
    return p.parse_args(argv)


def cpu_bf16_support() -> str:
    """The CPU's bf16 matrix instructions, as /proc/cpuinfo names them ("none" if it has neither)."""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        return "unknown"
    found = [f for f in ("avx512_bf16", "amx_bf16") if f in flags.split()]
    return ", ".join(found) or "none"


def gpt_step(device: str, steps: int) -> tuple[nn.Module, Callable[..., Callable[[], float]]]:
    """unitok's GPT at gpt_vs_hf's default config and a closure maker for its training step (``labels=``
    without logits, the LM head fused with the loss, as its tasks train)."""
    args = gpt_vs_hf.parse_args(["--device", device])
    ours, _ = gpt_vs_hf.build_models(args)
    g = torch.Generator().manual_seed(args.seed + 1)
    ids = torch.randint(0, args.vocab_size, (args.batch_size, args.seq_len), generator=g).to(device)
    return ours, lambda model, amp: gpt_vs_hf.make_train_step(model, ids, steps, amp, fused=True,
                                                              loss_fn=gpt_vs_hf.default_loss)


def vit_step(device: str, steps: int) -> tuple[nn.Module, Callable[..., Callable[[], float]]]:
    """unitok's ViT at vision_vs_timm's default config (class-token path, as its tasks train)."""
    args = vision_vs_timm.parse_args(["--device", device])
    ours, _ = vision_vs_timm.build_models("vit", args)
    batch = vision_vs_timm.make_batch(args)
    model = vision_vs_timm.ClassTokensOnly(ours)
    return model, lambda m, amp: vision_vs_timm.make_train_step(m.train(), "vit", batch, steps, amp, fused=True)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    prepare_process(args)
    start = time.perf_counter()
    print(f"device={args.device} threads={torch.get_num_threads()} torch={torch.__version__} "
          f"cpu capability={torch.backends.cpu.get_cpu_capability()} bf16 instructions={cpu_bf16_support()}")
    result: dict[str, Any] = {}
    for name in args.models:
        model, make = {"gpt": gpt_step, "vit": vit_step}[name](args.device, 2)
        runs = {precision: make(copy.deepcopy(model), functools.partial(autocast, args.device, precision))
                for precision in ("bf16", "fp32")}
        first = {precision: run() for precision, run in runs.items()}  # one step each: both losses
        times = alternate(runs, args.repeats, args.warmup, args.device, label=f"{name} train bf16 vs fp32")
        speedup = statistics.median(times["fp32"]) / statistics.median(times["bf16"])
        result[name] = {"bf16_over_fp32": speedup, "loss": first,
                        "seconds": {k: statistics.median(v) for k, v in times.items()}}
        print(f"{name}: training step bf16-mixed {1e3 * result[name]['seconds']['bf16']:.0f} ms, "
              f"fp32 {1e3 * result[name]['seconds']['fp32']:.0f} ms: bf16 {speedup:.2f}× fp32 "
              f"(losses after one step: bf16 {first['bf16']:.4f}, fp32 {first['fp32']:.4f})")
    print(f"({time.perf_counter() - start:.0f} s)")
    return result


if __name__ == "__main__":
    main()
