"""Image classification: ViT, MLP-Mixer and DeiT learn the built-in digits; DeiT's hard and soft
distillation losses are the paper's formulas; teachers stay frozen and out of checkpoints; the
test stage writes a confusion matrix and predict returns class indices."""

from __future__ import annotations

import math
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger

from tasks import (
    DigitsDataModule,
    ImageClassificationTask,
    SmallCNN,
    hard_distillation_loss,
    soft_distillation_loss,
    train_cnn_teacher,
)
from tasks.teachers import accuracy, load_teacher, mix_up, training_loader
from unitok.models import ViT, ViTConfig

# ------------------------------------------------------------------ helpers


def trainer(max_steps: int = 1, **options) -> L.Trainer:
    """A quiet CPU trainer that validates only when asked."""
    defaults = dict(max_steps=max_steps, accelerator="cpu", logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, log_every_n_steps=10,
                    val_check_interval=None, check_val_every_n_epoch=None)
    return L.Trainer(**{**defaults, **options})


def fit_and_score(task: ImageClassificationTask, datamodule: DigitsDataModule, steps: int) -> float:
    """Train for ``steps`` and return held-out top-1 accuracy."""
    t = trainer(steps, limit_val_batches=0)
    t.fit(task, datamodule=datamodule)
    return float(trainer().validate(task, datamodule=datamodule, verbose=False)[0]["val_acc"])


def held_out_accuracy(model: torch.nn.Module, datamodule: DigitsDataModule) -> float:
    correct = total = 0
    with torch.no_grad():
        for batch in datamodule.val_dataloader():
            correct += int((model(batch["pixel_values"]).argmax(-1) == batch["labels"]).sum())
            total += len(batch["labels"])
    return correct / total


def cross_entropy(row: list[float], target: int) -> float:
    return math.log(sum(math.exp(v) for v in row)) - row[target]


def softmax(row: list[float], tau: float) -> list[float]:
    e = [math.exp(v / tau) for v in row]
    return [v / sum(e) for v in e]


# ------------------------------------------------------------------ distillation losses

CLS = [[2.0, 0.0, -1.0], [0.5, 1.5, 0.0]]
DIST = [[1.0, 1.0, 0.0], [0.0, -0.5, 3.0]]
TEACHER = [[0.0, 3.0, 1.0], [0.0, 0.5, 2.0]]  # argmax: 1, 2 (the first disagrees with its label)
LABELS = [0, 1]


def test_hard_distillation_is_half_label_ce_plus_half_teacher_argmax_ce():
    loss = hard_distillation_loss(torch.tensor(CLS), torch.tensor(DIST), torch.tensor(LABELS), torch.tensor(TEACHER))
    by_hand = sum(0.5 * cross_entropy(c, y) + 0.5 * cross_entropy(d, t)
                  for c, d, y, t in zip(CLS, DIST, LABELS, [1, 2])) / 2
    assert float(loss) == pytest.approx(by_hand, rel=1e-6)


@pytest.mark.parametrize(("alpha", "tau"), [(0.5, 3.0), (0.1, 1.0), (1.0, 2.0)])
def test_soft_distillation_is_label_ce_plus_tau_squared_kl_to_the_teacher(alpha, tau):
    loss = soft_distillation_loss(torch.tensor(CLS), torch.tensor(DIST), torch.tensor(LABELS), torch.tensor(TEACHER),
                                  alpha=alpha, tau=tau)
    ce = sum(cross_entropy(c, y) for c, y in zip(CLS, LABELS)) / 2
    kl = sum(sum(pt * math.log(pt / ps) for pt, ps in zip(softmax(t, tau), softmax(d, tau)))
             for d, t in zip(DIST, TEACHER)) / 2  # KL(teacher ‖ student), mean over the batch
    assert float(loss) == pytest.approx((1 - alpha) * ce + alpha * tau**2 * kl, rel=1e-6)


def test_soft_distillation_toward_an_identical_teacher_is_the_label_loss_alone():
    cls, labels = torch.tensor(CLS), torch.tensor(LABELS)
    loss = soft_distillation_loss(cls, torch.tensor(DIST), labels, torch.tensor(DIST), alpha=0.3, tau=4.0)
    assert float(loss) == pytest.approx(0.7 * float(torch.nn.functional.cross_entropy(cls, labels)), rel=1e-6)


