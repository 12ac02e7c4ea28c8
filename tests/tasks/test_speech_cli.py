"""The Conformer recipes run through `unitok`: spoken digits fit, export (a folder that
transcribes audio files on its own) and test with beam search from the checkpoint; the
manifest recipe reads a user's JSONL manifest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import soundfile
import yaml

from tasks.cli import main
from tasks.data.speech import read_manifest
from unitok.models import ConformerCTC

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ROOT / "configs" / "conformer" / "spoken_digits.yaml"
MANIFEST = ROOT / "configs" / "conformer" / "manifest.yaml"
QUICK = ["--trainer.max_steps", "3", "--trainer.val_check_interval", "3", "--trainer.limit_val_batches", "2",
         "--trainer.limit_test_batches", "2", "--trainer.enable_progress_bar", "false",
         "--trainer.enable_model_summary", "false", "--trainer.log_every_n_steps", "1"]
SMALL_CORPUS = ["--data.train_utterances", "12", "--data.held_out_utterances", "6", "--data.batch_size", "4"]



@pytest.mark.parametrize("path", [DIGITS, MANIFEST], ids=lambda p: p.name)
def test_recipes_say_what_they_show_and_how_long_they_take(path):
    text = path.read_text()
    assert text.startswith("# ") and "unitok fit --config" in text
    config = yaml.safe_load(text)
    assert config["model"]["class_path"] == "tasks.CTCSpeechTask"


def test_spoken_digits_recipe_fits_exports_and_tests_with_beam_search(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cache = ["--data.cache_dir", str(tmp_path / "cache")]
    main(["fit", "--config", str(DIGITS), *QUICK, *SMALL_CORPUS, *cache])
    run = tmp_path / "runs" / "conformer_digits"
    assert "val_cer" in (run / "version_0" / "metrics.csv").read_text()
    model = ConformerCTC.from_pretrained(run / "latest" / "pretrained")
    assert "".join(model.config.vocabulary) == " efghinorstuvwxz" and model.config.spectrogram["n_mels"] == 80
    # the recipe's frames: normalised over the speech frames, faint values floored (silence cannot skew them)
    assert model.config.spectrogram["normalize"] == "speech" and model.config.spectrogram["floor_db"] == 80
    corpus = next((tmp_path / "cache").rglob("digits-*"))
    held_out = read_manifest(corpus / "held_out.jsonl")
    texts = model.transcribe([str(u.audio_filepath) for u in held_out[:2]], decoder="beam", beam_size=4)
    assert len(texts) == 2 and all(isinstance(t, str) for t in texts)

    main(["test", "--config", str(DIGITS), "--ckpt_path", str(run / "latest" / "checkpoints" / "last.ckpt"),
          "--model.decoder", "beam", "--model.beam_size", "4", *QUICK, *SMALL_CORPUS, *cache])
    metrics = (run / "version_1" / "metrics.csv").read_text()
    assert "test_cer" in metrics and "test_wer" in metrics
    config = yaml.safe_load((run / "version_1" / "config.yaml").read_text())
    assert config["model"]["init_args"]["decoder"] == "beam"  # not overridden by the checkpoint


def test_manifest_recipe_reads_a_users_jsonl_manifest(tmp_path, monkeypatch):
    import numpy as np

    rng = np.random.default_rng(0)
    rows = []
    for i, text in enumerate(["yes", "no", "yes no", "no yes", "yes yes", "no no"]):
        seconds = 0.4 + 0.1 * i
        audio = (0.1 * rng.standard_normal(int(seconds * 22050))).astype("float32")
        soundfile.write(tmp_path / f"{i}.flac", audio, 22050)  # resampled to 16 kHz on reading
        rows.append(json.dumps({"audio_filepath": f"{i}.flac", "text": text, "duration": seconds}))
    (tmp_path / "train.jsonl").write_text("\n".join(rows))
    monkeypatch.chdir(tmp_path)
    main(["fit", "--config", str(MANIFEST), "--data.train_manifest", "train.jsonl", "--model.preset",
          "conformer-digits", "--data.batch_size", "2", "--data.num_workers", "0", "--data.val_fraction", "0.34",
          "--trainer.max_epochs", "1", "--trainer.devices", "1", "--trainer.enable_progress_bar", "false",
          "--trainer.enable_model_summary", "false", "--trainer.log_every_n_steps", "1"])
    model = ConformerCTC.from_pretrained(tmp_path / "runs" / "conformer_manifest" / "latest" / "pretrained")
    assert "".join(model.config.vocabulary) == " enosy"
    assert len(model.transcribe(str(tmp_path / "0.flac"))) == 1
