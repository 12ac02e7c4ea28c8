"""The `unitok` command: recipes parse, `fit` runs as a subprocess and leaves a checkpoint and
a model folder, `predict`/`test` use the checkpoint, `unitok sample` continues prompts."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from tasks.cli import main

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs").rglob("*.yaml"))
TINY = ROOT / "configs" / "gpt" / "tiny.yaml"
# Small enough for a test: a slice of the corpus, a small vocabulary, short windows.
QUICK = ["--data.builtin_max_bytes", "150000", "--data.vocab_size", "400", "--data.context_length", "32",
         "--data.batch_size", "4", "--trainer.limit_val_batches", "2", "--trainer.enable_progress_bar", "false"]


@pytest.mark.parametrize("config", CONFIGS, ids=[str(c.relative_to(ROOT / "configs")) for c in CONFIGS])
def test_every_recipe_parses(config, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(config), "--print_config"])
    assert exit_info.value.code in (0, None)
    printed = capsys.readouterr().out
    assert "class_path" in printed and "trainer:" in printed


def test_a_config_typo_is_a_clear_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(TINY), "--model.learning_rat", "0.1", "--print_config"])
    assert exit_info.value.code != 0
    assert "learning_rat" in capsys.readouterr().err


def test_a_value_the_model_refuses_is_one_line_not_a_traceback(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(TINY), *QUICK, "--model.preset", "gpt-nan"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "error: unknown GPTConfig preset 'gpt-nan' (did you mean 'gpt-nano'?)" in err
    assert "Traceback" not in err and "Union subtypes" not in err
    assert not list(tmp_path.rglob("*.ckpt"))  # refused before any step


VIT = ROOT / "configs" / "vit" / "digits.yaml"
VIT_QUICK = ["--trainer.max_steps", "2", "--trainer.limit_val_batches", "1", "--trainer.enable_progress_bar", "false",
             "--trainer.enable_model_summary", "false"]


@pytest.mark.parametrize("option, message", [
    (["--data.train_per_class", "500"], "train_per_class"),  # refused as the data is read (setup)
    (["--ckpt_path", "last"], "has a last.ckpt yet; fit the recipe first"),  # nothing to resume yet
    (["--ckpt_path", "lats"], "--ckpt_path lats: no such checkpoint file ('last' or 'best' find the newest run's)"),
    (["--trainer.max_steps", "0"], "fit made no training step, so nothing was exported"),
    (["--model.learning_rate", "-1"], "learning_rate must be a finite number ≥ 0, got -1.0"),  # before the data
    (["--model.betas", "[0.9, 1.5]"], "betas must be a finite number in [0, 1), got 1.5"),
    (["--seed_everything", "-1"], "--seed_everything: -1 is not in bounds, numpy accepts from 0 to 4294967295"),
])
def test_values_refused_before_the_first_step_are_one_line_and_export_nothing(option, message, tmp_path, monkeypatch,
                                                                             capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(VIT), *VIT_QUICK, *option])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in err and "Traceback" not in err, err[-2000:]
    assert not list(tmp_path.rglob("*.ckpt")) and not list(tmp_path.rglob("latest"))


def test_only_unitoks_own_refusals_become_one_line_errors():
    """A value error raised by unitok's code (the chain jsonargparse wraps it in is followed) is
    the user's to fix; one raised elsewhere (a library, a bug) keeps its traceback."""
    from tasks.cli import _own_refusal
    from unitok.models import GPTConfig

    try:
        try:
            GPTConfig.from_name("gpt-nan")
        except ValueError as ours:
            raise ValueError("Does not validate against any of the Union subtypes") from ours
    except ValueError as wrapped:
        refusal = _own_refusal(wrapped)
    assert isinstance(refusal, ValueError) and "unknown GPTConfig preset 'gpt-nan'" in str(refusal)

    try:
        raise ValueError("raised outside unitok's packages")
    except ValueError as elsewhere:
        assert _own_refusal(elsewhere) is None
    try:
        {}["key"]
    except KeyError as bug:
        assert _own_refusal(bug) is None


