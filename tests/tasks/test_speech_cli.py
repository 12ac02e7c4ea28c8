"""The Conformer recipes run through `unitok`: spoken digits fit, export (a folder that
transcribes audio files on its own) and test with beam search from the checkpoint; the
manifest recipe reads a user's JSONL manifest; a checkpoint fine-tuned from a folder reloads
without that folder, and settings a pretrained model would ignore are refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import lightning as L
import pytest
import soundfile
import torch
import yaml

from tasks import CTCSpeechTask
from tasks.cli import main
from tasks.data.speech import read_manifest
from unitok.models import ConformerConfig, ConformerCTC

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ROOT / "configs" / "conformer" / "spoken_digits.yaml"
MANIFEST = ROOT / "configs" / "conformer" / "manifest.yaml"
QUICK = ["--trainer.max_steps", "3", "--trainer.val_check_interval", "3", "--trainer.limit_val_batches", "2",
         "--trainer.limit_test_batches", "2", "--trainer.enable_progress_bar", "false",
         "--trainer.enable_model_summary", "false", "--trainer.log_every_n_steps", "1"]
SMALL_CORPUS = ["--data.train_utterances", "12", "--data.held_out_utterances", "6", "--data.batch_size", "4"]


def save_folder(folder: Path, characters: str) -> Path:
    """A one-layer Conformer-CTC for ``characters``, saved to ``folder``."""
    config = ConformerConfig.from_name("conformer-digits", n_layers=1, vocabulary=tuple(characters),
                                       spectrogram={"n_mels": 80, "normalize": "speech"})
    ConformerCTC(config).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("folder_then", ["deleted", "replaced"])
def test_a_checkpoint_fine_tuned_from_a_folder_reloads_its_own_model_without_the_folder(tmp_path, folder_then):
    torch.manual_seed(0)
    folder = save_folder(tmp_path / "pretrained", "abc ")
    task = CTCSpeechTask(pretrained=str(folder))
    task.configure_model()
    checkpoint = tmp_path / "fine_tuned.ckpt"  # what ModelCheckpoint stores
    torch.save({"state_dict": task.state_dict(), "hyper_parameters": dict(task.hparams),
                "pytorch-lightning_version": L.__version__}, checkpoint)
    shutil.rmtree(folder)
    if folder_then == "replaced":  # e.g. the pretraining recipe run again, with another vocabulary of the same size
        save_folder(folder, "xyz ")
    loaded = CTCSpeechTask.load_from_checkpoint(checkpoint).eval()
    assert loaded.model.config == task.model.config and loaded.model.config.vocabulary == tuple("abc ")
    frames = torch.randn(1, 40, 80)
    torch.testing.assert_close(loaded(frames).logits, task.eval()(frames).logits)


def test_a_pretrained_model_refuses_a_vocabulary_or_spectrogram_it_would_ignore(tmp_path):
    folder = str(save_folder(tmp_path, "abc "))
    with pytest.raises(ValueError, match=r"vocabulary=\['x', 'y', 'z'\] differs from the pretrained model's "
                                         r"\['a', 'b', 'c', ' '\]"):
        CTCSpeechTask(pretrained=folder, vocabulary=list("xyz"))
    with pytest.raises(ValueError, match=r"spectrogram n_mels=40 \(the model's 80\) differs from the pretrained "
                                         r"model's"):
        CTCSpeechTask(pretrained=folder, spectrogram={"n_mels": 40})
    # the model's own settings, restated, are accepted
    task = CTCSpeechTask(pretrained=folder, vocabulary=list("abc "), spectrogram={"normalize": "speech"})
    assert task.model.config.vocabulary == tuple("abc ")


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
