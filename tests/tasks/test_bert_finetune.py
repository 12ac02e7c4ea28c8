"""Fine-tuning tasks on a tiny random BERT: every mode trains only what it should, sentence
pairs go through segment ids, regression, token labels, QA spans, and bad setups (label count
mismatch, wrong vocabulary, GPT checkpoints) are refused with clear errors. GPT-1's way
(``family="gpt"``): a classifier on the last real token learns, with or without the auxiliary
LM loss, from a GPT export and from scratch."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from tasks import (
    DocstringDataModule,
    DocstringQADataModule,
    QuestionAnsweringTask,
    SequenceClassificationTask,
    TokenClassificationTask,
)
from unitok.losses import causal_lm_loss
from unitok.models import BERT, GPT, BERTConfig, GPTConfig

V = 300


def saved(folder, model_class, config_class, preset: str) -> str:
    """A tiny random model of ``preset`` saved in ``folder`` (seeded)."""
    torch.manual_seed(0)
    model_class(config_class.from_name(preset, vocab_size=V, context_length=64)).save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def body_folder(tmp_path_factory):
    return saved(tmp_path_factory.mktemp("body"), BERT, BERTConfig, "bert-nano")


def batch(B=4, N=12, labels=None):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, V, (B, N), generator=g)
    seg = torch.zeros_like(ids)
    seg[:, N // 2:] = 1
    out = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "segment_ids": seg}
    if labels is not None:
        out["labels"] = labels
    return out


@pytest.mark.parametrize("mode", ["full", "frozen", "features"])
def test_each_mode_trains_what_it_should(body_folder, mode):
    task = SequenceClassificationTask(num_labels=3, vocab_size=V, context_length=64, pretrained=body_folder,
                                      mode=mode)
    trainable = {n for n, p in task.named_parameters() if p.requires_grad}
    if mode == "full":
        assert any(n.startswith("model.backbone.") for n in trainable)
    elif mode == "frozen":
        assert trainable == {"model.classifier.out.weight", "model.classifier.out.bias"}
    else:
        assert trainable == {"model.layer_mix.weights", "model.layer_mix.gamma", "model.classifier.out.weight",
                             "model.classifier.out.bias"}
    metrics = task._metrics(batch(labels=torch.tensor([0, 1, 2, 1])))
    metrics["loss"].backward()
    assert 0.0 <= float(metrics["acc"]) <= 1.0
    assert all(p.grad is not None for n, p in task.named_parameters() if p.requires_grad)


def test_regression_with_one_label(body_folder):
    task = SequenceClassificationTask(num_labels=1, vocab_size=V, context_length=64, pretrained=body_folder)
    metrics = task._metrics(batch(labels=torch.tensor([0.5, -1.0, 2.0, 0.0])))
    assert set(metrics) == {"loss", "mse"} and metrics["loss"] > 0


def test_token_classification_ignores_unlabelled_pieces(body_folder):
    task = TokenClassificationTask(num_labels=4, vocab_size=V, context_length=64, pretrained=body_folder)
    labels = torch.full((4, 12), -100)
    labels[:, 1:5] = torch.tensor([0, 1, 2, 3])
    metrics = task._metrics(batch(labels=labels))
    assert torch.isfinite(metrics["loss"])
    assert task(batch()).shape == (4, 12, 4)


def test_label_values_beyond_num_labels_are_refused(body_folder):
    task = SequenceClassificationTask(num_labels=2, vocab_size=V, context_length=64, pretrained=body_folder)
    with pytest.raises(ValueError, match=r"labels \[5\] are outside \[0, 2\).*num_labels=2"):
        task._metrics(batch(labels=torch.tensor([0, 1, 5, 1])))


def test_bad_setups_are_refused(body_folder, tmp_path):
    with pytest.raises(ValueError, match="the data's tokenizer has 999 tokens but the pretrained model"):
        SequenceClassificationTask(num_labels=2, vocab_size=999, context_length=64, pretrained=body_folder)
    with pytest.raises(ValueError, match="context_length=100 exceeds the pretrained model's 64"):
        SequenceClassificationTask(num_labels=2, vocab_size=V, context_length=100, pretrained=body_folder)
    GPT(GPTConfig.from_name("gpt-nano", vocab_size=V, context_length=64)).save_pretrained(tmp_path / "gpt")
    with pytest.raises(ValueError, match="holds a GPT checkpoint; fine-tuning needs a BERT or ELECTRA"):
        SequenceClassificationTask(num_labels=2, vocab_size=V, pretrained=str(tmp_path / "gpt"))
    with pytest.raises(FileNotFoundError, match="no config.json"):
        SequenceClassificationTask(num_labels=2, vocab_size=V, pretrained=str(tmp_path / "nothing"))
    with pytest.raises(ValueError, match="mode must be"):
        SequenceClassificationTask(num_labels=2, vocab_size=V, mode="partial")  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def gpt_folder(tmp_path_factory):
    return saved(tmp_path_factory.mktemp("gpt"), GPT, GPTConfig, "gpt-nano")


def first_token_batch(B: int = 16, seed: int = 0) -> dict[str, torch.Tensor]:
    """Label = which of two tokens opens the row, right-padded to varied lengths: the last real
    token must look back to the first one."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 2, (B,), generator=g)
    ids = torch.randint(10, V, (B, 12), generator=g)
    ids[:, 0] = 5 + labels
    lengths = torch.randint(4, 13, (B,), generator=g)
    mask = (torch.arange(12)[None] < lengths[:, None]).long()
    return {"input_ids": ids.masked_fill(mask == 0, 0), "attention_mask": mask,
            "segment_ids": torch.zeros_like(ids), "labels": labels}


