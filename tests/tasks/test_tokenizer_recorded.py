"""A checkpoint records the tokenizer its model was trained with (``trained_tokenizer``): a model
rebuilt from the checkpoint's ``model_config`` carries no tokenizer of its own, so ``unitok
test / validate / predict --ckpt_path`` (and a resumed ``fit``, whose tokenizer folder may have
been written again) with another tokenizer of the same size — which passes every id check, but
whose ids mean other pieces — is refused, naming both.
The tokenizer it was trained with runs; a checkpoint written before the record is taken as it is.
Fine-tuned (T5, BERT, GPT), pretrained (GPT, BERT) and multi-task models record it alike, and a model
loaded from a ``pretrained`` folder reads data with that folder's tokenizer only."""

from __future__ import annotations

import ast
import json
import re
import textwrap
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning as L
import pytest
import torch

from tasks import Seq2SeqTask
from tasks.cli import main
from tasks.data.t5 import train_t5_tokenizer
from tasks.recorded import TOKENIZER_KEY, tokenizer_fingerprint
from tokenizers_mm import BPETokenizer, Processor, WordPieceTokenizer
from unitok.models import T5, T5Config

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[2]
STEPS = ["--trainer.max_steps", "2", "--trainer.val_check_interval", "2", "--trainer.limit_val_batches", "1",
         "--trainer.limit_test_batches", "1", "--trainer.enable_progress_bar", "false",
         "--trainer.enable_model_summary", "false"]
TEXTS = [Path(ast.__file__).read_text(), Path(json.__file__).read_text()]  # two tokenizers' training texts


