"""`unitok.load`: open any family's saved folder by the family its ``config.json`` names.

``unitok.load("runs/vit_digits/latest/pretrained")`` builds the right class (GPT, BERT, ViT, CLIP, …),
loads its safetensors weights strictly, restores its processor (``model.processor``) and
returns it in eval mode — Hugging Face's ``AutoModel.from_pretrained``, for unitok folders.
"""

from __future__ import annotations

import difflib
from pathlib import Path

import torch

import unitok.models  # noqa: F401  (registers every family)
from unitok.models.base import FAMILIES, PretrainedModel, read_config


def family_class(name: str) -> type[PretrainedModel]:
    """The model class a config.json's ``family`` names; a clear error for an unknown one."""
    if name not in FAMILIES:
        close = difflib.get_close_matches(name, list(FAMILIES), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown model family {name!r}{hint}; unitok knows {', '.join(sorted(FAMILIES))}")
    return FAMILIES[name]


def load(path: str | Path, map_location: str | torch.device = "cpu") -> PretrainedModel:
    """A folder written by ``save_pretrained`` (or a run's ``pretrained/`` export) -> the model,
    in eval mode, with its processor."""
    directory = Path(path)
    family, _ = read_config(directory)
    return family_class(family).from_pretrained(directory, map_location=map_location)


class AutoModel:
    """Hugging Face's spelling of `load`: ``AutoModel.from_pretrained(path)``."""

    def __init__(self) -> None:
        raise TypeError("AutoModel is not instantiated; use AutoModel.from_pretrained(path) or unitok.load(path)")

    @staticmethod
    def from_pretrained(path: str | Path, map_location: str | torch.device = "cpu") -> PretrainedModel:
        return load(path, map_location=map_location)
