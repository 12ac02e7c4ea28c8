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


@pytest.mark.parametrize("engine", ["tiktoken", "rust"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_batch_encode_is_encode_row_by_row(tok, hf_only, engine, side):
    """Both batch paths — tiktoken's, and Hugging Face's Rust batch encoder where tiktoken is not
    found — give exactly the ids encode gives, row by row, padded on the asked side."""
    if engine == "tiktoken":
        assert tok._fast.available(tok._tok), tok._fast.reason
    else:
        tok = hf_only(tok._tok)
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


# ----------------------------------------------------------------- truncation values, as WordPiece takes them
@pytest.mark.parametrize("off", [False, "off"])
def test_truncation_off_refuses_a_long_text_whether_false_or_off(tok, off):
    # "off" is a non-empty str: read as truthy it used to cut silently
    with pytest.raises(ValueError, match="text 0 has .* tokens, more than max_length=2; pass truncation=True"):
        tok.batch_encode(["import os import sys"], max_length=2, truncation=off)
    with pytest.raises(ValueError, match="more than max_length=2"):
        tok.encode_for_classifier("return the words of the text", max_length=2, truncation=off)


@pytest.mark.parametrize("cut", [True, "longest_first", "only_first"])
def test_truncation_strategies_of_one_text_cut_it(tok, cut):
    ids = tok.encode("import os import sys").ids
    assert torch.equal(tok.batch_encode(["import os import sys"], max_length=2, truncation=cut).ids[0], ids[:2])


@pytest.mark.parametrize("bad", [None, "yes", "on", 1])
def test_a_truncation_value_wordpiece_would_refuse_is_refused_by_name(tok, bad):
    with pytest.raises(ValueError, match=rf"truncation={bad!r}: expected one of \('off', 'longest_first'"):
        tok.batch_encode(["import os"], truncation=bad)  # refused even when nothing needs cutting
    with pytest.raises(ValueError, match=rf"truncation={bad!r}"):
        tok.encode_for_classifier("import os", truncation=bad)


def test_only_second_needs_a_pair(tok):
    with pytest.raises(ValueError, match="truncation='only_second' needs a sentence pair"):
        tok.batch_encode(["import os import sys"], max_length=2, truncation="only_second")


def test_a_processor_passes_truncation_off_through_and_the_text_is_not_cut(tok):
    from tokenizers_mm import Processor

    with pytest.raises(ValueError, match="more than max_length=2"):
        Processor(text=tok)("import os import sys", max_length=2, truncation="off")


# ----------------------------------------------------------------- bad input named
@pytest.mark.parametrize("text", ["a\ud800b", "\udfff"])
def test_a_lone_surrogate_is_a_value_error_naming_where_it_is(tok, text):
    where = text.index(next(c for c in text if 0xD800 <= ord(c) <= 0xDFFF))
    char = repr(text[where]).replace("\\", "\\\\")
    with pytest.raises(ValueError, match=rf"^text has a lone surrogate {char} at position {where}: lone surrogates "
                                         "cannot be encoded"):
        tok.encode(text)
    with pytest.raises(ValueError, match=rf"^text 1 has a lone surrogate {char} at position {where}"):
        tok.batch_encode(["fine", text])
    with pytest.raises(ValueError, match=rf"^text 2 has a lone surrogate {char} at position {where}"):
        list(tok.iter_ids(["fine", "", text]))  # its index in the stream, the empty text counted


def test_iter_ids_names_an_item_that_is_not_a_str(tok):
    with pytest.raises(TypeError, match="text 1 is a int, expected str"):
        list(tok.iter_ids(["a", 5]))  # type: ignore[list-item]
    with pytest.raises(TypeError, match="text 2 is a NoneType, expected str"):
        list(tok.iter_ids(["a", "", None]))  # type: ignore[list-item]


@pytest.mark.parametrize("bad", [True, 2.5, "8", 0])
def test_pair_max_length_must_be_a_positive_int(tok, bad):
    bpe = BPETokenizer.train(iterator=CORPUS, vocab_size=300, special_tokens=("<|endoftext|>", "[CLS]", "[SEP]"))
    message = f"max_length must be an integer ≥ 1 or None, got {bad!r}"
    with pytest.raises(ValueError, match=message):
        bpe.encode_pair("import os", "x", max_length=bad, truncation=True)
    with pytest.raises(ValueError, match=f"^{message}"):  # not "text 0: ..."
        bpe.batch_encode_pairs(["import os"], ["x"], max_length=bad, truncation=True)


# ----------------------------------------------------------------- loading another tokenizer's folder
def test_load_refuses_a_wordpiece_folder_naming_the_folder_and_both_types(tmp_path):
    from tokenizers_mm import WordPieceTokenizer

    WordPieceTokenizer.train(iterator=CORPUS, vocab_size=100, min_frequency=1).save(tmp_path)
    with pytest.raises(ValueError, match=rf"{tmp_path} holds a 'wordpiece' tokenizer; BPETokenizer.load expected "
                                         r"type 'bpe' \(use WordPieceTokenizer.load\)"):
        BPETokenizer.load(tmp_path)
    alone = tmp_path / "alone"
    alone.mkdir()
    (tmp_path / "tokenizer.json").rename(alone / "tokenizer.json")  # no config beside it to say so
    with pytest.raises(ValueError, match="holds a WordPiece model; BPETokenizer.load expected a byte-level BPE"):
        BPETokenizer.load(alone)


def _gpt2_folder(tok: BPETokenizer, tmp_path, **options):
    from transformers import GPT2TokenizerFast

    files = tmp_path / "files"
    files.mkdir()
    vocab, merges = tok._tok.model.save(str(files))
    reference = GPT2TokenizerFast(vocab=vocab, merges=merges, **options)
    reference.save_pretrained(tmp_path / "gpt2")
    return tmp_path / "gpt2", reference


def test_load_reads_a_gpt2_folder_from_transformers_with_its_ids(tok, tmp_path):
    from transformers import GPT2TokenizerFast

    folder, _ = _gpt2_folder(tok, tmp_path)
    reference = GPT2TokenizerFast.from_pretrained(folder)
    loaded = BPETokenizer.load(folder)
    assert (loaded.eos_token, loaded.pad_token, loaded.bos_token) == ("<|endoftext|>",) * 3
    for text in ["import os", "  lead and tail  ", "héllo 😀 naïve 中文", "a<|endoftext|>b", "it's\n\n\tx 123"]:
        assert loaded.encode(text).ids.tolist() == reference(text)["input_ids"], text
        assert loaded.decode(loaded.encode(text).ids) == text
    texts = ["import os", "class Tokenizer", "x"]
    batch = loaded.batch_encode(texts)  # no padding token in GPT-2: its EOS pads, as BPETokenizer's default
    for row, mask, expected in zip(batch.ids, batch.attention_mask.bool(), reference(texts)["input_ids"], strict=True):
        assert row[mask].tolist() == expected


def test_load_refuses_a_gpt2_folder_that_adds_a_prefix_space(tok, tmp_path):
    folder, _ = _gpt2_folder(tok, tmp_path, add_prefix_space=True)
    with pytest.raises(ValueError, match=rf"{folder}: GPT2Tokenizer with add_prefix_space=True gives other ids "
                                         "than BPETokenizer; BPETokenizer encodes text as given"):
        BPETokenizer.load(folder)


def test_load_refuses_a_folder_of_another_transformers_tokenizer(tok, tmp_path):
    tok.save(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text('{"tokenizer_class": "LlamaTokenizer", "add_bos_token": true}')
    with pytest.raises(ValueError, match=rf"{tmp_path} was saved by transformers' LlamaTokenizer; BPETokenizer.load "
                                         "expected a BPETokenizer folder"):
        BPETokenizer.load(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text('{"type": "bpe", "eos_token": "<|endoftext|>", "cls_token": "x"}')
    with pytest.raises(ValueError, match=r"has settings BPETokenizer does not take: \['cls_token'\]"):
        BPETokenizer.load(tmp_path)
