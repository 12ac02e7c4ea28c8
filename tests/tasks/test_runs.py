"""Runs a user can trust: each run writes only into its own versioned folder, ``last.ckpt`` is the
last step and ``best.ckpt`` the best, SIGTERM / SIGINT leave a resumable checkpoint and a
non-zero exit, CSV and TensorBoard logs start with the first steps, and a mistyped option is
an error that says what was meant."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest
import torch
from jsonargparse import Namespace

import unitok
from tasks.cli import fill_cache_dirs, main, resolve_recipes
from tasks.data.base import CACHE_ENV

ROOT = Path(__file__).resolve().parents[2]
VIT = ROOT / "configs" / "vit" / "digits.yaml"
QUICK = ["--trainer.max_steps", "4", "--trainer.val_check_interval", "2", "--trainer.limit_val_batches", "1",
         "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false", "--data.batch_size", "16"]


def step_of(checkpoint: Path) -> int:
    return int(torch.load(checkpoint, map_location="cpu", weights_only=True)["global_step"])


def test_every_run_gets_its_own_version_and_nothing_overwrites_another(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    main(["fit", "--config", str(VIT), *QUICK])
    root = tmp_path / "runs" / "vit_digits"
    first = (root / "version_0" / "pretrained" / "model.safetensors").read_bytes()
    main(["fit", "--config", str(VIT), *QUICK, "--model.learning_rate", "0.01"])  # a variant of the recipe
    for version in (0, 1):
        run = root / f"version_{version}"
        assert {"checkpoints", "pretrained", "metrics.csv", "config.yaml"} <= {p.name for p in run.iterdir()}
        assert (run / "checkpoints" / "last.ckpt").is_file() and (run / "checkpoints" / "best.ckpt").is_file()
        assert list(run.glob("events.out.tfevents.*"))  # TensorBoard beside the CSV metrics
    assert (root / "version_0" / "pretrained" / "model.safetensors").read_bytes() == first
    assert (root / "latest").resolve() == (root / "version_1").resolve()
    assert sorted(p.name for p in root.iterdir()) == ["latest", "version_0", "version_1"]


def test_default_root_dir_holds_everything_the_run_writes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    elsewhere = tmp_path / "experiments" / "vit"
    main(["fit", "--config", str(VIT), *QUICK, "--trainer.default_root_dir", str(elsewhere)])
    assert not (tmp_path / "runs").exists()
    assert (elsewhere / "version_0" / "checkpoints" / "last.ckpt").is_file()
    assert unitok.load(elsewhere / "latest" / "pretrained").config.num_classes == 10


def test_data_caches_go_under_the_recipes_root_not_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(CACHE_ENV, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # and not the user's cache either
    root = tmp_path / "experiments" / "gpt"
    main(["fit", "--config", str(ROOT / "configs" / "gpt" / "tiny.yaml"), "--trainer.default_root_dir", str(root),
          "--data.builtin_max_bytes", "50000", "--data.vocab_size", "300", "--data.context_length", "16",
          *QUICK[:-2], "--data.batch_size", "4"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["experiments"]
    assert sorted(p.name for p in root.iterdir()) == ["cache", "latest", "version_0"]
    assert list((root / "cache").rglob("*.bin")) and list((root / "cache").rglob("tokenizer.json"))


def test_unset_cache_dirs_of_nested_data_modules_are_filled_and_set_ones_kept():
    def task(cache_dir):
        return Namespace(class_path="tasks.TextDataModule", init_args=Namespace(cache_dir=cache_dir))
    data = Namespace(class_path="tasks.MultiTaskDataModule",
                     init_args=Namespace(tasks={"text": task(None), "mine": task("/data/cache")}, mode="min_size"))
    fill_cache_dirs(data, "runs/x/cache")
    assert data.init_args.tasks["text"].init_args.cache_dir == "runs/x/cache"
    assert data.init_args.tasks["mine"].init_args.cache_dir == "/data/cache"


def test_last_is_the_last_step_and_best_is_named_so(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    main(["fit", "--config", str(VIT), *QUICK, "--trainer.max_steps", "6"])
    checkpoints = tmp_path / "runs" / "vit_digits" / "version_0" / "checkpoints"
    assert step_of(checkpoints / "last.ckpt") == 6
    assert step_of(checkpoints / "best.ckpt") in (2, 4, 6)
    main(["test", "--config", str(VIT), "--ckpt_path", "last", "--trainer.limit_test_batches", "1",
          "--trainer.enable_progress_bar", "false"])  # "last": the newest run's, found from the next version
    assert "test_acc" in (tmp_path / "runs" / "vit_digits" / "version_1" / "metrics.csv").read_text()


def test_a_short_run_logs_from_its_first_steps_and_counts_steps(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    main(["fit", "--config", str(VIT), *QUICK, "--trainer.enable_progress_bar", "true"])  # recipe logs every 20
    rows = (tmp_path / "runs" / "vit_digits" / "version_0" / "metrics.csv").read_text().splitlines()
    steps = sorted({int(r.split(",")[2]) for r in rows[1:] if r.split(",")[3]})  # rows with a train_loss
    assert rows[0].startswith("epoch,lr,step,train_loss") and steps[0] == 0 and len(steps) == 4
    assert "Training (steps)" in capsys.readouterr().out  # the bar counts steps, not an endless epoch


def test_a_run_in_steps_over_one_batch_epochs_logs_every_interval_without_lightnings_epoch_warnings(
        tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # 10 scans: each epoch is one batch, the logging interval three steps
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        main(["fit", "--config", str(VIT), *QUICK, "--trainer.max_steps", "30", "--trainer.log_every_n_steps", "3",
              "--trainer.val_check_interval", "30", "--data.train_per_class", "1", "--data.batch_size", "8"])
    messages = [str(w.message) for w in caught]
    assert not [m for m in messages if "is smaller than the logging interval" in m or "LeafSpec" in m], messages
    rows = (tmp_path / "runs" / "vit_digits" / "version_0" / "metrics.csv").read_text().splitlines()
    steps = sorted({int(r.split(",")[2]) for r in rows[1:] if r.split(",")[3]})  # rows with a train_loss
    assert steps == list(range(2, 30, 3))  # logged every third step across 30 one-batch epochs


def test_runs_started_together_take_a_folder_each(tmp_path, monkeypatch):
    from tasks import run_folder

    monkeypatch.setenv(run_folder.VERSION_ENV, "unset when the test ends")
    monkeypatch.delenv(run_folder.VERSION_ENV)  # each next_version below is a new command's
    monkeypatch.setattr(run_folder, "versions", lambda root: [])  # both listed the folder before either wrote
    first = run_folder.next_version(tmp_path)
    os.environ.pop(run_folder.VERSION_ENV)
    second = run_folder.next_version(tmp_path)
    os.environ.pop(run_folder.VERSION_ENV)
    assert (first, second) == (0, 1) and (tmp_path / "version_0").is_dir() and (tmp_path / "version_1").is_dir()


def test_a_refused_resume_leaves_no_folder_and_the_checkpoints_settings_decide_nothing(tmp_path, monkeypatch,
                                                                                       capsys):
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "runs" / "vit_digits"
    main(["fit", "--config", str(VIT), *QUICK])
    # another learning rate, batch size or seed would go on along another curve than the checkpoint's
    for changed, shown in ((["--model.learning_rate", "0.02"], "model.init_args.learning_rate: 0.002 → 0.02"),
                           (["--data.batch_size", "8"], "data.init_args.batch_size: 16 → 8"),
                           (["--seed_everything", "5"], "seed_everything: 0 → 5")):
        with pytest.raises(SystemExit) as exit_info:
            main(["fit", "--config", str(VIT), *QUICK, "--trainer.max_steps", "6", "--ckpt_path", "last", *changed])
        assert exit_info.value.code == 2
        assert f"with other settings than its run's: {shown}" in capsys.readouterr().err
    assert sorted(p.name for p in root.glob("version_*")) == ["version_0"]  # no empty version left behind
    main(["fit", "--config", str(VIT), *QUICK, "--trainer.max_steps", "6", "--ckpt_path", "last"])  # the same: fine
    assert step_of(root / "version_1" / "checkpoints" / "last.ckpt") == 6
    # a file given to --ckpt_path no longer replaces the recipe's and the command line's model options
    main(["validate", "--config", str(VIT), *QUICK, "--ckpt_path", str(root / "version_1" / "checkpoints" / "last.ckpt"),
          "--model.label_smoothing", "0.1"])
    assert "label_smoothing: 0.1" in (root / "version_2" / "config.yaml").read_text()
    assert "model.init_args.label_smoothing: 0.0 → 0.1" in capsys.readouterr().out  # listed, not refused


def test_another_recipes_checkpoint_is_refused_by_name(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    main(["fit", "--config", str(VIT), *QUICK])
    ckpt = str(tmp_path / "runs" / "vit_digits" / "version_0" / "checkpoints" / "last.ckpt")
    mixer = ROOT / "configs" / "mixer" / "digits.yaml"
    with pytest.raises(SystemExit) as exit_info:
        main(["test", "--config", str(mixer), "--ckpt_path", ckpt, "--trainer.enable_progress_bar", "false"])
    assert exit_info.value.code == 2
    assert "does not fit this recipe's model" in capsys.readouterr().err
    gpt = ROOT / "configs" / "gpt" / "tiny.yaml"
    with pytest.raises(SystemExit) as exit_info:
        main(["test", "--config", str(gpt), "--ckpt_path", ckpt])
    assert "was written by a tasks.ImageClassificationTask run; this recipe's model is tasks.CausalLMTask" in \
        capsys.readouterr().err
    assert not (tmp_path / "runs" / "gpt_tiny").exists() or not list((tmp_path / "runs" / "gpt_tiny").glob("version_*"))


def test_resuming_a_finished_run_trains_nothing_exports_nothing_and_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "runs" / "vit_digits"
    main(["fit", "--config", str(VIT), *QUICK])
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(VIT), *QUICK, "--ckpt_path", "last"])  # max_steps 4: already there
    assert exit_info.value.code == 2
    assert "the checkpoint is at step 4 and max_steps is 4; raise --trainer.max_steps" in capsys.readouterr().err
    assert (root / "latest").resolve() == (root / "version_0").resolve()
    assert not (root / "version_1" / "pretrained").exists()


def test_a_fast_dev_run_writes_into_its_own_version_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    main(["fit", "--config", str(VIT), "--trainer.fast_dev_run", "true", "--data.batch_size", "8",
          "--trainer.enable_progress_bar", "false"])
    root = tmp_path / "runs" / "vit_digits"
    assert (root / "version_0" / "pretrained" / "model.safetensors").is_file()
    assert not (root / "pretrained").exists() and not (root / "checkpoints").exists()


@pytest.mark.parametrize("option, hint", [
    ("--trainer.max_step", "did you mean --trainer.max_steps"),  # a prefix is no longer taken for the option
    ("--trainer.max_stepz", "did you mean --trainer.max_steps"),
    ("--model.lerning_rate", "did you mean 'learning_rate'"),
])
def test_abbreviated_or_misspelt_options_are_errors_with_a_suggestion(option, hint, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(VIT), option, "5", "--print_config"])
    assert exit_info.value.code != 0
    assert hint in capsys.readouterr().err


def run_until_training(command: list[str], cwd: Path) -> tuple[subprocess.Popen, list[str]]:
    """Start ``unitok`` in a subprocess; return once its step bar shows a finished step."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    lines: list[str] = []
    started = threading.Event()

    def read() -> None:
        for line in iter(process.stdout.readline, ""):  # tqdm rewrites its line with \r: split those too
            lines.extend(line.split("\r"))
            if any("Training (steps)" in part and "/40" in part and " 0/40" not in part
                   for part in line.split("\r")):
                started.set()

    threading.Thread(target=read, daemon=True).start()
    deadline = time.time() + 240
    while not started.is_set() and process.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    assert started.is_set(), "".join(lines)[-3000:]
    return process, lines


