"""Image classification data: the built-in digits, or users' image folders.

Both modules yield ``{"pixel_values": (B, C, H, W) float, "labels": (B,) long}`` batches,
normalised with ``mean`` / ``std``, and expose ``num_classes``, ``class_names``, ``channels``,
``image_size``, ``mean`` and ``std`` (the task checks them against its model).
Augmentation (torchvision ``transforms.v2``) applies to the training split only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import Tensor
from torch.utils.data import Dataset
from torchvision.transforms import InterpolationMode, v2

from tasks.data.base import SplitDataModule
from tokenizers_mm.checks import check_int
from tokenizers_mm.image import IMAGE_SUFFIXES, read_image

Interpolation = Literal["bilinear", "bicubic", "nearest"]


def augmentation(degrees: float, translate: float, hflip: bool = False) -> v2.Transform:
    """A small random affine (rotation up to ``degrees``, shift up to ``translate`` of the size),
    optionally a horizontal flip, on [0, 1] image tensors; the background fills with 0."""
    steps: list[v2.Transform] = [v2.RandomAffine(degrees=degrees, translate=(translate, translate),
                                                 interpolation=InterpolationMode.BILINEAR, fill=0)]
    if hflip:
        steps.append(v2.RandomHorizontalFlip())
    return v2.Compose(steps)


def _square(size: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(size, int):
        return (size, size)
    if len(size) != 2:
        raise ValueError(f"image_size must be an int or (height, width), got {size}")
    return (int(size[0]), int(size[1]))


def _stats(values: float | Sequence[float], channels: int, name: str) -> tuple[float, ...]:
    values = (float(values),) if isinstance(values, (int, float)) else tuple(float(v) for v in values)
    if len(values) == 1:
        values = values * channels
    if len(values) != channels:
        raise ValueError(f"{name} needs 1 or {channels} values (one per channel), got {values}")
    return values


def _split(labels: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Stratified, seeded (train indices, held-out indices), each sorted."""
    train, held = train_test_split(np.arange(len(labels)), test_size=fraction, stratify=labels,
                                   random_state=seed)
    return np.sort(train), np.sort(held)


