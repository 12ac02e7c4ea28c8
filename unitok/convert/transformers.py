"""Hugging Face transformers <-> unitok: registries of converters keyed by model class.

`from_transformers` looks the Hugging Face class name up; `to_transformers` the unitok class
(its nearest registered base). Importing reads the reference model's config and state dict
only; exporting imports transformers inside the family's function, so unitok does not depend
on it at run time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

_CONVERTERS: dict[str, Callable[[Any], nn.Module]] = {}
_EXPORTERS: dict[type, Callable[[Any], nn.Module]] = {}


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
    return _CONVERTERS[name](hf_model).eval()  # the reference's dropout rates, ready to predict


def register_transformers_exporter(*classes: type) -> Callable:
    """Decorator: ``fn(unitok model) -> Hugging Face model`` handles the named unitok classes."""

    def wrap(fn: Callable[[Any], nn.Module]) -> Callable[[Any], nn.Module]:
        for cls in classes:
            _EXPORTERS[cls] = fn
        return fn

    return wrap


def to_transformers(model: nn.Module, **options: Any) -> nn.Module:
    """Convert a unitok model to its Hugging Face class (eval mode, the same outputs):
    `GPT` -> ``GPT2LMHeadModel``, `BERT` -> the ``Bert*`` / ``Electra*`` class of its heads
    (``architecture=`` picks another), `T5` -> ``T5ForConditionalGeneration``, `T5Encoder` ->
    ``T5EncoderModel``, `DecisionTransformer` -> ``DecisionTransformerModel``. ``options`` go to
    the family's exporter."""
    _load_converters()
    for cls in type(model).__mro__:
        if cls in _EXPORTERS:
            return _EXPORTERS[cls](model, **options)
    supported = ", ".join(sorted(cls.__name__ for cls in _EXPORTERS))
    raise TypeError(f"to_transformers cannot convert a {type(model).__name__}; supported unitok classes: {supported}")


def _load_converters() -> None:
    # Importing the family modules registers their converters.
    from unitok.convert import bert, decision_transformer, gpt2, t5  # noqa: F401
