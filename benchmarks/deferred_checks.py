"""What reading the input checks' verdicts costs a GPU training step: deferred against at once.

unitok checks token ids, labels and pixels before using them. On a GPU a verdict read at once is
a host sync that drains the stream's queue; `unitok.checks.deferred_checks` (what the models'
forwards and the fused loss open) reads it as the forward ends instead. This times one model's
training step three ways, in one process, alternating repetitions:

- ``deferred``: as unitok runs (the default);
- ``at once``: the same checks, each verdict read where it is made (as before deferral);
- ``none``: no id or label checks at all (what a reference library does: a bad id is a device
  assert, not an error naming it), the floor the other two are measured against.

It also prints, for ``deferred`` and ``at once``, the share of a step the GPU spends in kernels
(torch.profiler). Default: GPT-124M, bf16 autocast, batch 16 x 1,024, fused AdamW, the stacks
and the fused loss compiled as `tasks.Compile` does (``--eager``: not).

Run (needs CUDA)::

    python benchmarks/deferred_checks.py
    python benchmarks/deferred_checks.py --batch-size 32 --repeats 7
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: find timing.py
from timing import positive_int  # noqa: E402

import unitok.checks as checks  # noqa: E402
import unitok.losses as losses  # noqa: E402
from unitok.compile import compile_backbones  # noqa: E402
from unitok.embed import TokenEmbedding  # noqa: E402
from unitok.models import GPT, GPTConfig  # noqa: E402

H100_BF16_FLOPS = 989.4e12  # dense bf16 peak of an H100 SXM, for the MFU column (as gpt_vs_hf.py)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch-size", type=positive_int, default=16)
    p.add_argument("--seq-len", type=positive_int, default=1024)
    p.add_argument("--steps", type=positive_int, default=5, help="training steps per repetition")
    p.add_argument("--repeats", type=positive_int, default=5, help="timed repetitions per variant")
    p.add_argument("--eager", action="store_true", help="do not compile the stacks and the loss")
    p.add_argument("--peak-flops", type=float, default=H100_BF16_FLOPS)
    return p.parse_args(argv)


def variants() -> dict[str, Callable[[], None]]:
    """How each variant sets the checks up (each undoes the others' settings)."""
    keep_labels, keep_embed = losses.check_class_labels, TokenEmbedding.forward

    def deferred() -> None:
        checks._DEFERRING_DEVICES, losses.check_class_labels = frozenset({"cuda"}), keep_labels
        TokenEmbedding.forward = keep_embed

    def at_once() -> None:
        checks._DEFERRING_DEVICES, losses.check_class_labels = frozenset(), keep_labels
        TokenEmbedding.forward = keep_embed

    def none() -> None:
        checks._DEFERRING_DEVICES = frozenset({"cuda"})
        losses.check_class_labels = lambda labels, *args, **kwargs: labels
        TokenEmbedding.forward = lambda self, ids, check=True: keep_embed(self, ids, check=False)

    return {"deferred": deferred, "at once": at_once, "none": none}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("deferred_checks.py measures a GPU's training step: it needs CUDA")
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=50304, context_length=args.seq_len, d_model=768, n_layers=12, n_heads=12,
                       dropout=0.0)
    model = GPT(config).cuda().train()
    if not args.eager:
        compile_backbones(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    ids = torch.randint(0, config.vocab_size, (args.batch_size, args.seq_len), device="cuda")
    setups = variants()

    def make_step(name: str) -> Callable[[], None]:
        def step() -> None:
            setups[name]()
            for _ in range(args.steps):
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = model(ids, labels=ids, return_logits=False).loss
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
        return step

    steps = {name: make_step(name) for name in setups}
    for step in steps.values():  # warm-up: compile, cuBLAS / allocator caches
        step()
    torch.cuda.synchronize()
    times: dict[str, list[float]] = {name: [] for name in steps}
    order = list(steps)
    for r in range(args.repeats):
        for name in order if r % 2 == 0 else order[::-1]:
            torch.cuda.synchronize()
            start = time.perf_counter()
            steps[name]()
            torch.cuda.synchronize()
            times[name].append(time.perf_counter() - start)
    tokens = args.batch_size * args.seq_len * args.steps
    # gpt_vs_hf.py's count: 6·N less the position table, + 12·L·D·T for attention
    params = sum(p.numel() for p in model.parameters()) - config.context_length * config.d_model
    flops_per_token = 6 * params + 12 * config.n_layers * config.d_model * args.seq_len
    print(f"GPT-124M, batch {args.batch_size} x {args.seq_len}, bf16 autocast, fused AdamW, "
          f"{'eager' if args.eager else 'compiled'}, {torch.cuda.get_device_name()}, torch {torch.__version__}")
    floor = statistics.median(times["none"])
    for name, t in times.items():
        median = statistics.median(t)
        rate = tokens / median
        print(f"{name:>9}: {rate:,.0f} tokens/s, MFU {100 * rate * flops_per_token / args.peak_flops:.1f} %, "
              f"{1e3 * median / args.steps:.2f} ms a step ({median / floor:.3f}x the unchecked step's time; "
              f"repetitions {', '.join(f'{x:.3f}' for x in t)} s)")
    from torch.profiler import ProfilerActivity, profile

    for name in ("deferred", "at once"):
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            start = time.perf_counter()
            steps[name]()
            torch.cuda.synchronize()
            wall = time.perf_counter() - start
        busy = sum(e.self_device_time_total for e in prof.key_averages() if e.device_type.name == "CUDA"
                   and not e.is_user_annotation) / 1e6  # the kernels' time, as the profiler's table sums it
        print(f"profile, {name}: GPU in kernels {1e3 * busy / args.steps:.2f} ms of {1e3 * wall / args.steps:.2f} ms "
              f"a step ({100 * busy / wall:.0f} %, wall under the profiler)")
    setups["deferred"]()


if __name__ == "__main__":
    main()
