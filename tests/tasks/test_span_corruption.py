"""T5's span corruption: the lectures' example, T5's noise statistics, exact reconstruction,
and clear errors for missing or too few sentinels and too-short sequences."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from tasks.data.span_corruption import (
    SpanCorruptionCollator,
    noise_span_counts,
    random_spans_noise_mask,
    restore_spans,
    sentinel_ids,
    sentinel_tokens,
    span_corrupt,
)
from tasks.data.t5 import train_t5_tokenizer
from tokenizers_mm import BPETokenizer

SENTENCE = "Thank you for inviting me to your party last week."


def spans_of(mask: np.ndarray) -> list[int]:
    """Lengths of the runs of True in a mask."""
    lengths, run = [], 0
    for flag in mask:
        if flag:
            run += 1
        elif run:
            lengths.append(run)
            run = 0
    return [*lengths, run] if run else lengths


@pytest.fixture(scope="module")
def tokenizer() -> BPETokenizer:
    texts = [SENTENCE] * 20 + ["def party(week):\n    return week + 1\n"] * 20
    return train_t5_tokenizer(texts, vocab_size=400, num_sentinels=20)


def test_the_lecture_example_with_a_fixed_mask():
    words = SENTENCE.split()
    noise = [w in ("for", "inviting", "last") for w in words]
    inputs, targets = span_corrupt(words, noise, ["<X>", "<Y>", "<Z>"])
    assert " ".join(inputs) == "Thank you <X> me to your party <Y> week."
    assert " ".join(targets) == "<X> for inviting <Y> last <Z>"
    assert restore_spans(inputs, targets, ["<X>", "<Y>", "<Z>"]) == words


def test_the_lecture_example_through_the_tokenizer(tokenizer):
    enc = tokenizer.encode(SENTENCE)
    noise = [tok.lstrip("Ġ") in ("for", "inviting", "last") for tok in enc.tokens]
    assert sum(noise) == 3  # each word is one token in this vocabulary
    inputs, targets = span_corrupt(enc.ids.tolist(), noise, sentinel_ids(tokenizer), tokenizer.eos_id)
    assert tokenizer.decode(inputs) == "Thank you<extra_id_0> me to your party<extra_id_1> week.</s>"
    assert tokenizer.decode(targets) == "<extra_id_0> for inviting<extra_id_1> last<extra_id_2></s>"


def test_sentinels_are_t5s_special_tokens(tokenizer):
    assert sentinel_tokens(3) == ["<extra_id_0>", "<extra_id_1>", "<extra_id_2>"]
    ids = sentinel_ids(tokenizer)
    assert len(ids) == 20 and ids[0] == tokenizer.token_to_id("<extra_id_0>")
    assert tokenizer.encode("x<extra_id_7>y").tokens == ["x", "<extra_id_7>", "y"]  # never split


@pytest.mark.parametrize("length", [20, 64, 100, 128, 257, 512])
def test_noise_and_span_counts_are_t5s(length):
    noise, spans = noise_span_counts(length)
    assert noise == round(0.15 * length) and spans == max(1, round(noise / 3))
    rng = np.random.default_rng(0)
    for _ in range(50):
        mask = random_spans_noise_mask(length, rng=rng, random_roll=False)
        assert mask.sum() == noise
        assert len(spans_of(mask)) == spans
        assert not mask[0] and mask[-1]  # T5 without the roll: kept span first, noise span last


@pytest.mark.parametrize("random_roll", [True, False])
def test_noise_density_and_mean_span_length_over_many_draws(random_roll):
    rng = np.random.default_rng(0)
    noise_tokens = total_tokens = 0
    span_lengths: list[int] = []
    for _ in range(2000):
        length = int(rng.integers(30, 300))
        mask = random_spans_noise_mask(length, 0.15, 3.0, rng=rng, random_roll=random_roll)
        noise_tokens += int(mask.sum())
        total_tokens += length
        span_lengths += spans_of(mask)
    assert noise_tokens / total_tokens == pytest.approx(0.15, abs=0.005)
    # Rolling can cut a span in two where it wraps around the end, so spans come out a bit shorter.
    assert np.mean(span_lengths) == pytest.approx(3.0, abs=0.3)
    assert min(span_lengths) >= 1 and np.std(span_lengths) > 0.5  # lengths vary, as a random segmentation does


def test_other_densities_and_span_lengths():
    rng = np.random.default_rng(1)
    masks = [random_spans_noise_mask(200, 0.3, 8.0, rng=rng) for _ in range(300)]
    assert np.mean([m.mean() for m in masks]) == pytest.approx(0.3, abs=0.005)
    assert np.mean([x for m in masks for x in spans_of(m)]) == pytest.approx(8.0, abs=1.0)


def test_collated_inputs_and_targets_reconstruct_the_original_tokens_exactly():
    collator = SpanCorruptionCollator(sentinel_ids=list(range(1000, 1100)), eos_id=1, pad_id=0)
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        windows = [torch.randint(2, 900, (int(torch.randint(8, 200, (), generator=generator)),), generator=generator)
                   for _ in range(8)]
        batch = collator([{"input_ids": w} for w in windows])
        for row, window in enumerate(windows):
            inputs = batch["input_ids"][row][batch["attention_mask"][row].bool()].tolist()
            targets = [t for t in batch["labels"][row].tolist() if t != -100]
            assert inputs[-1] == 1 and targets[-1] == 1  # EOS ends both
            assert targets[0] == 1000  # targets open with <extra_id_0>
            assert restore_spans(inputs, targets, collator.sentinel_ids, eos=1) == window.tolist()


def test_text_survives_the_round_trip(tokenizer):
    collator = SpanCorruptionCollator.from_tokenizer(tokenizer, seed=0)
    text = "def party(week):\n    return week + 1\n" + SENTENCE
    ids = tokenizer.encode(text).ids
    batch = collator([ids])
    inputs, targets = batch["input_ids"][0].tolist(), [t for t in batch["labels"][0].tolist() if t != -100]
    restored = restore_spans(inputs, targets, collator.sentinel_ids, eos=tokenizer.eos_id)
    assert tokenizer.decode(restored) == text
    assert "<extra_id_0>" in tokenizer.decode(inputs)


def test_the_collator_pads_and_is_picklable_and_seeded():
    collator = SpanCorruptionCollator(list(range(100, 120)), eos_id=1, pad_id=0, seed=3)
    items = [{"input_ids": torch.arange(2, 60)}, {"input_ids": torch.arange(2, 12)}]
    batch = collator(items)
    assert batch["input_ids"].shape == batch["attention_mask"].shape
    short_inputs = int(batch["attention_mask"][1].sum())
    assert (batch["input_ids"][1, short_inputs:] == 0).all() and (batch["attention_mask"][1, short_inputs:] == 0).all()
    assert (batch["labels"][1] == -100).any() and not (batch["labels"][0] == -100).any()
    again = pickle.loads(pickle.dumps(collator))(items)
    assert all(torch.equal(batch[k], again[k]) for k in batch)  # seeded: the same windows, the same masks
    unseeded = SpanCorruptionCollator(list(range(100, 120)), eos_id=1, pad_id=0)
    draws = {tuple(unseeded(items)["labels"][0].tolist()) for _ in range(10)}
    assert len(draws) > 1  # training: fresh masks every time


def test_missing_sentinels_are_a_clear_error():
    plain = BPETokenizer.train(iterator=iter([SENTENCE] * 5), vocab_size=300,
                               special_tokens=("<pad>", "</s>"), eos_token="</s>", pad_token="<pad>")
    with pytest.raises(ValueError, match=r"no sentinel tokens \(<extra_id_0>"):
        sentinel_ids(plain)
    with pytest.raises(ValueError, match="sentinel"):
        SpanCorruptionCollator.from_tokenizer(plain)


def test_too_few_sentinels_is_a_clear_error():
    words = SENTENCE.split()
    noise = [w in ("for", "inviting", "last") for w in words]
    with pytest.raises(ValueError, match="at least 2 spans, which with the closing sentinel need 3 sentinels, but only 2"):
        span_corrupt(words, noise, ["<X>", "<Y>"])  # two spans need three sentinels
    collator = SpanCorruptionCollator([100, 101, 102], eos_id=1, pad_id=0)
    with pytest.raises(ValueError, match="item 0: .*but only 3 were given"):
        collator([list(range(2, 200))])  # ~10 spans


def test_bad_lengths_and_rates_are_clear_errors():
    with pytest.raises(ValueError, match="too short for span corruption"):
        random_spans_noise_mask(1)
    with pytest.raises(ValueError, match="item 1: .*too short"):
        SpanCorruptionCollator([100, 101], eos_id=1, pad_id=0)([[5, 6, 7], [5]])
    with pytest.raises(ValueError, match="noise_density must be in"):
        random_spans_noise_mask(50, noise_density=1.5)
    with pytest.raises(ValueError, match="mean_noise_span_length must be"):
        SpanCorruptionCollator([100, 101], eos_id=1, pad_id=0, mean_noise_span_length=0.5)
    with pytest.raises(ValueError, match="one flag per token"):
        span_corrupt([1, 2, 3], [True, False], [100, 101])
