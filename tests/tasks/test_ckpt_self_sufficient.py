"""A checkpoint fine-tuned from a ``pretrained:`` folder is self-sufficient: ``unitok test /
validate / predict --ckpt_path`` (and a resumed ``fit``) rebuild the model from the config the
checkpoint recorded (``model_config``), so they score the checkpoint's weights in the checkpoint's
architecture whether the starting folder is still there, was written again with another
architecture of the same shapes, or is gone."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import lightning as L
import pytest
import torch

from tasks import (
    QuestionAnsweringTask,
    SequenceClassificationTask,
    TokenClassificationTask,
    record_episodes,
    save_trajectories,
)
from tasks.cli import main
from unitok.models import BERT, BERTConfig, DecisionTransformer, DecisionTransformerConfig

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[2]
STEPS = ["--trainer.max_steps", "2", "--trainer.val_check_interval", "2", "--trainer.limit_val_batches", "1",
         "--trainer.limit_test_batches", "1", "--trainer.enable_progress_bar", "false",
         "--trainer.enable_model_summary", "false"]


def logged_test_metrics(run: Path) -> dict[str, float]:
    """The test metrics a ``unitok test`` run logged."""
    rows = list(csv.DictReader((run / "metrics.csv").open()))
    return {k: float(v) for row in rows for k, v in row.items() if k.startswith("test_") and v}


# --------------------------------------------------------------------------- BERT (no model_config before)

BERT_RECIPES = ROOT / "configs" / "bert"
PRETRAIN = ["--data.builtin_max_bytes", "120000", "--data.vocab_size", "300", "--data.context_length", "24",
            "--data.batch_size", "4", "--data.val_samples", "8", *STEPS]
FINETUNE = ["--data.context_length", "24", "--data.batch_size", "4", "--data.val_per_class", "4",
            "--data.train_per_class", "8", "--data.test_per_class", "2", *STEPS]


def test_a_fine_tuned_bert_checkpoint_tests_without_its_starting_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    main(["fit", "--config", str(BERT_RECIPES / "mlm_tiny.yaml"), *PRETRAIN])  # runs/bert_mlm_tiny/latest/pretrained
    main(["fit", "--config", str(BERT_RECIPES / "finetune_cls.yaml"), *FINETUNE])
    runs = tmp_path / "runs" / "bert_finetune_cls"
    ckpt = str(runs / "version_0" / "checkpoints" / "last.ckpt")
    # the data module reads the tokenizer exported with the fine-tuned model, so that only the model's
    # folder (model.init_args.pretrained: runs/bert_mlm_tiny/latest/pretrained) is in question
    test = ["test", "--config", str(BERT_RECIPES / "finetune_cls.yaml"), *FINETUNE, "--ckpt_path", ckpt,
            "--data.tokenizer", str(runs / "version_0" / "pretrained")]
    main(test)
    scored = logged_test_metrics(runs / "version_1")
    assert "test_acc" in scored

    # the pretraining recipe run again with another architecture of the same shapes: `latest` moves to it
    main(["fit", "--config", str(BERT_RECIPES / "mlm_tiny.yaml"), *PRETRAIN, "--model.n_heads", "1"])
    main(test)
    assert logged_test_metrics(runs / "version_2") == scored  # the checkpoint's model, not the new folder's
    assert "model_config: null" in (runs / "version_2" / "config.yaml").read_text()  # the recipe's, as it was

    shutil.rmtree(tmp_path / "runs" / "bert_mlm_tiny")
    capsys.readouterr()
    main(test)  # no "does not exist: it is another run's export"
    assert logged_test_metrics(runs / "version_3") == scored
    main(["validate", *test[1:]])
    main(["predict", *test[1:]])
    listed = capsys.readouterr().out  # only the data's tokenizer is listed as another setting
    assert "data.init_args.tokenizer:" in listed and "model_config" not in listed


@pytest.mark.parametrize("task_class, options", [
    (SequenceClassificationTask, {"num_labels": 3, "mode": "frozen"}),
    (SequenceClassificationTask, {"num_labels": 3, "mode": "features"}),
    (TokenClassificationTask, {"num_labels": 3}),
    (QuestionAnsweringTask, {}),
], ids=["sequence-frozen", "sequence-features", "token", "qa"])
def test_a_bert_fine_tuning_checkpoint_reloads_its_own_body_without_the_folder(tmp_path, task_class, options):
    folder = tmp_path / "body"
    BERT(BERTConfig.from_name("bert-nano", vocab_size=300, context_length=64)).save_pretrained(folder)
    task = task_class(vocab_size=300, context_length=64, pretrained=str(folder), **options)
    checkpoint = tmp_path / "fine_tuned.ckpt"  # what ModelCheckpoint stores
    torch.save({"state_dict": task.state_dict(), "hyper_parameters": dict(task.hparams),
                "pytorch-lightning_version": L.__version__}, checkpoint)
    shutil.rmtree(folder)
    BERT(BERTConfig.from_name("bert-nano", vocab_size=300, context_length=64, n_heads=1)).save_pretrained(folder)
    loaded = task_class.load_from_checkpoint(checkpoint).eval()
    assert loaded.model.config == task.model.config and loaded.model.config.n_heads != 1
    ids = torch.randint(5, 300, (2, 12))
    torch.testing.assert_close(loaded.model(ids).last_hidden_state, task.eval().model(ids).last_hidden_state)
    trainable = lambda t: {n for n, p in t.named_parameters() if p.requires_grad}  # noqa: E731
    assert trainable(loaded) == trainable(task)  # the mode's frozen parts too


# --------------------------------------------------------------------------- Decision Transformer (model_config)

OFFLINE = ROOT / "configs" / "dt" / "offline.yaml"


@pytest.fixture
def dt_run(tmp_path, monkeypatch):
    """A pendulum data file, a tiny pretrained folder, and `unitok fit` options that fine-tune it."""
    monkeypatch.chdir(tmp_path)
    path = save_trajectories(record_episodes("Pendulum-v1", 3, "noisy", seed=0), tmp_path / "trajectories.npz")
    folder = tmp_path / "pre"
    DecisionTransformer(DecisionTransformerConfig.from_name("dt-tiny", state_dim=3, act_dim=1,
                                                            context_length=20)).save_pretrained(folder)
    options = [*STEPS, "--data.batch_size", "8", "--model.eval_episodes", "0", "--data.path", str(path),
               "--data.env_id", "Pendulum-v1", "--model.pretrained", str(folder)]
    main(["fit", "--config", str(OFFLINE), *options])
    return folder, options, tmp_path / "runs" / "dt_offline"


def test_a_fine_tuned_decision_transformer_tests_from_its_checkpoint_alone(dt_run):
    folder, options, runs = dt_run
    test = ["test", "--config", str(OFFLINE), *options, "--ckpt_path", str(runs / "version_0" / "checkpoints" /
                                                                            "last.ckpt")]
    main(test)
    scored = logged_test_metrics(runs / "version_1")
    shutil.rmtree(folder)  # written again: the same shapes, another activation
    DecisionTransformer(DecisionTransformerConfig.from_name("dt-tiny", state_dim=3, act_dim=1, context_length=20,
                                                            activation="gelu")).save_pretrained(folder)
    main(test)
    assert logged_test_metrics(runs / "version_2") == scored
    shutil.rmtree(folder)
    main(test)
    assert logged_test_metrics(runs / "version_3") == scored


def test_a_run_fine_tuned_from_a_folder_resumes_without_it(dt_run):
    folder, options, runs = dt_run
    shutil.rmtree(folder)
    main(["fit", "--config", str(OFFLINE), *options, "--trainer.max_steps", "3", "--ckpt_path", "last"])
    checkpoint = torch.load(runs / "version_1" / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["global_step"] == 3
    assert checkpoint["unitok_settings"]["model.init_args.model_config"] is None  # the recipe's, as recorded
    # the resumed run's own config resumes it again: it holds the recipe's settings, not the checkpoint's config
    main(["fit", "--config", str(runs / "version_1" / "config.yaml"), "--trainer.max_steps", "4",
          "--ckpt_path", "last"])
    assert torch.load(runs / "version_2" / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 4
