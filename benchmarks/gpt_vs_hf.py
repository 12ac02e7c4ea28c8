"""Throughput of unitok's GPT against Hugging Face ``GPT2LMHeadModel`` at the same config.

What it measures, in one process and with identical weights (the HF model is built with
random weights and converted with ``unitok.convert.from_transformers``):

1. Training: tokens/s of forward + next-token cross-entropy + backward + AdamW step on a
   (batch × seq_len) batch of random ids. Both models compute the loss the same way, outside
   the model, from their logits; then again on each library's default path, ``labels=``
   (unitok with ``return_logits=False``: its LM head fused with the loss, as its tasks train)
   with fused AdamW (the default of unitok's tasks and of Hugging Face's Trainer on torch >= 2.8).
2. Inference: tokens/s of an eval, ``no_grad`` forward to the logits at every position (as
   scoring a text's likelihood runs) at the training batch, logits checked equal first.
3. Generation: new tokens/s of greedy decoding with a KV cache, batch 1, ``--new-tokens``
   tokens after a ``--prompt-len`` random prompt. EOS stopping is off on both sides, so both
   generate exactly the same number of tokens; the two outputs are checked to be equal.
4. Beam search (``--beams``, default 4): new tokens/s, batch 1, no EOS, outputs compared.

   ``--compile-decode`` also times ``generate(compile=True)``, greedy and beam search (a
   `StaticKVCache` and the decode step compiled by inductor once a shape, in the warm-up) against
   the same Hugging Face runs; its tokens must equal eager decoding's.

Training also prints model FLOP/s: 6·N + 12·L·D·T FLOPs a token (N parameters less the
position table, as nanoGPT and PaLM count them: forward and backward of every weight, plus
attention's scores and mixing), and on CUDA the model FLOPs utilisation (MFU) against the
GPU's dense peak at ``--precision`` (``--peak-tflops`` to give it). ``--precision bf16`` trains
both sides under ``torch.autocast(bfloat16)``, as ``--trainer.precision bf16-mixed`` does;
``--compile`` trains both compiled (unitok's transformer stacks as ``tasks.Compile`` compiles
them, Hugging Face's whole model); ``--fused-adamw`` steps the same-loss rows with fused AdamW too;
``--profile ROWS`` prints torch.profiler's busiest operators for a step of each default path.

Repetitions alternate between the two libraries (unitok, HF, HF, unitok, ...) so slow drifts
of the machine hit both alike; the table reports the median of the repetitions and the ratio
unitok / HF (> 1 means unitok is faster).

Run (``make bench`` calls the first line)::

    python benchmarks/gpt_vs_hf.py
    python benchmarks/gpt_vs_hf.py --threads 1 --repeats 5
    python benchmarks/gpt_vs_hf.py --device cuda --d-model 768 --n-layers 12 --n-heads 12
    # GPT-2 124M, bf16, MFU (the issue's H100 target: ≥ 50 %); --compile: both sides compiled
    python benchmarks/gpt_vs_hf.py --device cuda --precision bf16 --d-model 768 --n-layers 12 --n-heads 12 \
        --vocab-size 50304 --context-length 1024 --batch-size 16 --seq-len 1024 --skip-generate --fused-adamw

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

from unitok.models import GPT  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (all have defaults that run in well under two minutes on 2 cores)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--n-layers", type=int, default=4)
    p.add_argument("--n-heads", type=int, default=4)
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--context-length", type=int, default=256)
    p.add_argument("--batch-size", type=positive_int, default=8, help="training batch")
    p.add_argument("--seq-len", type=positive_int, default=128, help="training sequence length")
    p.add_argument("--train-steps", type=positive_int, default=2, help="optimizer steps per repetition")
    p.add_argument("--prompt-len", type=positive_int, default=16)
    p.add_argument("--new-tokens", type=positive_int, default=64)
    p.add_argument("--repeats", type=positive_int, default=5, help="timed repetitions per library")
    p.add_argument("--warmup", type=non_negative_int, default=1, help="untimed repetitions per library")
    p.add_argument("--threads", type=positive_int, default=None,
                   help="torch.set_num_threads (default: torch's choice)")
    p.add_argument("--device", type=device_name, default="cpu", help="cpu or cuda")
    add_side_by_side_options(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip-train", action="store_true")
    p.add_argument("--skip-infer", action="store_true")
    p.add_argument("--skip-generate", action="store_true")
    p.add_argument("--beams", type=positive_int, default=4, help="beam-search width timed too (1: not timed)")
    p.add_argument("--peak-tflops", type=float, default=None,
                   help="the device's dense peak at --precision, for MFU (default: known GPUs by name)")
    p.add_argument("--compile", action="store_true",
                   help="train compiled: unitok's transformer stacks as tasks.Compile compiles them "
                        "(compile_backbones), Hugging Face's whole model through torch.compile")
    p.add_argument("--compile-mode", default=None,
                   help="torch.compile's mode for both sides with --compile (max-autotune-no-cudagraphs: "
                        "inductor times Triton GEMM templates against cuBLAS and fuses epilogues)")
    p.add_argument("--default-only", action="store_true",
                   help="train only each library's default path (labels=), not the same-loss rows")
    p.add_argument("--fused-adamw", action="store_true",
                   help="the same-loss rows step PyTorch's fused AdamW on both sides too (the labels= rows, "
                        "each library's default path, always do)")
    p.add_argument("--profile", type=non_negative_int, default=0, metavar="ROWS",
                   help="after training, profile three steps of each side's default path (labels=) and print "
                        "the ROWS operators with the most self time on the device (0: no profile)")
    p.add_argument("--compile-decode", action="store_true",
                   help="also time generate(compile=True), greedy and beam search: the static-cache step "
                        "compiled by inductor (compilation in the warm-up, not timed)")
    return p.parse_args(argv)


# --------------------------------------------------------------------------- models
def build_models(args: argparse.Namespace) -> tuple[nn.Module, nn.Module]:
    """(unitok GPT, HF GPT2LMHeadModel) with the same random weights, dropout off, eval mode."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from unitok.convert import from_transformers

    torch.manual_seed(args.seed)
    hf_config = GPT2Config(
        vocab_size=args.vocab_size, n_positions=args.context_length, n_embd=args.d_model,
        n_layer=args.n_layers, n_head=args.n_heads, attn_pdrop=0.0, resid_pdrop=0.0,
        embd_pdrop=0.0, bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    hf = GPT2LMHeadModel(hf_config).eval()
    ours = from_transformers(hf).eval()
    # No EOS anywhere: generation must run for exactly max_new_tokens on both sides.
    hf.generation_config.eos_token_id = None
    hf.generation_config.bos_token_id = None
    hf.generation_config.pad_token_id = 0
    return ours.to(args.device), hf.to(args.device)


def hf_attention_backend(hf: nn.Module) -> str:
    """The attention implementation HF picked (sdpa / eager), for the report."""
    return str(getattr(hf.config, "_attn_implementation", "?"))


# Dense peak TFLOP/s by (GPU name fragment, precision): the vendors' data sheets, without sparsity.
# fp32 is plain fp32 (PyTorch leaves TF32 off for matmuls by default).
PEAK_TFLOPS = {("H100 PCIe", "bf16"): 756.0, ("H100", "bf16"): 989.4, ("H200", "bf16"): 989.4,
               ("A100", "bf16"): 312.0, ("H100 PCIe", "fp32"): 51.2, ("H100", "fp32"): 66.9,
               ("H200", "fp32"): 66.9, ("A100", "fp32"): 19.5}


def flops_per_token(ours: nn.Module, args: argparse.Namespace) -> float:
    """Training FLOPs a token: 6·N (N: parameters less the position table; the tied LM head is
    counted once, as the embedding it shares) + 12·L·D·T for attention (scores and mixing)."""
    n = sum(p.numel() for p in ours.parameters())
    n -= args.context_length * args.d_model  # the learned position table does no matrix work
    return 6 * n + 12 * args.n_layers * args.d_model * args.seq_len


def peak_tflops(args: argparse.Namespace) -> float | None:
    """The device's dense peak at ``--precision`` (``--peak-tflops`` or a known GPU), else None."""
    if args.peak_tflops is not None:
        return args.peak_tflops
    if not args.device.startswith("cuda"):
        return None
    name = torch.cuda.get_device_name(torch.device(args.device))
    for (fragment, precision), value in PEAK_TFLOPS.items():  # more specific fragments come first
        if fragment in name and precision == args.precision:
            return value
    return None


# --------------------------------------------------------------------------- workloads
def lm_loss(logits: Tensor, ids: Tensor) -> Tensor:
    """Next-token cross-entropy, computed the same way for both models."""
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def same_loss(model: nn.Module, ids: Tensor) -> Tensor:
    """Both sides alike: the model's logits, then `lm_loss`."""
    return lm_loss(model(ids).logits, ids)


def default_loss(model: nn.Module, ids: Tensor) -> Tensor:
    """Each library's own training path: ``labels=`` (shifted inside, as in ``GPT2LMHeadModel``);
    unitok without returning the logits, so its LM head runs fused with the loss."""
    if isinstance(model, GPT):
        return model(ids, labels=ids, return_logits=False).loss
    return model(ids, labels=ids).loss


def make_train_step(model: nn.Module, ids: Tensor, steps: int, amp: Callable[[], AbstractContextManager] = nullcontext,
                    fused: bool | None = None,
                    loss_fn: Callable[[nn.Module, Tensor], Tensor] = same_loss) -> Callable[[], float]:
    """A closure running ``steps`` AdamW steps on ``model`` (own optimizer; ``fused``: PyTorch's
    fused kernel, as unitok's tasks step) with ``loss_fn(model, ids)``; returns the loss."""
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused)

    def run() -> float:
        loss = torch.zeros(())
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            with amp():
                loss = loss_fn(model, ids)
            loss.backward()
            opt.step()
        return float(loss.detach())

    return run


