"""Docstrings as labelled text, and corpora without them: one key finds a docstring's repeats
whatever its whitespace, case or punctuation; `strip_docstrings` cuts exactly the docstrings
(and comments) that hold a key, leaving valid Python; `without_docstrings` copies only the
files it changes; the labelled examples are distinct texts, and splits never share one."""

from __future__ import annotations

import ast

import yaml

from tasks.data import docstrings
from tasks.data.docstrings import (
    Docstring,
    docstring_key,
    extract_docstrings,
    strip_docstrings,
    without_docstrings,
)
from tasks.data.labelled_text import DocstringDataModule, distinct_docstrings, near_copy_families
from tasks.data.text import stdlib_package_files

SOURCE = '''"""Module docstring: tools for the café."""
# Return the event loop for this context.
import os


class Loop:
    """Return the   event loop
    for this context.

    More words after the first paragraph.
    """

    def run(self):
        """Run forever."""
        x = "Return the event loop for this context."  # a string, not a docstring
        return x


def f(): """RETURN the event-loop, for this context!"""
'''


def test_one_key_for_a_text_whatever_its_whitespace_case_and_punctuation():
    key = docstring_key("Return the event loop for this context.")
    assert key == "return the event loop for this context"
    assert docstring_key("RETURN the   event-loop,\n  for this context!") == key
    assert docstring_key("Return the event loop for that context.") != key


def test_strip_docstrings_cuts_the_docstrings_and_comments_holding_a_key_and_nothing_else():
    stripped = strip_docstrings(SOURCE, [docstring_key("Return the event loop for this context.")])
    tree = ast.parse(stripped)  # still valid Python
    loop = next(n for n in tree.body if isinstance(n, ast.ClassDef))
    run = next(n for n in loop.body if isinstance(n, ast.FunctionDef))
    f = next(n for n in tree.body if isinstance(n, ast.FunctionDef))
    assert ast.get_docstring(loop) is None and ast.get_docstring(f) is None  # multi-line and one-line ones
    assert ast.get_docstring(run) == "Run forever." and ast.get_docstring(tree).startswith("Module docstring")
    assert "More words" not in stripped  # the whole docstring goes, not its first paragraph only
    assert "# Return the event loop" not in stripped and "#\nimport os" in stripped
    assert 'x = "Return the event loop for this context."' in stripped  # code is never touched
    assert strip_docstrings(SOURCE, [docstring_key("Module docstring: tools for the café.")]).startswith("...\n#")
    assert strip_docstrings(SOURCE, ["no such words"]) == SOURCE
    assert strip_docstrings("def broken(:\n", ["broken"]) == "def broken(:\n"  # not Python: kept as it is


def test_lines_are_counted_as_python_counts_them_past_a_form_feed(tmp_path, monkeypatch):
    # str.splitlines would end a line at \f too, one more than ast counts, so rows after it shift
    source = 'import os\n\f\ndef run(self):\n    """Return the event loop for this context."""\n    # café\n'
    key = docstring_key("Return the event loop for this context.")
    assert strip_docstrings(source, [key]) == 'import os\n\f\ndef run(self):\n    ...\n    # café\n'
    assert strip_docstrings(source, ["cafe", "café"]) == source.replace("# café", "#")
    (tmp_path / "m.py").write_text(source, encoding="utf-8")
    monkeypatch.setattr(docstrings, "package_of", lambda path: ("pkg", "pkg.m"))  # a file outside the stdlib
    assert [d.signature for d in extract_docstrings([tmp_path / "m.py"])] == ["def run(self):"]


def test_without_docstrings_copies_only_the_files_it_changes(tmp_path):
    (tmp_path / "a.py").write_text(SOURCE)
    (tmp_path / "b.py").write_text('def g():\n    """Nothing to hide here."""\n')
    files = [tmp_path / "a.py", tmp_path / "b.py"]
    key = docstring_key("Run forever.")
    out = without_docstrings(files, [key], tmp_path / "cache")
    assert out[1] == files[1] and out[0] != files[0] and out[0].parent.parent == tmp_path / "cache"
    assert key not in docstring_key(out[0].read_text()) and key in docstring_key(SOURCE)
    assert without_docstrings(files, [key], tmp_path / "cache") == out  # cached: the same copies


def test_distinct_docstrings_keep_one_of_each_text_and_drop_texts_of_two_packages():
    def doc(text: str, package: str, name: str) -> Docstring:
        return Docstring(text, package, package, f"def {name}():", name)

    docs = [doc("Close the transport.", "asyncio", "a"), doc("close the  transport", "asyncio", "b"),
            doc("Return the header.", "email", "c"), doc("Return the header!", "logging", "d"),
            doc("Emit a record.", "logging", "e")]
    assert [d.name for d in distinct_docstrings(docs)] == ["a", "e"]


