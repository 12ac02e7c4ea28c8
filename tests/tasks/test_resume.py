"""Exact resume: a run resumed from a mid-epoch checkpoint reads the same batches in the same
order and logs the same losses, step for step, as the run that was never interrupted — across
the next epoch boundary too; and the pieces that make it so (`tasks.data.sampling`,
`tasks.ResumableRNG`)."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import random
import signal
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from lightning.pytorch.utilities import CombinedLoader

from tasks import CausalLMTask, ImageClassificationTask, resume_callbacks
from tasks.cli import main
from tasks.data.combined import MultiTaskDataModule
from tasks.data.image import DigitsDataModule
from tasks.data.sampling import (
    ResumableBatchSampler,
    ResumePoint,
    SeededFetch,
    SeededRandomSampler,
    resumable_loader,
)
from tasks.data.speech import BucketBatchSampler, SpokenDigitsDataModule
from tasks.resume import (
    ResumableRNG,
    ResumedBest,
    ResumedLogStep,
    _only_under,
    rng_states,
    set_rng_states,
)
from tasks.run_folder import find_checkpoint

ROOT = Path(__file__).resolve().parents[2]
GPT = ROOT / "configs" / "gpt" / "tiny.yaml"
VIT = ROOT / "configs" / "vit" / "digits.yaml"
QUIET = ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
         "--trainer.log_every_n_steps", "1"]


def batch_digest(batch: dict) -> str:
    """A hash of a batch's tensors (inputs after augmentation, labels)."""
    h = hashlib.sha1()
    for key in sorted(batch):
        if isinstance(batch[key], torch.Tensor):
            h.update(key.encode() + batch[key].detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def record_batches(monkeypatch, task_class) -> dict[int, str]:
    """{global step: digest of the batch it trained on}, filled by every run of ``task_class``."""
    seen: dict[int, str] = {}

    def on_train_batch_start(self, batch, batch_idx):
        seen[self.global_step + 1] = batch_digest(batch)

    monkeypatch.setattr(task_class, "on_train_batch_start", on_train_batch_start, raising=False)
    return seen


def train_losses(root: Path) -> dict[int, float]:
    """{step (1-based): train_loss} from every metrics.csv under ``root``."""
    losses = {}
    for path in root.rglob("metrics.csv"):
        with path.open() as f:
            for row in csv.DictReader(f):
                if row.get("train_loss"):
                    losses[int(row["step"]) + 1] = float(row["train_loss"])
    return losses


def fit(config, root: Path, *args: str) -> None:
    """``unitok fit`` with ``--trainer.default_root_dir root``, from inside ``root``."""
    root.mkdir(exist_ok=True)
    os.chdir(root)
    main(["fit", "--config", str(config), *args, *QUIET, "--trainer.default_root_dir", str(root)])


def every_n_steps(n: int) -> str:
    """An extra ModelCheckpoint writing ``every-step=N.ckpt`` every ``n`` steps (at the step's end)."""
    return "--trainer.callbacks+=" + json.dumps({
        "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
        "init_args": {"every_n_train_steps": n, "save_top_k": -1, "filename": "every-{step}"}})


def stop_at(monkeypatch, task_class, step: int) -> None:
    """A SIGTERM to this process while step ``step`` trains (what a scheduler's stop does)."""
    record = task_class.on_train_batch_start

    def on_train_batch_start(self, batch, batch_idx):
        record(self, batch, batch_idx)
        if self.global_step + 1 == step:
            assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None), "no SIGTERM handler"
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(task_class, "on_train_batch_start", on_train_batch_start)


def assert_resumes_exactly(full, resumed, full_batches, resumed_batches, steps, at):
    after = list(range(at + 1, steps + 1))
    assert sorted(resumed_batches) == after, "the resumed run trains the steps after the checkpoint"
    assert [resumed_batches[s] for s in after] == [full_batches[s] for s in after], "same batches, same order"
    assert sorted(full) == list(range(1, steps + 1)) and set(after) <= set(resumed)
    np.testing.assert_allclose([resumed[s] for s in after], [full[s] for s in after], rtol=0, atol=1e-6)