def test_gpt_family_fine_tunes_a_gpt_export_from_its_last_real_token(gpt_folder):
    task = SequenceClassificationTask(num_labels=2, vocab_size=V, context_length=64, pretrained=gpt_folder,
                                      family="gpt", learning_rate=3e-3)
    assert isinstance(task.model, GPT) and task.model.config.num_labels == 2
    body = GPT.from_pretrained(gpt_folder)
    torch.testing.assert_close(task.model.backbone.state_dict(), body.backbone.state_dict())
    b = first_token_batch()
    assert task(b).shape == (16, 2)
    optimizer = torch.optim.AdamW(task.parameters(), lr=3e-3)
    with torch.no_grad():
        first = float(task._metrics(b)["loss"])
    for step in range(60):
        metrics = task._metrics(first_token_batch(seed=step))
        optimizer.zero_grad()
        metrics["loss"].backward()
        optimizer.step()
    task.eval()
    with torch.no_grad():
        held_out = task._metrics(first_token_batch(B=64, seed=1000))
    assert float(held_out["loss"]) < first and float(held_out["acc"]) > 0.9


def test_gpt_1s_auxiliary_lm_loss_is_added_with_its_weight(gpt_folder):
    options = dict(num_labels=2, vocab_size=V, context_length=64, pretrained=gpt_folder, family="gpt", dropout=0.0)
    plain = SequenceClassificationTask(**options)
    aux = SequenceClassificationTask(**options, lm_loss_weight=0.5)
    aux.model.classifier.load_state_dict(plain.model.classifier.state_dict())
    b = first_token_batch()
    p, a = plain._metrics(b), aux._metrics(b)
    assert "lm_loss" not in p and float(a["lm_loss"].detach()) > 0
    torch.testing.assert_close(a["loss"], p["loss"] + 0.5 * a["lm_loss"])
    # the fused LM head + loss scores what the logits would: the next real token
    mask = b["attention_mask"]
    expected = causal_lm_loss(aux.model(b["input_ids"], attention_mask=mask).logits,
                              b["input_ids"].masked_fill(mask == 0, -100))
    torch.testing.assert_close(a["lm_loss"], expected, atol=1e-6, rtol=1e-6)
    a["loss"].backward()
    assert aux.model.tok_embed.weight.grad is not None