def training_copy(model: nn.Module, args: argparse.Namespace) -> nn.Module:
    """A copy of ``model`` for one side's training runs; with ``--compile`` unitok's transformer
    stacks are compiled as its tasks compile them, Hugging Face's model as a whole."""
    model = copy.deepcopy(model)
    if not args.compile:
        return model
    options = {"mode": args.compile_mode} if args.compile_mode else {}
    if isinstance(model, GPT):
        from unitok.compile import compile_backbones

        compile_backbones(model, **options)
        return model
    return torch.compile(model, **options)


def bench_train(ours: nn.Module, hf: nn.Module, args: argparse.Namespace) -> dict[str, float]:
    """Training tokens/s (median over repetitions) for both models, on copies of them."""
    g = torch.Generator().manual_seed(args.seed + 1)
    shape = (args.batch_size, args.seq_len)
    ids = torch.randint(0, args.vocab_size, shape, generator=g).to(args.device)
    # The same first-step loss confirms the two models (and the loss) are the same function.
    with torch.no_grad():
        loss_ours = float(lm_loss(ours(ids).logits, ids))
        loss_hf = float(lm_loss(hf(ids).logits, ids))
    amp = functools.partial(autocast, args.device, args.precision)
    fused = True if args.fused_adamw else None
    times = {}
    if not args.default_only:
        runs = {"unitok": make_train_step(training_copy(ours, args), ids, args.train_steps, amp, fused),
                "hf": make_train_step(training_copy(hf, args), ids, args.train_steps, amp, fused)}
        times = alternate(runs, args.repeats, args.warmup, args.device, label="gpt train")
    # Each side's default training path (labels=): unitok's LM head fused with the loss.
    with torch.no_grad():
        gap = abs(float(default_loss(ours, ids)) - float(default_loss(hf, ids)))
    if gap > 1e-4:
        raise AssertionError(f"unitok's and Hugging Face's labels= losses differ by {gap:.2e}")
    # ... stepping fused AdamW: unitok's tasks do, and so does Hugging Face's Trainer by default
    # (``optim="adamw_torch_fused"`` on torch >= 2.8).
    default = alternate({"unitok": make_train_step(training_copy(ours, args), ids, args.train_steps, amp, True,
                                                   loss_fn=default_loss),
                         "hf": make_train_step(training_copy(hf, args), ids, args.train_steps, amp, True,
                                               loss_fn=default_loss)},
                        args.repeats, args.warmup, args.device, label="gpt train, default paths (labels=)")
    tokens = args.batch_size * args.seq_len * args.train_steps
    return {**({"unitok": tokens / statistics.median(times["unitok"]),
                "hf": tokens / statistics.median(times["hf"])} if times else {}),
            "unitok default": tokens / statistics.median(default["unitok"]),
            "hf default": tokens / statistics.median(default["hf"]),
            "loss_unitok": loss_ours, "loss_hf": loss_hf}


