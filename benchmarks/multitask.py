"""One transformer on four tasks against the same model trained on each task alone.

What it measures, from one recipe (default ``configs/multimodal/four_tasks.yaml``):

1. **Held-out metrics.** The recipe's four-task run, then four single-task runs of the same
   model (same preset, same data modules, same settings) at the same number of steps *per
   task* — each single run takes the recipe's ``max_steps``, and the four-task run trains
   every task at every step. Each run's model is scored on each task's two held-out splits
   after training (``trainer.validate`` and ``trainer.test``: twice the evidence for a noisy
   metric such as CER); the tables show both columns and the relative change (positive = the
   four-task model is worse, in the metric's own direction).
2. **Step cost.** In one process, on the four-task model and one batch of each task: a
   four-task training step (four forward/backward passes, one AdamW step) against the four
   single-task steps (each one forward/backward and an AdamW step over its own model's
   parameters), repetitions alternating; the table reports medians and
   ``multi / sum(single)``.

Run::

    python benchmarks/multitask.py --threads 2             # both measurements (the four-task fit alone: ~9 minutes on 2 cores)
    python benchmarks/multitask.py --speed-only --threads 1
    python benchmarks/multitask.py --max-steps 200 --tasks digits cartpole   # a quick look
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: find timing.py
from timing import alternate, positive_int  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "configs" / "multimodal" / "four_tasks.yaml"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--config", type=Path, default=RECIPE)
    p.add_argument("--max-steps", type=positive_int, default=None, help="override the recipe's max_steps")
    p.add_argument("--tasks", nargs="*", default=None, help="a subset of the recipe's tasks")
    p.add_argument("--threads", type=positive_int, default=2)
    p.add_argument("--seed", type=int, default=None, help="override the recipe's seed_everything")
    p.add_argument("--speed-only", action="store_true", help="only the step-cost comparison")
    p.add_argument("--skip-speed", action="store_true", help="only the held-out metrics")
    p.add_argument("--repeats", type=positive_int, default=10)
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    return p.parse_args(argv)


def load(config: Path, tasks: list[str] | None, extra: list[str]) -> Any:
    """The recipe's model, data and trainer, instantiated (optionally restricted to ``tasks``)."""
    from tasks.cli import UnitokCLI

    args = ["--config", str(config), "--trainer.logger", "false", "--trainer.enable_checkpointing", "false",
            "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
            "--trainer.callbacks", "[]", *extra]
    cli = UnitokCLI(L.LightningModule, L.LightningDataModule, subclass_mode_model=True, subclass_mode_data=True,
                    run=False, args=args, save_config_callback=None)
    if tasks is not None:
        unknown = sorted(set(tasks) - set(cli.datamodule.tasks))
        if unknown:
            raise SystemExit(f"unknown tasks {unknown}; the recipe has {sorted(cli.datamodule.tasks)}")
        cli.datamodule.tasks = {n: d for n, d in cli.datamodule.tasks.items() if n in tasks}
        cli.model.objectives = {n: o for n, o in cli.model.objectives.items() if n in tasks}
    return cli


SPLITS = ("val", "test")


def run(config: Path, tasks: list[str], extra: list[str]) -> tuple[dict[str, dict[str, float]], float]:
    """Fit the recipe restricted to ``tasks``; -> {split: each task's held-out metric} for the
    validation and test splits, and the fit's seconds."""
    cli = load(config, tasks, extra)
    start = time.perf_counter()
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    seconds = time.perf_counter() - start
    metrics = {}
    for split, evaluate in zip(SPLITS, (cli.trainer.validate, cli.trainer.test)):
        merged = {k: v for r in evaluate(cli.model, datamodule=cli.datamodule, verbose=False) for k, v in r.items()}
        metrics[split] = {n: merged[f"{n}/{split}_{o.metric}"] for n, o in cli.model.objectives.items()}
    return metrics, seconds


