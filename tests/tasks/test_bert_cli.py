"""The BERT recipes through the `unitok` command: each parses; MLM pretraining, ELECTRA and
fine-tuning (from either checkpoint) run a couple of steps with tiny overrides, export
their folders, and `predict` fills in [MASK]s; bad setups fail with clear errors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tasks.cli import main

ROOT = Path(__file__).resolve().parents[2]
RECIPES = {name: ROOT / "configs" / "bert" / f"{name}.yaml" for name in ("mlm_tiny", "finetune_cls", "finetune_tokens",
                                                                 "electra_tiny")}
STEPS = ["--trainer.max_steps", "2", "--trainer.val_check_interval", "2", "--trainer.limit_val_batches", "1",
         "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]
PRETRAIN = ["--data.builtin_max_bytes", "120000", "--data.vocab_size", "300", "--data.context_length", "24",
            "--data.batch_size", "4", "--data.val_samples", "8", *STEPS]
FINETUNE = ["--data.context_length", "24", "--data.batch_size", "4", "--data.val_per_class", "4",
            "--data.train_per_class", "8", *STEPS]


@pytest.mark.parametrize("name", list(RECIPES))
def test_recipe_parses_and_says_what_it_shows(name, capsys):
    text = RECIPES[name].read_text()
    header = text.split("seed_everything")[0]
    assert text.startswith("#") and re.search(r"\d+ (s|minutes?)\b", header)  # what it shows, how long
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(RECIPES[name]), "--print_config"])
    assert exit_info.value.code in (0, None)
    assert "class_path: tasks." in capsys.readouterr().out


@pytest.mark.slow
def test_pretrain_predict_and_fine_tune_from_bert_and_electra(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    main(["fit", "--config", str(RECIPES["mlm_tiny"]), *PRETRAIN])
    bert = tmp_path / "runs" / "bert_mlm_tiny" / "latest" / "pretrained"
    assert {"model.safetensors", "config.json", "tokenizer.json", "vocab.txt"} <= {p.name for p in bert.iterdir()}
    assert list((tmp_path / "runs" / "bert_mlm_tiny").glob("version_*/metrics.csv"))

    main(["predict", "--config", str(RECIPES["mlm_tiny"]), *PRETRAIN,
          "--ckpt_path", str(tmp_path / "runs" / "bert_mlm_tiny" / "latest" / "checkpoints" / "last.ckpt"),
          "--data.predict_texts", "['import [MASK]']"])
    assert "import [MASK]  ->  import" in capsys.readouterr().out

    main(["fit", "--config", str(RECIPES["finetune_cls"]), *FINETUNE])
    assert (tmp_path / "runs" / "bert_finetune_cls" / "latest" / "pretrained" / "model.safetensors").is_file()
    main(["fit", "--config", str(RECIPES["finetune_cls"]), *FINETUNE, "--model.mode", "features"])
    main(["fit", "--config", str(RECIPES["finetune_tokens"]), *FINETUNE])
    assert (tmp_path / "runs" / "bert_finetune_tokens" / "latest" / "pretrained" / "model.safetensors").is_file()

    main(["fit", "--config", str(RECIPES["electra_tiny"]), *PRETRAIN])
    electra = tmp_path / "runs" / "electra_tiny" / "latest" / "pretrained"
    assert '"family": "ELECTRA"' in (electra / "config.json").read_text()
    main(["fit", "--config", str(RECIPES["finetune_cls"]), *FINETUNE, "--model.pretrained", str(electra),
          "--data.tokenizer", str(electra), "--model.mode", "frozen"])


def test_fine_tuning_without_the_pretrained_folder_is_a_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as error:
        main(["fit", "--config", str(RECIPES["finetune_cls"]), *FINETUNE])
    assert error.value.code == 2
    assert "runs/bert_mlm_tiny/latest/pretrained does not exist" in capsys.readouterr().err


@pytest.mark.slow
def test_label_count_mismatch_is_a_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    main(["fit", "--config", str(RECIPES["mlm_tiny"]), *PRETRAIN])
    capsys.readouterr()
    with pytest.raises(SystemExit) as refused:  # refused as the data is read: one line, exit 2
        main(["fit", "--config", str(RECIPES["finetune_cls"]), *FINETUNE, "--model.num_labels", "3"])
    err = capsys.readouterr().err
    assert refused.value.code == 2 and "label count mismatch: the data module has 4 labels" in err
    assert "Traceback" not in err


def test_a_features_mode_run_exports_its_layer_mix_and_classifier_in_the_model_folder(tmp_path, monkeypatch, capsys):
    # the layer mix and its classifier are part of the model's config: the exported folder loads as
    # the trained classifier (the checkpoint's scores), ready for the text-classification pipeline
    import ast
    import textwrap

    import torch

    from tasks import SequenceClassificationTask
    from tokenizers_mm import WordPieceTokenizer
    from unitok import load, pipeline

    monkeypatch.chdir(tmp_path)
    WordPieceTokenizer.train(iterator=textwrap.wrap(Path(ast.__file__).read_text(), 200), vocab_size=300).save("tok")
    quick = ["--data.tokenizer", "tok", "--data.context_length", "24", "--data.batch_size", "4", "--data.val_per_class", "4",
             "--data.train_per_class", "8", "--data.test_per_class", "2", "--model.pretrained", "null",
             "--model.feature_layers", "[0, 1, 2]", "--trainer.max_steps", "3", "--trainer.limit_val_batches", "1",
             "--trainer.limit_test_batches", "1", "--trainer.enable_progress_bar", "false",
             "--trainer.enable_model_summary", "false"]
    main(["fit", "--config", str(RECIPES["finetune_cls"]), *quick, "--model.mode", "features"])
    assert "exported the model and its processor (text) to" in capsys.readouterr().out
    run = tmp_path / "runs" / "bert_finetune_cls" / "latest"
    model = load(run / "pretrained")
    assert not model.training and model.config.classifier_layers == (0, 1, 2) and model.pooler is None
    task = SequenceClassificationTask.load_from_checkpoint(run / "checkpoints" / "last.ckpt").eval()
    assert not torch.equal(task.model.layer_mix.weights, torch.zeros(3)), "the mix trained"
    ids = torch.randint(5, 300, (3, 24), generator=torch.Generator().manual_seed(0))
    mask = (torch.arange(24) < torch.tensor([[24], [10], [3]])).long()
    with torch.no_grad():
        torch.testing.assert_close(model(ids, mask).logits, task({"input_ids": ids, "attention_mask": mask}),
                                   rtol=0, atol=0)
    answer = pipeline("text-classification", model=str(run / "pretrained"))("import ast")
    assert answer["label"] in model.processor.labels and 0 < answer["score"] <= 1
    main(["test", "--config", str(RECIPES["finetune_cls"]), *quick, "--model.mode", "features", "--ckpt_path", "last"])
    assert "test_acc" in capsys.readouterr().out
