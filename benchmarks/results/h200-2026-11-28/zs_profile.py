"""Where CLIP's zero-shot build spends its time, unitok against open_clip, at clip_vs_open_clip's
config (the H200 lease of 2026-11-28 ran it; its output is zs_profile.log beside this file).

Run from the repository root::

    python benchmarks/results/h200-2026-11-28/zs_profile.py cuda   # or cpu [--width 32 --layers 1]
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time
from collections.abc import Callable

import torch

sys.path.insert(0, "benchmarks")
import clip_vs_open_clip as bench  # noqa: E402
from timing import prepare_process  # noqa: E402


def main() -> None:
    import open_clip
    from open_clip.zero_shot_classifier import build_zero_shot_classifier

    from unitok.zero_shot import ZeroShotClassifier

    device = sys.argv[1] if len(sys.argv) > 1 else "cuda"
    args = bench.parse_args(["--device", device, "--threads", "4", "--skip-train", *sys.argv[2:]])
    prepare_process(args)
    ours, theirs = bench.build_models(args)
    classnames, templates = bench.prompts(args)
    their_tokenizer = open_clip.get_tokenizer("ViT-B-32")
    per_batch = max(1, args.text_batch // len(templates))
    classifier = ZeroShotClassifier(ours, classnames, templates, batch_size=per_batch * len(templates))
    texts = [t for group in classifier.prompts for t in group]
    starts = range(0, len(texts), classifier.batch_size)
    our_tokenizer = ours.text_tokenizer()
    our_ids = [our_tokenizer(texts[s : s + classifier.batch_size]).to(device) for s in starts]
    their_ids = [their_tokenizer(texts[s : s + classifier.batch_size]).to(device) for s in starts]

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    @torch.no_grad()
    def encode(model: torch.nn.Module, batches: list[torch.Tensor]) -> None:
        for ids in batches:
            model.encode_text(ids)

    runs: dict[str, Callable[[], object]] = {
        "ours_build": lambda: ZeroShotClassifier(ours, classnames, templates,
                                                 batch_size=per_batch * len(templates)).class_embeddings,
        "theirs_build": lambda: build_zero_shot_classifier(theirs, their_tokenizer, classnames, templates,
                                                           num_classes_per_batch=per_batch, device=device),
        "ours_tok": lambda: [our_tokenizer(texts[s : s + classifier.batch_size]) for s in starts],
        "ours_tok_to": lambda: [our_tokenizer(texts[s : s + classifier.batch_size]).to(device) for s in starts],
        "theirs_tok": lambda: [their_tokenizer(texts[s : s + classifier.batch_size]) for s in starts],
        "ours_encode_only": lambda: encode(ours, our_ids),
        "theirs_encode_only": lambda: encode(theirs, their_ids),
    }
    print("ids shapes unitok", [tuple(i.shape) for i in our_ids[:3]], "open_clip", tuple(their_ids[0].shape))
    for run in runs.values():  # warm-up: BPE caches, kernels
        run()
        sync()
    for rep in range(2):
        for name, run in runs.items():
            sync()
            start = time.perf_counter()
            run()
            sync()
            print(f"rep {rep} {name:20s} {time.perf_counter() - start:7.3f} s", flush=True)
    for name in ("ours_build", "theirs_build"):
        profile = cProfile.Profile()
        profile.enable()
        runs[name]()
        sync()
        profile.disable()
        print("=== cProfile", name)
        pstats.Stats(profile).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