def test_a_type_error_python_raises_inside_unitok_is_a_bug_not_a_refusal():
    """unitok's own ``raise TypeError(...)`` names a wrong value and becomes one line; Python's
    TypeError from a wrong operation inside unitok's code is a bug, and keeps its traceback."""
    from types import SimpleNamespace

    from tasks.cli import _own_refusal
    from unitok.checks import check_dtype

    try:
        check_dtype(torch.zeros(1, dtype=torch.float64), torch.zeros(1), "pixel_values")
    except TypeError as ours:
        assert _own_refusal(ours) is ours
    else:
        pytest.fail("float64 pixels should have been refused")
    try:  # a "weight" whose dtype is a list: the set lookup inside check_dtype fails in Python
        check_dtype(torch.zeros(1), SimpleNamespace(dtype=[torch.float32]), "pixel_values")
    except TypeError as bug:
        assert "unhashable type" in str(bug)
        assert bug.__traceback__.tb_next.tb_frame.f_code.co_filename.endswith("unitok/checks.py")
        assert _own_refusal(bug) is None
    else:
        pytest.fail("the list dtype should have raised")


@pytest.mark.slow
def test_fit_subprocess_then_predict_test_and_sample(tmp_path, monkeypatch, capsys):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "tasks.cli", "fit", "--config", str(TINY), "--trainer.max_steps", "5",
               "--trainer.val_check_interval", "5", "--model.generate_max_new_tokens", "5", *QUICK]
    run = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "litlogger" not in run.stdout + run.stderr  # Lightning's advert for its cloud logger is dropped
    assert "GPU available" in run.stdout + run.stderr  # its other lines are not
    checkpoints = tmp_path / "runs" / "gpt_tiny" / "latest" / "checkpoints"
    assert (checkpoints / "last.ckpt").is_file()
    pretrained = tmp_path / "runs" / "gpt_tiny" / "latest" / "pretrained"
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= {p.name for p in pretrained.iterdir()}
    assert list((tmp_path / "runs" / "gpt_tiny").glob("version_*/metrics.csv"))

    monkeypatch.chdir(tmp_path)
    ckpt = str(checkpoints / "last.ckpt")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        main(["predict", "--config", str(TINY), "--ckpt_path", ckpt, *QUICK,
              "--data.predict_prompts", "['def main(', 'import ']", "--model.generate_max_new_tokens", "5"])
        printed = capsys.readouterr().out
        assert "def main(" in printed and "import " in printed
        main(["test", "--config", str(TINY), "--ckpt_path", ckpt, *QUICK])
        assert "test_loss" in capsys.readouterr().out
        main(["validate", "--config", str(TINY), "--ckpt_path", ckpt, *QUICK])
        assert "val_loss" in capsys.readouterr().out
    # reading a checkpoint writes none, and restores the recipe's checkpoint callback without a word
    assert not [str(w.message) for w in caught
                if "dirpath has changed" in str(w.message) or "callbacks used to create the checkpoint" in str(w.message)]
    for version in ("version_1", "version_2", "version_3"):  # predict, test, validate: their own folders, no checkpoint
        assert not (tmp_path / "runs" / "gpt_tiny" / version / "checkpoints").exists()

    main(["sample", "--model", str(pretrained), "--prompt", "def main(", "--prompt", "class ",
          "--max_new_tokens", "6", "--strategy", "beam", "--num_beams", "2"])
    printed = capsys.readouterr().out
    assert "def main(" in printed and "class " in printed

    from tasks.sample import main as sample_main

    texts = sample_main(["--model", str(pretrained), "--prompt", "def main(", "--max_new_tokens", "6",
                         "--strategy", "sample", "--top_k", "5"])
    assert len(texts) == 1 and texts[0].startswith("def main(") and len(texts[0]) > len("def main(")
    greedy = ["--model", str(pretrained), "--prompt", "def main(", "--max_new_tokens", "6"]
    assert sample_main([*greedy, "--compile", "aot_eager"]) == sample_main(greedy)  # the compiled step's text
