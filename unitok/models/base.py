"""What every model family shares: a config, and safetensors + config.json checkpoints."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from tokenizers_mm.processor import PROCESSOR_FILE, Processor
from unitok.config import Config

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"

M = TypeVar("M", bound="PretrainedModel")


def read_config(directory: Path) -> tuple[str, dict[str, Any]]:
    """A saved folder's ``config.json`` -> (family name, config fields); clear errors for a
    folder that is not a model's."""
    if not directory.is_dir():
        raise FileNotFoundError(f"no model folder at {directory} (expected {CONFIG_FILE} and {WEIGHTS_FILE} "
                                "written by save_pretrained)")
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not (directory / name).is_file():
            raise FileNotFoundError(f"{directory} has no {name}; expected a folder written by save_pretrained")
    path = directory / CONFIG_FILE
    try:
        payload = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from None
    if not isinstance(payload, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(payload).__name__}")
    family = payload.pop("family", None)
    if not isinstance(family, str):
        raise ValueError(f"{path} names no model family (a \"family\" key such as \"GPT\"); "
                         "was it written by unitok's save_pretrained?")
    return family, payload


def read_weights(path: Path, map_location: str | torch.device = "cpu") -> dict[str, Tensor]:
    """A safetensors file -> its tensors; a truncated or corrupt file, or NaN/inf weights, is an
    error naming the file (and the tensors)."""
    try:  # the device first: its errors are not the file's
        device = torch.device(map_location)
        torch.empty(0, device=device)
    except (RuntimeError, TypeError, AssertionError) as error:  # an unknown name; CUDA absent (AssertionError)
        raise ValueError(f"map_location={map_location!r} is not a device this machine can load onto: {error}") from None
    try:
        state = load_file(str(path), device=str(device))
    except Exception as error:  # safetensors raises its own SafetensorError (and OSError)
        raise ValueError(f"cannot read {path}: {error} (a truncated or corrupt safetensors file?)") from None
    bad = sorted(k for k, v in state.items() if v.is_floating_point() and not bool(torch.isfinite(v).all()))
    if bad:
        raise ValueError(f"{path} holds NaN or inf values in {', '.join(bad)}; refusing to load them")
    return state


# Processor parts a model's config can store as well (and so could contradict), compared when a
# processor is set and taken from the config when it is read.
CONFIG_PARTS = ("image", "audio", "characters", "trajectory")


class CheckpointMismatchError(ValueError):
    """A state dict does not fit the model: lists missing, unexpected and mis-shaped keys."""

    def __init__(self, missing: list[str], unexpected: list[str], mismatched: list[str],
                 mistyped: list[str] | None = None) -> None:
        self.missing, self.unexpected, self.mismatched = missing, unexpected, mismatched
        self.mistyped = mistyped or []
        parts = []
        if missing:
            parts.append(f"missing keys: {', '.join(missing)}")
        if unexpected:
            parts.append(f"unexpected keys: {', '.join(unexpected)}")
        if mismatched:
            parts.append(f"mis-shaped keys: {', '.join(mismatched)}")
        if self.mistyped:
            parts.append(f"keys of another kind of dtype: {', '.join(self.mistyped)}")
        super().__init__("checkpoint does not match the model — " + "; ".join(parts))


def load_state_dict_strict(module: nn.Module, state: dict[str, Tensor], ignore: tuple[str, ...] = ()) -> None:
    """Copy ``state`` into ``module``, raising `CheckpointMismatchError` on any disagreement.

    ``ignore`` names keys that need not be present (weights tied to another key).
    """
    own = module.state_dict()
    missing = sorted(k for k in own if k not in state and k not in ignore)
    unexpected = sorted(k for k in state if k not in own)
    mismatched = sorted(
        f"{k} (checkpoint {tuple(state[k].shape)}, model {tuple(own[k].shape)})"
        for k in state
        if k in own and state[k].shape != own[k].shape
    )
    # float32 into bfloat16 is a cast; integers into a float weight (or floats into an integer
    # buffer) are another file's tensors, which load_state_dict would copy without a word
    mistyped = sorted(f"{k} (checkpoint {state[k].dtype}, model {own[k].dtype})" for k in state
                      if k in own and _dtype_kind(state[k]) != _dtype_kind(own[k]))
    if missing or unexpected or mismatched or mistyped:
        raise CheckpointMismatchError(missing, unexpected, mismatched, mistyped)
    module.load_state_dict(state, strict=False)


