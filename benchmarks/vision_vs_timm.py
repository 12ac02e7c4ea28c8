"""Throughput of unitok's ViT, DeiT and MLP-Mixer against timm at the same configs.

What it measures, in one process and with identical weights (each timm model is built with
random weights and converted with ``unitok.convert.from_timm``):

1. Training: images/s of forward + cross-entropy + backward + AdamW step on a batch of random
   normalised images. DeiT trains both heads, as hard distillation does:
   CE(class head, labels) / 2 + CE(distillation head, teacher labels) / 2 (random labels
   stand in for the teacher's); timm's model runs with ``set_distilled_training(True)`` so
   it returns both heads too.
   On the CPU a third row, "fused AdamW", steps unitok's side with PyTorch's fused AdamW, as its
   tasks do, against timm's side as timm's optimizer factory builds it (``torch.optim.AdamW``,
   ``foreach`` left to PyTorch: its single-tensor loop on a CPU): each library's default path.
2. Inference: images/s of a ``no_grad`` forward in eval mode.

unitok's ViT and DeiT run as its tasks and pipelines run them: the last block computes the
class (and distillation) tokens alone (``class_tokens_only``: the same logits, a layer's worth
of patch-token work saved); the plain forward over every token is a second row ("all tokens").

Before timing, each pair is checked to be the same function: eval-mode logits equal within
``--atol`` (and, for training, the same first loss).

Repetitions alternate between the two libraries (unitok, timm, timm, unitok, ...) so slow
drifts of the machine hit both alike; the table reports the median of the repetitions and the
ratio unitok / timm (> 1 means unitok is faster).

Run::

    python benchmarks/vision_vs_timm.py
    python benchmarks/vision_vs_timm.py --threads 1 --repeats 5
    python benchmarks/vision_vs_timm.py --img-size 64 --patch-size 8 --batch-size 32
    python benchmarks/vision_vs_timm.py --device cuda --batch-size 64 --depth 12

Needs ``timm`` (the ``dev`` extra).
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
    sync,
)

MODELS = ("vit", "deit", "mixer")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (defaults: ViT-Tiny / DeiT-Tiny / Mixer-S widths, 4 blocks, 224 px)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    p.add_argument("--img-size", type=int, default=224)
    p.add_argument("--patch-size", type=int, default=16)
    p.add_argument("--channels", type=int, default=3)
    p.add_argument("--num-classes", type=int, default=1000)
    p.add_argument("--depth", type=int, default=4, help="blocks in every model")
    p.add_argument("--vit-dim", type=int, default=192, help="ViT / DeiT width (192: Tiny)")
    p.add_argument("--vit-heads", type=int, default=3)
    p.add_argument("--mixer-dim", type=int, default=512, help="MLP-Mixer width (512: S/16)")
    p.add_argument("--batch-size", type=positive_int, default=8)
    p.add_argument("--train-steps", type=positive_int, default=2, help="optimizer steps per repetition")
    p.add_argument("--infer-batches", type=positive_int, default=2, help="forward passes per repetition")
    p.add_argument("--repeats", type=positive_int, default=5, help="timed repetitions per library")
    p.add_argument("--warmup", type=non_negative_int, default=1, help="untimed repetitions per library")
    p.add_argument("--threads", type=positive_int, default=None,
                   help="torch.set_num_threads (default: torch's choice)")
    p.add_argument("--device", type=device_name, default="cpu", help="cpu or cuda")
    add_side_by_side_options(p)
    p.add_argument("--atol", type=float, default=1e-4, help="tolerance of the equal-output check")
    p.add_argument("--profile", type=non_negative_int, default=0, metavar="ROWS",
                   help="after timing, profile a training and an inference repetition of unitok's default path "
                        "and timm's: wall, device busy time and kernels, then the ROWS busiest operators by device "
                        "and by host time (0: none)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip-train", action="store_true")
    p.add_argument("--skip-infer", action="store_true")
    return p.parse_args(argv)


# --------------------------------------------------------------------------- models
def build_timm(kind: str, args: argparse.Namespace) -> nn.Module:
    """A randomly initialised timm model of ``kind`` (vit / deit / mixer), dropout off."""
    from timm.models.deit import VisionTransformerDistilled
    from timm.models.mlp_mixer import MlpMixer
    from timm.models.vision_transformer import VisionTransformer

    common = dict(img_size=args.img_size, patch_size=args.patch_size, in_chans=args.channels,
                  num_classes=args.num_classes)
    if kind == "vit":
        return VisionTransformer(embed_dim=args.vit_dim, depth=args.depth, num_heads=args.vit_heads,
                                 **common)
    if kind == "deit":
        return VisionTransformerDistilled(embed_dim=args.vit_dim, depth=args.depth,
                                          num_heads=args.vit_heads, **common)
    if kind == "mixer":
        return MlpMixer(embed_dim=args.mixer_dim, num_blocks=args.depth, **common)
    raise ValueError(f"unknown model kind {kind!r}; expected one of {MODELS}")


def build_models(kind: str, args: argparse.Namespace) -> tuple[nn.Module, nn.Module]:
    """(unitok model, timm model) with the same random weights, in eval mode, on the device."""
    from unitok.convert import from_timm

    torch.manual_seed(args.seed)
    theirs = build_timm(kind, args).eval()
    # timm zero-initialises some heads (MLP-Mixer's): random ones make the equality check mean something.
    for name in ("head", "head_dist"):
        head = getattr(theirs, name, None)
        if isinstance(head, nn.Linear):
            nn.init.normal_(head.weight, std=0.02)
            nn.init.normal_(head.bias, std=0.02)
    ours = from_timm(theirs).eval()
    return ours.to(args.device), theirs.to(args.device)


def logits_of(output: Any) -> Tensor:
    """unitok returns an output object, timm a tensor."""
    return output if isinstance(output, Tensor) else output.logits


# --------------------------------------------------------------------------- workloads
def make_batch(args: argparse.Namespace) -> tuple[Tensor, Tensor, Tensor]:
    """Random normalised images, labels and stand-in teacher labels."""
    g = torch.Generator().manual_seed(args.seed + 1)
    shape = (args.batch_size, args.channels, args.img_size, args.img_size)
    images = torch.randn(shape, generator=g)
    labels = torch.randint(0, args.num_classes, (args.batch_size,), generator=g)
    teacher = torch.randint(0, args.num_classes, (args.batch_size,), generator=g)
    return images.to(args.device), labels.to(args.device), teacher.to(args.device)


def train_loss(model: nn.Module, kind: str, images: Tensor, labels: Tensor, teacher: Tensor) -> Tensor:
    """Cross-entropy; for DeiT the hard-distillation loss over both heads."""
    out = model(images)
    if kind != "deit":
        return F.cross_entropy(logits_of(out), labels)
    cls, dist = out if isinstance(out, tuple) else (out.logits_cls, out.logits_dist)
    return F.cross_entropy(cls, labels) / 2 + F.cross_entropy(dist, teacher) / 2


def prepare_for_training(model: nn.Module, kind: str) -> nn.Module:
    """A training-mode copy; timm's DeiT set to return both heads."""
    model = copy.deepcopy(model).train()
    if kind == "deit" and hasattr(model, "set_distilled_training"):
        model.set_distilled_training(True)
    return model


