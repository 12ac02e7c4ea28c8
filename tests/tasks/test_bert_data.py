"""BERT pretraining data: the masking statistics (15 % selected; 80 / 10 / 10 of them), special
tokens and padding never selected, whole-word masking, NSP pairs (50 % real next lines), test
documents from files outside training and validation, and the built-in labelled data (real labels, splits, first-sub-token alignment)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tasks.data.bert import (
    BERTDataModule,
    LineCorpus,
    MaskingCollator,
    SentencePairs,
    mask_tokens,
    prepare_wordpiece_corpus,
    wordpiece_key,
)
from tasks.data.labelled_text import (
    TOKEN_CLASSES,
    CodeTokensDataModule,
    DocstringDataModule,
    DocstringQADataModule,
    classify_token,
)
from tokenizers_mm import WordPieceTokenizer

V, MASK, PAD, CLS, SEP = 1000, 4, 0, 2, 3
SPECIAL = [0, 1, 2, 3, 4]


def random_batch(B=64, N=128, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, V, (B, N), generator=g)
    lengths = torch.randint(N // 2, N + 1, (B,), generator=g)
    mask = (torch.arange(N)[None] < lengths[:, None]).long()
    ids[:, 0] = CLS
    ids[torch.arange(B), lengths - 1] = SEP
    ids[:, N // 3] = SEP  # a pair separator inside every row
    ids[mask == 0] = PAD
    return ids, mask


def test_masking_rates_hold_over_many_draws():
    ids, mask = random_batch()
    eligible = mask.bool() & (ids >= 5)
    g = torch.Generator().manual_seed(1)
    counts = dict(selected=0, eligible=0, masked=0, random=0, kept=0)
    for _ in range(40):  # ≈ 40 × 6,000 eligible tokens
        out, labels = mask_tokens(ids, mask, SPECIAL, MASK, V, generator=g)
        selected = labels != -100
        counts["selected"] += int(selected.sum())
        counts["eligible"] += int(eligible.sum())
        counts["masked"] += int((selected & (out == MASK)).sum())
        counts["kept"] += int((selected & (out == ids)).sum())
        counts["random"] += int((selected & (out != MASK) & (out != ids)).sum())
        assert torch.equal(labels[selected], ids[selected])
        assert torch.equal(out[~selected], ids[~selected])  # unselected tokens untouched
        assert not selected[~eligible].any()  # [CLS], [SEP], padding never selected
        assert not torch.isin(out[selected & (out != MASK)], torch.tensor(SPECIAL)).any()
    sel = counts["selected"]
    assert abs(sel / counts["eligible"] - 0.15) < 0.005
    assert abs(counts["masked"] / sel - 0.80) < 0.01
    # A random replacement equals the original with probability ≈ 1/995: "kept" absorbs it.
    assert abs(counts["random"] / sel - 0.10) < 0.01
    assert abs(counts["kept"] / sel - 0.10) < 0.01


@pytest.mark.parametrize("rates", [(0.3, 0.5, 0.5), (0.1, 1.0, 0.0), (0.2, 0.0, 0.0)])
def test_every_rate_is_configurable(rates):
    p, mask_ratio, random_ratio = rates
    ids, mask = random_batch(seed=2)
    g = torch.Generator().manual_seed(3)
    selected = masked = randomised = 0
    for _ in range(20):
        out, labels = mask_tokens(ids, mask, SPECIAL, MASK, V, p, mask_ratio, random_ratio, generator=g)
        s = labels != -100
        selected += int(s.sum())
        masked += int((s & (out == MASK)).sum())
        randomised += int((s & (out != MASK) & (out != ids)).sum())
    eligible = int((mask.bool() & (ids >= 5)).sum()) * 20
    assert abs(selected / eligible - p) < 0.01
    assert abs(masked / selected - mask_ratio) < 0.02
    assert abs(randomised / selected - random_ratio) < 0.02


def test_whole_word_masking_selects_every_piece_of_a_word():
    continuation = torch.zeros(V, dtype=torch.bool)
    continuation[500:] = True  # ids ≥ 500 are "##" pieces
    ids, mask = random_batch(B=16, seed=4)
    g = torch.Generator().manual_seed(5)
    total = eligible_total = 0
    for _ in range(8):
        out, labels = mask_tokens(ids, mask, SPECIAL, MASK, V, continuation=continuation, generator=g)
        selected = labels != -100
        eligible = mask.bool() & (ids >= 5)
        for row in range(ids.shape[0]):  # a word = a start piece and the continuations after it
            word = 0
            words: dict[int, list[int]] = {}
            for j in range(ids.shape[1]):
                if not eligible[row, j]:
                    word += 1
                    continue
                if not continuation[ids[row, j]]:
                    word += 1
                words.setdefault(word, []).append(j)
            for positions in words.values():
                picked = {bool(selected[row, j]) for j in positions}
                assert len(picked) == 1  # all pieces of a word, or none
        total += int(selected.sum())
        eligible_total += int(eligible.sum())
    assert 0.10 < total / eligible_total < 0.20


def test_bad_rates_are_refused():
    ids, mask = random_batch(B=2, N=8)
    with pytest.raises(ValueError, match="mlm_probability must be in"):
        mask_tokens(ids, mask, SPECIAL, MASK, V, mlm_probability=1.5)
    with pytest.raises(ValueError, match="exceeds 1"):
        MaskingCollator(V, MASK, PAD, SPECIAL, mask_ratio=0.8, random_ratio=0.3)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> BERTDataModule:
    dm = BERTDataModule(builtin_max_bytes=300_000, vocab_size=600, context_length=48, batch_size=8,
                        train_samples=400, val_samples=64, cache_dir=str(tmp_path_factory.mktemp("cache")))
    dm.prepare_data()
    return dm


def test_sentence_pairs_are_half_real_next_lines(data):
    ds = data.train_dataset()
    tok = data.tokenizer
    labels = []
    for i in range(400):
        ex = ds[i]
        ids, seg = ex["input_ids"], ex["segment_ids"]
        assert len(ids) <= 48 and ids[0] == tok.cls_id and ids[-1] == tok.sep_id
        assert ids.count(tok.sep_id) == 2 and seg[0] == 0 and seg[-1] == 1
        assert seg == sorted(seg)  # A then B
        labels.append(ex["nsp_label"])
    assert abs(sum(labels) / len(labels) - 0.5) < 0.07
    assert ds[7] == ds[7]  # reproducible


def test_real_next_sentence_follows_in_the_corpus(data):
    ds = data.train_dataset()
    corpus_text = " " + " ".join(map(str, data.corpus.tokens[:].tolist())) + " "
    real = [ex for ex in (ds[i] for i in range(100)) if ex["nsp_label"] == 0]
    assert len(real) > 30
    for ex in real:  # A (cut at its start) runs straight on into B (cut at its end)
        ids = ex["input_ids"]
        sep = ids.index(data.tokenizer.sep_id)
        assert " " + " ".join(map(str, ids[1:sep] + ids[sep + 1:-1])) + " " in corpus_text


def test_a_not_next_b_comes_from_another_document_even_in_a_split_of_two():
    # Two documents of eight 3-token lines, ids 10-19 in the first and 20-29 in the second; with
    # only two documents BERT's ten tries all land on A's own one about once in 1,000 pairs.
    tokens = np.concatenate([np.arange(10, 34) % 10 + 10, np.arange(10, 34) % 10 + 20])
    corpus = LineCorpus(tokens, np.arange(0, 49, 3), np.array([0, 8, 16]))
    pairs = SentencePairs(corpus, 0, 2, 16, cls_id=2, sep_id=3, num_samples=5000, random_next=1.0)
    for i in range(len(pairs)):
        ex = pairs[i]
        ids, seg = ex["input_ids"], ex["segment_ids"]
        a = {t // 10 for t, s in zip(ids, seg, strict=True) if s == 0 and t >= 10}
        b = {t // 10 for t, s in zip(ids, seg, strict=True) if s == 1 and t >= 10}
        assert ex["nsp_label"] == 1 and len(a) == len(b) == 1 and a != b, (i, ids)


def test_collated_batch_never_masks_special_tokens_or_padding(data):
    batch = next(iter(data.train_dataloader()))
    assert set(batch) == {"input_ids", "attention_mask", "segment_ids", "labels", "nsp_labels"}
    selected = batch["labels"] != -100
    original = torch.where(selected, batch["labels"], batch["input_ids"])
    special = torch.isin(original, torch.tensor(data.tokenizer.special_ids))
    assert selected.any() and not (selected & special).any()
    assert not (selected & (batch["attention_mask"] == 0)).any()
    val_a = next(iter(data.val_dataloader()))
    val_b = next(iter(data.val_dataloader()))
    assert torch.equal(val_a["input_ids"], val_b["input_ids"])  # validation masks are fixed


def test_test_documents_are_files_outside_training_and_validation(data):
    source, test = data.source_files(), data.test_source_files()
    assert test and not set(source) & set(test)  # disjoint by file (a document is a file)
    assert test == BERTDataModule(builtin_max_bytes=300_000).test_source_files()  # the same every time
    ds = data.dataset("test")
    assert len(ds) == 64 and ds.corpus is not data.corpus  # val_samples examples from the test documents
    first = next(line for line in test[0].read_text().splitlines() if line.strip())
    assert ds.corpus.span(0, 1).tolist() == data.tokenizer.encode_batch_ids([first.strip()])[0]
    # `unitok test` reads them (with fixed masks), not the validation documents.
    a, b = next(iter(data.test_dataloader())), next(iter(data.test_dataloader()))
    assert torch.equal(a["input_ids"], b["input_ids"])
    assert not torch.equal(a["input_ids"], next(iter(data.val_dataloader()))["input_ids"])


def test_single_segment_mode_for_electra(tmp_path):
    dm = BERTDataModule(builtin_max_bytes=300_000, vocab_size=600, context_length=40, batch_size=4, nsp=False,
                        train_samples=8, cache_dir=str(tmp_path))
    batch = next(iter(dm.train_dataloader()))
    assert "nsp_labels" not in batch and not batch["segment_ids"].any()
    assert batch["input_ids"].shape[1] <= 40


# --------------------------------------------------------------------------- labelled data
@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("labelled"))


def test_docstring_packages_are_real_labels(cache):
    dm = DocstringDataModule(packages=["json", "calendar"], vocab_size=500, context_length=48, val_per_class=5,
                             train_per_class=10, cache_dir=cache)
    docs = dm.docstrings()
    assert {d.package for d in docs} == {"json", "calendar"}
    decoder = next(d for d in docs if d.name == "JSONDecoder")
    assert decoder.package == "json" and decoder.signature.startswith("class JSONDecoder")
    splits = dm.splits()
    assert len(splits["val"]) == 10 and len(splits["train"]) == 20
    assert not {id(e) for e in splits["val"]} & {id(e) for e in splits["train"]}
    batch = next(iter(dm.train_dataloader()))
    assert batch["labels"].tolist() and set(batch["labels"].tolist()) <= {0, 1} and dm.num_labels == 2
    with pytest.raises(ValueError, match="no standard-library source"):
        DocstringDataModule(packages=["json", "no_such_package"], cache_dir=cache).docstrings()


def test_docstring_match_pairs_use_segments(cache):
    dm = DocstringDataModule(task="match", packages=["json"], vocab_size=500, context_length=64, val_per_class=3,
                             cache_dir=cache)
    batch = next(iter(dm.train_dataloader()))
    assert batch["segment_ids"].any() and set(batch["labels"].tolist()) <= {0, 1}
    first = dm.tokenizer.decode(batch["input_ids"][0][batch["segment_ids"][0] == 0])
    assert first.startswith(("def", "class", "async"))


def test_code_tokens_follow_pythons_tokenizer(cache):
    import io
    import tokenize

    toks = list(tokenize.generate_tokens(io.StringIO("if x: print(len(y), 3)  # hi\n").readline))
    names = [TOKEN_CLASSES[c] for c in map(classify_token, toks) if c is not None]
    assert names == ["keyword", "name", "operator", "builtin", "operator", "builtin", "operator", "name",
                     "operator", "operator", "number", "operator", "comment"]
    dm = CodeTokensDataModule(packages=["json"], vocab_size=500, context_length=48, train_per_class=20,
                              val_per_class=5, cache_dir=cache)
    batch = next(iter(dm.train_dataloader()))
    labelled = batch["labels"] != -100
    assert labelled.any() and int(batch["labels"][labelled].max()) < len(TOKEN_CLASSES)
    assert not labelled[:, 0].any()  # [CLS] carries no label


def test_qa_answer_span_is_the_documented_name(cache):
    dm = DocstringQADataModule(packages=["calendar"], vocab_size=500, context_length=96, n_candidates=3,
                               val_per_class=3, cache_dir=cache)
    example = dm.splits()["train"][0]
    encoded = dm._encode(example)
    start, end = encoded["start_positions"], encoded["end_positions"]
    assert 0 < start <= end and encoded["segment_ids"][start] == 1
    answer = dm.tokenizer.decode(encoded["input_ids"][start:end + 1]).replace(" ", "")
    assert answer == example["name"]


def test_code_tokens_refuse_a_line_count_below_one_and_name_lines_when_short(cache):
    for bad in (0, -5, 2.5):
        with pytest.raises(ValueError, match="max_lines must be an integer ≥ 1"):
            CodeTokensDataModule(packages=["json"], max_lines=bad, cache_dir=cache)
    dm = CodeTokensDataModule(packages=["json"], max_lines=30, val_per_class=200, cache_dir=cache)
    with pytest.raises(ValueError, match=r"the distinct source lines of the first max_lines=30: \d+ examples"):
        dm.splits()


def test_bert_train_samples_fill_at_least_one_training_batch(tmp_path):
    for bad in (0, -3):
        with pytest.raises(ValueError, match="train_samples must be an integer ≥ 1"):
            BERTDataModule(train_samples=bad, cache_dir=str(tmp_path))
    with pytest.raises(ValueError, match="train_samples=10 is fewer than batch_size=32"):
        BERTDataModule(train_samples=10, batch_size=32, cache_dir=str(tmp_path))


@pytest.mark.parametrize("saved_as", ["tokenizer.json", "vocab.txt"])
def test_a_tokenizer_replaced_in_its_folder_gets_a_cache_of_its_own(tmp_path, saved_as):
    text = tmp_path / "corpus.txt"
    text.write_text("alpha beta gamma\ndelta epsilon\n" * 50)

    def save_tokenizer(words: str, vocab_size: int) -> int:
        tok = WordPieceTokenizer.train(iterator=iter([words] * 20), vocab_size=vocab_size)
        tok.save(tmp_path / "tokenizer")
        if saved_as == "vocab.txt":  # a folder as BERT checkpoints ship it: vocab.txt and its config only
            (tmp_path / "tokenizer" / "tokenizer.json").unlink()
        return WordPieceTokenizer.load(tmp_path / "tokenizer").vocab_size

    first = save_tokenizer("alpha beta gamma delta epsilon", 60)
    tok, _ = prepare_wordpiece_corpus([text], tmp_path / "cache", str(tmp_path / "tokenizer"))
    assert tok.vocab_size == first
    second = save_tokenizer("zulu yankee xray whiskey victor", 70)  # another tokenizer, the same path
    assert second != first
    tok, _ = prepare_wordpiece_corpus([text], tmp_path / "cache", str(tmp_path / "tokenizer"))
    assert tok.vocab_size == second
    assert len(list((tmp_path / "cache").iterdir())) == 2
    assert wordpiece_key(None) is None  # no tokenizer: the cache key (and existing caches) stay as they were