# ------------------------------------------------------------------ teachers and task mechanics


def digits_batch(n: int = 8) -> dict[str, torch.Tensor]:
    dm = DigitsDataModule(batch_size=n)
    return next(iter(dm.val_dataloader()))


def test_the_teacher_is_frozen_and_never_saved():
    teacher = SmallCNN(channels=1, num_classes=10)
    task = ImageClassificationTask(family="deit", distillation="soft", teacher_module=teacher)
    assert not teacher.training and not any(p.requires_grad for p in teacher.parameters())
    loss = task.training_loss(digits_batch())
    loss.backward()
    assert all(p.grad is None for p in teacher.parameters())
    assert all(p.grad is not None for p in task.model.parameters())  # the student learns from both heads
    assert not any(k.startswith("teacher") for k in task.state_dict())
    assert {id(p) for p in task.parameters()}.isdisjoint(id(p) for p in teacher.parameters())


def test_a_distilled_checkpoint_loads_without_its_teacher(tmp_path):
    task = ImageClassificationTask(family="deit", distillation="hard", teacher_module=SmallCNN())
    t = trainer(2, limit_val_batches=0, default_root_dir=str(tmp_path))
    t.fit(task, datamodule=DigitsDataModule(batch_size=16))
    t.save_checkpoint(tmp_path / "deit.ckpt")
    loaded = ImageClassificationTask.load_from_checkpoint(tmp_path / "deit.ckpt")
    assert loaded.teacher_model is None and loaded.hparams.distillation == "hard"
    pixels = digits_batch()["pixel_values"]
    assert torch.equal(loaded.model.eval()(pixels).logits, task.model.eval()(pixels).logits)


def test_teachers_load_from_a_cnn_state_dict_or_a_pretrained_folder(tmp_path):
    pixels = digits_batch()["pixel_values"]
    cnn = SmallCNN(channels=1, num_classes=10).eval()
    torch.save(cnn.state_dict(), tmp_path / "teacher.pt")
    loaded = load_teacher(str(tmp_path / "teacher.pt"), channels=1, num_classes=10)
    assert torch.equal(loaded(pixels), cnn(pixels)) and not loaded.training

    vit = ImageClassificationTask(family="vit").model.eval()
    vit.save_pretrained(tmp_path / "vit")
    loaded = load_teacher(str(tmp_path / "vit"), channels=1, num_classes=10)
    with torch.no_grad():  # as a teacher runs (with gradients, CPU training products may take other kernels)
        assert torch.equal(loaded(pixels).logits, vit(pixels).logits)
    assert not any(p.requires_grad for p in loaded.parameters())
    with pytest.raises(ValueError, match="neither"):
        load_teacher("resnet", channels=1, num_classes=10)
    # a teacher of other classes would hand the student labels it has no class for
    with pytest.raises(ValueError, match=r"teacher .*vit reads 1 channels into 10 classes; the student 1 channels "
                                         r"into 5 classes"):
        load_teacher(str(tmp_path / "vit"), channels=1, num_classes=5)
    with pytest.raises(ValueError, match="the student 3 channels into 10 classes"):
        load_teacher(str(tmp_path / "vit"), channels=3, num_classes=10)


def test_a_folder_teacher_reads_the_students_pixels_in_its_own_normalisation_and_size(tmp_path):
    torch.manual_seed(0)
    teacher = ViT(ViTConfig.from_name("vit-digits", n_layers=1)).eval()  # trained on (0.5, 0.5)
    teacher.save_pretrained(tmp_path / "vit")
    raw = torch.rand(4, 1, 32, 32)
    loaded = load_teacher(str(tmp_path / "vit"), channels=1, num_classes=10, mean=(0.1,), std=(0.3,),
                          image_size=(32, 32))
    with torch.no_grad():
        torch.testing.assert_close(loaded((raw - 0.1) / 0.3).logits, teacher((raw - 0.5) / 0.5).logits,
                                   atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match=r"reads 32×32 images; the student 16×16"):
        load_teacher(str(tmp_path / "vit"), channels=1, num_classes=10, image_size=(16, 16))