def make_train_step(model: nn.Module, kind: str, batch: tuple[Tensor, Tensor, Tensor],
                    steps: int, amp: Callable[[], AbstractContextManager] = nullcontext,
                    fused: bool | None = None) -> Callable[[], float]:
    """A closure running ``steps`` AdamW steps on ``model`` (own optimizer; ``fused``: PyTorch's
    fused kernel, as unitok's tasks step); returns the loss."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused)

    def run() -> float:
        loss = torch.zeros(())
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            with amp():
                loss = train_loss(model, kind, *batch)
            loss.backward()
            opt.step()
        return float(loss.detach())

    return run


def check_same(ours: nn.Module, theirs: nn.Module, kind: str, args: argparse.Namespace,
               batch: tuple[Tensor, Tensor, Tensor]) -> dict[str, float]:
    """Max |logit difference| in eval mode and the first training loss of both; raises if they differ."""
    with torch.no_grad():
        a, b = logits_of(ours(batch[0])), logits_of(theirs(batch[0]))
        fast = logits_of(sides(ours, theirs)["unitok"](batch[0]))  # the class-token path, where there is one
        diff = max(float((a - b).abs().max()), float((fast - b).abs().max()))
        loss_ours = float(train_loss(prepare_for_training(ours, kind), kind, *batch))
        loss_theirs = float(train_loss(prepare_for_training(theirs, kind), kind, *batch))
    if a.shape != b.shape or diff > args.atol or abs(loss_ours - loss_theirs) > args.atol:
        raise AssertionError(f"{kind}: unitok and timm differ: logits {tuple(a.shape)} vs {tuple(b.shape)}, "
                             f"max |diff| {diff:.2e}; loss {loss_ours:.6f} vs {loss_theirs:.6f}")
    return {"max_abs_diff": diff, "loss_unitok": loss_ours, "loss_timm": loss_theirs}


class ClassTokensOnly(nn.Module):
    """unitok's ViT / DeiT as its tasks and pipelines run it: the last block computes the class
    (and distillation) tokens alone (``class_tokens_only``; the same logits)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, images: Tensor) -> Any:
        return self.model(images, class_tokens_only=True)


