"""Throughput of unitok's CLIP against open_clip at the same config, with identical weights.

What it measures, in one process (the open_clip model is built with random weights and
converted with ``unitok.convert.from_open_clip``; both are checked to give the same
embeddings first):

1. Training: image–caption pairs/s of both towers forward + symmetric InfoNCE + backward +
   AdamW step, on a batch of random images and real captions (ImageNet class prompts).
   open_clip trains with its own ``ClipLoss``, unitok with ``tasks.contrastive_loss``.
2. Zero-shot: seconds to build a classifier for ``--classes`` ImageNet class names × the
   ``--templates`` OpenAI prompt templates (1,000 × 80 = 80,000 prompts by default):
   open_clip's ``build_zero_shot_classifier`` vs unitok's ``ZeroShotClassifier``, both
   tokenizing with CLIP's BPE.
3. Image embeddings: images/s of ``encode_image`` on the training batch, eval mode, ``no_grad``
   (what zero-shot classification and retrieval run for every image).

unitok's text tower stops at the longest end-of-text token of each batch (causal attention
makes the padding behind it irrelevant); open_clip always runs the full 77-token context.
Repetitions alternate between the libraries; the table reports medians and the ratio
unitok / open_clip (> 1 means unitok is faster).

Run::

    python benchmarks/clip_vs_open_clip.py --threads 1
    python benchmarks/clip_vs_open_clip.py --classes 100 --templates 10 --repeats 3
    python benchmarks/clip_vs_open_clip.py --model ViT-B-32 --device cuda --batch-size 128

The default is a CPU-sized model (``--width 128 --layers 4``, 64 px images, patch 16); ``--model
ViT-B-32`` uses open_clip's config of that name (random weights).
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
    timed,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default=None, help="an open_clip config name (e.g. ViT-B-32); default: small custom")
    p.add_argument("--width", type=int, default=128, help="tower width of the custom model")
    p.add_argument("--layers", type=int, default=4, help="layers per tower of the custom model")
    p.add_argument("--img-size", type=int, default=64)
    p.add_argument("--patch-size", type=int, default=16)
    p.add_argument("--batch-size", type=positive_int, default=32)
    p.add_argument("--train-steps", type=positive_int, default=2, help="optimizer steps per repetition")
    p.add_argument("--classes", type=positive_int, default=1000, help="ImageNet classes in the zero-shot classifier")
    p.add_argument("--templates", type=positive_int, default=80, help="OpenAI ImageNet templates per class")
    p.add_argument("--text-batch", type=positive_int, default=1000, help="prompts per text forward when building")
    p.add_argument("--repeats", type=positive_int, default=3)
    p.add_argument("--zero-shot-repeats", type=positive_int, default=1)
    p.add_argument("--warmup", type=non_negative_int, default=1)
    p.add_argument("--threads", type=positive_int, default=None, help="torch.set_num_threads (default: torch's choice)")
    p.add_argument("--device", type=device_name, default="cpu")
    add_side_by_side_options(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip-train", action="store_true")
    p.add_argument("--skip-zero-shot", action="store_true")
    return p.parse_args(argv)


def build_models(args: argparse.Namespace) -> tuple[nn.Module, nn.Module]:
    """(unitok CLIP, open_clip CLIP) with the same random weights, on the device."""
    import open_clip
    from open_clip.model import CLIP as OpenCLIP
    from open_clip.model import CLIPTextCfg, CLIPVisionCfg

    from unitok.convert import from_open_clip

    torch.manual_seed(args.seed)
    if args.model:
        theirs = open_clip.create_model(args.model, pretrained=None)
    else:
        heads = max(1, args.width // 64)
        theirs = OpenCLIP(embed_dim=args.width,
                          vision_cfg=CLIPVisionCfg(layers=args.layers, width=args.width, head_width=args.width // heads,
                                                   patch_size=args.patch_size, image_size=args.img_size),
                          text_cfg=CLIPTextCfg(width=args.width, heads=heads, layers=args.layers))
    theirs.eval()
    ours = from_open_clip(theirs).eval()
    return ours.to(args.device), theirs.to(args.device)


def prompts(args: argparse.Namespace) -> tuple[list[str], list[Callable[[str], str]]]:
    from open_clip.zero_shot_metadata import IMAGENET_CLASSNAMES, OPENAI_IMAGENET_TEMPLATES

    return list(IMAGENET_CLASSNAMES[: args.classes]), list(OPENAI_IMAGENET_TEMPLATES[: args.templates])


def check_same(ours: nn.Module, theirs: nn.Module, images: torch.Tensor, ids: torch.Tensor) -> float:
    with torch.no_grad():
        diff = max(float((ours.encode_image(images) - theirs.encode_image(images)).abs().max()),
                   float((ours.encode_text(ids) - theirs.encode_text(ids)).abs().max()))
    if diff > 1e-4:
        raise AssertionError(f"unitok and open_clip embeddings differ by {diff:.2e}")
    return diff


def make_train_step(model: nn.Module, loss_fn: Callable, images: torch.Tensor, ids: torch.Tensor,
                    steps: int, amp: Callable[[], AbstractContextManager] = nullcontext) -> Callable[[], float]:
    model = copy.deepcopy(model).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def run() -> float:
        loss = torch.zeros(())
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            with amp():
                loss = loss_fn(model, images, ids)
            loss.backward()
            opt.step()
        return float(loss.detach())

    return run


def bench_train(ours: nn.Module, theirs: nn.Module, args: argparse.Namespace, images, ids,
                label: str = "clip train") -> dict[str, float]:
    from open_clip.loss import ClipLoss

    from tasks.contrastive import contrastive_loss

    clip_loss = ClipLoss()

    def open_clip_loss(model, x, t):
        return clip_loss(model.encode_image(x, normalize=True), model.encode_text(t, normalize=True),
                         model.logit_scale.exp())

    def unitok_loss(model, x, t):
        return contrastive_loss(model.encode_image(x), model.encode_text(t), model.logit_scale)

    with torch.no_grad():
        a, b = unitok_loss(ours, images, ids), open_clip_loss(theirs, images, ids)
    if abs(float(a) - float(b)) > 1e-4:
        raise AssertionError(f"losses differ: {float(a)} vs {float(b)}")
    amp = functools.partial(autocast, args.device, args.precision)
    runs = {"unitok": make_train_step(ours, unitok_loss, images, ids, args.train_steps, amp),
            "open_clip": make_train_step(theirs, open_clip_loss, images, ids, args.train_steps, amp)}
    times = alternate(runs, args.repeats, args.warmup, args.device, label=label)
    pairs = args.batch_size * args.train_steps
    return {name: pairs / statistics.median(t) for name, t in times.items()}


def bench_zero_shot(ours: nn.Module, theirs: nn.Module, args: argparse.Namespace) -> dict[str, float]:
    import open_clip
    from open_clip.zero_shot_classifier import build_zero_shot_classifier

    from unitok.zero_shot import ZeroShotClassifier

    classnames, templates = prompts(args)
    tokenizer = open_clip.get_tokenizer("ViT-B-32")
    per_batch = max(1, args.text_batch // len(templates))  # open_clip batches by classes
    results: dict[str, Any] = {}

    def build_theirs() -> None:
        results["open_clip"] = build_zero_shot_classifier(theirs, tokenizer, classnames, templates,
                                                          num_classes_per_batch=per_batch, device=args.device)

    def build_ours() -> None:
        clf = ZeroShotClassifier(ours, classnames, templates, batch_size=per_batch * len(templates))
        results["unitok"] = clf.class_embeddings

    build_ours(), build_theirs()  # warm the BPE caches of both and check the results agree
    diff = float((results["unitok"] - results["open_clip"].T).abs().max())
    if diff > 1e-4:
        raise AssertionError(f"zero-shot class embeddings differ by {diff:.2e}")
    times: dict[str, list[float]] = {"unitok": [], "open_clip": []}
    for r in range(args.zero_shot_repeats):
        order = [("unitok", build_ours), ("open_clip", build_theirs)]
        for name, fn in order if r % 2 == 0 else reversed(order):
            times[name].append(timed(fn, args.device))
    return {name: statistics.median(t) for name, t in times.items()}


def bench_encode_images(ours: nn.Module, theirs: nn.Module, args: argparse.Namespace,
                        images: torch.Tensor) -> dict[str, float]:
    """Image embeddings/s (median): both models' ``encode_image``, eval mode, ``no_grad``."""
    runs = {"unitok": torch.no_grad()(lambda: ours.encode_image(images)),
            "open_clip": torch.no_grad()(lambda: theirs.encode_image(images))}
    times = alternate(runs, args.repeats, args.warmup, args.device, label="clip encode images")
    return {name: len(images) / statistics.median(t) for name, t in times.items()}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    prepare_process(args)
    import open_clip

    start = time.perf_counter()
    ours, theirs = build_models(args)
    size = ours.config.vision.image_size
    g = torch.Generator().manual_seed(args.seed + 1)
    images = torch.randn(args.batch_size, 3, *size, generator=g).to(args.device)
    classnames, templates = prompts(args)
    captions = [templates[i % len(templates)](classnames[i % len(classnames)]) for i in range(args.batch_size)]
    ids = open_clip.tokenize(captions).to(args.device)
    diff = check_same(ours, theirs, images, ids)
    n_params = sum(p.numel() for p in ours.parameters())
    print(f"{args.model or 'custom'} CLIP, {n_params / 1e6:.1f}M params, images {args.batch_size}x3x{size[0]}x{size[1]}, "
          f"max |embedding diff| {diff:.1e} | device={args.device} threads={torch.get_num_threads()} "
          f"torch={torch.__version__} open_clip={open_clip.__version__}")
    rows = []
    result: dict[str, Any] = {}
    if not args.skip_train:
        train = bench_train(ours, theirs, args, images, ids)
        rows.append(("training pairs/s", train["unitok"], train["open_clip"], train["unitok"] / train["open_clip"]))
        result["train"] = train
        # Equal work: one caption fills the whole context (open_clip.tokenize truncates it with
        # the end token last), so unitok, which skips the padding behind the last end token,
        # runs all 77 positions as open_clip always does.
        full = ids.clone()
        full[0] = open_clip.tokenize([" ".join(["digit"] * 200)])[0].to(args.device)
        equal = bench_train(ours, theirs, args, images, full, label="clip train, all 77 positions")
        rows.append(("training pairs/s, 77 positions", equal["unitok"], equal["open_clip"],
                     equal["unitok"] / equal["open_clip"]))
        result["train_equal_work"] = equal
    encode = bench_encode_images(ours.eval(), theirs.eval(), args, images)
    rows.append(("image embeddings/s", encode["unitok"], encode["open_clip"], encode["unitok"] / encode["open_clip"]))
    result["encode_images"] = encode
    if not args.skip_zero_shot:
        zs = bench_zero_shot(ours, theirs, args)
        label = f"zero-shot build s ({len(classnames)}x{len(templates)})"
        rows.append((label, zs["unitok"], zs["open_clip"], zs["open_clip"] / zs["unitok"]))
        result["zero_shot"] = zs
    print(f"{'metric':<34}{'unitok':>10}{'open_clip':>11}{'ratio':>9}")
    for metric, a, b, ratio in rows:
        print(f"{metric:<34}{a:>10.2f}{b:>11.2f}{ratio:>8.2f}x")
    print(f"(ratio > 1: unitok faster; {time.perf_counter() - start:.0f} s in all)")
    return result


if __name__ == "__main__":
    main()