def refusal(capsys, argv: list[str]) -> str:
    """The one-line error ``unitok`` exits with (status 2)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


# --------------------------------------------------------------------------- T5 fine-tuned from a folder

T5_RECIPE = str(ROOT / "configs" / "t5" / "text_to_text.yaml")
T5_QUICK = ["--data.builtin_max_bytes", "150000", "--data.batch_size", "4", "--data.val_per_task", "2",
            "--data.max_input_length", "32", "--data.max_target_length", "16", "--model.max_new_tokens", "4",
            "--model.eval_num_beams", "null", *STEPS]


def test_a_t5_checkpoint_refuses_another_tokenizer_of_its_size(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    saved, other = (train_t5_tokenizer([text], vocab_size=300, num_sentinels=2) for text in TEXTS)
    assert saved.vocab_size == other.vocab_size == 300 and saved != other
    model = T5(T5Config.from_name("t5-tiny", vocab_size=300, n_layers=1, n_decoder_layers=1))
    model.processor = Processor(text=saved)
    folder, other_folder = tmp_path / "pretrained", tmp_path / "other"
    model.save_pretrained(folder)
    other.save(other_folder)
    main(["fit", "--config", T5_RECIPE, *T5_QUICK, "--model.pretrained", str(folder), "--data.tokenizer", str(folder)])
    ckpt = tmp_path / "runs" / "t5_text_to_text" / "version_0" / "checkpoints" / "last.ckpt"
    recorded = torch.load(ckpt, weights_only=True)["hyper_parameters"][TOKENIZER_KEY]
    assert recorded == {"sha1": tokenizer_fingerprint(saved), "source": str(folder)}

    test = ["test", "--config", T5_RECIPE, *T5_QUICK, "--model.pretrained", str(folder), "--ckpt_path", str(ckpt)]
    message = (f"the data module's tokenizer (from {other_folder}) differs from the one the checkpoint's model was "
               f"trained with (from {folder}): the same ids would mean other pieces; "
               f"set data.init_args.tokenizer: {folder}")
    for command in ("test", "validate", "predict"):
        assert message in refusal(capsys, [command, *test[1:], "--data.tokenizer", str(other_folder)])

    main([*test, "--data.tokenizer", str(folder)])  # the tokenizer it was trained with
    logs = (tmp_path / "runs" / "t5_text_to_text").glob("version_*/metrics.csv")
    assert any("test_loss" in log.read_text() for log in logs)


def test_a_tokenizer_written_again_in_the_same_folder_is_refused_too(tmp_path):
    folder = tmp_path / "tok"
    first, second = (train_t5_tokenizer([text], vocab_size=300, num_sentinels=2) for text in TEXTS)
    first.save(folder)
    task = Seq2SeqTask(vocab_size=300, eos_token_id=1, n_layers=1)
    task._trainer = SimpleNamespace(datamodule=SimpleNamespace(tokenizer=BPETokenizer.load(folder),
                                                               tokenizer_path=str(folder)))
    task.setup("fit")  # fitting records the data's tokenizer
    checkpoint = {"hyper_parameters": dict(task.hparams)}
    second.save(folder)
    task._trainer.datamodule.tokenizer = BPETokenizer.load(folder)
    message = (f"the data module's tokenizer (from {folder}) differs from the one the checkpoint's model was "
               f"trained with (from {folder}, written again since): the same ids would mean other pieces; "
               "give the data module the tokenizer exported with the model (its run's pretrained/ folder)")
    fresh = Seq2SeqTask(vocab_size=300, eos_token_id=1, n_layers=1)
    fresh._trainer = task._trainer
    with pytest.raises(ValueError, match=re.escape(message)):
        fresh.on_load_checkpoint(checkpoint)


def test_a_checkpoint_without_the_record_is_taken_as_it_is(tmp_path):
    tokenizer = train_t5_tokenizer([TEXTS[0]], vocab_size=300, num_sentinels=2)
    task = Seq2SeqTask(vocab_size=300, eos_token_id=1, n_layers=1)
    task._trainer = SimpleNamespace(datamodule=SimpleNamespace(tokenizer=tokenizer, tokenizer_path=None))
    task.on_load_checkpoint({"hyper_parameters": {"model_config": task.hparams.model_config}})
    task.setup("test")
    assert TOKENIZER_KEY not in task.hparams  # nothing recorded outside fitting


def test_load_from_checkpoint_keeps_the_record_and_checks_it_in_setup(tmp_path):
    saved, other = (train_t5_tokenizer([text], vocab_size=300, num_sentinels=2) for text in TEXTS)
    task = Seq2SeqTask(vocab_size=300, eos_token_id=1, n_layers=1)
    task._trainer = SimpleNamespace(datamodule=SimpleNamespace(tokenizer=saved, tokenizer_path=None))
    task.setup("fit")
    path = tmp_path / "fitted.ckpt"  # what ModelCheckpoint stores
    torch.save({"state_dict": task.state_dict(), "hyper_parameters": dict(task.hparams),
                "pytorch-lightning_version": L.__version__}, path)
    loaded = Seq2SeqTask.load_from_checkpoint(path)
    assert loaded.hparams[TOKENIZER_KEY] == task.hparams[TOKENIZER_KEY]
    loaded._trainer = SimpleNamespace(datamodule=SimpleNamespace(tokenizer=other, tokenizer_path="other/"))
    with pytest.raises(ValueError, match=r"the data module's tokenizer \(from other/\) differs from the one the "
                                         r"checkpoint's model was trained with \(trained by its run's data module\)"):
        loaded.setup("test")
    loaded._trainer = task._trainer
    loaded.setup("test")


# --------------------------------------------------------------------------- BERT fine-tuned, then tested

BERT_RECIPE = str(ROOT / "configs" / "bert" / "finetune_cls.yaml")
BERT_QUICK = ["--data.context_length", "24", "--data.batch_size", "4", "--data.val_per_class", "4",
              "--data.train_per_class", "8", "--data.test_per_class", "2", "--model.pretrained", "null", *STEPS]


def wordpiece(text: str) -> WordPieceTokenizer:
    return WordPieceTokenizer.train(iterator=textwrap.wrap(text, 200), vocab_size=300)


def saved_pair(folder: Path, make: Callable[[str], Any]) -> tuple[Any, Any]:
    """Two tokenizers of one size made from the two texts, saved as ``folder/trained`` and ``folder/other``."""
    trained, other = make(TEXTS[0]), make(TEXTS[1])
    assert trained.vocab_size == other.vocab_size and trained != other
    trained.save(folder / "trained")
    other.save(folder / "other")
    return trained, other


def test_a_fine_tuned_bert_checkpoint_refuses_another_tokenizer_of_its_size(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    saved_pair(tmp_path, wordpiece)
    main(["fit", "--config", BERT_RECIPE, *BERT_QUICK, "--data.tokenizer", str(tmp_path / "trained")])
    ckpt = str(tmp_path / "runs" / "bert_finetune_cls" / "version_0" / "checkpoints" / "last.ckpt")
    test = ["test", "--config", BERT_RECIPE, *BERT_QUICK, "--ckpt_path", ckpt]
    err = refusal(capsys, [*test, "--data.tokenizer", str(tmp_path / "other")])
    assert (f"the data module's tokenizer (from {tmp_path / 'other'}) differs from the one the checkpoint's model "
            f"was trained with (from {tmp_path / 'trained'})") in err
    main([*test, "--data.tokenizer", str(tmp_path / "trained")])


# --------------------------------------------------------------------------- pretraining: GPT and BERT

GPT_RECIPE = str(ROOT / "configs" / "gpt" / "tiny.yaml")
GPT_QUICK = ["--data.builtin_max_bytes", "60000", "--data.context_length", "16", "--data.batch_size", "4",
             "--model.preset", "gpt-nano", *STEPS]


def bpe(text: str) -> BPETokenizer:
    return BPETokenizer.train(iterator=textwrap.wrap(text, 200), vocab_size=300)


def test_a_pretrained_gpt_checkpoint_refuses_another_tokenizer_of_its_size(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    trained, _ = saved_pair(tmp_path, bpe)
    main(["fit", "--config", GPT_RECIPE, *GPT_QUICK, "--data.tokenizer", str(tmp_path / "trained")])
    ckpt = tmp_path / "runs" / "gpt_tiny" / "version_0" / "checkpoints" / "last.ckpt"
    recorded = torch.load(ckpt, weights_only=True)["hyper_parameters"][TOKENIZER_KEY]
    assert recorded == {"sha1": tokenizer_fingerprint(trained), "source": str(tmp_path / "trained")}
    test = ["test", "--config", GPT_RECIPE, *GPT_QUICK, "--ckpt_path", str(ckpt)]
    for command in ("test", "validate"):
        err = refusal(capsys, [command, *test[1:], "--data.tokenizer", str(tmp_path / "other")])
        assert (f"the data module's tokenizer (from {tmp_path / 'other'}) differs from the one the checkpoint's "
                f"model was trained with (from {tmp_path / 'trained'})") in err
    main([*test, "--data.tokenizer", str(tmp_path / "trained")])
    assert any("test_loss" in log.read_text() for log in (tmp_path / "runs" / "gpt_tiny").glob("version_*/metrics.csv"))


def test_a_masked_lm_checkpoint_refuses_another_tokenizer_of_its_size():
    from tasks import MaskedLMTask

    trained, other = wordpiece(TEXTS[0]), wordpiece(TEXTS[1])
    task = MaskedLMTask(vocab_size=300, context_length=16, n_layers=1)
    task._trainer = SimpleNamespace(datamodule=SimpleNamespace(tokenizer=trained, tokenizer_path=None))
    task.setup("fit")  # fitting records the data's tokenizer
    assert task.hparams[TOKENIZER_KEY] == {"sha1": tokenizer_fingerprint(trained), "source": None}
    fresh = MaskedLMTask(vocab_size=300, context_length=16, n_layers=1)
    fresh._trainer = SimpleNamespace(datamodule=SimpleNamespace(tokenizer=other, tokenizer_path="other/"))
    with pytest.raises(ValueError, match=r"the data module's tokenizer \(from other/\) differs from the one the "
                                         r"checkpoint's model was trained with \(trained by its run's data module\)"):
        fresh.on_load_checkpoint({"hyper_parameters": dict(task.hparams)})
    fresh._trainer = task._trainer
    fresh.on_load_checkpoint({"hyper_parameters": dict(task.hparams)})  # the tokenizer it was trained with


def test_multi_task_data_gives_the_text_tokenizer_its_tasks_share():
    from tasks.data.combined import MultiTaskDataModule
    from tasks.recorded import check_trained_tokenizer

    trained, other = bpe(TEXTS[0]), bpe(TEXTS[1])
    images = SimpleNamespace(processor=lambda: Processor(labels=("0", "1")))  # no text: skipped
    data = MultiTaskDataModule({"digits": images, "text": SimpleNamespace(  # type: ignore[dict-item]
        processor=lambda: Processor(text=trained), tokenizer_path="tok/")})
    module = SimpleNamespace(hparams={})
    check_trained_tokenizer(module, data, "fit")
    assert module.hparams[TOKENIZER_KEY] == {"sha1": tokenizer_fingerprint(trained), "source": "tok/"}
    data.tasks["text"] = SimpleNamespace(processor=lambda: Processor(text=other), tokenizer_path="tok/")
    with pytest.raises(ValueError, match=r"\(from tok/\) differs .* \(from tok/, written again since\)"):
        check_trained_tokenizer(module, data, "test")


# --------------------------------------------------------------------------- fine-tuning from a folder

def test_fine_tuning_a_pretrained_folder_refuses_data_read_with_another_tokenizer(tmp_path, monkeypatch, capsys):
    from unitok.models import BERT, BERTConfig

    monkeypatch.chdir(tmp_path)
    saved, other = wordpiece(TEXTS[0]), wordpiece(TEXTS[1])
    body = BERT(BERTConfig.from_name("bert-micro", vocab_size=saved.vocab_size, context_length=32, n_layers=1))
    body.processor = Processor(text=saved)
    folder = tmp_path / "pretrained"
    body.save_pretrained(folder)
    other.save(tmp_path / "other")
    fit = ["fit", "--config", BERT_RECIPE, *BERT_QUICK, "--model.pretrained", str(folder)]
    err = refusal(capsys, [*fit, "--data.tokenizer", str(tmp_path / "other")])
    assert (f"the data module's tokenizer (from {tmp_path / 'other'}) differs from the one saved with the pretrained "
            f"model ({folder}): the same ids would mean other pieces; set data.init_args.tokenizer: {folder}") in err
    main([*fit, "--data.tokenizer", str(folder)])  # the folder's own tokenizer
    assert list((tmp_path / "runs" / "bert_finetune_cls").glob("version_*/checkpoints/last.ckpt"))


def test_a_t5_folder_refuses_data_read_with_another_tokenizer(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    saved, other = (train_t5_tokenizer([text], vocab_size=300, num_sentinels=2) for text in TEXTS)
    model = T5(T5Config.from_name("t5-tiny", vocab_size=300, n_layers=1, n_decoder_layers=1))
    model.processor = Processor(text=saved)
    folder = tmp_path / "pretrained"
    model.save_pretrained(folder)
    other.save(tmp_path / "other")
    err = refusal(capsys, ["fit", "--config", T5_RECIPE, *T5_QUICK, "--model.pretrained", str(folder),
                           "--data.tokenizer", str(tmp_path / "other")])
    assert f"differs from the one saved with the pretrained model ({folder})" in err