@pytest.mark.slow
def test_a_text_recipe_resumed_mid_epoch_logs_the_uninterrupted_losses(tmp_path, monkeypatch):
    # 48 windows of 4: 12 steps an epoch, dropout 0.1, a validation every 4 steps; the checkpoint
    # written at the end of step 5 (mid-epoch 0); the resumed run crosses into epoch 1.
    args = ["--data.builtin_max_bytes", "150000", "--data.vocab_size", "400", "--data.context_length", "32",
            "--data.batch_size", "4", "--data.train_samples", "48", "--data.cache_dir", str(tmp_path / "cache"),
            "--trainer.val_check_interval", "4", "--trainer.limit_val_batches", "2",
            "--model.init_args.dropout", "0.1", "--trainer.max_steps", "18", every_n_steps(5)]
    monkeypatch.chdir(tmp_path)
    seen = record_batches(monkeypatch, CausalLMTask)
    fit(GPT, tmp_path / "full", *args)
    full_batches = dict(seen)
    [checkpoint] = (tmp_path / "full").rglob("every-step=5.ckpt")

    seen.clear()
    torch.manual_seed(1234)  # the resumed process's own random state must not matter
    fit(GPT, tmp_path / "resumed", *args, "--ckpt_path", str(checkpoint))
    assert_resumes_exactly(train_losses(tmp_path / "full"), train_losses(tmp_path / "resumed"), full_batches,
                           dict(seen), steps=18, at=5)


def stop_and_resume(tmp_path: Path, monkeypatch, args: list[str], at: int, steps: int) -> tuple[dict, int]:
    """The digits recipe run in full, then again stopped by a SIGTERM while step ``at`` trains
    and resumed with ``--ckpt_path last``: the resumed run must train the full run's batches to
    its losses. Returns the stopped run's batches and the step its last.ckpt holds."""
    monkeypatch.chdir(tmp_path)
    seen = record_batches(monkeypatch, ImageClassificationTask)
    fit(VIT, tmp_path / "full", *args)
    full_batches = dict(seen)

    seen.clear()
    stop_at(monkeypatch, ImageClassificationTask, at)
    with pytest.raises(SystemExit) as stopped, pytest.warns(UserWarning, match="received SIGTERM: stopped after step"):
        fit(VIT, tmp_path / "stopped", *args)
    assert stopped.value.code == 128 + signal.SIGTERM
    stopped_batches = dict(seen)
    [last] = (tmp_path / "stopped").rglob("last.ckpt")
    stopped_step = torch.load(last, weights_only=True)["global_step"]
    seen = record_batches(monkeypatch, ImageClassificationTask)  # no more stops
    fit(VIT, tmp_path / "stopped", *args, "--ckpt_path", "last")
    assert_resumes_exactly(train_losses(tmp_path / "full"), train_losses(tmp_path / "stopped"), full_batches,
                           dict(seen), steps=steps, at=stopped_step)
    return stopped_batches, stopped_step


@pytest.mark.slow
def test_an_augmented_image_recipe_stopped_by_sigterm_resumes_from_last_with_the_same_losses(tmp_path, monkeypatch):
    # 1,437 digits in batches of 96: 14 steps an epoch, random affine augmentation and mixup, two
    # loader workers, a validation every 9 steps; SIGTERM during step 8, `--ckpt_path last`, and on
    # past the epoch boundary.
    args = ["--data.batch_size", "96", "--data.num_workers", "2", "--trainer.val_check_interval", "9",
            "--model.init_args.mixup", "0.4",
            "--trainer.limit_val_batches", "1", "--trainer.max_steps", "20"]
    batches, step = stop_and_resume(tmp_path, monkeypatch, args, at=8, steps=20)
    assert sorted(batches) == list(range(1, 9)) and step == 8


@pytest.mark.slow
def test_a_sigterm_in_the_middle_of_a_gradient_accumulation_stops_after_the_step_and_resumes_the_same_curve(
        tmp_path, monkeypatch):
    # two batches a step: the SIGTERM arrives as step 4's first batch trains; the run finishes
    # that step (its second batch) before stopping, so the checkpoint holds no half a step
    args = ["--data.batch_size", "96", "--trainer.accumulate_grad_batches", "2", "--trainer.val_check_interval", "12",
            "--trainer.limit_val_batches", "1", "--trainer.max_steps", "8", "--trainer.log_every_n_steps", "1"]
    _, step = stop_and_resume(tmp_path, monkeypatch, args, at=4, steps=8)
    assert step == 4, "the step in progress was finished"


