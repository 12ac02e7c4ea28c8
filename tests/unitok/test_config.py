"""Every config refuses a value of the wrong type by name, however it is built: from a dict or
JSON file (`from_dict`), a preset, or the constructor called directly — before its own range
checks can read the value (a float count, a bool size, a string number)."""

from __future__ import annotations

import dataclasses

import pytest

import unitok  # noqa: F401 (imports every family, so every config class is found)
from unitok.config import Config
from unitok.models.gpt import GPTConfig
from unitok.models.vit import ViTConfig


def _configs() -> list[type[Config]]:
    found, todo = set(), [Config]
    while todo:
        for sub in todo.pop().__subclasses__():
            found.add(sub)
            todo.append(sub)
    return sorted(found, key=lambda c: c.__name__)


def _first_int_field(cls: type[Config]) -> str | None:
    return next((f.name for f in dataclasses.fields(cls) if f.type in (int, "int")), None)


CONFIGS = [c for c in _configs() if _first_int_field(c) is not None]


def test_the_survey_covers_the_families():
    names = {c.__name__ for c in CONFIGS}
    assert {"GPTConfig", "BERTConfig", "T5Config", "ViTConfig", "MixerConfig", "ConformerConfig",
            "DecisionTransformerConfig", "CLIPTextConfig", "BackboneConfig", "GenerationConfig",
            "TextModality", "ImageModality", "AudioModality", "TrajectoryModality"} <= names


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("bad", [2.5, True, "8"], ids=["float", "bool", "str"])
def test_a_count_of_the_wrong_type_is_refused_by_the_constructor_with_the_field_named(cls, bad):
    name = _first_int_field(cls)
    with pytest.raises(TypeError, match=rf"{cls.__name__}\.{name} must be int, got {bad!r}"):
        cls(**{name: bad})


def test_a_value_outside_a_literal_is_named_with_the_choices():
    with pytest.raises(ValueError, match=r"unknown positions 'rope' for GPTConfig: expected 'learned' \| 'sinusoidal'"):
        GPTConfig(positions="rope")
    with pytest.raises(ValueError, match=r"unknown pool 'max' for ViTConfig: expected 'cls' \| 'avg'"):
        ViTConfig.from_name("vit-digits", pool="max")


def test_the_type_check_runs_before_the_configs_own_checks():
    # GPTConfig's own check compares context_length with 1: a string would raise a bare TypeError there
    with pytest.raises(TypeError, match=r"GPTConfig\.context_length must be int, got '64' \(str\)"):
        GPTConfig(context_length="64")
    with pytest.raises(ValueError, match="context_length must be ≥ 1, got 0"):  # its own range check still runs
        GPTConfig(context_length=0)


def test_values_a_config_file_may_spell_differently_are_still_accepted():
    assert ViTConfig(image_size=32, patch_size=8, num_classes=10).image_size == (32, 32)  # a square size as one number
    assert GPTConfig(dropout=0).dropout == 0  # an int where a float is expected
    assert ViTConfig(mean=[0.5, 0.5, 0.5]).mean == (0.5, 0.5, 0.5)  # a list for a tuple
