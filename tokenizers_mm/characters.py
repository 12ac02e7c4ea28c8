"""Characters <-> ids for CTC speech recognition: id 0 is the CTC blank, characters from 1."""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Sequence

import torch
from torch import Tensor

BLANK_ID = 0


class CharacterVocabulary:
    """A character vocabulary with the CTC blank at id 0 and ``chars[i]`` at id ``i + 1``.

    ``len(vocabulary)`` is the CTC output size V = 1 + characters. Round-trips through JSON as
    the list of characters (``to_list`` / ``from_list``).
    """

    def __init__(self, chars: Sequence[str]) -> None:
        chars = tuple(chars)
        bad = [c for c in chars if not isinstance(c, str) or len(c) != 1]
        if bad:
            raise ValueError(f"vocabulary entries must be single characters, got {bad[:5]}")
        repeated = sorted({c for c in chars if chars.count(c) > 1})
        if repeated:
            raise ValueError(f"vocabulary has repeated characters {repeated}")
        if not chars:
            raise ValueError("a vocabulary needs at least one character")
        self.chars = chars
        self._ids = {c: i + 1 for i, c in enumerate(chars)}

    @classmethod
    def build(cls, transcripts: Iterable[str]) -> CharacterVocabulary:
        """Every character that occurs in ``transcripts``, in sorted (code point) order."""
        seen: set[str] = set()
        for text in transcripts:
            if not isinstance(text, str):
                raise TypeError(f"transcripts must be strings, got {type(text).__name__}")
            seen.update(text)
        if not seen:
            raise ValueError("cannot build a vocabulary: the transcripts have no characters")
        return cls(sorted(seen))

    @property
    def blank_id(self) -> int:
        return BLANK_ID

    def __len__(self) -> int:
        return 1 + len(self.chars)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CharacterVocabulary) and other.chars == self.chars

    def __hash__(self) -> int:
        return hash(self.chars)

    def __repr__(self) -> str:
        return f"CharacterVocabulary({''.join(self.chars)!r})"

    def unknown(self, text: str) -> list[str]:
        """The characters of ``text`` that are not in the vocabulary, sorted."""
        return sorted({c for c in text if c not in self._ids})

    def encode(self, text: str) -> Tensor:
        """Text -> (L,) long ids in 1..V-1; characters outside the vocabulary are an error."""
        missing = self.unknown(text)
        if missing:
            raise ValueError(f"transcript {text!r} has characters {missing} that are not in the vocabulary "
                             f"{''.join(self.chars)!r}")
        return torch.tensor([self._ids[c] for c in text], dtype=torch.long)

    def decode(self, ids: Sequence[int] | Tensor) -> str:
        """Ids -> text; blanks (0) are skipped (repeats are not collapsed: that is the CTC decoder's job)."""
        values = ids.tolist() if isinstance(ids, Tensor) else list(ids)
        out = []
        for i in values:
            if isinstance(i, bool) or not isinstance(i, numbers.Integral):
                raise TypeError(f"ids must be integers, got {i!r} ({type(i).__name__})")
            if i == BLANK_ID:
                continue
            if not 0 < i <= len(self.chars):
                raise ValueError(f"id {i} is outside the vocabulary (0..{len(self.chars)})")
            out.append(self.chars[i - 1])
        return "".join(out)

    def to_list(self) -> list[str]:
        """The characters in id order (ids 1..), for JSON."""
        return list(self.chars)

    @classmethod
    def from_list(cls, chars: Sequence[str]) -> CharacterVocabulary:
        return cls(chars)
