"""The vision recipes run through `unitok`: fit leaves a checkpoint and a model folder, test a
confusion matrix; the DeiT recipe trains its CNN teacher first; the image-folder recipe reads a
user's folder tree. (The CLI's text-model links — vocab_size, eos_token_id, context_length — are
skipped for these tasks, which have no such arguments.)"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import unitok
from tasks.cli import main

ROOT = Path(__file__).resolve().parents[2]
VIT = ROOT / "configs" / "vit" / "digits.yaml"
DEIT = ROOT / "configs" / "deit" / "digits_distill.yaml"
FEW = ROOT / "configs" / "deit" / "digits_few.yaml"
FOLDER = ROOT / "configs" / "vit" / "imagefolder.yaml"
QUICK = ["--trainer.max_steps", "3", "--trainer.val_check_interval", "3", "--trainer.limit_val_batches", "1",
         "--trainer.limit_test_batches", "2", "--trainer.enable_progress_bar", "false",
         "--trainer.enable_model_summary", "false"]


def test_vit_recipe_fits_then_tests_from_the_checkpoint(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    main(["fit", "--config", str(VIT), *QUICK])
    run = tmp_path / "runs" / "vit_digits"
    assert (run / "latest" / "checkpoints" / "last.ckpt").is_file()
    assert {"model.safetensors", "config.json"} <= {p.name for p in (run / "latest" / "pretrained").iterdir()}
    assert list(run.glob("version_0/metrics.csv"))

    main(["test", "--config", str(VIT), "--ckpt_path", str(run / "latest" / "checkpoints" / "last.ckpt"), *QUICK])
    assert (run / "version_1" / "confusion_matrix.png").is_file()
    assert "test_acc" in (run / "version_1" / "metrics.csv").read_text()


def test_data_of_another_image_size_than_the_model_is_refused_and_the_export_resizes_as_training_did(
        tmp_path, monkeypatch, capsys):
    # the export declares the size it reads: trained on 16×16 images, it must not say 32×32
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as refused:
        main(["fit", "--config", str(VIT), *QUICK, "--data.image_size", "16"])
    assert refused.value.code == 2
    assert ("the data's images are 16×16 but the model's image_size is 32×32; set the model's image_size: [16, 16]"
            in capsys.readouterr().err)
    main(["fit", "--config", str(VIT), *QUICK, "--data.image_size", "16", "--model.init_args.image_size", "16"])
    config = unitok.load(tmp_path / "runs" / "vit_digits" / "latest" / "pretrained").config
    assert config.image_size == (16, 16) and config.interpolation == "bilinear"  # the data's filter, not bicubic


def test_distillation_recipe_trains_its_cnn_teacher_first_and_keeps_it_out_of_the_checkpoint(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    main(["fit", "--config", str(DEIT), "--model.teacher_steps", "5", *QUICK])
    run = tmp_path / "runs" / "deit_digits_distill"
    teacher = run / "version_0" / "teacher_cnn.pt"
    assert teacher.is_file()
    checkpoint = torch.load(run / "latest" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert checkpoint["state_dict"] and all(k.startswith("model.") for k in checkpoint["state_dict"])
    # The saved teacher is a path the recipe accepts instead of training a new one.
    main(["fit", "--config", str(DEIT), "--model.teacher", str(teacher), "--model.distillation", "hard", *QUICK])
    assert list(run.glob("version_1/metrics.csv")) and not (run / "version_1" / "teacher_cnn.pt").exists()


def test_a_distilled_checkpoint_is_tested_after_its_teacher_is_gone(tmp_path, monkeypatch, capsys):
    # the teacher is read for fitting only: testing the student needs no teacher export
    monkeypatch.chdir(tmp_path)
    teacher = "runs/vit_digits/latest/pretrained"
    main(["fit", "--config", str(VIT), *QUICK])
    main(["fit", "--config", str(DEIT), "--model.teacher", teacher, *QUICK])
    run = tmp_path / "runs" / "deit_digits_distill"
    ckpt = run / "version_0" / "checkpoints" / "last.ckpt"
    shutil.rmtree(tmp_path / "runs" / "vit_digits")
    for command in ("test", "validate"):
        main([command, "--config", str(DEIT), "--model.teacher", teacher, "--ckpt_path", str(ckpt), *QUICK])
    assert "test_acc" in (run / "version_1" / "metrics.csv").read_text()
    with pytest.raises(SystemExit) as refused:  # fitting still needs it, and says which recipe writes it
        main(["fit", "--config", str(DEIT), "--model.teacher", teacher, *QUICK])
    assert refused.value.code == 2
    assert f"--model.teacher={teacher} does not exist" in capsys.readouterr().err


def test_the_data_poor_recipe_logs_its_teachers_accuracy_and_runs_without_a_teacher(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    main(["fit", "--config", str(FEW), "--model.teacher_steps", "5", *QUICK])
    metrics = (tmp_path / "runs" / "deit_digits_few" / "version_0" / "metrics.csv").read_text()
    assert "teacher_val_acc" in metrics.splitlines()[0]
    # Its baseline: the same recipe without a teacher (benchmarks/claims_distillation.py).
    main(["fit", "--config", str(FEW), "--model.distillation", "none", "--model.teacher", "null", *QUICK])
    assert "teacher_val_acc" not in (tmp_path / "runs" / "deit_digits_few" / "version_1" / "metrics.csv").read_text()


def test_image_folder_recipe_reads_a_users_folder_tree(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    for split, count in (("train", 4), ("val", 2)):
        for c, name in enumerate(("circle", "square", "star")):
            (tmp_path / "images" / split / name).mkdir(parents=True)
            for i in range(count):
                pixels = rng.integers(0, 255, size=(40, 50, 3), dtype=np.uint8)
                pixels[..., c] = 255
                Image.fromarray(pixels).save(tmp_path / "images" / split / name / f"{i}.png")
    monkeypatch.chdir(tmp_path)
    main(["fit", "--config", str(FOLDER), "--data.root", str(tmp_path / "images"),  # 3 classes: linked from the data
          "--data.batch_size", "4", "--data.num_workers", "0", *QUICK])
    assert (tmp_path / "runs" / "vit_imagefolder" / "latest" / "checkpoints" / "last.ckpt").is_file()
    import unitok

    model = unitok.load(tmp_path / "runs" / "vit_imagefolder" / "latest" / "pretrained")
    assert model.config.num_classes == 3  # no --model.num_classes: the folder's classes reached the model
    assert model.processor.labels == ("circle", "square", "star")