def test_docstring_splits_share_no_text_even_up_to_whitespace_case_and_punctuation(tmp_path):
    packages = ["asyncio", "email", "logging", "tkinter"]
    raw = extract_docstrings(stdlib_package_files(packages))
    assert len({docstring_key(d.text) for d in raw}) < len(raw)  # the standard library does repeat itself
    dm = DocstringDataModule(packages=packages, train_per_class=16, val_per_class=25, test_per_class=100,
                             cache_dir=str(tmp_path))
    keys = {name: [docstring_key(e["text"]) for e in split] for name, split in dm.splits().items()}
    every = keys["train"] + keys["val"] + keys["test"]
    assert len(every) == 4 * (16 + 25 + 100) and len(set(every)) == len(every)
    # nor near-copies: templated docstrings one word apart are one family, drawn once
    families = near_copy_families(every)
    assert len(set(families.values())) == len(every)


def test_near_copies_one_word_apart_are_one_family_kept_once():
    def doc(text: str, package: str, name: str) -> Docstring:
        return Docstring(text, package, package, f"def {name}():", name)

    docs = [doc("Construct a ttk Button with parent master.", "tkinter", "a"),
            doc("Construct a ttk Label with parent master.", "tkinter", "b"),  # a word replaced
            doc("Construct a ttk Label widget with parent master.", "tkinter", "c"),  # then one added
            doc("Log a message with severity DEBUG on the root logger.", "logging", "d"),
            doc("Log a message with severity INFO on the root logger.", "email", "e"),  # another package
            doc("Return the number of bytes in the buffer.", "asyncio", "f"),
            doc("Return the number of lines read so far.", "asyncio", "g")]  # several words apart
    assert [d.name for d in distinct_docstrings(docs)] == ["a", "f", "g"]


def test_the_fine_tuning_recipes_are_low_resource(tmp_path):
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "configs"
    for recipe in ("bert/finetune_cls", "gpt/finetune_cls"):
        data = yaml.safe_load((root / f"{recipe}.yaml").read_text())["data"]["init_args"]
        assert data["train_per_class"] <= 32, recipe
    dm = DocstringDataModule(packages=data["packages"], train_per_class=data["train_per_class"],
                             val_per_class=data["val_per_class"], test_per_class=data["test_per_class"],
                             cache_dir=str(tmp_path))
    labels = [e["label"] for e in dm.splits()["train"]]
    assert sorted(labels) == sorted(list(range(len(data["packages"]))) * data["train_per_class"])


def test_docstring_match_pairs_read_each_docstring_in_one_split_only(tmp_path):
    dm = DocstringDataModule(task="match", cache_dir=str(tmp_path))
    splits = dm.splits()
    read = {name: {docstring_key(e["pair"]) for e in split} for name, split in splits.items()}
    assert not read["train"] & read["val"] and not read["train"] & read["test"] and not read["val"] & read["test"]
    for split in ("val", "test"):  # negatives drawn within the split, the classes still balanced
        assert sorted(e["label"] for e in splits[split]) == [0] * 50 + [1] * 50
    # A negative's docstring is a positive's of the same split, or another negative's own.
    positives = {docstring_key(e["pair"]) for e in splits["train"] if e["label"] == 1}
    assert any(docstring_key(e["pair"]) in positives for e in splits["train"] if e["label"] == 0)
    again = DocstringDataModule(task="match", cache_dir=str(tmp_path)).splits()
    other = DocstringDataModule(task="match", seed=1, cache_dir=str(tmp_path)).splits()
    assert again == splits and other["train"] != splits["train"]  # seeded


def test_qa_questions_and_code_lines_are_each_in_one_split(tmp_path):
    from tasks.data.labelled_text import CodeTokensDataModule, DocstringQADataModule

    qa = DocstringQADataModule(cache_dir=str(tmp_path)).splits()
    asked = {name: [docstring_key(e["question"]) for e in split] for name, split in qa.items()}
    every = asked["train"] + asked["val"] + asked["test"]
    assert len(set(every)) == len(every)
    code = CodeTokensDataModule(cache_dir=str(tmp_path)).splits()
    lines = {name: [tuple(e["words"]) for e in split] for name, split in code.items()}
    every = lines["train"] + lines["val"] + lines["test"]
    assert len(every) == 2000 + 200 + 200 and len(set(every)) == len(every)