def split_held_out(labels: np.ndarray, held: np.ndarray, val_share: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The held-out indices ``held`` cut into (validation, test), stratified by ``labels[held]``
    and seeded, ``val_share`` of them validating; each sorted. ``val_share`` 1: all validate
    (an empty test part)."""
    if val_share >= 1.0:
        return np.sort(held), held[:0]
    try:
        val, test = train_test_split(held, train_size=val_share, stratify=labels[held], random_state=seed)
    except ValueError as error:
        raise ValueError(f"cannot cut {len(held)} held-out items into stratified validation and test parts "
                         f"(val_share={val_share}): {error}; hold out more (or val_share=1.0: no test split)") from None
    return np.sort(val), np.sort(test)


def per_class(labels: np.ndarray, indices: np.ndarray, count: int, seed: int) -> np.ndarray:
    """``count`` of ``indices`` from each class of ``labels[indices]``, drawn at random (seeded),
    sorted. Raises ValueError if a class has fewer."""
    rng = np.random.default_rng(seed)
    chosen = []
    for label in np.unique(labels[indices]):
        of_class = indices[labels[indices] == label]
        if len(of_class) < count:
            raise ValueError(f"train_per_class={count} but class {label} has {len(of_class)} training scans")
        chosen.append(rng.choice(of_class, size=count, replace=False))
    return np.sort(np.concatenate(chosen))


class ImageTensors(Dataset):
    """In-memory [0, 1] images (N, C, H, W) and labels; ``transform`` runs per sample."""

    def __init__(self, images: Tensor, labels: Tensor, transform: Callable[[Tensor], Tensor]) -> None:
        self.images, self.labels, self.transform = images, labels, transform

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, Tensor]:
        return {"pixel_values": self.transform(self.images[index]), "labels": self.labels[index]}


class ImageFiles(Dataset):
    """Image files read with PIL on access (in data-loader workers), then ``transform``ed."""

    def __init__(self, files: Sequence[Path], labels: Sequence[int], mode: str,
                 transform: Callable[[Tensor], Tensor]) -> None:
        self.files, self.labels = list(files), torch.as_tensor(list(labels), dtype=torch.long)
        self.mode, self.transform = mode, transform

    def __len__(self) -> int:
        return len(self.files)

    def item_id(self, index: int) -> str:
        """The file of item ``index`` (how `tasks.PredictionWriter` names it)."""
        return str(self.files[index])

    def __getitem__(self, index: int) -> dict[str, Tensor]:
        # as a model's processor reads the file: 16-bit scans keep their values (PIL's conversion
        # to "L" / "RGB" clips them to 8 bits: 50 % grey read as white)
        pixels = read_image(self.files[index], 1 if self.mode == "L" else 3)  # (C, H, W) uint8 or [0, 1] float
        return {"pixel_values": self.transform(pixels), "labels": self.labels[index]}


class ImageDataModule(SplitDataModule):
    """What the image data modules share (subclasses build ``train_set`` / ``val_set`` in ``setup``)
    and tell the task: classes, channels, size and normalisation."""

    num_classes: int
    class_names: list[str]
    channels: int
    image_size: tuple[int, int]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    crop_pct: float | None = None  # how images reach image_size: None, a plain resize (no crop)


class DigitsDataModule(ImageDataModule):
    """scikit-learn's handwritten digits (1,797 real 8×8 scans, 10 classes; ships with
    scikit-learn, no download), scaled from 0..16 to [0, 1], upsampled to ``image_size`` and
    normalised: one channel, values in [(0 - mean) / std, (1 - mean) / std] = [-1, 1] by default.

    The split is fixed: stratified by class and seeded by ``split_seed``, ``test_fraction`` of
    the scans held out (20 %: 1,437 train / 360 held out), and the held-out scans cut again,
    stratified and seeded, into validation (``val_share`` of them: 180) and test (the other
    180). The three splits share no scan: checkpoints are chosen on validation, and
    ``unitok test`` (and ``predict``) reads only the test scans. ``val_share=1.0`` keeps all
    held-out scans for validation; the test loader then serves them again (no third split).

    Args:
        image_size: side of the square images (8 keeps the scans' own resolution).
        interpolation: upsampling filter (bicubic overshoots and is clamped to [0, 1]).
        mean / std: normalisation of the [0, 1] pixels.
        test_fraction / split_seed: the held-out share of the scans (validation and test together).
        val_share: the share of the held-out scans that validate; the rest are the test set.
        batch_size / num_workers: data loading.
        augment: a small random affine (``degrees``, ``translate``) on training images only.
        train_per_class: train on only this many scans of each class (a data-poor regime, e.g.
            20: 200 scans), drawn from the training split, seeded by ``split_seed`` (the same
            scans in every run); validation and test stay as they are. None: all 1,437.
    """

    def __init__(
        self,
        image_size: int = 32,
        interpolation: Interpolation = "bilinear",
        mean: float | tuple[float, ...] = 0.5,
        std: float | tuple[float, ...] = 0.5,
        test_fraction: float = 0.2,
        split_seed: int = 0,
        batch_size: int = 64,
        num_workers: int = 0,
        augment: bool = False,
        degrees: float = 10.0,
        translate: float = 0.1,
        val_share: float = 0.5,
        train_per_class: int | None = None,
    ) -> None:
        super().__init__(batch_size, num_workers)
        if image_size < 8:
            raise ValueError(f"image_size must be ≥ 8 (the scans are 8×8), got {image_size}")
        if not 0.0 < test_fraction < 1.0:
            raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
        if not 0.0 < val_share <= 1.0:
            raise ValueError(f"val_share must be in (0, 1], got {val_share}")
        check_int("train_per_class", train_per_class, or_none=True, note="(None: every training scan)")
        self.train_per_class = train_per_class
        self.image_size = (image_size, image_size)
        self.interpolation = interpolation
        self.channels = 1
        self.mean, self.std = _stats(mean, 1, "mean"), _stats(std, 1, "std")
        if any(s <= 0 for s in self.std):
            raise ValueError(f"std must be positive, got {self.std}")
        self.test_fraction, self.split_seed, self.val_share = test_fraction, split_seed, val_share
        self.augment, self.degrees, self.translate = augment, degrees, translate
        self.num_classes = 10
        self.class_names = [str(d) for d in range(10)]
        self.train_indices: np.ndarray | None = None
        self.held_out_indices: np.ndarray | None = None  # validation and test scans together
        self.val_indices: np.ndarray | None = None
        self.test_indices: np.ndarray | None = None

    def images(self) -> tuple[Tensor, Tensor]:
        """All 1,797 scans as [0, 1] floats (N, 1, H, W) at ``image_size``, and their labels (N,)."""
        digits = load_digits()
        pixels = torch.from_numpy(digits.images).float().div(16.0)[:, None]  # (N, 1, 8, 8)
        if self.image_size != (8, 8):
            kwargs = {} if self.interpolation == "nearest" else {"align_corners": False}
            pixels = F.interpolate(pixels, size=self.image_size, mode=self.interpolation, **kwargs)
        return pixels.clamp(0.0, 1.0), torch.from_numpy(digits.target).long()

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        images, labels = self.images()
        self.split_indices(labels.numpy())
        n_train = len(self.train_indices)  # type: ignore[arg-type]
        if n_train < self.batch_size:
            raise ValueError(f"{n_train} training scans make no full batch of batch_size={self.batch_size} "
                             "(the last partial batch is dropped); lower it")
        normalize = v2.Normalize(self.mean, self.std)
        train_transform = v2.Compose([augmentation(self.degrees, self.translate), normalize]) if self.augment else normalize
        train, val = torch.from_numpy(self.train_indices), torch.from_numpy(self.val_indices)  # type: ignore[arg-type]
        self.train_set = ImageTensors(images[train], labels[train], train_transform)
        self.val_set = ImageTensors(images[val], labels[val], normalize)
        if len(self.test_indices):  # type: ignore[arg-type]
            test = torch.from_numpy(self.test_indices)  # type: ignore[arg-type]
            self.test_set = ImageTensors(images[test], labels[test], normalize)

    def data_key(self) -> str:
        """A hash of the training scans as scikit-learn ships them (8×8, 0–16: exact on every
        machine, unlike their upsampled floats) and their labels: another scikit-learn's scans,
        or a split drawn otherwise, make another curve."""
        def scans() -> tuple[np.ndarray, np.ndarray]:
            digits = load_digits()
            return digits.images[self.train_indices], digits.target[self.train_indices]

        self.setup()
        return self._content_key_of(self.train_set, scans)

    def split_indices(self, labels: np.ndarray) -> None:
        """Set ``train_indices``, ``held_out_indices`` and its two parts ``val_indices`` /
        ``test_indices`` (sorted indices into the 1,797 scans) from the scans' ``labels``."""
        self.train_indices, self.held_out_indices = _split(labels, self.test_fraction, self.split_seed)
        self.val_indices, self.test_indices = split_held_out(labels, self.held_out_indices, self.val_share,
                                                             self.split_seed)
        if self.train_per_class is not None:
            self.train_indices = per_class(labels, self.train_indices, self.train_per_class, self.split_seed)


def _class_folders(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))


