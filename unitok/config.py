"""Base for every frozen config: presets by name, strict dict/JSON round trips."""

from __future__ import annotations

import dataclasses
import difflib
import json
from pathlib import Path
from typing import Any, ClassVar, TypeVar

C = TypeVar("C", bound="Config")


class Config:
    """Mixin for frozen dataclass configs.

    Subclasses are ``@dataclass(frozen=True)`` and may define ``presets``: a mapping from a
    name to field overrides, so presets are data (``GPTConfig.from_name("gpt2-small")``).
    """

    presets: ClassVar[dict[str, dict[str, Any]]] = {}

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
        """Build from a plain dict; unknown keys are an error, not ignored."""
        cls._check_keys(data)
        fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        values = {}
        for key, value in data.items():
            # JSON has no tuples: restore tuple-typed fields so configs compare equal.
            if isinstance(value, list) and "tuple" in str(fields[key].type):
                value = tuple(value)
            values[key] = value
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    def replace(self: C, **changes: Any) -> C:
        self._check_keys(changes)
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    @classmethod
    def load(cls: type[C], path: str | Path) -> C:
        return cls.from_dict(json.loads(Path(path).read_text()))
