"""Training and inference throughput of unitok's Conformer against torchaudio's at the same config.

A random ``torchaudio.models.Conformer`` (plus a linear CTC head) is converted with
``unitok.convert.from_torchaudio``; outputs are checked equal, then both train on the same
padded batch of random frames with CTC loss and AdamW, and run it through an eval-mode
``no_grad`` forward to CTC logits (inference). Reported: input frames/s (median of alternating
repetitions) and the ratio unitok / torchaudio (> 1 means unitok is faster). On the CPU a second
training row, "fused AdamW", steps unitok's side with PyTorch's fused AdamW, as its tasks do,
against torchaudio's with ``torch.optim.AdamW`` left to itself: each library's default path.

Run::

    python benchmarks/conformer_vs_torchaudio.py --threads 1
    python benchmarks/conformer_vs_torchaudio.py --d-model 256 --layers 16 --device cuda
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: find timing.py
from timing import (  # noqa: E402
    add_side_by_side_options,
    alternate,
    autocast,
    device_name,
    non_negative_int,
    positive_int,
    prepare_process,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--d-model", type=int, default=144)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--kernel", type=int, default=31)
    p.add_argument("--vocab", type=int, default=32)
    p.add_argument("--batch-size", type=positive_int, default=8)
    p.add_argument("--frames", type=positive_int, default=200, help="frames per utterance (after any subsampling)")
    p.add_argument("--train-steps", type=positive_int, default=2)
    p.add_argument("--repeats", type=positive_int, default=5)
    p.add_argument("--warmup", type=non_negative_int, default=1)
    p.add_argument("--threads", type=positive_int, default=None)
    p.add_argument("--device", type=device_name, default="cpu")
    add_side_by_side_options(p)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, float]:
    args = parse_args(argv)
    prepare_process(args)
    import torchaudio

    from unitok.convert import from_torchaudio

    start = time.perf_counter()
    torch.manual_seed(args.seed)
    ref = torchaudio.models.Conformer(input_dim=args.d_model, num_heads=args.heads, ffn_dim=4 * args.d_model,
                                      num_layers=args.layers, depthwise_conv_kernel_size=args.kernel).eval()
    head = nn.Linear(args.d_model, args.vocab)
    ours = from_torchaudio(ref, head).eval().to(args.device)
    ref, head = ref.to(args.device), head.to(args.device)
    g = torch.Generator().manual_seed(args.seed + 1)
    B, N = args.batch_size, args.frames
    frames = torch.randn(B, N, args.d_model, generator=g).to(args.device)
    lengths = torch.linspace(N // 2, N, B).long().to(args.device)  # a padded batch
    targets = torch.randint(1, args.vocab, (B, N // 8), generator=g).to(args.device)
    target_lengths = torch.full((B,), N // 8, dtype=torch.long, device=args.device)
    with torch.no_grad():
        real = torch.arange(N, device=args.device)[None] < lengths[:, None]
        diff = float((ours(frames, lengths).logits - head(ref(frames, lengths)[0]))[real].abs().max())
    if diff > 1e-4:
        raise AssertionError(f"unitok and torchaudio outputs differ by {diff:.2e}")
    print(f"Conformer D={args.d_model}, {args.layers} layers, kernel {args.kernel}, batch {B}×{N} frames, "
          f"max |diff| {diff:.1e} | device={args.device} threads={torch.get_num_threads()} "
          f"torch={torch.__version__} torchaudio={torchaudio.__version__}")

    def step_fn(model: nn.Module, forward: Callable, fused: bool | None = None) -> Callable[[], float]:
        model = copy.deepcopy(model).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused)

        def run() -> float:
            loss = torch.zeros(())
            for _ in range(args.train_steps):
                opt.zero_grad(set_to_none=True)
                with autocast(args.device, args.precision):
                    log_probs = forward(model).float().log_softmax(-1).transpose(0, 1)  # (N, B, V)
                    loss = F.ctc_loss(log_probs, targets, lengths, target_lengths, zero_infinity=True)
                loss.backward()
                opt.step()
            return float(loss.detach())

        return run

    reference = nn.ModuleDict({"conformer": ref, "head": head})
    runs = {"unitok": step_fn(ours, lambda m: m(frames, lengths).logits),
            "torchaudio": step_fn(reference, lambda m: m["head"](m["conformer"](frames, lengths)[0]))}
    if args.device == "cpu":  # each library's default: unitok's tasks step PyTorch's fused AdamW; torchaudio
        # has no trainer, and torch.optim.AdamW left to itself runs its single-tensor loop on a CPU
        runs["unitok_fused_adamw"] = step_fn(ours, lambda m: m(frames, lengths).logits, fused=True)
    times = alternate(runs, args.repeats, args.warmup, args.device, label="conformer train")
    total = int(lengths.sum()) * args.train_steps
    rates = {k: total / statistics.median(v) for k, v in times.items()}
    print(f"{'metric':<24}{'unitok':>10}{'torchaudio':>12}{'ratio':>9}")
    print(f"{'training frames/s':<24}{rates['unitok']:>10.1f}{rates['torchaudio']:>12.1f}"
          f"{rates['unitok'] / rates['torchaudio']:>8.2f}x")
    if "unitok_fused_adamw" in rates:
        print(f"{'  fused AdamW':<24}{rates['unitok_fused_adamw']:>10.1f}{rates['torchaudio']:>12.1f}"
              f"{rates['unitok_fused_adamw'] / rates['torchaudio']:>8.2f}x")
    infer_runs = {"unitok": torch.no_grad()(lambda: ours(frames, lengths).logits),
                  "torchaudio": torch.no_grad()(lambda: head(ref(frames, lengths)[0]))}
    infer_times = alternate(infer_runs, args.repeats, args.warmup, args.device, label="conformer infer")
    infer = {k: int(lengths.sum()) / statistics.median(v) for k, v in infer_times.items()}
    print(f"{'inference frames/s':<24}{infer['unitok']:>10.1f}{infer['torchaudio']:>12.1f}"
          f"{infer['unitok'] / infer['torchaudio']:>8.2f}x")
    print(f"(ratio > 1: unitok faster; {time.perf_counter() - start:.0f} s in all)")
    return {**rates, "infer": infer}


if __name__ == "__main__":
    main()