def test_a_sigterm_while_testing_writes_no_checkpoint_that_last_would_then_find(tmp_path, monkeypatch):
    # `unitok test` reads a checkpoint and writes none, stopped or not: a last.ckpt written at
    # "step 0" would be the newest, and `fit --ckpt_path last` would restart from it
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "run"
    fit(VIT, root, "--data.batch_size", "32", "--trainer.max_steps", "2", "--trainer.limit_val_batches", "1")
    fitted = find_checkpoint(root, "last")

    def test_step(self, batch, batch_idx):
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(ImageClassificationTask, "test_step", test_step)
    with pytest.raises(SystemExit) as stopped, pytest.warns(UserWarning, match="received SIGTERM: test stopped"):
        main(["test", "--config", str(VIT), *QUIET, "--data.batch_size", "32", "--trainer.default_root_dir", str(root),
              "--ckpt_path", "last"])
    assert stopped.value.code == 128 + signal.SIGTERM
    assert sorted(root.rglob("*.ckpt")) == sorted((root / "version_0").rglob("*.ckpt"))
    assert find_checkpoint(root, "last") == fitted


@pytest.mark.slow
def test_a_resumed_run_keeps_the_best_score_of_the_run_it_goes_on_from(tmp_path, monkeypatch):
    # Validations every 2 steps read the scripted val_acc below. The first run (version_0) is best
    # at step 4 (0.9); resumed from its last.ckpt into version_1, no validation beats 0.9, so
    # version_1 writes no best.ckpt and `--ckpt_path best` still finds version_0's, kept on disk.
    script = {2: 0.5, 4: 0.9, 6: 0.7, 8: 0.8, 10: 0.6, 12: 0.85}

    def validation_step(self, batch, batch_idx):
        self.log("val_acc", script.get(self.global_step, 0.0))  # 0.0: the sanity check

    monkeypatch.setattr(ImageClassificationTask, "validation_step", validation_step)
    monkeypatch.chdir(tmp_path)
    args = ["--data.batch_size", "96", "--trainer.val_check_interval", "2", "--trainer.limit_val_batches", "1"]
    root = tmp_path / "run"
    fit(VIT, root, *args, "--trainer.max_steps", "6")
    best = root / "version_0" / "checkpoints" / "best.ckpt"
    assert torch.load(best, weights_only=True)["global_step"] == 4
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(VIT, root, *args, "--trainer.max_steps", "12", "--ckpt_path", "last")
    assert not [w for w in caught if "dirpath has changed" in str(w.message)]
    assert (root / "version_1" / "checkpoints" / "last.ckpt").is_file()
    assert not (root / "version_1" / "checkpoints" / "best.ckpt").exists(), "0.8 and 0.85 do not beat 0.9"
    assert find_checkpoint(root, "best") == best and torch.load(best, weights_only=True)["global_step"] == 4

    # Resumed again, a run that beats the best writes its own best.ckpt; the earlier run's stays.
    script.update({14: 0.95})
    fit(VIT, root, *args, "--trainer.max_steps", "14", "--ckpt_path", "last")
    assert torch.load(root / "version_2" / "checkpoints" / "best.ckpt", weights_only=True)["global_step"] == 14
    assert best.is_file() and find_checkpoint(root, "best") == root / "version_2" / "checkpoints" / "best.ckpt"


# --------------------------------------------------------------------------- the pieces


def digests(loader, n: int | None = None) -> list[str]:
    out = []
    for i, batch in enumerate(loader):
        if i == n:
            break
        out.append(batch_digest(batch))
    return out


@pytest.fixture(scope="module")
def digits() -> DigitsDataModule:
    data = DigitsDataModule(batch_size=256, image_size=16, augment=True)
    data.setup("fit")
    data.shuffle_seed = 7
    return data


