"""Every built-in data module whose training content is made by code, or read from the
environment (the standard library's source and docstrings, CartPole's simulator and the
scripted policies, scikit-learn's digit scans, espeak-ng's audio), has a data key
(`SplitDataModule.data_key`, recorded in checkpoints): the same for the same settings and the
same content — in another instance, built afresh or read from its cache — and another as soon
as the training content differs (one docstring, one label, one episode, one scan, one token),
so a resumed fit on a corpus made otherwise since is refused by name. Keys are hashed once per
module (`content_key`, one helper for all), not at every checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch

from tasks.cli import main
from tasks.data import base, speech
from tasks.data import bert as bert_data
from tasks.data import t5 as t5_data
from tasks.data.base import content_key
from tasks.data.bert import BERTDataModule
from tasks.data.captions import CaptionedDigitsDataModule
from tasks.data.image import DigitsDataModule
from tasks.data.image_audio import ImageAudioPairsDataModule
from tasks.data.labelled_text import (
    CodeTokensDataModule,
    DocstringDataModule,
    DocstringQADataModule,
)
from tasks.data.t5 import SpanCorruptionDataModule, TextToTextDataModule, cached_t5_tokenizer
from tasks.data.text import TextDataModule, stdlib_source_files
from tasks.data.trajectories import TrajectoryDataModule, save_trajectories
from tokenizers_mm import Episode, WordPieceTokenizer

ROOT = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------- the shared helper
def test_a_content_key_is_the_same_in_every_process_and_reads_values_not_their_containers():
    parts = ({"text": "Return the sum.", "label": 2}, [1.5, None, True], np.arange(6, dtype=np.int32).reshape(2, 3),
             torch.tensor([0.25, -1.0]), Path("a/b.wav"), b"\x00\x01")
    # a fixed value: no Python hash() (salted per process), no memory addresses, no dict order
    assert content_key(*parts) == "7e9c2f13cba78225"
    assert content_key({"label": 2, "text": "Return the sum."}) == content_key({"text": "Return the sum.", "label": 2})
    assert content_key([1, 2]) == content_key((1, 2))
    assert content_key([np.zeros(3, np.float32)]) == content_key((np.zeros(3, np.float32),))


@pytest.mark.parametrize("other", [
    ({"text": "Return the sum!", "label": 2},),  # one character of a text
    ({"text": "Return the sum.", "label": 1},),  # a label
    (np.arange(6, dtype=np.int64).reshape(2, 3),),  # the same numbers in another dtype
    (np.arange(6, dtype=np.int32).reshape(3, 2),),  # or another shape
    (torch.tensor([0.25, -1.0], dtype=torch.float64),),
    ("1",), ([["a", "b"]],), ([["a"], ["b"]],),  # nesting and types are part of the value
])
def test_a_content_key_changes_with_any_part_of_the_content(other):
    keys = {content_key(x) for x in [({"text": "Return the sum.", "label": 2},), (np.arange(6, dtype=np.int32).reshape(2, 3),),
                                     (torch.tensor([0.25, -1.0]),), (1,), (["a", "b"],), (["a", ["b"]],), other]}
    assert len(keys) == 7


def test_a_content_key_of_something_it_cannot_read_is_an_error_naming_it():
    with pytest.raises(TypeError, match="got a set"):
        content_key([{1, 2}])
    with pytest.raises(TypeError, match="not of Python objects"):
        content_key(np.array([object()]))


# --------------------------------------------------------------------------- labelled text
def _alter_text(field: str):
    return lambda ex: {**ex, field: ex[field] + " (changed since)"}


def _alter_first_label(ex):
    return {**ex, "word_labels": [(ex["word_labels"][0] + 1) % 7, *ex["word_labels"][1:]]}


LABELLED = {  # module, the field that finds a training example among `_examples`, how it is changed
    "docstring package": (lambda cache: DocstringDataModule(packages=["json", "calendar"], train_per_class=6,
                                                            val_per_class=3, test_per_class=2, cache_dir=cache),
                          "text", _alter_text("text")),
    "docstring match": (lambda cache: DocstringDataModule(task="match", packages=["json"], train_per_class=6,
                                                          val_per_class=3, test_per_class=2, cache_dir=cache),
                        "text", _alter_text("text")),
    "code tokens": (lambda cache: CodeTokensDataModule(packages=["json"], max_lines=80, train_per_class=20,
                                                       val_per_class=5, test_per_class=5, cache_dir=cache),
                    "words", _alter_first_label),
    "docstring qa": (lambda cache: DocstringQADataModule(packages=["calendar"], n_candidates=3, train_per_class=6,
                                                         val_per_class=3, test_per_class=2, cache_dir=cache),
                     "question", _alter_text("question")),
}


@pytest.mark.parametrize("name", LABELLED)
def test_a_labelled_text_key_names_its_training_examples(name, tmp_path, monkeypatch):
    make, field, alter = LABELLED[name]
    data = make(str(tmp_path))
    key = data.data_key()  # examples read off the source
    assert make(str(tmp_path)).data_key() == key  # the same, read from the cache
    assert make(str(tmp_path / "other")).data_key() == key  # and built afresh
    trained = data.splits()["train"][0][field]
    real = type(data)._examples
    # one training example read otherwise (another Python's docstring, another tokenize's label)
    monkeypatch.setattr(type(data), "_examples",
                        lambda self: [alter(ex) if ex[field] == trained else ex for ex in real(self)])
    assert make(str(tmp_path)).data_key() != key


def test_a_data_key_is_hashed_once_per_module(tmp_path, monkeypatch):
    # every checkpoint records the key: the training content must not be hashed at every save
    data = LABELLED["docstring package"][0](str(tmp_path))
    hashed = []
    monkeypatch.setattr(base, "content_key", lambda *parts: hashed.append(parts) or "k")
    assert data.data_key() == data.data_key() == "k" and len(hashed) == 1


# --------------------------------------------------------------------------- text corpora
BERT = dict(builtin_max_bytes=60_000, vocab_size=300, context_length=16, batch_size=4, train_samples=8)


def test_the_bert_key_names_its_training_documents_as_tokenized(tmp_path, monkeypatch):
    data = BERTDataModule(**BERT, cache_dir=str(tmp_path))
    key = data.data_key()  # the corpus as built
    assert BERTDataModule(**BERT, cache_dir=str(tmp_path)).data_key() == key  # as read from its cache
    real = bert_data.read_texts
    # one line of the first file read otherwise (the standard library of another Python)
    monkeypatch.setattr(bert_data, "read_texts", lambda files: [t.replace("\n", "\nx = 1\n", 1) if i == 0 else t
                                                                for i, t in enumerate(real(files))])
    assert BERTDataModule(**BERT, cache_dir=str(tmp_path / "other")).data_key() != key


def test_a_span_corruption_run_keys_its_token_stream_as_text_runs_do():
    # covered by `TextDataModule`'s key (test_resume.py: a corpus cut otherwise is refused)
    assert SpanCorruptionDataModule.data_key is TextDataModule.data_key


T5 = dict(tasks=["params", "statement"], builtin_max_bytes=60_000, train_per_task=40, val_per_task=5,
          test_fraction=0.0, batch_size=4)


def test_the_text_to_text_key_names_its_training_examples(tmp_path, monkeypatch):
    tokenizer = str(cached_t5_tokenizer(stdlib_source_files(60_000), 300, 8, tmp_path / "tokenizer"))
    data = TextToTextDataModule(**T5, tokenizer=tokenizer, cache_dir=str(tmp_path))
    key = data.data_key()
    assert TextToTextDataModule(**T5, tokenizer=tokenizer, cache_dir=str(tmp_path)).data_key() == key  # cached
    trained = data.encoded("train")[0]["input"]
    real = t5_data.builtin_text_to_text_examples

    def one_target_otherwise(*args, **kwargs):  # the `ast` of another Python reads one line otherwise
        built = real(*args, **kwargs)
        built["train"] = [{**ex, "target": "assert"} if ex["input"] == trained else ex for ex in built["train"]]
        return built

    monkeypatch.setattr(t5_data, "builtin_text_to_text_examples", one_target_otherwise)
    assert TextToTextDataModule(**T5, tokenizer=tokenizer, cache_dir=str(tmp_path / "other")).data_key() != key


# --------------------------------------------------------------------------- episodes
DT = dict(expert_episodes=2, noisy_episodes=3, random_episodes=2, val_fraction=0.3)


def test_the_trajectory_key_names_its_training_episodes(tmp_path):
    data = TrajectoryDataModule(**DT, cache_dir=str(tmp_path))
    key = data.data_key()  # the episodes as recorded
    assert TrajectoryDataModule(**DT, cache_dir=str(tmp_path)).data_key() == key  # as read from the cache
    # one training episode recorded otherwise (another simulator, a policy changed since)
    [cached] = (tmp_path / "trajectories").glob("*.npz")
    episodes = list(data.episodes())
    i = next(i for i, ep in enumerate(episodes)
             if any(np.array_equal(ep.observations, t.observations) for t in data.train_episodes))
    episodes[i] = Episode(episodes[i].observations + 1e-3, episodes[i].actions, episodes[i].rewards,
                          episodes[i].terminated)
    save_trajectories(episodes, cached)
    assert TrajectoryDataModule(**DT, cache_dir=str(tmp_path)).data_key() != key
    # a file's episodes are keyed alike
    mine = tmp_path / "mine.npz"
    save_trajectories(episodes, mine)
    assert TrajectoryDataModule(path=str(mine), val_fraction=0.3).data_key() == \
        TrajectoryDataModule(path=str(mine), val_fraction=0.3).data_key()


# --------------------------------------------------------------------------- scans, captions, spoken digits
def _one_scan_otherwise(monkeypatch):
    """scikit-learn's scans with one pixel of every scan changed (another release of them)."""
    from tasks.data import image

    real = image.load_digits

    def load_digits():
        digits = real()
        digits.images = digits.images.copy()
        digits.images[:, 0, 0] = 16 - digits.images[:, 0, 0]
        return digits

    monkeypatch.setattr(image, "load_digits", load_digits)


