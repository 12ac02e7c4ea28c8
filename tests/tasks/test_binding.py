"""Binding speech into the image–text space: training sees (image, caption) and (audio, image)
pairs only — never audio with text — with one temperature per pair type; validation scores
image and audio zero-shot and cross-modal recall; users bring (audio, image) manifests; and a
tiny run classifies held-out voices by text prompts it was never paired with."""

from __future__ import annotations

import json

import lightning as L
import numpy as np
import pytest
import soundfile
import torch
from PIL import Image

from tasks import (
    AudioImageManifestDataModule,
    BindTask,
    CaptionedDigitsDataModule,
    ImageAudioPairsDataModule,
    MultiTaskDataModule,
)
from tasks.binding import recall_at_1
from tasks.cli import main
from unitok.models import CLIP

PAIRS = dict(same_fraction=1.0, train_utterances=80, held_out_utterances=60, held_out_pairs=24, batch_size=8)


def trainer(max_steps: int = 2, **options) -> L.Trainer:
    defaults = dict(max_steps=max_steps, accelerator="cpu", logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                    val_check_interval=None, check_val_every_n_epoch=None, limit_val_batches=2)
    return L.Trainer(**{**defaults, **options})


def bind_data(cache: str, **pairs) -> MultiTaskDataModule:
    return MultiTaskDataModule({"image_text": CaptionedDigitsDataModule(batch_size=8),
                                "audio_image": ImageAudioPairsDataModule(cache_dir=cache, **{**PAIRS, **pairs})})


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("spoken"))


def test_recall_at_1_counts_nearest_neighbours_of_the_same_label():
    queries = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    keys = torch.tensor([[2.0, 0.1], [0.1, 3.0]])
    assert recall_at_1(queries, keys, torch.tensor([0, 1, 1]), torch.tensor([0, 1])) == pytest.approx(2 / 3)


def test_training_never_pairs_audio_with_text(cache, monkeypatch):
    data = bind_data(cache)
    data.setup("fit")
    for i, (batch, _, _) in enumerate(data.train_dataloader()):  # CombinedLoader: (batch, index, loader)
        assert set(batch) == {"image_text", "audio_image"}
        assert "input_ids" in batch["image_text"] and "features" not in batch["image_text"]
        assert "features" in batch["audio_image"] and "input_ids" not in batch["audio_image"]
        if i == 5:
            break
    # ... and the loss only ever contrasts (image, text) and (audio, image).
    task = BindTask(preset="clip-digits-audio")
    pairs = []
    for name in ("image", "text", "audio"):
        encode = getattr(task.model, f"encode_{name}")

        def tagged(*args, _encode=encode, _name=name, **kwargs):
            out = _encode(*args, **kwargs)
            out.modality = _name
            return out

        monkeypatch.setattr(task.model, f"encode_{name}", tagged)
    import tasks.binding

    real_loss = tasks.binding.contrastive_loss

    def recording(a, b, scale, gather=True):
        pairs.append((a.modality, b.modality, scale is task.model.logit_scale_audio))
        return real_loss(a, b, scale, gather)

    monkeypatch.setattr(tasks.binding, "contrastive_loss", recording)
    trainer(3).fit(task, datamodule=data)
    assert set(pairs) == {("image", "text", False), ("audio", "image", True)}


def test_validation_scores_both_zero_shots_and_recall_and_stores_the_audio_settings(cache):
    data = bind_data(cache)
    task = BindTask(preset="clip-digits-audio")
    t = trainer(2, val_check_interval=2)
    t.fit(task, datamodule=data)
    for name in ("val_image_zero_shot_acc", "val_image_zero_shot_acc_numerals", "val_audio_zero_shot_acc",
                 "val_audio_to_image_r1", "val_image_to_audio_r1", "val_image_text_loss", "val_audio_image_loss"):
        assert name in t.callback_metrics, (name, sorted(t.callback_metrics))
    assert task.model.config.audio.spectrogram == data.tasks["audio_image"].spectrogram_config.to_dict()


def test_bind_task_refuses_what_it_cannot_train(cache):
    with pytest.raises(ValueError, match="has no audio tower"):
        BindTask(preset="clip-digits")
    with pytest.raises(ValueError, match="two tasks, 'image_text' .* and 'audio_image'"):
        trainer(1).fit(BindTask(), datamodule=MultiTaskDataModule({"image_text": CaptionedDigitsDataModule()}))
    other = MultiTaskDataModule({"image_text": CaptionedDigitsDataModule(batch_size=8),
                                 "audio_image": ImageAudioPairsDataModule(cache_dir=cache, spectrogram={"n_mels": 40},
                                                                          **PAIRS)})
    with pytest.raises(ValueError, match="40 mel bins, the audio tower 80"):
        trainer(1).fit(BindTask(), datamodule=other)


