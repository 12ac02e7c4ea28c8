"""Training and inference throughput of unitok's BERT against Hugging Face ``BertForMaskedLM`` at
the same config.

What it measures, in one process and with identical weights (the HF model is built with random
weights and converted with ``unitok.convert.from_transformers``): tokens/s of forward + masked-LM
cross-entropy + backward + AdamW step on a (batch × seq_len) batch masked as BERT masks (15 %;
80/10/10), two ways:

1. ``full logits``: both models score every position over the vocabulary and the loss ignores
   unmasked ones (-100) — the same arithmetic on both sides, as ``BertForMaskedLM`` computes it.
2. ``masked-only``: unitok scores only the masked positions (``model.mlm_head(hidden[masked])``,
   what ``tasks.MaskedLMTask`` does) against HF's usual full-logit step — the practical speed-up.

Inference: tokens/s of an eval-mode ``no_grad`` forward to masked-LM logits on the same batch,
every position on both sides (the same arithmetic), and unitok's logits at the masked positions
only (what its fill-mask pipeline and ``MaskedLMTask``'s evaluation compute) against HF's full
forward (what its fill-mask pipeline runs).

The first-step losses of the two models are printed (they must agree). Repetitions alternate
between the libraries so slow drifts of the machine hit both alike; the table reports medians
and the ratio unitok / HF (> 1 means unitok is faster).

Run::

    python benchmarks/bert_vs_hf.py --threads 1
    python benchmarks/bert_vs_hf.py --device cuda --d-model 768 --n-layers 12 --n-heads 12 --vocab-size 30522

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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (defaults run in about a minute on 2 cores)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--n-layers", type=int, default=4)
    p.add_argument("--n-heads", type=int, default=4)
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--batch-size", type=positive_int, default=8)
    p.add_argument("--seq-len", type=positive_int, default=128)
    p.add_argument("--dropout", type=float, default=0.1, help="hidden and attention dropout (BERT's 0.1)")
    p.add_argument("--train-steps", type=positive_int, default=2, help="optimizer steps per repetition")
    p.add_argument("--repeats", type=positive_int, default=5, help="timed repetitions per library")
    p.add_argument("--warmup", type=non_negative_int, default=1, help="untimed repetitions per library")
    p.add_argument("--threads", type=positive_int, default=None, help="torch.set_num_threads (default: torch's choice)")
    p.add_argument("--device", type=device_name, default="cpu", help="cpu or cuda")
    add_side_by_side_options(p)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def build_models(args: argparse.Namespace) -> tuple[nn.Module, nn.Module]:
    """(unitok BERT with an MLM head, HF BertForMaskedLM) with the same random weights."""
    from transformers import BertConfig, BertForMaskedLM

    from unitok.convert import from_transformers

    torch.manual_seed(args.seed)
    config = BertConfig(vocab_size=args.vocab_size, hidden_size=args.d_model, num_hidden_layers=args.n_layers,
                        num_attention_heads=args.n_heads, intermediate_size=4 * args.d_model,
                        max_position_embeddings=max(512, args.seq_len), hidden_dropout_prob=args.dropout,
                        attention_probs_dropout_prob=args.dropout)
    hf = BertForMaskedLM(config)
    ours = from_transformers(hf)
    return ours.to(args.device), hf.to(args.device)


def masked_batch(args: argparse.Namespace) -> tuple[Tensor, Tensor]:
    """Random ids masked the BERT way: (masked ids, labels with -100 where not masked)."""
    from tasks.data.bert import mask_tokens

    g = torch.Generator().manual_seed(args.seed + 1)
    ids = torch.randint(5, args.vocab_size, (args.batch_size, args.seq_len), generator=g)
    ids[:, 0], ids[:, -1] = 2, 3  # [CLS] ... [SEP]
    masked, labels = mask_tokens(ids, None, [0, 1, 2, 3, 4], 4, args.vocab_size, generator=g)
    return masked.to(args.device), labels.to(args.device)


def loss_full(model: nn.Module, ids: Tensor, labels: Tensor, hf: bool) -> Tensor:
    """Masked-LM loss from logits at every position (the loss ignores unmasked ones)."""
    logits = model(ids).logits if hf else model(ids).mlm_logits
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)


def loss_masked_only(model: nn.Module, ids: Tensor, labels: Tensor) -> Tensor:
    """unitok's way: run the MLM head only where something was masked."""
    hidden = model(ids, compute_heads=False).last_hidden_state
    masked = labels != -100
    return F.cross_entropy(model.mlm_head(hidden[masked]), labels[masked])


def mlm_logits(model: nn.Module, ids: Tensor, hf: bool) -> Tensor:
    """Masked-LM logits at every position, (B, N, V)."""
    return model(ids).logits if hf else model(ids).mlm_logits


