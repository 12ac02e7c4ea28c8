"""The CLIP recipes run through `unitok`: digits fit, export and test (zero-shot accuracy as a
test metric); the pairs recipe reads a user's JSONL file; LiT from an exported ViT folder."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image

from tasks.cli import main
from unitok.models import CLIP

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ROOT / "configs" / "clip" / "digits.yaml"
PAIRS = ROOT / "configs" / "clip" / "pairs.yaml"
QUICK = ["--trainer.max_steps", "3", "--trainer.val_check_interval", "3", "--trainer.limit_val_batches", "2",
         "--trainer.limit_test_batches", "2", "--trainer.enable_progress_bar", "false",
         "--trainer.enable_model_summary", "false"]


def test_digits_recipe_fits_exports_and_tests_zero_shot(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    main(["fit", "--config", str(DIGITS), *QUICK])
    run = tmp_path / "runs" / "clip_digits"
    model = CLIP.from_pretrained(run / "latest" / "pretrained")
    assert model.config.vision.image_size == (32, 32)
    assert "val_zero_shot_acc" in (run / "version_0" / "metrics.csv").read_text()
    main(["test", "--config", str(DIGITS), "--ckpt_path", str(run / "latest" / "checkpoints" / "last.ckpt"), *QUICK])
    assert "test_zero_shot_acc" in (run / "version_1" / "metrics.csv").read_text()


def test_digits_recipe_with_a_locked_pretrained_vit_and_a_shared_backbone(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    main(["fit", "--config", str(ROOT / "configs" / "vit" / "digits.yaml"), *QUICK])
    vit = tmp_path / "runs" / "vit_digits" / "latest" / "pretrained"
    main(["fit", "--config", str(DIGITS), "--model.image_tower", str(vit), "--model.lock_image_tower", "true", *QUICK])
    main(["fit", "--config", str(DIGITS), "--model.preset", "clip-digits-shared", *QUICK])
    assert CLIP.from_pretrained(tmp_path / "runs" / "clip_digits" / "latest" / "pretrained").config.shared_backbone


def test_pairs_recipe_reads_a_users_jsonl_file(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    rows = []
    for i in range(8):
        Image.fromarray(rng.integers(0, 255, size=(24, 24), dtype=np.uint8)).save(tmp_path / f"{i}.png")
        rows.append(json.dumps({"image": f"{i}.png", "caption": f"a grey square number {i}"}))
    (tmp_path / "captions.jsonl").write_text("\n".join(rows))
    monkeypatch.chdir(tmp_path)
    main(["fit", "--config", str(PAIRS), "--data.train_file", "captions.jsonl", "--model.preset", "clip-digits",
          "--data.image_size", "32", "--data.channels", "1", "--data.batch_size", "2", "--data.num_workers", "0",
          "--data.val_fraction", "0.25", *QUICK])
    assert (tmp_path / "runs" / "clip_pairs" / "latest" / "pretrained" / "model.safetensors").is_file()
