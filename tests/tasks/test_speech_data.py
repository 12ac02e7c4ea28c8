"""Speech data: the built-in spoken digits are synthesised once by espeak-ng's library (from a
PyPI wheel, no executable) into 16 kHz wavs
and JSONL manifests, cached, with held-out voices never used in training; users' manifests
are read with clear errors; batches pad frames and targets and keep their lengths; length
bucketing groups similar durations; SpecAugment, acoustic conditions and vocal-tract warps touch
training batches only."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch
from torch.utils.data import DistributedSampler, SequentialSampler

from tasks import ManifestDataModule, SpokenDigitsDataModule
from tasks.data import espeak
from tasks.data import speech as speech_data
from tasks.data.speech import (
    ACCENTS,
    CACHE_ENV,
    DIGIT_WORDS,
    EVERY_TRAIN_VOICES,
    HELD_OUT_VOICES,
    NEAR_HELD_OUT_VARIANTS,
    TRAIN_VOICES,
    BucketBatchSampler,
    DigitsCorpusSpec,
    WaveBatches,
    read_manifest,
    spoken_digits_corpus,
    validation_rows,
)
from tokenizers_mm import CharacterVocabulary, SpectrogramTokenizer, WaveAugment

ROOT = Path(__file__).resolve().parents[2]
TINY = dict(train_voices=("en-us+m1", "en+f2"), held_out_voices=("en-us+m4",), train_utterances=6,
            held_out_utterances=3, max_digits=3)


@pytest.fixture(scope="module")
def tiny_corpus(tmp_path_factory):
    """A small corpus in a temporary cache (6 training and 3 held-out utterances)."""
    cache = tmp_path_factory.mktemp("digits")
    return spoken_digits_corpus(DigitsCorpusSpec(**TINY), cache), cache


def rows_of(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def write_wavs(folder, texts, seconds=(0.5,), rate=16000):
    """Noise wavs with transcripts -> manifest rows (relative paths)."""
    rng = np.random.default_rng(0)
    rows = []
    for i, text in enumerate(texts):
        s = seconds[i % len(seconds)]
        soundfile.write(folder / f"{i}.wav", 0.1 * rng.standard_normal(int(s * rate)).astype("float32"), rate)
        rows.append({"audio_filepath": f"{i}.wav", "text": text, "duration": s})
    return rows


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# --------------------------------------------------------------------------- the built-in corpus


def test_the_default_corpus_keeps_held_out_voices_out_of_training():
    assert not set(TRAIN_VOICES) & set(HELD_OUT_VOICES)
    held_out_variants = {v.split("+")[1] for v in HELD_OUT_VOICES}
    assert not held_out_variants & {v.split("+")[1] for v in TRAIN_VOICES}  # unseen timbres, not just accents
    assert not set(NEAR_HELD_OUT_VARIANTS) & {v.split("+")[1] for v in TRAIN_VOICES}  # nor near-copies of them
    rows = DigitsCorpusSpec().rows()
    assert rows == DigitsCorpusSpec().rows()  # seeded
    assert {r["voice"] for r in rows if r["split"] == "train"} == set(TRAIN_VOICES)
    assert all(set(r["text"].split()) <= set(DIGIT_WORDS) and 1 <= len(r["text"].split()) <= 5 for r in rows)
    with pytest.raises(ValueError, match="both training and held-out"):
        DigitsCorpusSpec(held_out_voices=(TRAIN_VOICES[0],))


def test_every_voice_is_real_and_no_training_voice_shares_a_held_out_timbre():
    assert len(EVERY_TRAIN_VOICES) == len(set(EVERY_TRAIN_VOICES)) == 8 * 93
    held_out_variants = {v.split("+")[1] for v in HELD_OUT_VOICES}
    assert not held_out_variants & {v.split("+", 1)[1] for v in EVERY_TRAIN_VOICES}
    # nor a near-copy of one: a variant whose formants lie within 10 % of a held-out variant's
    assert not set(NEAR_HELD_OUT_VARIANTS) & {v.split("+", 1)[1] for v in EVERY_TRAIN_VOICES}
    assert set(TRAIN_VOICES) < set(EVERY_TRAIN_VOICES)
    assert not set(EVERY_TRAIN_VOICES) & set(HELD_OUT_VOICES)
    espeak.check_voices(EVERY_TRAIN_VOICES)  # every one exists in the bundled espeak-ng
    dm = SpokenDigitsDataModule(voices="every")
    assert dm.spec.train_voices == EVERY_TRAIN_VOICES and dm.spec.held_out_voices == HELD_OUT_VOICES
    with pytest.raises(ValueError, match="voices must be one of"):
        SpokenDigitsDataModule(voices="all")



def test_unheard_strings_keep_every_held_out_transcript_out_of_training_and_the_held_out_rows_as_they_were():
    plain = DigitsCorpusSpec(train_intonation=True)
    unheard = DigitsCorpusSpec(train_intonation=True, unheard_strings=True)
    held = [r for r in plain.rows() if r["split"] == "held_out"]
    assert [r for r in unheard.rows() if r["split"] == "held_out"] == held
    held_texts = {r["text"] for r in held}
    plain_train = [r for r in plain.rows() if r["split"] == "train"]
    train = [r for r in unheard.rows() if r["split"] == "train"]
    assert sum(r["text"] in held_texts for r in plain_train) > 100  # what the option is for
    assert not {r["text"] for r in train} & held_texts
    for before, after in zip(plain_train, train):  # only the repeated strings are redrawn, voice and all kept
        assert (after["text"] == before["text"]) == (before["text"] not in held_texts)
        assert after["voice"] == before["voice"] and after["speed"] == before["speed"]
        assert after["spoken"].replace(",", "").rstrip(".?!") == after["text"]
    assert plain.key() == DigitsCorpusSpec(train_intonation=True, unheard_strings=False).key() != unheard.key()
    with pytest.raises(ValueError, match="leave no 1–1-digit string to train on"):
        DigitsCorpusSpec(max_digits=1, unheard_strings=True).rows()

def test_training_variety_leaves_the_held_out_utterances_and_older_caches_alone():
    plain = DigitsCorpusSpec()
    varied = DigitsCorpusSpec(train_voices=EVERY_TRAIN_VOICES, train_speeds=(100, 260), train_pitches=(5, 95),
                              train_pitch_ranges=(0, 100), train_intonation=True)
    held = [r for r in plain.rows() if r["split"] == "held_out"]
    assert [r for r in varied.rows() if r["split"] == "held_out"] == held  # the same test audio either way
    train = [r for r in varied.rows() if r["split"] == "train"]
    assert [r["text"] for r in train] == [r["text"] for r in plain.rows() if r["split"] == "train"]
    assert min(r["speed"] for r in train) < 130 and max(r["speed"] for r in train) > 200
    assert {r["pitch_range"] for r in train} <= set(range(101)) and len({r["pitch_range"] for r in train}) > 50
    spoken = {r["spoken"][-1] for r in train} | {"," for r in train if "," in r["spoken"]}
    assert spoken >= {"?", "!", ".", ","} and all(r["spoken"].replace(",", "").rstrip(".?!") == r["text"]
                                                  for r in train)
    # options added later count in the cache key only when set: existing corpora stay valid
    first_voices = tuple(f"{a}+{v}" for a in ACCENTS for v in ("m1", "m2", "m3", "m6", "f1", "f2", "f4"))
    assert DigitsCorpusSpec(train_voices=first_voices).key() == "2be4de02476d"  # as before the train_ options
    assert varied.key() != plain.key() and DigitsCorpusSpec(train_speeds=(100, 260)).key() != plain.key()
    with pytest.raises(ValueError, match=r"train_pitch_ranges must lie in 0\.\.100, got \(0, 120\)$"):
        DigitsCorpusSpec(train_pitch_ranges=(0, 120))
    with pytest.raises(ValueError, match=r"speeds must lie in 80\.\.450 wpm .*, got \(50, 100\)"):
        DigitsCorpusSpec(train_speeds=(50, 100))


def test_the_corpus_is_16_khz_speech_with_manifests(tiny_corpus):
    corpus, _ = tiny_corpus
    train, held = rows_of(corpus / "train.jsonl"), rows_of(corpus / "held_out.jsonl")
    assert len(train) == 6 and len(held) == 3
    assert {r["voice"] for r in held} == {"en-us+m4"} and {r["voice"] for r in train} == {"en-us+m1", "en+f2"}
    for row in train + held:
        audio, rate = soundfile.read(corpus / row["audio_filepath"])
        assert rate == 16000 and audio.ndim == 1
        assert row["duration"] == pytest.approx(len(audio) / 16000, abs=1e-3)
        assert 0.3 < row["duration"] < 5 and np.abs(audio).max() > 0.05  # speech, not silence


def test_the_corpus_is_cached_and_not_synthesised_again(tiny_corpus, monkeypatch):
    corpus, cache = tiny_corpus
    monkeypatch.setattr(speech_data, "synthesize", lambda *a, **k: pytest.fail("synthesised again"))
    assert spoken_digits_corpus(DigitsCorpusSpec(**TINY), cache) == corpus
    monkeypatch.setenv(CACHE_ENV, str(corpus.parent))
    assert spoken_digits_corpus(DigitsCorpusSpec(**TINY)) == corpus  # the env var names the corpora's folder


def test_synthesis_runs_the_wheels_library_even_with_a_broken_espeak_ng_on_path(tmp_path, monkeypatch):
    fake = tmp_path / "bin" / "espeak-ng"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho broken >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:/nonexistent")
    import subprocess

    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("shelled out to a program"))
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("shelled out to a program"))
    wave = speech_data.synthesize("four two", "en-us+m1", speed=160, pitch=50)
    assert wave.dtype == np.float32 and 0.3 < len(wave) / 16000 < 3 and np.abs(wave).max() > 0.05


def test_the_same_utterance_gives_the_same_samples_whatever_was_spoken_before():
    # espeak-ng keeps pitch-flutter and gain state between utterances; each utterance gets a fresh engine.
    first, rate = espeak.speak("three one four", "en-us+m3", rate=150, pitch=50, word_gap=2)
    espeak.speak("nine nine", "en+f3", rate=200, pitch=90)
    again, _ = espeak.speak("three one four", "en-us+m3", rate=150, pitch=50, word_gap=2)
    assert rate == 22050 and np.array_equal(first, again)
    assert espeak.version().startswith("1.52")
    other, _ = espeak.speak("three one four", "en-us+m4", rate=150, pitch=50, word_gap=2)
    assert not np.array_equal(first[: len(other)], other[: len(first)])  # the voice matters


def test_bad_synthesis_requests_are_clear_errors():
    with pytest.raises(ValueError, match="no voice 'en-xx\\+m1'"):
        espeak.speak("one", "en-xx+m1")
    with pytest.raises(ValueError, match="non-empty text"):
        espeak.speak("  ", "en-us+m1")


def test_a_bad_voice_in_the_spec_fails_before_anything_is_written(tmp_path):
    with pytest.raises(ValueError, match="no voice 'xx\\+m9'"):
        spoken_digits_corpus(DigitsCorpusSpec(**{**TINY, "train_voices": ("en-us+m1", "xx+m9")}), tmp_path)
    assert not tmp_path.exists() or not any(tmp_path.iterdir())  # nothing half-written


def test_spoken_digit_batches_pad_frames_and_targets_and_keep_lengths(tiny_corpus):
    _, cache = tiny_corpus
    dm = SpokenDigitsDataModule(cache_dir=str(cache), batch_size=3, augment=False, **TINY)
    dm.setup("fit")
    assert dm.vocabulary == CharacterVocabulary.build(DIGIT_WORDS + (" ",)) and len(dm.vocabulary) == 17
    assert dm.spectrogram_config.n_mels == 80
    batch = next(iter(dm.val_dataloader()))
    assert set(batch) == {"features", "feature_lengths", "targets", "target_lengths", "texts"}
    B, N, F = batch["features"].shape
    assert B == 2 and F == 80 and int(batch["feature_lengths"].max()) == N  # 2 of the 3 held-out rows validate
    for i in range(B):
        n, length = int(batch["feature_lengths"][i]), int(batch["target_lengths"][i])
        assert torch.all(batch["features"][i, n:] == 0) and torch.all(batch["targets"][i, length:] == 0)
        assert dm.vocabulary.decode(batch["targets"][i, :length]) == batch["texts"][i]
    assert batch["texts"][0] in {u.text for u in dm.val_utterances}


def test_specaugment_applies_to_training_batches_only(tiny_corpus):
    _, cache = tiny_corpus
    dm = SpokenDigitsDataModule(cache_dir=str(cache), batch_size=2, freq_masks=2, freq_width=20, **TINY)
    train = dm.train_dataloader().dataset  # no explicit setup: the loaders set up on first use
    val, test = dm.val_dataloader().dataset, dm.test_dataloader().dataset
    assert len(train) == 6 and len(val) == 2 and len(test) == 1
    assert train.augment is dm.spec_augment and val.augment is None and test.augment is None
    torch.manual_seed(0)
    masked = train[0]["features"]
    clean = dm.tokenizer.features(dm.train_utterances[0].audio_filepath)
    assert masked.shape == clean.shape and not torch.equal(masked, clean)
    assert torch.equal(val[0]["features"], dm.tokenizer.features(dm.val_utterances[0].audio_filepath))


def test_acoustic_conditions_apply_to_training_batches_only(tiny_corpus):
    _, cache = tiny_corpus
    dm = SpokenDigitsDataModule(cache_dir=str(cache), batch_size=3, wave_augment={"no_speech_p": 0.5, "silence_p": 0.5},
                                spectrogram={"normalize": "speech", "floor_db": 80}, **TINY)
    plain = SpokenDigitsDataModule(cache_dir=str(cache), batch_size=3,
                                   spectrogram={"normalize": "speech", "floor_db": 80}, **TINY)
    assert dm.wave_augment.no_speech_p == 0.5 and plain.wave_augment is None
    texts, lengths = [], set()
    for seed in range(6):  # six runs' first epochs
        dm.shuffle_seed = seed
        for batch in dm.train_dataloader():
            # one common length (silence fills the batch, no mask padding), transcripts "" for no-speech clips
            assert len(set(batch["feature_lengths"].tolist())) == 1
            lengths.add(int(batch["feature_lengths"][0]))
            for text, n in zip(batch["texts"], batch["target_lengths"].tolist()):
                assert n == len(text) and (text == "" or text in {u.text for u in dm.train_utterances})
                texts.append(text)
    assert "" in texts and len([t for t in texts if t]) > 5 and len(lengths) > 2
    val, val_plain = next(iter(dm.val_dataloader())), next(iter(plain.val_dataloader()))
    assert torch.equal(val["features"], val_plain["features"]) and val["texts"] == val_plain["texts"]
    with pytest.raises(TypeError, match="wave_augment"):
        SpokenDigitsDataModule(cache_dir=str(cache), wave_augment="yes", **TINY)


def test_training_frames_are_read_with_the_drawn_vocal_tract_warp():
    tokenizer, vocabulary = SpectrogramTokenizer(), CharacterVocabulary.build(DIGIT_WORDS + (" ",))
    only_warp = dict(speed_p=0, reverb_p=0, silence_p=0, noise_p=0, telephone_p=0, gain_db=(0.0, 0.0))
    wave = 0.5 * torch.sin(2 * math.pi * 700 * torch.arange(8000) / 16000)
    item = {"wave": wave, "text": "one"}
    warped = WaveBatches(tokenizer, vocabulary, WaveAugment(warp_p=1.0, warps=(1.25, 1.25), **only_warp))([item])
    plain = WaveBatches(tokenizer, vocabulary, WaveAugment(**only_warp))([item])
    assert torch.equal(warped["features"][0], tokenizer.features(wave, 16000, warp=1.25))
    assert torch.equal(plain["features"][0], tokenizer.features(wave, 16000))
    assert not torch.allclose(warped["features"], plain["features"], atol=0.1)


def test_acoustic_conditions_are_the_same_for_the_same_seed(tiny_corpus):
    _, cache = tiny_corpus

    def first_batch(seed):
        dm = SpokenDigitsDataModule(cache_dir=str(cache), batch_size=3, wave_augment=True, **TINY)
        dm.shuffle_seed = seed  # the run's seed: the order and each batch's random numbers
        return next(iter(dm.train_dataloader()))

    a, b, c = first_batch(0), first_batch(0), first_batch(1)
    assert torch.equal(a["features"], b["features"]) and a["texts"] == b["texts"]
    assert not (a["features"].shape == c["features"].shape and torch.equal(a["features"], c["features"]))


def test_worker_processes_load_the_same_batches(tiny_corpus):
    _, cache = tiny_corpus
    batches = [next(iter(SpokenDigitsDataModule(cache_dir=str(cache), batch_size=3, num_workers=workers,
                                                **TINY).val_dataloader())) for workers in (0, 2)]
    assert torch.equal(batches[0]["features"], batches[1]["features"]) and batches[0]["texts"] == batches[1]["texts"]


def test_held_out_rows_are_cut_into_validation_and_test_without_a_new_corpus(tiny_corpus, monkeypatch):
    corpus, cache = tiny_corpus
    monkeypatch.setattr(speech_data, "synthesize", lambda *a, **k: pytest.fail("synthesised again"))
    dm = SpokenDigitsDataModule(cache_dir=str(cache), batch_size=3, augment=False, **TINY)
    dm.setup("fit")
    assert dm.corpus == corpus  # the same spec, the same cached corpus
    assert dm.train_utterances == read_manifest(corpus / "train.jsonl")  # training: every training row, as before
    held = read_manifest(corpus / "held_out.jsonl")
    assert dm.val_utterances == held[0::2] and dm.test_utterances == held[1::2]  # alternate rows
    files = {name: {u.audio_filepath for u in rows}
             for name, rows in (("train", dm.train_utterances), ("val", dm.val_utterances),
                                ("test", dm.test_utterances))}
    assert not files["train"] & files["val"] and not files["train"] & files["test"]
    assert not files["val"] & files["test"]
    tested = dm.test_dataloader()
    assert [u.audio_filepath for u in tested.dataset.utterances] == [u.audio_filepath for u in held[1::2]]
    assert sorted(t for batch in tested for t in batch["texts"]) == sorted(u.text for u in held[1::2])
    assert {u.audio_filepath for u in dm.predict_dataloader().dataset.utterances} == files["test"]
    # val_share=1.0: every held-out row validates, and the test loader serves them again.
    whole = SpokenDigitsDataModule(cache_dir=str(cache), batch_size=3, augment=False, val_share=1.0, **TINY)
    whole.setup("fit")
    assert whole.val_utterances == held and whole.test_utterances is None
    assert [u.audio_filepath for u in whole.test_dataloader().dataset.utterances] == [u.audio_filepath for u in held]
    with pytest.raises(ValueError, match=r"val_share must be in \(0, 1\], got 0\.0$"):
        SpokenDigitsDataModule(cache_dir=str(cache), val_share=0.0, **TINY)


@pytest.mark.parametrize("voices", [HELD_OUT_VOICES, HELD_OUT_VOICES[:4], HELD_OUT_VOICES[:2]], ids=len)
def test_the_cut_gives_every_held_out_voice_to_both_parts(voices):
    rows = [r for r in DigitsCorpusSpec(held_out_voices=voices).rows() if r["split"] == "held_out"]
    validates = validation_rows([r["voice"] for r in rows], 0.5)
    assert sum(validates) == 100 and len(rows) - sum(validates) == 100
    val_voices = {r["voice"] for r, v in zip(rows, validates) if v}
    test_voices = {r["voice"] for r, v in zip(rows, validates) if not v}
    assert val_voices == test_voices == set(voices)


def test_with_an_odd_count_of_round_robin_voices_the_cut_is_alternate_rows():
    # the default corpus's five voices: the test set the README's figures were measured on
    rows = [r for r in DigitsCorpusSpec().rows() if r["split"] == "held_out"]
    assert validation_rows([r["voice"] for r in rows], 0.5) == [k % 2 == 0 for k in range(len(rows))]
    assert validation_rows(["a"] * 5, 1.0) == [True] * 5
    assert validation_rows(["a"] * 4, 0.25) == [True, False, False, False]


# --------------------------------------------------------------------------- users' manifests


def test_a_manifest_builds_the_vocabulary_and_holds_out_a_split(tmp_path):
    texts = [" ".join(DIGIT_WORDS[(i + k) % 3] for k in range(1 + i % 3)) for i in range(10)]  # one / two / zero
    write_jsonl(tmp_path / "train.jsonl", write_wavs(tmp_path, texts, seconds=(0.3, 0.6)))
    dm = ManifestDataModule(str(tmp_path / "train.jsonl"), val_fraction=0.2, batch_size=4)
    assert len(dm.train_utterances) == 8 and len(dm.val_utterances) == 2
    assert dm.vocabulary == CharacterVocabulary.build(u.text for u in dm.train_utterances)
    batch = next(iter(dm.train_dataloader()))
    assert batch["features"].shape[0] == 4 and batch["feature_lengths"].max() <= 61


def test_a_hold_out_that_leaves_nothing_to_train_on_is_refused(tmp_path):
    # it used to train on the validation utterances: an empty training set read as "no test set"
    write_jsonl(tmp_path / "train.jsonl", write_wavs(tmp_path, ["one", "two"]))
    with pytest.raises(ValueError, match=r"val_fraction=0.75 holds out all 2 utterances .*train.jsonl, leaving none"):
        ManifestDataModule(str(tmp_path / "train.jsonl"), val_fraction=0.75, vocabulary=list(" enotw"))


def test_validation_transcripts_outside_the_training_vocabulary_are_named(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", write_wavs(tmp_path, ["one two", "two one"]))
    write_jsonl(tmp_path / "val.jsonl", [{"audio_filepath": "0.wav", "text": "One 2", "duration": 0.5}])
    with pytest.raises(ValueError, match=r"\['2', 'O'\].*vocabulary=\["):
        ManifestDataModule(str(tmp_path / "train.jsonl"), val_manifest=str(tmp_path / "val.jsonl"))
    dm = ManifestDataModule(str(tmp_path / "train.jsonl"), val_manifest=str(tmp_path / "val.jsonl"),
                            vocabulary=list(" 12Oenotw"))
    assert dm.vocabulary.chars == tuple(" 12Oenotw")
    with pytest.raises(ValueError, match=r"\['e', 'n', 'o', 't', 'w'\]"):
        ManifestDataModule(str(tmp_path / "train.jsonl"), vocabulary=list(" 12O"))


def test_lowercase_max_duration_and_a_missing_duration(tmp_path):
    rows = write_wavs(tmp_path, ["ONE", "TWO", "THREE"], seconds=(0.5, 2.0, 0.4))
    del rows[2]["duration"]  # read from the file's header instead
    write_jsonl(tmp_path / "train.jsonl", rows)
    write_jsonl(tmp_path / "val.jsonl", rows[:1])
    dm = ManifestDataModule(str(tmp_path / "train.jsonl"), val_manifest=str(tmp_path / "val.jsonl"),
                            lowercase=True, max_duration=1.0)
    assert [(u.text, u.duration) for u in dm.train_utterances] == [("one", 0.5), ("three", pytest.approx(0.4))]


@pytest.mark.parametrize(("row", "message"), [
    ({"text": "one", "duration": 1.0}, r"train.jsonl:1 lacks \['audio_filepath'\]"),
    ({"audio_filepath": "nowhere.wav", "text": "one", "duration": 1.0}, "nowhere.wav does not exist"),
    ({"audio_filepath": "0.wav", "text": "", "duration": 1.0}, "empty or non-string text"),
    ({"audio_filepath": "0.wav", "text": "one", "duration": -1}, r"duration \(seconds\) must be a finite number > 0, got -1"),
    ({"audio_filepath": "0.wav", "text": "one", "duration": True}, "got True"),  # not 1 s
    ({"audio_filepath": "0.wav", "text": "one", "duration": float("inf")}, "got inf"),  # JSON's Infinity
    ({"audio_filepath": "0.wav", "text": "one", "duration": float("nan")}, "got nan"),
])
def test_bad_manifest_rows_are_named(tmp_path, row, message):
    write_wavs(tmp_path, ["x"])
    write_jsonl(tmp_path / "train.jsonl", [row])
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        read_manifest(tmp_path / "train.jsonl")


def test_a_manifest_written_as_one_json_array_is_refused_naming_the_line_and_the_format(tmp_path):
    rows = write_wavs(tmp_path, ["one", "two"])
    (tmp_path / "train.json").write_text(json.dumps(rows))
    with pytest.raises(ValueError, match=r"train.json:1 is a JSON array, not an object; a manifest is one JSON "
                                         r"object per line \(JSONL\)"):
        read_manifest(tmp_path / "train.json")
    (tmp_path / "train.json").write_text(json.dumps(rows, indent=2))  # its first line "[" is not JSON at all
    with pytest.raises(ValueError, match=r"train.json:1 is not JSON: .*one JSON object per line \(JSONL\)"):
        read_manifest(tmp_path / "train.json")


def test_manifest_rows_end_at_newlines_only(tmp_path):
    rows = write_wavs(tmp_path, ["one\u2028two", "three"])  # json.dumps(ensure_ascii=False) keeps U+2028 as it is
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows),
                                          encoding="utf-8")
    assert [u.text for u in read_manifest(tmp_path / "train.jsonl")] == ["one\u2028two", "three"]


def test_a_manifest_is_read_as_utf_8_whatever_the_locale(tmp_path):
    rows = write_wavs(tmp_path, ["café crème", "naïve"])
    (tmp_path / "train.jsonl").write_bytes("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode())
    # A C locale without Python's UTF-8 mode: the locale's encoding is ASCII, as on a bare server or container.
    env = {**os.environ, "LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
    script = ("import sys; from tasks.data.speech import read_manifest; "
              "print(ascii([u.text for u in read_manifest(sys.argv[1])]))")
    run = subprocess.run([sys.executable, "-c", script, str(tmp_path / "train.jsonl")], env=env, cwd=ROOT,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == ascii(["café crème", "naïve"])


def test_a_manifest_module_needs_a_manifest(tmp_path):
    with pytest.raises(ValueError, match="--data.train_manifest"):
        ManifestDataModule()
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    with pytest.raises(ValueError, match="bad.jsonl:1 is not JSON"):
        ManifestDataModule(str(tmp_path / "bad.jsonl"))


def test_global_normalisation_statistics_come_from_the_training_audio(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", write_wavs(tmp_path, ["ab", "ba", "abba", "b"]))
    dm = ManifestDataModule(str(tmp_path / "train.jsonl"), spectrogram={"normalize": "global", "n_mels": 40},
                            val_fraction=0.25)
    c = dm.spectrogram_config
    assert c.normalize == "global" and len(c.global_mean) == len(c.global_std) == 40
    frames = torch.cat([dm.tokenizer.features(u.audio_filepath) for u in dm.train_utterances])
    assert float(frames.mean(0).abs().max()) < 1e-3


# --------------------------------------------------------------------------- bucketing


def test_bucketing_batches_similar_lengths_and_covers_every_utterance_once():
    torch.manual_seed(0)
    lengths = torch.rand(200).tolist()
    sampler = BucketBatchSampler(list(range(200)), batch_size=10, drop_last=False, lengths=lengths, pool_batches=20)
    batches = list(sampler)
    assert len(batches) == len(sampler) == 20
    assert sorted(i for b in batches for i in b) == list(range(200))
    spread = sum(max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in batches) / 20
    assert spread < 0.1  # random batches of 10 would spread ≈ 0.8


def test_the_partial_batch_dropped_each_epoch_is_random_not_the_longest_utterances():
    # cut after sorting by length, the remainder was the longest four every epoch: never trained on
    from tasks.data.sampling import SeededRandomSampler

    lengths = list(range(100))  # utterance i lasts i
    seen: set[int] = set()
    for epoch in range(20):
        sampler = BucketBatchSampler(SeededRandomSampler(range(100), seed=epoch), batch_size=16, drop_last=True,
                                     lengths=lengths, pool_batches=32, seed=epoch)
        batches = list(sampler)
        assert len(batches) == len(sampler) == 6 and all(len(b) == 16 for b in batches)
        seen |= {i for b in batches for i in b}
    assert seen == set(range(100))


def test_fewer_training_utterances_than_a_batch_is_refused(tmp_path):
    # the loader drops its partial batch: the run stopped at once with "no training batches" and status 0
    write_jsonl(tmp_path / "train.jsonl", write_wavs(tmp_path, ["one", "two", "one two"] * 4))  # 12 rows
    dm = ManifestDataModule(str(tmp_path / "train.jsonl"), val_fraction=0.25, batch_size=16, vocabulary=list(" enotw"))
    with pytest.raises(ValueError, match="9 training utterances are fewer than batch_size=16"):
        dm.train_dataloader()
    assert len(list(dm.val_dataloader())) == 1  # evaluating needs no full batch


def test_bucketing_under_a_distributed_sampler_splits_the_data_between_devices():
    lengths = list(range(50))
    shares = []
    for rank in range(2):
        sampler = DistributedSampler(range(50), num_replicas=2, rank=rank, shuffle=True, seed=0)
        batches = list(BucketBatchSampler(sampler, batch_size=5, drop_last=True, lengths=lengths, pool_batches=2))
        assert len(batches) == 5 and all(len(b) == 5 for b in batches)
        shares.append({i for b in batches for i in b})
    assert not shares[0] & shares[1]


def test_evaluation_batches_are_sorted_and_not_shuffled():
    lengths = [5, 1, 4, 2, 3, 0]
    sampler = BucketBatchSampler(SequentialSampler(range(6)), 2, False, lengths, pool_batches=3, shuffle=False)
    assert list(sampler) == [[5, 1], [3, 4], [2, 0]]