def masked_logits(model: nn.Module, ids: Tensor, masked: Tensor) -> Tensor:
    """unitok's logits at the ``masked`` positions only, (M, V)."""
    return model.mlm_head(model(ids, compute_heads=False).last_hidden_state[masked])


def bench_infer(ours: nn.Module, hf: nn.Module, ids: Tensor, labels: Tensor,
                args: argparse.Namespace) -> dict[str, float]:
    """Inference tokens/s (median): eval mode, ``no_grad`` forwards, unitok's logits checked first."""
    ours, hf = copy.deepcopy(ours).eval(), copy.deepcopy(hf).eval()
    masked = labels != -100
    with torch.no_grad():
        full = mlm_logits(ours, ids, hf=False)
        diff = float((full - mlm_logits(hf, ids, hf=True)).abs().max())
        if diff > 1e-4 or not torch.allclose(masked_logits(ours, ids, masked), full[masked], atol=1e-4):
            raise AssertionError(f"unitok's and HF's masked-LM logits differ (max |diff| {diff:.2e})")
    runs = {"unitok": lambda: mlm_logits(ours, ids, hf=False),
            "unitok_masked": lambda: masked_logits(ours, ids, masked),
            "hf": lambda: mlm_logits(hf, ids, hf=True)}
    runs = {name: torch.no_grad()(run) for name, run in runs.items()}
    times = alternate(runs, args.repeats, args.warmup, args.device, label="bert infer")
    return {name: ids.numel() / statistics.median(t) for name, t in times.items()}


def make_train_step(model: nn.Module, loss_fn: Callable[[nn.Module], Tensor], steps: int,
                    amp: Callable[[], AbstractContextManager] = nullcontext) -> Callable[[], float]:
    """A closure running ``steps`` AdamW steps on ``model`` (own optimizer); returns the loss."""
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def run() -> float:
        loss = torch.zeros(())
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            with amp():
                loss = loss_fn(model)
            loss.backward()
            opt.step()
        return float(loss.detach())

    return run


def print_table(rows: list[tuple[str, float, float]]) -> None:
    """metric | unitok | HF | ratio (unitok / HF)."""
    print(f"{'metric':<34}{'unitok':>12}{'HF':>12}{'ratio':>9}")
    for metric, ours, theirs in rows:
        print(f"{metric:<34}{ours:>12.1f}{theirs:>12.1f}{ours / theirs:>8.2f}x")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, print the table and return the figures."""
    args = parse_args(argv)
    prepare_process(args)
    start = time.perf_counter()
    ours, hf = build_models(args)
    ids, labels = masked_batch(args)
    ours.eval(), hf.eval()
    with torch.no_grad():
        first = {"unitok": float(loss_full(ours, ids, labels, hf=False)), "hf": float(loss_full(hf, ids, labels, hf=True)),
                 "unitok masked-only": float(loss_masked_only(ours, ids, labels))}
    n_params = sum(p.numel() for p in ours.parameters())
    print(f"config: D={args.d_model} L={args.n_layers} H={args.n_heads} V={args.vocab_size} batch "
          f"{args.batch_size}x{args.seq_len} dropout={args.dropout} ({n_params / 1e6:.2f}M params) | "
          f"device={args.device} threads={torch.get_num_threads()} torch={torch.__version__} "
          f"hf_attn={getattr(hf.config, '_attn_implementation', '?')} repeats={args.repeats}")
    print("initial loss: " + ", ".join(f"{k} {v:.5f}" for k, v in first.items()))
    amp = functools.partial(autocast, args.device, args.precision)
    runs = {
        "unitok": make_train_step(copy.deepcopy(ours), lambda m: loss_full(m, ids, labels, hf=False),
                                  args.train_steps, amp),
        "unitok_masked": make_train_step(copy.deepcopy(ours), lambda m: loss_masked_only(m, ids, labels),
                                         args.train_steps, amp),
        "hf": make_train_step(copy.deepcopy(hf), lambda m: loss_full(m, ids, labels, hf=True), args.train_steps, amp),
    }
    times = alternate(runs, args.repeats, args.warmup, args.device, label="bert train")
    tokens = args.batch_size * args.seq_len * args.train_steps
    speed = {name: tokens / statistics.median(t) for name, t in times.items()}
    print_table([("train tokens/s (full logits)", speed["unitok"], speed["hf"]),
                 ("train tokens/s (masked-only)", speed["unitok_masked"], speed["hf"])])
    infer = bench_infer(ours, hf, ids, labels, args)
    print_table([("infer tokens/s (full logits)", infer["unitok"], infer["hf"]),
                 ("infer tokens/s (masked-only)", infer["unitok_masked"], infer["hf"])])
    result = {"train": speed, "infer": infer, "initial_loss": first, "seconds": time.perf_counter() - start}
    print(f"({result['seconds']:.0f} s)")
    return result


if __name__ == "__main__":
    main()
