"""Character vocabulary for CTC: blank is id 0 and characters follow in sorted order; text
encodes and decodes exactly; characters outside the vocabulary are named in the error; the
vocabulary round-trips through JSON as its list of characters."""

from __future__ import annotations

import json
import pickle

import pytest
import torch

from tokenizers_mm import CharacterVocabulary


def test_build_collects_every_character_in_sorted_order_after_the_blank():
    vocab = CharacterVocabulary.build(["three one", "four"])
    assert vocab.chars == (" ", "e", "f", "h", "n", "o", "r", "t", "u")
    assert vocab.blank_id == 0 and len(vocab) == 10  # blank + 9 characters
    assert vocab.encode(" ").tolist() == [1]


def test_encode_then_decode_is_the_identity():
    vocab = CharacterVocabulary.build(["three one four", "nine"])
    ids = vocab.encode("one nine")
    assert ids.dtype == torch.long and ids.min() >= 1 and len(ids) == 8
    assert vocab.decode(ids) == "one nine"
    assert vocab.decode(ids.tolist()) == "one nine"


def test_decode_skips_blanks_but_keeps_repeats():
    vocab = CharacterVocabulary(["a", "b"])
    assert vocab.decode([0, 1, 1, 0, 2, 0]) == "aab"  # collapsing repeats is the CTC decoder's job
    with pytest.raises(ValueError, match=r"id 3 is outside the vocabulary \(0..2\)"):
        vocab.decode([1, 3])


def test_characters_outside_the_vocabulary_are_named():
    vocab = CharacterVocabulary.build(["one two"])
    with pytest.raises(ValueError, match=r"\['!', '9'\]"):
        vocab.encode("one 9 two!")
    assert vocab.unknown("Two") == ["T"]


def test_the_vocabulary_round_trips_through_json_and_pickle():
    vocab = CharacterVocabulary.build(["héllo wörld"])
    back = CharacterVocabulary.from_list(json.loads(json.dumps(vocab.to_list())))
    assert back == vocab and back.encode("wörld").tolist() == vocab.encode("wörld").tolist()
    assert pickle.loads(pickle.dumps(vocab)) == vocab


@pytest.mark.parametrize(("chars", "message"), [
    (["a", "b", "a"], "repeated characters"),
    (["ab"], "single characters"),
    ([], "at least one character"),
])
def test_bad_vocabularies_are_refused(chars, message):
    with pytest.raises(ValueError, match=message):
        CharacterVocabulary(chars)
    with pytest.raises(ValueError, match="no characters"):
        CharacterVocabulary.build(["", ""])


@pytest.mark.parametrize("ids", [[1.0], torch.tensor([1.0, 2.0]), [True]], ids=["floats", "float tensor", "bools"])
def test_decode_refuses_ids_that_are_not_integers(ids):
    with pytest.raises(TypeError, match="ids must be integers"):
        CharacterVocabulary(["a", "b"]).decode(ids)