def test_the_digits_key_reads_the_scans_as_shipped_not_their_upsampled_floats(monkeypatch):
    key = DigitsDataModule(batch_size=8).data_key()
    assert DigitsDataModule(batch_size=8, image_size=16).data_key() == key  # a setting, recorded as one
    assert DigitsDataModule(batch_size=8, train_per_class=20).data_key() != key  # other training scans
    _one_scan_otherwise(monkeypatch)
    assert DigitsDataModule(batch_size=8).data_key() != key


def test_the_captioned_digits_key_names_its_scans_and_what_captions_are_drawn_from(monkeypatch):
    key = CaptionedDigitsDataModule(batch_size=8).data_key()
    assert CaptionedDigitsDataModule(batch_size=8).data_key() == key
    assert CaptionedDigitsDataModule(batch_size=8, templates=["a {}."]).data_key() != key
    _one_scan_otherwise(monkeypatch)
    assert CaptionedDigitsDataModule(batch_size=8).data_key() != key


def _fake_spoken(monkeypatch, shift: float = 0.0):
    """The spoken corpus as frames without synthesis: three utterances a digit, seeded."""
    def spoken(self, split):
        rng = np.random.default_rng(0 if split == "train" else 1)
        digits = [d for d in range(10) for _ in range(3)]
        frames = [torch.from_numpy(rng.standard_normal((5 + d, 8)).astype(np.float32)) for d in digits]
        frames[0] = frames[0] + shift
        return frames, digits, [f"{split}-{i}.wav" for i in range(len(digits))]

    monkeypatch.setattr(ImageAudioPairsDataModule, "spoken", spoken)