def profile_default_paths(ours: nn.Module, hf: nn.Module, args: argparse.Namespace) -> None:
    """Where a training step of each side's default path (``labels=``, fused AdamW; compiled with
    ``--compile``) spends its time: torch.profiler's operators by self time on the device."""
    from torch.profiler import ProfilerActivity, profile

    g = torch.Generator().manual_seed(args.seed + 1)
    ids = torch.randint(0, args.vocab_size, (args.batch_size, args.seq_len), generator=g).to(args.device)
    amp = functools.partial(autocast, args.device, args.precision)
    cuda = args.device.startswith("cuda")
    for name, model in (("unitok", ours), ("hf", hf)):
        step = make_train_step(training_copy(model, args), ids, 1, amp, True, loss_fn=default_loss)
        for _ in range(2):  # warm-up, compilation included
            step()
        with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
            start = time.perf_counter()
            for _ in range(3):
                step()  # returns the loss as a float: each step ends synchronised
            wall = time.perf_counter() - start
        print(f"profile, {name} default path (labels=), 3 steps:")
        print(prof.key_averages().table(sort_by="self_device_time_total" if cuda else "self_cpu_time_total",
                                        row_limit=args.profile, max_name_column_width=60))
        if cuda:
            print(kernel_time_by_kind(prof, wall))


