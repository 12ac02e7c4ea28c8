"""BPETokenizer: training, exact round trips, special tokens, batching, save/load, bad input."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenizers_mm import BPETokenizer, Tokens

CORPUS = [
    "def main(argv):\n    return 0\n",
    "class Tokenizer:\n    \"\"\"Turns text into ids.\"\"\"\n",
    "import os\nimport sys\nprint(os.getcwd(), sys.argv)\n",
] * 20


@pytest.fixture(scope="module")
def tok() -> BPETokenizer:
    return BPETokenizer.train(iterator=CORPUS, vocab_size=300)


def test_train_reaches_requested_vocab_and_knows_eos(tok):
    assert 257 < tok.vocab_size <= 300
    assert tok.id_to_token(tok.eos_id) == "<|endoftext|>"
    assert tok.pad_id == tok.eos_id  # GPT-2 convention: EOS doubles as padding


def test_merges_learned_from_the_corpus_shorten_text(tok):
    text = "def main(argv):\n    return 0\n"
    assert len(tok.encode(text).ids) < len(text.encode()) / 2


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1))
def test_decode_inverts_encode_for_any_unicode(text):
    tok = _shared_tok()
    assert tok.decode(tok.encode(text).ids) == text


_CACHE: dict = {}


def _shared_tok() -> BPETokenizer:
    if "tok" not in _CACHE:
        _CACHE["tok"] = BPETokenizer.train(iterator=CORPUS, vocab_size=300)
    return _CACHE["tok"]


def test_round_trip_of_hard_cases(tok):
    for text in ["naïve café", "emoji 🤖 and 中文", " leading space", "tabs\t\tand\r\nCRLF", "\x00\x7f",
                 "<|endoftext|> inside text", "   "]:
        assert tok.decode(tok.encode(text).ids) == text


def test_special_token_in_text_is_one_id_and_skippable(tok):
    enc = tok.encode("a<|endoftext|>b")
    assert tok.eos_id in enc.ids.tolist()
    assert tok.decode(enc.ids, skip_special_tokens=True) == "ab"


def test_encode_returns_long_tensor_that_indexes_into_a_batch(tok):
    enc = tok.encode("def main(")
    assert enc.ids.dtype == torch.long and enc.ids.dim() == 1
    assert enc.ids[None].shape == (1, len(enc.tokens))
    assert enc.tokens and len(enc.offsets) == len(enc.tokens)


def test_add_eos(tok):
    ids = tok.encode("x", add_eos=True).ids
    assert ids[-1].item() == tok.eos_id


def test_save_load_round_trip(tok, tmp_path):
    tok.save(tmp_path)
    loaded = BPETokenizer.load(tmp_path)
    assert loaded.vocab_size == tok.vocab_size and loaded.eos_id == tok.eos_id
    text = "class Tokenizer: pass"
    assert torch.equal(loaded.encode(text).ids, tok.encode(text).ids)
    assert torch.equal(BPETokenizer.load(tmp_path / "tokenizer.json").encode(text).ids, tok.encode(text).ids)


def test_train_from_files(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("".join(CORPUS))
    tok = BPETokenizer.train(files=[path], vocab_size=280)
    assert tok.decode(tok.encode("return 0").ids) == "return 0"


def test_batch_encode_pads_right_or_left(tok):
    right = tok.batch_encode(["import os", "x"])
    assert isinstance(right, Tokens)
    n_long, n_short = len(tok.encode("import os").ids), len(tok.encode("x").ids)
    assert right.ids.shape == (2, n_long)
    assert right.attention_mask[1].tolist() == [1] * n_short + [0] * (n_long - n_short)
    assert right.ids[1, n_short:].eq(tok.pad_id).all()
    left = tok.batch_encode(["import os", "x"], padding_side="left")
    assert left.attention_mask[1].tolist() == [0] * (n_long - n_short) + [1] * n_short
    assert torch.equal(left.ids[1, -n_short:], tok.encode("x").ids)


def test_batch_encode_refuses_to_truncate_silently(tok):
    with pytest.raises(ValueError, match="max_length=2"):
        tok.batch_encode(["import os import sys"], max_length=2)
    cut = tok.batch_encode(["import os import sys"], max_length=2, truncation=True)
    assert cut.ids.shape == (1, 2)
    assert torch.equal(cut.ids[0], tok.encode("import os import sys").ids[:2])
    tail = tok.batch_encode(["import os import sys"], max_length=2, truncation=True, truncation_side="left")
    assert torch.equal(tail.ids[0], tok.encode("import os import sys").ids[-2:])


def test_bad_input_is_named(tok):
    with pytest.raises(ValueError, match="empty text"):
        tok.encode("")
    with pytest.raises(TypeError, match="str"):
        tok.encode(123)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([tok.vocab_size + 5])
    with pytest.raises(TypeError, match=r"ids must be integers, got \[True\]"):
        tok.decode([True, 5])  # not id 1
    with pytest.raises(TypeError, match="list of strings"):
        tok.batch_encode("not a list")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="too small"):
        BPETokenizer.train(iterator=CORPUS, vocab_size=100)
    with pytest.raises(ValueError, match="exactly one"):
        BPETokenizer.train(vocab_size=300)
    with pytest.raises(FileNotFoundError):
        BPETokenizer.load("/nonexistent/tokenizer")


@pytest.mark.parametrize("side", ["left", "right"])
def test_batch_encode_is_encode_row_by_row(tok, side):
    """The Rust batch path gives exactly the ids encode gives, for every row and option."""
    texts = ["import os", "x", "def main():\n    return 0", "ünïcode ✓ 名前", "  spaces  "]
    batch = tok.batch_encode(texts, padding_side=side, add_eos=True)
    for i, text in enumerate(texts):
        ids = tok.encode(text, add_eos=True).ids
        real = batch.attention_mask[i].bool()
        assert torch.equal(batch.ids[i][real], ids)
        assert batch.ids[i][~real].eq(tok.pad_id).all()
        assert real.tolist() == ([False] * (batch.ids.shape[1] - len(ids)) + [True] * len(ids) if side == "left"
                                 else [True] * len(ids) + [False] * (batch.ids.shape[1] - len(ids)))


def test_batch_encode_names_the_bad_item(tok):
    with pytest.raises(ValueError, match="text 1 is empty"):
        tok.batch_encode(["a", "", "b"])
    with pytest.raises(TypeError, match="text 2 is a int, expected str"):
        tok.batch_encode(["a", "b", 3])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="at least one text"):
        tok.batch_encode([])
    with pytest.raises(ValueError, match="no bos_token"):
        tok.batch_encode(["a"], add_bos=True)


def test_a_classifiers_input_is_text_then_eos_and_fits_by_cutting_the_longer_text(tok):
    a, b = tok.encode("def parse(text):").ids.tolist(), tok.encode("return the words of the text").ids.tolist()
    ids, segments = tok.encode_for_classifier("def parse(text):")
    assert ids.tolist() == [*a, tok.eos_id] and segments.tolist() == [0] * (len(a) + 1)
    ids, segments = tok.encode_for_classifier("def parse(text):", "return the words of the text")
    assert ids.tolist() == [*a, tok.eos_id, *b, tok.eos_id]
    assert segments.tolist() == [0] * (len(a) + 1) + [1] * (len(b) + 1)
    ids, _ = tok.encode_for_classifier("def parse(text):", "return the words of the text", max_length=len(a) + 4)
    assert len(ids) == len(a) + 4 and ids.tolist().count(tok.eos_id) == 2 and ids[-1] == tok.eos_id
    ids, _ = tok.encode_for_classifier("return the words of the text", max_length=3)
    assert ids.tolist() == [*b[:2], tok.eos_id]


def test_classifier_input_longer_than_max_length_is_refused_without_truncation(tok):
    with pytest.raises(ValueError, match="more than max_length=3"):
        tok.encode_for_classifier("return the words of the text", max_length=3, truncation=False)


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("max_length", [0, -1])
def test_batch_encode_refuses_a_max_length_that_is_not_positive(tok, max_length, side):
    # ids[-0:] would keep the whole text, ids[:-1] would drop its last token
    with pytest.raises(ValueError, match=f"max_length must be an integer ≥ 1 or None, got {max_length}"):
        tok.batch_encode(["import os"], max_length=max_length, truncation=True, truncation_side=side)


@pytest.fixture(scope="module")
def tok_bos() -> BPETokenizer:
    return BPETokenizer.train(iterator=CORPUS, vocab_size=300, special_tokens=("<|endoftext|>", "<|startoftext|>"),
                              bos_token="<|startoftext|>")


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("add_bos", [False, True])
def test_truncation_cuts_the_text_and_keeps_bos_and_eos_like_hugging_face(tok_bos, side, add_bos):
    from tokenizers import Tokenizer
    from tokenizers.processors import TemplateProcessing

    text = "import os import sys print"
    reference = Tokenizer.from_str(tok_bos._tok.to_str())
    specials = [("<|startoftext|>", tok_bos.bos_id), ("<|endoftext|>", tok_bos.eos_id)]
    reference.post_processor = TemplateProcessing(
        single=("<|startoftext|> " if add_bos else "") + "$A <|endoftext|>", special_tokens=specials)
    for max_length in range(3, len(tok_bos.encode(text).ids) + 3):
        reference.enable_truncation(max_length, direction=side)
        cut = tok_bos.batch_encode([text], max_length=max_length, truncation=True, truncation_side=side,
                                   add_bos=add_bos, add_eos=True)
        assert cut.ids[0].tolist() == reference.encode(text).ids, max_length
        assert cut.ids[0, -1] == tok_bos.eos_id and (cut.ids[0, 0] == tok_bos.bos_id) == add_bos


def test_a_max_length_with_no_room_besides_bos_and_eos_is_refused(tok_bos):
    with pytest.raises(ValueError, match="max_length=2 leaves no room for text besides the 2 special tokens"):
        tok_bos.batch_encode(["import os"], max_length=2, truncation=True, add_bos=True, add_eos=True)


@pytest.mark.parametrize("one_sequence", [lambda ids: ids, lambda ids: ids.tolist()], ids=["tensor", "list"])
def test_batch_decode_refuses_one_sequence_and_points_to_decode(tok, one_sequence):
    ids = tok.encode("import os").ids
    with pytest.raises(ValueError, match="batch_decode takes a batch of rows.*use decode"):
        tok.batch_decode(one_sequence(ids))
    assert tok.batch_decode(ids[None]) == ["import os"]


def test_tokenizers_are_equal_when_they_give_every_text_the_same_ids(tok, tok_bos, tmp_path):
    loaded = BPETokenizer.load(tok.save(tmp_path))
    assert loaded == tok and hash(loaded) == hash(tok)
    assert BPETokenizer.train(iterator=CORPUS, vocab_size=300) == tok  # training is deterministic
    assert BPETokenizer.train(iterator=CORPUS, vocab_size=290) != tok
    assert tok_bos != tok  # the same merges, another special token read first
