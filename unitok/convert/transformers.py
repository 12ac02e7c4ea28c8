"""Hugging Face transformers -> unitok: a registry of converters keyed by model class name.

The converters read the reference model's config and state dict only; transformers itself is
not imported here, so unitok does not depend on it at run time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

_CONVERTERS: dict[str, Callable[[Any], nn.Module]] = {}


def register_transformers_converter(*class_names: str) -> Callable:
    """Decorator: ``fn(hf_model) -> unitok model`` handles the named transformers classes."""

    def wrap(fn: Callable[[Any], nn.Module]) -> Callable[[Any], nn.Module]:
        for name in class_names:
            _CONVERTERS[name] = fn
        return fn

    return wrap


def from_transformers(hf_model: nn.Module) -> nn.Module:
    """Convert a Hugging Face model to the unitok family that implements it."""
    _load_converters()
    name = type(hf_model).__name__
    if name not in _CONVERTERS:
        raise ValueError(
            f"no converter for transformers class {name}; supported: {', '.join(sorted(_CONVERTERS))}"
        )
    return _CONVERTERS[name](hf_model)


def _load_converters() -> None:
    # Importing the family modules registers their converters.
    from unitok.convert import bert, decision_transformer, gpt2, t5  # noqa: F401
