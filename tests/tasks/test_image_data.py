"""Image data: the built-in digits (fixed stratified split, documented range, train-only
augmentation) and users' image folders (layouts, channels, sizes, clear errors)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from tasks import DigitsDataModule, ImageFolderDataModule

# ------------------------------------------------------------------ digits


def test_digits_split_is_fixed_disjoint_and_stratified():
    dm = DigitsDataModule()
    dm.setup("fit")
    train, held = dm.train_indices, dm.held_out_indices
    assert (len(train), len(held)) == (1437, 360)  # 20 % of 1,797 held out
    assert not set(train) & set(held) and sorted([*train, *held]) == list(range(1797))
    # Stratified: every digit is held out in its share of the data (20 % of ~180 scans each),
    # half of it validating and half testing.
    counts = np.bincount(dm.val_set.labels.numpy(), minlength=10) + np.bincount(dm.test_set.labels.numpy(), minlength=10)
    assert counts.min() >= 35 and counts.max() <= 37
    # Fixed: another module with the same seed holds out the same scans; another seed does not.
    again = DigitsDataModule()
    again.setup("fit")
    assert np.array_equal(again.held_out_indices, held)
    other = DigitsDataModule(split_seed=1)
    other.setup("fit")
    assert not np.array_equal(other.held_out_indices, held)
    # Validation and test are the two disjoint halves of the held-out scans (tests/tasks/test_test_splits.py).
    assert (len(dm.val_set), len(dm.test_set)) == (180, 180)
    assert sorted([*dm.val_indices, *dm.test_indices]) == held.tolist()


def test_a_data_poor_training_subset_is_balanced_seeded_and_leaves_val_and_test_alone():
    full = DigitsDataModule()
    full.setup("fit")
    few = DigitsDataModule(train_per_class=10)
    few.setup("fit")
    # Ten scans of each digit, all from the training split: none validates or tests.
    assert np.bincount(few.train_set.labels.numpy(), minlength=10).tolist() == [10] * 10
    assert set(few.train_indices) <= set(full.train_indices)
    assert not set(few.train_indices) & (set(few.val_indices) | set(few.test_indices))
    # Validation and test are the full recipe's scans: scores compare across the two.
    assert np.array_equal(few.val_indices, full.val_indices) and np.array_equal(few.test_indices, full.test_indices)
    # Seeded by split_seed: the same scans in every run, other scans with another split seed.
    again = DigitsDataModule(train_per_class=10)
    again.setup("fit")
    assert np.array_equal(again.train_indices, few.train_indices)
    other = DigitsDataModule(train_per_class=10, split_seed=1)
    other.setup("fit")
    assert not np.array_equal(other.train_indices, few.train_indices)
    # A class must have that many training scans; 0 is no training set.
    with pytest.raises(ValueError, match="train_per_class=500"):
        DigitsDataModule(train_per_class=500).setup("fit")
    with pytest.raises(ValueError, match=r"train_per_class must be an integer ≥ 1 .*, got 0$"):
        DigitsDataModule(train_per_class=0)
    with pytest.raises(ValueError, match="no full batch"):  # 50 scans, batches of 64: nothing to train on
        DigitsDataModule(train_per_class=5, batch_size=64).setup("fit")


def test_digits_are_one_channel_images_normalised_to_minus_one_one():
    dm = DigitsDataModule(batch_size=16)
    assert dm.num_classes == 10 and dm.class_names == [str(d) for d in range(10)]
    batch = next(iter(dm.train_dataloader()))
    pixels, labels = batch["pixel_values"], batch["labels"]
    assert pixels.shape == (16, 1, 32, 32) and pixels.dtype == torch.float32
    assert labels.shape == (16,) and labels.dtype == torch.long and 0 <= labels.min() <= labels.max() <= 9
    assert pixels.min() >= -1.0 and pixels.max() <= 1.0
    assert pixels.min() == -1.0 and pixels.max() > 0.9  # white background (0) and dark ink (16) scans
    # Raw [0, 1] images: at image_size 8 they are the scans themselves, divided by 16.
    from sklearn.datasets import load_digits

    raw, targets = DigitsDataModule(image_size=8).images()
    assert raw.shape == (1797, 1, 8, 8)
    assert torch.allclose(raw[:, 0], torch.from_numpy(load_digits().images).float() / 16)
    assert torch.equal(targets, torch.from_numpy(load_digits().target))


def test_digits_mean_and_std_come_from_the_arguments():
    dm = DigitsDataModule(mean=0.0, std=1.0, batch_size=8)
    pixels = next(iter(dm.val_dataloader()))["pixel_values"]
    assert pixels.min() >= 0.0 and pixels.max() <= 1.0
    assert dm.mean == (0.0,) and dm.std == (1.0,)


def test_augmentation_changes_training_images_only():
    plain, augmented = DigitsDataModule(), DigitsDataModule(augment=True, degrees=15, translate=0.15)
    plain.setup("fit")
    augmented.setup("fit")
    torch.manual_seed(0)
    changed = [not torch.equal(augmented.train_set[i]["pixel_values"], plain.train_set[i]["pixel_values"])
               for i in range(20)]
    assert sum(changed) >= 15
    assert augmented.train_set[0]["labels"] == plain.train_set[0]["labels"]
    for i in range(20):  # held-out images never change
        assert torch.equal(augmented.val_set[i]["pixel_values"], plain.val_set[i]["pixel_values"])
    assert plain.augment is False  # off unless asked for


def test_bad_digits_arguments_are_errors():
    with pytest.raises(ValueError, match=r"test_fraction must be in \(0, 1\), got 1\.0$"):
        DigitsDataModule(test_fraction=1.0)
    with pytest.raises(ValueError, match=r"image_size must be ≥ 8 .*, got 4$"):
        DigitsDataModule(image_size=4)
    with pytest.raises(ValueError, match=r"std must be positive, got \(0\.0,\)$"):
        DigitsDataModule(std=0.0)


# ------------------------------------------------------------------ image folders

CLASSES = ("cat", "dog", "fox")


def write_images(folder, per_class: int, sizes=((20, 24), (17, 17), (40, 30))) -> None:
    """``per_class`` small RGB images per class (mixed sizes and formats), a colour per class."""
    rng = np.random.default_rng(0)
    for c, name in enumerate(CLASSES):
        (folder / name).mkdir(parents=True)
        for i in range(per_class):
            h, w = sizes[i % len(sizes)]
            pixels = rng.integers(0, 60, size=(h, w, 3), dtype=np.uint8)
            pixels[..., c] += 180
            suffix = ".png" if i % 2 == 0 else ".jpg"
            Image.fromarray(pixels).save(folder / name / f"{i}{suffix}")


def test_train_and_val_folders_become_batches(tmp_path):
    write_images(tmp_path / "train", per_class=4)
    write_images(tmp_path / "val", per_class=2)
    dm = ImageFolderDataModule(root=str(tmp_path), image_size=16, batch_size=5)
    assert dm.num_classes == 3 and dm.class_names == list(CLASSES)
    assert (len(dm.train_files), len(dm.val_files)) == (12, 6)
    batch = next(iter(dm.val_dataloader()))
    assert batch["pixel_values"].shape == (5, 3, 16, 16) and batch["pixel_values"].dtype == torch.float32
    assert batch["pixel_values"].min() >= -1.0 and batch["pixel_values"].max() <= 1.0
    assert batch["labels"].tolist() == [0, 0, 1, 1, 2]
    # Each class's dominant colour channel survives loading, resizing and normalisation.
    means = batch["pixel_values"].mean(dim=(2, 3))  # (B, C)
    assert means.argmax(dim=1).tolist() == batch["labels"].tolist()
    train = next(iter(dm.train_dataloader()))  # shuffled, whole batches only
    assert train["pixel_values"].shape == (5, 3, 16, 16)


def test_a_test_folder_is_the_test_split(tmp_path):
    write_images(tmp_path / "train", per_class=4)
    write_images(tmp_path / "test", per_class=1)
    dm = ImageFolderDataModule(root=str(tmp_path), image_size=16, batch_size=8, val_fraction=0.25)
    assert (len(dm.train_files), len(dm.val_files), len(dm.test_files)) == (9, 3, 3)
    assert not set(dm.test_files) & set(dm.train_files + dm.val_files)  # disjoint by file
    batch = next(iter(dm.test_dataloader()))
    assert batch["labels"].tolist() == [0, 1, 2]  # one image of each class from root/test
    assert dm.dataset("test").item_id(0) == str(tmp_path / "test" / "cat" / "0.png")


def test_grey_images_and_a_held_out_fraction_of_one_folder(tmp_path):
    write_images(tmp_path, per_class=5)
    dm = ImageFolderDataModule(root=str(tmp_path), image_size=(8, 12), channels=1, val_fraction=0.4,
                               batch_size=64, augment=True)
    assert (len(dm.train_files), len(dm.val_files)) == (9, 6)  # stratified: 2 of 5 per class held out
    assert not set(dm.train_files) & set(dm.val_files)
    assert sorted(dm.val_labels) == [0, 0, 1, 1, 2, 2]
    batch = next(iter(dm.val_dataloader()))
    assert batch["pixel_values"].shape == (6, 1, 8, 12)
    assert ImageFolderDataModule(root=str(tmp_path), val_fraction=0.4).val_files == dm.val_files  # seeded


def test_missing_root_empty_class_and_unreadable_images_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="needs root"):
        ImageFolderDataModule()
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ImageFolderDataModule(root=str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="no class folders"):
        ImageFolderDataModule(root=str(tmp_path))

    write_images(tmp_path / "data", per_class=2)
    (tmp_path / "data" / "empty").mkdir()
    with pytest.raises(ValueError, match=r"class folder .*empty has no images"):
        ImageFolderDataModule(root=str(tmp_path / "data"), val_fraction=0.5)

    (tmp_path / "data" / "empty").rmdir()
    (tmp_path / "data" / "cat" / "broken.png").write_bytes(b"not a png")
    dm = ImageFolderDataModule(root=str(tmp_path / "data"), val_fraction=0.5)
    dm.setup("fit")
    files = [(dm.train_set, i, f) for i, f in enumerate(dm.train_files)] + \
            [(dm.val_set, i, f) for i, f in enumerate(dm.val_files)]
    dataset, index = next((d, i) for d, i, f in files if f.name == "broken.png")
    with pytest.raises(ValueError, match="cannot read image .*broken.png"):
        dataset[index]


def test_validation_classes_must_be_training_classes(tmp_path):
    write_images(tmp_path / "train", per_class=2)
    write_images(tmp_path / "val", per_class=1)
    (tmp_path / "val" / "owl").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "val" / "owl" / "0.png")
    with pytest.raises(ValueError, match="owl"):
        ImageFolderDataModule(root=str(tmp_path))


@pytest.mark.parametrize("channels", [1, 3])
def test_a_16_bit_image_is_read_as_the_models_processor_reads_it(tmp_path, channels):
    # PIL's conversion to "L" / "RGB" clips 16-bit values to 8 bits: 50 % grey read as white
    from tokenizers_mm import ImagePreprocessConfig, PatchTokenizer

    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        for i in range(3):
            Image.fromarray(np.full((16, 16), 32768, np.uint16)).save(tmp_path / name / f"{i}.png")
    dm = ImageFolderDataModule(root=str(tmp_path), image_size=16, channels=channels, mean=0.0, std=1.0, batch_size=1)
    dm.setup()
    pixels = dm.train_set[0]["pixel_values"]
    read = PatchTokenizer(ImagePreprocessConfig(patch_size=8, channels=channels, mean=(0.0,) * channels,
                                                std=(1.0,) * channels)).preprocess(str(tmp_path / "a" / "0.png"))[0]
    torch.testing.assert_close(pixels, torch.full((channels, 16, 16), 32768 / 65535))
    torch.testing.assert_close(pixels, read)


def test_a_model_trained_on_resized_folders_exports_the_same_resize_without_a_crop(tmp_path):
    # the data squashes every image to image_size; a preset's crop_pct (0.875) would make
    # predict(resize=True) and the pipelines crop what training never cropped
    from tasks.image_classification import ImageClassificationTask

    rng = np.random.default_rng(0)
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        for i in range(3):
            Image.fromarray(rng.integers(0, 256, (60, 100, 3), dtype=np.uint8)).save(tmp_path / name / f"{i}.png")
    dm = ImageFolderDataModule(root=str(tmp_path), image_size=32, channels=3, batch_size=1)
    dm.setup()
    task = ImageClassificationTask(family="vit", preset="vit-tiny-patch16-224", image_size=32, channels=3,
                                   num_classes=2, d_model=32, n_layers=1, n_heads=2)
    assert task.model.config.crop_pct == 0.875
    task._check_data(dm)
    assert task.model.config.crop_pct is None
    served = task.model.image_tokenizer(resize=True).preprocess(str(dm.val_files[0]))
    torch.testing.assert_close(served, dm.val_set[0]["pixel_values"][None], atol=0.02, rtol=0)  # bilinear both ways

