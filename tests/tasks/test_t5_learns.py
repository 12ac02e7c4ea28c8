"""A tiny T5 learns on the built-in corpus: span-corruption loss falls clearly below the unigram
baseline and rises when the model is given another example's source, and a text-to-text
run mixing two prefixed tasks answers held-out examples (from files it never saw) exactly, with
beam search at least as good as greedy decoding."""

from __future__ import annotations

import itertools

import lightning as L
import pytest
import torch

from tasks import Seq2SeqTask, SpanCorruptionDataModule, TextToTextDataModule

CORPUS = dict(builtin_max_bytes=2_000_000, vocab_size=1024)  # one tokenizer, trained once for both tests


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("cache"))


def trainer(steps: int, **options) -> L.Trainer:
    return L.Trainer(max_steps=steps, accelerator="cpu", logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                     val_check_interval=steps, check_val_every_n_epoch=None, **options)


def test_span_corruption_loss_falls_clearly_below_unigram_and_needs_the_source(cache):
    """Trained, the held-out loss is far below the unigram baseline (the targets' cross-entropy
    under the training targets' add-one frequencies: what a model that only knows which tokens
    are common gets) and below the same model's loss when each example is given another
    example's source, so it reads the corrupted input: a decoder blind to the source fails."""
    dm = SpanCorruptionDataModule(**CORPUS, context_length=32, batch_size=32, train_samples=32 * 300, cache_dir=cache)
    dm.prepare_data()
    dm.setup("fit")
    L.seed_everything(0)
    counts = torch.ones(dm.vocab_size)
    for batch in dm.train_dataloader():
        counts += torch.bincount(batch["labels"][batch["labels"] != -100], minlength=dm.vocab_size)
    log_freq = (counts / counts.sum()).log()
    held_out = list(itertools.islice(dm.val_dataloader(), 8))  # fixed masks per window in validation
    L.seed_everything(0)
    task = Seq2SeqTask(vocab_size=dm.vocab_size, eos_token_id=dm.eos_token_id, dropout=0.0, learning_rate=3e-3,
                       warmup_steps=20, d_model=128)
    fit = trainer(300, limit_val_batches=8)
    before = fit.validate(task, datamodule=dm, verbose=False)[0]["val_loss"]
    fit.fit(task, datamodule=dm)
    after = float(fit.callback_metrics["val_loss"])

    def held_out_loss(swap_sources: bool) -> float:
        """Token-weighted loss on the held-out batches; ``swap_sources`` gives row i row i-1's input."""
        total = tokens = 0.0
        task.eval()
        with torch.no_grad():
            for batch in held_out:
                if swap_sources:
                    batch = {**batch, **{k: batch[k].roll(1, dims=0) for k in ("input_ids", "attention_mask")}}
                n = int((batch["labels"] != -100).sum())
                total, tokens = total + float(task.loss(batch)) * n, tokens + n
        return total / tokens

    targets = torch.cat([b["labels"][b["labels"] != -100] for b in held_out])
    unigram = float(-log_freq[targets].mean())
    read, swapped = held_out_loss(False), held_out_loss(True)
    print(f"span corruption val loss {before:.2f} -> {after:.2f}; held out {read:.3f}, another example's source "
          f"{swapped:.3f}, unigram {unigram:.3f}")
    assert before > 6.0  # near ln(1024) ≈ 6.9 at the start (7.6 measured)
    assert after == pytest.approx(read, abs=0.02)  # the same held-out batches Lightning validated on
    # Measured (seeds 0-2): 3.47-3.51 against a unigram 4.64, and 0.13-0.17 below the swapped-source
    # loss; a decoder whose encoder states are zeroed gets the same loss with either source.
    assert read < unigram - 0.75, f"held-out loss {read:.3f} vs unigram baseline {unigram:.3f}"
    assert read < swapped - 0.05, f"held-out loss {read:.3f} barely rises with another source ({swapped:.3f})"


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