def _image_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())


def scan_image_folder(folder: Path, class_names: list[str] | None = None) -> tuple[list[str], list[Path], list[int]]:
    """``folder/<class>/**/*.png|jpg|…`` -> (class names, files, labels), in sorted order.

    With ``class_names`` given (the training classes), every class folder here must be one of them.
    Raises FileNotFoundError / ValueError for a missing folder, no class folders, an empty class.
    """
    if not folder.is_dir():
        raise FileNotFoundError(f"image folder {folder} does not exist")
    classes = _class_folders(folder)
    if not classes:
        raise ValueError(f"{folder} has no class folders; expected {folder}/<class name>/<image files>")
    names = [c.name for c in classes]
    if class_names is not None:
        unknown = sorted(set(names) - set(class_names))
        if unknown:
            raise ValueError(f"{folder} has classes {unknown} that the training folder does not have")
    index = {name: i for i, name in enumerate(class_names or names)}
    files, labels = [], []
    for folder_of_class in classes:
        found = _image_files(folder_of_class)
        if not found:
            raise ValueError(
                f"class folder {folder_of_class} has no images (looked for {', '.join(IMAGE_SUFFIXES)})"
            )
        files += found
        labels += [index[folder_of_class.name]] * len(found)
    return class_names or names, files, labels


