"""An image classifier (ViT, DeiT, MLP-Mixer) or a CLIP (with or without an audio tower) fine-tuned
from a ``pretrained:`` folder — or a CLIP started from an ``image_tower:`` folder — is
self-sufficient: its checkpoint records the model's config (``model_config``) as training left it,
the data's normalisation and resizing filter included, and ``unitok test / validate / predict
--ckpt_path`` (and a resumed ``fit``) rebuild the model from it, scoring the checkpoint's weights
in the checkpoint's architecture whether the starting folder is still there, was written again
with another architecture of the same shapes, or is gone. A checkpoint written before the
config was recorded still loads from its folder. A pretrained model (image, CLIP, Conformer-CTC)
takes a new dropout, a training choice, and keeps refusing new architecture options."""

from __future__ import annotations

import csv
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from torch import nn

from tasks import (
    BindTask,
    CaptionedDigitsDataModule,
    ContrastiveTask,
    CTCSpeechTask,
    DigitsDataModule,
    ImageAudioPairsDataModule,
    ImageClassificationTask,
    MultiTaskDataModule,
)
from tasks.cli import main
from unitok.models import (
    CLIP,
    CLIPConfig,
    ConformerCTC,
    DeiT,
    MixerConfig,
    MLPMixer,
    ViT,
    ViTConfig,
)

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[2]
VIT = ROOT / "configs" / "vit" / "digits.yaml"
CLIP_DIGITS = ROOT / "configs" / "clip" / "digits.yaml"
STEPS = ["--trainer.max_steps", "2", "--trainer.val_check_interval", "2", "--trainer.limit_val_batches", "1",
         "--trainer.limit_test_batches", "1", "--trainer.limit_predict_batches", "1",
         "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
         "--data.batch_size", "8"]


def logged_test_metrics(run: Path) -> dict[str, float]:
    """The test metrics a ``unitok test`` run logged."""
    rows = list(csv.DictReader((run / "metrics.csv").open()))
    return {k: float(v) for row in rows for k, v in row.items() if k.startswith("test_") and v}


def vit_folder(folder: Path, activation: str = "gelu") -> None:
    """A 16×16, 4-class ViT whose normalisation and resizing filter are not the digits data's."""
    ViT(ViTConfig.from_name("vit-digits", image_size=16, num_classes=4, mean=(0.3,), std=(0.2,),
                            interpolation="bicubic", activation=activation)).save_pretrained(folder)


# --------------------------------------------------------------------------- through the CLI

def fine_tuned_vit(tmp_path: Path, monkeypatch) -> tuple[Path, list[str]]:
    """A run of the ViT recipe fine-tuned from a folder -> (the folder, the run's options): a new size
    and a new head, as a user would (the positions resampled to 32×32, a 10-class head)."""
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "pre"
    vit_folder(folder)
    options = ["--config", str(VIT), *STEPS, "--model.pretrained", str(folder), "--model.image_size", "32",
               "--model.num_classes", "10"]
    main(["fit", *options])
    return folder, options


def test_a_vit_fine_tuned_from_a_folder_is_tested_validated_and_predicted_from_its_checkpoint_alone(
        tmp_path, monkeypatch, capsys):
    folder, options = fine_tuned_vit(tmp_path, monkeypatch)
    runs = tmp_path / "runs" / "vit_digits"
    ckpt = runs / "version_0" / "checkpoints" / "last.ckpt"
    recorded = torch.load(ckpt, weights_only=True)["hyper_parameters"]["model_config"]
    # the model's final config: the overrides applied, the data's normalisation and filter adopted
    data = DigitsDataModule(image_size=32)
    assert recorded["image_size"] == [32, 32] and recorded["num_classes"] == 10
    assert (recorded["mean"], recorded["std"], recorded["interpolation"]) == (list(data.mean), list(data.std),
                                                                             data.interpolation)
    test = ["test", *options, "--ckpt_path", str(ckpt)]
    main(test)
    scored = logged_test_metrics(runs / "version_1")
    assert "test_acc" in scored

    shutil.rmtree(folder)  # written again: the same shapes, another activation
    vit_folder(folder, activation="relu")
    main(test)
    assert logged_test_metrics(runs / "version_2") == scored  # the checkpoint's model, not the new folder's
    assert "model_config: null" in (runs / "version_2" / "config.yaml").read_text()  # the recipe's, as it was

    shutil.rmtree(folder)
    capsys.readouterr()
    main(test)
    assert logged_test_metrics(runs / "version_3") == scored
    main(["validate", *test[1:]])
    main(["predict", *test[1:]])
    assert "model_config" not in capsys.readouterr().out  # not listed as another setting than the run's


