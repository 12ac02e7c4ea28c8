"""CTC speech recognition: the loss is torch's CTC with blank 0 averaged per target character;
the task builds its Conformer from the data's vocabulary and spectrogram settings and records
them so checkpoints reload alone; a pretrained model must match the data; NaN features are
refused; and a tiny Conformer learns the built-in spoken digits well enough to transcribe
voices it never heard, with prefix beam search no worse than greedy decoding."""

from __future__ import annotations

import lightning as L
import pytest
import torch
import torch.nn.functional as F

from tasks import CTCSpeechTask, SpokenDigitsDataModule, ctc_loss
from tasks.data.speech import DigitsCorpusSpec, spoken_digits_corpus
from tokenizers_mm import CharacterVocabulary, SpectrogramConfig
from unitok.models import ConformerCTC

TINY = dict(train_voices=("en-us+m1", "en+f2"), held_out_voices=("en-us+m4",), train_utterances=8,
            held_out_utterances=4, max_digits=3)


def trainer(max_steps: int = 1, **options) -> L.Trainer:
    """A quiet CPU trainer that validates only when asked."""
    defaults = dict(max_steps=max_steps, accelerator="cpu", logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, log_every_n_steps=10,
                    val_check_interval=None, check_val_every_n_epoch=None)
    return L.Trainer(**{**defaults, **options})


@pytest.fixture(scope="module")
def tiny_cache(tmp_path_factory):
    cache = tmp_path_factory.mktemp("digits")
    spoken_digits_corpus(DigitsCorpusSpec(**TINY), cache)
    return str(cache)


def tiny_data(cache: str, **options) -> SpokenDigitsDataModule:
    return SpokenDigitsDataModule(cache_dir=cache, batch_size=4, **TINY, **options)


# ------------------------------------------------------------------ loss


def test_ctc_loss_is_torchs_ctc_with_blank_zero_per_target_character():
    torch.manual_seed(0)
    logits = torch.randn(2, 10, 5)
    targets, target_lengths, lengths = torch.tensor([[1, 2, 2], [3, 0, 0]]), torch.tensor([3, 1]), torch.tensor([10, 6])
    by_hand = [F.ctc_loss(logits[b, : lengths[b]].log_softmax(-1)[:, None], targets[b : b + 1, : target_lengths[b]],
                          lengths[b : b + 1], target_lengths[b : b + 1], reduction="sum") / target_lengths[b]
               for b in range(2)]
    assert float(ctc_loss(logits, lengths, targets, target_lengths)) == pytest.approx(float(sum(by_hand) / 2), rel=1e-5)
    # Too few frames for the targets: an impossible alignment counts as 0, not inf.
    assert float(ctc_loss(logits[:1, :2], torch.tensor([2]), targets[:1], torch.tensor([3]))) == 0.0


def test_ctc_targets_outside_the_vocabulary_are_refused_not_read_out_of_bounds():
    # torch's CPU ctc_loss does not check target ids: one >= V corrupts the heap (a crash later).
    logits, lengths = torch.randn(2, 10, 5), torch.tensor([10, 6])
    target_lengths = torch.tensor([3, 1])
    with pytest.raises(ValueError, match=r"CTC targets \[7\] are not label ids in \[0, 5\)"):
        ctc_loss(logits, lengths, torch.tensor([[1, 7, 2], [3, 0, 0]]), target_lengths)
    with pytest.raises(ValueError, match=r"CTC targets \[0\].*blank"):
        ctc_loss(logits, lengths, torch.tensor([[1, 0, 2], [3, 0, 0]]), target_lengths)
    # Padding beyond a row's length is not a target.
    assert torch.isfinite(ctc_loss(logits, lengths, torch.tensor([[1, 2, 2], [3, 99, 99]]), target_lengths))


# ------------------------------------------------------------------ task mechanics


def test_the_model_is_built_from_the_data_and_checkpoints_reload_without_it(tiny_cache, tmp_path):
    dm = tiny_data(tiny_cache, spectrogram={"n_mels": 64})
    task = CTCSpeechTask(d_model=32, n_layers=1)
    assert task.model is None
    t = trainer(2, default_root_dir=str(tmp_path))
    t.fit(task, datamodule=dm)
    c = task.model.config
    assert c.vocabulary == dm.vocabulary.chars and c.n_mels == 64 and c.d_model == 32
    assert SpectrogramConfig.from_dict(c.spectrogram) == dm.spectrogram_config
    t.save_checkpoint(tmp_path / "asr.ckpt")
    loaded = CTCSpeechTask.load_from_checkpoint(tmp_path / "asr.ckpt")
    batch = next(iter(dm.val_dataloader()))
    task.eval()
    loaded.eval()
    torch.testing.assert_close(loaded(batch["features"], batch["feature_lengths"]).logits,
                               task(batch["features"], batch["feature_lengths"]).logits)