def test_distillation_settings_are_refused_by_name_not_read_as_soft():
    for bad in ("Hard", "hard ", "kd"):
        with pytest.raises(ValueError, match=f"distillation must be 'none', 'hard' or 'soft', got {bad!r}"):
            ImageClassificationTask(family="deit", distillation=bad, teacher="cnn:train")
    five = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(32 * 32, 5))  # a teacher of 5 classes
    task = ImageClassificationTask(family="deit", distillation="hard", teacher_module=five)
    with pytest.raises(ValueError, match="the teacher gives 5 class scores; the student has 10 classes"):
        task.training_loss(digits_batch())


def fit_with_a_trained_teacher(seed: int, tmp_path: Path) -> ImageClassificationTask:
    """One step of soft distillation from a `SmallCNN` trained for 3 steps, in a run seeded ``seed``."""
    L.seed_everything(seed)
    task = ImageClassificationTask(family="deit", distillation="soft", teacher="cnn:train", teacher_steps=3)
    t = trainer(1, limit_val_batches=0, logger=CSVLogger(str(tmp_path), name=f"seed{seed}"))
    t.fit(task, datamodule=DigitsDataModule(batch_size=16, augment=True))
    return task


def test_the_trained_teacher_follows_the_runs_seed_and_its_accuracy_is_logged(tmp_path):
    first, again, other = (fit_with_a_trained_teacher(seed, tmp_path) for seed in (1, 1, 2))
    weights = [task.teacher_model.state_dict() for task in (first, again, other)]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])  # same seed: same teacher
    assert not all(torch.equal(weights[0][k], weights[2][k]) for k in weights[0])  # another seed: another
    # Its accuracy on the validation scans is printed and logged with the run's metrics.
    expected = accuracy(first.teacher_model, DigitsDataModule().val_dataloader())
    assert first.teacher_val_acc == pytest.approx(expected)
    assert float(first.trainer.callback_metrics["teacher_val_acc"]) == pytest.approx(expected)
    assert "teacher_val_acc" in (Path(first.trainer.log_dir) / "metrics.csv").read_text()


def test_the_teacher_trains_on_training_scans_only():
    dm = DigitsDataModule(train_per_class=3, batch_size=10)
    dm.setup("fit")
    train = {tuple(x.flatten().tolist()) for x in dm.train_set.transform(dm.train_set.images)}
    seen = [tuple(x.flatten().tolist()) for batch in training_loader(dm, seed=0) for x in batch["pixel_values"]]
    assert len(seen) == 30 and set(seen) <= train  # 3 batches of 10: a pass over 3 scans of each digit


def test_mixup_blends_images_and_targets_by_the_same_weight():
    torch.manual_seed(0)
    pixels, labels = torch.rand(6, 1, 8, 8), torch.tensor([0, 1, 2, 3, 4, 5])
    mixed, targets = mix_up(pixels, labels, num_classes=10, alpha=1.0)
    assert mixed.shape == pixels.shape and targets.shape == (6, 10)
    torch.testing.assert_close(targets.sum(-1), torch.ones(6))
    weights = set()
    for i in range(6):  # row i is λ·x_i + (1 − λ)·x_j; its target puts λ on i's label (= i), 1 − λ on j's
        others = [int(k) for k in targets[i].nonzero().flatten() if int(k) != i]
        if not others:  # mixed with itself
            torch.testing.assert_close(mixed[i], pixels[i])
            continue
        j, lam = others[0], float(targets[i, i])
        weights.add(round(lam, 5))
        torch.testing.assert_close(mixed[i], lam * pixels[i] + (1 - lam) * pixels[j])
    assert len(weights) == 1  # one λ for the batch
    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="teacher_mixup must be ≥ 0"):
            ImageClassificationTask(family="deit", distillation="soft", teacher="cnn:train", teacher_mixup=bad)
    with pytest.raises(ValueError, match="teacher_mixup trains the 'cnn:train' teacher"):
        ImageClassificationTask(family="deit", distillation="soft", teacher="teacher.pt", teacher_mixup=1.0)


def test_mixup_draws_from_a_seed_when_given_one():
    pixels, labels = torch.rand(8, 1, 8, 8), torch.arange(8)
    first, again = mix_up(pixels, labels, 10, 1.0, seed=7), mix_up(pixels, labels, 10, 1.0, seed=7)
    other = mix_up(pixels, labels, 10, 1.0, seed=8)
    assert all(torch.equal(a, b) for a, b in zip(first, again))  # the same draw, whatever the global state
    assert not torch.equal(first[0], other[0])


