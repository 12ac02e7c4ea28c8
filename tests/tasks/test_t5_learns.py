"""A tiny T5 learns on the built-in corpus: span-corruption loss falls clearly, and a text-to-text
run mixing two prefixed tasks answers held-out examples (from files it never saw) exactly, with
beam search at least as good as greedy decoding."""

from __future__ import annotations

import lightning as L
import pytest

from tasks import Seq2SeqTask, SpanCorruptionDataModule, TextToTextDataModule

CORPUS = dict(builtin_max_bytes=2_000_000, vocab_size=1024)  # one tokenizer, trained once for both tests


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("cache"))


def trainer(steps: int, **options) -> L.Trainer:
    return L.Trainer(max_steps=steps, accelerator="cpu", logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                     val_check_interval=steps, check_val_every_n_epoch=None, **options)


def test_span_corruption_loss_falls_clearly(cache):
    dm = SpanCorruptionDataModule(**CORPUS, context_length=64, batch_size=16, train_samples=16 * 100, cache_dir=cache)
    dm.prepare_data()
    L.seed_everything(0)
    task = Seq2SeqTask(vocab_size=dm.vocab_size, eos_token_id=dm.eos_token_id, dropout=0.0, learning_rate=3e-3,
                       warmup_steps=20)
    fit = trainer(100, limit_val_batches=8)
    before = fit.validate(task, datamodule=dm, verbose=False)[0]["val_loss"]
    fit.fit(task, datamodule=dm)
    after = float(fit.callback_metrics["val_loss"])
    print(f"span corruption val loss {before:.2f} -> {after:.2f}")
    assert before > 6.0  # near ln(1024) ≈ 6.9 at the start (7.33 measured)
    assert after < before - 2.0, f"val loss only fell from {before:.2f} to {after:.2f}"  # 4.94 measured


@pytest.mark.slow
def test_text_to_text_answers_held_out_examples_and_beam_is_no_worse(cache):
    # "statement: <line>" -> its kind (a classification written as text) and
    # "params: <def line>" -> its parameter names, mixed in one run.
    dm = TextToTextDataModule(tasks=["statement", "params"], **CORPUS, max_chars=50, max_target_length=16,
                              val_per_task=100, batch_size=32, cache_dir=cache)
    dm.prepare_data()
    L.seed_everything(0)
    task = Seq2SeqTask(vocab_size=dm.vocab_size, eos_token_id=dm.eos_token_id, dropout=0.0, learning_rate=5e-3,
                       warmup_steps=30, eval_num_beams=4)
    fit = trainer(400)
    fit.fit(task, datamodule=dm)
    m = {k: float(v) for k, v in fit.callback_metrics.items()}
    print({k: round(v, 3) for k, v in m.items() if "exact" in k})
    # Measured: statement 0.99; both tasks' 200 held-out examples 0.60 greedy, 0.625 with 4 beams
    # (params 0.21 / 0.26: the tiny model has barely begun to copy names in 400 steps).
    assert m["val_exact_match_statement"] >= 0.9
    assert m["val_exact_match"] >= 0.5
    assert m["val_exact_match_beam"] >= m["val_exact_match"]
