"""WordPieceTokenizer and sentence pairs: training, loading, [CLS] A [SEP] B [SEP] with segment
ids, the pair truncation strategies (checked against the `tokenizers` library), first-sub-token
labels, BPE pairs, save/load and bad input."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from tokenizers_mm import (
    BPETokenizer,
    Tokens,
    WordPieceTokenizer,
    align_word_labels,
    encode_pair_ids,
    pad_pairs,
)
from tokenizers_mm.pairs import pair_lengths

CORPUS = [
    "def tokenize(text): return text.split()",
    "class Tokenizer: turns text into ids and back again.",
    "import os, sys; print(os.getcwd(), sys.argv)",
    "The tokenizer splits unbelievable words into pieces.",
    "Tokenization of tokenizers tokenizes tokens.",
] * 30


@pytest.fixture(scope="module")
def tok() -> WordPieceTokenizer:
    return WordPieceTokenizer.train(iterator=CORPUS, vocab_size=200, min_frequency=1)


def test_training_puts_special_tokens_first_and_learns_continuations(tok):
    assert [tok.id_to_token(i) for i in range(5)] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert tok.vocab_size <= 200
    assert tok.special_ids == [0, 1, 2, 3, 4]
    pieces = tok.encode("tokenization").tokens
    assert pieces[0] == "[CLS]" and pieces[-1] == "[SEP]" and any(p.startswith("##") for p in pieces)
    cont = tok.continuation_mask()
    assert cont.shape == (tok.vocab_size,) and bool(cont[tok.token_to_id(pieces[2])]) == pieces[2].startswith("##")


def test_training_is_deterministic_and_numbers_the_vocabulary_canonically():
    """Hugging Face's trainer numbers continuation pieces in (Rust) hash order and breaks merge
    ties by those numbers, so on its own one corpus gives different vocabularies from run to run
    (three in 100 runs on the two lines below); unitok names those pieces up front, so every run
    agrees, and ids are canonical — special tokens first, then the learned tokens sorted."""
    import sysconfig
    from pathlib import Path

    tiny = ["Wel come to the Tok en izers libr ary.", "Welcome to the tokenizers library, wel come again"]
    vocabularies = {tuple(sorted(WordPieceTokenizer.train(iterator=tiny, vocab_size=60, min_frequency=1)._tok.get_vocab()
                                .items())) for _ in range(30)}
    assert len(vocabularies) == 1
    root = Path(sysconfig.get_paths()["stdlib"])
    texts = [(root / name).read_text(encoding="utf-8") for name in ("argparse.py", "ast.py")]
    first, second = (WordPieceTokenizer.train(iterator=texts, vocab_size=400) for _ in range(2))
    a, b = first._tok.get_vocab(with_added_tokens=False), second._tok.get_vocab(with_added_tokens=False)
    assert a == b and len(a) == 400
    assert first._tok.get_added_tokens_decoder().keys() == {0, 1, 2, 3, 4}  # only the special tokens
    for vocab in (a, b):
        specials = [t for t in sorted(vocab, key=vocab.get) if t.startswith("[") and t.endswith("]")]
        learned = [t for t in sorted(vocab, key=vocab.get) if t not in specials]
        assert [vocab[t] for t in specials] == list(range(len(specials)))
        assert learned == sorted(learned)


def test_pair_encoding_has_segments_and_matches_the_rust_template(tok):
    enc = tok.encode("class Tokenizer", "import os")
    sep = enc.tokens.index("[SEP]")
    assert enc.tokens[0] == "[CLS]" and enc.tokens[-1] == "[SEP]"
    assert enc.segments.tolist() == [0] * (sep + 1) + [1] * (len(enc.tokens) - sep - 1)
    assert enc.sequence_ids[0] is None and enc.sequence_ids[1] == 0 and enc.sequence_ids[-2] == 1
    reference = tok._tok.encode("class Tokenizer", "import os")  # the saved BERT post-processor
    assert enc.ids.tolist() == reference.ids and enc.segments.tolist() == reference.type_ids


def test_decode_joins_word_pieces(tok):
    text = "The tokenizer splits words."
    assert tok.decode(tok.encode(text).ids) == "The tokenizer splits words."
    batch = tok.batch_encode([text, "import os"])
    assert tok.batch_decode(batch.ids) == [text, "import os"]


@pytest.mark.parametrize("strategy", ["longest_first", "only_first", "only_second"])
def test_truncation_strategies_match_the_tokenizers_library(tok, strategy):
    """The same ids and segments wherever the library fits the pair; where it refuses (the side
    that may not be trimmed is too long alone), a ValueError with the lengths and the budget."""
    a, b = CORPUS[0] + " " + CORPUS[3], CORPUS[1]
    n_a, n_b = len(tok.encode(a).ids) - 2, len(tok.encode(b).ids) - 2  # without [CLS] and [SEP]
    trimmed, kept, kept_length = {"only_first": ("first", "second", n_b),
                                  "only_second": ("second", "first", n_a)}.get(strategy, (None, None, None))
    reference = Tokenizer.from_str(tok._tok.to_str())
    checked = refused = 0
    for max_length in range(4, 45):
        reference.enable_truncation(max_length, strategy=strategy)
        try:
            expected = reference.encode(a, b)
        except Exception:
            assert trimmed is not None, f"{strategy} always fits, but the library refused max_length={max_length}"
            budget = max_length - 3  # [CLS] A [SEP] B [SEP]
            message = (f"cannot fit {n_a} + {n_b} tokens into {budget} by trimming the {trimmed} sequence: "
                       f"the {kept} alone has {kept_length}")
            with pytest.raises(ValueError, match=re.escape(message)):
                tok.encode(a, b, max_length=max_length, truncation=strategy)
            refused += 1
            continue
        enc = tok.encode(a, b, max_length=max_length, truncation=strategy)
        assert enc.ids.tolist() == expected.ids, max_length
        assert enc.segments.tolist() == expected.type_ids
        assert len(enc.ids) <= max_length
        checked += 1
    assert checked > 10
    # refused: each max_length (from 4) whose budget leaves nothing once the kept side is in
    assert refused == (0 if kept_length is None else kept_length)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 40), st.integers(0, 40), st.integers(0, 60))
def test_longest_first_fits_the_budget_and_trims_the_longer_side(n_a, n_b, budget):
    keep_a, keep_b = pair_lengths(n_a, n_b, budget, "longest_first")
    assert keep_a <= n_a and keep_b <= n_b
    assert keep_a + keep_b == min(n_a + n_b, budget)
    if n_a + n_b > budget:  # the kept lengths differ by at most one unless a side was short already
        assert abs(keep_a - keep_b) <= 1 or min(keep_a, keep_b) == min(n_a, n_b)


def test_too_long_pair_with_truncation_off_is_a_clear_error(tok):
    with pytest.raises(ValueError, match=r"does not fit max_length.*truncation is off"):
        tok.encode(CORPUS[0], CORPUS[1], max_length=8)
    with pytest.raises(ValueError, match="text 1"):
        tok.batch_encode(["import os", CORPUS[3]], max_length=6)
    with pytest.raises(ValueError, match="only_second.*single"):
        tok.encode(CORPUS[0], max_length=4, truncation="only_second")
    with pytest.raises(ValueError, match="truncation='sideways'"):
        tok.encode("x", truncation="sideways")  # type: ignore[arg-type]


def test_batch_encode_pairs_gives_tokens_with_segments_and_padding(tok):
    batch = tok.batch_encode(["import os", CORPUS[3]], ["class Tokenizer", "def f"], max_length=12,
                             truncation="longest_first")
    assert isinstance(batch, Tokens) and batch.segments is not None
    assert batch.ids.shape[1] <= 12
    real = batch.attention_mask.bool()
    assert bool((batch.ids[~real] == tok.pad_id).all()) and bool((batch.segments[~real] == 0).all())
    for row in range(2):
        n = int(real[row].sum())
        assert batch.ids[row, 0] == tok.cls_id and batch.ids[row, n - 1] == tok.sep_id
        assert batch.segments[row, n - 1] == 1
    with pytest.raises(ValueError, match="2 texts but 1 text_pairs"):
        tok.batch_encode(["a", "b"], ["c"])


def test_first_sub_token_rule_for_word_labels(tok):
    words = ["tokenization", "of", "tokens"]
    enc = tok.encode(words)
    labels = align_word_labels(enc.word_ids, [7, 8, 9])
    firsts = [i for i, (w, prev) in enumerate(zip(enc.word_ids, [None, *enc.word_ids])) if w is not None and w != prev]
    assert [labels[i] for i in firsts] == [7, 8, 9]
    assert sum(label != -100 for label in labels) == 3  # special tokens and later pieces ignored
    assert len(enc.ids) > len(words) + 2  # "tokenization" really was split
    with pytest.raises(ValueError, match="word labels"):
        align_word_labels(enc.word_ids, [1])


def test_save_load_round_trip_and_vocab_txt(tok, tmp_path):
    tok.save(tmp_path)
    for source in (tmp_path, tmp_path / "tokenizer.json"):
        again = WordPieceTokenizer.load(source)
        assert again.encode(CORPUS[2], CORPUS[3]).ids.tolist() == tok.encode(CORPUS[2], CORPUS[3]).ids.tolist()
    (tmp_path / "tokenizer.json").unlink()
    from_vocab = WordPieceTokenizer.load(tmp_path)  # cased, as tokenizer_config.json says
    assert from_vocab.encode(CORPUS[3]).ids.tolist() == tok.encode(CORPUS[3]).ids.tolist()
    with pytest.raises(FileNotFoundError):
        WordPieceTokenizer.load(tmp_path / "missing")


def test_a_vocab_txt_keeps_its_special_tokens_whole_and_decodes_without_them(tok, tmp_path):
    # A checkpoint that ships only vocab.txt (as many BERTs do): "[MASK]" in text is the mask
    # token, not "[", "mask", "]", and decoding skips the special tokens, as BertTokenizer does.
    tok.save(tmp_path)
    (tmp_path / "tokenizer.json").unlink()
    from_vocab = WordPieceTokenizer.load(tmp_path)
    text = "[MASK] the tokenizer [SEP] splits"
    ids = from_vocab.encode(text).ids.tolist()
    assert ids == tok.encode(text).ids.tolist()
    assert ids.count(from_vocab.mask_id) == 1 and from_vocab.unk_id not in ids
    assert from_vocab.decode(ids) == tok.decode(ids)
    assert "[CLS]" not in from_vocab.decode(ids) and "[CLS]" in from_vocab.decode(ids, skip_special_tokens=False)
    from transformers import BertTokenizer
    reference = BertTokenizer(vocab=str(tmp_path / "vocab.txt"), do_lower_case=False)
    assert ids == reference(text)["input_ids"]


def test_bad_input_is_refused(tok):
    with pytest.raises(ValueError, match="empty"):
        tok.encode("")
    with pytest.raises(ValueError, match="WordPiece model"):
        WordPieceTokenizer(BPETokenizer.train(iterator=CORPUS, vocab_size=300)._tok)
    with pytest.raises(ValueError, match="lacks"):
        WordPieceTokenizer.train(iterator=CORPUS, special_tokens=("[PAD]", "[UNK]"))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([tok.vocab_size])


def test_bpe_encodes_pairs_for_bert_too():
    bpe = BPETokenizer.train(iterator=CORPUS, vocab_size=320,
                             special_tokens=("<|endoftext|>", "[CLS]", "[SEP]", "[MASK]", "[PAD]"), pad_token="[PAD]")
    ids, segments = bpe.encode_pair("class Tokenizer", "import os")
    cls_id, sep_id = bpe.token_to_id("[CLS]"), bpe.token_to_id("[SEP]")
    a, b = bpe.encode("class Tokenizer").ids.tolist(), bpe.encode("import os").ids.tolist()
    assert ids.tolist() == [cls_id, *a, sep_id, *b, sep_id]
    assert segments.tolist() == [0] * (len(a) + 2) + [1] * (len(b) + 1)
    assert bpe.decode(ids[1:1 + len(a)]) == "class Tokenizer"
    batch = bpe.batch_encode_pairs([CORPUS[0], "x"], [CORPUS[1], "y"], max_length=16, truncation=True)
    assert batch.ids.shape == (2, 16) and batch.segments is not None
    assert int(batch.attention_mask[1].sum()) == 5  # [CLS] x [SEP] y [SEP]
    with pytest.raises(ValueError, match="truncation is off"):
        bpe.encode_pair(CORPUS[0], CORPUS[1], max_length=10)
    with pytest.raises(KeyError, match=r"\[CLS\]"):
        BPETokenizer.train(iterator=CORPUS, vocab_size=300).encode_pair("a", "b")


def test_encode_pair_ids_shared_function():
    ids, seg = encode_pair_ids([5, 6, 7], [8, 9], cls_id=1, sep_id=2, max_length=7, truncation="longest_first")
    assert ids == [1, 5, 6, 2, 8, 9, 2] and seg == [0, 0, 0, 0, 1, 1, 1]
    ids, seg = encode_pair_ids([5, 6, 7], None, cls_id=1, sep_id=2, max_length=4, truncation=True)
    assert ids == [1, 5, 6, 2] and seg == [0, 0, 0, 0]


@pytest.mark.parametrize(("text", "pair", "message"), [
    ("   ", None, "text .*encodes to no tokens"),
    ("\x00\t", None, "text .*encodes to no tokens"),
    ("import os", "", "empty text_pair|text_pair 0 encodes to no tokens"),
    ("import os", "  ", "text_pair .*encodes to no tokens"),
    ([" ", "\t"], None, "text .*encodes to no tokens"),  # pre-split words, all blank
])
def test_encode_and_batch_encode_refuse_the_same_blank_texts(tok, text, pair, message):
    with pytest.raises(ValueError, match=message):
        tok.encode(text, pair)
    if isinstance(text, str):  # batch_encode takes strings only
        with pytest.raises(ValueError, match=message):
            tok.batch_encode([text], None if pair is None else [pair])


def test_batch_encode_names_an_item_that_is_not_a_str(tok):
    with pytest.raises(TypeError, match="text 1 is a int, expected str"):
        tok.batch_encode(["import os", 3])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="text 0 is a list, expected str"):
        tok.batch_encode([["import", "os"]])  # type: ignore[list-item]  # not taken as a pair
    with pytest.raises(TypeError, match="text_pair 1 is a NoneType, expected str"):
        tok.batch_encode(["import os", "def f"], ["class", None])  # type: ignore[list-item]


@pytest.mark.parametrize("one_sequence", [lambda ids: ids, lambda ids: ids.tolist()], ids=["tensor", "list"])
def test_batch_decode_refuses_one_sequence_and_points_to_decode(tok, one_sequence):
    ids = tok.encode("import os").ids
    with pytest.raises(ValueError, match="batch_decode takes a batch of rows.*use decode"):
        tok.batch_decode(one_sequence(ids))


def test_tokenizers_are_equal_when_they_give_every_text_the_same_ids(tok, tmp_path):
    loaded = WordPieceTokenizer.load(tok.save(tmp_path))
    assert loaded == tok and hash(loaded) == hash(tok)
    assert WordPieceTokenizer.train(iterator=CORPUS, vocab_size=100, min_frequency=1) != tok


# ----------------------------------------------------------------- vocab.txt read as BertTokenizer reads it
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def _vocab_folder(path, lines, config=None):
    path.mkdir(parents=True, exist_ok=True)
    (path / "vocab.txt").write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    if config is not None:
        import json

        (path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer", **config}))
    return path


def test_a_token_listed_twice_has_its_last_lines_id_and_trailing_whitespace_is_dropped(tmp_path):
    from transformers import BertTokenizerFast

    # "hello" on lines 5 and 7: the last wins and id 5 holds no token; "foo " is "foo"
    folder = _vocab_folder(tmp_path / "dup", [*SPECIALS, "hello", "world", "hello", "##s", "foo \t"])
    reference = BertTokenizerFast.from_pretrained(folder)
    tok = WordPieceTokenizer.load(folder)
    for text in ["hello worlds", "foo", "Hello foo worlds"]:
        assert tok.encode(text).ids.tolist() == reference(text)["input_ids"], text
    assert tok.encode("hello worlds foo").ids.tolist() == [2, 7, 6, 8, 9, 3]
    assert tok.vocab_size == 10  # ids 0..9: an embedding table needs 10 rows, though 9 tokens
    assert tok.decode([7, 9]) == reference.decode([7, 9]) == "hello foo"
    assert tok.decode([5, 9]) == reference.decode([5, 9]) == "foo"  # the empty id decodes to nothing
    assert tok.continuation_mask().tolist() == [False] * 8 + [True, False]
    with pytest.raises(KeyError, match="id 5 holds no token"):
        tok.id_to_token(5)


def test_saving_a_vocabulary_with_a_gap_reloads_to_the_same_ids(tmp_path):
    from transformers import BertTokenizerFast

    tok = WordPieceTokenizer.load(_vocab_folder(tmp_path / "dup", [*SPECIALS, "hello", "world", "hello", "##s", "foo"]))
    saved = tok.save(tmp_path / "saved")
    lines = (saved / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert lines == [*SPECIALS, "world", "world", "hello", "##s", "foo"]  # line number = id; the gap repeats a later token
    (saved / "tokenizer.json").rename(tmp_path / "tokenizer.json")
    text = "hello worlds foo"
    assert WordPieceTokenizer.load(saved).encode(text).ids.tolist() == tok.encode(text).ids.tolist() == [2, 7, 6, 8, 9, 3]
    assert BertTokenizerFast.from_pretrained(saved)(text)["input_ids"] == [2, 7, 6, 8, 9, 3]
    assert WordPieceTokenizer.load(saved).vocab_size == 10


NORMALISATION_VOCAB = [*SPECIALS, "cafe", "café", "Cafe", "Café", "naive", "naïve", "你", "好", "你好", "##好"]
NORMALISATION_TEXTS = ["Café naïve 你好", "CAFE café cafe", "你好好"]


@pytest.mark.parametrize("config", [
    {},
    {"do_lower_case": True, "strip_accents": False},
    {"do_lower_case": False, "strip_accents": True},
    {"do_lower_case": False},
    {"tokenize_chinese_chars": False},
    {"do_lower_case": True, "strip_accents": None, "tokenize_chinese_chars": True},
], ids=["defaults", "keep-accents", "cased-strip", "cased", "no-chinese", "explicit-defaults"])
def test_a_vocab_txt_folder_reads_its_normaliser_settings_as_bert_tokenizer_does(tmp_path, config):
    from transformers import BertTokenizerFast

    folder = _vocab_folder(tmp_path / "vocab", NORMALISATION_VOCAB, config)
    reference = BertTokenizerFast.from_pretrained(folder)
    tok = WordPieceTokenizer.load(folder)
    expected = [reference(text)["input_ids"] for text in NORMALISATION_TEXTS]
    assert [tok.encode(text).ids.tolist() for text in NORMALISATION_TEXTS] == expected
    # save keeps the settings: reloaded from tokenizer.json or from vocab.txt alone, the same ids
    saved = tok.save(tmp_path / "saved")
    assert WordPieceTokenizer.load(saved) == tok
    (saved / "tokenizer.json").unlink()
    for again in (WordPieceTokenizer.load(saved), BertTokenizerFast.from_pretrained(saved)):
        ids = [again.encode(t).ids.tolist() if isinstance(again, WordPieceTokenizer) else again(t)["input_ids"]
               for t in NORMALISATION_TEXTS]
        assert ids == expected


def test_settings_differ_from_the_defaults_so_the_test_above_sees_them(tmp_path):
    plain = WordPieceTokenizer.load(_vocab_folder(tmp_path / "a", NORMALISATION_VOCAB, {}))
    for config in ({"strip_accents": False}, {"tokenize_chinese_chars": False}):
        other = WordPieceTokenizer.load(_vocab_folder(tmp_path / str(len(config)) / next(iter(config)),
                                                      NORMALISATION_VOCAB, config))
        assert [other.encode(t).ids.tolist() for t in NORMALISATION_TEXTS] != \
            [plain.encode(t).ids.tolist() for t in NORMALISATION_TEXTS]


def test_a_tokenizer_json_folder_takes_the_settings_its_config_gives_as_bert_tokenizer_does(tmp_path):
    import json

    from transformers import BertTokenizerFast

    folder = WordPieceTokenizer.from_vocab(_vocab_folder(tmp_path / "v", NORMALISATION_VOCAB) / "vocab.txt").save(
        tmp_path / "json")
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "BertTokenizer", "do_lower_case": True, "strip_accents": False,
         "tokenize_chinese_chars": False}))
    reference = BertTokenizerFast.from_pretrained(folder)
    tok = WordPieceTokenizer.load(folder)
    assert [tok.encode(t).ids.tolist() for t in NORMALISATION_TEXTS] == \
        [reference(t)["input_ids"] for t in NORMALISATION_TEXTS]


@pytest.mark.parametrize(("key", "value", "allowed"), [("do_lower_case", "yes", "true or false"),
                                                        ("strip_accents", 0, "true, false or null"),
                                                        ("tokenize_chinese_chars", None, "true or false")])
def test_a_normaliser_setting_of_the_wrong_kind_is_refused(tmp_path, key, value, allowed):
    folder = _vocab_folder(tmp_path, NORMALISATION_VOCAB, {key: value})
    with pytest.raises(ValueError, match=f"tokenizer_config.json: {key} must be {allowed}, got {value!r}"):
        WordPieceTokenizer.load(folder)


def test_load_refuses_a_bpe_folder_naming_both_types(tmp_path):
    BPETokenizer.train(iterator=CORPUS, vocab_size=300).save(tmp_path)
    with pytest.raises(ValueError, match=rf"{tmp_path} holds a 'bpe' tokenizer; WordPieceTokenizer.load expected "
                                         r"type 'wordpiece' \(use BPETokenizer.load\)"):
        WordPieceTokenizer.load(tmp_path)


# ----------------------------------------------------------------- bad input named
@pytest.mark.parametrize("bad", [[True, 5], [5, 2.0], ["7"]], ids=["bool", "float", "str"])
def test_decode_refuses_ids_that_are_not_integers(tok, bad):
    odd = [i for i in bad if isinstance(i, (bool, float, str))]
    with pytest.raises(TypeError, match=rf"ids must be integers, got {odd!r}".replace("[", r"\[").replace("]", r"\]")):
        tok.decode(bad)  # True is not id 1


def test_encode_batch_ids_refuses_one_string_and_names_a_bad_item(tok):
    with pytest.raises(TypeError, match="encode_batch_ids takes a list of strings; use encode_ids"):
        tok.encode_batch_ids("import os")  # not one text per character
    with pytest.raises(TypeError, match="text 1 is a int, expected str"):
        tok.encode_batch_ids(["import os", 3])  # type: ignore[list-item]
    assert tok.encode_batch_ids(["import os", ""]) == [tok.encode_ids("import os"), []]


def test_a_lone_surrogate_is_a_value_error_naming_where_it_is(tok):
    with pytest.raises(ValueError, match=r"^text has a lone surrogate '\\ud800' at position 1: lone surrogates"):
        tok.encode("a\ud800")
    with pytest.raises(ValueError, match=r"^text_pair has a lone surrogate '\\udfff' at position 0"):
        tok.encode("a", "\udfff")
    with pytest.raises(ValueError, match=r"^text word 1 has a lone surrogate '\\ud800' at position 2"):
        tok.encode(["import", "os\ud800"])
    with pytest.raises(ValueError, match=r"^text 1 has a lone surrogate '\\ud800' at position 1"):
        tok.batch_encode(["import os", "a\ud800"])
    with pytest.raises(ValueError, match=r"^text_pair 0 has a lone surrogate"):
        tok.batch_encode(["import os"], ["\ud800"])
    with pytest.raises(ValueError, match=r"^text 0 has a lone surrogate"):
        tok.encode_batch_ids(["a\ud800"])


def test_encode_names_a_text_that_is_neither_a_str_nor_words(tok):
    with pytest.raises(TypeError, match=r"text must be a str or a non-empty list of words \(str\), got int"):
        tok.encode(5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="text word 1 is a int, expected str"):
        tok.encode(["import", 5])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="text_pair must be a str or a non-empty list"):
        tok.encode("import os", 3.5)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [True, 2.5, "8", 0])
def test_max_length_and_pad_to_must_be_positive_ints(tok, bad):
    # max_length=True used to be a budget of 1, 2.5 a slice error
    message = f"^max_length must be an integer ≥ 1 or None, got {bad!r}"
    with pytest.raises(ValueError, match=message):
        tok.encode("import os", max_length=bad, truncation=True)
    with pytest.raises(ValueError, match=message):
        tok.batch_encode(["import os"], max_length=bad, truncation=True)
    with pytest.raises(ValueError, match=message):
        encode_pair_ids([5, 6], [7], cls_id=1, sep_id=2, max_length=bad, truncation=True)
    message = f"^pad_to must be an integer ≥ 1 or None, got {bad!r}"
    with pytest.raises(ValueError, match=message):
        tok.batch_encode(["import os"], pad_to=bad)
    with pytest.raises(ValueError, match=message):
        pad_pairs([([1, 5, 2], [0, 0, 0])], pad_id=0, pad_to=bad)
