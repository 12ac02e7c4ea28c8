"""Training and inference speed of unitok's DecisionTransformer against Hugging Face
``DecisionTransformerModel``.

What it measures, in one process and with identical weights (the HF model is built with
random weights and converted with ``unitok.convert.from_transformers``): training steps/s of
forward + masked action MSE (the paper's continuous-action loss) + backward + AdamW step on a
batch of random K-step windows, some of them left-padded as at an episode's start. Both models
get the same tensors and compute the loss the same way, outside the model. Dropout is as
configured on both sides (default 0.1, the paper's). unitok runs as `DecisionTransformerTask`
trains (``actions_only=True``: the last block computes only the state tokens the action head
reads, the same actions and gradients); the plain forward over every token, the same matrix
work as Hugging Face's, is a second row ("all tokens"). A third, "both fused AdamW", is each
library's default path: both sides step PyTorch's fused AdamW (unitok's tasks do; so does Hugging
Face's Trainer on torch >= 2.8).

Inference: windows/s of an eval-mode ``no_grad`` forward to action predictions on the same batch,
unitok as its `DecisionTransformerTask` predicts (``actions_only=True``) and over every token.

Before timing, the two are checked to be the same function: eval-mode action predictions equal
within ``--atol`` at every real step.

Repetitions alternate between the two libraries (unitok, HF, HF, unitok, ...) so slow drifts
of the machine hit both alike; the table reports the median of the repetitions and the ratio
unitok / HF (> 1 means unitok is faster).

Run::

    python benchmarks/dt_vs_hf.py                       # the paper's gym model: width 128, 3 layers, K = 20
    python benchmarks/dt_vs_hf.py --threads 1 --repeats 5
    python benchmarks/dt_vs_hf.py --device cuda --batch-size 256 --hidden 256 --heads 4

Needs ``transformers`` (the ``dev`` extra).
"""

from __future__ import annotations

import argparse
import copy
import functools
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

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

KEYS = ("states", "actions", "returns_to_go", "timesteps", "attention_mask")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (defaults: HalfCheetah-sized spaces, the paper's model)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--state-dim", type=int, default=17)
    p.add_argument("--act-dim", type=int, default=6)
    p.add_argument("--hidden", type=int, default=128, help="model width")
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--heads", type=int, default=1)
    p.add_argument("--max-ep-len", type=int, default=1000)
    p.add_argument("--context", type=int, default=20, help="K steps per window (3K tokens)")
    p.add_argument("--batch-size", type=positive_int, default=64)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--padded-fraction", type=float, default=0.25,
                   help="share of windows left-padded (episode starts)")
    p.add_argument("--train-steps", type=positive_int, default=5, help="optimizer steps per repetition")
    p.add_argument("--repeats", type=positive_int, default=5, help="timed repetitions per library")
    p.add_argument("--warmup", type=non_negative_int, default=1, help="untimed repetitions per library")
    p.add_argument("--threads", type=positive_int, default=None, help="torch.set_num_threads (default: torch's choice)")
    p.add_argument("--device", type=device_name, default="cpu", help="cpu or cuda")
    add_side_by_side_options(p)
    p.add_argument("--atol", type=float, default=1e-5, help="tolerance of the equal-output check")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def build_models(args: argparse.Namespace) -> tuple[nn.Module, nn.Module]:
    """(unitok DecisionTransformer, HF DecisionTransformerModel) with the same random weights."""
    from transformers import DecisionTransformerConfig, DecisionTransformerModel

    from unitok.convert import from_transformers

    torch.manual_seed(args.seed)
    config = DecisionTransformerConfig(
        state_dim=args.state_dim, act_dim=args.act_dim, hidden_size=args.hidden, n_layer=args.layers,
        n_head=args.heads, max_ep_len=args.max_ep_len, resid_pdrop=args.dropout, embd_pdrop=args.dropout,
        attn_pdrop=args.dropout, bos_token_id=None, eos_token_id=None,
    )
    hf = DecisionTransformerModel(config).eval()
    ours = from_transformers(hf).eval()
    return ours.to(args.device), hf.to(args.device)


def make_batch(args: argparse.Namespace) -> dict[str, Tensor]:
    """Random windows: normalised states, actions in [-1, 1], returns-to-go, timesteps; a share
    of the rows left-padded by a random number of steps."""
    g = torch.Generator().manual_seed(args.seed + 1)
    B, K = args.batch_size, args.context
    starts = torch.randint(0, args.max_ep_len - K, (B, 1), generator=g)
    mask = torch.ones(B, K, dtype=torch.long)
    n_padded = int(args.padded_fraction * B)
    for row in range(n_padded):
        mask[row, : int(torch.randint(1, K, (1,), generator=g))] = 0
    batch = {
        "states": torch.randn(B, K, args.state_dim, generator=g),
        "actions": torch.rand(B, K, args.act_dim, generator=g) * 2 - 1,
        "returns_to_go": torch.rand(B, K, 1, generator=g),
        "timesteps": (starts + torch.arange(K)) * mask,
        "attention_mask": mask,
    }
    return {k: v.to(args.device) for k, v in batch.items()}


def action_mse(model: nn.Module, batch: dict[str, Tensor], **options: Any) -> Tensor:
    """Mean squared error of the predicted actions at real steps, the same for both models
    (``options``: extra forward arguments, unitok's ``actions_only``)."""
    preds = model(**{k: batch[k] for k in KEYS}, **options).action_preds
    real = batch["attention_mask"].bool()
    return F.mse_loss(preds[real], batch["actions"][real])