def test_gpt_family_from_scratch_and_its_bad_setups(gpt_folder, body_folder):
    task = SequenceClassificationTask(num_labels=3, vocab_size=V, context_length=32, family="gpt", preset="gpt-nano")
    assert task.model.config.context_length == 32 and task.model.config.d_model == 64
    with pytest.raises(ValueError, match="family='gpt' classifies whole texts"):
        SequenceClassificationTask(num_labels=2, vocab_size=V, pretrained=gpt_folder, family="gpt", mode="frozen")
    with pytest.raises(ValueError, match="holds a BERT checkpoint; family='gpt' fine-tunes a GPT"):
        SequenceClassificationTask(num_labels=2, vocab_size=V, pretrained=body_folder, family="gpt")
    with pytest.raises(ValueError, match="lm_loss_weight must be ≥ 0, and > 0 only with family='gpt'"):
        SequenceClassificationTask(num_labels=2, vocab_size=V, pretrained=body_folder, lm_loss_weight=0.5)
    with pytest.raises(ValueError, match="family must be 'bert' or 'gpt'"):
        SequenceClassificationTask(num_labels=2, vocab_size=V, family="t5")  # type: ignore[arg-type]


def trainer(steps: int) -> L.Trainer:
    return L.Trainer(max_steps=steps, accelerator="cpu", logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False, val_check_interval=steps,
                     check_val_every_n_epoch=None, limit_val_batches=2, num_sanity_val_steps=0)


def test_sentence_pair_classification_trains_through_the_cli_path(tmp_path):
    dm = DocstringDataModule(task="match", packages=["json", "calendar"], vocab_size=400, context_length=48,
                             batch_size=8, train_per_class=16, val_per_class=4, cache_dir=str(tmp_path))
    L.seed_everything(0)
    task = SequenceClassificationTask(num_labels=2, vocab_size=dm.vocab_size, context_length=48, preset="bert-nano")
    trainer(10).fit(task, datamodule=dm)
    with pytest.raises(ValueError, match="label count mismatch: the data module has 2 labels"):
        trainer(1).fit(SequenceClassificationTask(num_labels=3, vocab_size=dm.vocab_size, context_length=48,
                                                  preset="bert-nano"), datamodule=dm)


def test_question_answering_learns_to_point_at_spans(tmp_path):
    dm = DocstringQADataModule(packages=["calendar"], vocab_size=400, context_length=96, n_candidates=2,
                               batch_size=8, val_per_class=8, cache_dir=str(tmp_path))
    L.seed_everything(0)
    task = QuestionAnsweringTask(vocab_size=dm.vocab_size, context_length=96, preset="bert-nano",
                                 learning_rate=2e-3)
    with torch.no_grad():
        first = float(task._metrics(next(iter(dm.train_dataloader())))["loss"])
    run = trainer(30)
    run.fit(task, datamodule=dm)
    assert float(run.callback_metrics["train_loss"]) < first
    assert 0.0 <= float(run.callback_metrics["val_exact_match"]) <= 1.0
    # predict: each held-out question's answer span as text, p(start)·p(end), the documented name
    records = [r for batch in run.predict(task, datamodule=dm) for r in batch]
    assert len(records) == 8 and all(isinstance(r["prediction"], str) and 0.0 <= r["score"] <= 1.0 for r in records)
    assert all(r["target"] and r["input"] for r in records)


def qa_batch(pairs, tok):
    from tokenizers_mm import pad_pairs

    encs = [tok.encode(q, c) for q, c in pairs]
    b = pad_pairs([(e.ids.tolist(), e.segments.tolist()) for e in encs], tok.pad_id)
    return {"input_ids": b.ids, "attention_mask": b.attention_mask, "segment_ids": b.segments}


