"""Stop signals: SIGTERM (a scheduler's stop) or SIGINT (Ctrl-C) stops a run where the next
optimizer step would start — never inside a gradient accumulation or a validation, never held
off by ``min_steps``, with no validation of its own — writes ``last.ckpt`` and exits with 128 +
the signal (143, 130). A run whose last step is done finishes and is exported; `unitok
predict`, ``validate`` and ``test`` stop before their next batch. (`tests/tasks/test_resume.py`
and `test_runs.py` cover the stop and resume of whole recipes.)"""

from __future__ import annotations

import csv
import json
import os
import signal
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from tasks import CausalLMTask
from tasks.cli import main

ROOT = Path(__file__).resolve().parents[2]
GPT = ROOT / "configs" / "gpt" / "tiny.yaml"
# gpt-nano on 150 kB of the corpus, windows of 32 tokens, 4 a batch: a step takes milliseconds
TINY = ["--model.preset", "gpt-nano", "--data.builtin_max_bytes", "150000", "--data.vocab_size", "400",
        "--data.context_length", "32", "--data.batch_size", "4", "--trainer.limit_val_batches", "1",
        "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
        "--trainer.log_every_n_steps", "1"]


# A stop warns what it did ("received SIGTERM: stopped after step 2, …"): `unitok` below checks that
# it names the signal of the exit status, the tests that need its words match them (pytest.warns).
pytestmark = pytest.mark.filterwarnings("ignore:received SIG")


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cache")  # the tokenizer and token stream, built once


