"""tiktoken as BPETokenizer's engine: the very same ids as Hugging Face `tokenizers` (on the
standard library's source, edge cases and random Unicode), refusal of vocabularies it cannot
represent, pickling, and encode / batch_encode answers equal to the Hugging Face path."""

from __future__ import annotations

import pickle

import pytest
import tiktoken  # a dependency (pyproject): a missing install fails here, never skips
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

from tasks.data.text import read_texts, stdlib_source_files
from tokenizers_mm import BPETokenizer, tiktoken_engine
from tokenizers_mm.tiktoken_engine import (
    NotRepresentable,
    TiktokenEngine,
    build_encoding,
    byte_alphabet,
)

torch.set_num_threads(1)

TRAIN_BYTES = 400_000
EDGE_CASES = [
    " ", "  ", "\t", "\n", "\r\n", "\n\n\n", "   \n", "a  b", "a \n b", "x ", " x", "\u00a0", "\u3000",
    "\u2028", "\u0085", "\x0b\x0c", "\x00", "\x7f", "\u200b", "\ufeff", "'s", "'S", "it's", "we'll", "''",
    "'", "e\u0301", "é", "ß", "中文字符", "日本語のテキスト", "한국어", "😀", "👨‍👩‍👧", "🏳️‍🌈", "\U0010ffff",
    "٣٤", "Ⅻ", "½", "x²", "𝔘𝔫𝔦", "ﷺ", "__init__", "    def f(self):\n        return 1\n",
    "<|endoftext|>", "a<|endoftext|>b", "<|endoftext|><|endoftext|>", "<|endoftext", "endoftext|>",
    " <|endoftext|> ", "x" * 5000, " " * 300, "\t" * 40 + "x", "1234567890" * 50,
]
PIECES = st.sampled_from(EDGE_CASES + ["def", " return", "(self)", ":\n", "    ", "0x1F", "ü", "中"])
TEXTS = st.lists(PIECES | st.text(min_size=1, max_size=8), min_size=1, max_size=12).map("".join)


def hf_ids(tok: BPETokenizer, text: str) -> list[int]:
    return tok._tok.encode(text, add_special_tokens=False).ids


@pytest.fixture(scope="module")
def tok() -> BPETokenizer:
    files = stdlib_source_files(TRAIN_BYTES)
    return BPETokenizer.train(files=files, vocab_size=2048, special_tokens=("<|endoftext|>", "<|pad|>"))


@pytest.fixture(scope="module")
def held_out() -> list[str]:
    """About 1 MB of standard-library source the tokenizer did not learn from."""
    files = stdlib_source_files()[len(stdlib_source_files(TRAIN_BYTES)):]
    chosen, size = [], 0
    for text in read_texts(files):
        if text and size < 1_000_000:
            chosen.append(text)
            size += len(text.encode())
    return chosen


# ----------------------------------------------------------------- identical ids
def test_trained_vocabulary_is_representable(tok):
    encoding = build_encoding(tok._tok)
    assert encoding.n_vocab == tok.vocab_size
    assert tok._fast.encode(tok._tok, "x") is not None, tok._fast.reason


def test_ids_identical_on_held_out_stdlib_source(tok, held_out):
    for text in held_out:
        assert tok._fast.encode(tok._tok, text) == hf_ids(tok, text)
    lines = [line for text in held_out[:20] for line in text.splitlines() if line]
    expected = [e.ids for e in tok._tok.encode_batch(lines, add_special_tokens=False)]
    assert tok._fast.encode_batch(tok._tok, lines) == expected


@pytest.mark.parametrize("text", EDGE_CASES)
def test_ids_identical_on_edge_cases(tok, text):
    assert tok.encode(text).ids.tolist() == hf_ids(tok, text)


@settings(max_examples=300, deadline=None)
@given(text=TEXTS)
def test_ids_identical_on_random_unicode(tok, text):
    assert tok._fast.encode(tok._tok, text) == hf_ids(tok, text)


def test_special_tokens_in_text_are_split_out_as_hugging_face_does(tok):
    ids = tok.encode("a<|pad|>b<|endoftext|>").ids.tolist()
    assert ids == hf_ids(tok, "a<|pad|>b<|endoftext|>")
    assert tok.token_to_id("<|pad|>") in ids and tok.eos_id in ids


