"""The multimodal recipes run through `unitok`: both parse; the four-task recipe fits one model
on four modalities (tiny overrides), logs every task, exports one model folder and tests from
the checkpoint; the matching recipe fits on an image and an audio segment in one sequence."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tasks.cli import main
from tasks.recorded import TOKENIZER_KEY
from unitok.models import MultimodalTransformer

ROOT = Path(__file__).resolve().parents[2]
FOUR = ROOT / "configs" / "multimodal" / "four_tasks.yaml"
MATCH = ROOT / "configs" / "multimodal" / "image_audio_match.yaml"
QUICK = ["--trainer.max_steps", "2", "--trainer.val_check_interval", "2", "--trainer.limit_val_batches", "1",
         "--trainer.limit_test_batches", "1", "--trainer.enable_progress_bar", "false",
         "--trainer.enable_model_summary", "false", "--trainer.log_every_n_steps", "1", "--model.preset", "mm-tiny"]


def task_options(task: str, **options) -> list[str]:
    return [arg for key, value in options.items()
            for arg in (f"--data.init_args.tasks.{task}.init_args.{key}", str(value))]


@pytest.mark.parametrize("config", [FOUR, MATCH], ids=["four_tasks", "image_audio_match"])
def test_recipes_parse_and_say_what_they_show(config, capsys):
    text = config.read_text()
    assert text.startswith("# ") and "unitok fit --config" in text
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(config), "--print_config"])
    assert exit_info.value.code in (0, None)
    printed = capsys.readouterr().out
    assert "tasks.MultiTaskTask" in printed and "tasks.MultiTaskDataModule" in printed


def test_four_task_recipe_fits_one_model_and_tests_from_its_checkpoint(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    small = [*task_options("speech", train_utterances=12, held_out_utterances=4, max_digits=2,
                           cache_dir=tmp_path / "speech", batch_size=4),
             *task_options("text", builtin_max_bytes=60000, vocab_size=300, context_length=16,
                           cache_dir=tmp_path / "text"),
             *task_options("cartpole", expert_episodes=2, noisy_episodes=2, random_episodes=2,
                           cache_dir=tmp_path / "rl"),
             "--model.init_args.objectives.cartpole.init_args.eval_episodes", "1"]
    main(["fit", "--config", str(FOUR), *QUICK, *small])
    run = tmp_path / "runs" / "mm_four_tasks"
    hparams = torch.load(run / "latest" / "checkpoints" / "last.ckpt", weights_only=True)["hyper_parameters"]
    assert hparams[TOKENIZER_KEY]["sha1"]  # the text task's tokenizer: a test with another one is refused
    model = MultimodalTransformer.from_pretrained(run / "latest" / "pretrained")
    assert set(model.config.modalities) == {"image", "audio", "text", "trajectory"}
    metrics = (run / "version_0" / "metrics.csv").read_text()
    for column in ("digits/val_acc", "speech/val_cer", "text/val_ppl", "cartpole/val_return", "train_loss"):
        assert column in metrics, column
    capsys.readouterr()
    main(["test", "--config", str(FOUR), "--ckpt_path", str(run / "latest" / "checkpoints" / "last.ckpt"), *QUICK, *small])
    assert "test: digits acc" in capsys.readouterr().out


def test_match_recipe_fits_an_image_and_an_audio_segment_in_one_sequence(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    small = [*task_options("match", train_utterances=80, held_out_utterances=60, held_out_pairs=16, batch_size=8,
                           cache_dir=tmp_path / "speech"),
             *task_options("speech", train_utterances=12, held_out_utterances=4, max_digits=2,
                           cache_dir=tmp_path / "speech", batch_size=4)]
    main(["fit", "--config", str(MATCH), *QUICK, *small])
    run = tmp_path / "runs" / "mm_match"
    model = MultimodalTransformer.from_pretrained(run / "latest" / "pretrained")
    assert set(model.config.modalities) == {"image", "audio"} and model.config.heads["match"].segment == "image"
    assert "match/val_acc" in (run / "version_0" / "metrics.csv").read_text()