class ImageFolderDataModule(ImageDataModule):
    """Users' images, one folder per class, read with PIL.

    Layouts: ``root/train/<class>/*.png|jpg`` with ``root/val/<class>/…`` (validation), or
    ``root/<class>/…`` alone (or ``root/train`` without ``val``), from which a stratified, seeded
    ``val_fraction`` is held out; ``root/test/<class>/…``, when there, is the test set (else
    ``unitok test`` scores the validation images). Images are converted to ``channels``
    (1: grey, 3: RGB), resized to ``image_size`` and normalised with ``mean`` / ``std``.

    Args:
        root: the image folder. image_size: (height, width) or one side.
        channels / mean / std / interpolation: how pixels are prepared.
        val_fraction / split_seed: the held-out split when there is no ``val`` folder.
        batch_size / num_workers: data loading.
        augment: random affine (``degrees``, ``translate``) and, with ``hflip``, horizontal
            flips, on training images only.
    """

    def __init__(
        self,
        root: str | None = None,
        image_size: int | tuple[int, int] = 32,
        channels: int = 3,
        mean: float | tuple[float, ...] = 0.5,
        std: float | tuple[float, ...] = 0.5,
        interpolation: Interpolation = "bilinear",
        val_fraction: float = 0.2,
        split_seed: int = 0,
        batch_size: int = 64,
        num_workers: int = 0,
        augment: bool = False,
        degrees: float = 10.0,
        translate: float = 0.1,
        hflip: bool = False,
    ) -> None:
        super().__init__(batch_size, num_workers)
        if root is None:
            raise ValueError("ImageFolderDataModule needs root: the folder of class folders (--data.root PATH)")
        if channels not in (1, 3):
            raise ValueError(f"channels must be 1 (grey) or 3 (RGB), got {channels}")
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
        self.root = Path(root)
        if not self.root.is_dir():
            raise FileNotFoundError(f"image root {self.root} does not exist")
        self.image_size, self.channels = _square(image_size), channels
        self.mean, self.std = _stats(mean, channels, "mean"), _stats(std, channels, "std")
        if any(s <= 0 for s in self.std):
            raise ValueError(f"std must be positive, got {self.std}")
        self.interpolation = interpolation
        self.augment, self.degrees, self.translate, self.hflip = augment, degrees, translate, hflip
        # Scan now, so a bad layout fails at construction and num_classes is known before fitting.
        train_dir = self.root / "train" if (self.root / "train").is_dir() else self.root
        self.class_names, self.train_files, self.train_labels = scan_image_folder(train_dir)
        if (self.root / "val").is_dir():
            _, self.val_files, self.val_labels = scan_image_folder(self.root / "val", self.class_names)
        else:
            if min(np.bincount(self.train_labels)) < 2:
                raise ValueError(f"every class in {train_dir} needs ≥ 2 images to hold some out (or add {self.root}/val)")
            files, labels = np.array(self.train_files, dtype=object), np.array(self.train_labels)
            train, held = _split(labels, val_fraction, split_seed)
            self.train_files, self.train_labels = list(files[train]), labels[train].tolist()
            self.val_files, self.val_labels = list(files[held]), labels[held].tolist()
        self.test_files: list[Path] = []
        self.test_labels: list[int] = []
        if train_dir != self.root and (self.root / "test").is_dir():
            _, self.test_files, self.test_labels = scan_image_folder(self.root / "test", self.class_names)
        self.num_classes = len(self.class_names)
        if self.num_classes < 2:
            raise ValueError(f"{train_dir} has one class ({self.class_names[0]}); classification needs ≥ 2")

    def _transform(self, train: bool) -> v2.Transform:
        # PIL's nearest pixels (torchvision's NEAREST on tensors is torch's own floor rule), as the
        # exported model's processor resizes (`tokenizers_mm.image.torch_interpolation`)
        mode = InterpolationMode.NEAREST_EXACT if self.interpolation == "nearest" else InterpolationMode(self.interpolation)
        steps: list[v2.Transform] = [v2.Resize(self.image_size, interpolation=mode, antialias=True),
                                     v2.ToDtype(torch.float32, scale=True)]
        if train and self.augment:
            steps.append(augmentation(self.degrees, self.translate, self.hflip))
        steps.append(v2.Normalize(self.mean, self.std))
        return v2.Compose(steps)

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        mode = "L" if self.channels == 1 else "RGB"
        self.train_set = ImageFiles(self.train_files, self.train_labels, mode, self._transform(train=True))
        self.val_set = ImageFiles(self.val_files, self.val_labels, mode, self._transform(train=False))
        if self.test_files:
            self.test_set = ImageFiles(self.test_files, self.test_labels, mode, self._transform(train=False))
