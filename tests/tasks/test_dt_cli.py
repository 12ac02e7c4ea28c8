"""The Decision Transformer recipes run through `unitok`: both parse; cartpole.yaml fits on
built-in data (tiny overrides), leaves a checkpoint, a model folder with the tokenizer
statistics, per-target returns (argmax actions) and the achieved-vs-target plot, and tests from
the checkpoint; offline.yaml trains on a user's .npz and says so when the file is missing; rollout
options, the environment and a pretrained model's options are checked before any training step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tasks import DecisionTransformerTask, record_episodes, save_trajectories
from tasks.cli import main
from tokenizers_mm import Processor
from unitok.models import DecisionTransformer, DecisionTransformerConfig

ROOT = Path(__file__).resolve().parents[2]
CARTPOLE = ROOT / "configs" / "dt" / "cartpole.yaml"
OFFLINE = ROOT / "configs" / "dt" / "offline.yaml"
QUICK = ["--trainer.max_steps", "3", "--trainer.val_check_interval", "3", "--trainer.limit_val_batches", "1",
         "--trainer.limit_test_batches", "1", "--trainer.enable_progress_bar", "false",
         "--trainer.enable_model_summary", "false", "--data.batch_size", "8", "--model.eval_episodes", "1",
         "--model.eval_max_steps", "20"]


@pytest.mark.parametrize("config", [CARTPOLE, OFFLINE], ids=["cartpole", "offline"])
def test_recipes_parse(config, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(config), "--print_config"])
    assert exit_info.value.code in (0, None)
    printed = capsys.readouterr().out
    assert "tasks.DecisionTransformerTask" in printed and "tasks.TrajectoryDataModule" in printed


def test_cartpole_recipe_fits_then_tests_from_the_checkpoint(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    small = ["--data.expert_episodes", "2", "--data.noisy_episodes", "3", "--data.random_episodes", "2",
             "--data.cache_dir", str(tmp_path / "cache")]
    main(["fit", "--config", str(CARTPOLE), *QUICK, *small])
    run = tmp_path / "runs" / "dt_cartpole"
    assert (run / "latest" / "checkpoints" / "last.ckpt").is_file()
    model = DecisionTransformer.from_pretrained(run / "latest" / "pretrained")
    assert model.config.context_length == 10  # linked from the data module
    assert model.config.return_scale == 50.0  # the recipe's: returns-to-go of 0–10
    assert Processor.load(run / "latest" / "pretrained").trajectory == model.tokenizer()  # in processor_config.json
    metrics = (run / "version_0" / "metrics.csv").read_text()
    assert all(f"eval_return_{t}" in metrics for t in (100, 200, 300, 400, 500))
    assert (run / "version_0" / "returns_vs_target.png").is_file()
    assert json.loads((run / "version_0" / "eval_returns.json").read_text())["sample"] is False  # argmax

    main(["test", "--config", str(CARTPOLE), "--ckpt_path", str(run / "latest" / "checkpoints" / "last.ckpt"), *QUICK, *small])
    assert "test_loss" in (run / "version_1" / "metrics.csv").read_text()
    assert (run / "version_1" / "returns_vs_target.png").is_file()


def test_offline_recipe_trains_on_a_users_file(tmp_path, monkeypatch):
    path = save_trajectories(record_episodes("Pendulum-v1", 3, "noisy", seed=0), tmp_path / "trajectories.npz")
    monkeypatch.chdir(tmp_path)
    main(["fit", "--config", str(OFFLINE), "--data.path", str(path), "--data.env_id", "Pendulum-v1", *QUICK])
    run = tmp_path / "runs" / "dt_offline"
    model = DecisionTransformer.from_pretrained(run / "latest" / "pretrained")
    assert (model.config.state_dim, model.config.act_dim, model.config.discrete) == (3, 1, False)
    assert model.config.action_low is not None and model.config.return_scale > 0
    assert "eval_return_top" in (run / "version_0" / "metrics.csv").read_text()


def test_offline_recipe_without_a_file_says_what_to_give(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:  # a parser error: one line, no traceback
        main(["fit", "--config", str(OFFLINE), *QUICK])
    assert exit_info.value.code == 2
    assert "error: give a trajectory file (path: my_data.npz)" in capsys.readouterr().err


@pytest.fixture
def pendulum_file(tmp_path, monkeypatch):
    path = save_trajectories(record_episodes("Pendulum-v1", 3, "noisy", seed=0), tmp_path / "trajectories.npz")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(DecisionTransformerTask, "training_step",
                        lambda *a, **k: pytest.fail("a training step ran before the options were checked"))
    return path


@pytest.mark.parametrize("option, message", [
    (["--model.eval_max_steps", "0"], "eval_max_steps must be an integer ≥ 1 or None, got 0"),
    (["--model.eval_seed", "-1"], "eval_seed must be an integer ≥ 0, got -1"),
    (["--model.eval_episodes", "-1"], "eval_episodes must be an integer ≥ 0 (0: no rollouts), got -1"),
], ids=["max-steps-0", "negative-seed", "negative-episodes"])
def test_bad_rollout_options_are_parser_errors(pendulum_file, capsys, option, message):
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(OFFLINE), "--data.path", str(pendulum_file), "--data.env_id", "Pendulum-v1",
              *QUICK, *option])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("option, message", [
    (["--data.env_id", "Pendulum-v1", "--model.eval_sample", "true"],
     "eval_sample=True draws discrete actions from the softmax, but this model has continuous actions"),
    (["--model.eval_env", "CartPole-v1"],
     "but the model (checkpoint) was trained with state_dim=3"),  # CartPole's observations have 4
], ids=["sampled-continuous-actions", "eval-env-of-other-spaces"])
def test_rollouts_that_would_fail_are_refused_before_training(pendulum_file, capsys, option, message):
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(OFFLINE), "--data.path", str(pendulum_file), *QUICK, *option])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_options_a_pretrained_model_cannot_honour_are_refused(pendulum_file, capsys):
    # Left out, the pretrained architecture is used; given with another value, it used to be ignored
    # silently (a "behaviour-cloning baseline" that reads returns).
    folder = DecisionTransformer(DecisionTransformerConfig.from_name(
        "dt-tiny", state_dim=3, act_dim=1, context_length=20)).save_pretrained(pendulum_file.parent / "pre")
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(OFFLINE), "--data.path", str(pendulum_file), *QUICK,
              "--model.pretrained", str(folder), "--model.condition_on_returns", "false", "--model.d_model", "64"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "keeps its own architecture; given d_model=64 (the model's: 32), condition_on_returns=False " \
           "(the model's: True)" in err