def test_lone_surrogates_are_refused_by_both_engines_naming_text_and_position(tok):
    # tiktoken would replace them, Hugging Face says "TextInputSequence must be str": refused by name
    with pytest.raises(ValueError, match=r"text has a lone surrogate '\\ud800' at position 1"):
        tok.encode("a\ud800b")
    with pytest.raises(ValueError, match=r"text 1 has a lone surrogate '\\udfff' at position 1"):
        tok.batch_encode(["fine", "a\udfffb"])


# ----------------------------------------------------------------- encode / batch_encode answers
def test_encode_equals_the_hugging_face_path(tok, held_out, hf_only):
    reference = hf_only(tok._tok)
    texts = [line for line in held_out[0].splitlines() if line][:50] + EDGE_CASES[:20] + ["héllo <|endoftext|> 😀"]
    for text in texts:
        for eos in (False, True):
            ours, theirs = tok.encode(text, add_eos=eos), reference.encode(text, add_eos=eos)
            assert ours.ids.dtype == torch.long and torch.equal(ours.ids, theirs.ids)
            assert ours.tokens == theirs.tokens
            assert ours.offsets == theirs.offsets


@pytest.mark.parametrize("options", [{}, {"add_eos": True}, {"max_length": 5, "truncation": True},
                                     {"max_length": 5, "truncation": True, "truncation_side": "left",
                                      "padding_side": "left"}])
def test_batch_encode_equals_the_hugging_face_path(tok, held_out, hf_only, options):
    reference = hf_only(tok._tok)
    texts = [line for line in held_out[1].splitlines() if line][:64] + ["<|endoftext|>", "中文 😀"]
    ours, theirs = tok.batch_encode(texts, **options), reference.batch_encode(texts, **options)
    assert torch.equal(ours.ids, theirs.ids)
    assert torch.equal(ours.attention_mask, theirs.attention_mask)


def test_batch_encode_on_threads_gives_the_same_ids(tok, held_out, monkeypatch):
    lines = [line for line in held_out[2].splitlines() if line][:100]
    expected = tok.batch_encode(lines)
    monkeypatch.setattr(tiktoken_engine, "_PARALLEL_CHARS", 0)
    monkeypatch.setattr(tiktoken_engine, "_PARALLEL_MEAN_CHARS", 0)
    monkeypatch.setenv("RAYON_NUM_THREADS", "2")
    assert torch.equal(tok.batch_encode(lines).ids, expected.ids)
    assert list(tok.iter_ids(held_out[:6])) == [[*hf_ids(tok, text), tok.eos_id] for text in held_out[:6]]


def test_threads_take_large_batches_of_long_texts_in_runs_of_equal_characters():
    parallel_parts = tiktoken_engine.parallel_parts
    documents = ["x" * n for n in (40_000, 1_000, 1_000, 30_000, 20_000, 50_000, 5_000, 3_000)]
    parts = parallel_parts(documents, threads=2)
    assert parts is not None and [t for part in parts for t in part] == documents  # in order, each once
    assert 2 <= len(parts) <= 8 and all(parts)
    assert max(sum(map(len, part)) for part in parts) <= 50_000  # no run much above its share
    assert parallel_parts(documents, threads=1) is None
    assert parallel_parts(["x" * 40] * 10_000, threads=2) is None  # 400k characters of short lines: a loop
    assert parallel_parts(["x" * 1_000] * 10, threads=2) is None  # 10k characters: not worth the threads


def test_bos_token_is_added_on_the_fast_path(held_out):
    tok = BPETokenizer.train(iterator=held_out[:3], vocab_size=400,
                             special_tokens=("<|endoftext|>", "<|startoftext|>"), bos_token="<|startoftext|>")
    ids = tok.encode("def f", add_bos=True, add_eos=True).ids.tolist()
    assert ids == [tok.bos_id, *hf_ids(tok, "def f"), tok.eos_id]
    assert tok._fast.reason is None