def test_student_mixup_trains_on_blended_batches_the_teacher_reads_too():
    """``mixup`` = α blends each training batch (images and labels), drawn from the run's seed and
    the batch; a teacher's targets are its predictions on the same blended images."""
    seen: list[torch.Tensor] = []

    class Recording(torch.nn.Module):
        def forward(self, pixels):
            seen.append(pixels.clone())
            return torch.zeros(len(pixels), 10)

    torch.manual_seed(0)
    task = ImageClassificationTask(family="deit", distillation="soft", mixup=1.0, teacher_module=Recording())
    batch = {"pixel_values": torch.rand(4, 1, 32, 32), "labels": torch.tensor([0, 1, 2, 3])}
    loss = task.training_loss(batch, mixup_seed=3)
    pixels, targets = mix_up(batch["pixel_values"], batch["labels"], 10, 1.0, seed=3)
    assert not torch.equal(pixels, batch["pixel_values"])
    torch.testing.assert_close(seen[0], pixels)  # the teacher read the blended images
    out = task.model(pixels)
    expected = soft_distillation_loss(out.logits_cls, out.logits_dist, targets, torch.zeros(4, 10), 0.5, 3.0)
    torch.testing.assert_close(loss, expected)  # against the blended labels (the model has no dropout here)
    with pytest.raises(ValueError, match="mixup must be ≥ 0"):
        ImageClassificationTask(family="vit", mixup=float("nan"))


def test_distillation_needs_deit_and_a_teacher():
    with pytest.raises(ValueError, match="family='deit'"):
        ImageClassificationTask(family="vit", distillation="hard", teacher="cnn:train")
    with pytest.raises(ValueError, match="needs a teacher"):
        trainer().fit(ImageClassificationTask(family="deit", distillation="soft"), datamodule=DigitsDataModule())
    with pytest.raises(ValueError, match="distillation='none'"):
        ImageClassificationTask(family="deit", teacher="cnn:train")
    with pytest.raises(ValueError, match="no attention heads"):
        ImageClassificationTask(family="mixer", n_heads=2)


def test_a_pretrained_folder_is_the_starting_point(tmp_path):
    source = ImageClassificationTask(family="mixer")
    source.model.save_pretrained(tmp_path / "mixer")
    task = ImageClassificationTask(family="mixer", pretrained=str(tmp_path / "mixer"))
    for key, value in source.model.state_dict().items():
        assert torch.equal(task.model.state_dict()[key], value)
    new_head = ImageClassificationTask(family="mixer", pretrained=str(tmp_path / "mixer"), num_classes=4)
    assert new_head.model.head.out_features == 4
    with pytest.raises(ValueError, match="DeiT|MLPMixer"):
        ImageClassificationTask(family="deit", pretrained=str(tmp_path / "mixer"))
    with pytest.raises(ValueError, match="d_model"):
        ImageClassificationTask(family="mixer", pretrained=str(tmp_path / "mixer"), d_model=32)


def test_the_model_must_fit_the_data():
    task = ImageClassificationTask(family="vit", num_classes=7)
    with pytest.raises(ValueError, match="num_classes=10"):
        trainer().fit(task, datamodule=DigitsDataModule())


def test_test_writes_a_confusion_matrix_and_predict_returns_class_records(tmp_path):
    L.seed_everything(0)
    dm = DigitsDataModule(batch_size=128)
    task = ImageClassificationTask(family="vit")
    t = trainer(5, logger=CSVLogger(str(tmp_path), name="cm"), limit_val_batches=0)
    t.fit(task, datamodule=dm)
    t.test(task, datamodule=dm, verbose=False)
    png = Path(t.log_dir) / "confusion_matrix.png"
    assert png.is_file() and png.read_bytes().startswith(b"\x89PNG")
    matrix = task.confusion_matrix  # the 180 test scans, none of them a validation scan
    assert matrix.shape == (10, 10) and int(matrix.sum()) == 180
    assert np.bincount(dm.test_set.labels.numpy(), minlength=10).tolist() == matrix.sum(1).tolist()  # rows: true
    assert float(t.callback_metrics["test_acc"]) == pytest.approx(float(matrix.trace()) / 180)

    records = [r for batch in t.predict(task, datamodule=dm) for r in batch]  # predict reads the test scans too
    assert len(records) == 180 and all(0.0 <= r["score"] <= 1.0 for r in records)
    assert [r["target"] for r in records] == [str(y) for y in dm.test_set.labels.tolist()]
    predictions = torch.tensor([int(r["prediction"]) for r in records])  # class names: "0" … "9"
    assert torch.bincount(predictions, minlength=10).tolist() == matrix.sum(0).tolist()  # columns: predicted