def sides(ours: nn.Module, theirs: nn.Module) -> dict[str, nn.Module]:
    """unitok's default path ("unitok": the class-token path where the model has one, else the
    plain forward), the plain forward over every token ("unitok_all_tokens"), and timm."""
    if getattr(ours, "reads_class_tokens", False):
        return {"unitok": ClassTokensOnly(ours), "unitok_all_tokens": ours, "timm": theirs}
    return {"unitok": ours, "timm": theirs}


def bench_train(ours: nn.Module, theirs: nn.Module, kind: str, args: argparse.Namespace,
                batch: tuple[Tensor, Tensor, Tensor]) -> dict[str, float]:
    """Training images/s (median over repetitions) for each side, on training copies."""
    amp = functools.partial(autocast, args.device, args.precision)
    models = sides(ours, theirs)
    runs = {name: make_train_step(prepare_for_training(model, kind), kind, batch, args.train_steps, amp)
            for name, model in models.items()}
    if args.device == "cpu":  # unitok's tasks step PyTorch's fused AdamW; timm's (torch.optim.AdamW,
        # foreach left to PyTorch) runs its single-tensor loop on the CPU: each library's default
        runs["unitok_fused_adamw"] = make_train_step(prepare_for_training(models["unitok"], kind), kind, batch,
                                                     args.train_steps, amp, fused=True)
    times = alternate(runs, args.repeats, args.warmup, args.device, label=f"{kind} train")
    images = args.batch_size * args.train_steps
    return {name: images / statistics.median(t) for name, t in times.items()}


def bench_infer(ours: nn.Module, theirs: nn.Module, args: argparse.Namespace,
                images: Tensor, kind: str = "vision") -> dict[str, float]:
    """Inference images/s (median over repetitions): eval mode, no_grad forward."""

    def make(model: nn.Module) -> Callable[[], None]:
        model.eval()

        @torch.no_grad()
        def run() -> None:
            for _ in range(args.infer_batches):
                model(images)

        return run

    times = alternate({name: make(model) for name, model in sides(ours, theirs).items()}, args.repeats,
                      args.warmup, args.device, label=f"{kind} infer")
    n = args.batch_size * args.infer_batches
    return {name: n / statistics.median(t) for name, t in times.items()}