def test_training_batches_depend_on_seed_epoch_and_pass_only_not_on_workers_or_global_state(digits):
    torch.manual_seed(0)
    first = digests(digits.train_dataloader())
    torch.manual_seed(1)
    random.seed(1)
    np.random.seed(1)
    assert digests(digits.train_dataloader()) == first  # augmentation drew from the batch's own seed
    digits.num_workers = 2
    try:
        assert digests(digits.train_dataloader()) == first
    finally:
        digits.num_workers = 0
    loader = digits.train_dataloader()
    assert digests(loader) == first and digests(loader) != first  # a second pass: a new order
    loader.batch_sampler.sampler.set_epoch(1)
    assert digests(loader) not in (first, digests(digits.train_dataloader()))


def test_fetching_a_batch_leaves_the_global_generators_alone(digits):
    torch.manual_seed(3)
    before = rng_states()
    digests(digits.train_dataloader(), 2)
    after = rng_states()
    assert torch.equal(before["torch"], after["torch"]) and before["python"] == after["python"]
    assert torch.equal(before["numpy"]["keys"], after["numpy"]["keys"])


def test_a_loader_built_at_a_resume_point_reads_on_from_that_batch(digits):
    full = digests(digits.train_dataloader())
    digits.resume_point = ResumePoint(epoch=0, batches=2)
    assert digests(digits.train_dataloader()) == full[2:]
    assert digests(digits.train_dataloader()) == full, "only the first loader after loading resumes"
    second_epoch = digits.train_dataloader()
    second_epoch.batch_sampler.sampler.set_epoch(1)
    expected = digests(second_epoch)
    digits.resume_point = ResumePoint(epoch=1, batches=3)
    assert digests(digits.train_dataloader()) == expected[3:]


def test_a_resume_point_past_a_short_loader_falls_in_a_later_pass():
    assert ResumePoint(0, 3).locate(10) == (0, 3)
    assert ResumePoint(0, 23).locate(10) == (2, 3)
    assert ResumePoint(0, 23, cycle=False).locate(10) == (0, 10)  # "max_size": exhausted this epoch
    sampler = ResumableBatchSampler(SeededRandomSampler(range(20), seed=1), 5, False, seed=1)
    passes = [list(sampler) for _ in range(3)]
    resumed = ResumableBatchSampler(SeededRandomSampler(range(20), seed=1), 5, False, seed=1,
                                    resume=ResumePoint(0, 6))  # pass 1, batch 2
    assert list(resumed) == passes[1][2:] and list(resumed) == passes[2]


def test_bucketed_speech_batches_resume_and_shuffle_from_their_seed():
    lengths = torch.rand(60, generator=torch.Generator().manual_seed(0)).tolist()

    def bucketed(resume=None):
        return BucketBatchSampler(SeededRandomSampler(range(60), seed=4), batch_size=6, drop_last=True,
                                  lengths=lengths, pool_batches=5, seed=4, resume=resume)

    torch.manual_seed(0)
    full = list(bucketed())
    torch.manual_seed(1)
    assert list(bucketed()) == full and [b.seed for b in bucketed()] == [b.seed for b in full]
    assert list(bucketed(ResumePoint(0, 4))) == full[4:]
    assert sorted(i for b in full for i in b) == list(range(60))


def test_multitask_data_saves_and_restores_every_tasks_position(tmp_path):
    class Trainer:  # what `training_position` reads
        current_epoch, num_training_batches, state = 0, 14, type("S", (), {"fn": "fit"})()
        fit_loop = type("F", (), {"epoch_loop": type("E", (), {"batch_progress": type(
            "B", (), {"current": type("C", (), {"processed": 9})()})()})()})()

    def multitask():
        data = MultiTaskDataModule({"big": DigitsDataModule(batch_size=100, image_size=16, augment=True),
                                    "small": DigitsDataModule(batch_size=400, image_size=16, augment=True)})
        for task in data.tasks.values():
            task.setup("fit")
            task.trainer = Trainer()
        return data

    data = multitask()
    loader = data.train_dataloader()  # 14 and 3 batches: "small" cycles
    assert isinstance(loader, CombinedLoader)
    seeds = {name: task.shuffle_seed for name, task in data.tasks.items()}
    assert seeds["big"] != seeds["small"]
    steps = [{name: batch_digest(b) for name, b in batch.items()} for batch, _, _ in loader]
    state = data.state_dict()
    assert state["big"]["batches"] == 9 and state["small"]["seed"] == seeds["small"]

    resumed = multitask()
    resumed.load_state_dict(state)
    rest = [{name: batch_digest(b) for name, b in batch.items()} for batch, _, _ in resumed.train_dataloader()]
    assert rest == steps[9:]


