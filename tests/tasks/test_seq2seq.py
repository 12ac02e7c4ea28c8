"""`Seq2SeqTask`: exact match counts a prediction up to its EOS, the loss is teacher-forced
cross-entropy that ignores padding, and mismatched vocabularies, special ids or tokenizers are
clear errors."""

from __future__ import annotations

import ast
import json
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
import torch.nn.functional as F

from tasks.data.t5 import TextToTextDataModule, train_t5_tokenizer
from tasks.seq2seq import Seq2SeqTask, exact_match
from tokenizers_mm import Processor
from unitok.models import T5, T5Config

V = 50


def tiny_task(**overrides) -> Seq2SeqTask:
    options = dict(vocab_size=V, eos_token_id=1, pad_token_id=0, dropout=0.0)
    return Seq2SeqTask(**{**options, **overrides})


def test_exact_match_counts_up_to_the_first_eos():
    generated = torch.tensor([[0, 5, 6, 1, 0],    # right, then padding
                              [0, 5, 1, 0, 0],    # stops too early
                              [0, 5, 6, 7, 8],    # never ends
                              [0, 5, 6, 1, 9]])   # right; whatever follows EOS does not count
    labels = torch.tensor([[5, 6, 1, -100], [5, 6, 1, -100], [5, 6, 7, 8], [5, 6, 1, -100]])
    assert exact_match(generated, labels, eos_token_id=1).tolist() == [True, False, False, True]


def test_exact_match_compares_the_texts_when_it_can_read_them():
    # "hello" is one piece in the target and five in the answer, a stray pad in another: the same text
    pieces = {5: "hello", 6: "h", 7: "e", 8: "l", 9: "o", 10: "help"}
    decode = lambda ids: "".join(pieces[i] for i in ids)  # noqa: E731
    generated = torch.tensor([[0, 6, 7, 8, 8, 9, 1],
                              [0, 0, 5, 1, 0, 0, 0],
                              [0, 10, 1, 0, 0, 0, 0],
                              [0, 6, 7, 8, 8, 9, 9]])  # never ends
    labels = torch.tensor([[5, 1], [5, 1], [5, 1], [5, 1]])
    assert exact_match(generated, labels, 1, decode, pad_token_id=0).tolist() == [True, True, False, False]
    assert exact_match(generated, labels, 1).tolist() == [False, False, False, False]  # ids alone


def test_the_loss_is_teacher_forced_cross_entropy_ignoring_padding():
    task = tiny_task().eval()
    batch = {"input_ids": torch.randint(2, V, (2, 7)), "attention_mask": torch.ones(2, 7, dtype=torch.long),
             "labels": torch.tensor([[5, 6, 7, 1], [8, 1, -100, -100]])}
    logits = task.model(batch["input_ids"], decoder_input_ids=torch.tensor([[0, 5, 6, 7], [0, 8, 1, 0]])).logits
    expected = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100)
    torch.testing.assert_close(task.loss(batch), expected)
    out = task.predict_ids(batch)
    assert out.shape[0] == 2 and out.shape[1] <= 1 + batch["labels"].shape[1] + 1
    assert (out[:, 0] == 0).all()  # decoding starts from <pad>, as in T5


def test_fine_tuning_checks_the_pretrained_models_vocabulary(tmp_path):
    tiny_task().model.save_pretrained(tmp_path / "t5")
    task = Seq2SeqTask(vocab_size=V, eos_token_id=1, pretrained=str(tmp_path / "t5"))
    assert task.model.config.vocab_size == V
    with pytest.raises(ValueError, match=r"the data's vocab_size=60 differs from the pretrained model's 50"):
        Seq2SeqTask(vocab_size=60, eos_token_id=1, pretrained=str(tmp_path / "t5"))
    with pytest.raises(ValueError, match="vocab_size is required"):
        Seq2SeqTask()
    with pytest.raises(ValueError, match=r"eval_num_beams must be an integer ≥ 2 or None \(None: greedy only\), got 1"):
        tiny_task(eval_num_beams=1)