# Device kernels by what they compute, from their names (the first pattern that matches)
KERNEL_KINDS = (("attention", ("sdpa", "flash", "fmha", "attention")),
                ("GEMM", ("gemm", "nvjet", "cutlass", "sm90_xmma", "cublas")),
                ("optimizer", ("adam", "multi_tensor")),
                ("fused (inductor)", ("triton_",)))


def kernel_time_by_kind(prof: Any, wall: float) -> str:
    """One line: the profiled steps' device kernel time by `KERNEL_KINDS` (the rest: "other"),
    and the kernels' total against the steps' wall time (the device's busy share)."""
    times: dict[str, float] = {}
    for event in prof.key_averages():
        if getattr(event, "device_type", None) != torch.autograd.DeviceType.CUDA:
            continue
        lowered = event.key.lower()
        kind = next((k for k, pats in KERNEL_KINDS if any(p in lowered for p in pats)), "other")
        times[kind] = times.get(kind, 0.0) + event.self_device_time_total / 1e3  # us -> ms
    total = sum(times.values())
    if not total:
        return "device kernels: none recorded"
    parts = ", ".join(f"{k} {v:.1f} ms ({100 * v / total:.0f} %)" for k, v in sorted(times.items(), key=lambda kv: -kv[1]))
    return f"device kernels, 3 steps: {parts}; {total:.1f} ms in all, {100 * total / (wall * 1e3):.0f} % of {wall * 1e3:.1f} ms wall"


def bench_infer(ours: nn.Module, hf: nn.Module, args: argparse.Namespace) -> dict[str, float]:
    """Inference tokens/s (median): eval mode, ``no_grad`` forwards to every position's logits."""
    g = torch.Generator().manual_seed(args.seed + 3)
    ids = torch.randint(0, args.vocab_size, (args.batch_size, args.seq_len), generator=g).to(args.device)
    ours, hf = ours.eval(), hf.eval()
    with torch.no_grad():
        diff = float((ours(ids).logits - hf(ids).logits).abs().max())
    if diff > 1e-4:
        raise AssertionError(f"unitok's and Hugging Face's logits differ by {diff:.2e}")
    runs = {"unitok": torch.no_grad()(lambda: ours(ids).logits), "hf": torch.no_grad()(lambda: hf(ids).logits)}
    times = alternate(runs, args.repeats, args.warmup, args.device, label="gpt infer")
    return {name: ids.numel() / statistics.median(t) for name, t in times.items()}