PAIRS = dict(train_pairs=16, held_out_pairs=8, batch_size=4)


def test_the_image_audio_key_names_its_synthesis_version_its_scans_and_its_digits(monkeypatch):
    _fake_spoken(monkeypatch)
    key = ImageAudioPairsDataModule(**PAIRS).data_key()
    assert ImageAudioPairsDataModule(**PAIRS).data_key() == key
    # the frames' floats are not hashed: they round differently from one CPU to another
    _fake_spoken(monkeypatch, shift=1e-6)
    assert ImageAudioPairsDataModule(**PAIRS).data_key() == key
    _fake_spoken(monkeypatch)
    monkeypatch.setattr(speech, "CORPUS_VERSION", speech.CORPUS_VERSION + 1)  # synthesis changed since
    assert ImageAudioPairsDataModule(**PAIRS).data_key() != key
    monkeypatch.undo()
    _fake_spoken(monkeypatch)
    _one_scan_otherwise(monkeypatch)
    assert ImageAudioPairsDataModule(**PAIRS).data_key() != key


def test_a_manifest_key_names_its_vocabulary_and_training_transcripts(tmp_path):
    rate = 16000
    rows = []
    for i, text in enumerate(["one two", "two one", "one", "two", "one one"]):
        soundfile.write(tmp_path / f"{i}.wav", np.zeros(rate // 4, np.float32), rate)
        rows.append({"audio_filepath": f"{i}.wav", "text": text, "duration": 0.25})

    def key_of(rows, **options):
        manifest = tmp_path / "train.jsonl"
        manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return speech.ManifestDataModule(str(manifest), val_fraction=0.2, batch_size=2, **options).data_key()

    key = key_of(rows)
    assert key_of(rows) == key
    # a character gained: the vocabulary built from the transcripts moves every id after it
    assert key_of([{**r, "text": r["text"] + "!"} for r in rows]) not in (None, key)
    fixed = list(" enotw")
    assert key_of(rows, vocabulary=fixed) == key_of(rows, vocabulary=fixed) != key_of(rows, vocabulary=fixed[::-1])


# --------------------------------------------------------------------------- a resumed docstring run
QUICK = ["--model.pretrained", "null", "--model.num_labels", "2", "--data.packages", "[json, calendar]",
         "--data.tokenizer", "tok", "--data.context_length", "24", "--data.batch_size", "4",
         "--data.train_per_class", "6", "--data.val_per_class", "3", "--data.test_per_class", "2",
         "--trainer.limit_val_batches", "1", "--trainer.enable_progress_bar", "false",
         "--trainer.enable_model_summary", "false"]


def test_a_docstring_run_resumed_on_docstrings_read_otherwise_since_is_refused_by_name(tmp_path, monkeypatch, capsys):
    # The same settings over another Python's standard library (one training docstring written
    # otherwise): the resumed run would train on other examples.
    monkeypatch.chdir(tmp_path)
    WordPieceTokenizer.train(iterator=iter(["return the value of the key", "def f(x): pass"] * 20),
                             vocab_size=120).save("tok")
    config = str(ROOT / "configs" / "bert" / "finetune_cls.yaml")
    args = [*QUICK, "--data.cache_dir", str(tmp_path / "cache"), "--trainer.default_root_dir", str(tmp_path / "run")]
    main(["fit", "--config", config, *args, "--trainer.max_steps", "2"])
    [last] = (tmp_path / "run").rglob("last.ckpt")
    recorded = torch.load(last, weights_only=True)["DocstringDataModule"]["data"]
    trained = DocstringDataModule(packages=["json", "calendar"], train_per_class=6, val_per_class=3, test_per_class=2,
                                  cache_dir=str(tmp_path / "cache"))
    assert trained.data_key() == recorded
    text = trained.splits()["train"][0]["text"]
    [cache] = (tmp_path / "cache").glob("docstrings-*.json")
    rows = json.loads(cache.read_text())
    cache.write_text(json.dumps([{**r, "text": r["text"] + " (changed since)"} if r["text"] == text else r for r in rows]))
    with pytest.raises(SystemExit) as refused:
        main(["fit", "--config", config, *args, "--trainer.max_steps", "4", "--ckpt_path", str(last)])
    assert refused.value.code == 2
    assert f"DocstringDataModule's training data is not the checkpoint's (data key {recorded} → " in capsys.readouterr().err
    main(["fit", "--config", config, *args, "--trainer.max_steps", "2"])  # a new run on it is fine