def _dtype_kind(tensor: Tensor) -> str:
    if tensor.dtype == torch.bool:
        return "bool"
    return "complex" if tensor.is_complex() else "float" if tensor.is_floating_point() else "integer"


FAMILIES: dict[str, type[PretrainedModel]] = {}  # family name (config.json's "family") -> class


class PretrainedModel(nn.Module):
    """Base for the families: ``save_pretrained`` / ``from_pretrained`` with safetensors weights.

    Subclasses set ``config_class`` and take their config as the only constructor argument;
    ``tied_keys`` lists parameters that share storage with another key and are not saved.
    Every concrete subclass (one with a ``config_class``) is registered by name, so `unitok.load`
    opens any family's folder. A model carries a `Processor` (``model.processor``): what turns raw
    input into its `Tokens`.
    """

    config_class: ClassVar[type[Config]]
    config: Any
    _processor: Processor | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # an abstract base (ImageModel) has no config to build it from: no folder can name it
        if getattr(cls, "config_class", None) is not None:
            FAMILIES[cls.__name__] = cls

    @property
    def tied_keys(self) -> tuple[str, ...]:
        """Parameters that share storage with another key (tied embeddings); not saved."""
        return ()

    # ------------------------------------------------------------------ raw input
    @property
    def processor(self) -> Processor | None:
        """Raw input -> `Tokens` for this model: the processor saved or set on it, completed by
        what its config knows (image normalisation, spectrogram settings, statistics…)."""
        default = self.default_processor()
        if default is None or self._processor is None:
            return default if self._processor is None else self._processor
        # the parts the config stores come from it (`CONFIG_PARTS`): a task that adapts the config to
        # its data (statistics, normalisation) after a folder's processor was loaded is read the new
        # way everywhere; the others (a tokenizer and its settings, class names) from the processor,
        # and so do the image part's call-time options (resize, pad) that the config does not hold
        merged = self._processor.merge(default)
        parts = {name: getattr(default, name) for name in CONFIG_PARTS if getattr(default, name) is not None}
        if "image" in parts and self._processor.image is not None:
            parts["image"] = dataclasses.replace(self._processor.image, **_image_settings(default.image))
        return dataclasses.replace(merged, **parts)

    @processor.setter
    def processor(self, value: Processor | None) -> None:
        if value is not None and not isinstance(value, Processor):
            raise TypeError(f"processor must be a tokenizers_mm.Processor (or None), got {type(value).__name__}")
        if value is not None:
            self.check_processor(value)
        self._processor = value

    def default_processor(self) -> Processor | None:
        """The processor this family's config alone defines (None: it needs one saved with it)."""
        return None

    def class_count(self) -> int | None:
        """How many classes the model's classifier tells apart (None: it has none)."""
        return None

    def check_processor(self, processor: Processor) -> None:
        """Refuse a processor that contradicts the model: a part the config defines too, set
        otherwise (images normalised with statistics the model was not trained on would be read
        wrongly by one path and rightly by another), or class names that are not one a class."""
        default = self.default_processor()
        for name in CONFIG_PARTS:
            given, stored = getattr(processor, name), getattr(default, name, None)
            if given is None or stored is None:
                continue
            differ = _image_differences(given, stored) if name == "image" else ([] if given == stored else [name])
            if differ:
                raise ValueError(f"the processor's {name} part differs from the one this {type(self).__name__}'s config "
                                 f"stores ({', '.join(differ)}): the config is what the model was trained to read; "
                                 f"leave the part out (the config's is used) or change the config")
        count = self.class_count()
        if count is not None and processor.labels is not None and len(processor.labels) != count:
            raise ValueError(f"{len(processor.labels)} class names for a model of {count} classes: give one name a "
                             f"class, in class-id order")

    def _drop_stale_class_names(self) -> None:
        """After the classifier was replaced: class names that no longer number one a class (the
        old task's) are dropped, so that the model can be saved and loaded again."""
        processor, count = self._processor, self.class_count()
        if processor is not None and processor.labels is not None and len(processor.labels) != count:
            self._processor = dataclasses.replace(processor, labels=None)

    # ------------------------------------------------------------------ files
    def save_pretrained(self, directory: str | Path) -> Path:
        """Write ``model.safetensors``, ``config.json`` (with the family name) and the processor
        (tokenizer files, ``processor_config.json``) to ``directory``: all a loader needs. A
        processor that contradicts the model is refused before anything is written: the folder
        could not be loaded."""
        processor = self.processor
        if processor is not None:
            self.check_processor(processor)
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items() if k not in self.tied_keys}
        save_file(state, str(directory / WEIGHTS_FILE), metadata={"format": "pt", "family": type(self).__name__})
        payload = {"family": type(self).__name__, **self.config.to_dict()}
        (directory / CONFIG_FILE).write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
        if processor is not None:
            processor.save(directory)
        else:  # an earlier save's processor would otherwise be loaded with these weights
            (directory / PROCESSOR_FILE).unlink(missing_ok=True)
        return directory

    @classmethod
    def from_pretrained(cls: type[M], directory: str | Path, map_location: str | torch.device = "cpu") -> M:
        """Build the model from ``config.json``, load ``model.safetensors`` strictly and the
        processor; the model comes back in eval mode (call ``.train()`` to fine-tune)."""
        directory = Path(directory)
        family, payload = read_config(directory)
        if family != cls.__name__:
            raise ValueError(f"{directory} holds a {family} checkpoint, not a {cls.__name__}; "
                             "unitok.load(path) opens any family")
        try:
            config = cls.config_class.from_dict(payload)
        except (TypeError, ValueError) as error:
            raise type(error)(f"{directory / CONFIG_FILE}: {error}") from None
        model = cls(config)  # type: ignore[call-arg]
        state = read_weights(directory / WEIGHTS_FILE, map_location)
        load_state_dict_strict(model, state, ignore=model.tied_keys)
        model.processor = _with_config_crop(Processor.load(directory), model.default_processor())
        return model.to(map_location).eval()

    def rebuilt(self: M, config: Config) -> M:
        """A new model of this class built from ``config`` (this one's with training choices
        changed, e.g. dropout), holding this model's weights and processor, in this model's mode."""
        model = type(self)(config)  # type: ignore[call-arg]
        model.load_state_dict(self.state_dict())
        model.processor = self.processor
        return model.train(self.training)

    def num_parameters(self, trainable_only: bool = False) -> int:
        seen, total = set(), 0
        for p in self.parameters():
            if id(p) not in seen and (p.requires_grad or not trainable_only):
                seen.add(id(p))
                total += p.numel()
        return total