def profile_sides(ours: nn.Module, theirs: nn.Module, kind: str, args: argparse.Namespace,
                  batch: tuple[Tensor, Tensor, Tensor]) -> None:
    """Where a repetition of each side goes (torch.profiler): its wall time, the device's busy
    time and kernel count (a small batch on a GPU is bound by the host launching kernels), and
    the ``--profile`` busiest operators (by device time on a GPU, then by host time)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = args.device.startswith("cuda")
    amp = functools.partial(autocast, args.device, args.precision)
    for name, model in sides(ours, theirs).items():
        if name == "unitok_all_tokens":
            continue
        train = make_train_step(prepare_for_training(model, kind), kind, batch, args.train_steps, amp)
        model.eval()

        @torch.no_grad()
        def infer(model: nn.Module = model) -> None:
            for _ in range(args.infer_batches):
                model(batch[0])

        for mode, run in (("train", train), ("infer", infer)):
            run()  # warm-up
            sync(args.device)
            with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
                start = time.perf_counter()
                run()
                sync(args.device)
                wall = time.perf_counter() - start
            events = prof.key_averages()
            kernels = [e for e in events if e.device_type.name == "CUDA" and not e.is_user_annotation]
            busy = sum(e.self_device_time_total for e in kernels) / 1e6
            print(f"profile, {kind} {mode}, {name}: {1e3 * wall:.2f} ms under the profiler"
                  + (f", device busy {1e3 * busy:.2f} ms, {sum(e.count for e in kernels)} kernels" if cuda else ""))
            for key in ("self_device_time_total", "self_cpu_time_total") if cuda else ("self_cpu_time_total",):
                print(events.table(sort_by=key, row_limit=args.profile, max_name_column_width=50))


# --------------------------------------------------------------------------- report
def print_table(rows: list[tuple[str, str, float, float]]) -> None:
    """model | metric | unitok | timm | ratio (unitok / timm)."""
    print(f"{'model':<8}{'metric':<18}{'unitok':>10}{'timm':>10}{'ratio':>9}")
    for model, metric, ours, theirs in rows:
        print(f"{model:<8}{metric:<18}{ours:>10.1f}{theirs:>10.1f}{ours / theirs:>8.2f}x")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, print the table and return the figures."""
    args = parse_args(argv)
    prepare_process(args)
    if args.img_size % args.patch_size:
        raise SystemExit("--img-size must be divisible by --patch-size")
    import timm

    start = time.perf_counter()
    grid = args.img_size // args.patch_size
    print(f"images {args.batch_size}x{args.channels}x{args.img_size}x{args.img_size}, patch "
          f"{args.patch_size} ({grid * grid} patches), depth {args.depth} | device={args.device} "
          f"threads={torch.get_num_threads()} torch={torch.__version__} timm={timm.__version__} "
          f"precision={args.precision} "
          f"repeats={args.repeats}")
    result: dict[str, Any] = {"threads": torch.get_num_threads(), "device": args.device}
    rows: list[tuple[str, str, float, float]] = []
    batch = make_batch(args)
    for kind in args.models:
        ours, theirs = build_models(kind, args)
        n_params = sum(p.numel() for p in ours.parameters())
        same = check_same(ours, theirs, kind, args, batch)
        print(f"{kind}: {type(theirs).__name__} -> {type(ours).__name__}, {n_params / 1e6:.2f}M params; "
              f"same outputs: max |logit diff| {same['max_abs_diff']:.1e} (atol {args.atol:g}), "
              f"first loss unitok {same['loss_unitok']:.5f} timm {same['loss_timm']:.5f}")
        result[kind] = {"check": same, "params": n_params}
        if not args.skip_train:
            train = bench_train(ours, theirs, kind, args, batch)
            result[kind]["train"] = train
            rows.append((kind, "train images/s", train["unitok"], train["timm"]))
            if "unitok_all_tokens" in train:
                rows.append((kind, "  all tokens", train["unitok_all_tokens"], train["timm"]))
            if "unitok_fused_adamw" in train:
                rows.append((kind, "  fused AdamW", train["unitok_fused_adamw"], train["timm"]))
        if not args.skip_infer:
            infer = bench_infer(ours, theirs, args, batch[0], kind)
            result[kind]["infer"] = infer
            rows.append((kind, "infer images/s", infer["unitok"], infer["timm"]))
            if "unitok_all_tokens" in infer:
                rows.append((kind, "  all tokens", infer["unitok_all_tokens"], infer["timm"]))
        if args.profile:
            profile_sides(ours, theirs, kind, args, batch)
    print_table(rows)
    result["seconds"] = time.perf_counter() - start
    print(f"({result['seconds']:.0f} s)")
    return result


if __name__ == "__main__":
    main()