def test_rng_states_round_trip_through_a_weights_only_checkpoint(tmp_path):
    torch.manual_seed(5)
    np.random.seed(5)
    random.seed(5)
    states = rng_states()
    expected = (torch.rand(3), np.random.rand(3), random.random())
    path = tmp_path / "states.pt"
    torch.save(states, path)
    torch.manual_seed(0)
    set_rng_states(torch.load(path, weights_only=True))
    again = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(expected[0], again[0]) and np.array_equal(expected[1], again[1]) and expected[2] == again[2]


def test_a_resumed_checkpoint_callback_removes_files_of_its_own_run_only(tmp_path):
    removed = []
    remove = _only_under(str(tmp_path / "version_1" / "checkpoints"), lambda trainer, path: removed.append(path))
    for path in ("version_1/checkpoints/best.ckpt", "version_1/checkpoints/sub/epoch=3.ckpt",
                 "version_0/checkpoints/best.ckpt", "version_1/checkpoints/../../version_0/checkpoints/best.ckpt",
                 "version_1/checkpoints-old/best.ckpt"):
        remove(None, str(tmp_path / path))
    assert removed == [str(tmp_path / "version_1/checkpoints/best.ckpt"),
                       str(tmp_path / "version_1/checkpoints/sub/epoch=3.ckpt")]


def test_the_callbacks_a_run_needs():
    assert [type(c) for c in resume_callbacks()] == [ResumableRNG, ResumedBest, ResumedLogStep]


@pytest.mark.parametrize("counter", [12, 14])  # a logging counter one behind or one ahead of the step
def test_a_resumed_run_logs_each_step_at_its_own_number(counter):
    from types import SimpleNamespace

    loop = SimpleNamespace(_batches_that_stepped=counter)
    trainer = SimpleNamespace(global_step=13, fit_loop=SimpleNamespace(epoch_loop=loop))
    module = SimpleNamespace(automatic_optimization=True)
    callback = ResumedLogStep()
    callback.on_train_start(trainer, module)
    callback.on_train_batch_start(trainer, module, None, 0)
    assert loop._batches_that_stepped == 13  # as the uninterrupted run's counter at that batch
    loop._batches_that_stepped = 20
    callback.on_train_batch_start(trainer, module, None, 1)
    assert loop._batches_that_stepped == 20  # once, at the first batch after the resume


def test_settings_are_compared_as_plain_values_and_neutral_ones_ignored():
    from jsonargparse import Namespace

    from tasks.resume import changed_settings, plain_settings

    before = plain_settings({"model": Namespace(class_path="tasks.X", init_args=Namespace(lr=0.1, sizes=(1, 2))),
                             "data": {"init_args": {"batch_size": 8, "num_workers": 0, "cache_dir": "a"}}})
    assert before == {"model.class_path": "tasks.X", "model.init_args.lr": 0.1, "model.init_args.sizes": [1, 2],
                      "data.init_args.batch_size": 8, "data.init_args.num_workers": 0, "data.init_args.cache_dir": "a"}
    after = {**before, "model.init_args.lr": 0.2, "data.init_args.num_workers": 4, "data.init_args.cache_dir": "b"}
    assert changed_settings(before, after) == ["model.init_args.lr: 0.1 → 0.2"]