def check_same(ours: nn.Module, hf: nn.Module, batch: dict[str, Tensor], atol: float) -> float:
    """Largest |difference| of eval-mode action predictions at real steps; raises above ``atol``."""
    with torch.no_grad():
        a = ours.eval()(**{k: batch[k] for k in KEYS}).action_preds
        b = hf.eval()(**{k: batch[k] for k in KEYS}).action_preds
    real = batch["attention_mask"].bool()
    diff = float((a[real] - b[real]).abs().max())
    if diff > atol:
        raise AssertionError(f"unitok and HF predictions differ by {diff:.2e} > atol {atol:g}")
    return diff


def make_train_step(model: nn.Module, batch: dict[str, Tensor], steps: int,
                    amp: Callable[[], AbstractContextManager] = nullcontext, fused: bool | None = None,
                    **options: Any) -> Callable[[], float]:
    """A closure running ``steps`` AdamW steps on ``model`` (own optimizer; ``fused``: PyTorch's
    fused kernel); returns the loss."""
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=1e-4, fused=fused)

    def run() -> float:
        loss = torch.zeros(())
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            with amp():
                loss = action_mse(model, batch, **options)
            loss.backward()
            opt.step()
        return float(loss.detach())

    return run


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, print the table and return the figures."""
    args = parse_args(argv)
    prepare_process(args)
    import transformers

    start = time.perf_counter()
    ours, hf = build_models(args)
    batch = make_batch(args)
    n_params = sum(p.numel() for p in ours.parameters())
    diff = check_same(ours, hf, batch, args.atol)
    print(f"config: state {args.state_dim}, act {args.act_dim}, width {args.hidden}, {args.layers} layers, "
          f"{args.heads} head(s), K={args.context} ({3 * args.context} tokens), batch {args.batch_size}, "
          f"dropout {args.dropout} ({n_params / 1e6:.2f}M params) | device={args.device} "
          f"threads={torch.get_num_threads()} torch={torch.__version__} transformers={transformers.__version__} "
          f"hf_attn={getattr(hf.config, '_attn_implementation', '?')} repeats={args.repeats}")
    print(f"same function: max |action difference| {diff:.1e} (atol {args.atol:g})")
    amp = functools.partial(autocast, args.device, args.precision)
    runs = {"unitok": make_train_step(copy.deepcopy(ours), batch, args.train_steps, amp, actions_only=True),
            "unitok_all_tokens": make_train_step(copy.deepcopy(ours), batch, args.train_steps, amp),
            "hf": make_train_step(copy.deepcopy(hf), batch, args.train_steps, amp)}
    # each library's default path: both step PyTorch's fused AdamW (unitok's tasks; Hugging Face's
    # Trainer on torch >= 2.8, optim="adamw_torch_fused")
    runs |= {"unitok_fused": make_train_step(copy.deepcopy(ours), batch, args.train_steps, amp, fused=True,
                                             actions_only=True),
             "hf_fused": make_train_step(copy.deepcopy(hf), batch, args.train_steps, amp, fused=True)}
    times = alternate(runs, args.repeats, args.warmup, args.device, label="dt train")
    rates = {name: args.train_steps / statistics.median(t) for name, t in times.items()}
    ratio, ratio_all = rates["unitok"] / rates["hf"], rates["unitok_all_tokens"] / rates["hf"]
    ratio_default = rates["unitok_fused"] / rates["hf_fused"]
    print(f"{'metric':<28}{'unitok':>10}{'HF':>10}{'ratio':>9}")
    print(f"{'train steps/s':<28}{rates['unitok']:>10.2f}{rates['hf']:>10.2f}{ratio:>8.2f}x")
    print(f"{'  all tokens':<28}{rates['unitok_all_tokens']:>10.2f}{rates['hf']:>10.2f}{ratio_all:>8.2f}x")
    print(f"{'  both fused AdamW':<28}{rates['unitok_fused']:>10.2f}{rates['hf_fused']:>10.2f}{ratio_default:>8.2f}x")
    inputs = {k: batch[k] for k in KEYS}
    evals = {"unitok": copy.deepcopy(ours).eval(), "hf": copy.deepcopy(hf).eval()}
    infer_runs = {"unitok": lambda: evals["unitok"](**inputs, actions_only=True).action_preds,
                  "unitok_all_tokens": lambda: evals["unitok"](**inputs).action_preds,
                  "hf": lambda: evals["hf"](**inputs).action_preds}
    infer_times = alternate({k: torch.no_grad()(run) for k, run in infer_runs.items()}, args.repeats, args.warmup,
                            args.device, label="dt infer")
    infer = {name: args.batch_size / statistics.median(t) for name, t in infer_times.items()}
    print(f"{'infer windows/s':<28}{infer['unitok']:>10.1f}{infer['hf']:>10.1f}{infer['unitok'] / infer['hf']:>8.2f}x")
    print(f"{'  all tokens':<28}{infer['unitok_all_tokens']:>10.1f}{infer['hf']:>10.1f}"
          f"{infer['unitok_all_tokens'] / infer['hf']:>8.2f}x")
    seconds = time.perf_counter() - start
    print(f"({seconds:.0f} s)")
    return {"train_steps_per_s": rates, "ratio": ratio, "ratio_all_tokens": ratio_all, "ratio_fused_adamw": ratio_default,
            "infer": infer,
            "max_abs_diff": diff, "seconds": seconds,
            "threads": torch.get_num_threads(), "device": args.device}


if __name__ == "__main__":
    main()