@pytest.mark.slow
@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_stop_signal_saves_a_resumable_checkpoint_and_exits_non_zero(tmp_path, signum, code):
    command = [sys.executable, "-m", "tasks.cli", "fit", "--config", str(VIT), "--trainer.max_steps", "40",
               "--trainer.val_check_interval", "1000", "--trainer.limit_val_batches", "1",
               "--trainer.enable_model_summary", "false", "--data.batch_size", "8", "--trainer.devices", "1",
               "--trainer.accelerator", "cpu"]
    process, lines = run_until_training(command, tmp_path)
    process.send_signal(signum)
    assert process.wait(timeout=120) == code, "".join(lines)[-3000:]
    last = tmp_path / "runs" / "vit_digits" / "version_0" / "checkpoints" / "last.ckpt"
    stopped_at = step_of(last)
    assert 0 < stopped_at < 40
    assert not (tmp_path / "runs" / "vit_digits" / "latest").exists()  # nothing exported from a stopped run
    if signum == signal.SIGTERM:  # and it resumes to the end
        resumed = subprocess.run([*command, "--ckpt_path", "last", "--trainer.enable_progress_bar", "false"],
                                 cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert step_of(tmp_path / "runs" / "vit_digits" / "version_1" / "checkpoints" / "last.ckpt") == 40


@pytest.mark.parametrize("recipe, writer", [("bert/finetune_cls", "configs/bert/mlm_tiny.yaml"),
                                            ("gpt/finetune_cls", "configs/gpt/tiny.yaml"),
                                            ("t5/text_to_text", "configs/t5/span_corruption_tiny.yaml")])
def test_a_recipe_missing_the_export_it_starts_from_names_the_recipe_to_run(recipe, writer, tmp_path, monkeypatch,
                                                                               capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as error:
        main(["fit", "--config", str(ROOT / "configs" / f"{recipe}.yaml")])
    message = capsys.readouterr().err
    assert error.value.code == 2 and "--model.pretrained=runs/" in message and f"unitok fit --config {writer}" in message
    assert not (tmp_path / "runs").exists()  # nothing was started


def test_the_readme_commands_work_from_any_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no configs/ here: the shipped recipe is read
    main(["fit", "--config", "configs/vit/digits.yaml", *QUICK])
    assert (tmp_path / "runs" / "vit_digits" / "latest" / "pretrained" / "config.json").is_file()
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "mine.yaml").write_text("seed_everything: 1\n")
    assert resolve_recipes(["fit", "--config", "configs/mine.yaml"]) == ["fit", "--config", "configs/mine.yaml"]
    assert resolve_recipes(["fit", "-c", "configs/nope.yaml"]) == ["fit", "-c", "configs/nope.yaml"]  # left to fail