def _image_settings(stored: Any) -> dict[str, Any]:
    """The image settings a model's config fixes (all but the call-time ``resize`` and ``pad``, and
    ``image_size`` where the config has none), from its default image part ``stored``."""
    fields = ["patch_size", "channels", "mean", "std", "interpolation", "crop_pct"]
    fields += ["image_size"] if stored.image_size is not None else []
    return {f: getattr(stored, f) for f in fields}


def _image_differences(given: Any, stored: Any) -> list[str]:
    """Image settings that change what the model reads, as ``field=given (config: stored)``."""
    return [f"{f}={getattr(given, f)!r} (config: {value!r})" for f, value in _image_settings(stored).items()
            if getattr(given, f) != value]


def _with_config_crop(processor: Processor | None, default: Processor | None) -> Processor | None:
    """A loaded processor whose image part has no crop_pct where the config has one: folders saved
    before the image part carried it hold null there whatever the config said (it acted only with
    resize, which was never saved), so it is read as the config's rather than refused."""
    given, stored = getattr(processor, "image", None), getattr(default, "image", None)
    if given is None or stored is None or given.crop_pct is not None or stored.crop_pct is None:
        return processor
    return dataclasses.replace(processor, image=dataclasses.replace(given, crop_pct=stored.crop_pct))
