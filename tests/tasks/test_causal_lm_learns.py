"""A tiny GPT trained on the built-in corpus must beat the unigram baseline on held-out text."""

from __future__ import annotations

import lightning as L
import numpy as np
import pytest

from tasks import CausalLMTask, TextDataModule


@pytest.mark.slow
def test_tiny_gpt_beats_the_unigram_baseline(tmp_path):
    dm = TextDataModule(builtin_max_bytes=400_000, vocab_size=1024, context_length=64, batch_size=16,
                        train_samples=16 * 400, cache_dir=str(tmp_path / "cache"))
    dm.prepare_data()
    # Baseline: cross-entropy of held-out tokens under the training tokens' (add-one) frequencies.
    tokens = np.memmap(dm._token_file, dtype=dm._dtype, mode="r")
    cut, end = dm._split()
    counts = np.bincount(tokens[:cut], minlength=dm.vocab_size) + 1.0
    unigram = float(-np.log(counts[tokens[cut + 1 : end]] / counts.sum()).mean())

    L.seed_everything(0)
    task = CausalLMTask(vocab_size=dm.vocab_size, context_length=64, preset="gpt-nano",
                        learning_rate=3e-3, warmup_steps=20, eos_token_id=dm.eos_token_id)
    trainer = L.Trainer(max_steps=400, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=10,
                        val_check_interval=400)
    trainer.fit(task, datamodule=dm)
    val_loss = float(trainer.callback_metrics["val_loss"])
    assert unigram > 5.5  # the baseline is itself far below uniform (ln 1024 ≈ 6.93)
    assert val_loss < unigram - 0.75, f"val loss {val_loss:.3f} vs unigram baseline {unigram:.3f}"


def test_a_prediction_scores_its_generated_tokens_only():
    """`predict_step`'s score is the mean log-probability of the generated tokens (up to EOS) under
    the model, read off a forward over prompt + continuation: prompt positions do not count."""
    from types import SimpleNamespace

    import torch

    from tokenizers_mm import BPETokenizer

    tok = BPETokenizer.train(iterator=iter(["def add(a, b): return a + b", "print('hello')"] * 5), vocab_size=300)
    torch.manual_seed(0)
    task = CausalLMTask(vocab_size=tok.vocab_size, context_length=32, preset="gpt-nano",
                        generate_max_new_tokens=6).eval()
    task._trainer = SimpleNamespace(datamodule=SimpleNamespace(tokenizer=tok))  # what predict_step reads
    prompts = ["def add(a, b):", "print"]  # unequal lengths: the shorter is left-padded
    records = task.predict_step(prompts, 0)

    for prompt, record in zip(prompts, records, strict=True):
        ids = tok.encode(prompt).ids[None]  # (1, S), unpadded
        full = task.model.generate(ids, max_new_tokens=6)
        new = full[0, ids.shape[1]:]
        with torch.no_grad():
            log_probs = task.model(full[:, :-1]).logits[0, ids.shape[1] - 1:].log_softmax(-1)
        expected = log_probs.gather(-1, new[:, None]).mean()
        assert record["input"] == prompt
        assert record["score"] == pytest.approx(float(expected), abs=1e-4)