def test_a_vit_run_fine_tuned_from_a_folder_resumes_without_it(tmp_path, monkeypatch):
    folder, options = fine_tuned_vit(tmp_path, monkeypatch)
    shutil.rmtree(folder)
    main(["fit", *options, "--trainer.max_steps", "3", "--ckpt_path", "last"])
    checkpoint = torch.load(tmp_path / "runs" / "vit_digits" / "version_1" / "checkpoints" / "last.ckpt",
                            weights_only=True)
    assert checkpoint["global_step"] == 3
    assert checkpoint["unitok_settings"]["model.init_args.model_config"] is None  # the recipe's, as recorded


def test_a_clip_started_from_an_exported_image_tower_tests_without_it(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    tower = tmp_path / "runs" / "vit_digits" / "latest" / "pretrained"  # another run's export
    make_tower = lambda activation: ViT(ViTConfig.from_name(  # noqa: E731
        "vit-digits", mean=(0.3,), std=(0.2,), activation=activation)).save_pretrained(tower)
    make_tower("gelu")
    options = ["--config", str(CLIP_DIGITS), *STEPS, "--model.image_tower", str(tower)]
    main(["fit", *options])
    runs = tmp_path / "runs" / "clip_digits"
    ckpt = runs / "version_0" / "checkpoints" / "last.ckpt"
    vision = torch.load(ckpt, weights_only=True)["hyper_parameters"]["model_config"]["vision"]
    data = CaptionedDigitsDataModule(image_size=32)
    assert (vision["mean"], vision["std"], vision["activation"]) == (list(data.mean), list(data.std), "gelu")
    test = ["test", *options, "--ckpt_path", str(ckpt)]
    main(test)
    scored = logged_test_metrics(runs / "version_1")
    assert "test_zero_shot_acc" in scored

    shutil.rmtree(tower)
    make_tower("relu")
    main(test)
    assert logged_test_metrics(runs / "version_2") == scored
    shutil.rmtree(tmp_path / "runs" / "vit_digits")
    capsys.readouterr()
    main(test)  # no "does not exist: it is another run's export"
    assert logged_test_metrics(runs / "version_3") == scored


# --------------------------------------------------------------------------- load_from_checkpoint

def vit_case(folder: Path, activation: str) -> None:
    vit_folder(folder, activation)


def deit_case(folder: Path, activation: str) -> None:
    DeiT(ViTConfig.from_name("deit-digits", activation=activation)).save_pretrained(folder)


def mixer_case(folder: Path, activation: str) -> None:
    MLPMixer(MixerConfig.from_name("mixer-digits", activation=activation)).save_pretrained(folder)


def clip_case(preset: str) -> Callable[[Path, str], None]:
    def write(folder: Path, activation: str) -> None:
        c = CLIPConfig.from_name(preset)
        CLIP(c.replace(vision=c.vision.replace(activation=activation),
                       text=c.text.replace(activation=activation))).save_pretrained(folder)
    return write


def tower_case(folder: Path, activation: str) -> None:
    ViT(ViTConfig.from_name("vit-digits", activation=activation)).save_pretrained(folder)


def outputs(task: L.LightningModule) -> list[torch.Tensor]:
    """What the task's model computes from fixed inputs, in eval mode."""
    model = task.model.eval()
    torch.manual_seed(0)
    if isinstance(model, CLIP):
        c = model.config
        pixels = torch.randn(2, c.vision.channels, *c.vision.image_size)
        ids = torch.cat([torch.randint(1, 400, (2, 8)), torch.full((2, 1), c.text.eot_token_id)], dim=1)
        found = [model.encode_image(pixels), model.encode_text(ids)]
        if c.audio is not None:
            found.append(model.encode_audio(torch.randn(2, 40, c.audio.n_mels), torch.tensor([40, 31])))
        return found
    return [model(torch.randn(2, model.config.channels, *model.config.image_size)).logits]


CASES: list[tuple[type[L.LightningModule], Callable[[Path, str], None], str, dict[str, Any]]] = [
    (ImageClassificationTask, vit_case, "pretrained", {"family": "vit", "image_size": 32, "num_classes": 10}),
    (ImageClassificationTask, deit_case, "pretrained", {"family": "deit", "num_classes": 3}),
    (ImageClassificationTask, mixer_case, "pretrained", {"family": "mixer"}),
    (ContrastiveTask, clip_case("clip-digits"), "pretrained", {}),
    (ContrastiveTask, tower_case, "image_tower", {"lock_image_tower": True}),
    (BindTask, clip_case("clip-digits-audio"), "pretrained", {}),
]


@pytest.mark.parametrize("task_class, write, folder_option, options", CASES,
                         ids=["vit-new-size-and-head", "deit-new-head", "mixer", "clip", "clip-locked-image-tower",
                              "bind"])
def test_a_checkpoint_reloads_its_own_model_without_the_starting_folder(tmp_path, task_class, write, folder_option,
                                                                        options):
    folder = tmp_path / "start"
    write(folder, "gelu")
    task = task_class(**{folder_option: str(folder)}, **options)
    checkpoint = tmp_path / "fine_tuned.ckpt"  # what ModelCheckpoint stores
    torch.save({"state_dict": task.state_dict(), "hyper_parameters": dict(task.hparams),
                "pytorch-lightning_version": L.__version__}, checkpoint)
    shutil.rmtree(folder)
    write(folder, "relu")  # the same shapes, another architecture
    loaded = task_class.load_from_checkpoint(checkpoint)
    assert loaded.model.config == task.model.config
    trainable = lambda t: {n for n, p in t.named_parameters() if p.requires_grad}  # noqa: E731
    in_training = lambda t: {n for n, m in t.named_modules() if m.training}  # noqa: E731
    assert trainable(loaded) == trainable(task) and in_training(loaded) == in_training(task)  # LiT's frozen tower
    for found, expected in zip(outputs(loaded), outputs(task), strict=True):
        torch.testing.assert_close(found, expected)
    shutil.rmtree(folder)
    assert task_class.load_from_checkpoint(checkpoint).model.config == task.model.config


def test_a_checkpoint_written_before_the_config_was_recorded_still_loads_from_its_folder(tmp_path):
    folder = tmp_path / "pre"
    vit_folder(folder)
    task = ImageClassificationTask(family="vit", pretrained=str(folder), image_size=32, num_classes=10)
    hyper_parameters = {k: v for k, v in task.hparams.items() if k != "model_config"}
    checkpoint = tmp_path / "old.ckpt"
    torch.save({"state_dict": task.state_dict(), "hyper_parameters": hyper_parameters,
                "pytorch-lightning_version": L.__version__}, checkpoint)
    loaded = ImageClassificationTask.load_from_checkpoint(checkpoint)
    assert loaded.model.config == task.model.config  # the folder's, resized and given a new head, as before
    torch.testing.assert_close(outputs(loaded), outputs(task))


def test_the_recorded_config_is_the_one_the_data_completed(tmp_path):
    task = ImageClassificationTask(family="vit")  # vit-digits reads bicubic; the digits data resizes bilinearly
    data = DigitsDataModule(image_size=32, batch_size=8)
    trainer = L.Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, limit_val_batches=0, accelerator="cpu")
    trainer.fit(task, datamodule=data)
    assert task.model.config.interpolation == "bilinear"
    assert ViTConfig.from_dict(task.hparams["model_config"]) == task.model.config