def step_costs(config: Path, tasks: list[str] | None, repeats: int) -> dict[str, float]:
    """Median seconds of a four-task step and of each single-task step, interleaved."""
    cli = load(config, tasks, ["--trainer.max_steps", "1"])
    task, data = cli.model, cli.datamodule
    data.setup("fit")
    for name, objective in task.objectives.items():
        objective.bind(name, data.tasks[name])
    from unitok.models import MultimodalConfig, MultimodalTransformer

    batches = {n: next(iter(d.train_dataloader())) for n, d in data.tasks.items()}
    multi = MultimodalTransformer(task.build_config()).train()
    singles = {}
    for name, objective in task.objectives.items():
        c = multi.config
        config = MultimodalConfig.from_dict({**c.to_dict(), "modalities": objective.modalities(),
                                             "heads": objective.heads()})
        singles[name] = MultimodalTransformer(config).train()

    def step(model: Any, names: list[str], optimizer: torch.optim.Optimizer) -> None:
        total = 0.0
        for n in names:
            objective = task.objectives[n]
            total = total + objective.loss(model(objective.inputs(batches[n]), heads=[n]), batches[n])
        total.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    optimizers = {n: torch.optim.AdamW(m.parameters(), lr=1e-4) for n, m in singles.items()}
    multi_optimizer = torch.optim.AdamW(multi.parameters(), lr=1e-4)
    runs = {"multi": lambda: step(multi, list(task.objectives), multi_optimizer)}
    for n in singles:
        runs[n] = lambda n=n: step(singles[n], [n], optimizers[n])
    times = alternate(runs, repeats=repeats, warmup=2, device="cpu")
    return {name: statistics.median(t) for name, t in times.items()}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    warnings.filterwarnings("ignore", message="LightningCLI's args parameter")
    torch.set_num_threads(args.threads)
    extra = ["--trainer.max_steps", str(args.max_steps)] if args.max_steps else []
    if args.seed is not None:
        extra += ["--seed_everything", str(args.seed)]
    names = args.tasks or list(load(args.config, None, []).datamodule.tasks)
    report: dict[str, Any] = {"config": str(args.config), "threads": args.threads, "tasks": names, "seed": args.seed}

    if not args.skip_speed:
        costs = step_costs(args.config, names, args.repeats)
        total = sum(costs[n] for n in names)
        print(f"\nstep cost ({args.threads} threads, median of {args.repeats}, one batch of each task)")
        print("| step | seconds |\n|---|---|")
        for n in names:
            print(f"| {n} alone | {costs[n]:.3f} |")
        print(f"| sum of single-task steps | {total:.3f} |")
        print(f"| four-task step | {costs['multi']:.3f} ({costs['multi'] / total:.2f}× the sum) |")
        report["step_cost"] = {**costs, "sum_single": total}

    if not args.speed_only:
        multi, multi_seconds = run(args.config, names, extra)
        single: dict[str, dict[str, float]] = {split: {} for split in SPLITS}
        single_seconds = {}
        for n in names:
            values, single_seconds[n] = run(args.config, [n], extra)
            for split in SPLITS:
                single[split][n] = values[split][n]
        objectives = load(args.config, names, []).model.objectives
        for split in SPLITS:
            print(f"\nheld-out metric ({split} split), same steps per task, same model size")
            print("| task | metric | alone | four tasks, one model | relative change |\n|---|---|---|---|---|")
            for n in names:
                o, alone, together = objectives[n], single[split][n], multi[split][n]
                sign = -1 if o.higher_is_better else 1
                change = sign * (together - alone) / abs(alone) if alone else math.nan
                print(f"| {n} | {o.metric} | {alone:.4g} | {together:.4g} | {change:+.1%} |")
        print(f"\nfit time: four tasks {multi_seconds / 60:.1f} min; alone "
              + ", ".join(f"{n} {s / 60:.1f} min" for n, s in single_seconds.items()))
        report.update(single=single, multi=multi, multi_seconds=multi_seconds, single_seconds=single_seconds)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
