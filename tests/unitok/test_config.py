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


def test_a_list_for_a_tuple_field_is_stored_as_a_tuple_however_the_config_is_built(tmp_path):
    from unitok.models import BERTConfig, DecisionTransformerConfig

    bert = BERTConfig.from_name("bert-nano").replace(heads=["pooler", "mlm"])
    assert bert.heads == ("pooler", "mlm") and hash(bert) == hash(bert.replace(heads=("pooler", "mlm")))
    bert.save(tmp_path / "bert.json")
    assert BERTConfig.load(tmp_path / "bert.json") == bert  # JSON's lists read back as tuples too
    dt = DecisionTransformerConfig(state_dim=2, act_dim=1, state_mean=[0.0, 1.0], state_std=[1.0, 2.0])
    assert dt.state_mean == (0.0, 1.0) and dt.state_std == (1.0, 2.0)


@pytest.mark.parametrize(("build", "message"), [
    (lambda: GPTConfig(norm_eps=float("nan")), r"GPTConfig\.norm_eps must be float with no NaN or infinite value, got nan"),
    (lambda: GPTConfig.from_name("gpt-nano", dropout=float("inf")), r"GPTConfig\.dropout must be float .*got inf"),
    (lambda: ViTConfig.from_name("vit-digits", mean=(float("nan"),)), r"ViTConfig\.mean must be tuple\[float, \.\.\.\] "
                                                                      r"with no NaN or infinite value, got \(nan,\)"),
    (lambda: ViTConfig(crop_pct=float("nan")), r"ViTConfig\.crop_pct must be float \| None with no NaN"),
    (lambda: GPTConfig.from_dict({"norm_eps": float("-inf")}), r"GPTConfig\.norm_eps .*got -inf"),
])
def test_a_nan_or_infinite_float_is_refused_by_name(build, message):
    # a NaN epsilon or statistic would silently turn every output into NaN
    with pytest.raises(ValueError, match=message):
        build()
