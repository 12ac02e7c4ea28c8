"""TextDataModule: built-in corpus, cached token file, windows, held-out split, bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tasks import TextDataModule, stdlib_source_files


def test_builtin_corpus_is_the_standard_library_source():
    files = stdlib_source_files(max_bytes=100_000)
    assert files and all(f.suffix == ".py" for f in files)
    assert sum(f.stat().st_size for f in files) <= 100_000 or len(files) == 1
    assert files == stdlib_source_files(max_bytes=100_000)  # a fixed order


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


def test_validation_is_a_held_out_tail(tmp_path, corpus):
    dm = TextDataModule(files=[str(corpus)], vocab_size=300, context_length=16, val_fraction=0.1,
                        cache_dir=str(tmp_path / "cache"))
    cut, end = dm._split()
    train, val = dm.train_dataset(), dm.val_dataset()
    assert int(train.offsets.max()) + 17 <= cut
    assert int(val.offsets.min()) >= cut and int(val.offsets.max()) + 17 <= end
    assert np.all(np.diff(val.offsets) == 16)


def test_bad_data_arguments_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        TextDataModule(files=[str(tmp_path / "missing.txt")])
    with pytest.raises(ValueError, match="empty list"):
        TextDataModule(files=[])
    with pytest.raises(ValueError, match="val_fraction"):
        TextDataModule(val_fraction=1.5)
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("x = 1\n")
    dm = TextDataModule(files=[str(tiny)], vocab_size=270, context_length=64, cache_dir=str(tmp_path / "c"))
    with pytest.raises(ValueError, match="fewer than context_length"):
        dm.train_dataset()