@pytest.mark.parametrize("captions, pairs, mode, message", [
    # half the rows would show another digit, yet every row trains as a matched pair
    ({}, {"same_fraction": 0.5}, "max_size_cycle",
     r"the 'audio_image' data has same_fraction=0.5: .* set same_fraction: 1.0"),
    # scans held out for image zero-shot would be trained on through (audio, image) pairs
    ({"split_seed": 1}, {}, "max_size_cycle", r"split the digit scans differently \('image_text': \{.*'split_seed': 1\}, "
                                              r"'audio_image': \{.*'split_seed': 0\}\)"),
    ({"val_share": 0.4}, {}, "max_size_cycle", r"'val_share': 0.4, .*'audio_image': \{.*'val_share': 0.5, "),
    # one image tower, two normalisations of the same scans
    ({"mean": 0.1307, "std": 0.3081}, {}, "max_size_cycle",
     r"the 'image_text' data mean \(0.1307,\), std \(0.3081,\); the 'audio_image' data mean \(0.5,\), std \(0.5,\)"),
    ({}, {"image_size": 28}, "max_size_cycle", r"the 'audio_image' data has image_size=\(28, 28\) but the image tower "
                                                r"\(32, 32\)"),
    # an ended loader leaves its pair type without a batch
    ({}, {}, "max_size", r"BindTask trains both pair types every step, which the data's mode 'max_size'"),
])
def test_bind_task_refuses_data_it_would_train_wrongly_on(cache, captions, pairs, mode, message):
    data = MultiTaskDataModule({"image_text": CaptionedDigitsDataModule(batch_size=8, **captions),
                                "audio_image": ImageAudioPairsDataModule(cache_dir=cache, **{**PAIRS, **pairs})},
                               mode=mode)
    with pytest.raises(ValueError, match=message):
        trainer(1).fit(BindTask(), datamodule=data)


def test_both_pair_types_normalised_alike_train_and_the_model_keeps_their_statistics(cache):
    stats = dict(mean=0.1307, std=0.3081)
    data = MultiTaskDataModule({"image_text": CaptionedDigitsDataModule(batch_size=8, **stats),
                                "audio_image": ImageAudioPairsDataModule(cache_dir=cache, **PAIRS, **stats)})
    task = BindTask()
    trainer(1, limit_val_batches=0).fit(task, datamodule=data)
    assert (task.model.config.vision.mean, task.model.config.vision.std) == ((0.1307,), (0.3081,))


def test_users_audio_image_manifest(tmp_path):
    rng = np.random.default_rng(0)
    rows = []
    for i in range(6):
        soundfile.write(tmp_path / f"{i}.wav", (0.1 * rng.standard_normal(8000)).astype("float32"), 16000)
        Image.fromarray(rng.integers(0, 255, (20, 24, 3), dtype=np.uint8)).save(tmp_path / f"{i}.png")
        rows.append({"audio": f"{i}.wav", "image": f"{i}.png"})
    manifest = tmp_path / "pairs.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = AudioImageManifestDataModule(str(manifest), image_size=16, val_fraction=0.34, batch_size=2)
    assert (len(data.train_pairs), len(data.val_pairs)) == (4, 2)
    batch = next(iter(data.train_dataloader()))
    assert batch["pixel_values"].shape == (2, 3, 16, 16) and batch["features"].shape[-1] == 80
    assert batch["feature_lengths"].tolist() == [51, 51]
    (tmp_path / "bad.jsonl").write_text(json.dumps({"audio": "0.wav", "image": "missing.png"}) + "\n")
    with pytest.raises(FileNotFoundError, match="row 1: image file .*missing.png does not exist"):
        AudioImageManifestDataModule(str(tmp_path / "bad.jsonl"))
    (tmp_path / "keys.jsonl").write_text(json.dumps({"sound": "0.wav", "image": "0.png"}) + "\n")
    with pytest.raises(ValueError, match=r"row 1 lacks \['audio'\]"):
        AudioImageManifestDataModule(str(tmp_path / "keys.jsonl"))


def test_users_audio_image_splits_share_no_image_and_no_audio_file(tmp_path):
    rng = np.random.default_rng(0)
    for i in range(6):
        soundfile.write(tmp_path / f"{i}.wav", (0.1 * rng.standard_normal(8000)).astype("float32"), 16000)
        Image.fromarray(rng.integers(0, 255, (20, 24, 3), dtype=np.uint8)).save(tmp_path / f"{i}.png")
    def manifest(name, rows):
        (tmp_path / name).write_text("".join(json.dumps({"audio": f"{a}.wav", "image": f"{b}.png"}) + "\n"
                                             for a, b in rows))
        return str(tmp_path / name)
    # three images with two clips each: a held-out image takes both of its clips along
    data = AudioImageManifestDataModule(manifest("pairs.jsonl", [(0, 0), (1, 0), (2, 1), (3, 1), (4, 2), (5, 2)]),
                                        val_fraction=0.34, batch_size=2)
    assert len(data.val_pairs) == 2 and len({image for _, image in data.val_pairs}) == 1
    assert {image for _, image in data.train_pairs}.isdisjoint(image for _, image in data.val_pairs)
    train = manifest("train.jsonl", [(0, 0), (1, 1), (2, 2), (3, 3)])
    with pytest.raises(ValueError, match=r"1 image\(s\) of the validation pairs are also in the training pairs"):
        AudioImageManifestDataModule(train, val_manifest=manifest("val.jsonl", [(4, 3), (5, 4)]), batch_size=2)
    with pytest.raises(ValueError, match=r"1 audio file\(s\) of the test pairs are also in the training pairs"):
        AudioImageManifestDataModule(train, val_manifest=manifest("val.jsonl", [(4, 4)]),
                                     test_manifest=manifest("test.jsonl", [(0, 5)]), batch_size=2)