# --------------------------------------------------------------------------- dropout with pretrained

def dropout_is_on(model: nn.Module, pixels: torch.Tensor) -> bool:
    """Whether two training-mode passes over the same input differ."""
    return not torch.equal(model(pixels).logits, model(pixels).logits)


def test_a_pretrained_image_model_takes_a_new_dropout_and_keeps_its_architecture(tmp_path):
    folder = tmp_path / "pre"
    vit_folder(folder)
    loaded = ViT.from_pretrained(folder)
    task = ImageClassificationTask(family="vit", pretrained=str(folder), dropout=0.25)
    assert task.model.config == loaded.config.replace(dropout=0.25)
    assert task.hparams["model_config"]["dropout"] == 0.25  # a checkpoint rebuilds it with its dropout
    torch.testing.assert_close(task.model.state_dict(), loaded.state_dict())
    assert task.model.training and dropout_is_on(task.model, torch.randn(2, 1, 16, 16))
    same = ImageClassificationTask(family="vit", pretrained=str(folder), dropout=0.0)  # the folder's own
    assert same.model.config == loaded.config
    for option in ({"d_model": 32}, {"n_layers": 2}, {"channels": 3}):
        with pytest.raises(ValueError, match=f"{next(iter(option))} cannot be overridden"):
            ImageClassificationTask(family="vit", pretrained=str(folder), dropout=0.25, **option)