def bench_generate(ours: nn.Module, hf: nn.Module, args: argparse.Namespace) -> dict[str, Any]:
    """Greedy decoding new tokens/s (median) for both; checks the generated ids agree."""
    g = torch.Generator().manual_seed(args.seed + 2)
    ids = torch.randint(0, args.vocab_size, (1, args.prompt_len), generator=g).to(args.device)
    mask = torch.ones_like(ids)
    n = args.new_tokens
    outputs: dict[str, Tensor] = {}

    def run_ours() -> None:
        outputs["unitok"] = ours.generate(ids, max_new_tokens=n, strategy="greedy",
                                          eos_token_id=None)

    def run_hf() -> None:
        outputs["hf"] = hf.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                                    do_sample=False, eos_token_id=None, pad_token_id=0)

    def run_compiled() -> None:
        outputs["unitok compiled"] = ours.generate(ids, max_new_tokens=n, strategy="greedy",
                                                   eos_token_id=None, compile=True)

    ours.eval()
    hf.eval()
    runs = {"unitok": run_ours} | ({"unitok compiled": run_compiled} if args.compile_decode else {}) | {"hf": run_hf}
    times = alternate(runs, args.repeats, args.warmup, args.device, label="gpt generate")
    a, b = outputs["unitok"], outputs["hf"]
    if a.shape != (1, args.prompt_len + n) or b.shape != a.shape:
        raise AssertionError(f"generated shapes differ: unitok {tuple(a.shape)}, "
                             f"hf {tuple(b.shape)}")
    same = bool(torch.equal(a.cpu(), b.cpu()))
    if args.compile_decode and not torch.equal(outputs["unitok compiled"].cpu(), a.cpu()):
        raise AssertionError("the compiled decode step generated other tokens than the eager one")
    if not same:
        first = int((a != b).nonzero()[0, 1])
        raise AssertionError(f"greedy outputs differ from position {first}: "
                             f"unitok {a[0, first:].tolist()[:8]}, hf {b[0, first:].tolist()[:8]}")
    return {name: n / statistics.median(t) for name, t in times.items()} | {"same_output": same}


def bench_beam(ours: nn.Module, hf: nn.Module, args: argparse.Namespace) -> dict[str, Any]:
    """Beam search (``--beams``) new tokens/s (median) for both, batch 1, no EOS; the outputs are
    compared (unitok returns the greedy answer where it scores higher than every beam's, so they
    may differ — reported, not an error). "unitok, HF's search" is the same work as Hugging
    Face's (``greedy_floor=False``: W rows, no greedy row); its output must equal theirs."""
    g = torch.Generator().manual_seed(args.seed + 3)
    ids = torch.randint(0, args.vocab_size, (1, args.prompt_len), generator=g).to(args.device)
    n, W = args.new_tokens, args.beams
    outputs: dict[str, Tensor] = {}

    def run_ours() -> None:
        outputs["unitok"] = ours.generate(ids, max_new_tokens=n, strategy="beam", num_beams=W, eos_token_id=None)

    def run_ours_plain() -> None:
        outputs["unitok, HF's search"] = ours.generate(ids, max_new_tokens=n, strategy="beam", num_beams=W,
                                                       eos_token_id=None, greedy_floor=False)

    def run_hf() -> None:
        outputs["hf"] = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                                    num_beams=W, do_sample=False, eos_token_id=None, pad_token_id=0)

    def run_compiled() -> None:
        outputs["unitok compiled"] = ours.generate(ids, max_new_tokens=n, strategy="beam", num_beams=W,
                                                   eos_token_id=None, compile=True)

    runs = {"unitok": run_ours, "unitok, HF's search": run_ours_plain}
    runs |= ({"unitok compiled": run_compiled} if args.compile_decode else {}) | {"hf": run_hf}
    times = alternate(runs, args.repeats, args.warmup, args.device, label="gpt beam search")
    if not torch.equal(outputs["unitok, HF's search"].cpu(), outputs["hf"].cpu()):
        raise AssertionError("beam search without the greedy floor differs from Hugging Face's")
    if args.compile_decode and not torch.equal(outputs["unitok compiled"].cpu(), outputs["unitok"].cpu()):
        raise AssertionError("the compiled beam search found other beams than the eager one")
    same = bool(torch.equal(outputs["unitok"].cpu(), outputs["hf"].cpu()))
    return {name: n / statistics.median(t) for name, t in times.items()} | {"same_output": same}


