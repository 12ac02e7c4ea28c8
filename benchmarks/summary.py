"""Every family against its reference in one table (the end of ``make bench``).

Runs each side-by-side benchmark in this process at its default config (one torch thread
unless ``--threads`` says otherwise), then prints one row per family: the speed ratio
unitok / reference (> 1: unitok faster) for training, inference and generation, and the
peak-memory ratio of the training step (< 1: unitok needs less). The README copies it.

Run::

    python benchmarks/summary.py --threads 1
    python benchmarks/summary.py --only gpt vision --device cuda
    python benchmarks/summary.py --only gpt vision --precision bf16   # both sides under bf16 autocast
"""

from __future__ import annotations

import argparse
import importlib
import math
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: find the benchmarks
import timing  # noqa: E402

BENCHMARKS = ("gpt", "bert", "t5", "vision", "clip", "conformer", "dt")
MODULES = {"gpt": "gpt_vs_hf", "bert": "bert_vs_hf", "t5": "t5_vs_hf", "vision": "vision_vs_timm",
           "clip": "clip_vs_open_clip", "conformer": "conformer_vs_torchaudio", "dt": "dt_vs_hf"}


def ratio(pair: dict[str, float] | None, reference: str) -> float:
    if not pair:
        return math.nan
    return pair["unitok"] / pair[reference]


def rows_of(name: str, result: dict[str, Any]) -> list[tuple[str, float, float, float, str]]:
    """(family, train, infer, generate, memory label) speed ratios of one benchmark's result."""
    nan = math.nan
    if name == "gpt":
        train = result.get("train") or {}
        default = {"unitok": train["unitok default"], "hf": train["hf default"]} if train else None
        return [("GPT", ratio(train, "hf"), ratio(result.get("infer"), "hf"), ratio(result.get("generate"), "hf"),
                 "gpt train"),
                ("GPT, `labels=` paths (LM head fused with the loss)", ratio(default, "hf"), nan, nan,
                 "gpt train, default paths (labels=)"),
                ("GPT, beam search (W=4)", nan, nan, ratio(result.get("beam"), "hf"), "gpt beam search")]
    if name == "bert":
        return [("BERT", ratio(result.get("train"), "hf"), ratio(result.get("infer"), "hf"), nan, "bert train")]
    if name == "t5":
        return [("T5", ratio(result.get("train"), "hf"), ratio(result.get("infer"), "hf"), ratio(result.get("beam"), "hf"),
                 "t5 train"),
                ("T5, `labels=` paths (LM head fused with the loss)", ratio(result.get("train_default"), "hf"), nan,
                 nan, "t5 train, default paths (labels=)")]
    if name == "vision":
        return [({"vit": "ViT", "deit": "DeiT", "mixer": "MLP-Mixer"}[k], ratio(v.get("train"), "timm"),
                 ratio(v.get("infer"), "timm"), nan, f"{k} train")
                for k, v in result.items() if isinstance(v, dict) and "check" in v]
    if name == "clip":
        zero_shot = result.get("zero_shot")  # seconds to build the classifier: lower is better
        infer = zero_shot["open_clip"] / zero_shot["unitok"] if zero_shot else nan
        return [("CLIP", ratio(result.get("train"), "open_clip"), infer, nan, "clip train"),
                ("CLIP, all 77 text positions", ratio(result.get("train_equal_work"), "open_clip"), nan, nan,
                 "clip train, all 77 positions"),
                ("CLIP, image embeddings", nan, ratio(result.get("encode_images"), "open_clip"), nan, "")]
    if name == "conformer":
        return [("Conformer", result["unitok"] / result["torchaudio"], ratio(result.get("infer"), "torchaudio"), nan,
                 "conformer train")]
    if name == "dt":
        return [("Decision Transformer", result["ratio"], ratio(result.get("infer"), "hf"), nan, "dt train")]
    raise ValueError(f"unknown benchmark {name!r}")


def fmt(value: float) -> str:
    return "—" if math.isnan(value) else f"{value:.2f}×"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", nargs="+", choices=BENCHMARKS, default=list(BENCHMARKS))
    p.add_argument("--threads", type=timing.positive_int, default=1)
    p.add_argument("--device", type=timing.device_name, default="cpu")
    timing.add_side_by_side_options(p)
    args = p.parse_args(argv)
    start = time.perf_counter()
    rows = []
    for name in args.only:
        print(f"\n=== {name} ({MODULES[name]})")
        options = ["--threads", str(args.threads), "--precision", args.precision, "--device", args.device,
                   "--malloc", args.malloc]
        result = importlib.import_module(MODULES[name]).main(options)
        rows += rows_of(name, result)
    print(f"\nunitok / reference, {args.device}, {args.precision}, {args.threads} thread(s), malloc {args.malloc}; speed ratios > 1: "
          "unitok faster; memory ratio < 1: unitok needs less")
    print("| family | train | infer | generate | train peak memory |\n|---|---|---|---|---|")
    for family, train, infer, generate, label in rows:
        peaks = timing.MEMORY.get(label, {})
        values = list(peaks.values())
        memory = values[0] / values[-1] if len(values) > 1 and values[-1] else math.nan
        print(f"| {family} | {fmt(train)} | {fmt(infer)} | {fmt(generate)} | {fmt(memory)} |")
    print(f"({(time.perf_counter() - start) / 60:.1f} min)")


if __name__ == "__main__":
    main()
