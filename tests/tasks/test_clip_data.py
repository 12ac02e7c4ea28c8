"""Captioned digits and users' image–caption pairs: the right captions, the held-out split and
templates kept apart, batches tokenized in the loader, and clear errors for bad files."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from tasks.data.captions import (
    HELD_OUT_TEMPLATES,
    OPENAI_MEAN,
    OPENAI_STD,
    TRAIN_TEMPLATES,
    CaptionedDigitsDataModule,
    ImageCaptionDataModule,
)
from tasks.data.sampling import ResumePoint
from tokenizers_mm import CLIPTokenizer


def test_digits_are_captioned_with_their_class_as_word_or_numeral_from_the_right_templates():
    data = CaptionedDigitsDataModule(batch_size=8)
    data.setup("fit")
    train, held = data.train_set, data.val_set
    assert (len(train), len(held), len(data.test_set)) == (1437, 180, 180)
    assert set(data.digits.train_indices).isdisjoint(data.digits.held_out_indices)

    def written(templates, label):
        return {t.format(name) for t in templates for name in (data.class_names[label], data.class_numerals[label])}

    forms = []
    for i in range(200):
        caption, label = train.caption(i), int(train.labels[i])
        assert caption in written(TRAIN_TEMPLATES, label)
        forms.append(any(ch.isdigit() for ch in caption))
        if i < len(held):  # 180 validation scans
            caption, label = held.caption(i), int(held.labels[i])
            assert caption in written(HELD_OUT_TEMPLATES, label)
    assert 0.35 < sum(forms) / len(forms) < 0.65  # numerals half of the time
    assert any(ch.isdigit() for i in range(len(held)) for ch in held.caption(i))  # held out: both forms too
    assert set(TRAIN_TEMPLATES).isdisjoint(HELD_OUT_TEMPLATES) and data.zero_shot_templates == HELD_OUT_TEMPLATES
    assert not any(ch.isdigit() for t in TRAIN_TEMPLATES + HELD_OUT_TEMPLATES for ch in t)  # the class is the only number
    drawn = {train.caption(0) for _ in range(50)}
    assert len(drawn) > 10  # a new wording each time the image is read
    words_only = CaptionedDigitsDataModule(batch_size=8, numerals=0.0)
    words_only.setup("fit")
    assert not any(ch.isdigit() for i in range(100) for ch in words_only.train_set.caption(i))


def test_batches_hold_normalised_pixels_tokenized_captions_and_labels():
    data = CaptionedDigitsDataModule(batch_size=8)
    batch = next(iter(data.train_dataloader()))
    assert batch["pixel_values"].shape == (8, 1, 32, 32) and batch["pixel_values"].min() >= -1.0
    assert batch["labels"].shape == (8,)
    ids = batch["input_ids"]
    assert ids.shape[0] == 8 and (ids[:, 0] == CLIPTokenizer().sot_id).all()
    assert ((ids == CLIPTokenizer().eot_id).sum(dim=1) == 1).all()


def test_digit_templates_must_have_a_slot():
    with pytest.raises(ValueError, match="no '\\{\\}'"):
        CaptionedDigitsDataModule(templates=("a digit",))
    with pytest.raises(ValueError, match=r"held-out templates are never captions .*\['a photo of a \{\}.'\] are in both"):
        CaptionedDigitsDataModule(templates=("a photo of a {}.", "a {}"), held_out_templates=("a photo of a {}.",))
    with pytest.raises(ValueError, match="batch_size ≥ 2"):
        CaptionedDigitsDataModule(batch_size=1)


def _images(folder, n=6):
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    paths = []
    for i in range(n):
        path = folder / f"img{i}.png"
        Image.fromarray(rng.integers(0, 255, size=(20, 30, 3), dtype=np.uint8)).save(path)
        paths.append(path)
    return paths


def test_jsonl_csv_and_folder_pairs_load(tmp_path):
    paths = _images(tmp_path / "images")
    lines = [json.dumps({"image": f"images/{p.name}", "caption": f"picture number {i}"}) for i, p in enumerate(paths)]
    (tmp_path / "pairs.jsonl").write_text("\n".join(lines))
    (tmp_path / "pairs.csv").write_text("image,caption\n" + "\n".join(f"images/{p.name},a caption {i}"
                                                                       for i, p in enumerate(paths)))
    for p in paths:
        p.with_suffix(".txt").write_text(f"caption of {p.stem}")
    for options in (dict(train_file=str(tmp_path / "pairs.jsonl")), dict(train_file=str(tmp_path / "pairs.csv")),
                    dict(train_folder=str(tmp_path / "images"))):
        data = ImageCaptionDataModule(image_size=16, batch_size=2, val_fraction=0.34, **options)
        assert (len(data.train_pairs), len(data.val_pairs)) == (4, 2)
        batch = next(iter(data.train_dataloader()))
        assert batch["pixel_values"].shape == (2, 3, 16, 16) and (batch["labels"] == -1).all()
        assert batch["input_ids"].dtype == torch.long


def test_bad_pair_files_are_clear_errors(tmp_path):
    paths = _images(tmp_path / "images", n=2)
    (tmp_path / "keys.jsonl").write_text(json.dumps({"path": paths[0].name, "text": "x"}))
    with pytest.raises(ValueError, match="lacks \\['image', 'caption'\\]"):
        ImageCaptionDataModule(train_file=str(tmp_path / "keys.jsonl"))
    (tmp_path / "missing.jsonl").write_text(json.dumps({"image": "nope.png", "caption": "x"}))
    with pytest.raises(FileNotFoundError, match="nope.png"):
        ImageCaptionDataModule(train_file=str(tmp_path / "missing.jsonl"))
    long = " ".join(["word"] * 100)
    (tmp_path / "long.jsonl").write_text("\n".join(json.dumps({"image": f"images/{p.name}", "caption": long})
                                                   for p in paths))
    with pytest.raises(ValueError, match="more than context_length=77"):
        ImageCaptionDataModule(train_file=str(tmp_path / "long.jsonl"), val_fraction=0.5)
    with pytest.warns(UserWarning, match="cut to 77"):
        ImageCaptionDataModule(train_file=str(tmp_path / "long.jsonl"), val_fraction=0.5, truncation="warn")
    with pytest.raises(ValueError, match="exactly one of train_file"):
        ImageCaptionDataModule()
    (tmp_path / "images" / "img0.txt").unlink(missing_ok=True)
    with pytest.raises(FileNotFoundError, match="no caption file img0.txt"):
        ImageCaptionDataModule(train_folder=str(tmp_path / "images"))


def _first_words(data, n, **loader):
    words = []
    for i, batch in enumerate(data.train_dataloader()):
        words.append([data.tokenizer.decode(ids).split()[0] for ids in batch["input_ids"]])
        if i + 1 == n:
            return words
    return words


def test_a_batchs_caption_templates_depend_on_its_seed_alone(monkeypatch):
    # each template starts with its own word, so a caption's first word names the template drawn
    monkeypatch.setenv("PL_GLOBAL_SEED", "0")
    templates = tuple(f"{w} {{}}" for w in "alpha bravo charlie delta echo foxtrot golf hotel india juliet".split())

    def data(**kwargs):
        module = CaptionedDigitsDataModule(templates=templates, numerals=0.0, batch_size=8, **kwargs)
        module.setup("fit")
        return module

    full = _first_words(data(), 4)
    resumed = data()
    resumed.resume_point = ResumePoint(epoch=0, batches=2)
    assert _first_words(resumed, 2) == full[2:]  # a resumed run reads the captions it would have read
    workers = _first_words(data(num_workers=2), 4)
    assert workers == full  # two workers: the same captions, not each worker's copy of one sequence
    assert workers[0] != workers[1]


def test_a_missing_mean_or_std_alone_takes_the_default(tmp_path):
    paths = _images(tmp_path / "images", n=4)
    (tmp_path / "pairs.jsonl").write_text("\n".join(json.dumps({"image": f"images/{p.name}", "caption": f"picture {i}"})
                                                    for i, p in enumerate(paths)))
    data = ImageCaptionDataModule(train_file=str(tmp_path / "pairs.jsonl"), mean=0.2, val_fraction=0.25)
    assert data.mean == (0.2, 0.2, 0.2) and data.std == tuple(OPENAI_STD)
    data = ImageCaptionDataModule(train_file=str(tmp_path / "pairs.jsonl"), std=0.9, val_fraction=0.25)
    assert data.mean == tuple(OPENAI_MEAN) and data.std == (0.9, 0.9, 0.9)


def test_an_images_captions_are_held_out_together_and_given_splits_share_no_image(tmp_path):
    paths = _images(tmp_path / "images", n=10)
    rows = [{"image": f"images/{p.name}", "caption": f"caption {j} of image {i}"} for i, p in enumerate(paths)
            for j in range(5)]  # COCO's five captions an image
    (tmp_path / "coco.jsonl").write_text("\n".join(json.dumps(r) for r in rows + rows[:1]))  # and a repeated row
    data = ImageCaptionDataModule(train_file=str(tmp_path / "coco.jsonl"), val_fraction=0.2)
    train, val = {p for p, _ in data.train_pairs}, {p for p, _ in data.val_pairs}
    assert len(val) == 2 and len(train) == 8 and train.isdisjoint(val)
    (tmp_path / "val.jsonl").write_text("\n".join(json.dumps(r) for r in rows[:5]))
    with pytest.raises(ValueError, match=r"1 image\(s\) of the validation pairs are also in the training pairs .*img0.png"):
        ImageCaptionDataModule(train_file=str(tmp_path / "coco.jsonl"), val_file=str(tmp_path / "val.jsonl"))
    with pytest.raises(ValueError, match=r"8 image\(s\) of the test pairs are also in the training pairs"):
        ImageCaptionDataModule(train_file=str(tmp_path / "coco.jsonl"), val_fraction=0.2,
                               test_file=str(tmp_path / "coco.jsonl"))