def test_validation_logs_loss_top1_and_top5():
    task = ImageClassificationTask(family="vit")
    metrics = trainer().validate(task, datamodule=DigitsDataModule(batch_size=180), verbose=False)[0]
    assert {"val_loss", "val_acc", "val_top5"} <= set(metrics)
    assert 0.0 <= metrics["val_acc"] <= metrics["val_top5"] <= 1.0
    assert metrics["val_loss"] == pytest.approx(math.log(10), abs=0.1)  # an untrained head is near uniform


# ------------------------------------------------------------------ learning on digits


@pytest.mark.slow
def test_vit_learns_digits():
    L.seed_everything(0)
    accuracy = fit_and_score(ImageClassificationTask(family="vit", learning_rate=2e-3), DigitsDataModule(), steps=400)
    assert accuracy >= 0.90, f"ViT held-out accuracy {accuracy:.3f}"


@pytest.mark.slow
def test_mlp_mixer_learns_digits():
    L.seed_everything(0)
    accuracy = fit_and_score(ImageClassificationTask(family="mixer", learning_rate=2e-3), DigitsDataModule(), steps=250)
    assert accuracy >= 0.85, f"MLP-Mixer held-out accuracy {accuracy:.3f}"


def divergence_from(teacher: torch.nn.Module, task: ImageClassificationTask, datamodule: DigitsDataModule) -> float:
    """Mean KL(teacher ‖ student) over the held-out scans: how far the student's class
    distribution is from the teacher's."""
    total, count = 0.0, 0
    task.eval()
    with torch.no_grad():
        for batch in datamodule.val_dataloader():
            target = teacher(batch["pixel_values"]).log_softmax(-1)
            student = task.model(batch["pixel_values"]).logits.log_softmax(-1)
            total += float(torch.nn.functional.kl_div(student, target, log_target=True, reduction="sum"))
            count += len(target)
    return total / count


@pytest.mark.slow
def test_deit_distilled_from_a_cnn_learns_the_teachers_distribution():
    # A CNN teacher: ≥ 96 % held out after 200 steps, seconds on a CPU (97–97.5 % with AMD CPUs'
    # kernels, 96.9 % with an AMX Xeon's: 349 of 360). Nothing here selects a checkpoint, so both
    # held-out halves (validation and test, 360 scans) score, as below.
    held_out = dict(val_share=1.0)
    teacher = train_cnn_teacher(DigitsDataModule(), steps=200, seed=0)
    assert held_out_accuracy(teacher, DigitsDataModule(**held_out)) >= 0.96
    # The same DeiT (deit-digits) with the same seed, hence the same initial weights and batches, and
    # the same 250 steps: only the soft-distillation teacher differs. What distillation does is pull
    # the student's class distribution towards the teacher's: seeds 0–4 gave KL(teacher ‖ student)
    # 0.17 / 0.20 / 0.20 / 0.18 / 0.17 distilled against 0.39 / 0.28 / 0.34 / 0.31 / 0.29 without.
    # Whether that buys accuracy is a claim over seeds (benchmarks/claims_distillation.py, on a
    # data-poor slice), not asserted here: the accuracy margins were +5.8 / −0.6 / −1.4 / −1.1 / +4.2 points.
    steps, options = 250, dict(family="deit", learning_rate=2e-3)
    L.seed_everything(0)
    alone = ImageClassificationTask(**options)
    alone_acc = fit_and_score(alone, DigitsDataModule(**held_out), steps)
    L.seed_everything(0)
    student = ImageClassificationTask(**options, distillation="soft", teacher_module=teacher)
    distilled_acc = fit_and_score(student, DigitsDataModule(**held_out), steps)
    data = DigitsDataModule(**held_out)
    distilled, without = divergence_from(teacher, student, data), divergence_from(teacher, alone, data)
    assert distilled <= 0.75 * without, (f"KL from the teacher: distilled {distilled:.3f}, without a teacher "
                                         f"{without:.3f} (accuracy {distilled_acc:.3f} vs {alone_acc:.3f})")
