"""CLIP learns the built-in captioned digits: after a short contrastive run, held-out scans are
classified zero-shot — by prompts the text tower never saw as captions — far above chance;
LiT keeps a pretrained image tower fixed while the text tower learns to match it."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from tasks import (
    CaptionedDigitsDataModule,
    ContrastiveTask,
    DigitsDataModule,
    FrozenInEval,
    ImageClassificationTask,
)
from unitok.zero_shot import ZeroShotClassifier


def trainer(max_steps: int, **options) -> L.Trainer:
    defaults = dict(max_steps=max_steps, accelerator="cpu", logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                    limit_val_batches=0, val_check_interval=None, check_val_every_n_epoch=None,
                    callbacks=[FrozenInEval()])  # a locked tower trains in eval mode, quietly
    return L.Trainer(**{**defaults, **options})


@pytest.mark.slow
def test_tiny_clip_reaches_80_percent_zero_shot_on_held_out_scans_and_templates():
    L.seed_everything(0)
    data = CaptionedDigitsDataModule(batch_size=64)
    task = ContrastiveTask(preset="clip-digits", learning_rate=2e-3, warmup_steps=50)
    untrained = trainer(1).test(task, data, verbose=False)[0]["test_zero_shot_acc"]
    trainer(500).fit(task, data)
    accuracy = trainer(1).test(task, data, verbose=False)[0]["test_zero_shot_acc"]
    # 180 test scans (never trained or validated on), 4 held-out templates; chance is 10 %.
    assert untrained < 0.3 and accuracy >= 0.80, (untrained, accuracy)
    assert task.model.logit_scale.exp() <= 100.0

    # The same accuracy from Python, on raw [0, 1] scans, through the exported model's own preprocessing.
    clf = ZeroShotClassifier(task.model, data.class_names, data.zero_shot_templates)
    images, labels = data.digits.images()
    held = torch.from_numpy(data.digits.test_indices)  # what `test` scored
    predicted = clf.predict(images[held])
    assert abs(float((predicted == labels[held]).float().mean()) - accuracy) < 1e-6


@pytest.mark.slow
def test_lit_locked_image_tower_stays_fixed_while_text_learns_to_match(tmp_path):
    L.seed_everything(0)
    digits = DigitsDataModule(batch_size=64)
    classifier = ImageClassificationTask(family="vit", preset="vit-digits", learning_rate=2e-3, warmup_steps=20)
    trainer(150).fit(classifier, digits)
    classifier.model.save_pretrained(tmp_path / "vit")

    data = CaptionedDigitsDataModule(batch_size=64)
    task = ContrastiveTask(preset="clip-digits", image_tower=str(tmp_path / "vit"), lock_image_tower=True,
                           learning_rate=2e-3, warmup_steps=20)
    before = {k: v.clone() for k, v in task.model.visual.state_dict().items()}
    trainer(150).fit(task, data)
    after = task.model.visual.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    accuracy = trainer(1).test(task, data, verbose=False)[0]["test_zero_shot_acc"]
    assert accuracy >= 0.6, accuracy  # only the text tower and projection learned
