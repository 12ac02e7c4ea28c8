"""A held-out test split wherever a test metric is reported: the built-in digit scans (and the
captioned digits and the scan × speech pairs built on them), CartPole episodes and the
labelled-text fine-tuning sets each get a third split, disjoint from training and validation,
and ``test_dataloader`` (and ``predict``) serve it — while the training items stay the ones the
old two-way split chose (the old rule is computed here inline). The spoken digits' cut is in
tests/tasks/test_speech_data.py (it shares that file's tiny corpus)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from tasks import (
    CaptionedDigitsDataModule,
    CodeTokensDataModule,
    DigitsDataModule,
    DocstringDataModule,
    ImageAudioPairsDataModule,
    TrajectoryDataModule,
    builtin_trajectories,
)
from tasks.data.captions import HELD_OUT_TEMPLATES


def old_digit_split(seed: int = 0, fraction: float = 0.2) -> tuple[np.ndarray, np.ndarray]:
    """The two-way split before the test split: (train, held out) indices, sorted."""
    train, held = train_test_split(np.arange(1797), test_size=fraction, stratify=load_digits().target,
                                   random_state=seed)
    return np.sort(train), np.sort(held)


def images_of(loader) -> torch.Tensor:
    return torch.cat([batch["pixel_values"] for batch in loader])


# ------------------------------------------------------------------ digit scans


def test_digit_scans_split_three_ways_and_training_is_the_old_split():
    dm = DigitsDataModule(batch_size=100)
    dm.setup("fit")
    old_train, old_held = old_digit_split()
    assert np.array_equal(dm.train_indices, old_train) and np.array_equal(dm.held_out_indices, old_held)
    images, labels = dm.images()
    normalize = lambda x: (x - 0.5) / 0.5  # noqa: E731 — the default mean / std
    assert torch.equal(dm.train_set.images, images[torch.from_numpy(old_train)])  # the same 1,437, same order
    assert torch.equal(dm.train_set.labels[:20], labels[torch.from_numpy(old_train[:20])])
    assert torch.equal(dm.train_set[0]["pixel_values"], normalize(images[int(old_train[0])]))

    train, val, test = (set(i.tolist()) for i in (dm.train_indices, dm.val_indices, dm.test_indices))
    assert (len(train), len(val), len(test)) == (1437, 180, 180)
    assert not train & val and not train & test and not val & test
    assert val | test == set(old_held.tolist())
    for part in (dm.val_set, dm.test_set):  # stratified: 17–19 scans of every digit in each half
        counts = np.bincount(part.labels.numpy(), minlength=10)
        assert counts.min() >= 17 and counts.max() <= 19

    # The test loader serves the test scans, in order, and not the validation ones.
    tested = images_of(dm.test_dataloader())
    assert torch.equal(tested, normalize(images[torch.from_numpy(dm.test_indices)]))
    assert not torch.equal(tested, images_of(dm.val_dataloader()))
    assert torch.equal(images_of(dm.predict_dataloader()), tested)  # predict reads the test scans

    # Seeded: the same halves again; another seed cuts them differently.
    again = DigitsDataModule()
    again.setup("fit")
    assert np.array_equal(again.test_indices, dm.test_indices)
    other = DigitsDataModule(split_seed=1)
    other.setup("fit")
    assert not np.array_equal(other.test_indices, dm.test_indices)


def test_val_share_sizes_the_halves_and_one_gives_the_old_two_way_split():
    quarter = DigitsDataModule(val_share=0.25)
    quarter.setup("fit")
    assert (len(quarter.train_set), len(quarter.val_set), len(quarter.test_set)) == (1437, 90, 270)
    whole = DigitsDataModule(val_share=1.0, batch_size=400)
    whole.setup("fit")
    assert whole.test_set is None and len(whole.val_set) == 360
    assert torch.equal(images_of(whole.test_dataloader()), images_of(whole.val_dataloader()))  # no third split
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match=rf"val_share must be in \(0, 1\], got {re.escape(str(bad))}$"):
            DigitsDataModule(val_share=bad)


def test_captioned_digits_keep_their_training_scans_and_test_on_the_test_scans():
    data = CaptionedDigitsDataModule(batch_size=8)
    data.setup("fit")
    old_train, old_held = old_digit_split()
    images, labels = data.digits.images()
    assert torch.equal(data.train_set.images, images[torch.from_numpy(old_train)])
    assert data.train_set.labels.tolist() == labels[torch.from_numpy(old_train)].tolist()
    val, test = data.val_set, data.test_set
    assert (len(val), len(test)) == (180, 180)
    assert torch.equal(test.images, images[torch.from_numpy(data.digits.test_indices)])
    assert torch.equal(val.images, images[torch.from_numpy(data.digits.val_indices)])
    assert set(data.digits.val_indices.tolist()).isdisjoint(data.digits.test_indices.tolist())
    assert data.test_dataloader().dataset is test and data.val_dataloader().dataset is val
    for i in range(len(test)):  # fixed held-out captions of the test scan's own class
        name, numeral = data.class_names[int(test.labels[i])], data.class_numerals[int(test.labels[i])]
        assert test.caption(i) in {t.format(c) for t in HELD_OUT_TEMPLATES for c in (name, numeral)}


def test_scan_and_speech_pairs_test_on_scans_and_utterances_validation_never_sees(tmp_path):
    data = ImageAudioPairsDataModule(cache_dir=str(tmp_path), train_utterances=40, held_out_utterances=40,
                                     train_pairs=64, held_out_pairs=32, batch_size=8)
    data.setup()
    old_train, _ = old_digit_split()
    images, _ = data.digits.images()
    assert torch.equal(data.train_set.images, images[torch.from_numpy(old_train)])  # training scans unchanged
    assert len(data.train_set.frames) == 40  # every training utterance, as before
    val, test = data.val_set, data.test_set
    normalize = lambda x: (x - 0.5) / 0.5  # noqa: E731
    assert torch.equal(val.images, normalize(images[torch.from_numpy(data.digits.val_indices)]))
    assert torch.equal(test.images, normalize(images[torch.from_numpy(data.digits.test_indices)]))
    # The held-out utterances are cut per digit: no utterance in both, every digit in each.
    assert {id(f) for f in val.frames}.isdisjoint(id(f) for f in test.frames)
    assert len(val.frames) + len(test.frames) == 40
    assert set(val.audio_digits.tolist()) == set(test.audio_digits.tolist()) == set(range(10))
    assert len(val) == len(test) == 32
    tested = next(iter(data.test_dataloader()))
    first = [test[i] for i in range(8)]
    assert torch.equal(tested["features"][0, : first[0]["features"].shape[0]], first[0]["features"])
    assert tested["image_digits"].tolist() == [it["image_digits"] for it in first]


# ------------------------------------------------------------------ CartPole episodes

MIX = dict(expert_episodes=2, noisy_episodes=6, random_episodes=4)  # 12 short-ish episodes


def test_trajectory_test_episodes_come_out_of_the_old_validation_share(tmp_path):
    dm = TrajectoryDataModule(env_id="CartPole-v1", context_length=4, batch_size=32, val_fraction=0.5,
                              cache_dir=str(tmp_path), **MIX)
    episodes = builtin_trajectories("CartPole-v1", seed=0, cache_dir=str(tmp_path), **MIX)
    order = np.random.default_rng(0).permutation(len(episodes))  # the old rule: the first 6 held out
    old_train = [episodes[i] for i in sorted(order[6:])]
    assert len(dm.train_episodes) == len(old_train) == 6
    for ep, old in zip(dm.train_episodes, old_train, strict=True):
        assert np.array_equal(ep.observations, old.observations) and np.array_equal(ep.actions, old.actions)
    assert (len(dm.val_episodes), len(dm.test_episodes)) == (3, 3)

    def key(ep) -> bytes:  # CartPole starts every episode from its own random state
        return ep.observations[0].tobytes()

    train, val, test = ({key(e) for e in part} for part in (dm.train_episodes, dm.val_episodes, dm.test_episodes))
    assert len(train | val | test) == 12 and not train & val and not train & test and not val & test
    assert val | test == {key(episodes[i]) for i in order[:6]}
    assert dm.max_episode_length == max(ep.length for ep in episodes)  # as before: every episode counts

    loader = dm.test_dataloader()
    assert len(loader.dataset) == sum(ep.length for ep in dm.test_episodes)
    assert len(dm.val_dataloader().dataset) == sum(ep.length for ep in dm.val_episodes)
    first = next(iter(loader))
    step0 = first["states"][0, -1]  # the first window ends at the first test episode's first step
    expected = (dm.test_episodes[0].observations[0] - dm.tokenizer.state_mean) / dm.tokenizer.state_std
    torch.testing.assert_close(step0, torch.as_tensor(expected, dtype=torch.float32))
    assert len(dm.predict_dataloader().dataset) == len(loader.dataset)


def test_one_held_out_episode_validates_and_the_test_loader_falls_back_to_it(tmp_path):
    dm = TrajectoryDataModule(env_id="CartPole-v1", context_length=4, val_fraction=0.1, cache_dir=str(tmp_path),
                              **MIX)
    assert (len(dm.train_episodes), len(dm.val_episodes), dm.test_episodes) == (11, 1, [])
    assert len(dm.test_dataloader().dataset) == dm.val_episodes[0].length
    with pytest.raises(ValueError, match=r"val_share must be in \(0, 1\], got 0\.0$"):
        TrajectoryDataModule(val_share=0.0)


# ------------------------------------------------------------------ labelled text


def old_label_budget(groups: dict[int, list], val_per_class: int, train_per_class: int | None, seed: int = 0):
    """The old two-way rule: per class, a seeded shuffle; the first val_per_class validate, the
    next train_per_class (all the rest when None) train."""
    rng = np.random.default_rng(seed)
    train, val = [], []
    for label in sorted(groups):
        order = rng.permutation(len(groups[label]))
        val += [groups[label][i] for i in order[:val_per_class]]
        rest = order[val_per_class:]
        train += [groups[label][i] for i in (rest if train_per_class is None else rest[:train_per_class])]
    return train, val


def by_class(examples: list[dict]) -> dict[int, list[dict]]:
    groups: dict[int, list[dict]] = {}
    for ex in examples:
        groups.setdefault(ex["label"], []).append(ex)
    return groups


@pytest.mark.parametrize("make", [
    lambda cache: DocstringDataModule(packages=["json", "calendar"], val_per_class=5, train_per_class=10,
                                      cache_dir=cache),
    lambda cache: CodeTokensDataModule(packages=["json"], val_per_class=20, train_per_class=64, cache_dir=cache),
], ids=["docstring-packages", "code-tokens"])
def test_labelled_text_keeps_its_budget_and_tests_on_examples_neither_split_holds(make, tmp_path):
    dm = make(str(tmp_path))
    old_train, old_val = old_label_budget(by_class(dm._examples()), dm.val_per_class, dm.train_per_class)
    splits = dm.splits()
    assert splits["train"] == old_train and splits["val"] == old_val  # same examples, same order
    ids = {name: {id(e) for e in splits[name]} for name in ("train", "val", "test")}
    assert ids["test"] and not ids["train"] & ids["val"] and not ids["train"] & ids["test"]
    assert not ids["val"] & ids["test"]
    assert max(len(group) for group in by_class(splits["test"]).values()) <= dm.val_per_class  # = test_per_class
    assert dm.test_dataloader().dataset is splits["test"]  # the test loader serves the test examples
    assert dm.predict_dataloader().dataset is splits["test"]


def test_labelled_text_test_examples_do_not_depend_on_the_budget(tmp_path):
    cache = str(tmp_path)
    options = dict(packages=["asyncio", "email", "logging", "tkinter"], val_per_class=50, cache_dir=cache)
    budget = DocstringDataModule(train_per_class=64, **options).splits()
    everything = DocstringDataModule(**options).splits()  # train_per_class=None: all but val and test
    assert [len(s) for s in by_class(budget["test"]).values()] == [50, 50, 50, 50]
    assert [e["text"] for e in budget["test"]] == [e["text"] for e in everything["test"]]
    assert [e["text"] for e in budget["val"]] == [e["text"] for e in everything["val"]]
    # 1,353 docstrings: 45 repeats, and 145 more near-copies (templated, one word apart) or families
    # spread over two packages
    assert len(everything["train"]) == 1163 - 200 - 200
    # Disjoint as texts: the standard library repeats a few docstrings word for word; each is kept once.
    assert {e["text"] for e in everything["train"]}.isdisjoint(e["text"] for e in everything["test"])
    assert {e["text"] for e in everything["val"]}.isdisjoint(e["text"] for e in everything["test"])


def test_no_test_examples_means_the_test_loader_serves_validation(tmp_path):
    dm = DocstringDataModule(packages=["json", "calendar"], val_per_class=5, train_per_class=10, test_per_class=0,
                             cache_dir=str(tmp_path))
    assert "test" not in dm.splits() and dm.test_dataloader().dataset is dm.splits()["val"]
    with pytest.raises(ValueError, match=r"test_per_class must be an integer ≥ 0 .*, got -1$"):
        DocstringDataModule(packages=["json", "calendar"], val_per_class=5, test_per_class=-1, cache_dir=str(tmp_path))
    with pytest.raises(ValueError, match=r"val_per_class=10 \+ test_per_class=10"):
        DocstringDataModule(packages=["json", "calendar"], val_per_class=10, cache_dir=str(tmp_path)).splits()


# ------------------------------------------------------------------ users' pair files


def test_users_caption_and_audio_image_pairs_take_a_test_file(tmp_path):
    import json

    import soundfile
    from PIL import Image

    from tasks import AudioImageManifestDataModule, ImageCaptionDataModule

    rng = np.random.default_rng(0)
    rows = []
    for i in range(8):
        soundfile.write(tmp_path / f"{i}.wav", (0.1 * rng.standard_normal(4000)).astype("float32"), 16000)
        Image.fromarray(rng.integers(0, 255, (12, 12, 3), dtype=np.uint8)).save(tmp_path / f"{i}.png")
        rows.append({"audio": f"{i}.wav", "image": f"{i}.png", "caption": f"picture number {i}"})

    def write(name: str, part: list[dict]) -> str:
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in part))
        return str(tmp_path / name)

    train, test = write("train.jsonl", rows[:6]), write("test.jsonl", rows[6:])
    captions = ImageCaptionDataModule(train_file=train, test_file=test, image_size=8, batch_size=2,
                                      val_fraction=0.34)
    old_train = ImageCaptionDataModule(train_file=train, image_size=8, batch_size=2, val_fraction=0.34).train_pairs
    assert captions.train_pairs == old_train  # the training pairs do not change
    files = {name: {p for p, _ in pairs} for name, pairs in
             (("train", captions.train_pairs), ("val", captions.val_pairs), ("test", captions.test_pairs))}
    assert files["test"] == {tmp_path / "6.png", tmp_path / "7.png"} and not files["test"] & (files["train"] | files["val"])
    tested = next(iter(captions.test_dataloader()))
    assert tested["pixel_values"].shape == (2, 3, 8, 8)
    assert captions.dataset("test").captions == ["picture number 6", "picture number 7"]
    assert ImageCaptionDataModule(train_file=train, image_size=8, batch_size=2).dataset("test") is None  # none given

    audio = AudioImageManifestDataModule(train, test_manifest=test, image_size=8, batch_size=2, val_fraction=0.34)
    assert audio.train_pairs == AudioImageManifestDataModule(train, image_size=8, batch_size=2,
                                                             val_fraction=0.34).train_pairs
    assert [image for _, image in audio.test_pairs] == [tmp_path / "6.png", tmp_path / "7.png"]
    assert audio.test_dataloader().dataset.pairs == audio.test_pairs
