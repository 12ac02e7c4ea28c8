"""Throughput of unitok's T5 against Hugging Face's `T5ForConditionalGeneration`, same weights.

What it measures, in one process (the Hugging Face model is built with random weights and
converted with ``unitok.convert.from_transformers``; logits are checked equal first):

1. Training: target tokens/s of encoder + decoder forward, cross-entropy, backward and an
   AdamW step on a batch of random sources and targets: both sides computing the loss alike
   from their logits, then each on its default path, ``labels=`` (unitok with
   ``return_logits=False``: its LM head fused with the loss, as its tasks train) stepping fused
   AdamW (unitok's tasks and Hugging Face's Trainer, on torch >= 2.8, both default to it).
2. Inference: target tokens/s of an eval, ``no_grad`` teacher-forced forward (encoder and
   decoder, logits at every target position, as scoring a candidate answer runs).
3. Beam search: new tokens/s of ``generate(num_beams=W, max_new_tokens=M)`` with EOS
   disabled (every row runs the full M steps on both sides), outputs checked identical; also
   unitok without its greedy floor (``greedy_floor=False``: W rows a source, Hugging Face's work);
   with ``--compile-decode`` also through the compiled static-cache step (``compile=True``), its
   beams checked equal to the eager search's.

Repetitions alternate between the libraries; medians and the ratio unitok / Hugging Face
(> 1 means unitok is faster) are printed.

Run::

    python benchmarks/t5_vs_hf.py --threads 1
    python benchmarks/t5_vs_hf.py --variant v1.1 --d-model 512 --layers 6 --device cuda
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
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--variant", choices=("v1.0", "v1.1"), default="v1.0")
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch-size", type=positive_int, default=8)
    p.add_argument("--source-len", type=positive_int, default=64)
    p.add_argument("--target-len", type=positive_int, default=32)
    p.add_argument("--beams", type=positive_int, default=4)
    p.add_argument("--gen-batch", type=positive_int, default=2)
    p.add_argument("--new-tokens", type=positive_int, default=32)
    p.add_argument("--train-steps", type=positive_int, default=2)
    p.add_argument("--repeats", type=positive_int, default=5)
    p.add_argument("--warmup", type=non_negative_int, default=1)
    p.add_argument("--threads", type=positive_int, default=None)
    p.add_argument("--device", type=device_name, default="cpu")
    add_side_by_side_options(p)
    p.add_argument("--compile-decode", action="store_true",
                   help="also time the beam search through the compiled static-cache step "
                        "(generate(compile=True); compilation in the warm-up, not timed)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def build_models(args: argparse.Namespace) -> tuple[nn.Module, nn.Module]:
    from transformers import T5Config, T5ForConditionalGeneration

    from unitok.convert import from_transformers

    torch.manual_seed(args.seed)
    ff = {"v1.0": "relu", "v1.1": "gated-gelu"}[args.variant]
    config = T5Config(vocab_size=args.vocab_size, d_model=args.d_model, d_kv=args.d_model // args.heads,
                      d_ff=4 * args.d_model, num_layers=args.layers, num_heads=args.heads, dropout_rate=0.0,
                      feed_forward_proj=ff, decoder_start_token_id=0)
    theirs = T5ForConditionalGeneration(config).eval()
    ours = from_transformers(theirs).eval()
    return ours.to(args.device), theirs.to(args.device)


def make_train_step(model: nn.Module, loss_fn: Callable[[nn.Module], Tensor], steps: int,
                    amp: Callable[[], AbstractContextManager] = nullcontext,
                    fused: bool | None = None) -> Callable[[], float]:
    """A closure running ``steps`` AdamW steps on a copy of ``model`` with ``loss_fn(model)``
    (``fused``: PyTorch's fused AdamW kernel)."""
    model = copy.deepcopy(model).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused)

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


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    prepare_process(args)
    import transformers

    start = time.perf_counter()
    ours, theirs = build_models(args)
    g = torch.Generator().manual_seed(args.seed + 1)
    src = torch.randint(2, args.vocab_size, (args.batch_size, args.source_len), generator=g).to(args.device)
    labels = torch.randint(2, args.vocab_size, (args.batch_size, args.target_len), generator=g).to(args.device)
    dec_in = ours.shift_right(labels)
    with torch.no_grad():
        diff = float((ours(src, decoder_input_ids=dec_in).logits
                      - theirs(input_ids=src, decoder_input_ids=dec_in).logits).abs().max())
    if diff > 1e-4:
        raise AssertionError(f"unitok and Hugging Face logits differ by {diff:.2e}")
    print(f"T5 {args.variant}: D={args.d_model}, {args.layers}+{args.layers} layers, V={args.vocab_size}, "
          f"max |logit diff| {diff:.1e} | device={args.device} threads={torch.get_num_threads()} "
          f"torch={torch.__version__} transformers={transformers.__version__}")

    def same_loss(logits: Tensor) -> Tensor:  # both sides alike, from the logits
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())

    amp = functools.partial(autocast, args.device, args.precision)
    times = alternate({"unitok": make_train_step(ours, lambda m: same_loss(m(src, decoder_input_ids=dec_in).logits),
                                                 args.train_steps, amp),
                       "hf": make_train_step(theirs, lambda m: same_loss(m(input_ids=src, decoder_input_ids=dec_in).logits),
                                             args.train_steps, amp)},
                      args.repeats, args.warmup, args.device, label="t5 train")
    tokens = args.batch_size * args.target_len * args.train_steps
    train = {k: tokens / statistics.median(v) for k, v in times.items()}

    # Each library's default training path: labels= (unitok's LM head fused with the loss,
    # return_logits=False, as Seq2SeqTask trains; Hugging Face's logits then its loss) and fused
    # AdamW (unitok's tasks step it; so does Hugging Face's Trainer by default on torch >= 2.8).
    def ours_default(m: nn.Module) -> Tensor:
        return m(src, labels=labels, return_logits=False).loss

    def theirs_default(m: nn.Module) -> Tensor:
        return m(input_ids=src, labels=labels).loss

    with torch.no_grad():
        gap = abs(float(ours_default(ours)) - float(theirs_default(theirs)))
    if gap > 1e-4:
        raise AssertionError(f"unitok's and Hugging Face's labels= losses differ by {gap:.2e}")
    times = alternate({"unitok": make_train_step(ours, ours_default, args.train_steps, amp, fused=True),
                       "hf": make_train_step(theirs, theirs_default, args.train_steps, amp, fused=True)},
                      args.repeats, args.warmup, args.device, label="t5 train, default paths (labels=)")
    train_default = {k: tokens / statistics.median(v) for k, v in times.items()}

    runs = {"unitok": torch.no_grad()(lambda: ours(src, decoder_input_ids=dec_in).logits),
            "hf": torch.no_grad()(lambda: theirs(input_ids=src, decoder_input_ids=dec_in).logits)}
    times = alternate(runs, args.repeats, args.warmup, args.device, label="t5 infer")
    infer = {k: labels.numel() / statistics.median(v) for k, v in times.items()}

    gen_src = src[: args.gen_batch]
    no_eos = args.vocab_size + 7  # an id no model can produce: every row decodes all steps

    def gen_ours() -> torch.Tensor:
        return ours.generate(gen_src, max_new_tokens=args.new_tokens, strategy="beam", num_beams=args.beams,
                             eos_token_id=None)

    def gen_theirs() -> torch.Tensor:
        return theirs.generate(input_ids=gen_src, max_new_tokens=args.new_tokens, num_beams=args.beams,
                               do_sample=False, eos_token_id=no_eos, min_new_tokens=0)

    def gen_ours_plain() -> torch.Tensor:
        return ours.generate(gen_src, max_new_tokens=args.new_tokens, strategy="beam", num_beams=args.beams,
                             eos_token_id=None, greedy_floor=False)

    def gen_compiled() -> torch.Tensor:
        return ours.generate(gen_src, max_new_tokens=args.new_tokens, strategy="beam", num_beams=args.beams,
                             eos_token_id=None, compile=True)

    a, b, c = gen_ours(), gen_theirs(), gen_ours_plain()
    if a.tolist() != b.tolist() or c.tolist() != b.tolist():
        raise AssertionError("beam-search outputs differ")
    if args.compile_decode and gen_compiled().tolist() != a.tolist():
        raise AssertionError("the compiled beam search found other beams than the eager one")
    runs = {"unitok": gen_ours, "unitok, HF's search": gen_ours_plain}
    runs |= ({"unitok compiled": gen_compiled} if args.compile_decode else {}) | {"hf": gen_theirs}
    times = alternate(runs, args.repeats, args.warmup, args.device, label="t5 generate")
    new = args.gen_batch * args.new_tokens
    beam = {k: new / statistics.median(v) for k, v in times.items()}
    plain = {"unitok": beam["unitok, HF's search"], "hf": beam["hf"]}
    compiled = {"unitok": beam["unitok compiled"], "hf": beam["hf"]} if args.compile_decode else None

    print(f"{'metric':<36}{'unitok':>10}{'HF':>10}{'ratio':>9}")
    for metric, r in (("training target tokens/s", train), ("  default paths (labels=)", train_default),
                      ("inference target tokens/s", infer),
                      (f"beam search (W={args.beams}) new tokens/s", beam), ("  HF's search (same work)", plain),
                      *([("  compiled decode step", compiled)] if compiled else [])):
        print(f"{metric:<36}{r['unitok']:>10.1f}{r['hf']:>10.1f}{r['unitok'] / r['hf']:>8.2f}x")
    print(f"(ratio > 1: unitok faster; {time.perf_counter() - start:.0f} s in all)")
    return {"train": train, "train_default": train_default, "infer": infer, "beam": beam}


if __name__ == "__main__":
    main()