def test_an_answer_lies_in_the_context_and_its_score_ignores_the_batchs_padding():
    from types import SimpleNamespace

    from tasks.bert_finetune import context_positions
    from tokenizers_mm import WordPieceTokenizer

    corpus = ["which function reads a file", "def read ( path ) : def write ( path , data ) :"] * 30
    tok = WordPieceTokenizer.train(iterator=corpus, vocab_size=120)
    short = ("which function reads", "def read ( path ) : def write ( path ) :")
    long = ("which function writes a file", "def write ( path , data ) : def read ( path ) : def read ( path ) :")
    batch_ = qa_batch([short, long], tok)
    allowed = context_positions(batch_["segment_ids"], batch_["attention_mask"])
    n_short = int(batch_["attention_mask"][0].sum())
    assert allowed[0, n_short - 1].item() is False and allowed[0, n_short - 2].item() is True  # [SEP] out
    assert int(allowed[0].sum()) == int(batch_["segment_ids"][0].sum()) - 1
    torch.manual_seed(0)
    task = QuestionAnsweringTask(vocab_size=tok.vocab_size, context_length=64, preset="bert-nano").eval()
    task._trainer = SimpleNamespace(datamodule=SimpleNamespace(tokenizer=tok))
    with torch.no_grad():  # a head that loves the closing [SEP] must still answer from the context
        task.model.span_head.out.bias.zero_()
        task.model.span_head.out.weight.zero_()
    alone = task.predict_step(qa_batch([short], tok), 0)[0]
    batched = task.predict_step(batch_, 0)[0]
    assert alone["prediction"] and alone["prediction"] == batched["prediction"]
    assert alone["score"] == pytest.approx(batched["score"], rel=1e-5)  # padding is not part of the softmax
    for bad in (0, -3, 2.5):
        with pytest.raises(ValueError, match=f"max_answer_length must be an integer ≥ 1, got {bad}"):
            QuestionAnsweringTask(vocab_size=V, max_answer_length=bad)


@pytest.mark.parametrize("task_name", ["MaskedLMTask", "ElectraTask"])
def test_predicting_a_text_longer_than_the_context_is_an_error_not_a_cut(task_name):
    # cut, the text loses its [MASK] and the answer fills nothing in, with a score of 0
    from types import SimpleNamespace

    import tasks
    from tokenizers_mm import WordPieceTokenizer

    tok = WordPieceTokenizer.train(iterator=["the parser reads the text and returns the words"] * 30, vocab_size=100)
    task = getattr(tasks, task_name)(vocab_size=tok.vocab_size, context_length=16, preset="bert-nano"
                                     if task_name == "MaskedLMTask" else "electra-nano").eval()
    task._trainer = SimpleNamespace(datamodule=SimpleNamespace(tokenizer=tok))
    assert task.predict_step(["the parser [MASK] the text"], 0)[0]["prediction"]
    with pytest.raises(ValueError, match="text 0: input of 28 tokens does not fit max_length"):
        task.predict_step(["the parser reads the text and returns the words " * 3 + "[MASK]"], 0)


def test_the_token_classification_pipeline_names_an_unknown_token_by_its_text():
    from tokenizers_mm import Processor, WordPieceTokenizer
    from unitok import pipeline

    tok = WordPieceTokenizer.train(iterator=["class parser pass"] * 30, vocab_size=60)
    torch.manual_seed(0)
    bert = BERT(BERTConfig.from_name("bert-nano", vocab_size=tok.vocab_size, context_length=32,
                                     heads=("token_classifier",), num_labels=2))
    bert.processor = Processor(text=tok, labels=("name", "other"))
    entities = pipeline("token-classification", model=bert, ignore_labels=())("class Ωmega pass")
    assert tok.encode("class Ωmega pass").tokens[2] == "[UNK]"  # what the word is to the model
    assert [e["word"] for e in entities] == ["class", "Ωmega", "pass"]  # Hugging Face's: the text it stands for

