"""Base for every frozen config: presets by name, strict dict/JSON round trips."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import math
import numbers
import types
import typing
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar, Union

C = TypeVar("C", bound="Config")


class Config:
    """Mixin for frozen dataclass configs.

    Subclasses are ``@dataclass(frozen=True)`` and may define ``presets``: a mapping from a
    name to field overrides, so presets are data (``GPTConfig.from_name("gpt2-small")``).
    """

    presets: ClassVar[dict[str, dict[str, Any]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # A subclass's own __post_init__ (its range checks) runs after the field types are checked,
        # so `GPTConfig(vocab_size=2.5)` is refused by name however the config is built.
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("__post_init__")
        if own is not None and not getattr(own, "checks_types", False):
            @functools.wraps(own)
            def __post_init__(self: Config) -> None:  # noqa: N807
                self.check_types()
                own(self)

            __post_init__.checks_types = True  # type: ignore[attr-defined]
            cls.__post_init__ = __post_init__  # type: ignore[attr-defined]

    def __post_init__(self) -> None:
        self.check_types()

    def check_types(self) -> None:
        """Refuse a field whose value does not fit its annotation (a float count, a bool size, a
        string number, a NaN or infinite float), naming the field; nested configs check themselves.
        A list given for a tuple field is stored as a tuple, so the config equals itself read back
        from JSON and can be hashed however it was built."""
        hints = _type_hints(type(self))
        for field in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, field.name)
            if not matches_type(value, hints[field.name]):
                raise _type_error(type(self), field.name, value, hints[field.name])
            if isinstance(value, list) and _is_tuple(hints[field.name]):
                object.__setattr__(self, field.name, tuple(value))

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]

    @classmethod
    def _check_keys(cls, keys: Any) -> None:
        known = cls.field_names()
        unknown = [k for k in keys if k not in known]
        if unknown:
            hints = []
            for key in unknown:
                close = difflib.get_close_matches(key, known, n=1)
                hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
            raise ValueError(
                f"unknown {cls.__name__} key(s): {', '.join(hints)}; known keys: {', '.join(known)}"
            )

    @classmethod
    def from_name(cls: type[C], name: str, **overrides: Any) -> C:
        """Build a named preset, optionally overriding some of its fields."""
        if name not in cls.presets:
            close = difflib.get_close_matches(name, list(cls.presets), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(
                f"unknown {cls.__name__} preset {name!r}{hint}; available: {', '.join(sorted(cls.presets))}"
            )
        return cls.from_dict({**cls.presets[name], **overrides})

    @classmethod
    def from_dict(cls: type[C], data: dict[str, Any]) -> C:
        """Build from a plain dict; unknown keys and values of the wrong type are errors."""
        cls._check_keys(data)
        hints = _type_hints(cls)
        for key, value in data.items():  # JSON's lists for tuple fields: stored as tuples by `check_types`
            if not matches_type(value, hints[key]):
                raise _type_error(cls, key, value, hints[key])
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    def replace(self: C, **changes: Any) -> C:
        self._check_keys(changes)
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    @classmethod
    def load(cls: type[C], path: str | Path) -> C:
        """Read a file written by ``save``, or a model folder's ``config.json`` (whose ``family`` key
        must name a model of this config class)."""
        data = json.loads(Path(path).read_text())
        if isinstance(data, dict) and "family" in data and "family" not in cls.field_names():
            data = dict(data)
            family = data.pop("family")
            # the model registry imports this module, so it is read when called
            from unitok.models.base import FAMILIES

            model = FAMILIES.get(family) if isinstance(family, str) else None
            if getattr(model, "config_class", None) is not cls:
                reads = f"a {model.config_class.__name__}" if model is not None else "no config of this class"
                raise ValueError(f"{path} is the config of a {family!r} model (it reads {reads}), not a "
                                 f"{cls.__name__}; unitok.load(folder) opens any family")
        return cls.from_dict(data)


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _type_error(cls: type, key: str, value: Any, hint: Any) -> Exception:
    """A value outside a Literal's choices or a NaN / infinite float is a bad value (ValueError),
    anything else a bad type."""
    if _is_choice(hint) and isinstance(value, str):
        return ValueError(f"unknown {key} {value!r} for {cls.__name__}: expected {type_name(hint)}")
    if _non_finite(value):
        return ValueError(f"{cls.__name__}.{key} must be {type_name(hint)} with no NaN or infinite value, "
                          f"got {value!r}")
    return TypeError(f"{cls.__name__}.{key} must be {type_name(hint)}, got {value!r} ({type(value).__name__})")


def matches_type(value: Any, hint: Any) -> bool:
    """Whether a config value (as JSON or YAML gives it) fits a field's annotation.

    Checks what a config file can get wrong — numbers, strings, booleans, literals, optional
    values and the items of tuples; nested configs and ``Any`` are left to their own checks.
    """
    if hint is Any or isinstance(hint, TypeVar):
        return True
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        return any(matches_type(value, a) for a in args)
    if origin is Literal:
        return value in args
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if hint is float:  # finite: a NaN or infinite epsilon, scale or statistic would turn outputs to NaN
        return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if hint is str:
        return isinstance(value, str)
    if origin is tuple:
        if isinstance(value, numbers.Integral) and not isinstance(value, bool) and args and all(a is int for a in args):
            return True  # a square size given as one number: the config broadcasts it ((32, 32))
        if not isinstance(value, (tuple, list)):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(matches_type(v, args[0]) for v in value)
        return len(args) == len(value) and all(matches_type(v, a) for v, a in zip(args, value, strict=True))
    if origin is dict or hint is dict:
        return isinstance(value, dict)
    return True  # nested configs, tensors, callables: their own __post_init__ checks them


def _non_finite(value: Any) -> bool:
    """Whether ``value`` is, or (a tuple / list) holds, a NaN or infinite float."""
    if isinstance(value, (tuple, list)):
        return any(_non_finite(v) for v in value)
    return isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral) and not math.isfinite(value)


def _is_tuple(hint: Any) -> bool:
    """A tuple annotation, optionally with None (``tuple[float, ...] | None``)."""
    args = typing.get_args(hint) if typing.get_origin(hint) in (Union, types.UnionType) else (hint,)
    return any(typing.get_origin(a) is tuple or a is tuple for a in args)


def _is_choice(hint: Any) -> bool:
    """A Literal annotation (optionally with None): its values are choices, not a type."""
    args = typing.get_args(hint) if typing.get_origin(hint) in (Union, types.UnionType) else (hint,)
    return any(typing.get_origin(a) is Literal for a in args)


def type_name(hint: Any) -> str:
    """A field's annotation as a reader writes it (``int``, ``float | None``, ``'gelu' | 'relu'``)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is Literal:
        return " | ".join(repr(a) for a in args)
    if hint is type(None):
        return "None"
    if origin is not None:
        return str(hint).replace("typing.", "")
    return getattr(hint, "__name__", str(hint))