# ----------------------------------------------------------------- pickling
def test_pickling_ships_no_rank_table_and_rebuilds_the_engine(tok):
    tok.encode("built")  # the engine exists before pickling
    assert len(pickle.dumps(tok._fast)) < 200
    clone = pickle.loads(pickle.dumps(tok))
    text = "class A:\n    pass  # 😀 <|endoftext|>"
    assert torch.equal(clone.encode(text).ids, tok.encode(text).ids)
    assert clone._fast.available(clone._tok)
    assert torch.equal(clone.batch_encode([text, "x"]).ids, tok.batch_encode([text, "x"]).ids)


# ----------------------------------------------------------------- vocabularies tiktoken cannot represent
def byte_level_bpe(merges: list[tuple[str, str]], specials: tuple[str, ...] = ("<|endoftext|>",)) -> Tokenizer:
    """A byte-level BPE from explicit merges: 256 bytes, then one token per merge, in order."""
    vocab = {c: i for i, c in enumerate(sorted(byte_alphabet(), key=byte_alphabet().get))}
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(list(specials))
    return tokenizer


def test_explicit_merges_in_id_order_are_representable():
    tokenizer = byte_level_bpe([("a", "b"), ("ab", "c"), ("Ġ", "x")])
    tok = BPETokenizer(tokenizer)
    for text in ("abc", "ab abc", "abcabc x", " xabc<|endoftext|>"):
        assert tok.encode(text).ids.tolist() == hf_ids(tok, text)
    assert tok._fast.reason is None


def test_token_that_its_merge_cannot_reach_is_refused():
    # b+c merges first, so Hugging Face never builds "abc" from "ab" + "c"; tiktoken would
    # merge "a" + "bc" into it, since it only asks whether the concatenation is a token.
    tokenizer = byte_level_bpe([("b", "c"), ("a", "b"), ("ab", "c")])
    ranks = {bytes([b]): i for i, b in enumerate(sorted(byte_alphabet().values()))}
    ranks.update({b"bc": 256, b"ab": 257, b"abc": 258})
    naive = tiktoken.Encoding("naive", pat_str=tiktoken_engine.GPT2_PATTERN, mergeable_ranks=ranks,
                              special_tokens={})
    assert naive.encode_ordinary("abc") != tokenizer.encode("abc").ids  # why it must be refused
    with pytest.raises(NotRepresentable, match="reached by another split"):
        build_encoding(tokenizer)


def test_merges_out_of_id_order_are_refused():
    tokenizer = byte_level_bpe([("a", "b"), ("b", "c")])
    vocab = tokenizer.get_vocab()
    vocab["ab"], vocab["bc"] = vocab["bc"], vocab["ab"]  # "bc" now ranks before "ab"
    swapped = Tokenizer(models.BPE(vocab=vocab, merges=[("a", "b"), ("b", "c")]))
    swapped.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    swapped.add_special_tokens(["<|endoftext|>"])
    with pytest.raises(NotRepresentable, match="out of id order"):
        build_encoding(swapped)


@pytest.mark.parametrize("change, message", [
    (lambda t: setattr(t, "pre_tokenizer", pre_tokenizers.ByteLevel(add_prefix_space=True)), "add_prefix_space"),
    (lambda t: setattr(t, "pre_tokenizer", pre_tokenizers.Whitespace()), "not ByteLevel"),
    (lambda t: setattr(t, "normalizer", normalizers.NFKC()), "normalizer"),
    (lambda t: t.enable_truncation(8), "truncation"),
    (lambda t: t.add_tokens(["hello"]), "not a plain special token"),
    (lambda t: t.add_special_tokens(["<|endoftext|>x"]), "prefix"),
])
def test_unrepresentable_pipelines_are_refused_and_fall_back_to_hugging_face(change, message):
    tokenizer = byte_level_bpe([("a", "b"), ("ab", "c")])
    change(tokenizer)
    with pytest.raises(NotRepresentable, match=message):
        build_encoding(tokenizer)
    tok = BPETokenizer(tokenizer)
    text = "abc abc hello"
    assert tok.encode(text).ids.tolist() == hf_ids(tok, text)
    assert message in tok._fast.reason


def test_without_tiktoken_the_engine_steps_aside(monkeypatch):
    monkeypatch.setattr(tiktoken_engine, "tiktoken", None)
    engine = TiktokenEngine()
    assert engine.encode(byte_level_bpe([("a", "b")]), "ab") is None
    assert "not installed" in engine.reason