def test_validation_logs_cer_and_wer_and_predict_returns_transcripts(tiny_cache):
    dm = tiny_data(tiny_cache)
    task = CTCSpeechTask(n_layers=1, vocabulary=list(dm.vocabulary.chars), decoder="beam", beam_size=3)
    metrics = trainer().validate(task, datamodule=dm, verbose=False)[0]
    assert {"val_loss", "val_cer", "val_wer"} <= set(metrics)
    assert metrics["val_cer"] >= 0.5  # an untrained model transcribes nothing useful
    records = [r for batch in trainer().predict(task, datamodule=dm) for r in batch]
    texts = [r["prediction"] for r in records]
    assert len(texts) == 2 and all(set(t) <= set(dm.vocabulary.chars) for t in texts)  # the 2 test rows of 4 held out
    assert all(r["score"] <= 0 and r["target"] for r in records)  # log P(text | audio); the true transcript


def test_a_pretrained_model_must_match_the_datas_vocabulary(tiny_cache, tmp_path):
    other = ConformerCTC(ConformerCTC.config_class.from_name("conformer-digits", n_layers=1, vocabulary=tuple("ab ")))
    other.save_pretrained(tmp_path / "ab")
    with pytest.raises(ValueError, match="vocabulary"):
        trainer().fit(CTCSpeechTask(pretrained=str(tmp_path / "ab")), datamodule=tiny_data(tiny_cache))
    with pytest.raises(ValueError, match="n_layers cannot be overridden"):
        CTCSpeechTask(pretrained=str(tmp_path / "ab"), n_layers=2)


def test_the_task_needs_a_vocabulary_or_a_data_module_and_refuses_nan_features():
    with pytest.raises(ValueError, match="needs a vocabulary"):
        CTCSpeechTask().configure_model()
    with pytest.raises(ValueError, match="decoder must be"):
        CTCSpeechTask(decoder="viterbi")
    with pytest.raises(ValueError, match="a lexicon needs decoder='beam'"):
        CTCSpeechTask(lexicon=["one", "two"])
    with pytest.raises(ValueError, match=r"'three' has characters \['h', 'r'\] that are not in the vocabulary"):
        CTCSpeechTask(n_layers=1, vocabulary=list("enotw "), decoder="beam", lexicon=["one", "three"]).configure_model()
    vocabulary = CharacterVocabulary.build(["one two"])
    task = CTCSpeechTask(n_layers=1, vocabulary=list(vocabulary.chars))
    features = torch.randn(1, 40, 80)
    features[0, 3, 7] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        task(features, torch.tensor([40]))


# ------------------------------------------------------------------ learning


@pytest.mark.slow
def test_a_tiny_conformer_transcribes_voices_it_never_heard(tmp_path):
    # conformer-digits (4 blocks, width 96) on the default corpus (2,100 utterances of 35 voices,
    # cached under ~/.cache/unitok/spoken_digits or $UNITOK_SPOKEN_DIGITS_DIR), 150 steps of 16:
    # 30 s on one CPU core, plus 20 s to synthesise the corpus the first time. Held-out (5 voices
    # whose timbres never occur in training), seeds 0-3: validation CER 3.3-4.2 % greedy; on the
    # test voices 1.8-3.4 % greedy, 1.7-3.1 % beam, 0.4-0.8 % beam held to the digit names.
    # The bound leaves room for other CPUs.
    L.seed_everything(0)
    dm = SpokenDigitsDataModule(batch_size=16)
    task = CTCSpeechTask(learning_rate=2e-3, warmup_steps=50)
    trainer(150, gradient_clip_val=1.0, limit_val_batches=0).fit(task, datamodule=dm)
    held_out = trainer().validate(task, datamodule=dm, verbose=False)[0]["val_cer"]
    assert held_out < 0.08, f"held-out CER {held_out:.3f}"

    # The decoders compared on the same (test) voices.
    greedy = trainer().test(task, datamodule=dm, verbose=False)[0]["test_cer"]
    task.decoder = "beam"
    beam = trainer().test(task, datamodule=dm, verbose=False)[0]["test_cer"]
    assert beam <= greedy + 0.005, f"beam CER {beam:.3f} vs greedy {greedy:.3f}"
    digits = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    task.lexicon = digits  # the task's own path (`--model.lexicon`): beam search held to the digit names
    held_task = trainer().test(task, datamodule=dm, verbose=False)[0]["test_cer"]
    assert held_task <= beam + 0.005, f"lexicon CER {held_task:.3f} vs beam {beam:.3f}"

    task.model.save_pretrained(tmp_path / "asr")
    model = ConformerCTC.from_pretrained(tmp_path / "asr")
    utterances = dm.val_utterances[:8]
    texts = model.transcribe([str(u.audio_filepath) for u in utterances])
    assert sum(t == u.text for t, u in zip(texts, utterances)) >= 5, list(zip(texts, [u.text for u in utterances]))
    # held to the ten digit names, beam search spells only those, and reads at least as many right
    held = model.transcribe([str(u.audio_filepath) for u in utterances], "beam", lexicon=digits)
    assert all(w in digits for t in held for w in t.split()), held
    assert sum(t == u.text for t, u in zip(held, utterances)) >= sum(t == u.text for t, u in zip(texts, utterances))