def test_users_pairs_linked_by_a_shared_file_are_held_out_together(tmp_path):
    rng = np.random.default_rng(0)
    for i in range(10):
        soundfile.write(tmp_path / f"{i}.wav", (0.1 * rng.standard_normal(8000)).astype("float32"), 16000)
        Image.fromarray(rng.integers(0, 255, (20, 24, 3), dtype=np.uint8)).save(tmp_path / f"{i}.png")
    # each narration goes with two photos; clip 9 goes with photos 9, 8 and 0: clips 0, 4, 9 form one group
    rows = [(a, 2 * a % 10 + j) for a in range(5) for j in range(2)] + [(9, 9), (9, 8), (9, 0)]
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps({"audio": f"{a}.wav", "image": f"{b}.png"}) + "\n"
                                                  for a, b in rows))
    for seed in range(4):  # the automatic split never makes splits that share a file (and refuses them)
        data = AudioImageManifestDataModule(str(tmp_path / "pairs.jsonl"), val_fraction=0.3, split_seed=seed,
                                            batch_size=2)
        assert data.val_pairs and len(data.train_pairs) + len(data.val_pairs) == len(rows)
        for side in (0, 1):
            assert {p[side] for p in data.train_pairs}.isdisjoint(p[side] for p in data.val_pairs)


def test_bind_recipe_fits_exports_and_tests(tmp_path, monkeypatch, cache, capsys):
    from pathlib import Path

    recipe = Path(__file__).resolve().parents[2] / "configs" / "clip" / "bind_audio.yaml"
    monkeypatch.chdir(tmp_path)
    quick = ["--trainer.max_steps", "2", "--trainer.val_check_interval", "2", "--trainer.limit_val_batches", "1",
             "--trainer.limit_test_batches", "1", "--trainer.enable_progress_bar", "false",
             "--trainer.enable_model_summary", "false",
             "--data.init_args.tasks.audio_image.init_args.cache_dir", cache,
             "--data.init_args.tasks.audio_image.init_args.train_utterances", "80",
             "--data.init_args.tasks.audio_image.init_args.held_out_utterances", "60"]
    main(["fit", "--config", str(recipe), *quick])
    run = tmp_path / "runs" / "clip_bind_audio"
    model = CLIP.from_pretrained(run / "latest" / "pretrained")
    assert model.config.audio is not None and model.config.audio.spectrogram["n_mels"] == 80
    capsys.readouterr()
    main(["test", "--config", str(recipe), "--ckpt_path", str(run / "latest" / "checkpoints" / "last.ckpt"), *quick])
    printed = "".join(capsys.readouterr())
    for line in ("image zero-shot accuracy", "audio zero-shot accuracy", "recall@1 audio→image"):
        assert line in printed, printed[-2000:]


@pytest.mark.slow
def test_text_prompts_classify_held_out_voices_never_paired_with_text():
    # clip-digits-audio on the built-in pairs (1,400 single-digit utterances of 35 training voices
    # with scans; captioned scans), 400 steps of 32 + 32 pairs. Held out: 5 unseen voices, 8 prompt
    # templates never used as captions, class names as words and as numerals. Seed 0 measured
    # 1.0 audio, 0.94 / 0.93 image (words / numerals); chance is 0.1. The contrastive plateau
    # lasts a seed-dependent while at this size: at 250 steps seed 0 read 0.80 / 0.73 (0.84 / 0.76
    # before the image class token was spared weight decay), seed 1 leaves it only by 600 steps.
    L.seed_everything(0)
    data = MultiTaskDataModule({"image_text": CaptionedDigitsDataModule(batch_size=32),
                                "audio_image": ImageAudioPairsDataModule(same_fraction=1.0, batch_size=32)})
    task = BindTask(preset="clip-digits-audio", learning_rate=2e-3, warmup_steps=30)
    trainer(400, limit_val_batches=0).fit(task, datamodule=data)
    result = {k: v for r in trainer(limit_val_batches=None).validate(task, datamodule=data, verbose=False)
              for k, v in r.items()}
    assert result["val_audio_zero_shot_acc"] >= 0.8, f"emergent audio zero-shot {result['val_audio_zero_shot_acc']:.3f}"
    assert result["val_image_zero_shot_acc"] >= 0.6, f"image zero-shot {result['val_image_zero_shot_acc']:.3f}"
    assert result["val_image_zero_shot_acc_numerals"] >= 0.6, result