def unitok(command: str, root: Path, cache: Path, *args: str) -> int:
    """``unitok <command>`` of the tiny GPT into ``root``; its exit status. What a stop warns
    ("received SIGTERM: stopped after step 2, …") must name the signal its exit status says."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            main([command, "--config", str(GPT), *TINY, "--data.cache_dir", str(cache),
                  "--trainer.default_root_dir", str(root), *args])
            code = 0
        except SystemExit as stopped:
            code = stopped.code
    for w in caught:
        if str(w.message).startswith("received SIG"):
            assert code in (130, 143) and {130: "SIGINT", 143: "SIGTERM"}[code] in str(w.message), str(w.message)
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)  # as the run showed it
    return code


def signal_from(monkeypatch, method: str, signum: int, when: Callable[[CausalLMTask, int], bool]) -> list[int]:
    """Send ``signum`` to this process once, from inside ``CausalLMTask.<method>`` (a step: the
    signal arrives while it computes) when ``when(task, batch_idx)``; returns the global steps
    each call of the method started at."""
    original = getattr(CausalLMTask, method)
    calls: list[int] = []

    def step(self, batch, batch_idx, *args):
        calls.append(self.global_step)
        if when(self, batch_idx) and not getattr(step, "sent", False):
            step.sent = True
            os.kill(os.getpid(), signum)
        return original(self, batch, batch_idx, *args)

    monkeypatch.setattr(CausalLMTask, method, step)
    return calls


def step_of(checkpoint: Path) -> int:
    return torch.load(checkpoint, map_location="cpu", weights_only=False)["global_step"]


def logged(root: Path, column: str) -> dict[int, float]:
    """{step (1-based): value} of ``column`` in every metrics.csv under ``root``."""
    values = {}
    for path in sorted(root.rglob("metrics.csv")):
        with path.open() as f:
            for row in csv.DictReader(f):
                if row.get(column):
                    values[int(row["step"]) + 1] = float(row[column])
    return values


STOPS = [pytest.param(signal.SIGTERM, 143, id="SIGTERM"), pytest.param(signal.SIGINT, 130, id="SIGINT")]


@pytest.mark.parametrize("signum, code", STOPS)
def test_a_signal_inside_a_gradient_accumulation_stops_after_the_step_and_resumes_the_same_curve(
        tmp_path, cache, monkeypatch, signum, code):
    # two batches a step; the signal arrives as step 2's first batch trains (batch 2 of 0..5)
    args = ["--trainer.max_steps", "3", "--trainer.accumulate_grad_batches", "2"]
    assert unitok("fit", tmp_path / "full", cache, *args) == 0
    signal_from(monkeypatch, "training_step", signum, lambda task, batch_idx: batch_idx == 2)
    assert unitok("fit", tmp_path / "stopped", cache, *args) == code
    last = tmp_path / "stopped" / "version_0" / "checkpoints" / "last.ckpt"
    assert step_of(last) == 2, "the step in progress was finished: no half-accumulated step is saved"
    monkeypatch.undo()
    assert unitok("fit", tmp_path / "stopped", cache, *args, "--ckpt_path", "last") == 0
    full, resumed = logged(tmp_path / "full", "train_loss"), logged(tmp_path / "stopped", "train_loss")
    assert sorted(full) == sorted(resumed) == [1, 2, 3]
    np.testing.assert_allclose([resumed[s] for s in (1, 2, 3)], [full[s] for s in (1, 2, 3)], rtol=0, atol=1e-6)


@pytest.mark.parametrize("signum, code", STOPS)
def test_a_signal_during_an_epochs_last_step_resumes_into_the_next_epoch_on_the_same_curve(
        tmp_path, cache, monkeypatch, signum, code):
    # 12 windows of 4: three steps an epoch; the signal arrives in step 3, the first epoch's last
    args = ["--data.train_samples", "12", "--trainer.max_steps", "5", "--trainer.val_check_interval", "2"]
    assert unitok("fit", tmp_path / "full", cache, *args) == 0
    signal_from(monkeypatch, "training_step", signum, lambda task, batch_idx: task.global_step == 2)
    assert unitok("fit", tmp_path / "stopped", cache, *args) == code
    assert step_of(tmp_path / "stopped" / "version_0" / "checkpoints" / "last.ckpt") == 3
    monkeypatch.undo()
    assert unitok("fit", tmp_path / "stopped", cache, *args, "--ckpt_path", "last") == 0
    full, resumed = logged(tmp_path / "full", "train_loss"), logged(tmp_path / "stopped", "train_loss")
    assert sorted(full) == sorted(resumed) == [1, 2, 3, 4, 5]
    np.testing.assert_allclose([resumed[s] for s in (4, 5)], [full[s] for s in (4, 5)], rtol=0, atol=1e-6)
    assert logged(tmp_path / "stopped", "val_loss") == pytest.approx(logged(tmp_path / "full", "val_loss"))


@pytest.mark.parametrize("signum, code", STOPS)
def test_a_signal_during_the_last_step_lets_the_run_finish_and_export_and_exits_non_zero(
        tmp_path, cache, monkeypatch, signum, code):
    signal_from(monkeypatch, "training_step", signum, lambda task, batch_idx: task.global_step == 1)  # step 2 of 2
    assert unitok("fit", tmp_path, cache, "--trainer.max_steps", "2") == code
    assert step_of(tmp_path / "version_0" / "checkpoints" / "last.ckpt") == 2
    assert (tmp_path / "version_0" / "pretrained" / "config.json").is_file(), "the finished model is exported"
    assert (tmp_path / "latest").resolve() == (tmp_path / "version_0").resolve()


def test_ctrl_c_is_not_held_off_by_min_steps(tmp_path, cache, monkeypatch):
    # Lightning ignores `should_stop` until min_steps (and the min_epochs it implies) are met
    calls = signal_from(monkeypatch, "training_step", signal.SIGINT, lambda task, batch_idx: task.global_step == 1)
    assert unitok("fit", tmp_path, cache, "--trainer.min_steps", "4", "--trainer.max_steps", "6") == 130
    assert calls == [0, 1], "stopped after step 2"
    assert step_of(tmp_path / "version_0" / "checkpoints" / "last.ckpt") == 2
    assert not (tmp_path / "version_0" / "pretrained").exists(), "a stopped run is not exported"


def test_ctrl_c_adds_no_validation_the_uninterrupted_run_would_not_make(tmp_path, cache, monkeypatch):
    # the recipe validates every 200 steps (and keeps best.ckpt by val_loss): a 4-step run never does;
    # Lightning validates when `should_stop` is set, which made a val point and a best.ckpt of its own
    signal_from(monkeypatch, "training_step", signal.SIGINT, lambda task, batch_idx: task.global_step == 1)
    assert unitok("fit", tmp_path, cache, "--trainer.max_steps", "4", "--trainer.num_sanity_val_steps", "0") == 130
    assert step_of(tmp_path / "version_0" / "checkpoints" / "last.ckpt") == 2
    assert logged(tmp_path, "val_loss") == {}, "no validation"
    assert sorted(p.name for p in (tmp_path / "version_0" / "checkpoints").iterdir()) == ["last.ckpt"]


@pytest.mark.parametrize("signum, code", STOPS)
def test_a_signal_during_a_validation_within_fit_lets_it_finish_before_the_stop(
        tmp_path, cache, monkeypatch, signum, code):
    # a validation of two batches every 2 steps; the signal arrives in the first one's first batch
    args = ["--trainer.max_steps", "4", "--trainer.val_check_interval", "2", "--trainer.limit_val_batches", "2",
            "--trainer.num_sanity_val_steps", "0"]
    signal_from(monkeypatch, "validation_step", signum, lambda task, batch_idx: batch_idx == 0)
    assert unitok("fit", tmp_path, cache, *args) == code
    assert step_of(tmp_path / "version_0" / "checkpoints" / "last.ckpt") == 2
    assert sorted(logged(tmp_path, "val_loss")) == [2], "the validation of step 2 was finished and logged"
    monkeypatch.undo()
    assert unitok("fit", tmp_path, cache, *args, "--ckpt_path", "last") == 0
    assert sorted(logged(tmp_path, "val_loss")) == [2, 4], "as the uninterrupted run: one validation each"


@pytest.fixture(scope="module")
def fitted(tmp_path_factory, cache) -> Path:
    """last.ckpt of a one-step run of the tiny GPT."""
    root = tmp_path_factory.mktemp("fitted")
    assert unitok("fit", root, cache, "--trainer.max_steps", "1") == 0
    return root / "version_0" / "checkpoints" / "last.ckpt"


@pytest.mark.parametrize("command, method, signum, code", [
    pytest.param("predict", "predict_step", signal.SIGTERM, 143, id="predict-SIGTERM"),  # it never stopped
    pytest.param("predict", "predict_step", signal.SIGINT, 130, id="predict-SIGINT"),  # it exited 1
    pytest.param("validate", "validation_step", signal.SIGINT, 130, id="validate-SIGINT"),
    pytest.param("test", "test_step", signal.SIGINT, 130, id="test-SIGINT"),
])
def test_a_signal_stops_predict_validate_and_test_before_their_next_batch(
        tmp_path, cache, fitted, monkeypatch, command, method, signum, code):
    calls = signal_from(monkeypatch, method, signum, lambda task, batch_idx: batch_idx == 0)
    args = ["--ckpt_path", str(fitted), "--trainer.limit_val_batches", "3", "--trainer.limit_test_batches", "3",
            "--model.generate_max_new_tokens", "2", "--data.predict_prompts", "[a, b, c, d, e, f, g, h, i, j]"]
    with pytest.warns(UserWarning, match=f"received {signal.Signals(signum).name}: {command} stopped"):
        assert unitok(command, tmp_path, cache, *args) == code
    assert len(calls) == 1, "the batch under way was finished, and no other started"
    assert not list(tmp_path.rglob("*.ckpt")), f"{command} writes no checkpoint"
    if command == "predict":  # the batch it finished is kept, in order; the exit status says it stopped
        records = [json.loads(line) for line in (tmp_path / "version_0" / "predictions.jsonl").read_text().splitlines()]
        assert 0 < len(records) < 10 and [r["id"] for r in records] == list(range(len(records)))