def test_an_option_added_since_a_checkpoint_was_written_is_unchanged_at_its_default():
    from tasks.resume import changed_settings

    # a checkpoint of an image run from before `mixup` and `model_config` existed
    current = {"model.class_path": "tasks.ImageClassificationTask", "model.init_args.learning_rate": 0.002,
               "model.init_args.mixup": 0.0, "model.init_args.model_config": None}
    before = {k: v for k, v in current.items() if k not in ("model.init_args.mixup", "model.init_args.model_config")}
    assert changed_settings(before, current) == []
    # set to something else, the new option does change the run's curve
    assert changed_settings(before, {**current, "model.init_args.mixup": 0.4}) == ["model.init_args.mixup: None → 0.4"]
    # an option the checkpoint did record is compared as always, default or not
    assert changed_settings({**current, "model.init_args.mixup": 0.4}, current) == ["model.init_args.mixup: 0.4 → 0.0"]


def test_resumable_loaders_keep_the_datasets_attributes(digits):
    loader = resumable_loader(digits.train_set, ResumableBatchSampler(range(8), 4, True), None)
    assert isinstance(loader.dataset, SeededFetch) and len(loader.dataset) == len(digits.train_set)
    assert loader.dataset.transform is digits.train_set.transform
    assert hasattr(loader, "state_dict") and hasattr(loader, "load_state_dict")  # resumable, for Lightning


def test_a_resume_on_a_corpus_made_otherwise_since_is_refused_by_name(tmp_path, monkeypatch, capsys):
    # The same settings, another token stream (what another version of the code that cuts or
    # tokenizes the built-in corpus would give): the resumed run would train on other data.
    args = ["--data.builtin_max_bytes", "60000", "--data.vocab_size", "300", "--data.context_length", "16",
            "--data.batch_size", "4", "--data.cache_dir", str(tmp_path / "cache"), "--model.preset", "gpt-nano",
            "--trainer.max_steps", "2", "--trainer.limit_val_batches", "1"]
    monkeypatch.chdir(tmp_path)
    fit(GPT, tmp_path / "run", *args)
    [last] = (tmp_path / "run").rglob("last.ckpt")
    recorded = torch.load(last, weights_only=True)["TextDataModule"]["data"]
    [tokens] = (tmp_path / "cache").rglob("tokens.bin")
    stream = np.fromfile(tokens, dtype=np.uint16)
    stream[:8] = stream[8:16]  # a corpus cut otherwise
    stream.tofile(tokens)
    with pytest.raises(SystemExit) as refused:
        fit(GPT, tmp_path / "run", *args, "--trainer.max_steps", "4", "--ckpt_path", str(last))
    assert refused.value.code == 2
    assert f"TextDataModule's training data is not the checkpoint's (data key {recorded} → " in capsys.readouterr().err
    fit(GPT, tmp_path / "run", *args, "--trainer.max_steps", "4")  # a new run on it is fine
    main(["validate", "--config", str(GPT), *args, *QUIET, "--trainer.default_root_dir", str(tmp_path / "run"),
          "--ckpt_path", str(last)])  # and so is evaluating the checkpoint on it


def test_the_spoken_digit_corpus_key_names_its_voices_and_synthesis_version(monkeypatch):
    from tasks.data import speech

    data = SpokenDigitsDataModule(batch_size=4, train_utterances=8, held_out_utterances=4)
    key = data.data_key()
    assert key == data.spec.key() == SpokenDigitsDataModule(batch_size=4, train_utterances=8,
                                                            held_out_utterances=4).data_key()
    assert SpokenDigitsDataModule(batch_size=4, train_utterances=8, held_out_utterances=4,
                                  train_voices=["linda"]).data_key() != key
    monkeypatch.setattr(speech, "CORPUS_VERSION", speech.CORPUS_VERSION + 1)  # synthesis changed since
    assert data.data_key() != key


def test_the_text_data_key_reads_its_token_stream_once(tmp_path, monkeypatch):
    # every checkpoint records the key: a big corpus must not be re-read and hashed at each save
    from tasks.data import text as text_data

    data = text_data.TextDataModule(builtin_max_bytes=60000, vocab_size=300, context_length=16, batch_size=4,
                                    cache_dir=tmp_path)
    data.prepare_data()
    opened = []
    monkeypatch.setattr(text_data, "open", lambda *a, **k: opened.append(a[0]) or open(*a, **k), raising=False)
    assert data.data_key() == data.data_key() and len(opened) == 1
