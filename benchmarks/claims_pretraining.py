"""Claim (a): pretraining on unlabelled text helps fine-tuning with few labels — BERT-style
(masked LM + next-sentence prediction, then a classifier on [CLS]) and GPT-1-style (causal LM,
then a classifier on the last token).

The task (`tasks.DocstringDataModule`): which standard-library package — asyncio, email,
logging or tkinter — a docstring comes from; 16 labelled docstrings a class for training, 25
for validation, 100 for test, drawn afresh for each seed, no text in two splits (repeats of a
docstring, whitespace, case and punctuation aside, are dropped). The pretraining corpus covers
the domain but not its labels: the four packages' source first, then the rest of the standard
library up to 2 MB, with every docstring that holds one of the packages' labelled docstrings
(all of them, not only those drawn for a seed) cut out (`held_out_docstrings`).

One seed: pretrain (seeded) at a fixed small budget, then fine-tune the pretrained export and
the same shape from random initialisation with the same recipe — same steps, learning rate
and schedule, same tokenizer (the export's) — and score both on the test docstrings.

- a-mlm: `configs/bert/mlm_tiny.yaml` (bert-nano: 2 layers × 64, WordPiece 1,024) as shipped,
  then `configs/bert/finetune_cls.yaml`.
- a-lm: `configs/gpt/tiny.yaml` at bert-nano's size (gpt-nano, byte-level BPE 1,024, 64-token
  windows), then `configs/gpt/finetune_cls.yaml` (GPT-1: a linear classifier on the last real
  token's state; no auxiliary LM loss).

Run alone (or through ``benchmarks/claims.py --claims a``)::

    python benchmarks/claims_pretraining.py --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: find claim.py
from claim import Claim, finite, fit_recipe, mean_std, verdict  # noqa: E402

MLM_STEPS = 2000  # bert/mlm_tiny as shipped
LM_STEPS = 1500
# GPT-1-style at the BERT claim's size (gpt/tiny ships gpt-micro with 4,096 tokens for its samples)
LM_SHAPE = ["--model.preset", "gpt-nano", "--data.context_length", "64", "--data.vocab_size", "1024"]


def pretrain_then_fine_tune(seed: int, pretrain: str, pretrain_overrides: list[str], steps: int, finetune: str,
                            finetune_overrides: list[str], report: dict[str, str]) -> dict[str, float]:
    """Pretrain ``pretrain`` for ``steps`` (seed ``seed``), then fine-tune ``finetune`` from its
    export ("pretrained") and from scratch ("scratch") -> test accuracies (%) and the
    pretraining's validation numbers named in ``report`` ({metric: name})."""
    with tempfile.TemporaryDirectory(prefix="claim-a-") as folder:
        root = Path(folder)
        cli, pre = fit_recipe(pretrain, ["--trainer.max_steps", str(steps), "--trainer.val_check_interval",
                                         str(steps), "--trainer.limit_val_batches", "8", *pretrain_overrides],
                              seed=seed, root=root / "pretrain", test=False)
        export = str(cli.run_dir / "pretrained")
        result = {name: pre[metric] * (100 if "acc" in metric else 1) for metric, name in report.items()}
        for arm, pretrained in (("pretrained", export), ("scratch", "null")):
            _, metrics = fit_recipe(finetune, ["--model.pretrained", pretrained, "--data.tokenizer", export,
                                               "--data.seed", str(seed), *finetune_overrides],
                                    seed=seed, root=root / arm)
            result[arm] = 100 * metrics["test_acc"]
    return finite(result)


def run_mlm(seed: int) -> dict[str, float]:
    return pretrain_then_fine_tune(seed, "bert/mlm_tiny", [], MLM_STEPS, "bert/finetune_cls", [],
                                   {"val_mlm_acc": "MLM acc (%)", "val_nsp_acc": "NSP acc (%)"})


def run_lm(seed: int) -> dict[str, float]:
    return pretrain_then_fine_tune(seed, "gpt/tiny", LM_SHAPE, LM_STEPS, "gpt/finetune_cls",
                                   ["--model.preset", "gpt-nano"], {"val_loss": "LM val loss"})


DATA = ("which of asyncio / email / logging / tkinter a docstring comes from: 16 labelled a class, 100 test "
        "docstrings a class (redrawn each seed, no text in two splits); pretraining text = those packages' code "
        "+ more of the standard library, none of their docstrings")
CLAIMS = [
    Claim(key="a-mlm", title="BERT-style pretraining (masked LM + NSP) helps low-resource fine-tuning",
          metric="accuracy (%)", better="pretrained", baseline="scratch", min_gap=5.0, run=run_mlm,
          data=f"{DATA}; {MLM_STEPS} steps of configs/bert/mlm_tiny.yaml, then configs/bert/finetune_cls.yaml",
          extra=("MLM acc (%)", "NSP acc (%)")),
    Claim(key="a-lm", title="GPT-1-style pretraining (causal LM) helps low-resource fine-tuning",
          metric="accuracy (%)", better="pretrained", baseline="scratch", min_gap=5.0, run=run_lm,
          data=f"{DATA}; {LM_STEPS} steps of configs/gpt/tiny.yaml at gpt-nano size, then configs/gpt/finetune_cls.yaml",
          extra=("LM val loss",)),
]


def main(argv: list[str] | None = None) -> None:
    import torch
    from claims import add_claim_options, parse_claim_args  # claims.py's checks, alike here

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_claim_options(p, claims="both")
    args = parse_claim_args(p, argv, {c.key: ("claims_pretraining", c) for c in CLAIMS})
    torch.set_num_threads(args.threads)
    claims = [c for c in CLAIMS if c.key in args.keys]
    results: dict[str, list[dict[str, float]]] = {c.key: [] for c in claims}
    for seed in args.seeds:
        for claim in claims:
            wall, cpu = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
            row = claim.run(seed)
            after = resource.getrusage(resource.RUSAGE_SELF)
            used = after.ru_utime + after.ru_stime - cpu.ru_utime - cpu.ru_stime
            results[claim.key].append(row)
            print(f"{claim.key} seed {seed}: " + ", ".join(f"{k} {v:.4g}" for k, v in row.items())
                  + f" ({time.perf_counter() - wall:.0f} s wall, {used:.0f} s CPU)", flush=True)
    for claim in claims:
        rows = results[claim.key]
        ok, why = verdict(claim, rows)
        arms = ", ".join(f"{arm} {mean_std([r[arm] for r in rows])[0]:.1f} ± {mean_std([r[arm] for r in rows])[1]:.1f}"
                         for arm in (claim.better, claim.baseline))
        print(f"{claim.key}: {arms} -> {'holds' if ok else 'does not hold'} ({why})")


if __name__ == "__main__":
    main()
