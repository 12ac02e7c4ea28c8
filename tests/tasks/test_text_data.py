"""TextDataModule: built-in corpus, cached token file, windows, held-out splits (validation
tail, test files), bad input; a built-in corpus that starts with chosen packages, and the
shipped pretraining recipes' corpora, which cover the fine-tuning packages but none of the
docstrings the fine-tuning recipes label."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from tasks import BERTDataModule, DocstringDataModule, TextDataModule, stdlib_source_files
from tasks.data.docstrings import docstring_key, package_of
from tasks.data.text import read_texts, split_test_files, stdlib_test_files
from tokenizers_mm import BPETokenizer

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_builtin_corpus_is_the_standard_library_source():
    files = stdlib_source_files(max_bytes=100_000)
    assert files and all(f.suffix == ".py" for f in files)
    assert sum(f.stat().st_size for f in files) <= 100_000 or len(files) == 1
    assert files == stdlib_source_files(max_bytes=100_000)  # a fixed order


def test_the_builtin_corpus_can_start_with_chosen_packages():
    files = stdlib_source_files(max_bytes=400_000, first=["logging", "json"])
    packages = [package_of(f)[0] for f in files]
    assert packages[0] == "logging" and set(packages[:packages.index("json")]) == {"logging"}
    rest = [f for f, p in zip(files, packages) if p not in ("logging", "json")]
    others = [f for f in stdlib_source_files(None) if package_of(f)[0] not in ("logging", "json")]
    assert rest and rest == others[:len(rest)]  # then the others, in their usual order
    test = stdlib_test_files(400_000, 40_000, first=["logging", "json"])
    assert test and not set(test) & set(files)
    with pytest.raises(ValueError, match="no standard-library source"):
        stdlib_source_files(1000, first=["no_such_package"])


@pytest.mark.parametrize("pretrain, finetune", [("bert/mlm_tiny", "bert/finetune_cls"),
                                                ("gpt/tiny", "gpt/finetune_cls")])
def test_pretraining_text_covers_the_fine_tuning_packages_but_holds_none_of_their_labelled_docstrings(
        pretrain, finetune, tmp_path):
    data = yaml.safe_load((CONFIGS / f"{pretrain}.yaml").read_text())["data"]
    labelled = yaml.safe_load((CONFIGS / f"{finetune}.yaml").read_text())["data"]["init_args"]
    options = {k: data["init_args"][k] for k in ("builtin_max_bytes", "builtin_first", "held_out_docstrings")}
    module = {"tasks.BERTDataModule": BERTDataModule, "tasks.TextDataModule": TextDataModule}[data["class_path"]]
    source = module(**options, cache_dir=str(tmp_path)).source_files()
    covered = {package_of(f)[0] for f in stdlib_source_files(options["builtin_max_bytes"], options["builtin_first"])}
    assert set(labelled["packages"]) <= covered  # every fine-tuning package's code is read
    text = docstring_key(" ".join(read_texts(source)))
    keys = {docstring_key(d.text) for d in DocstringDataModule(packages=labelled["packages"],
                                                               cache_dir=str(tmp_path)).docstrings()}
    assert len(keys) > 1000 and not [k for k in keys if k in text]
    raw = docstring_key(" ".join(read_texts(stdlib_source_files(options["builtin_max_bytes"], options["builtin_first"]))))
    assert sum(k in raw for k in keys) > 0.95 * len(keys)  # without held_out_docstrings they would all be there


@pytest.fixture
def corpus(tmp_path):
    text = "".join(f"def function_{i}(x):\n    return x * {i} + {i % 7}\n\n" for i in range(2000))
    path = tmp_path / "code.txt"
    path.write_text(text)
    return path


def test_user_files_become_cached_windows(tmp_path, corpus):
    dm = TextDataModule(files=[str(corpus)], vocab_size=300, context_length=16, batch_size=4,
                        train_samples=40, cache_dir=str(tmp_path / "cache"))
    dm.prepare_data()
    assert dm.vocab_size <= 300 and dm.eos_token_id == dm.tokenizer.eos_id
    batch = next(iter(dm.train_dataloader()))
    assert batch["input_ids"].shape == (4, 16) and batch["input_ids"].dtype == torch.long
    assert torch.equal(batch["input_ids"][:, 1:], batch["labels"][:, :-1])  # labels are inputs shifted by one
    # The cached token file is the corpus, tokenized: decoding a window gives corpus text back.
    window = dm.train_dataset()[0]["input_ids"]
    assert dm.tokenizer.decode(window) in corpus.read_text()
    # A second module over the same inputs reuses the cache (same token file, no retraining).
    again = TextDataModule(files=[str(corpus)], vocab_size=300, context_length=16, cache_dir=str(tmp_path / "cache"))
    assert again.tokenizer.vocab_size == dm.vocab_size and again._token_file == dm._token_file


def test_a_tokenizer_replaced_in_its_folder_gets_a_token_file_of_its_own(tmp_path, corpus):
    # the token cache is keyed by the tokenizer's contents, not by the folder's name
    folder = tmp_path / "tokenizer"

    def windows_with(tokenizer: BPETokenizer) -> TextDataModule:
        tokenizer.save(folder)
        dm = TextDataModule(files=[str(corpus)], tokenizer=str(folder), context_length=16,
                            cache_dir=str(tmp_path / "cache"))
        dm.prepare_data()
        return dm

    small = windows_with(BPETokenizer.train(iterator=[corpus.read_text()], vocab_size=300))
    large = windows_with(BPETokenizer.train(iterator=[corpus.read_text()], vocab_size=400))
    assert small.vocab_size == 300 and large.vocab_size == 400 and large._token_file != small._token_file
    window = large.train_dataset()[0]["input_ids"]
    assert large.tokenizer.decode(window) in corpus.read_text()  # the new tokenizer's ids
    assert windows_with(small.tokenizer)._token_file == small._token_file  # the same tokenizer again: reused


def test_validation_is_a_held_out_tail(tmp_path, corpus):
    dm = TextDataModule(files=[str(corpus)], vocab_size=300, context_length=16, val_fraction=0.1,
                        cache_dir=str(tmp_path / "cache"))
    cut, end = dm._split()
    train, val = dm.train_dataset(), dm.val_dataset()
    assert int(train.offsets.max()) + 17 <= cut
    assert int(val.offsets.min()) >= cut and int(val.offsets.max()) + 17 <= end
    assert np.all(np.diff(val.offsets) == 16)


def test_builtin_test_split_is_the_files_after_the_corpus(tmp_path):
    dm = TextDataModule(builtin_max_bytes=60_000, vocab_size=300, context_length=16, batch_size=4,
                        cache_dir=str(tmp_path / "cache"))
    source, test = dm.source_files(), dm.test_source_files()
    assert source == stdlib_source_files(60_000)  # training and validation text: as without a test split
    assert test and not set(source) & set(test)  # disjoint by file
    assert 0 < sum(f.stat().st_size for f in test) <= 6_000  # test_fraction (0.1) of builtin_max_bytes
    assert test == stdlib_test_files(60_000, 6_000) == TextDataModule(builtin_max_bytes=60_000).test_source_files()
    # The test windows are the test files' tokens, consecutive, in their own token file.
    windows = dm.dataset("test")
    assert len(windows) > 0 and windows.path != dm.val_dataset().path == dm.train_dataset().path
    first_file = next(dm.tokenizer.iter_ids([test[0].read_text(encoding="utf-8", errors="replace")]))
    assert windows[0]["input_ids"].tolist() == first_file[:16]
    # `unitok test` reads them, and validation still reads the tail of the training stream.
    assert torch.equal(next(iter(dm.test_dataloader()))["input_ids"][0], windows[0]["input_ids"])
    assert not torch.equal(next(iter(dm.val_dataloader()))["input_ids"][0], windows[0]["input_ids"])


def write_files(folder, n):
    folder.mkdir()
    paths = []
    for k in range(n):
        path = folder / f"part{k:02d}.txt"
        path.write_text("".join(f"def f_{k}_{i}(x):\n    return x * {i} + {k}\n\n" for i in range(150)))
        paths.append(path)
    return paths


def test_users_last_files_are_the_test_split(tmp_path):
    files = write_files(tmp_path / "text", 12)  # equal sizes: 1 of 12 is at most 10 %
    dm = TextDataModule(files=list(map(str, files)), vocab_size=300, context_length=16, batch_size=4,
                        cache_dir=str(tmp_path / "cache"))
    assert dm.source_files() == files[:11] and dm.test_source_files() == files[11:]
    assert split_test_files(files, None, 0.1) == (files[:11], files[11:])  # the same every time
    assert split_test_files(files, None, 0.3) == (files[:9], files[9:])
    assert split_test_files(files, None, 0.0) == (files, [])  # 0: no test split
    assert split_test_files(files[:1], None, 0.5) == (files[:1], [])  # one file: never all of it
    stream = dm.tokenizer.decode(np.fromfile(dm.train_dataset().path, dtype=dm._dtype).tolist())
    assert "def f_10_" in stream and "def f_11_" not in stream  # the test file is not in the training stream
    assert "def f_11_" in dm.tokenizer.decode(next(iter(dm.test_dataloader()))["input_ids"][0])
    # Explicit test files leave `files` whole; a file in both is an error.
    own = TextDataModule(files=list(map(str, files[:3])), test_files=[str(files[5])], vocab_size=300,
                         context_length=16, cache_dir=str(tmp_path / "cache"))
    assert own.source_files() == files[:3] and own.test_source_files() == [files[5]]
    with pytest.raises(ValueError, match="must not be training"):
        TextDataModule(files=[str(files[0])], test_files=[str(files[0])]).source_files()


def test_one_user_file_has_no_test_split_and_tests_on_validation(tmp_path, corpus):
    dm = TextDataModule(files=[str(corpus)], vocab_size=300, context_length=16, batch_size=4,
                        cache_dir=str(tmp_path / "cache"))
    assert dm.dataset("test") is None
    assert torch.equal(next(iter(dm.test_dataloader()))["input_ids"], next(iter(dm.val_dataloader()))["input_ids"])


def test_bad_data_arguments_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        TextDataModule(files=[str(tmp_path / "missing.txt")])
    with pytest.raises(ValueError, match="empty list"):
        TextDataModule(files=[])
    with pytest.raises(ValueError, match="val_fraction"):
        TextDataModule(val_fraction=1.5)
    with pytest.raises(ValueError, match="test_fraction"):
        TextDataModule(test_fraction=1.0)
    with pytest.raises(FileNotFoundError, match="test files not found"):
        TextDataModule(test_files=[str(tmp_path / "missing.txt")])
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("x = 1\n")
    dm = TextDataModule(files=[str(tiny)], vocab_size=270, context_length=64, cache_dir=str(tmp_path / "c"))
    with pytest.raises(ValueError, match="fewer than context_length"):
        dm.train_dataset()


def test_a_file_listed_twice_is_refused_naming_it(tmp_path, corpus, monkeypatch):
    small = tmp_path / "small.txt"
    small.write_text(corpus.read_text()[:15_000])
    monkeypatch.chdir(tmp_path)
    for files in ([corpus, small, small], [corpus, small, Path("small.txt")]):  # as resolved paths
        with pytest.raises(ValueError, match="small.txt is given twice in files"):
            TextDataModule(files=list(map(str, files)), cache_dir=str(tmp_path / "cache"))
        with pytest.raises(ValueError, match="small.txt is given twice in files"):
            BERTDataModule(files=list(map(str, files)), cache_dir=str(tmp_path / "cache"))
        with pytest.raises(ValueError, match="small.txt is given twice in files"):
            split_test_files(files, None, 0.1)  # else the repeat would be a test file and a training one
    with pytest.raises(ValueError, match="small.txt is given twice in test_files"):
        TextDataModule(files=[str(corpus)], test_files=[str(small), str(small)], cache_dir=str(tmp_path / "cache"))


def test_train_samples_fill_at_least_one_training_batch(tmp_path, corpus):
    from tasks.data.t5 import SpanCorruptionDataModule

    for module in (TextDataModule, SpanCorruptionDataModule):
        for bad in (0, -3, 2.5):
            with pytest.raises(ValueError, match="train_samples must be an integer ≥ 1"):
                module(files=[str(corpus)], train_samples=bad, cache_dir=str(tmp_path))
        with pytest.raises(ValueError, match="train_samples=10 is fewer than batch_size=32"):
            module(files=[str(corpus)], train_samples=10, batch_size=32, cache_dir=str(tmp_path))
    dm = TextDataModule(files=[str(corpus)], vocab_size=300, context_length=16, batch_size=4, train_samples=4,
                        cache_dir=str(tmp_path))
    assert len(dm.train_dataloader()) == 1  # one full batch: the least an epoch holds
