"""The T5 recipes through the `unitok` command: span-corruption pretraining runs a few steps and
exports model + tokenizer; text-to-text fine-tuning starts from that export, logs exact match,
answers prefixed inputs in ``predict``, and refuses a task prefix the recipe does not allow."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from tasks.cli import main

ROOT = Path(__file__).resolve().parents[2]
PRETRAIN = str(ROOT / "configs" / "t5" / "span_corruption_tiny.yaml")
FINETUNE = str(ROOT / "configs" / "t5" / "text_to_text.yaml")
STEPS = ["--trainer.max_steps", "3", "--trainer.val_check_interval", "3", "--trainer.limit_val_batches", "2",
         "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
         "--trainer.log_every_n_steps", "1"]
PRETRAIN_QUICK = ["--data.builtin_max_bytes", "150000", "--data.vocab_size", "400", "--data.context_length", "32",
                  "--data.batch_size", "4"]
# The tokenizer and the model come from the pretraining run's export (the recipe's paths).
FINETUNE_QUICK = ["--data.builtin_max_bytes", "150000", "--data.batch_size", "4", "--data.val_per_task", "2",
                  "--model.max_new_tokens", "4"]


def test_pretrain_then_fine_tune_then_predict(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    main(["fit", "--config", PRETRAIN, *STEPS, *PRETRAIN_QUICK])
    pretrained = tmp_path / "runs" / "t5_span_corruption_tiny" / "latest" / "pretrained"
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= {p.name for p in pretrained.iterdir()}
    assert (tmp_path / "runs" / "t5_span_corruption_tiny" / "latest" / "checkpoints" / "last.ckpt").is_file()

    main(["fit", "--config", FINETUNE, *STEPS, *FINETUNE_QUICK])
    run = tmp_path / "runs" / "t5_text_to_text"
    (metrics_file,) = run.glob("version_*/metrics.csv")
    columns = next(csv.reader(metrics_file.open()))
    assert {"val_loss", "val_exact_match", "val_exact_match_beam", "train_loss"} <= set(columns)
    assert any(c.startswith("val_exact_match_") and c != "val_exact_match_beam" for c in columns)  # per task

    capsys.readouterr()
    main(["predict", "--config", FINETUNE, "--ckpt_path", str(run / "latest" / "checkpoints" / "last.ckpt"),
          *FINETUNE_QUICK, "--data.predict_inputs", "['params: def f(x, y):', 'statement: return x']"])
    printed = capsys.readouterr().out
    assert "params: def f(x, y):\n→ " in printed and "statement: return x\n→ " in printed

    with pytest.raises(SystemExit) as exit_info:  # a parser error: one line, no traceback
        main(["fit", "--config", FINETUNE, *STEPS, *FINETUNE_QUICK, "--data.allowed_prefixes", "[name, identifiers]"])
    assert exit_info.value.code == 2
    assert "error: built-in tasks ['params', 'statement'] have prefixes outside" in capsys.readouterr().err
