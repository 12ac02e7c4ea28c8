"""T5 data: the tokenizer's special tokens, span-corruption batches from the built-in corpus,
the built-in text-to-text tasks (right answers, held out by file, a test split from files
outside the corpus), users' JSONL, and clear
errors for unknown prefixes, targets that are too long, tokenizers without sentinels, and a
JSONL file or a user's input in two splits."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch

from tasks.data.span_corruption import restore_spans, sentinel_ids
from tasks.data.t5 import (
    SpanCorruptionDataModule,
    TextToTextCollator,
    TextToTextDataModule,
    builtin_text_to_text_examples,
    encode_inputs,
    held_out_files,
    load_jsonl_examples,
    prefix_of,
    train_t5_tokenizer,
)
from tokenizers_mm import BPETokenizer

SMALL = dict(builtin_max_bytes=150_000, vocab_size=400)

SOURCE = textwrap.dedent('''
    def add_numbers(first, second=2, *rest, scale, **options):
        """Add the numbers and scale the sum.

        More words here.
        """
        total = first + second
        return total * scale
''')


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("cache"))


def write_jsonl(path: Path, rows: list) -> str:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return str(path)


def test_the_tokenizer_has_t5s_special_tokens():
    tok = train_t5_tokenizer(["def f(x):\n    return x\n"] * 10, vocab_size=300, num_sentinels=5)
    assert (tok.pad_id, tok.eos_id) == (0, 1)
    assert sentinel_ids(tok) == [2, 3, 4, 5, 6]
    assert tok.id_to_token(2) == "<extra_id_0>"


def test_span_corruption_batches_from_the_builtin_corpus(cache):
    dm = SpanCorruptionDataModule(**SMALL, context_length=32, batch_size=4, train_samples=8, cache_dir=cache)
    dm.prepare_data()
    assert (dm.pad_token_id, dm.eos_token_id) == (0, 1) and dm.vocab_size == 400
    batch = next(iter(dm.train_dataloader()))
    assert batch["input_ids"].shape[0] == 4 and batch["labels"].shape[0] == 4
    assert (batch["labels"] == 1).sum(dim=1).tolist() == [1, 1, 1, 1]  # one EOS per target
    # 32 raw tokens: 5 noise tokens in 2 spans -> 32 - 5 + 2 + EOS inputs, 5 + 3 sentinels + EOS targets
    # (a span wrapping around the end adds one sentinel to each).
    assert batch["input_ids"].shape[1] in (30, 31) and batch["labels"].shape[1] in (9, 10)

    first = dm.val_dataloader()
    a, b = next(iter(first)), next(iter(dm.val_dataloader()))
    assert all(torch.equal(a[k], b[k]) for k in a)  # validation masks are fixed
    window = dm.val_dataset()[0]["input_ids"].tolist()
    inputs = a["input_ids"][0][a["attention_mask"][0].bool()].tolist()
    targets = [t for t in a["labels"][0].tolist() if t != -100]
    assert restore_spans(inputs, targets, sentinel_ids(dm.tokenizer), eos=1) == window
    # The test split: windows of the standard-library files after the corpus, masked the same way every time.
    assert dm.test_source_files() and not set(dm.test_source_files()) & set(dm.source_files())
    t1, t2 = next(iter(dm.test_dataloader())), next(iter(dm.test_dataloader()))
    assert all(torch.equal(t1[k], t2[k]) for k in t1) and not torch.equal(t1["input_ids"], a["input_ids"])
    inputs = t1["input_ids"][0][t1["attention_mask"][0].bool()].tolist()
    targets = [t for t in t1["labels"][0].tolist() if t != -100]
    assert restore_spans(inputs, targets, sentinel_ids(dm.tokenizer), eos=1) == dm.dataset("test")[0]["input_ids"].tolist()


def test_span_corruption_refuses_a_tokenizer_without_sentinels(tmp_path, cache):
    plain = BPETokenizer.train(iterator=iter(["some text to learn from"] * 5), vocab_size=300)
    plain.save(tmp_path / "plain")
    dm = SpanCorruptionDataModule(**SMALL, tokenizer=str(tmp_path / "plain"), context_length=16, cache_dir=cache)
    with pytest.raises(ValueError, match="no sentinel tokens"):
        dm.prepare_data()


def test_span_corruption_refuses_too_few_sentinels_for_its_windows(cache):
    dm = SpanCorruptionDataModule(**SMALL, num_sentinels=3, context_length=128, cache_dir=cache)
    with pytest.raises(ValueError, match="context_length=128 need up to 8 sentinels but the tokenizer has 3"):
        dm.prepare_data()


def test_span_corruption_refuses_bad_settings(cache):
    with pytest.raises(ValueError, match=r"noise_density must be in \(0, 1\), got 0\.0$"):
        SpanCorruptionDataModule(noise_density=0.0, cache_dir=cache)
    with pytest.raises(ValueError, match="context_length=1 is too short"):
        SpanCorruptionDataModule(context_length=1, cache_dir=cache)


def test_builtin_tasks_give_the_right_answers(tmp_path):
    (tmp_path / "a.py").write_text(SOURCE)
    (tmp_path / "b.py").write_text("def other(x):\n    return x\n")
    splits = builtin_text_to_text_examples([tmp_path / "a.py", tmp_path / "b.py"], val_fraction=0.5)
    pairs = {(ex["input"], ex["target"]) for split in splits.values() for ex in split}
    assert ("name: Add the numbers and scale the sum.", "add_numbers") in pairs
    assert ("params: def add_numbers(first, second=2, *rest, scale, **options):",
            "first second rest scale options") in pairs
    assert ("identifiers: total = first + second", "total first second") in pairs
    assert ("identifiers: return total * scale", "total scale") in pairs
    assert ("params: def other(x):", "x") in pairs
    assert ("statement: total = first + second", "assignment") in pairs
    assert ("statement: return total * scale", "return") in pairs
    assert not any(p[0].startswith("identifiers: \"\"\"") for p in pairs)  # docstrings are not code lines
    assert len(splits["val"]) > 0 and len(splits["train"]) > 0  # one file each


def test_code_is_read_whole_on_lines_with_non_ascii_text_and_after_a_form_feed(tmp_path):
    # ast counts columns in UTF-8 bytes and ends lines at \n only (str.splitlines also at \f)
    (tmp_path / "a.py").write_text('greeting = "héllo"; n = len(greeting)\n\f\ndef wave(hand, café):\n'
                                   '    send(café, hand)\n', encoding="utf-8")
    (tmp_path / "b.py").write_text("def other(x):\n    return x\n")
    splits = builtin_text_to_text_examples([tmp_path / "a.py", tmp_path / "b.py"], val_fraction=0.5)
    pairs = {(ex["input"], ex["target"]) for split in splits.values() for ex in split}
    assert ("statement: n = len(greeting)", "assignment") in pairs
    assert ("identifiers: n = len(greeting)", "n len greeting") in pairs
    assert ("identifiers: send(café, hand)", "send café hand") in pairs
    assert ("params: def wave(hand, café):", "hand café") in pairs


def test_an_input_stays_in_the_first_split_it_occurs_in_whatever_its_answer(tmp_path):
    # The same docstring names `wait` in a training file and `_wait` in a held-out one: the
    # held-out copy is dropped, or the model would be scored on an input it trained on.
    (tmp_path / "a.py").write_text('def wait():\n    """Wait for it."""\n    return 1\n')
    (tmp_path / "b.py").write_text('def _wait():\n    """Wait for it."""\n    return 2\n')
    (tmp_path / "c.py").write_text('def go():\n    """Go on ahead."""\n    return 3\n')
    files = [tmp_path / "a.py", tmp_path / "b.py"]
    held_out = held_out_files(files, val_fraction=0.5)
    splits = builtin_text_to_text_examples(files, tasks=["name"], val_fraction=0.5, test_files=[tmp_path / "c.py"])
    first = "val" if tmp_path / "a.py" in held_out else "train"  # a.py is read first: its split keeps the input
    assert [(ex["input"], ex["target"]) for ex in splits[first]] == [("name: Wait for it.", "wait")]
    assert splits["train" if first == "val" else "val"] == []
    assert [(ex["input"], ex["target"]) for ex in splits["test"]] == [("name: Go on ahead.", "go")]


def test_builtin_splits_share_no_input(cache):
    examples = TextToTextDataModule(**SMALL, cache_dir=cache, val_per_task=None).examples()
    inputs = {split: {ex["input"] for ex in rows} for split, rows in examples.items()}
    assert inputs["train"] and inputs["val"]
    assert not inputs["train"] & inputs["val"]
    assert not (inputs["train"] | inputs["val"]) & inputs["test"]


def test_held_out_examples_come_from_held_out_files(cache):
    dm = TextToTextDataModule(**SMALL, cache_dir=cache, val_per_task=None)
    examples = dm.examples()
    train_files = {ex["source"] for ex in examples["train"]}
    val_files = {ex["source"] for ex in examples["val"]}
    assert val_files and train_files and not train_files & val_files
    pairs = {(ex["input"], ex["target"]) for ex in examples["train"]}
    assert not any((ex["input"], ex["target"]) in pairs for ex in examples["val"])
    files = dm._corpus_files()
    assert held_out_files(files) == held_out_files(list(reversed(files)))  # by hash, not by order


def test_test_examples_come_from_files_outside_the_corpus(cache, tmp_path):
    dm = TextToTextDataModule(**SMALL, cache_dir=cache, val_per_task=None)
    examples = dm.examples()
    root = dm._corpus_files()[0].parent
    test_files = {str(f.relative_to(root)) for f in dm._test_files()}
    sources = {split: {ex["source"] for ex in rows} for split, rows in examples.items()}
    assert sources["test"] and sources["test"] <= test_files  # non-empty, from the test files only
    assert not sources["test"] & (sources["train"] | sources["val"])  # disjoint by file
    seen = {(ex["input"], ex["target"]) for split in ("train", "val") for ex in examples[split]}
    assert not any((ex["input"], ex["target"]) in seen for ex in examples["test"])  # no trained pair
    again = TextToTextDataModule(**SMALL, cache_dir=str(tmp_path), val_per_task=None).examples()["test"]
    assert [ex["input"] for ex in again] == [ex["input"] for ex in examples["test"]]  # the same every time
    batch = next(iter(dm.test_dataloader()))
    assert batch["input_ids"].shape[0] == min(32, len(examples["test"]))
    assert torch.equal(batch["input_ids"][0][batch["attention_mask"][0].bool()],
                       torch.tensor(dm.encoded("test")[0]["input_ids"]))
    # Without a test split (test_fraction 0), `unitok test` scores the validation examples.
    assert TextToTextDataModule(**SMALL, cache_dir=cache, test_fraction=0.0).dataset("test") is None


def test_text_to_text_mixes_tasks_by_prefix(cache):
    dm = TextToTextDataModule(**SMALL, cache_dir=cache, batch_size=64, train_per_task=40, val_per_task=5)
    dm.prepare_data()
    assert dm.prefixes == ["identifiers", "name", "params", "statement"]
    assert (dm.vocab_size, dm.pad_token_id, dm.eos_token_id) == (400, 0, 1)
    train = dm.encoded("train")
    assert {ex["prefix"] for ex in train} == {"identifiers", "name", "params", "statement"}
    assert max(sum(ex["prefix"] == p for ex in train) for p in dm.prefixes) == 40
    batch = next(iter(dm.train_dataloader()))
    assert len(set(batch["prefix"])) >= 3  # one batch holds several tasks
    row = batch["labels"][0][batch["labels"][0] != -100].tolist()
    assert row[-1] == 1 and dm.tokenizer.decode(row[:-1]) == next(
        ex["target"] for ex in train if ex["labels"] == row)


def test_users_jsonl_examples(tmp_path, cache):
    rows = [{"input": f"double: {i}", "target": str(2 * i)} for i in range(40)]
    rows += [{"input": f"negate: {i}", "target": str(-i)} for i in range(40)]
    dm = TextToTextDataModule(jsonl=[write_jsonl(tmp_path / "train.jsonl", rows)], tokenizer=None, **SMALL,
                              cache_dir=cache, val_per_task=None)
    examples = dm.examples()
    assert len(examples["train"]) + len(examples["val"]) == 80 and examples["val"]
    assert dm.prefixes == ["double", "negate"]
    val = write_jsonl(tmp_path / "val.jsonl", [{"input": "double: 100", "target": "200"}])
    dm = TextToTextDataModule(jsonl=[str(tmp_path / "train.jsonl")], val_jsonl=[val], **SMALL, cache_dir=cache)
    assert [ex["target"] for ex in dm.examples()["val"]] == ["200"]
    assert dm.dataset("test") is None  # users' examples only: no test split unless test_jsonl
    test = write_jsonl(tmp_path / "test.jsonl", [{"input": "negate: 100", "target": "-100"}])
    dm = TextToTextDataModule(jsonl=[str(tmp_path / "train.jsonl")], test_jsonl=[test], **SMALL, cache_dir=cache)
    assert [ex["target"] for ex in dm.examples()["test"]] == ["-100"] and len(dm.dataset("test")) == 1


def test_jsonl_rows_end_at_newlines_only(tmp_path):
    # json.dumps(..., ensure_ascii=False) leaves U+2028 and U+0085 in a string as they are
    rows = [{"input": "say: a\u2028b", "target": "c\x85d"}, {"input": "say: e", "target": "f"}]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    examples = load_jsonl_examples([path])
    assert [(ex["input"], ex["target"]) for ex in examples] == [(r["input"], r["target"]) for r in rows]
    assert examples[1]["source"] == f"{path}:2"


def test_bad_jsonl_lines_are_errors_naming_the_line(tmp_path):
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"input": "a: b", "target": "c"}, "{not json"])
    with pytest.raises(ValueError, match=r"bad.jsonl:2 is not valid JSON"):
        load_jsonl_examples([bad])
    missing = write_jsonl(tmp_path / "missing.jsonl", [{"input": "a: b"}])
    with pytest.raises(ValueError, match=r"missing.jsonl:1: expected an object with non-empty"):
        load_jsonl_examples([missing])


def test_an_unknown_prefix_is_an_error_when_prefixes_are_restricted(tmp_path, cache):
    rows = [{"input": "double: 2", "target": "4"}, {"input": "triple: 2", "target": "6"}]
    path = write_jsonl(tmp_path / "t.jsonl", rows * 10)
    dm = TextToTextDataModule(jsonl=[path], allowed_prefixes=["double"], **SMALL, cache_dir=cache)
    with pytest.raises(ValueError, match=r"t.jsonl:2 has prefix 'triple'; allowed_prefixes=\['double'\]"):
        dm.examples()
    with pytest.raises(ValueError, match="built-in tasks \\['params'\\] have prefixes outside allowed_prefixes"):
        TextToTextDataModule(tasks=["name", "params"], allowed_prefixes=["name"], cache_dir=cache)
    dm = TextToTextDataModule(tasks=["name"], allowed_prefixes=["name"], **SMALL, cache_dir=cache)
    with pytest.raises(ValueError, match="predict input has no 'prefix: ' at its start"):
        dm.check_prefix("what is this", "predict input")
    with pytest.raises(ValueError, match="unknown built-in tasks \\['summarize'\\]"):
        TextToTextDataModule(tasks=["summarize"], cache_dir=cache)


def test_a_prefix_of_several_words_is_read_when_allowed_prefixes_name_it(tmp_path, cache):
    rows = [{"input": f"translate English to German: sentence {i}", "target": f"Satz {i}"} for i in range(20)]
    dm = TextToTextDataModule(jsonl=[write_jsonl(tmp_path / "t.jsonl", rows)],
                              allowed_prefixes=["translate English to German"], **SMALL, cache_dir=cache)
    assert dm.prefixes == ["translate English to German"]  # T5's own prefixes have spaces
    assert {ex["prefix"] for ex in dm.encoded("train")} == {"translate English to German"}
    with pytest.raises(ValueError, match=r"predict input has prefix 'translate English to French'; "
                                         r"allowed_prefixes=\['translate English to German'\]"):
        dm.check_prefix("translate English to French: Hello.", "predict input")  # not "no 'prefix: '"
    assert prefix_of("translate English to German: x", ["translate", "translate English to German"]) == \
        "translate English to German"  # the longest that is allowed
    assert prefix_of("translate English to German: x") is None  # without allowed prefixes: one word only


def test_a_target_longer_than_max_target_length_is_an_error_naming_the_example(tmp_path, cache):
    rows = [{"input": "spell: short", "target": "s h o r t"}] * 10
    rows.append({"input": "spell: long", "target": " ".join("a very long answer indeed " * 4)})
    path = write_jsonl(tmp_path / "t.jsonl", rows)
    val = write_jsonl(tmp_path / "v.jsonl", [{"input": "spell: tiny", "target": "t i n y"}])
    dm = TextToTextDataModule(jsonl=[path], val_jsonl=[val], max_target_length=20, **SMALL, cache_dir=cache)
    with pytest.raises(ValueError, match=r"example .*t.jsonl:11: the target has \d+ tokens .*max_target_length=20"):
        dm.prepare_data()
    dm = TextToTextDataModule(jsonl=[path], val_jsonl=[val], max_target_length=20, truncation=True, **SMALL,
                              cache_dir=cache)
    longest = max(dm.encoded("train"), key=lambda ex: len(ex["labels"]))
    assert len(longest["labels"]) == 20 and longest["labels"][-1] == dm.eos_token_id


def test_prefixes_and_encoder_inputs(cache):
    assert prefix_of("name: Return the size.") == "name"
    assert prefix_of("no prefix here") is None and prefix_of("two words: x") is None
    tok = TextToTextDataModule(**SMALL, cache_dir=cache).tokenizer
    enc = encode_inputs(tok, ["params: def f(x):", "name: Do it."])
    assert enc["input_ids"].shape == enc["attention_mask"].shape
    lengths = enc["attention_mask"].sum(dim=1)
    assert all(enc["input_ids"][i, n - 1] == tok.eos_id for i, n in enumerate(lengths.tolist()))
    batch = TextToTextCollator(pad_id=0)([{"input_ids": [5, 6, 1], "labels": [7, 1], "prefix": "a"},
                                          {"input_ids": [5, 1], "labels": [7, 8, 9, 1], "prefix": None}])
    assert batch["labels"].tolist() == [[7, 1, -100, -100], [7, 8, 9, 1]]
    assert batch["input_ids"].tolist() == [[5, 6, 1], [5, 1, 0]] and batch["prefix"] == ["a", ""]


def test_a_jsonl_file_given_twice_is_refused_naming_it(tmp_path, cache):
    path = write_jsonl(tmp_path / "t.jsonl", [{"input": f"upper: word{i}", "target": f"WORD{i}"} for i in range(20)])
    with pytest.raises(ValueError, match=r"t.jsonl is given in both jsonl and val_jsonl"):
        TextToTextDataModule(jsonl=[path], val_jsonl=[path], cache_dir=cache)
    with pytest.raises(ValueError, match=r"t.jsonl is given in both jsonl and test_jsonl"):
        TextToTextDataModule(jsonl=[path], test_jsonl=[str(tmp_path / "." / "t.jsonl")], cache_dir=cache)
    with pytest.raises(ValueError, match=r"t.jsonl is given twice in jsonl"):
        TextToTextDataModule(jsonl=[path, path], cache_dir=cache)


def test_a_users_input_in_two_splits_is_refused_with_a_count_and_an_example(tmp_path, cache):
    rows = [{"input": f"upper: word{i}", "target": f"WORD{i}"} for i in range(200)]
    train = write_jsonl(tmp_path / "train.jsonl", rows)
    test = write_jsonl(tmp_path / "test.jsonl", rows[:3] + [{"input": "upper: other", "target": "OTHER"}])
    dm = TextToTextDataModule(jsonl=[train], test_jsonl=[test], **SMALL, cache_dir=cache)
    with pytest.raises(ValueError, match=r"3 input\(s\) are in more than one split, "
                                         r"e.g. 'upper: word[012]' in (train|val) \(.*train.jsonl:[123]\), test \(.*test.jsonl:[123]\)"):
        dm.examples()
    # The hold-out from one file keeps every row of one input in one split (a hash of the input).
    repeated = write_jsonl(tmp_path / "repeated.jsonl", rows + [{**row, "target": row["target"].lower()} for row in rows])
    examples = TextToTextDataModule(jsonl=[repeated], **SMALL, cache_dir=cache, val_per_task=None).examples()
    assert examples["val"] and not {e["input"] for e in examples["train"]} & {e["input"] for e in examples["val"]}


def test_max_chars_below_one_is_refused_at_construction(cache):
    for bad in (0, -1):
        with pytest.raises(ValueError, match="max_chars must be an integer ≥ 1"):
            TextToTextDataModule(max_chars=bad, cache_dir=cache)