# --------------------------------------------------------------------------- report
def print_table(rows: list[tuple[str, float, float]]) -> None:
    """metric | unitok | HF | ratio (unitok / HF)."""
    print(f"{'metric':<28}{'unitok':>12}{'HF':>12}{'ratio':>9}")
    for metric, ours, theirs in rows:
        print(f"{metric:<28}{ours:>12.1f}{theirs:>12.1f}{ours / theirs:>8.2f}x")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, print the table and return the figures."""
    args = parse_args(argv)
    prepare_process(args)
    if args.prompt_len + args.new_tokens > args.context_length:
        raise SystemExit("prompt-len + new-tokens exceeds context-length")
    start = time.perf_counter()
    ours, hf = build_models(args)
    n_params = sum(p.numel() for p in ours.parameters())
    print(f"config: D={args.d_model} L={args.n_layers} H={args.n_heads} V={args.vocab_size} "
          f"ctx={args.context_length} ({n_params / 1e6:.2f}M params) | device={args.device} "
          f"threads={torch.get_num_threads()} torch={torch.__version__} precision={args.precision} "
          f"hf_attn={hf_attention_backend(hf)} malloc={args.malloc} repeats={args.repeats} "
          f"compile={args.compile}{'/' + args.compile_mode if args.compile_mode else ''} fused_adamw={args.fused_adamw}"
          + (f" gpu={torch.cuda.get_device_name(torch.device(args.device))}" if args.device.startswith("cuda") else ""))
    result: dict[str, Any] = {"threads": torch.get_num_threads(), "device": args.device}
    rows: list[tuple[str, float, float]] = []
    if not args.skip_train:
        train = bench_train(ours, hf, args)
        result["train"] = train
        print(f"train: batch {args.batch_size}x{args.seq_len}, {args.train_steps} steps/rep; "
              f"initial loss unitok {train['loss_unitok']:.5f} hf {train['loss_hf']:.5f}")
        if "unitok" in train:
            rows.append(("train tokens/s", train["unitok"], train["hf"]))
        rows.append(("  default paths (labels=)", train["unitok default"], train["hf default"]))
        per_token = flops_per_token(ours, args)
        peak = peak_tflops(args)
        train["gflops"] = {k: train[k] * per_token / 1e9 for k in ("unitok", "hf", "unitok default", "hf default")
                           if k in train}
        line = (f"model FLOP/s ({per_token / 1e6:.1f} MFLOP a token, {args.precision}): "
                + (f"unitok {train['gflops']['unitok']:.1f} GFLOP/s, HF {train['gflops']['hf']:.1f} GFLOP/s; "
                   if "unitok" in train else "")
                + f"default paths unitok {train['gflops']['unitok default']:.1f}, "
                f"HF {train['gflops']['hf default']:.1f}")
        if peak is not None:
            train["mfu"] = {k: v / (peak * 1e3) for k, v in train["gflops"].items()}
            line += f"; MFU against {peak:g} TFLOP/s: " + ", ".join(
                f"{k} {100 * v:.1f} %" for k, v in train["mfu"].items())
        print(line)
        if args.profile:
            profile_default_paths(ours, hf, args)
    if not args.skip_infer:
        infer = bench_infer(ours, hf, args)
        result["infer"] = infer
        rows.append(("infer tokens/s (all logits)", infer["unitok"], infer["hf"]))
    if not args.skip_generate:
        gen = bench_generate(ours, hf, args)
        result["generate"] = gen
        print(f"generate: greedy, batch 1, prompt {args.prompt_len}, {args.new_tokens} new tokens; "
              f"identical outputs: {gen['same_output']}")
        rows.append(("generate new tokens/s", gen["unitok"], gen["hf"]))
        if args.compile_decode:
            rows.append(("  compiled decode step", gen["unitok compiled"], gen["hf"]))
        if args.beams > 1:
            beam = bench_beam(ours, hf, args)
            result["beam"] = beam
            print(f"beam search: {args.beams} beams, batch 1, {args.new_tokens} new tokens, no EOS; "
                  f"identical outputs: {beam['same_output']}")
            rows.append((f"beam (W={args.beams}) new tokens/s", beam["unitok"], beam["hf"]))
            rows.append(("  HF's search (same work)", beam["unitok, HF's search"], beam["hf"]))
            if args.compile_decode:
                rows.append(("  compiled decode step", beam["unitok compiled"], beam["hf"]))
    print_table(rows)
    result["seconds"] = time.perf_counter() - start
    print(f"({result['seconds']:.0f} s)")
    return result


if __name__ == "__main__":
    main()