def test_a_pretrained_clip_takes_a_new_dropout_in_both_towers_and_keeps_its_shape(tmp_path):
    folder = tmp_path / "clip"
    CLIP(CLIPConfig.from_name("clip-digits")).save_pretrained(folder)
    loaded = CLIP.from_pretrained(folder)
    task = ContrastiveTask(pretrained=str(folder), dropout=0.25)
    c = task.model.config
    assert (c.vision.dropout, c.text.dropout) == (0.25, 0.25)
    assert c == loaded.config.replace(vision=loaded.config.vision.replace(dropout=0.25),
                                      text=loaded.config.text.replace(dropout=0.25))
    torch.testing.assert_close(task.model.state_dict(), loaded.state_dict())
    assert task.model.training
    with pytest.raises(ValueError, match="shape and image tower cannot be overridden"):
        ContrastiveTask(pretrained=str(folder), dropout=0.25, embed_dim=32)


def test_a_pretrained_conformer_takes_a_new_dropout_and_keeps_its_architecture(tmp_path):
    folder = tmp_path / "asr"
    CTCSpeechTask(vocabulary=list("abc "), spectrogram={"n_mels": 40}, n_layers=1).model.save_pretrained(folder)
    loaded = ConformerCTC.from_pretrained(folder)
    task = CTCSpeechTask(pretrained=str(folder), dropout=0.3)
    assert task.model.config == loaded.config.replace(dropout=0.3) and task.hparams["model_config"]["dropout"] == 0.3
    torch.testing.assert_close(task.model.state_dict(), loaded.state_dict())
    assert task.model.training
    with pytest.raises(ValueError, match="d_model cannot be overridden"):
        CTCSpeechTask(pretrained=str(folder), dropout=0.3, d_model=32)


def test_a_bind_checkpoint_records_the_audio_settings_its_tower_was_trained_with(tmp_path):
    pairs = ImageAudioPairsDataModule(cache_dir=str(tmp_path), same_fraction=1.0, train_utterances=80,
                                      held_out_utterances=60, held_out_pairs=24, batch_size=4)
    data = MultiTaskDataModule({"image_text": CaptionedDigitsDataModule(batch_size=4), "audio_image": pairs})
    task = BindTask(preset="clip-digits-audio")
    trainer = L.Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, limit_val_batches=0, accelerator="cpu")
    trainer.fit(task, datamodule=data)
    assert task.model.config.audio.spectrogram == pairs.spectrogram_config.to_dict()  # adopted from the data
    assert CLIPConfig.from_dict(task.hparams["model_config"]) == task.model.config
