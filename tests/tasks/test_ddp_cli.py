"""`unitok fit` on two CPU processes (DDP over gloo), as a user would launch it: a text recipe and
an image recipe run a few steps, rank 0 alone writes the checkpoint, the metrics and the exported
model, and the export loads with `unitok.load`. Outputs are found by searching the run's folder,
not by a fixed layout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import unitok

ROOT = Path(__file__).resolve().parents[2]
DDP = ["--trainer.devices", "2", "--trainer.accelerator", "cpu", "--trainer.strategy", "ddp"]
STEPS = ["--trainer.max_steps", "4", "--trainer.val_check_interval", "2", "--trainer.limit_val_batches", "2",
         "--trainer.log_every_n_steps", "1", "--trainer.enable_progress_bar", "false"]
RECIPES = {
    # A slice of the corpus, a small vocabulary, short windows.
    "gpt/tiny": ["--data.builtin_max_bytes", "100000", "--data.vocab_size", "300", "--data.context_length", "32",
                 "--data.batch_size", "4", "--model.preset", "gpt-micro"],
    "vit/digits": ["--data.batch_size", "16"],
}
METRIC = {"gpt/tiny": "val_loss", "vit/digits": "val_acc"}


def files(root: Path, pattern: str) -> list[Path]:
    """Every file matching ``pattern`` under ``root``, each once (a ``latest`` link is no second copy)."""
    return sorted({p.resolve() for p in root.rglob(pattern)})


def only(found: list[Path], what: str) -> Path:
    assert len(found) == 1, f"expected one {what}, found {[str(p) for p in found]}"
    return found[0]


@pytest.mark.slow
@pytest.mark.parametrize("recipe", list(RECIPES))
def test_fit_on_two_cpu_processes(recipe, tmp_path):
    run_root = tmp_path / "run"
    command = [sys.executable, "-m", "tasks.cli", "fit", "--config", str(ROOT / "configs" / f"{recipe}.yaml"),
               "--trainer.default_root_dir", str(run_root), *DDP, *STEPS, *RECIPES[recipe]]
    # One thread per process: two ranks share two cores. The data cache lands under tmp_path (the cwd).
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-4000:]
    assert "Starting with 2 processes" in output  # both ranks joined the gloo process group

    # Rank 0 alone writes: one last checkpoint, one metrics file, one export (wherever the recipe puts them).
    last = only(files(tmp_path, "last.ckpt"), "last.ckpt")
    names = [p.name for p in files(tmp_path, "*.ckpt")]
    assert len(names) == len(set(names)), names  # no checkpoint written twice
    checkpoint = torch.load(last, map_location="cpu", weights_only=True)
    assert checkpoint["global_step"] == 4

    metrics = only(files(tmp_path, "metrics.csv"), "metrics.csv").read_text().splitlines()
    header = metrics[0].split(",")
    assert {"train_loss", METRIC[recipe]} <= set(header)
    for column in ("train_loss", METRIC[recipe]):
        values = [float(row.split(",")[header.index(column)]) for row in metrics[1:]
                  if row.split(",")[header.index(column)]]
        assert values and all(v == v for v in values), column  # logged, and not NaN

    folder = only([p.parent for p in files(tmp_path, "config.json") if p.parent.name == "pretrained"], "export")
    model = unitok.load(folder)
    trained = {k.removeprefix("model."): v for k, v in checkpoint["state_dict"].items() if k.startswith("model.")}
    exported = model.state_dict()
    assert trained and exported.keys() <= trained.keys()
    for name, value in exported.items():  # the export is the trained weights (both ranks hold the same)
        torch.testing.assert_close(value, trained[name], msg=name)
