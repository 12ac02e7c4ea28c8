"""What every model family shares: a config, and safetensors + config.json checkpoints."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from unitok.config import Config

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"

M = TypeVar("M", bound="PretrainedModel")


class CheckpointMismatchError(ValueError):
    """A state dict does not fit the model: lists missing, unexpected and mis-shaped keys."""

    def __init__(self, missing: list[str], unexpected: list[str], mismatched: list[str]) -> None:
        self.missing, self.unexpected, self.mismatched = missing, unexpected, mismatched
        parts = []
        if missing:
            parts.append(f"missing keys: {', '.join(missing)}")
        if unexpected:
            parts.append(f"unexpected keys: {', '.join(unexpected)}")
        if mismatched:
            parts.append(f"mis-shaped keys: {', '.join(mismatched)}")
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
    if missing or unexpected or mismatched:
        raise CheckpointMismatchError(missing, unexpected, mismatched)
    module.load_state_dict(state, strict=False)


class PretrainedModel(nn.Module):
    """Base for the families: ``save_pretrained`` / ``from_pretrained`` with safetensors weights.

    Subclasses set ``config_class`` and take their config as the only constructor argument;
    ``tied_keys`` lists parameters that share storage with another key and are not saved.
    """

    config_class: ClassVar[type[Config]]
    config: Any

    @property
    def tied_keys(self) -> tuple[str, ...]:
        """Parameters that share storage with another key (tied embeddings); not saved."""
        return ()

    def save_pretrained(self, directory: str | Path) -> Path:
        """Write ``model.safetensors`` and ``config.json`` (with the family name) to ``directory``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items() if k not in self.tied_keys}
        save_file(state, str(directory / WEIGHTS_FILE), metadata={"format": "pt", "family": type(self).__name__})
        payload = {"family": type(self).__name__, **self.config.to_dict()}
        (directory / CONFIG_FILE).write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
        return directory

    @classmethod
    def from_pretrained(cls: type[M], directory: str | Path, map_location: str | torch.device = "cpu") -> M:
        """Build the model from ``config.json`` and load ``model.safetensors`` strictly."""
        directory = Path(directory)
        for name in (CONFIG_FILE, WEIGHTS_FILE):
            if not (directory / name).is_file():
                raise FileNotFoundError(f"{directory} has no {name}; expected a folder written by save_pretrained")
        payload = json.loads((directory / CONFIG_FILE).read_text())
        family = payload.pop("family", cls.__name__)
        if family != cls.__name__:
            raise ValueError(f"{directory} holds a {family} checkpoint, not a {cls.__name__}")
        model = cls(cls.config_class.from_dict(payload))  # type: ignore[call-arg]
        state = load_file(str(directory / WEIGHTS_FILE), device=str(map_location))
        load_state_dict_strict(model, state, ignore=model.tied_keys)
        return model.to(map_location)

    def num_parameters(self, trainable_only: bool = False) -> int:
        seen, total = set(), 0
        for p in self.parameters():
            if id(p) not in seen and (p.requires_grad or not trainable_only):
                seen.add(id(p))
                total += p.numel()
        return total