def test_fine_tuning_refuses_a_data_tokenizer_other_than_the_one_saved_with_the_model(tmp_path):
    # two tokenizers of one size and the same special ids: only their pieces differ
    texts = [Path(ast.__file__).read_text(), Path(json.__file__).read_text()]
    saved, other = (train_t5_tokenizer([text], vocab_size=300, num_sentinels=2) for text in texts)
    assert saved.vocab_size == other.vocab_size == 300 and saved != other
    model = T5(T5Config.from_name("t5-tiny", vocab_size=300, n_layers=1))
    model.processor = Processor(text=saved)
    model.save_pretrained(tmp_path / "pretrained")
    other.save(tmp_path / "other")
    task = Seq2SeqTask(vocab_size=300, eos_token_id=1, pretrained=str(tmp_path / "pretrained"))
    task._trainer = SimpleNamespace(datamodule=TextToTextDataModule(tokenizer=str(tmp_path / "other")))
    message = (f"the data module's tokenizer (from {tmp_path / 'other'}) differs from the one saved with the "
               f"pretrained model ({tmp_path / 'pretrained'}): the same ids would mean other pieces; "
               f"set data.init_args.tokenizer: {tmp_path / 'pretrained'}")
    with pytest.raises(ValueError, match=re.escape(message)):
        task.setup("fit")
    task._trainer = SimpleNamespace(datamodule=TextToTextDataModule(tokenizer=str(tmp_path / "pretrained")))
    task.setup("fit")  # the model's own tokenizer


def save_checkpoint(task: Seq2SeqTask, path: Path, drop: tuple[str, ...] = ()) -> Path:
    """What ModelCheckpoint stores (``drop``: hyperparameters an older checkpoint lacks)."""
    hparams = {k: v for k, v in task.hparams.items() if k not in drop}
    torch.save({"state_dict": task.state_dict(), "hyper_parameters": hparams,
                "pytorch-lightning_version": L.__version__}, path)
    return path


@pytest.mark.parametrize("folder_then", ["deleted", "replaced"])
def test_a_checkpoint_fine_tuned_from_a_folder_reloads_its_own_model_without_the_folder(tmp_path, folder_then):
    torch.manual_seed(0)
    folder = tmp_path / "pretrained"
    T5(T5Config.from_name("t5-tiny", vocab_size=V, n_layers=1, dropout=0.0)).save_pretrained(folder)
    task = Seq2SeqTask(vocab_size=V, eos_token_id=1, pretrained=str(folder))
    checkpoint = save_checkpoint(task, tmp_path / "fine_tuned.ckpt")
    shutil.rmtree(folder)
    if folder_then == "replaced":  # the pretraining recipe run again: same shapes, another activation
        T5(T5Config.from_name("t5-tiny", vocab_size=V, n_layers=1, dropout=0.0,
                              activation="gelu")).save_pretrained(folder)
    loaded = Seq2SeqTask.load_from_checkpoint(checkpoint).eval()
    assert loaded.model.config == task.model.config and loaded.model.config.activation == "relu"
    ids = torch.tensor([[4, 5, 6, 1]])
    torch.testing.assert_close(loaded(ids, decoder_input_ids=ids).logits,
                               task.eval()(ids, decoder_input_ids=ids).logits)


def test_a_checkpoint_without_a_model_config_still_rebuilds_from_its_folder(tmp_path):
    folder = tmp_path / "pretrained"
    T5(T5Config.from_name("t5-tiny", vocab_size=V, n_layers=1)).save_pretrained(folder)
    task = Seq2SeqTask(vocab_size=V, eos_token_id=1, pretrained=str(folder))
    checkpoint = save_checkpoint(task, tmp_path / "older.ckpt", drop=("model_config",))
    loaded = Seq2SeqTask.load_from_checkpoint(checkpoint)
    assert loaded.model.config == task.model.config
    assert loaded.hparams.model_config == json.loads(json.dumps(task.model.config.to_dict()))


class _Data(L.LightningDataModule):
    vocab_size, eos_token_id, pad_token_id = V, 1, 3

    def train_dataloader(self):
        return [{"input_ids": torch.tensor([[4, 1]]), "labels": torch.tensor([[5, 1]])}]

    val_dataloader = train_dataloader


def test_a_data_module_with_another_pad_id_is_a_clear_error():
    trainer = L.Trainer(max_steps=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    with pytest.raises(ValueError, match="the data module's pad_token_id=3 differs from the model's pad_token_id=0"):
        trainer.fit(tiny_task(), datamodule=_Data())
